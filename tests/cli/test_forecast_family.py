"""``runwatch forecast --family`` and ``analyze --family`` on a real SQLite store: the
forecast before the run starts and with its points, the JSON contract, and bad input
refused with the run or key named and nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from runwatch.cli import main
from runwatch.expect.lrlaw import lr_areas
from runwatch.expect.planned import planned_lr
from runwatch.store import open_store

COSINE = {"name": "cosine", "warmup": 50, "final_lr_fraction": 0.1}


def _run_csv(path, run, params, total, worse=1.0, lr=True):
    steps, share = planned_lr(COSINE, total)
    s1, s2 = lr_areas(steps, share, total)
    loss = worse * (2.0 * (params / 1e6) ** -0.07 + 3.0 * np.maximum(s1, 1) ** -0.5 - 4e-4 * s2)
    rows = ["run,step,metric,value"]
    for s in range(1, total + 1, 5):
        rows.append(f"{run},{s},loss,{loss[s]:.6f}")
        if lr:
            rows.append(f"{run},{s},lr,{3e-3 * share[s]:.8f}")
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture
def db(tmp_path):
    db = tmp_path / "fam.db"
    for name, params in (("s", 1e5), ("m", 3e5), ("l", 1e6)):
        src = _run_csv(tmp_path / f"{name}.csv", name, params, 2000)
        config = {"params": params, "total_steps": 2000, "schedule": COSINE}
        assert main(["import", str(src), "--db", str(db), "--config", json.dumps(config)]) == 0
    src = _run_csv(tmp_path / "xl.csv", "xl", 3e6, 2000, worse=1.15)
    config = {"params": 3e6, "total_steps": 2000, "schedule": COSINE}
    assert main(["import", str(src), "--db", str(db), "--config", json.dumps(config)]) == 0
    return db


def _json(capsys, argv):
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_forecast_before_the_run_starts_and_updated_by_its_points(db, capsys):
    base = ["forecast", "--db", str(db), "--run", "xl", "--family", "s", "m", "l"]
    before = _json(capsys, [*base, "--upto", "0", "--format", "json"])
    assert before["model"] == "family" and before["family"] == ["s", "m", "l"]
    assert before["upto"] == 0 and before["final_step"] == 2000
    assert before["curve"]["step"][0] == 1.0
    assert len(before["curve"]["expected"]) == len(before["curve"]["step"])
    # Losses a power law in params: the log-log line, with no other law alike.
    assert before["size_law"] == "loglog" and before["size_laws_alike"] == []
    assert before["size_law_weights"] == {"loglog": 1.0}
    one_size = _json(capsys, [*base[:5], "--family", "l", "--upto", "0", "--format", "json"])
    assert not {"size_law", "size_laws_alike", "size_law_weights"} & one_size.keys()
    after = _json(capsys, [*base, "--upto", "500", "--format", "json"])
    with open_store(str(db)) as store:
        final = float(store.read_series("xl", "loss")["value"].iloc[-5:].median())
    # The run is 15% worse than its size predicts: the family alone says so, its points fix it.
    assert before["predicted"] < final * 0.9
    assert abs(after["predicted"] / final - 1) < 0.01
    assert after["lower"] <= final <= after["upper"]


def test_the_text_names_the_size_laws_and_the_line_held_by_the_band_only(tmp_path, capsys):
    # Final losses bent in log params over three sizes: one leave-the-larger-out error
    # cannot tell the line from the floor law with the prior exponent.
    db = tmp_path / "bent.db"
    for name, params in (("s", 1e5), ("m", 2e5), ("l", 4e5), ("xl", 1.6e6)):
        x = np.log(params / 1e4)
        src = _run_csv(tmp_path / f"{name}.csv", name, 1e6, 2000, 1.5 - 0.15 * x + 0.01 * x * x)
        config = {"params": params, "total_steps": 2000, "schedule": COSINE}
        assert main(["import", str(src), "--db", str(db), "--config", json.dumps(config)]) == 0
    base = ["forecast", "--db", str(db), "--run", "xl", "--family", "s", "m", "l"]
    got = _json(capsys, [*base, "--upto", "0", "--format", "json"])
    assert got["size_law_weights"]["loglog"] == 0 and got["size_law"] != "loglog"
    capsys.readouterr()
    assert main([*base, "--upto", "0"]) == 0
    text = capsys.readouterr().out
    assert "the family s, m, l, before the run starts; size laws " in text
    assert "loglog in the band only (it has no floor)" in text
    assert f"{got['size_law']} 100%" in text
    assert main([*base, "--upto", "500"]) == 0
    assert "updated by its own points to step 500" in capsys.readouterr().out


def test_analyze_family_flags_a_run_above_its_scaling_line(db, capsys):
    capsys.readouterr()
    argv = ["analyze", "--db", str(db), "--run", "xl", "--family", "s", "m", "l"]
    assert main([*argv, "--format", "json"]) == 0
    found = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    worse = [a for a in found if a["detector"] == "curve_deviation" and a["severity"] == "warning"]
    assert worse, found
    # A run of the family's own line is not flagged as worse.
    assert (
        main(["analyze", "--db", str(db), "--run", "l", "--family", "s", "m", "--format", "json"])
        == 0
    )
    found = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert not [a for a in found if a["detector"] == "curve_deviation" and a["severity"] != "info"]


def test_a_loss_the_family_logs_too_rarely_is_left_to_the_runs_own_fit(tmp_path, capsys):
    # HF logs ``train_loss`` once, at the end: it cannot be fitted, and must not stop the
    # family from judging ``loss``.
    db = tmp_path / "hf.db"
    for name, params, worse in (("s", 1e5, 1), ("m", 3e5, 1), ("l", 1e6, 1), ("xl", 3e6, 1.15)):
        src = _run_csv(tmp_path / f"{name}.csv", name, params, 2000, worse=worse)
        src.write_text(src.read_text() + f"{name},2000,train_loss,2.5\n")
        config = {"params": params, "total_steps": 2000, "schedule": COSINE}
        assert main(["import", str(src), "--db", str(db), "--config", json.dumps(config)]) == 0
    capsys.readouterr()
    argv = ["analyze", "--db", str(db), "--run", "xl", "--family", "s", "m", "l"]
    assert main([*argv, "--format", "json"]) == 0
    found = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    worse = [a for a in found if a["detector"] == "curve_deviation" and a["severity"] == "warning"]
    assert worse and {a["metric"] for a in worse} == {"loss"}


def _state(db):
    with open_store(str(db)) as store:
        runs = store.runs()
        curves = store.expected_curves("xl") if hasattr(store, "expected_curves") else None
    return runs[["name", "points", "config"]].to_dict("records"), repr(curves)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--family", "nope"], "nope"),
        (["--family", "xl", "s"], "other runs than 'xl'"),
        (["--family", "s", "--reference", "m"], "not both"),
        (["--family", "s", "--metric", "val_loss"], "val_loss"),
    ],
)
def test_bad_input_exits_2_naming_it_and_writes_nothing(db, capsys, args, named):
    before = _state(db)
    capsys.readouterr()
    assert main(["forecast", "--db", str(db), "--run", "xl", *args]) == 2
    assert named in capsys.readouterr().err
    assert _state(db) == before


def test_a_family_run_without_params_is_named(db, tmp_path, capsys):
    src = _run_csv(tmp_path / "np.csv", "noparams", 1e5, 2000)
    assert main(["import", str(src), "--db", str(db)]) == 0
    capsys.readouterr()
    argv = ["forecast", "--db", str(db), "--run", "xl", "--family", "s", "noparams"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "family run 'noparams' has no params" in err and "--config" in err


def test_a_target_smaller_than_the_family_warns_and_widens(db, tmp_path, capsys):
    src = _run_csv(tmp_path / "xs.csv", "xs", 3e4, 2000)
    config = json.dumps({"params": 3e4, "total_steps": 2000, "schedule": COSINE})
    assert main(["import", str(src), "--db", str(db), "--config", config]) == 0
    out = _json(
        capsys,
        [
            "forecast",
            "--db",
            str(db),
            "--run",
            "xs",
            "--family",
            "m",
            "l",
            "--upto",
            "0",
            "--format",
            "json",
        ],
    )
    inside = _json(
        capsys,
        [
            "forecast",
            "--db",
            str(db),
            "--run",
            "m",
            "--family",
            "s",
            "l",
            "--upto",
            "0",
            "--format",
            "json",
        ],
    )
    assert out["upper"] - out["lower"] > inside["upper"] - inside["lower"]
