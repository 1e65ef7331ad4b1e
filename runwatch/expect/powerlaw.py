"""A robust power law in the step: L(s) = E + A·(s + s0)^-α."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from runwatch.expect._lm import cost_at, solve

MIN_POINTS = 6
"""Fewer finite bins than this is too little data to fit four parameters."""


class TooLittleData(ValueError):
    """Not enough finite points to fit an expected curve; carries how many there were."""

    def __init__(self, n: int, need: int, what: str = "points") -> None:
        super().__init__(f"too little data to fit an expected curve: {n} {what}, need >= {need}")
        self.n = n
        self.need = need


@dataclass(frozen=True, slots=True)
class PowerLaw:
    """A fitted L(s) = E + A·(s + s0)^-α; ``sigma`` is the robust residual scale of the fit.

    >>> p = PowerLaw(E=2.0, A=10.0, alpha=0.5, s0=0.0, sigma=0.01, n=100)
    >>> float(p.predict(np.array([100.0]))[0])
    3.0
    """

    E: float
    A: float
    alpha: float
    s0: float
    sigma: float
    n: int

    def predict(self, steps: np.ndarray) -> np.ndarray:
        s = np.asarray(steps, dtype=float)
        return self.E + self.A * np.power(np.maximum(s + self.s0, 1e-9), -self.alpha)


def median(x: np.ndarray) -> float:
    """``np.median`` of a short 1-d array, without its per-call overhead (refits take
    several of a dozen or two bins each): the same float, the middle value or the mean of
    the two middle ones as ``np.mean`` forms it; NaN if any value is."""
    n = x.size
    if n == 0 or np.isnan(x).any():
        return float(np.median(x))
    s = sorted(x.tolist())
    m = n // 2
    return s[m] if n % 2 else (s[m - 1] + s[m]) / 2.0


def noise_sigma(y: np.ndarray) -> float:
    """The robust noise scale of a curve: the median absolute first difference, scaled to
    a sigma (first differences do not carry the curve's fall)."""
    if y.size < 3:
        return 0.0
    return float(1.0484 * median(np.abs(np.diff(y))))


def soft_l1_scale(y: np.ndarray, span: float) -> float:
    """The soft-L1 loss's scale for a fit of ``y`` (``span``: its max - min): residuals
    beyond the curve's own noise count less; never zero, even on a noiseless curve."""
    return max(noise_sigma(y), 1e-3 * span, 1e-12)


def residual_sigma(res: np.ndarray) -> float:
    """The robust sigma of a fit's residuals (1.4826 times their MAD), its band's width."""
    return float(1.4826 * median(np.abs(res - median(res))))


def finite_points(steps, values, weights=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The points (and weights, 1 when not given) whose step and value are finite, as
    floats; ``TooLittleData`` below ``MIN_POINTS`` of them (what every fit needs)."""
    x = np.asarray(steps, dtype=float)
    y = np.asarray(values, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=float)
    x, y, w = x[ok], y[ok], w[ok]
    if x.size < MIN_POINTS:
        raise TooLittleData(int(x.size), MIN_POINTS)
    return x, y, w


def fit_power_law(
    steps: np.ndarray,
    values: np.ndarray,
    weights: np.ndarray | None = None,
    start: PowerLaw | None = None,
) -> PowerLaw:
    """Fit the power law to (binned) points with a soft-L1 loss, so outliers pull little.

    Steps are scaled to [0, 1] internally so the parameters are of order one whatever the
    run length. Raises ``TooLittleData`` below ``MIN_POINTS`` finite points. A constant
    curve fits as A = 0 (no crash). The loss is minimised by a small bounded
    Levenberg-Marquardt (``runwatch.expect._lm.solve``, compiled, analytic Jacobian) from
    the better of two starts: the best point of a grid over (α, s0) where E and A, being
    linear, are solved in closed form (variable projection), and ``start`` (an earlier fit)
    when given. Why not ``scipy.optimize.least_squares``: ``bench/README-fit-solver.md``.

    Parameters
    ----------
    steps, values : array-like
        The (binned) points; non-finite ones are left out.
    weights : array-like, optional
        The points' weights (default: all 1).
    start : PowerLaw, optional
        An earlier fit (a refit as the run goes), tried as a second start.
    """
    x, y, w = finite_points(steps, values, weights)
    xmax = float(max(x.max(), 1.0))
    xs = np.maximum(x, 0.0) / xmax
    ymin, ymax = float(y.min()), float(y.max())
    span = ymax - ymin
    if span <= 1e-12 * max(1.0, abs(ymax)):
        return PowerLaw(ymin, 0.0, 1.0, 1.0, 0.0, int(x.size))
    f_scale = soft_l1_scale(y, span)
    e_low = 0.0 if ymin > 0 else ymin - 10.0 * span
    lo = np.array([e_low, 0.0, 0.02, 1e-6])
    hi = np.array([ymin, np.inf, 3.0, 1.0])
    # Unit weights (the detectors' fits) are left out: multiplying by 1.0 changes nothing.
    unit = bool((w == 1.0).all())
    sws = None if unit else np.sqrt(w)
    starts = [_grid_start(xs, y, w, lo, hi)]
    if start is not None and start.A > 0:
        s0s = float(np.clip(start.s0 / xmax, lo[3], hi[3]))
        a_s = start.A * xmax ** (-start.alpha)
        p = np.array([min(start.E, ymin), a_s, start.alpha, s0s])
        starts.append(np.clip(p, lo, np.where(np.isinf(hi), p, hi)))
    f2 = f_scale * f_scale
    # One local solve, from whichever start fits better already: on the real runs' refits,
    # solving from both starts as well lowered the cost by at most 2e-4 relative (once;
    # median 0), at twice the cost.
    first = [cost_at(xs, y, sws, p.tolist(), f2) for p in starts]
    p0 = starts[int(np.argmin(first))]
    best, best_cost = solve(xs, y, sws, p0.tolist(), lo.tolist(), hi.tolist(), f2)
    if not math.isfinite(best_cost):  # pragma: no cover - defensive
        raise TooLittleData(int(x.size), MIN_POINTS, "usable points")
    e, a_s, alpha, s0s = best
    res = y - (e + a_s * np.power(xs + s0s, -alpha))
    sigma = residual_sigma(res)
    # Back to raw steps: A·(x/xmax + s0')^-α = A·xmax^α·(x + s0'·xmax)^-α.
    return PowerLaw(e, a_s * xmax**alpha, alpha, s0s * xmax, sigma, int(x.size))


ALPHA_GRID = np.geomspace(0.03, 2.5, 36)
"""The exponents α the fits' grid starts try (the power law's and the LR-area law's)."""
_S0S = np.geomspace(1e-4, 0.9, 12)
_GRID_ALPHA = np.repeat(ALPHA_GRID, _S0S.size)[:, None]
_GRID_NEG_ALPHA = -_GRID_ALPHA
_GRID_S0 = np.tile(_S0S, ALPHA_GRID.size)[:, None]


def _grid_start(xs: np.ndarray, y: np.ndarray, w: np.ndarray, lo, hi) -> np.ndarray:
    """Best (E, A, alpha, s0) on a grid: for fixed alpha and s0 the law is linear in E, A.

    Unit weights (the detectors' fits) skip the products by ``w``, which would change
    no float."""
    alpha, s0 = _GRID_ALPHA, _GRID_S0
    b = np.power(xs[None, :] + s0, _GRID_NEG_ALPHA)
    unit = bool((w == 1.0).all())
    wb = b if unit else w * b
    sw, sb, sbb = w.sum(), wb.sum(1), (wb * b).sum(1)
    sy, sby = (y if unit else w * y).sum(), (wb * y).sum(1)
    det = sw * sbb - sb * sb
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(det > 0, (sw * sby - sb * sy) / det, 0.0)
    a = np.maximum(np.nan_to_num(a), 0.0)
    e = np.clip((sy - a * sb) / sw, lo[0], hi[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.maximum(np.nan_to_num((wb * (y - e[:, None])).sum(1) / sbb), 0.0)
    with np.errstate(over="ignore"):  # a huge value: an infinite cost, never the best
        sq = (e[:, None] + a[:, None] * b - y) ** 2
    cost = (sq if unit else w * sq).sum(1)
    k = int(np.argmin(cost))
    return np.array([e[k], max(a[k], 1e-12), alpha[k, 0], s0[k, 0]])
