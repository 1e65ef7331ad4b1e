"""The command line: a public contract (exit codes, formats, messages)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from runwatch.cli import main
from runwatch.store import open_store


def _csv(path, text):
    path.write_text(text)
    return path


def test_help_explains_every_command():
    out = subprocess.run(
        [sys.executable, "-m", "runwatch.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in ("demo", "import", "export", "runs"):
        assert command in out
    sub = subprocess.run(
        [sys.executable, "-m", "runwatch.cli", "import", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "line number" in sub and "--append" in sub


def test_import_export_round_trip(tmp_path, db_path, capsys):
    src = _csv(
        tmp_path / "a.csv",
        "run,step,metric,value,time,rank\n"
        "r,0,loss,3.5,1700000000.5,\nr,1,loss,nan,1700000001.25,\n"
        "r,1,step_time,0.5,,3\nr,2,loss,-inf,,\n",
    )
    assert main(["import", str(src), "--db", str(db_path)]) == 0
    assert "imported 4 points in 2 series into run 'r'" in capsys.readouterr().out
    assert main(["export", "--db", str(db_path), "--run", "r", "--format", "jsonl"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    loss = [r for r in rows if r["metric"] == "loss"]
    assert [r["step"] for r in loss] == [0, 1, 2]
    assert loss[0]["time"] == 1700000000.5
    st = [r for r in rows if r["metric"] == "step_time"]
    assert st[0]["rank"] == 3


def test_malformed_line_names_file_and_line_and_writes_nothing(tmp_path, db_path, capsys):
    src = _csv(tmp_path / "bad.csv", "run,step,metric,value\nr,0,loss,1.0\nr,1,loss,\n")
    assert main(["import", str(src), "--db", str(db_path)]) == 2
    err = capsys.readouterr().err
    assert "bad.csv:3: column 'value': empty value" in err
    with open_store(str(db_path)) as store:
        assert store.runs().empty


def test_a_bad_line_in_a_later_chunk_rolls_back_the_earlier_chunks(tmp_path, db_path, capsys):
    n = 250_000
    frame = pd.DataFrame(
        {"run": "big", "step": np.arange(n), "metric": "loss", "value": np.linspace(5, 2, n)}
    )
    src = tmp_path / "big.csv.gz"
    with gzip.open(src, "wt") as fh:
        frame.to_csv(fh, index=False)
        fh.write("big,250000,loss,not-a-number\n")
    assert main(["import", str(src), "--db", str(db_path)]) == 2
    assert f"big.csv.gz:{n + 2}: column 'value'" in capsys.readouterr().err
    with open_store(str(db_path)) as store:
        assert store.runs().empty


def test_importing_a_run_twice_needs_append(tmp_path, db_path, capsys):
    src = _csv(tmp_path / "a.csv", "run,step,metric,value\nr,0,loss,2\nr,1,loss,1\n")
    assert main(["import", str(src), "--db", str(db_path)]) == 0
    assert main(["import", str(src), "--db", str(db_path)]) == 2
    assert "--append" in capsys.readouterr().err
    assert main(["import", str(src), "--db", str(db_path), "--append"]) == 0
    assert main(["import", str(src), "--db", str(db_path), "--run", "copy"]) == 0
    with open_store(str(db_path)) as store:
        runs = store.runs().set_index("name")
    assert runs.loc["r", "attempts"] == 2 and "copy" in runs.index


def test_real_run_imports_exactly(real_runs, db_path, capsys):
    src = real_runs / "mng_soap_6k.csv"
    assert main(["import", str(src), "--db", str(db_path)]) == 0
    original = pd.read_csv(src)
    with open_store(str(db_path)) as store:
        loss = store.read_series("mng_soap_6k", "train_loss")
    expected = original[original["metric"] == "train_loss"].drop_duplicates("step", keep="last")
    assert loss["step"].tolist() == sorted(expected["step"].tolist())
    assert np.allclose(loss["value"], expected.sort_values("step")["value"])


def test_runs_table_and_json(tmp_path, db_path, capsys):
    src = _csv(tmp_path / "a.csv", "run,step,metric,value\nr,0,loss,2\nr,5,loss,1\n")
    main(["import", str(src), "--db", str(db_path)])
    capsys.readouterr()
    assert main(["runs", "--db", str(db_path)]) == 0
    assert "finished" in capsys.readouterr().out
    assert main(["runs", "--db", str(db_path), "--format", "json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["name"], row["last_step"], row["points"]) == ("r", 5, 2)


@pytest.mark.parametrize("args", [["runs"], ["export", "--run", "x"]])
def test_missing_store_is_exit_2_with_a_hint(tmp_path, capsys, args):
    assert main([*args, "--db", str(tmp_path / "none.db")]) == 2
    assert "no such store" in capsys.readouterr().err


def test_unknown_run_is_exit_2_naming_the_runs(tmp_path, db_path, capsys):
    src = _csv(tmp_path / "a.csv", "run,step,metric,value\nalpha,0,loss,2\n")
    main(["import", str(src), "--db", str(db_path)])
    assert main(["export", "--db", str(db_path), "--run", "beta"]) == 2
    assert "alpha" in capsys.readouterr().err


def test_demo_writes_a_run_with_its_faults(db_path, capsys):
    assert main(["demo", "--db", str(db_path), "--steps", "400", "--no-dashboard"]) == 0
    out = capsys.readouterr().out
    assert "2 attempts" in out and "nan" in out
    with open_store(str(db_path)) as store:
        (name,) = store.runs()["name"].tolist()
        loss = store.read_series(name, "loss")
        lost = store.read_series(name, "loss", all_attempts=True)
        kinds = set(store.events(name)["kind"])
    assert loss["value"].isna().sum() == 1
    assert loss["step"].tolist() == list(range(1, 401))
    assert lost["superseded"].sum() > 0
    assert {"checkpoint", "crash", "restart"} <= kinds


def test_demo_refuses_too_few_steps(db_path, capsys):
    assert main(["demo", "--db", str(db_path), "--steps", "10"]) == 2
    assert "at least 200" in capsys.readouterr().err
