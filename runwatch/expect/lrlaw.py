"""An LR-schedule-aware loss law, after Tissue et al. 2024 ("Scaling Law with Learning
Rate Annealing"): L(s) = L0 + A·S1(s)^-α - C·S2(s).

S1 is the forward area (the summed LR up to step s) and S2 the annealing area: the sum
of a momentum of LR decreases, m_i = λ·m_(i-1) + (η_(i-1) - η_i). A cosine or
warmup-stable-decay schedule lowers the loss during its decay; this law expects that
drop, where a plain power law in the step would call it an anomaly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares
from scipy.signal import lfilter

from runwatch.expect.powerlaw import MIN_POINTS, TooLittleData

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
    drop = np.concatenate(([0.0], eta[:-1] - eta[1:]))
    m = lfilter([1.0], [1.0, -decay], drop)
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


def fit_lr_law(
    steps: np.ndarray,
    values: np.ndarray,
    lr_steps: np.ndarray,
    lr_values: np.ndarray,
    horizon: int,
    weights: np.ndarray | None = None,
) -> LRLaw:
    """Fit the law on (binned) points; the areas are computed up to ``horizon`` steps."""
    x = np.asarray(steps, dtype=float)
    y = np.asarray(values, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=float)
    x, y, w = x[ok], y[ok], w[ok]
    if x.size < MIN_POINTS:
        raise TooLittleData(int(x.size), MIN_POINTS)
    horizon = int(max(horizon, x.max()))
    s1, s2 = lr_areas(lr_steps, lr_values, horizon)
    idx = np.clip(x.round().astype(int), 0, horizon)
    a1, a2 = np.maximum(s1[idx], 1e-9), s2[idx]
    a1n = a1 / a1.max()
    ymin, span = float(y.min()), float(np.ptp(y))
    if span <= 1e-12 * max(1.0, abs(ymin)):
        return LRLaw(ymin, 0.0, 1.0, 0.0, 0.0, int(x.size), s1, s2)
    sw = np.sqrt(w)
    f_scale = max(float(1.0484 * np.median(np.abs(np.diff(y)))), 1e-3 * span, 1e-12)
    s2max = max(float(np.abs(a2).max()), 1e-9)

    def resid(p: np.ndarray) -> np.ndarray:
        return sw * (p[0] + p[1] * np.power(a1n, -p[2]) - p[3] * a2 / s2max - y)

    def jac(p: np.ndarray) -> np.ndarray:
        pw = np.power(a1n, -p[2])
        return np.column_stack((sw, sw * pw, -sw * p[1] * pw * np.log(a1n), -sw * a2 / s2max))

    e_low = 0.0 if ymin > 0 else ymin - 10.0 * span
    lo = np.array([e_low, 0.0, 0.02, 0.0])
    hi = np.array([ymin + span, np.inf, 3.0, np.inf])
    p0 = np.array([max(ymin - 0.5 * span, e_low), 0.5 * span + 1e-9, 0.5, 0.0])
    r = least_squares(
        resid, p0, jac=jac, bounds=(lo, hi), loss="soft_l1", f_scale=f_scale, max_nfev=300
    )
    l0, a, alpha, c = (float(v) for v in r.x)
    res = r.fun / sw
    sigma = float(1.4826 * np.median(np.abs(res - np.median(res))))
    return LRLaw(l0, a * a1.max() ** alpha, alpha, c / s2max, sigma, int(x.size), s1, s2)
