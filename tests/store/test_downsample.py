"""Downsampling keeps every spike, every NaN, and at most the points asked for."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwatch.store.downsample import minmax_downsample


def _frame(values: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"step": np.arange(len(values)), "value": values})


def test_one_step_spike_in_a_million_survives():
    values = np.random.default_rng(1).normal(3.0, 0.01, 1_000_000)
    values[654_321] = 30.0
    values[999] = -5.0
    small = minmax_downsample(_frame(values), 4000)
    assert len(small) <= 4000
    assert 30.0 in small["value"].to_numpy()
    assert -5.0 in small["value"].to_numpy()
    assert small["step"].is_monotonic_increasing


def test_nan_and_inf_survive():
    values = np.ones(100_000)
    values[[10, 50_000]] = np.nan
    values[77_777] = np.inf
    small = minmax_downsample(_frame(values), 1000)
    kept = set(small["step"])
    assert {10, 50_000, 77_777} <= kept
    assert len(small) <= 1000


def test_small_frames_are_returned_whole():
    frame = _frame(np.arange(10.0))
    assert minmax_downsample(frame, 100).equals(frame)


def test_too_few_points_asked_is_refused():
    with pytest.raises(ValueError, match="max_points must be >= 3"):
        minmax_downsample(_frame(np.arange(10.0)), 2)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(10, 5000),
    max_points=st.integers(3, 500),
    seed=st.integers(0, 1000),
)
def test_global_extremes_always_kept_and_bound_respected(n, max_points, seed):
    values = np.random.default_rng(seed).normal(size=n)
    small = minmax_downsample(_frame(values), max_points)
    assert len(small) <= max(max_points, 0) or len(small) == n
    assert small["value"].max() == values.max()
    assert small["value"].min() == values.min()
