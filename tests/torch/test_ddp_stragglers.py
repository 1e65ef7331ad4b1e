"""runwatch.torch under a real torchrun (3 ranks, gloo, the CPU): own time, wait, stragglers,
job-wide slowdowns and hangs, from what each rank's hook logged."""

from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import runwatch  # noqa: E402
from runwatch.detect.fleet.jobwide import merge_job_wide  # noqa: E402
from runwatch.detect.fleet.monitor import FleetMonitor, fleet_anomalies  # noqa: E402
from runwatch.pipeline.analysis import analyze_run  # noqa: E402
from runwatch.torch import NotInstrumentable, instrument  # noqa: E402
from tests.torch.torchrun_jobs import medians, run_job  # noqa: E402


def test_instrument_refuses_a_process_without_a_group_in_one_line():
    with pytest.raises(NotInstrumentable, match=r"no torch\.distributed process group") as e:
        instrument(torch.nn.Linear(2, 2))
    assert "\n" not in str(e.value)


def test_instrument_refuses_a_model_not_wrapped_in_ddp(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        with pytest.raises(NotInstrumentable, match="not DistributedDataParallel; wrap it"):
            instrument(torch.nn.Linear(2, 2))
    finally:
        dist.destroy_process_group()


def test_a_rank_slowed_by_half_computes_most_and_waits_least(tmp_path):
    pts = run_job(tmp_path, "--slow", "1", "--factor", "0.5", "--steps", "220")
    compute = medians(pts, "step_time_compute", 120)
    wait = medians(pts, "comm_wait_time", 120)
    wall = medians(pts, "step_time", 120)
    assert compute.idxmax() == 1 and compute[1] > 1.2 * compute.drop(1).max()
    assert wait.idxmin() == 1
    # the wall step time the README logs does not tell the ranks apart
    assert wall.max() / wall.min() < 1.15
    # the loss (run-level) is logged by rank 0 only; the timings by every rank
    assert set(pts.loc[pts["metric"] == "loss", "rank"].astype(int)) == {0}
    stragglers = [a for a in fleet_anomalies(pts) if a.detector == "straggler"]
    (named,) = [a for a in stragglers if a.labels["rank"] == 1]
    assert 100 <= named.details["detected_at"] <= 150  # within 50 steps
    assert named.details["slowdown"] > 1.3 and named.details["wait_agrees"]
    assert "named by its own compute time (step_time_compute)" in named.message
    assert "it waits least in the all-reduce" in named.message
    # a healthy rank may drift a little on two shared cores; it is never made a big straggler
    assert all(a.details["slowdown"] < 1.2 for a in stragglers if a.labels["rank"] != 1)


def test_no_rank_slowed_names_no_real_straggler(tmp_path):
    pts = run_job(tmp_path, "--steps", "220")
    stragglers = [a for a in fleet_anomalies(pts) if a.detector == "straggler"]
    # a healthy rank drifting a little is possible here (bench/results/ddp_stragglers.md)
    assert all(a.details["slowdown"] < 1.2 for a in stragglers), [a.message for a in stragglers]


def test_every_rank_slowed_is_one_job_wide_finding(tmp_path):
    pts = run_job(tmp_path, "--all", "--factor", "1.0", "--steps", "220")
    per_rank = []
    for r in range(3):
        store = runwatch.open_store(str(tmp_path / f"rank{r}.db"))
        per_rank += [
            a
            for a in analyze_run(store, "ddp-job", save=False).anomalies
            if a.metric in ("step_time", "step_time_compute")
        ]
    # the fleet median moves with every rank: nobody is made a straggler of it
    stragglers = [a for a in fleet_anomalies(pts) if a.detector == "straggler"]
    assert all(a.details["slowdown"] < 1.2 for a in stragglers), [a.message for a in stragglers]
    flagged: dict = {}
    for a in per_rank:
        flagged.setdefault((a.detector, a.metric), set()).add(a.labels["rank"])
    everywhere = {key for key, ranks in flagged.items() if ranks == {0, 1, 2}}
    # the per-series Monitor sees the slowdown on every rank: one episode per rank ...
    assert everywhere, flagged
    merged = merge_job_wide(per_rank, ranks=3)
    for key in everywhere:
        # ... and the merge makes it one job-level finding, the ranks listed
        # (a rank may also have had an episode of its own before the slowdown)
        (one,) = [a for a in merged if (a.detector, a.metric) == key and a.end_step >= 110]
        assert one.details["ranks"] == [0, 1, 2] and "rank" not in one.labels
        assert one.message.startswith("job-wide on all 3 ranks (0, 1, 2)")


def test_a_rank_hanging_before_the_collective_is_named(tmp_path):
    began = time.time()
    pts = run_job(
        tmp_path, "--hang", "2", "--hang-step", "60", "--hang-s", "4", "--steps", "200", ok=False
    )
    # checked when the job has died, with a hang timeout shorter than the 4 s stall
    fm = FleetMonitor(hang={"min_timeout_s": 2.0})
    hangs = [a for a in fleet_anomalies(pts, now=time.time(), monitor=fm) if a.detector == "hang"]
    assert time.time() - began < 90
    assert hangs, "no hang found"
    named = {a.labels["rank"] for a in hangs}
    assert named == {2}
    assert "rank 2" in hangs[0].message and hangs[0].details["last_step"] == 59
    last = pts[pts["metric"] == "step_time_compute"].groupby("rank")["step"].max()
    assert last.loc[2] < last.drop(2).min()
    assert np.isfinite(last).all()
