"""``runwatch import --config/--config-file``: the run's config, checked before anything is
written, shown by ``runwatch runs``."""

from __future__ import annotations

import json

import pytest

from runwatch.cli import main
from runwatch.store import open_store

GOOD = {
    "params": 1.2e8,
    "total_steps": 20000,
    "tokens_per_step": 524288,
    "schedule": {"name": "cosine", "warmup": 200, "final_lr_fraction": 0.1},
    "family": ["gpt-s", "gpt-m"],
    "reference": "gpt-s",
    "lr": 3e-4,
    "optimizer": {"name": "adamw", "betas": [0.9, 0.95]},
}
# What `runs --format json` printed before the config columns: a contract, never broken.
RUNS_JSON_KEYS = {
    "run_id",
    "name",
    "project",
    "status",
    "start_time",
    "end_time",
    "last_step",
    "last_time",
    "attempts",
    "points",
    "series",
}


def _csv(path, run="r", steps=(0, 5)):
    path.write_text("run,step,metric,value\n" + "".join(f"{run},{s},loss,1.0\n" for s in steps))
    return path


def _config(db_path, run):
    with open_store(str(db_path)) as store:
        runs = store.runs().set_index("name")
    return json.loads(runs.loc[run, "config"])


def _state(db_path):
    """Everything an import could change: each run's attempts, points, status, config."""
    if not db_path.exists():
        return None
    with open_store(str(db_path)) as store:
        runs = store.runs()
    return runs[["name", "attempts", "points", "series", "status", "config"]].to_dict("records")


