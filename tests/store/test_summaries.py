"""Block summaries: full-range downsampled reads from 1/10 of the data, every spike kept."""

from __future__ import annotations

import numpy as np

from runwatch.store import open_store
from runwatch.store.points import read_summarized


def _write(store, run_id, attempt, sid, steps, values):
    steps = np.asarray(steps, dtype=np.int64)
    store.write(run_id, attempt, {sid: (steps, 1.7e9 + steps * 0.5, np.asarray(values, float))})


def test_summarized_read_keeps_spikes_nan_and_the_bound(store_url):
    n = 1_000_000
    values = 2.0 + np.random.default_rng(0).normal(0, 0.01, n)
    values[654_321], values[12_345], values[777_777] = 30.0, -4.0, np.nan
    with open_store(store_url) as store:
        run_id, a1 = store.start_run("r")
        sid = store.series_id(run_id, "loss")
        _write(store, run_id, a1, sid, np.arange(n), values)
        assert read_summarized(store._conn, sid, None, None, 4000) is not None
        small = store.read_series("r", "loss", max_points=4000)
        full = store.read_series("r", "loss")
    assert len(small) <= 4000
    kept = dict(zip(small["step"], small["value"], strict=True))
    assert kept[654_321] == 30.0 and kept[12_345] == -4.0 and np.isnan(kept[777_777])
    finite = small["value"][np.isfinite(small["value"])]
    assert finite.max() == np.nanmax(full["value"]) and finite.min() == np.nanmin(full["value"])


def test_summarized_read_respects_restarts(store_url):
    with open_store(store_url) as store:
        run_id, a1 = store.start_run("r")
        sid = store.series_id(run_id, "loss")
        _write(store, run_id, a1, sid, np.arange(300_000), np.ones(300_000))
        a2 = store.begin_attempt(run_id, 200_000, "restart")
        values = np.full(100_000, 2.0)
        values[50_000] = 9.0
        _write(store, run_id, a2, sid, np.arange(200_000, 300_000), values)
        small = store.read_series("r", "loss", max_points=1000)
    late = small[small["step"] >= 200_000]
    assert set(late["attempt"]) == {a2}
    assert 9.0 in late["value"].tolist() and 1.0 not in late["value"].tolist()


def test_repeated_steps_fall_back_to_the_exact_read(store_url):
    with open_store(store_url) as store:
        run_id, a1 = store.start_run("r")
        sid = store.series_id(run_id, "loss")
        _write(store, run_id, a1, sid, np.arange(300_000), np.ones(300_000))
        _write(store, run_id, a1, sid, [10], [5.0])  # re-logged step: last value wins
        assert read_summarized(store._conn, sid, None, None, 1000) is None
        small = store.read_series("r", "loss", max_points=1000)
    assert 5.0 in small["value"].tolist()
