"""The failure-aware ETA of a stored run: two attempts, checkpoint and crash events, in a
real SQLite store written through the store API."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from runwatch.model import Event
from runwatch.pipeline.eta import checkpoint_interval, eta_report
from runwatch.store import open_store

PACE = 2.0
START = 1000.0
DOWN = 300.0


def _write(store, run_id, attempt, first, last, t_first):
    """Loss points ``first``..``last``, one every PACE s from ``t_first``; checkpoints
    every 25 steps. The time of the last point."""
    steps = np.arange(first, last + 1, dtype=np.int64)
    times = t_first + (steps - first) * PACE
    store.write(
        run_id, attempt, {store.series_id(run_id, "loss"): (steps, times, 3.0 / (1 + steps))}
    )
    ckpts = [
        Event("checkpoint", int(s), float(t))
        for s, t in zip(steps, times, strict=True)
        if s and s % 25 == 0
    ]
    store.add_events(run_id, attempt, ckpts)
    return float(times[-1])


@pytest.fixture
def store(db_path):
    with open_store(str(db_path)) as store:
        run_id, first = store.start_run("r", now=START)
        end = _write(store, run_id, first, 0, 89, START + PACE)  # steps 0..89
        store.add_events(run_id, first, [Event("crash", 90, end + 1.0, "CUDA error")])
        second = store.begin_attempt(run_id, 76, "restart", now=end + 60.0)
        _write(store, run_id, second, 76, 149, end + DOWN)  # back to the checkpoint at 75
        store.start_run("empty", now=START)
        yield store


def test_two_attempts_give_one_failure_its_cost_and_the_goodput(store):
    eta = eta_report(store, "r", final_step=199)
    assert eta is not None and eta.failures == 1
    clean = 50 * PACE
    assert eta.eta_lower <= eta.eta_seconds < eta.eta_upper
    assert eta.eta_seconds > clean
    # 300 s down; redone steps 76..89 (14), with the checkpoint prior of 25 / 2 as one more.
    assert eta.cost_per_failure_s == pytest.approx(DOWN + (14 + 12.5) / 2 * PACE)
    # Kept: steps 1..75 of the first attempt, 77..149 of the second; wall from run start.
    last = START + PACE + 89 * PACE + DOWN + 73 * PACE
    assert eta.goodput == pytest.approx((75 + 73) * PACE / (last - START))
    assert set(eta.as_json()) == {"eta_seconds", "eta_lower", "eta_upper", "goodput"}


def test_upto_uses_only_what_was_known_then(store):
    before = eta_report(store, "r", upto=50, final_step=199)
    assert before is not None and before.failures == 0
    assert before.eta_seconds == pytest.approx(149 * PACE)
    assert before.eta_upper > before.eta_lower
    # Step 80 was first reached by the first attempt, but the second one's step 80 is kept.
    after = eta_report(store, "r", upto=80, final_step=199)
    assert after is not None and after.failures == 1
    assert after.eta_seconds > 119 * PACE


def test_no_timed_points_gives_none(store):
    assert eta_report(store, "empty", final_step=100) is None
    assert eta_report(store, "r", upto=-1, final_step=100) is None


def test_checkpoint_interval_from_events_else_from_restart_steps():
    events = pd.DataFrame({"kind": ["checkpoint"] * 3 + ["crash"], "step": [250, 500, 750, 5]})
    assert checkpoint_interval(events, np.array([101])) == 250.0
    none = events[events["kind"] != "checkpoint"]
    assert checkpoint_interval(none, np.array([101, 551, 601])) == 50.0
    assert checkpoint_interval(none, np.array([101])) is None
