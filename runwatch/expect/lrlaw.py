"""An LR-schedule-aware loss law, after Tissue et al. 2024 ("Scaling Law with Learning
Rate Annealing"): L(s) = L0 + A·S1(s)^-α - C·S2(s).

S1 is the forward area (the summed LR up to step s) and S2 the annealing area: the sum
of a momentum of LR decreases, m_i = λ·m_(i-1) + max(η_(i-1) - η_i, 0). Increases (a
warmup) add nothing to S2: counted as negative annealing, a warmup would leave S2 drifting
for thousands of steps after it, a bend the law would have to explain with C. A cosine or
warmup-stable-decay schedule lowers the loss during its decay; this law expects that
drop, where a plain power law in the step would call it an anomaly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from runwatch.expect._lm import cost_at, solve
from runwatch.expect._lrclock import momentum
from runwatch.expect.powerlaw import (
    ALPHA_GRID,
    MIN_POINTS,
    TooLittleData,
    finite_points,
    residual_sigma,
    soft_l1_scale,
)

DECAY = 0.999
"""λ, the momentum of the annealing term (the paper's default)."""


def lr_areas(
    lr_steps: np.ndarray, lr_values: np.ndarray, upto: int, decay: float = DECAY
) -> tuple[np.ndarray, np.ndarray]:
    """S1 and S2 at every integer step 0..upto, from an LR logged at some steps.

    The LR is interpolated linearly between logged steps and held flat beyond the last
    one (a forecast then assumes the LR stays where it is). Normalised by the peak LR so
    the parameters stay of order one.
    """
    ls = np.asarray(lr_steps, dtype=float)
    lv = np.asarray(lr_values, dtype=float)
    ok = np.isfinite(ls) & np.isfinite(lv)
    ls, lv = ls[ok], lv[ok]
    if ls.size == 0:
        raise TooLittleData(0, 1, "learning-rate points")
    order = np.argsort(ls, kind="stable")
    ls, lv = ls[order], lv[order]
    peak = float(np.max(np.abs(lv))) or 1.0
    grid = np.arange(int(upto) + 1, dtype=float)
    eta = np.interp(grid, ls, lv / peak)
    s1 = np.cumsum(eta)
    drop = np.concatenate(([0.0], np.maximum(eta[:-1] - eta[1:], 0.0)))
    m = momentum(drop, decay)
    s2 = np.cumsum(m)
    return s1, s2


@dataclass(frozen=True, slots=True)
class LRLaw:
    """A fitted L = L0 + A·S1^-α - C·S2 with the areas it was fitted on."""

    L0: float
    A: float
    alpha: float
    C: float
    sigma: float
    n: int
    s1: np.ndarray
    s2: np.ndarray

    def predict(self, steps: np.ndarray) -> np.ndarray:
        idx = np.clip(np.asarray(steps, dtype=float).round().astype(int), 0, self.s1.size - 1)
        s1 = np.maximum(self.s1[idx], 1e-9)
        return self.L0 + self.A * np.power(s1, -self.alpha) - self.C * self.s2[idx]


@dataclass(frozen=True, slots=True)
class AreaLaw:
    """L = E + A·S1^-α - C·S2 on areas given point by point (``runwatch.expect.LRClock``)."""

    E: float
    A: float
    alpha: float
    C: float
    sigma: float
    n: int

    def forward(self, s1: float) -> float:
        """The forward-area term A·S1^-α alone (what the LR's progress predicts)."""
        return self.A * max(s1, 1e-300) ** -self.alpha

    def part(self, s1: float, s2: float) -> float:
        """The law less its constant ``E``, as the expected-curve detector forms it."""
        return self.forward(s1) - self.C * s2

    def predict_areas(self, s1: np.ndarray, s2: np.ndarray) -> np.ndarray:
        return self.E + self.A * np.power(np.maximum(s1, 1e-300), -self.alpha) - self.C * s2


def fit_area_law(
    s1: np.ndarray,
    s2: np.ndarray,
    values: np.ndarray,
    weights: np.ndarray | None = None,
    start: AreaLaw | None = None,
) -> AreaLaw:
    """Fit L = E + A·S1^-α - C·S2 (soft-L1) on points or bins whose areas are known.

    The areas are scaled to at most 1 so the parameters are of order one. The loss is
    minimised by the power law's compiled Levenberg-Marquardt solver
    (``runwatch.expect._lm``, with this model's Jacobian) from the better of two starts:
    the best point of a grid over α where E, A and C, being linear, are solved by least
    squares, and ``start`` (a previous fit: a refit as the run goes) when given. It ends
    at a soft-L1 cost no higher than ``scipy.optimize.least_squares`` on synthetic
    schedules (``tests/expect/test_lrlaw.py``), and faster (``bench/README-fit-solver.md``).

    Parameters
    ----------
    s1, s2 : array-like
        The points' forward and annealing areas (``LRClock``, ``lr_areas``).
    values : array-like
        The (binned) loss at those points; non-finite points are left out.
    weights : array-like, optional
        The points' weights (default: all 1).
    start : AreaLaw, optional
        An earlier fit (a refit as the run goes), tried as a second start.
    """
    a1 = np.asarray(s1, dtype=float)
    a2 = np.asarray(s2, dtype=float)
    y = np.asarray(values, dtype=float)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=float)
    ok = np.isfinite(a1) & np.isfinite(a2) & np.isfinite(y) & (a1 > 0)
    a1, a2, y, w = a1[ok], a2[ok], y[ok], w[ok]
    if y.size < MIN_POINTS:
        raise TooLittleData(int(y.size), MIN_POINTS)
    ymin, span = float(y.min()), float(np.ptp(y))
    if span <= 1e-12 * max(1.0, abs(ymin)):
        return AreaLaw(ymin, 0.0, 1.0, 0.0, 0.0, int(y.size))
    top = float(a1.max())
    a1n = a1 / top
    sw = np.sqrt(w)
    f_scale = soft_l1_scale(y, span)
    s2max = float(np.abs(a2).max())
    # Without an anneal in the data (S2 all zero) C cannot be told apart: it is held at 0.
    a2n = a2 / s2max if s2max > 0 else a2
    e_low = 0.0 if ymin > 0 else ymin - 10.0 * span
    lo = [e_low, 0.0, 0.02, 0.0]
    hi = [ymin + span, math.inf, 3.0, math.inf if s2max > 0 else 0.0]
    starts = [_grid_start(a1n, a2n, y, w, lo, hi)]
    if start is not None and start.A > 0:
        p = [start.E, start.A * top**-start.alpha, start.alpha, start.C * s2max]
        starts.append([min(max(v, low), high) for v, low, high in zip(p, lo, hi, strict=True)])
    f2 = f_scale * f_scale
    sws = None if bool((w == 1.0).all()) else sw
    costs = [cost_at(a1n, y, sws, p, f2, a2n) for p in starts]
    p0 = starts[int(np.argmin(costs))]
    (e, a, alpha, c), _ = solve(a1n, y, sws, p0, lo, hi, f2, zs=a2n)
    res = e + a * np.power(a1n, -alpha) - c * a2n - y
    sigma = residual_sigma(res)
    return AreaLaw(e, a * top**alpha, alpha, c / s2max if s2max > 0 else 0.0, sigma, int(y.size))


