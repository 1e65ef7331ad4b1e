"""A metric read without labels is the run's own series, however the run was logged: a run
pushed through ``runwatch serve`` labels its series with host and rank."""

from __future__ import annotations

import numpy as np

from runwatch.pipeline.analysis import forecast_run
from runwatch.store import open_store


def _write(store, run_id: int, attempt: int, metric: str, labels: dict, level: float) -> None:
    steps = np.arange(1, 301, dtype=np.int64)
    values = level + 8.0 * (steps + 20.0) ** -0.4
    sid = store.series_id(run_id, metric, labels)
    store.write(run_id, attempt, {sid: (steps, steps * 0.5, values)})


def test_a_served_run_reads_like_an_in_process_one(store_url) -> None:
    with open_store(store_url) as store:
        run_id, attempt = store.start_run("served", now=0.0)
        _write(store, run_id, attempt, "loss", {"host": "a", "rank": 1}, level=3.0)
        _write(store, run_id, attempt, "loss", {"host": "b", "rank": 0}, level=2.0)
        _write(store, run_id, attempt, "step_time_s", {"host": "a"}, level=1.0)
        loss = store.read_series("served", "loss")
        assert len(loss) == 300 and loss["value"].min() > 2.0 > loss["value"].min() - 1.0
        assert len(store.read_series("served", "step_time_s")) == 300  # host only: the run's
        assert store.read_series("served", "loss", {}).empty  # exactly unlabelled: none
        rank1 = store.read_series("served", "loss", {"host": "a", "rank": 1})
        assert rank1["value"].min() > 3.0
        # What reads "the run's loss" works on it: the forecast and its stored curve.
        result = forecast_run(store, "served", "loss")
        assert abs(result.predicted - loss["value"].iloc[-1]) < 0.05
        assert not store.expected_curve("served", "loss")[1].empty
