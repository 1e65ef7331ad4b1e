"""The hook at training cadence (issue 23): ``run.log`` wakes no thread, the writer drains on
its own clock or past a backlog threshold, and the column path stores what the one-by-one
path would."""

from __future__ import annotations

import math
import time

import numpy as np

import runwatch


def _series(db_path, run, metric):
    with runwatch.open_store(str(db_path), readonly=True) as store:
        return store.read_series(run, metric)


def _wait_for(condition, timeout=20.0):
    """Poll ``condition`` until true (the writer's clock is not under test; no bound on it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_log_never_wakes_the_writer(db_path):
    # An hour between drains: whatever the writer takes before flush() was a wake-up.
    run = runwatch.init(name="quiet", store=db_path, flush_interval=3600.0, monitor=False)
    for step in range(500):
        run.log({"loss": 1.0 / (step + 1), "lr": 3e-4}, step=step)
        run.log_labeled({"gpu_util": 0.5}, {"gpu": 0})  # what the system-metrics sampler calls
    time.sleep(0.2)  # a woken writer would have drained by now
    assert run._writer.worker.drains == 0
    assert run.stats()["pending"] == 1500
    assert run.flush(timeout=30)
    assert run.stats()["pending"] == 0
    assert run.stats()["written"] == 1500
    run.finish()
    assert len(_series(db_path, "quiet", "loss")) == 500


def test_points_reach_the_store_without_flush_on_the_writers_clock(db_path):
    run = runwatch.init(name="clock", store=db_path, monitor=False)
    run.log({"loss": 2.5}, step=7)
    assert _wait_for(lambda: len(_series(db_path, "clock", "loss")) == 1)
    assert run._writer.worker.drains >= 1
    run.finish()


def test_a_backlog_past_half_the_bound_wakes_the_writer(db_path):
    run = runwatch.init(
        name="backlog", store=db_path, max_pending_points=100, flush_interval=3600.0, monitor=False
    )
    for step in range(60):  # 60 points: past half of 100, under the bound
        run.log({"loss": float(step)}, step=step)
    assert _wait_for(lambda: run.stats()["pending"] == 0)
    assert run.stats()["dropped"] == {}
    run.finish()
    assert len(_series(db_path, "backlog", "loss")) == 60


def test_the_column_path_stores_what_one_by_one_would(db_path, caplog):
    run = runwatch.init(name="cols", store=db_path, flush_interval=3600.0, monitor=False)
    nan, inf = float("nan"), float("inf")
    calls = [
        ({"loss": 2.0, "n": 3}, 0),  # an int value among floats
        ({"loss": nan, "n": 4}, 1),
        ({"loss": inf, "n": 2**60}, 2),  # an int a float64 rounds
        ({"loss": 1.5, "n": 5}, 3),
        ({"loss": 1.0, "acc": 0.5}, 4),  # the names change: a new run of calls
        ({"loss": 0.9, "acc": 0.6}, 5),
        ({"loss": np.float32(0.8), "acc": True}, 6),  # NumPy and bool: one by one
        ({"loss": 0.7, "acc": "high"}, 7),  # a str is refused and counted
        ({"loss": 0.6, "": 1.0}, 8),  # a bad name, counted per point
        ({"loss": 0.5, "": 1.0}, 9),
        ({"loss": 3.0, "n": 10**400}, 3),  # the step goes back (a restart); an int too big
        ({"loss": 2.9, "n": 1}, 4),
    ]
    for data, step in calls:
        run.log(data, step=step)
    assert run.flush(timeout=30)
    stats = run.stats()
    run.finish()
    assert stats["dropped"] == {"bad_value": 2, "bad_name": 2}
    assert stats["logged"] == stats["written"] + 4 == 24
    loss = _series(db_path, "cols", "loss")
    assert loss["step"].tolist() == [0, 1, 2, 3, 4]  # redone steps: the latest attempt's
    assert loss["attempt"].tolist() == [1, 1, 1, 2, 2]
    assert loss["value"].tolist()[3:] == [3.0, 2.9]
    with runwatch.open_store(str(db_path), readonly=True) as store:
        first, n, acc = (
            (lambda f: f[f["attempt"] == 1])(store.read_series("cols", m, all_attempts=True))
            for m in ("loss", "n", "acc")
        )
    values = first["value"].tolist()
    assert values[0] == 2.0 and math.isnan(values[1]) and values[2] == inf
    assert values[3:] == [1.5, 1.0, 0.9, float(np.float32(0.8)), 0.7, 0.6, 0.5]
    assert n["value"].tolist() == [3.0, 4.0, float(2**60), 5.0]
    assert acc["step"].tolist() == [4, 5, 6] and acc["value"].tolist() == [0.5, 0.6, 1.0]
