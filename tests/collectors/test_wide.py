"""Wide CSV exports into a real store: W&B-style columns, blanks, bad cells, duplicate steps."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from runwatch.collectors.importer import RunAlreadyStoredError
from runwatch.collectors.wide import WideFormatError, import_wide, is_wide
from runwatch.store import open_store

WANDB = (
    "_step,train/loss,eval/accuracy,_runtime,_timestamp,epoch\n"
    "0,2.5,,1.5,1700000000.25,0\n"
    "1,2.25,,2.5,1700000001.25,0\n"
    "2,nan,0.5,3.5,1700000002.25,1\n"
    "3,2.0,0.75,4.5,1700000003.25,1\n"
)


def _store(tmp_path: Path):
    return open_store(str(tmp_path / "s.db"))


def test_wandb_export_blanks_times_and_bookkeeping(tmp_path: Path) -> None:
    path = tmp_path / "wandb.csv"
    path.write_text(WANDB)
    assert is_wide(path)
    store = _store(tmp_path)
    summary = import_wide(store, path, run_name="r")
    assert summary.points["r"] == 4 + 2 + 4  # eval/accuracy blank at steps 0 and 1
    points = store.read_points("r")
    assert set(points["metric"]) == {"train/loss", "eval/accuracy", "epoch"}  # _runtime dropped
    loss = points[points["metric"] == "train/loss"].set_index("step")["value"]
    assert math.isnan(loss[2]) and loss[3] == 2.0  # "nan" is a value, not a blank
    acc = points[points["metric"] == "eval/accuracy"]
    assert list(acc["step"]) == [2, 3]
    assert points["time"].min() == pytest.approx(1700000000.25)  # _timestamp -> time
    run = store.runs().set_index("name").loc["r"]
    assert run["status"] == "finished"


def test_millisecond_timestamps_and_global_step(tmp_path: Path) -> None:
    path = tmp_path / "mlflow.csv"
    path.write_text("global_step,timestamp,loss\n10,1700000000000,1.0\n20,1700000005000,0.5\n")
    store = _store(tmp_path)
    import_wide(store, path, run_name="r")
    points = store.read_points("r")
    assert list(points["step"]) == [10, 20]
    assert list(points["time"]) == [1700000000.0, 1700000005.0]


def test_duplicate_step_is_refused_with_its_line_and_nothing_written(tmp_path: Path) -> None:
    path = tmp_path / "dup.csv"
    path.write_text("step,loss\n0,1\n1,2\n2,3\n1,4\n")
    store = _store(tmp_path)
    with pytest.raises(WideFormatError) as err:
        import_wide(store, path, run_name="r")
    assert err.value.line == 5 and err.value.column == "step"
    assert "first at line 3" in str(err.value)
    assert store.runs().empty


@pytest.mark.parametrize(
    ("body", "line", "column"),
    [
        ("step,loss,acc\n0,1,2\n1,2,high\n", 3, "acc"),
        ("step,loss\n0,1\n,2\n", 3, "step"),
        ("step,loss\n0,1\n1.5,2\n", 3, "step"),
        ("step,loss\n0,1\n1,2,3\n", 3, None),
    ],
)
def test_bad_cells_name_line_and_column(
    tmp_path: Path, body: str, line: int, column: str | None
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(body)
    store = _store(tmp_path)
    with pytest.raises(WideFormatError) as err:
        import_wide(store, path, run_name="r")
    assert (err.value.line, err.value.column) == (line, column)
    assert store.runs().empty


def test_step_going_back_starts_a_new_attempt(tmp_path: Path) -> None:
    path = tmp_path / "restart.csv"
    path.write_text("iteration,loss\n0,3\n10,2\n20,1\n5,2.5\n15,1.5\n")
    store = _store(tmp_path)
    summary = import_wide(store, path, run_name="r")
    assert summary.restarts["r"] == 1
    assert len(store.attempts("r")) == 2


def test_long_format_header_is_not_wide(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    path.write_text("run,step,metric,value\na,0,loss,1\n")
    assert not is_wide(path)
    nostep = tmp_path / "nostep.csv"
    nostep.write_text("when,loss\n0,1\n")
    assert not is_wide(nostep)
    with pytest.raises(WideFormatError, match="no step column"):
        import_wide(_store(tmp_path), nostep, run_name="r")


def test_append_adds_an_attempt_to_a_stored_run(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text("step,loss\n0,1\n1,0.5\n")
    store = _store(tmp_path)
    import_wide(store, path, run_name="r")
    with pytest.raises(RunAlreadyStoredError, match="already has a run"):
        import_wide(store, path, run_name="r")
    import_wide(store, path, run_name="r", append=True)
    assert len(store.attempts("r")) == 2
