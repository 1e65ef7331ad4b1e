"""Job-wide slowdowns as one finding, and a straggler's message naming its signal."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from runwatch.detect.fleet.jobwide import merge_job_wide
from runwatch.detect.fleet.monitor import fleet_anomalies
from runwatch.model import Anomaly


def episode(rank, start, end, detector="regression", metric="step_time", severity="critical"):
    return Anomaly(
        detector,
        metric,
        start,
        end,
        severity,
        3.0,
        1.2,
        f"slower on {rank}",
        labels={"rank": rank, "host": "n1"},
    )


def test_every_rank_regressing_together_is_one_job_level_episode():
    eps = [episode(r, 100 + r, 300) for r in range(4)] + [episode(0, 50, 60, "spike", "loss")]
    merged = merge_job_wide(eps, ranks=4)
    job = [a for a in merged if a.details.get("job_wide")]
    assert len(merged) == 2 and len(job) == 1
    (one,) = job
    assert (one.start_step, one.end_step, one.details["ranks"]) == (100, 300, [0, 1, 2, 3])
    assert one.labels == {"host": "n1"} and one.severity == "critical"
    assert one.message.startswith("job-wide on all 4 ranks (0, 1, 2, 3)")


def test_one_rank_or_disjoint_episodes_are_left_alone():
    eps = [episode(1, 100, 200), episode(2, 400, 500)]
    assert merge_job_wide(eps, ranks=8) == eps
    stragglers = [episode(r, 10, 90, detector="straggler") for r in range(3)]
    assert merge_job_wide(stragglers, ranks=3) == stragglers


def test_half_the_ranks_is_enough_by_default_and_the_share_is_said():
    eps = [episode(r, 100, 200) for r in (0, 2)]
    (one,) = merge_job_wide(eps, ranks=4)
    assert one.message.startswith("job-wide on 2 of 4 ranks (0, 2)")
    with pytest.raises(ValueError, match="valid values"):
        merge_job_wide(eps, min_share=0.0)


def test_a_straggler_named_by_own_time_says_so_and_that_it_waits_least():
    rng = np.random.default_rng(3)
    steps, ranks = np.meshgrid(np.arange(300), np.arange(4), indexing="ij")
    own = 0.010 * (1 + 0.01 * rng.standard_normal(steps.shape))
    own[150:, 2] *= 1.5
    wait = 0.020 - own + 0.001  # the others wait for the slowest
    frames = [
        pd.DataFrame(
            {
                "metric": m,
                "step": steps.ravel(),
                "rank": ranks.ravel(),
                "value": v.ravel(),
                "time": steps.ravel() * 0.03,
            }
        )
        for m, v in (("step_time_compute", own), ("comm_wait_time", wait))
    ]
    (a,) = fleet_anomalies(pd.concat(frames, ignore_index=True))
    assert a.labels == {"rank": 2} and a.details["signal"] == "step_time_compute"
    assert a.details["wait_agrees"] and a.details["wait_ratio"] < 0.9
    assert "named by its own compute time (step_time_compute)" in a.message
    assert "it waits least in the all-reduce" in a.message
    assert 150 <= a.details["detected_at"] <= 200
