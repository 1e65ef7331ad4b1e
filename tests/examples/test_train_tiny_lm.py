"""End to end: a real PyTorch training loop on the CPU, a NaN, a crash, a resume, analyze."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the example needs torch (pip install torch==2.13.0)")

import runwatch
from runwatch.cli import main

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_tiny_lm.py"


def _train(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--steps",
            "60",
            "--checkpoint-every",
            "20",
            "--db",
            str(tmp_path / "runwatch.db"),
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )


def test_nan_crash_and_resume_are_all_visible(tmp_path, capsys):
    first = _train(tmp_path, "--nan-at", "25", "--crash-at", "50")
    assert first.returncode == 1 and "simulated crash at step 50" in first.stderr
    second = _train(tmp_path, "--resume")
    assert second.returncode == 0, second.stderr
    db = tmp_path / "runwatch.db"
    with runwatch.open_store(str(db)) as store:
        run = store.runs().iloc[0]
        loss = store.read_series("tiny-lm", "loss")
        everything = store.read_series("tiny-lm", "loss", all_attempts=True)
        kinds = store.events("tiny-lm")["kind"].tolist()
    assert (run["status"], run["attempts"], run["last_step"]) == ("finished", 2, 59)
    assert loss["step"].tolist() == list(range(60))  # the resumed attempt wins
    assert everything["superseded"].sum() == 10  # steps 41-50 were redone after the crash
    assert {"crash", "resume", "checkpoint"} <= set(kinds)
    assert main(["analyze", "--db", str(db), "--run", "tiny-lm", "--format", "json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    nan = [r for r in rows if r["detector"] == "nonfinite" and r["metric"] == "loss"]
    assert [r["start_step"] for r in nan] == [25]
