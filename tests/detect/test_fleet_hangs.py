"""Hangs with a fake clock: the ranks behind, the step each reached, no sleeping."""

from __future__ import annotations

import pandas as pd
import pytest

from runwatch.detect.fleet.hangs import HangDetector
from runwatch.detect.fleet.monitor import fleet_anomalies


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def run_steps(det, clock, ranks, steps, step_s=2.0, stop=None):
    """Every rank reports each step; ``stop`` = {rank: last step it reaches}."""
    stop = stop or {}
    for step in steps:
        clock.now += step_s
        for r in range(ranks):
            if step <= stop.get(r, step):
                det.beat(r, step)


def test_one_hung_rank_is_named_with_its_last_step():
    clock = Clock()
    det = HangDetector(k=5.0, min_timeout_s=1.0, clock=clock)
    for r in range(64):
        det.set_labels(r, {"rank": r, "host": f"node-{r // 8}", "gpu": r % 8})
    run_steps(det, clock, 64, range(42), stop={17: 40})
    assert det.step_time == pytest.approx(2.0)
    # the frontier (step 40) was reached at t=82; the timeout is 5 x 2 s
    clock.now = 92.0
    assert det.check() == []
    clock.now = 92.5
    (a,) = det.check()
    assert a.labels == {"rank": 17, "host": "node-2", "gpu": 1}
    assert (a.start_step, a.severity, a.detector) == (40, "critical", "hang")
    assert a.details["behind"] == {17: 40} and a.details["furthest_step"] == 41
    assert a.details["ranks_behind"] == 1 and a.details["stalled_s"] == pytest.approx(10.5)
    assert det.check() == []  # one episode, not one per check
    det.beat(17, 41)
    assert not a.is_open and a.details["recovered"] is True


def test_a_job_wide_stall_names_no_rank():
    clock = Clock()
    det = HangDetector(k=3.0, min_timeout_s=0.0, clock=clock)
    run_steps(det, clock, 8, range(10))
    clock.now += 6.5
    (a,) = det.check()
    assert a.labels == {} and a.start_step == 9 and "all 8 ranks stopped at step 9" in a.message


def test_the_timeout_has_a_floor_before_any_step_time_is_learned():
    clock = Clock()
    det = HangDetector(min_timeout_s=60.0, clock=clock)
    det.beat(0, 0)
    clock.now = 1000.0
    assert det.check() == []  # no progress has been timed yet
    run_steps(det, clock, 1, range(1, 5), step_s=0.1)
    clock.now += 59.0
    assert det.check() == []
    clock.now += 2.0
    assert len(det.check()) == 1


def test_one_slow_checkpoint_step_does_not_stretch_the_step_time():
    clock = Clock()
    det = HangDetector(clock=clock)
    run_steps(det, clock, 4, range(20), step_s=1.0)
    clock.now += 30.0
    run_steps(det, clock, 4, range(20, 30), step_s=1.0)
    assert det.step_time == pytest.approx(1.0)


def test_restart_forgets_where_ranks_were_but_keeps_the_step_time():
    clock = Clock()
    det = HangDetector(min_timeout_s=0.0, clock=clock)
    run_steps(det, clock, 4, range(10), stop={2: 6})
    det.restart()
    run_steps(det, clock, 4, range(5, 8))
    clock.now += 4.0
    assert det.check() == [] and det.step_time == pytest.approx(2.0)


def test_replay_names_the_rank_from_the_superseded_attempt():
    ranks, hang_step = 16, 120
    rows = []
    for step in range(150):
        for r in range(ranks):
            if step <= hang_step - (r == 5):
                rows.append(("step_time", r, step, 1.0, 1000.0 + step, 1))
    for step in range(100, 130):  # attempt 2 resumes from the checkpoint at step 100
        for r in range(ranks):
            rows.append(("step_time", r, step, 1.0, 2000.0 + step, 2))
    points = pd.DataFrame(rows, columns=["metric", "rank", "step", "value", "time", "attempt"])
    events = pd.DataFrame(
        {"kind": ["restart"], "step": [100], "time": [1900.0], "message": [""], "attrs": ["{}"]}
    )
    hangs = [a for a in fleet_anomalies(points, events) if a.detector == "hang"]
    assert [(a.labels, a.start_step) for a in hangs] == [({"rank": 5}, hang_step - 1)]
    assert hangs[0].details["furthest_step"] == hang_step
    # replay has no clock between points: the hang is seen at the next thing that happened
    assert hangs[0].details["detected_at_time"] == 1900.0
    assert hangs[0].details["stalled_s"] == 1900.0 - (1000.0 + hang_step - 1)


def test_own_time_is_the_heartbeat_where_ranks_log_it():
    # A synchronous job: every rank logs the same wall step_time up to step 59, and its own
    # time (step_time_compute) a step late, as FSDP's timer does. Rank 2 never started step
    # 60, so its own time stops at 58; the wall time alone would show no rank behind.
    rows = [("step_time", r, s, 0.03, 1000.0 + s) for s in range(60) for r in range(3)]
    rows += [
        ("step_time_compute", r, s, 0.02, 1000.5 + s)
        for s in range(1, 60)
        for r in range(3)
        if s < 59 or r != 2
    ]
    points = pd.DataFrame(rows, columns=["metric", "rank", "step", "value", "time"])
    hangs = [a for a in fleet_anomalies(points, now=2000.0) if a.detector == "hang"]
    assert [(a.labels, a.start_step) for a in hangs] == [({"rank": 2}, 58)]
    assert hangs[0].details["furthest_step"] == 59
    wall_only = points[points["metric"] == "step_time"]
    (stall,) = [a for a in fleet_anomalies(wall_only, now=2000.0) if a.detector == "hang"]
    assert stall.labels == {} and "no rank is behind" in stall.message


def _two_attempts(crash_time: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """16 ranks step to 120 every second from t=1000, the job fails at ``crash_time``, and
    attempt 2 resumes from step 100 at t=2000 (a restart gap of minutes)."""
    rows = [("step_time", r, s, 1.0, 1000.0 + s, 1) for s in range(121) for r in range(16)]
    rows += [("step_time", r, s, 1.0, 2000.0 + s, 2) for s in range(100, 130) for r in range(16)]
    points = pd.DataFrame(rows, columns=["metric", "rank", "step", "value", "time", "attempt"])
    events = pd.DataFrame(
        {
            "kind": ["nccl_timeout", "restart"],
            "step": [120, 100],
            "time": [crash_time, 1990.0],
            "message": ["Watchdog caught collective operation timeout", ""],
            "attrs": ["{}", "{}"],
        }
    )
    return points, events


def test_the_downtime_after_a_failure_is_no_hang():
    points, events = _two_attempts(crash_time=1121.0)  # failed right after its last step
    assert [a for a in fleet_anomalies(points, events) if a.detector == "hang"] == []


def test_ranks_stuck_before_a_failure_are_a_hang():
    points, events = _two_attempts(crash_time=1720.0)  # 10 minutes in NCCL, then the timeout
    (hang,) = [a for a in fleet_anomalies(points, events) if a.detector == "hang"]
    assert hang.details["detected_at_time"] == 1720.0
