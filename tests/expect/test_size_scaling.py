"""The size laws over the curves of a family's sizes; the shared law in particular."""

from __future__ import annotations

import numpy as np
import pytest

from runwatch.expect.size_scaling import SHARED_FROM, scale_to

SIZES = np.array([1e5, 2e5, 4e5, 8e5])
STEPS = np.arange(1001, dtype=float)


def separable(params):
    """L = g(s) + A·N^-a: the same gap between sizes at every step."""
    g = 2.0 + 3.0 * (STEPS + 10) ** -0.3
    return g[None, :] + 0.8 * (np.asarray(params, dtype=float)[:, None] / 1e5) ** -0.4


def test_the_shared_law_carries_a_separable_family_to_another_size():
    got = scale_to(separable(SIZES), SIZES, 3.2e6, "shared")
    want = separable([3.2e6])[0]
    start = int(SHARED_FROM * STEPS[-1])
    np.testing.assert_allclose(got[start:], want[start:], rtol=3e-3)  # a on a grid
    line = scale_to(separable(SIZES), SIZES, 3.2e6, "loglog")
    assert abs(line[-1] / want[-1] - 1) > 0.01  # the line cannot bend towards g(s)


def test_before_the_shared_steps_the_gap_shrinks_where_the_sizes_are_together():
    curves = separable(SIZES)
    early = int(SHARED_FROM * STEPS[-1]) // 2
    curves[:, :early] = curves[-1, :early]  # every size on the same curve early on
    got = scale_to(curves, SIZES, 3.2e6, "shared")
    np.testing.assert_allclose(got[:early], curves[-1, :early], rtol=1e-9)


def test_the_shared_law_needs_three_sizes_and_an_unknown_law_is_refused():
    two = separable(SIZES[:2])
    np.testing.assert_allclose(
        scale_to(two, SIZES[:2], 8e5, "shared"), scale_to(two, SIZES[:2], 8e5, "loglog")
    )
    with pytest.raises(ValueError, match="unknown size law 'bent'"):
        scale_to(two, SIZES[:2], 8e5, "bent")