def _runs_json(db_path, capsys):
    capsys.readouterr()
    assert main(["runs", "--db", str(db_path), "--format", "json"]) == 0
    return {r["name"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}


def test_config_is_stored_and_listed_by_runs(tmp_path, db_path, capsys):
    src = _csv(tmp_path / "a.csv")
    assert main(["import", str(src), "--db", str(db_path), "--config", json.dumps(GOOD)]) == 0
    assert _config(db_path, "r") == GOOD  # free-form keys kept as given
    capsys.readouterr()
    assert main(["runs", "--db", str(db_path)]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[-4:] == ["params", "total_steps", "tokens_per_step", "schedule"]
    assert row.split()[-4:] == ["120M", "20000", "524288", "cosine"]
    rec = _runs_json(db_path, capsys)["r"]
    assert set(rec) == RUNS_JSON_KEYS | {"params", "total_steps", "tokens_per_step", "schedule"}
    assert (rec["params"], rec["total_steps"], rec["tokens_per_step"]) == (1.2e8, 20000, 524288)
    assert rec["schedule"] == GOOD["schedule"]
    assert (rec["name"], rec["last_step"], rec["points"]) == ("r", 5, 2)


def test_runs_without_config_show_empty_columns_and_null_keys(tmp_path, db_path, capsys):
    assert main(["import", str(_csv(tmp_path / "a.csv")), "--db", str(db_path)]) == 0
    with open_store(str(db_path)) as store:  # as runwatch.init stores it: not checked
        store.start_run("hooked", config={"params": "7B", "total_steps": 500})
    rows = _runs_json(db_path, capsys)
    assert [rows["r"][k] for k in ("params", "total_steps", "tokens_per_step", "schedule")] == [
        None
    ] * 4
    assert (rows["hooked"]["params"], rows["hooked"]["total_steps"]) == (None, 500)
    assert main(["runs", "--db", str(db_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[-1] == "2"  # r: points, then nothing in the config columns
    assert lines[2].split()[-1] == "500"


def test_config_file_then_inline_config_wins(tmp_path, db_path):
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"params": 1e9, "total_steps": 1000, "lr": 1e-3}))
    src = _csv(tmp_path / "a.csv")
    argv = ["import", str(src), "--db", str(db_path), "--config-file", str(cfg)]
    assert main([*argv, "--config", '{"lr": 2e-3, "seed": 7}']) == 0
    assert _config(db_path, "r") == {"params": 1e9, "total_steps": 1000, "lr": 2e-3, "seed": 7}


def test_every_run_of_the_file_gets_the_config(tmp_path, db_path):
    src = tmp_path / "two.csv"
    src.write_text("run,step,metric,value\na,0,loss,1\nb,0,loss,2\n")
    assert main(["import", str(src), "--db", str(db_path), "--config", '{"total_steps": 9}']) == 0
    assert _config(db_path, "a") == _config(db_path, "b") == {"total_steps": 9}


def test_append_merges_into_the_stored_config_new_keys_winning(tmp_path, db_path):
    src = _csv(tmp_path / "a.csv")
    first = {"params": 1e8, "total_steps": 1000, "lr": 1e-3}
    assert main(["import", str(src), "--db", str(db_path), "--config", json.dumps(first)]) == 0
    again = ["import", str(src), "--db", str(db_path), "--append"]
    assert main([*again, "--config", '{"total_steps": 2000, "note": "resumed"}']) == 0
    assert _config(db_path, "r") == {**first, "total_steps": 2000, "note": "resumed"}
    assert main(again) == 0  # no --config: the stored config stays
    assert _config(db_path, "r")["total_steps"] == 2000


BAD = [
    pytest.param(["--config", "{params: 1}"], "not valid JSON", id="not-json"),
    pytest.param(["--config", "[1, 2]"], "JSON object", id="not-an-object"),
    pytest.param(["--config", '{"params": "big"}'], "params", id="params-string"),
    pytest.param(["--config", '{"params": -1}'], "params", id="params-negative"),
    pytest.param(["--config", '{"total_steps": -5}'], "total_steps", id="total-steps-negative"),
    pytest.param(["--config", '{"total_steps": 10.5}'], "total_steps", id="total-steps-fraction"),
    pytest.param(["--config", '{"tokens_per_step": true}'], "tokens_per_step", id="tokens-bool"),
    pytest.param(
        ["--config", '{"schedule": {"name": "cosine", "warmpu": 100}}'],
        "warmpu",
        id="schedule-unknown-field",
    ),
    pytest.param(["--config", '{"schedule": "cosine"}'], "schedule", id="schedule-string"),
    pytest.param(
        ["--config", '{"total_steps": 100, "schedule": {"name": "wsd", "decay_start": 150}}'],
        "decay_start",
        id="schedule-past-total-steps",
    ),
    pytest.param(["--config", '{"family": "gpt-s"}'], "family", id="family-not-a-list"),
    pytest.param(["--config", '{"reference": 3}'], "reference", id="reference-not-a-name"),
    pytest.param(["--config-file", "NOFILE"], "no such file", id="missing-file"),
]


@pytest.mark.parametrize("append", [False, True], ids=["new-run", "append"])
@pytest.mark.parametrize(("options", "named"), BAD)
def test_bad_config_is_exit_2_naming_the_key_and_writes_nothing(
    tmp_path, db_path, capsys, options, named, append
):
    src = _csv(tmp_path / "a.csv")
    assert main(["import", str(src), "--db", str(db_path), "--config", '{"lr": 1}']) == 0
    before = _state(db_path)
    options = [str(tmp_path / o) if o == "NOFILE" else o for o in options]
    argv = ["import", str(src), "--db", str(db_path), *options]
    argv += ["--append"] if append else ["--run", "other"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("runwatch import: error:") and named in err
    assert len(err.strip().splitlines()) == 1  # one line, no traceback
    assert _state(db_path) == before


def test_bad_config_does_not_create_the_store(tmp_path, db_path, capsys):
    src = _csv(tmp_path / "a.csv")
    assert main(["import", str(src), "--db", str(db_path), "--config", '{"params": "big"}']) == 2
    assert not db_path.exists()


def test_file_and_inline_config_are_checked_together(tmp_path, db_path, capsys):
    cfg = tmp_path / "run.json"
    cfg.write_text('{"schedule": {"name": "wsd", "decay_start": 800}}')
    src = _csv(tmp_path / "a.csv")
    argv = ["import", str(src), "--db", str(db_path), "--config-file", str(cfg)]
    assert main([*argv, "--config", '{"total_steps": 500}']) == 2
    assert "decay_start" in capsys.readouterr().err
    assert not db_path.exists()


def test_schedule_against_the_stored_total_steps_on_append_writes_nothing(
    tmp_path, db_path, capsys
):
    src = _csv(tmp_path / "a.csv")
    assert main(["import", str(src), "--db", str(db_path), "--config", '{"total_steps": 100}']) == 0
    before = _state(db_path)
    bad = '{"schedule": {"name": "wsd", "decay_start": 150}}'
    assert main(["import", str(src), "--db", str(db_path), "--append", "--config", bad]) == 2
    err = capsys.readouterr().err
    assert "run 'r'" in err and "decay_start 150" in err and "stored config" in err
    assert _state(db_path) == before


def test_a_failed_import_leaves_the_stored_config_as_it_was(tmp_path, db_path, capsys):
    src = _csv(tmp_path / "a.csv")
    assert main(["import", str(src), "--db", str(db_path), "--config", '{"lr": 1}']) == 0
    before = _state(db_path)
    bad = tmp_path / "bad.csv"
    bad.write_text("run,step,metric,value\nr,6,loss,1.0\nr,7,loss,\n")
    argv = ["import", str(bad), "--db", str(db_path), "--append", "--config", '{"lr": 2}']
    assert main(argv) == 2
    assert "bad.csv:3" in capsys.readouterr().err
    assert _state(db_path) == before and _config(db_path, "r") == {"lr": 1}


def test_help_says_how_config_and_config_file_combine(capsys):
    with pytest.raises(SystemExit):
        main(["import", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--config-file F" in out and "file is read first and --config's keys win" in out
