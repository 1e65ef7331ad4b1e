"""The power-law fitter: its own small solver must fit at least as well as scipy's."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import least_squares

from runwatch.expect import PowerLaw, bin_arrays, fit_power_law
from runwatch.expect.powerlaw import _robust_sigma


def _soft_l1_cost(law: PowerLaw, s: np.ndarray, y: np.ndarray) -> float:
    f = max(_robust_sigma(y), 1e-3 * float(y.max() - y.min()), 1e-12)
    r = law.predict(s) - y
    return float(f * f * np.sum(np.sqrt(1.0 + (r / f) ** 2) - 1.0))


def _scipy_fit(s: np.ndarray, y: np.ndarray, start: PowerLaw) -> PowerLaw:
    """The same problem through scipy's trust-region solver, from the same start."""
    xmax = float(s.max())
    xs = s / xmax
    f = max(_robust_sigma(y), 1e-3 * float(y.max() - y.min()), 1e-12)
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


@pytest.mark.parametrize("n", [2, 3, 4])
def test_written_out_damped_solves_equal_the_general_cholesky_bit_for_bit(n):
    """The LM step's 4x4 and 3x3 systems are solved by written-out code for speed; it must
    give exactly the floats of the general solver (the golden anomalies depend on it)."""
    from runwatch.expect.powerlaw import _damped_solve, _lin_solve

    rng = np.random.default_rng(n)
    for _ in range(200):
        a = rng.standard_normal((n, n)) * rng.lognormal(0, 3, n)
        h = (a @ a.T).tolist()
        dh = np.abs(np.diag(a @ a.T)).tolist()
        lam = float(rng.lognormal(-5, 4))
        v = rng.standard_normal(n).tolist()
        damped = [row[:] for row in h]
        for k in range(n):
            damped[k][k] += lam * dh[k]
        assert _damped_solve(h, dh, lam, v) == _lin_solve(damped, v)
