"""Point blocks: exact round trips, and compactness on real curves."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from runwatch.store.codec import decode_block, encode_block, encode_open_block

finite_or_not = st.floats(allow_nan=True, allow_infinity=True, width=64)


@settings(max_examples=200, deadline=None)
@given(
    data=st.integers(1, 300).flatmap(
        lambda n: st.tuples(
            arrays(np.int64, n, elements=st.integers(0, 2**40)),
            arrays(np.float64, n, elements=st.floats(0, 4e9)),
            arrays(np.float64, n, elements=finite_or_not),
        )
    )
)
def test_block_round_trip_is_exact_for_steps_and_values(data):
    steps, times, values = data
    got_steps, got_times, got_values = decode_block(encode_block(steps, times, values))
    assert np.array_equal(got_steps, steps)
    assert np.array_equal(got_values, values, equal_nan=True)
    # wall times are kept to the microsecond
    assert np.allclose(got_times, times, rtol=0, atol=1e-6 + 1e-15 * np.abs(times).max())


times_known_or_not = st.sampled_from(["all", "some", "none"])


@settings(max_examples=200, deadline=None)
@given(
    data=st.integers(1, 300).flatmap(
        lambda n: st.tuples(
            arrays(np.int64, n, elements=st.integers(-(2**40), 2**40)),
            arrays(np.float64, n, elements=st.floats(0, 4e9)),
            arrays(np.float64, n, elements=finite_or_not),
        )
    ),
    known=times_known_or_not,
)
def test_an_open_block_decodes_to_what_a_sealed_one_of_its_points_does(data, known):
    # The writer stores a series' newest points raw and rewrites them sealed later: a
    # reader must not see them change.
    steps, times, values = data
    if known != "all":
        times = times.copy()
        times[:: 2 if known == "some" else 1] = np.nan
    sealed = decode_block(encode_block(steps, times, values))
    opened = decode_block(encode_open_block(steps, times, values))
    for got, want in zip(opened, sealed, strict=True):
        assert got.dtype == want.dtype
        assert np.array_equal(got, want, equal_nan=True)
    assert opened[0].flags.writeable and opened[2].flags.writeable


def test_missing_times_come_back_missing():
    steps = np.arange(5)
    times = np.array([np.nan, 1.0, np.nan, 3.0, 4.0])
    _, got, _ = decode_block(encode_block(steps, times, np.ones(5)))
    assert np.array_equal(got, times, equal_nan=True)
    _, none, _ = decode_block(encode_block(steps, np.full(5, np.nan), np.ones(5)))
    assert np.isnan(none).all()


def test_float32_losses_cost_under_eight_bytes_per_point(real_runs):
    frame = pd.read_csv(real_runs / "mng_scaleup1b_20k.csv")
    loss = frame[frame["metric"] == "train_loss"]
    steps = loss["step"].to_numpy()
    values = loss["value"].astype(np.float32).astype(np.float64).to_numpy()
    times = 1.7e9 + np.cumsum(np.random.default_rng(0).normal(1.7, 0.05, len(steps)))
    blob = encode_block(steps, times, values)
    assert len(blob) / len(steps) < 8
