"""Run ``ddp_job.py`` under a real torchrun (3 gloo ranks on the CPU, bounded) and read what
every rank stored: shared by the DDP and FSDP straggler tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

import runwatch

JOB = Path(__file__).with_name("ddp_job.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")
RANKS = 3


def run_job(out: Path, *args: str, fsdp: bool = False, ok: bool = True) -> pd.DataFrame:
    """torchrun the job (DDP, or FSDP2 with ``fsdp``); every rank's points, one frame."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node", str(RANKS), str(JOB)]
    cmd += ["--fsdp"] if fsdp else []
    proc = subprocess.run(
        [*cmd, "--out", str(out), *args], capture_output=True, text=True, timeout=150, env=env
    )
    if ok:
        assert proc.returncode == 0, proc.stderr[-3000:]
    run = "fsdp-job" if fsdp else "ddp-job"
    frames = [
        runwatch.open_store(str(out / f"rank{r}.db"), readonly=True).read_points(run)
        for r in range(RANKS)
    ]
    return pd.concat(frames, ignore_index=True)


def medians(points: pd.DataFrame, metric: str, lo: int, hi: int = 10**9) -> pd.Series:
    """Per rank, the median of ``metric`` over steps ``lo``..``hi``."""
    rows = points[(points["metric"] == metric) & points["step"].between(lo, hi)]
    return rows.groupby(rows["rank"].astype(int))["value"].median()
