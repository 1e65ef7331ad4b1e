"""The power-law fitter: its own small solver must fit at least as well as scipy's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import least_squares

from runwatch.expect import PowerLaw, bin_arrays, fit_power_law
from runwatch.expect._lm import cost_at, solve
from runwatch.expect.powerlaw import median, noise_sigma


def _soft_l1_cost(law: PowerLaw, s: np.ndarray, y: np.ndarray) -> float:
    f = max(noise_sigma(y), 1e-3 * float(y.max() - y.min()), 1e-12)
    r = law.predict(s) - y
    return float(f * f * np.sum(np.sqrt(1.0 + (r / f) ** 2) - 1.0))


def _scipy_fit(s: np.ndarray, y: np.ndarray, start: PowerLaw) -> PowerLaw:
    """The same problem through scipy's trust-region solver, from the same start."""
    xmax = float(s.max())
    xs = s / xmax
    f = max(noise_sigma(y), 1e-3 * float(y.max() - y.min()), 1e-12)
    lo = [0.0, 0.0, 0.02, 1e-6]
    hi = [float(y.min()), np.inf, 3.0, 1.0]
    p0 = np.clip(
        [start.E, start.A * xmax**-start.alpha, start.alpha, start.s0 / xmax],
        lo,
        [h if np.isfinite(h) else 1e300 for h in hi],
    )
    r = least_squares(
        lambda p: p[0] + p[1] * (xs + p[3]) ** -p[2] - y,
        p0,
        bounds=(lo, hi),
        loss="soft_l1",
        f_scale=f,
        max_nfev=2000,
    )
    e, a, alpha, s0 = r.x
    return PowerLaw(e, a * xmax**alpha, alpha, s0 * xmax, 0.0, s.size)


@pytest.mark.parametrize("seed", range(8))
def test_fit_is_at_least_as_good_as_scipy_least_squares(seed):
    rng = np.random.default_rng(seed)
    s = np.arange(1, 20_001, dtype=float)
    alpha = 0.2 + 0.1 * seed
    y = (1.5 + 6.0 * (s + 50.0) ** -alpha) * np.exp(0.02 * rng.standard_normal(s.size))
    y[rng.integers(0, s.size, 40)] *= 2.0  # spikes the soft-L1 loss should shrug off
    bs, bv, _ = bin_arrays(s, y)
    start = PowerLaw(2.0, 5.0, 0.5, 10.0, 0.0, 0)  # a rough earlier fit
    ours = fit_power_law(bs, bv, start=start)
    theirs = _scipy_fit(bs, bv, start)
    assert _soft_l1_cost(ours, bs, bv) <= _soft_l1_cost(theirs, bs, bv) * (1 + 1e-6)


def test_refit_from_a_bad_start_still_finds_the_curve():
    s = np.arange(1, 5001, dtype=float)
    y = 2.0 + 8.0 * (s + 30.0) ** -0.4
    bs, bv, _ = bin_arrays(s, y)
    bad = PowerLaw(0.1, 1.0, 2.5, 0.01, 0.0, 0)  # far from the truth
    law = fit_power_law(bs, bv, start=bad)
    np.testing.assert_allclose(law.predict(s[::250]), y[::250], rtol=2e-3)


def test_fit_respects_the_bounds_on_a_rising_curve():
    s = np.arange(1, 2001, dtype=float)
    y = 1.0 + 1e-4 * s  # rises: the best a falling law can do is flat
    law = fit_power_law(s, y)
    assert law.A >= 0.0 and 0.02 <= law.alpha <= 3.0
    assert float(y.min()) + 1e-12 >= law.E


def test_weights_decide_which_points_the_fit_follows():
    """The weighted branch (the detectors always fit with unit weights): points given a
    tiny weight are all but ignored, and unit weights are the unweighted fit exactly."""
    bs, _, _ = bin_arrays(np.arange(1, 20_001, dtype=float), np.ones(20_000))
    truth = 2.0 + 8.0 * (bs + 30.0) ** -0.4
    y = truth.copy()
    late = bs > bs[int(0.6 * bs.size)]
    y[late] += 0.3  # the late bins sit well above the law
    w = np.where(late, 1e-6, 1.0)
    weighted = fit_power_law(bs, y, weights=w)
    plain = fit_power_law(bs, y)
    np.testing.assert_allclose(weighted.predict(bs), truth, rtol=2e-3)
    assert np.abs(plain.predict(bs[late]) - truth[late]).max() > 0.05  # pulled up by them
    assert fit_power_law(bs, y, weights=np.ones_like(y)) == plain


def test_solver_never_ends_worse_than_its_start_and_stays_in_the_box():
    """The compiled LM solver takes a step only when it lowers the cost, clips it into the
    bounds, and reports the cost of the parameters it returns."""
    rng = np.random.default_rng(3)
    lo = [0.0, 0.0, 0.02, 1e-6]
    for _ in range(200):
        n = int(rng.integers(6, 30))
        xs = np.sort(rng.uniform(0.0, 1.0, n))
        ys = 1.0 + 3.0 * (xs + 0.01) ** -0.3 * (1.0 + 0.05 * rng.standard_normal(n))
        hi = [float(ys.min()), math.inf, 3.0, 1.0]
        p0 = [float(rng.uniform(0, ys.min())), float(rng.uniform(0, 10))]
        p0 += [float(rng.uniform(0.02, 3.0)), float(rng.uniform(1e-6, 1.0))]
        sws = None if n % 2 else np.sqrt(rng.uniform(0.1, 3.0, n))
        p, cost = solve(xs, ys, sws, p0, lo, hi, 0.01)
        assert cost <= cost_at(xs, ys, sws, p0, 0.01)
        assert cost == cost_at(xs, ys, sws, p, 0.01)
        assert all(low <= v <= high for v, low, high in zip(p, lo, hi, strict=True))


def test_solver_refuses_a_start_whose_cost_is_not_finite():
    xs, ys = np.linspace(0.0, 1.0, 8), np.linspace(3.0, 2.0, 8)
    p, cost = solve(xs, ys, None, [math.nan, 1.0, 0.5, 0.1], [0.0] * 4, [2.0] * 4, 0.01)
    assert cost == math.inf and math.isnan(p[0])


def test_median_is_numpys_median_to_the_bit():
    rng = np.random.default_rng(7)
    for n in [1, 2, 3, 4, 5, 16, 17, 40] * 100:
        x = rng.standard_normal(n) * 10 ** rng.uniform(-8, 8)
        if rng.random() < 0.3:
            x = np.round(x, 1)  # ties
        assert median(x) == float(np.median(x))
    assert math.isnan(median(np.array([1.0, math.nan, 2.0])))