def fit_lr_law(
    steps: np.ndarray,
    values: np.ndarray,
    lr_steps: np.ndarray,
    lr_values: np.ndarray,
    horizon: int,
    weights: np.ndarray | None = None,
) -> LRLaw:
    """Fit the law on (binned) points; the areas are computed up to ``horizon`` steps."""
    x, y, w = finite_points(steps, values, weights)
    horizon = int(max(horizon, x.max()))
    s1, s2 = lr_areas(lr_steps, lr_values, horizon)
    idx = np.clip(x.round().astype(int), 0, horizon)
    law = fit_area_law(np.maximum(s1[idx], 1e-9), s2[idx], y, w)
    return LRLaw(law.E, law.A, law.alpha, law.C, law.sigma, law.n, s1, s2)


def _grid_start(
    x: np.ndarray, z: np.ndarray, y: np.ndarray, w: np.ndarray, lo: list[float], hi: list[float]
) -> list[float]:
    """The best (E, A, α, C) on a grid of α: for a fixed α the law is linear in E, A and
    C, solved by weighted least squares (one pseudo-inverse for the whole grid) and
    clipped into the bounds."""
    sw = np.sqrt(w)
    b = np.power(x[None, :], -ALPHA_GRID[:, None])  # one row per alpha
    cols = [np.broadcast_to(sw, b.shape), b * sw]
    if hi[3] > lo[3]:
        cols.append(np.broadcast_to(-z * sw, b.shape))
    coef = np.linalg.pinv(np.stack(cols, axis=2)) @ (sw * y)
    e = np.clip(coef[:, 0], lo[0], hi[0])
    a = np.clip(coef[:, 1], lo[1], hi[1])
    c = np.clip(coef[:, 2], lo[3], hi[3]) if coef.shape[1] == 3 else np.zeros_like(e)
    cost = (w * (e[:, None] + a[:, None] * b - c[:, None] * z - y) ** 2).sum(axis=1)
    k = int(np.argmin(cost))
    return [float(e[k]), float(a[k]), float(ALPHA_GRID[k]), float(c[k])]
