"""replay_input: the arrays a replay takes, made without one Python object per row."""

from __future__ import annotations

import numpy as np
import pandas as pd

from runwatch.detect import analyze_frame
from runwatch.detect.replay import replay_input


def _frame(n: int = 600, shuffle: bool = False) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    steps = np.repeat(np.arange(n // 3), 3)
    frame = pd.DataFrame(
        {
            "metric": np.tile(["loss", "grad_norm", "step_time"], n // 3),
            "rank": pd.array(np.tile([None, 0.0, 1.0], n // 3), dtype=object),
            "host": [None] * n,
            "gpu": np.full(n, np.nan),
            "step": steps,
            "time": steps * 0.5,
            "value": 2.0 + rng.standard_normal(n) * 0.01,
        }
    )
    frame.loc[301, "value"] = 40.0  # a grad-norm spike
    frame.loc[300, "value"] = np.nan  # a NaN loss
    return frame.sample(frac=1.0, random_state=1) if shuffle else frame


def test_replay_input_takes_the_rows_in_step_order_as_objects():
    frame = _frame(shuffle=True)
    got = replay_input(frame)
    order = np.argsort(frame["step"].to_numpy(), kind="stable")
    assert got.metric.dtype == object
    assert got.metric.tolist() == frame["metric"].to_numpy(dtype=object)[order].tolist()
    assert got.steps.tolist() == frame["step"].to_numpy()[order].tolist()
    np.testing.assert_array_equal(got.values, frame["value"].to_numpy()[order])
    # empty label columns label nothing and are left out
    assert list(got.labels) == ["rank"]
    assert got.labels["rank"].tolist() == frame["rank"].to_numpy(dtype=object)[order].tolist()


def test_replay_input_shares_one_object_per_distinct_metric_name():
    got = replay_input(_frame())
    assert len({id(m) for m in got.metric}) == 3


def test_a_shuffled_frame_replays_alike_on_both_paths_and_finds_the_same_episodes():
    def found(anomalies):
        return sorted((a.detector, a.metric, str(a.labels), a.start_step) for a in anomalies)

    want = found(analyze_frame(_frame()))
    assert want  # the spike and the NaN
    shuffled = _frame(shuffle=True)
    fast, slow = analyze_frame(shuffled), analyze_frame(shuffled, fast=False)
    assert [vars_of(a) for a in fast] == [vars_of(a) for a in slow]
    assert found(fast) == want


def vars_of(a):
    return (a.detector, a.metric, a.labels, a.start_step, a.end_step, a.severity)


def test_an_empty_frame_replays_to_nothing():
    assert analyze_frame(pd.DataFrame({"metric": [], "step": [], "value": []})) == []
    assert len(replay_input(pd.DataFrame())) == 0


def test_replay_input_codes_each_series_once_by_metric_and_labels():
    """The series codes batch replay groups by: equal metric and labels (missing alike)
    share a code, and any difference in either gives another."""
    frame = _frame(shuffle=True)
    frame.loc[frame.index[:5], "rank"] = 7  # a few rows of a series of their own
    got = replay_input(frame)
    keys = [(m, r) for m, r in zip(got.metric.tolist(), got.labels["rank"].tolist(), strict=True)]
    keys = [(m, None if r is None or r != r else float(r)) for m, r in keys]
    by_key: dict = {}
    for code, key in zip(got.series.tolist(), keys, strict=True):
        assert by_key.setdefault(key, code) == code
    assert len(set(by_key.values())) == len(by_key) == len(set(keys))
