"""TensorBoard logdirs written by torch's real SummaryWriter: import and tailing."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")
torch_tb = pytest.importorskip("torch.utils.tensorboard")

from runwatch.collectors.importer import RunAlreadyStoredError  # noqa: E402
from runwatch.collectors.tensorboard import (  # noqa: E402
    TensorBoardError,
    TensorBoardSource,
    event_files,
    import_logdir,
)
from runwatch.store import Store  # noqa: E402


def write_run(logdir: Path, run: str, steps: range, nan_at: int | None = None) -> None:
    writer = torch_tb.SummaryWriter(str(logdir / run))
    for step in steps:
        loss = math.nan if step == nan_at else 2.0 / (step + 1)
        writer.add_scalar("train/loss", loss, step)
        writer.add_scalar("train/lr", 1e-3, step)
        writer.add_scalar("eval/acc", 0.5 + step / 100, step, new_style=True)  # a TF2 tensor
    writer.close()


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    root = tmp_path / "logs"
    write_run(root, "baseline", range(20), nan_at=7)
    write_run(root, "sweep/lr3", range(10))
    return root


def test_each_run_directory_becomes_a_run_with_its_scalars(logdir: Path, db_path: Path) -> None:
    with Store(db_path) as store:
        summary = import_logdir(store, logdir)
        assert summary.points == {"baseline": 60, "sweep/lr3": 30}
        assert {s[0] for s in summary.series["sweep/lr3"]} == {"train/loss", "train/lr", "eval/acc"}
        points = store.read_points("baseline")
        runs = store.runs().set_index("name")
    loss = points[points["metric"] == "train/loss"].set_index("step")["value"]
    assert loss.index.tolist() == list(range(20))
    assert math.isnan(loss[7])  # the NaN scalar is kept as a NaN
    assert loss[3] == pytest.approx(0.5)
    acc = points[points["metric"] == "eval/acc"].set_index("step")["value"]
    assert acc[10] == pytest.approx(0.6)  # tensor scalars decoded too
    assert points["time"].between(1e9, 1e10).all()  # wall time from the events
    assert (runs.loc[["baseline", "sweep/lr3"], "status"] == "finished").all()


def test_run_name_puts_everything_in_one_run_and_existing_runs_are_refused(
    logdir: Path, db_path: Path
) -> None:
    with Store(db_path) as store:
        import_logdir(store, logdir / "sweep", run_name="only")
        assert store.runs()["name"].tolist() == ["only"]
        with pytest.raises(RunAlreadyStoredError):
            import_logdir(store, logdir / "sweep", run_name="only")
        assert len(store.read_points("only")) == 30


def test_files_at_the_top_make_a_run_named_for_the_logdir(tmp_path: Path) -> None:
    write_run(tmp_path, "flat", range(3))
    assert [run for run, _ in event_files(tmp_path / "flat")] == ["flat"]


def test_empty_logdir_is_an_error_naming_it(tmp_path: Path, db_path: Path) -> None:
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with Store(db_path) as store, pytest.raises(TensorBoardError, match="no TensorBoard event"):
        import_logdir(store, tmp_path / "empty")


def test_truncated_tail_keeps_the_complete_records_and_says_so(
    logdir: Path, db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (_, path), *_ = event_files(logdir)
    path.write_bytes(path.read_bytes()[:-7])  # cut inside the last record
    with Store(db_path) as store:
        summary = import_logdir(store, logdir)
        assert summary.points["baseline"] == 59  # the last scalar was in the cut record
        assert len(summary.truncated) == 1 and str(path) in summary.truncated[0]
        assert "truncated" in caplog.text and path.name in caplog.text
        assert len(store.read_points("sweep/lr3")) == 30


def test_corrupt_record_names_file_and_record_and_writes_nothing(
    logdir: Path, db_path: Path
) -> None:
    _, (_, path) = event_files(logdir)
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF  # inside an early record's payload: its CRC fails
    path.write_bytes(bytes(data))
    with Store(db_path) as store:
        with pytest.raises(TensorBoardError, match=r"record \d+: corrupt") as err:
            import_logdir(store, logdir)
        assert err.value.path == str(path) and err.value.record is not None
        assert store.runs().empty  # baseline, read before, was rolled back too


def test_cli_import_of_an_empty_logdir_exits_2(tmp_path: Path, db_path: Path) -> None:
    import runwatch.cli

    if "import_logdir" not in Path(runwatch.cli.__file__).read_text():
        pytest.skip("runwatch import does not dispatch directories to import_logdir yet")
    (tmp_path / "empty").mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "runwatch.cli", "import", str(tmp_path / "empty"), "--db", db_path],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert str(tmp_path / "empty") in out.stderr and "no TensorBoard event" in out.stderr


def test_source_reads_only_what_is_new_across_files_runs_and_restarts(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    writer = torch_tb.SummaryWriter(str(root / "a"), flush_secs=3600)
    source = TensorBoardSource(root)
    assert source.read_new() == []
    for step in range(5):
        writer.add_scalar("loss", float(step), step)
    writer.flush()
    first = source.read_new()
    assert [(r.run, r.step, r.tag, r.value) for r in first] == [
        ("a", s, "loss", float(s)) for s in range(5)
    ]
    assert source.read_new() == []
    write_run(root, "b", range(2))  # a new run directory
    writer.add_scalar("loss", 5.0, 5)
    writer.flush()
    state = source.state()
    again = TensorBoardSource(root)  # a restarted watcher
    again.restore(state)
    new = again.read_new()
    assert sorted((r.run, r.step, r.tag) for r in new) == sorted(
        [("a", 5, "loss")]
        + [("b", s, t) for s in range(2) for t in ("train/loss", "train/lr")]
        + [("b", s, "eval/acc") for s in range(2)]
    )
    assert source.read_new() == new  # the first source had not read them either
    writer.close()


def test_source_waits_for_a_record_written_in_two_parts(logdir: Path, tmp_path: Path) -> None:
    (_, path), *_ = event_files(logdir)
    data = path.read_bytes()
    growing = tmp_path / "live" / "run" / path.name
    growing.parent.mkdir(parents=True)
    growing.write_bytes(data[: len(data) // 2 + 3])  # ends inside a record
    source = TensorBoardSource(tmp_path / "live")
    first = source.read_new()
    cut = source.state()["files"][f"run/{path.name}"]["offset"]
    assert 0 < cut <= len(data) // 2 + 3
    with growing.open("ab") as fh:
        fh.write(data[len(data) // 2 + 3 :])
    rest = source.read_new()
    whole = TensorBoardSource(logdir).read_new()
    expected = [(r.step, r.tag) for r in whole if r.run == "baseline"]
    assert [(r.step, r.tag) for r in first + rest] == expected
    assert source.state()["files"][f"run/{path.name}"]["offset"] == len(data)
