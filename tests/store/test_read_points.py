"""read_points builds its frame from arrays: the same frame as the merge-and-sort it
replaced, on runs with restarts, repeated steps, labels and ranges."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest

from runwatch.model import Event
from runwatch.store import open_store
from runwatch.store.points import latest_points, live_order, mark_superseded, read_blocks

COLUMNS = ["metric", "rank", "host", "gpu", "step", "time", "value", "attempt"]


def _reference(store, run, metrics=None, start=None, end=None, all_attempts=False):
    """read_points as it was: a pandas merge of the raw points with the catalogue, sorted."""
    run_id = store.run_id(run)
    catalogue = store.series(run_id)
    if metrics is not None:
        catalogue = catalogue[catalogue["metric"].isin(list(metrics))]
    raw = read_blocks(store._conn, catalogue["series_id"].tolist(), start, end)
    starts = store._attempt_starts(run_id)
    columns = list(COLUMNS)
    if all_attempts:
        points = raw.assign(superseded=mark_superseded(raw, starts))
        order = ["attempt", "step", "series_id"]
        columns.append("superseded")
    else:
        points = latest_points(raw, starts)
        order = ["step", "series_id"]
    merged = points.merge(catalogue.drop(columns="points"), on="series_id", how="left")
    return merged.sort_values(order, kind="stable")[columns].reset_index(drop=True)


def _pts(steps, rng):
    steps = np.asarray(steps, dtype=np.int64)
    return steps, steps * 0.5, rng.standard_normal(len(steps))


@pytest.fixture
def store(store_url):
    rng = np.random.default_rng(7)
    with open_store(store_url) as store:
        run_id, a1 = store.start_run("r")
        loss = store.series_id(run_id, "loss")
        st0 = store.series_id(run_id, "step_time", {"rank": 0, "host": "h0"})
        st1 = store.series_id(run_id, "step_time", {"rank": 1})
        gpu = store.series_id(run_id, "gpu_temp_c", {"gpu": 2})
        big = store.series_id(run_id, "grad_norm", {"rank": 0})
        store.write(
            run_id,
            a1,
            {
                loss: _pts(range(50), rng),
                st0: _pts(range(50), rng),
                st1: _pts([0, 1, 1, 2, 3, 3, 3, 4], rng),  # repeated steps: last one wins
                gpu: _pts(range(0, 50, 5), rng),
                big: _pts(range(10_000), rng),  # sealed blocks
            },
        )
        store.write(run_id, a1, {loss: _pts([50, 51, 51], rng), st0: _pts(range(50, 60), rng)})
        a2 = store.begin_attempt(run_id, 30, "restart")
        store.write(run_id, a2, {loss: _pts(range(30, 70), rng), big: _pts(range(30, 9000), rng)})
        store.begin_attempt(run_id, None, "restart")  # an attempt that logged nothing
        run_id, b1 = store.start_run("single")
        store.write(run_id, b1, {store.series_id(run_id, "loss"): _pts(range(100), rng)})
        store.start_run("empty")
        yield store


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"all_attempts": True},
        {"metrics": ["loss", "step_time"]},
        {"metrics": []},
        {"start": 5, "end": 40},
        {"start": 40, "all_attempts": True},
    ],
)
@pytest.mark.parametrize("run", ["r", "single", "empty"])
def test_read_points_gives_the_frame_the_merge_and_sort_gave(store, run, kwargs):
    got = store.read_points(run, **kwargs)
    pd.testing.assert_frame_equal(got, _reference(store, run, **kwargs), check_exact=True)


def test_live_order_keeps_the_last_of_a_repeated_step_and_drops_redone_steps():
    pts = {
        "series_id": np.array([1, 2, 1, 1, 2, 1, 1]),
        "step": np.array([0, 0, 1, 1, 1, 2, 1]),
        "attempt": np.array([1, 1, 1, 1, 1, 1, 2]),
    }
    # step 1 of series 1: written twice by attempt 1, then redone by attempt 2 (start 1)
    assert live_order(pts, {1: 0, 2: 1}).tolist() == [0, 1, 6]
    assert live_order(pts, {1: 0}).tolist() == [0, 1, 6, 4, 5]  # no restart known


def test_the_cross_rank_read_replays_events_of_a_run_with_no_fleet_series(store_url):
    from runwatch.detect.fleet.monitor import fleet_anomalies
    from runwatch.pipeline.fleet import run_fleet_anomalies

    rng = np.random.default_rng(3)
    with open_store(store_url) as store:
        run_id, a1 = store.start_run("r")
        store.write(run_id, a1, {store.series_id(run_id, "loss"): _pts(range(20), rng)})
        xid = Event("xid", 10, 5.0, rank=2, host="h", attrs={"xid": 79, "gpu": 1})
        store.add_events(run_id, a1, [xid])
        events = store.events("r")
        everything = fleet_anomalies(store.read_points("r", all_attempts=True), events)
        narrowed = run_fleet_anomalies(store, "r", events)
    assert [a.detector for a in everything] == ["hardware"]
    assert [(a.detector, a.labels, a.start_step) for a in narrowed] == [
        (a.detector, a.labels, a.start_step) for a in everything
    ]


def test_the_cross_rank_read_finds_what_reading_every_series_finds(store_url):
    from runwatch.detect.fleet.monitor import fleet_anomalies
    from runwatch.pipeline.fleet import run_fleet_anomalies

    rng = np.random.default_rng(5)
    steps = np.arange(200, dtype=np.int64)
    with open_store(store_url) as store:
        run_id, a1 = store.start_run("r")
        batch = {store.series_id(run_id, "loss"): _pts(steps, rng)}
        for rank in range(8):
            t = 1.0 + 0.01 * rng.standard_normal(200) + (0.3 if rank == 6 else 0.0) * (steps >= 100)
            sid = store.series_id(run_id, "step_time", {"rank": rank, "host": f"h{rank // 4}"})
            batch[sid] = (steps, steps * 1.0, t)
            gpu = store.series_id(run_id, "gpu_temp_c", {"rank": rank, "gpu": rank})
            batch[gpu] = (steps, steps * 1.0, 60.0 + (40.0 if rank == 3 else 0.0) * (steps > 150))
        store.write(run_id, a1, batch)
        events = store.events("r")
        everything = fleet_anomalies(store.read_points("r", all_attempts=True), events)
        narrowed = run_fleet_anomalies(store, "r", events)
    assert {a.detector for a in everything} >= {"straggler"}
    assert [asdict(a) for a in narrowed] == [asdict(a) for a in everything]


def test_a_restart_supersedes_its_steps_in_a_series_it_has_not_logged_yet(store_url):
    """Attempt 2 restarted from step 6 and so far logged grad_norm only: attempt 1's loss
    at steps 6-10 is lost work too, however the loss is read."""
    with open_store(store_url) as store:
        run_id, first = store.start_run("r", now=0.0)
        loss, grad = store.series_id(run_id, "loss"), store.series_id(run_id, "grad_norm")
        steps = np.arange(1, 11, dtype=np.int64)
        store.write(run_id, first, {sid: (steps, steps * 1.0, steps * 0.1) for sid in (loss, grad)})
        second = store.begin_attempt(run_id, 6, "restart", now=20.0)
        redo = np.arange(6, 9, dtype=np.int64)
        store.write(run_id, second, {grad: (redo, redo + 20.0, redo * 0.3)})
        everything = store.read_points("r")
        assert everything[everything["metric"] == "loss"]["step"].tolist() == [1, 2, 3, 4, 5]
        assert store.read_points("r", metrics=["loss"])["step"].tolist() == [1, 2, 3, 4, 5]
        assert store.read_series("r", "loss")["step"].tolist() == [1, 2, 3, 4, 5]
        lost = store.read_series("r", "loss", all_attempts=True)
        assert lost[lost["superseded"]]["step"].tolist() == [6, 7, 8, 9, 10]
