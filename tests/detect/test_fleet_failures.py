"""Failure, MTBF, goodput and ETA figures on a scripted run, computed by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from runwatch.detect.fleet.failures import failure_report
from runwatch.model import Event
from runwatch.pipeline.fleet import fleet_report
from runwatch.store import open_store


def steps_at(first, last, t0):
    """Steps first..last, one every 2 s from t0."""
    s = np.arange(first, last + 1)
    return s, t0 + 2.0 * (s - first), np.ones(s.size)


@pytest.fixture
def scripted(db_path):
    """Four attempts: a crash (seen by ranks 3 and 4), an OOM, a silent death, then clean.

    attempt  starts  start step  steps   step times          ends with
    1        t=0     0           0..9    t=5,7,...,23        crash at t=24 (ranks 3, 4)
    2        t=40    6           6..14   t=50,52,...,66      oom at t=67
    3        t=80    12          12..19  t=85,87,...,99      nothing (died silently)
    4        t=110   18          18..24  t=112,...,124       still running
    """
    store = open_store(str(db_path))
    run_id, a1 = store.start_run("scripted", now=0.0)
    sid = store.series_id(run_id, "step_time")
    store.write(run_id, a1, {sid: steps_at(0, 9, 5.0)})
    store.add_events(
        run_id,
        a1,
        [Event("crash", 9, 24.0, "CUDA error", rank=3), Event("crash", 9, 24.1, "", rank=4)],
    )
    a2 = store.begin_attempt(run_id, 6, "restart", now=40.0)
    store.write(run_id, a2, {sid: steps_at(6, 14, 50.0)})
    store.add_events(run_id, a2, [Event("oom", 14, 67.0, "CUDA out of memory")])
    a3 = store.begin_attempt(run_id, 12, "restart", now=80.0)
    store.write(run_id, a3, {sid: steps_at(12, 19, 85.0)})
    a4 = store.begin_attempt(run_id, 18, "restart", now=110.0)
    store.write(run_id, a4, {sid: steps_at(18, 24, 112.0)})
    return store


def test_figures_match_the_hand_computation(scripted):
    r = fleet_report(scripted, "scripted", final_step=100)
    # Cut-offs (first redone step): attempt 1 -> 6, 2 -> 12, 3 -> 18, 4 -> none.
    # startup: 5 + 10 + 5 + 2; productive: 2 s x (5 + 5 + 5 + 6) kept steps;
    # redone: 2 s x (4 + 3 + 2); downtime: (40-23) + (80-66) + (110-99).
    assert r.badput == {"startup": 22.0, "redone": 18.0, "downtime": 42.0, "stalled": 0.0}
    assert r.productive_s == 42.0 and r.wall_s == 124.0
    assert r.productive_s + sum(r.badput.values()) == r.wall_s
    assert r.goodput == 42.0 / 124.0
    assert (r.productive_steps, r.redone_steps, r.steps_run) == (21, 9, 30)
    assert r.failures["kind"].tolist() == ["crash", "oom", "restart"]
    assert r.failures["ranks"].tolist() == [[3, 4], [], []]
    assert r.failures["events"].tolist() == [2, 1, 0]
    assert r.failures_n == 3
    assert r.failures_per_1k_steps == 100.0
    assert r.failures_per_day == 3 * 86_400 / 124.0
    assert r.uptime_s == 23.0 + 26.0 + 19.0 + 14.0
    assert r.mtbf_s == 82.0 / 3 and r.mtbf_steps == 10.0
    assert r.tbf_s == [23.0, 26.0, 19.0]
    assert r.mtbf_trend == 19.0 / 24.5  # failures coming faster: < 1
    assert r.time_lost_s == 18.0 + 42.0 + 17.0
    assert r.mean_step_s == 2.0 and r.current_step == 24
    assert r.eta_no_failures_s == 76 * 2.0
    assert r.eta_s == pytest.approx(152.0 + 76 * (3 / 30) * (77.0 / 3), rel=1e-12)


def test_a_run_that_stopped_counts_stalled_time_and_no_failure(scripted):
    r = fleet_report(scripted, "scripted", now=150.0)
    assert r.badput["stalled"] == 26.0 and r.wall_s == 150.0
    assert r.failures_n == 3 and r.eta_s is None


def test_a_finished_attempt_followed_by_a_resume_is_not_a_failure():
    attempts = pd.DataFrame({"attempt": [1, 2], "start_step": [0, 10], "start_time": [0.0, 100.0]})
    points = pd.DataFrame(
        {
            "attempt": [1] * 10 + [2] * 10,
            "step": list(range(20)),
            "time": [1.0 + i for i in range(10)] + [101.0 + i for i in range(10)],
        }
    )
    events = pd.DataFrame({"kind": ["finish"], "step": [9], "time": [10.5], "attempt": [1]})
    r = failure_report(events, attempts, points)
    assert r.failures_n == 0 and r.mtbf_s is None and r.failures_per_day == 0.0
    assert r.badput["redone"] == 0.0 and r.productive_s == 18.0


def test_improving_failure_rate_shows_in_the_trend():
    # attempts of uptime 10, 10, 40, 40 s each ended by a crash: later failures are rarer
    starts = [0.0, 20.0, 40.0, 90.0, 140.0]
    lengths = [10, 10, 40, 40, 5]
    rows, step = [], 0
    for a, (t0, n) in enumerate(zip(starts, lengths, strict=True), start=1):
        for k in range(n + 1):
            rows.append((a, step + k, t0 + k))
        step += n + 1
    points = pd.DataFrame(rows, columns=["attempt", "step", "time"])
    attempts = points.groupby("attempt", as_index=False).agg(start_step=("step", "min"))
    attempts["start_time"] = starts
    events = pd.DataFrame(
        {
            "kind": ["crash"] * 4,
            "step": [0] * 4,
            "time": [s + 0.5 for s in starts[1:]],
            "attempt": [1, 2, 3, 4],
        }
    )
    r = failure_report(events, attempts, points)
    assert r.tbf_s == [10.0, 10.0, 40.0, 40.0] and r.mtbf_trend == 4.0


def test_no_step_clock_is_a_clear_error():
    with pytest.raises(ValueError, match="no step clock"):
        failure_report(None, None, pd.DataFrame({"step": [], "time": []}))
