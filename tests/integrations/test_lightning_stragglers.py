"""Lightning's own DDP launcher (3 CPU ranks, gloo): ranks read without RANK, and the per-rank
timing turned on by GradNormCallback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning.pytorch")

import runwatch

JOB = Path(__file__).parents[1] / "torch" / "lightning_job.py"


def test_lightning_ddp_ranks_are_told_apart_and_rank_zero_times_its_wait(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(JOB), str(tmp_path), "1"],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = [json.loads(p.read_text()) for p in tmp_path.glob("rank-*.json")]
    assert sorted(s["global_rank"] for s in seen) == [0, 1, 2]
    for s in seen:
        # the children have no RANK; the rank is still read, and agrees with Lightning's
        assert s["rank"] == s["global_rank"] and s["world"] == 3
        if s["global_rank"] > 0:
            assert not s["has_RANK"] and s["env_rank"] == s["global_rank"]
    store = runwatch.open_store(str(tmp_path / "rw.db"), readonly=True)
    pts = store.read_points("lit-ddp", ["step_time_compute", "comm_wait_time"])
    assert set(pts["rank"].astype(int)) == {0}
    wait = pts[pts["metric"] == "comm_wait_time"].set_index("step")["value"]
    own = pts[pts["metric"] == "step_time_compute"].set_index("step")["value"]
    # rank 1 slows from step 40 by 30 ms: rank 0 waits about that much more, and the time is
    # not put on rank 0's own account (its own time may fall as warm-up ends, not rise)
    assert wait.loc[50:].median() - wait.loc[15:38].median() > 0.015
    assert own.loc[50:].median() - own.loc[15:38].median() < 0.010
