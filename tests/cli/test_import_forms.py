"""`runwatch import` on wide CSV, job logs (SRC --preset, --log FILE) and TensorBoard logdirs.

Each form writes to a real store; bad input exits 2 and leaves the store without a run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runwatch.cli import main
from runwatch.store import open_store

BLOOM = (
    " [default7]: iteration    {step}/  115311 | elapsed time per iteration (s): 105.22 | "
    "learning rate: 5.969E-05 | lm loss: {loss} | grad norm: 0.174 |"
)


def _runs(db: Path) -> list[str]:
    if not db.exists():
        return []
    with open_store(str(db), readonly=True) as store:
        return list(store.runs()["name"])


def test_wide_csv_is_detected_from_its_header(tmp_path: Path, capsys) -> None:
    src = tmp_path / "export.csv"
    src.write_text("_step,loss,acc\n0,1.0,\n1,0.5,0.1\n")
    db = tmp_path / "s.db"
    assert main(["import", str(src), "--db", str(db)]) == 0
    assert "imported 3 points in 2 series into run 'export'" in capsys.readouterr().out
    assert _runs(db) == ["export"]


def test_format_wide_forces_it(tmp_path: Path) -> None:
    src = tmp_path / "export.txt"  # no .csv: only --format wide makes it one
    src.write_text("step,loss\n0,1.0\n1,0.5\n")
    db = tmp_path / "s.db"
    assert main(["import", str(src), "--db", str(db), "--format", "wide", "--run", "w"]) == 0
    assert _runs(db) == ["w"]


@pytest.mark.parametrize(
    "body", ["step,loss\n0,1\n0,2\n", "step,loss\n0,1\n1,oops\n"], ids=["duplicate", "text"]
)
def test_bad_wide_csv_exits_2_and_writes_nothing(tmp_path: Path, capsys, body: str) -> None:
    src = tmp_path / "bad.csv"
    src.write_text(body)
    db = tmp_path / "s.db"
    assert main(["import", str(src), "--db", str(db)]) == 2
    assert "bad.csv:3" in capsys.readouterr().err
    assert _runs(db) == []


@pytest.mark.parametrize("form", ["src", "log"])
def test_job_log_with_a_preset(tmp_path: Path, capsys, form: str) -> None:
    src = tmp_path / "train.log"
    lines = [BLOOM.format(step=s, loss="2.5E+00") for s in (10, 20)]
    src.write_text("\n".join([*lines, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1"]) + "\n")
    db = tmp_path / "s.db"
    where = [str(src)] if form == "src" else ["--log", str(src)]
    assert main(["import", *where, "--preset", "megatron", "--db", str(db), "--run", "j"]) == 0
    out = capsys.readouterr().out
    assert "into run 'j'" in out and out.rstrip().endswith(", and 1 event")
    with open_store(str(db), readonly=True) as store:
        assert set(store.events("j")["kind"]) >= {"xid"}
        assert sorted(set(store.read_points("j")["step"])) == [10, 20]


def test_halfway_log_line_exits_2_and_writes_nothing(tmp_path: Path, capsys) -> None:
    src = tmp_path / "train.log"
    good, bad = BLOOM.format(step=10, loss="2.5E+00"), BLOOM.format(step=20, loss="2.5E+0x")
    src.write_text(f"{good}\n{bad}\n")
    db = tmp_path / "s.db"
    assert main(["import", str(src), "--preset", "megatron", "--db", str(db)]) == 2
    assert "train.log:2" in capsys.readouterr().err
    assert _runs(db) == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--preset", "regex"], "needs --pattern"),
        (["--preset", "regex", "--pattern", r"it (?P<step>\d+)"], "(?P<loss>...)"),
        (["--pattern", "x"], "--pattern goes with --preset regex"),
        (["--preset", "megatron", "--format", "csv"], "--format is for"),
    ],
)
def test_bad_options_exit_2(tmp_path: Path, capsys, extra: list[str], message: str) -> None:
    src = tmp_path / "train.log"
    src.write_text("it 1 loss 2\n")
    db = tmp_path / "s.db"
    assert main(["import", str(src), "--db", str(db), *extra]) == 2
    assert message in capsys.readouterr().err
    assert _runs(db) == []


def test_log_without_preset_or_with_src_is_refused(tmp_path: Path, capsys) -> None:
    src = tmp_path / "train.log"
    src.write_text("x\n")
    db = tmp_path / "s.db"
    assert main(["import", "--log", str(src), "--db", str(db)]) == 2
    assert main(["import", str(src), "--log", str(src), "--preset", "hf", "--db", str(db)]) == 2
    assert main(["import", "--db", str(db)]) == 2
    assert _runs(db) == []


def test_directory_is_read_as_a_tensorboard_logdir(tmp_path: Path, capsys) -> None:
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    logdir = tmp_path / "tb"
    with SummaryWriter(str(logdir / "run-a")) as writer:
        for step in range(5):
            writer.add_scalar("train/loss", 2.0 - 0.1 * step, step)
    db = tmp_path / "s.db"
    assert main(["import", str(logdir), "--db", str(db), "--run", "tb"]) == 0
    assert _runs(db) == ["tb"]
    with open_store(str(db), readonly=True) as store:
        assert len(store.read_points("tb")) == 5
