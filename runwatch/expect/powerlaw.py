"""A robust power law in the step: L(s) = E + A·(s + s0)^-α."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

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


def _robust_sigma(y: np.ndarray) -> float:
    if y.size < 3:
        return 0.0
    return float(1.0484 * np.median(np.abs(np.diff(y))))


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
    Levenberg-Marquardt (``_solve``, analytic Jacobian) from the better of two starts: the
    best point of a grid over (α, s0) where E and A, being linear, are solved in closed
    form (variable projection), and ``start`` (an earlier fit) when given. The problem has
    four parameters and a dozen or two binned points: a hand-written solver in plain floats
    takes ~2 ms where ``scipy.optimize.least_squares`` took ~15 and the same solver in numpy
    ~2.8 (per-call overhead, on arrays this small, outweighs the arithmetic).
    """
    x, y, w = finite_points(steps, values, weights)
    xmax = float(max(x.max(), 1.0))
    xs = np.maximum(x, 0.0) / xmax
    ymin, ymax = float(y.min()), float(y.max())
    span = ymax - ymin
    sig = _robust_sigma(y)
    if span <= 1e-12 * max(1.0, abs(ymax)):
        return PowerLaw(ymin, 0.0, 1.0, 1.0, 0.0, int(x.size))
    f_scale = max(sig, 1e-3 * span, 1e-12)
    e_low = 0.0 if ymin > 0 else ymin - 10.0 * span
    lo = np.array([e_low, 0.0, 0.02, 1e-6])
    hi = np.array([ymin, np.inf, 3.0, 1.0])
    # Unit weights (the detectors' fits) are left out: multiplying by 1.0 changes nothing.
    unit = bool((w == 1.0).all())
    pts = (xs.tolist(), y.tolist(), None if unit else np.sqrt(w).tolist())
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
    first = [_soft_l1(_residuals(pts, p.tolist())[0], f2) for p in starts]
    p0 = starts[int(np.argmin(first))]
    best, best_cost = _solve(pts, p0.tolist(), lo.tolist(), hi.tolist(), f2)
    if not math.isfinite(best_cost):  # pragma: no cover - defensive
        raise TooLittleData(int(x.size), MIN_POINTS, "usable points")
    e, a_s, alpha, s0s = best
    res = y - (e + a_s * np.power(xs + s0s, -alpha))
    sigma = float(1.4826 * np.median(np.abs(res - np.median(res))))
    # Back to raw steps: A·(x/xmax + s0')^-α = A·xmax^α·(x + s0'·xmax)^-α.
    return PowerLaw(e, a_s * xmax**alpha, alpha, s0s * xmax, sigma, int(x.size))


Points = tuple[list[float], list[float], list[float] | None]
"""A fit's points as plain floats: the scaled steps, the values, the square roots of the
weights (None: every weight 1)."""


def _residuals(pts: Points, p: list[float]) -> tuple[list[float], list[float], list[float]]:
    """The weighted residuals at parameters ``p`` = (E, A, α, s0), with each point's
    (x + s0) and its power (the Jacobian at an accepted step reuses them)."""
    e, a, alpha, s0 = p
    neg = -alpha
    xs, ys, sws = pts
    base = [x + s0 for x in xs]  # > 0: x >= 0 and s0 >= 1e-6
    pw = [b**neg for b in base]
    if sws is None:
        r = [e + a * q - y for y, q in zip(ys, pw, strict=True)]
    else:
        r = [sw * (e + a * q - y) for y, sw, q in zip(ys, sws, pw, strict=True)]
    return r, base, pw


def _soft_l1(r: list[float], f2: float) -> float:
    """scipy's soft-L1 cost: 0.5·Σ f²·2(√(1 + r²/f²) − 1)."""
    sqrt = math.sqrt
    return f2 * sum([sqrt(1.0 + x * x / f2) - 1.0 for x in r])


def _normal_equations(
    pts: Points, p: list[float], r: list[float], base: list[float], pw: list[float], f2: float
) -> tuple[list[float], list[list[float]]]:
    """Gradient Jᵀ·ρ'·r and Gauss-Newton Hessian Jᵀ·diag(ρ' + 2r²ρ'')·J of the soft-L1 cost
    (for soft-L1: ρ' = (1 + r²/f²)^-1/2, ρ' + 2r²ρ'' = (1 + r²/f²)^-3/2), with the
    analytic Jacobian of the weighted residuals."""
    a, alpha = p[1], p[2]
    if pts[2] is None:
        return _normal_equations_unit(a, alpha, r, base, pw, f2)
    neg_a = -a
    sqrt, log = math.sqrt, math.log
    g0 = g1 = g2 = g3 = 0.0
    h00 = h01 = h02 = h03 = h11 = h12 = h13 = h22 = h23 = h33 = 0.0
    for j0, ri, b, q in zip(pts[2], r, base, pw, strict=True):
        j1 = j0 * q  # the Jacobian's row: d r / d (E, A, alpha, s0)
        t = neg_a * j1
        j2 = t * log(b)
        j3 = t * alpha / b
        u = 1.0 + ri * ri / f2
        su = sqrt(u)
        gw = ri / su
        g0 += j0 * gw
        g1 += j1 * gw
        g2 += j2 * gw
        g3 += j3 * gw
        hw = 1.0 / (u * su)
        w0 = hw * j0
        w1 = hw * j1
        w2 = hw * j2
        w3 = hw * j3
        h00 += w0 * j0
        h01 += w0 * j1
        h02 += w0 * j2
        h03 += w0 * j3
        h11 += w1 * j1
        h12 += w1 * j2
        h13 += w1 * j3
        h22 += w2 * j2
        h23 += w2 * j3
        h33 += w3 * j3
    h = [
        [h00, h01, h02, h03],
        [h01, h11, h12, h13],
        [h02, h12, h22, h23],
        [h03, h13, h23, h33],
    ]
    return [g0, g1, g2, g3], h


def _normal_equations_unit(
    a: float, alpha: float, r: list[float], base: list[float], pw: list[float], f2: float
) -> tuple[list[float], list[list[float]]]:
    """``_normal_equations`` with every weight 1: the same floats, without the products
    by the Jacobian's first column (1.0)."""
    neg_a = -a
    sqrt, log = math.sqrt, math.log
    g0 = g1 = g2 = g3 = 0.0
    h00 = h01 = h02 = h03 = h11 = h12 = h13 = h22 = h23 = h33 = 0.0
    for ri, b, j1 in zip(r, base, pw, strict=True):
        t = neg_a * j1
        j2 = t * log(b)
        j3 = t * alpha / b
        u = 1.0 + ri * ri / f2
        su = sqrt(u)
        gw = ri / su
        g0 += gw
        g1 += j1 * gw
        g2 += j2 * gw
        g3 += j3 * gw
        hw = 1.0 / (u * su)
        w1 = hw * j1
        w2 = hw * j2
        h00 += hw
        h01 += hw * j1
        h02 += hw * j2
        h03 += hw * j3
        h11 += w1 * j1
        h12 += w1 * j2
        h13 += w1 * j3
        h22 += w2 * j2
        h23 += w2 * j3
        h33 += hw * j3 * j3
    h = [
        [h00, h01, h02, h03],
        [h01, h11, h12, h13],
        [h02, h12, h22, h23],
        [h03, h13, h23, h33],
    ]
    return [g0, g1, g2, g3], h


def _damped_solve(
    h: list[list[float]], dh: list[float], lam: float, v: list[float]
) -> list[float] | None:
    """``(h + lam·diag(dh))⁻¹·v``: the Levenberg-Marquardt step's system, solved by
    ``_lin_solve``; the 4×4 and 3×3 systems (no parameter, or one, held on a bound: most
    steps) are written out, with the loop's operations in the loop's order, so they give
    the same floats without copying ``h``."""
    n = len(v)
    if n == 4:
        (m00, _, _, _), (m10, m11, _, _), (m20, m21, m22, _), (m30, m31, m32, m33) = h
        d0, d1, d2, d3 = dh
        m00 += lam * d0
        m11 += lam * d1
        m22 += lam * d2
        m33 += lam * d3
        if not m00 > 0.0:
            return None
        l00 = math.sqrt(m00)
        l10 = m10 / l00
        t = m11 - l10 * l10
        if not t > 0.0:
            return None
        l11 = math.sqrt(t)
        l20 = m20 / l00
        l21 = (m21 - l20 * l10) / l11
        t = m22 - l20 * l20 - l21 * l21
        if not t > 0.0:
            return None
        l22 = math.sqrt(t)
        l30 = m30 / l00
        l31 = (m31 - l30 * l10) / l11
        l32 = (m32 - l30 * l20 - l31 * l21) / l22
        t = m33 - l30 * l30 - l31 * l31 - l32 * l32
        if not t > 0.0:
            return None
        l33 = math.sqrt(t)
        v0, v1, v2, v3 = v
        z0 = v0 / l00  # low·z = v
        z1 = (v1 - l10 * z0) / l11
        z2 = (v2 - l20 * z0 - l21 * z1) / l22
        z3 = (v3 - l30 * z0 - l31 * z1 - l32 * z2) / l33
        x3 = z3 / l33  # lowᵀ·x = z
        x2 = (z2 - l32 * x3) / l22
        x1 = (z1 - l21 * x2 - l31 * x3) / l11
        x0 = (z0 - l10 * x1 - l20 * x2 - l30 * x3) / l00
        return [x0, x1, x2, x3]
    if n == 3:
        (m00, _, _), (m10, m11, _), (m20, m21, m22) = h
        d0, d1, d2 = dh
        m00 += lam * d0
        m11 += lam * d1
        m22 += lam * d2
        if not m00 > 0.0:
            return None
        l00 = math.sqrt(m00)
        l10 = m10 / l00
        t = m11 - l10 * l10
        if not t > 0.0:
            return None
        l11 = math.sqrt(t)
        l20 = m20 / l00
        l21 = (m21 - l20 * l10) / l11
        t = m22 - l20 * l20 - l21 * l21
        if not t > 0.0:
            return None
        l22 = math.sqrt(t)
        v0, v1, v2 = v
        z0 = v0 / l00
        z1 = (v1 - l10 * z0) / l11
        z2 = (v2 - l20 * z0 - l21 * z1) / l22
        x2 = z2 / l22
        x1 = (z1 - l21 * x2) / l11
        x0 = (z0 - l10 * x1 - l20 * x2) / l00
        return [x0, x1, x2]
    damped = [row[:] for row in h]
    for k, dk in enumerate(dh):
        damped[k][k] += lam * dk
    return _lin_solve(damped, v)


def _lin_solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """``m⁻¹·v`` for a symmetric positive definite ``m`` (the damped Gauss-Newton Hessian),
    by Cholesky; None if ``m`` is not (numerically) positive definite, and the caller then
    damps more. A 4×4 system in floats costs less than one ``np.linalg.solve`` call."""
    n = len(v)
    low = [[0.0] * n for _ in range(n)]
    for i in range(n):
        li = low[i]
        for j in range(i + 1):
            lj = low[j]
            t = m[i][j]
            for k in range(j):
                t -= li[k] * lj[k]
            if i != j:
                li[j] = t / lj[j]
            elif t > 0.0:
                li[i] = math.sqrt(t)
            else:
                return None
    x = list(v)
    for i in range(n):  # low·z = v
        li = low[i]
        for k in range(i):
            x[i] -= li[k] * x[k]
        x[i] /= li[i]
    for i in range(n - 1, -1, -1):  # lowᵀ·x = z
        for k in range(i + 1, n):
            x[i] -= low[k][i] * x[k]
        x[i] /= low[i][i]
    return x


def _predicted_gain(g: list[float], h: list[list[float]], d: list[float]) -> float:
    """The fall of the cost the quadratic model predicts for step ``d``: -(g·d + ½·dᵀ·h·d).

    Each sum adds its terms in order from 0, as ``sum`` does; 4 parameters (most steps)
    written out."""
    if len(d) == 4:
        d0, d1, d2, d3 = d
        (h00, h01, h02, h03), (h10, h11, h12, h13), (h20, h21, h22, h23), (h30, h31, h32, h33) = h
        quad = (
            0.0
            + d0 * (0.0 + h00 * d0 + h01 * d1 + h02 * d2 + h03 * d3)
            + d1 * (0.0 + h10 * d0 + h11 * d1 + h12 * d2 + h13 * d3)
            + d2 * (0.0 + h20 * d0 + h21 * d1 + h22 * d2 + h23 * d3)
            + d3 * (0.0 + h30 * d0 + h31 * d1 + h32 * d2 + h33 * d3)
        )
        g0, g1, g2, g3 = g
        return -((0.0 + g0 * d0 + g1 * d1 + g2 * d2 + g3 * d3) + 0.5 * quad)
    quad = sum(
        [
            dk * sum([hkm * dm for hkm, dm in zip(hk, d, strict=True)])
            for dk, hk in zip(d, h, strict=True)
        ]
    )
    return -(sum([gk * dk for gk, dk in zip(g, d, strict=True)]) + 0.5 * quad)


def _solve(
    pts: Points,
    p0: list[float],
    lo: list[float],
    hi: list[float],
    f2: float,
    max_iter: int = 100,
    ftol: float = 1e-10,
) -> tuple[list[float], float]:
    """Bounded Levenberg-Marquardt on the soft-L1 cost; returns (parameters, cost).

    The robust loss enters as in scipy (``_normal_equations``). A parameter on a bound
    whose gradient pushes it outward is held there for that step; steps are clipped into
    the box. Only steps that lower the cost are taken, so the result is never worse than
    the start. In plain floats: with the dozen or so binned points a fit sees, a numpy
    call per operation cost far more than the arithmetic.
    """
    p = list(p0)
    r, base, pw = _residuals(pts, p)
    cost = _soft_l1(r, f2)
    if not math.isfinite(cost):
        return p, math.inf
    lam, nu = 1e-3, 2.0
    bounds = list(zip(lo, hi, strict=True))
    for _ in range(max_iter):
        g, h = _normal_equations(pts, p, r, base, pw, f2)
        free = [
            k
            for k in range(4)
            if not ((p[k] <= lo[k] and g[k] > 0) or (p[k] >= hi[k] and g[k] < 0))
        ]
        if not free:
            break
        if len(free) == 4:  # nothing held: the normal equations as they are
            gf, hf = g, h
        else:
            gf = [g[k] for k in free]
            hf = [[h[k][m] for m in free] for k in free]
        diag = [hf[k][k] for k in range(len(free))]
        floor = 1e-12 * max(max(diag), 1e-300)
        dh = [max(v, floor) for v in diag]
        neg_g = [-v for v in gf]
        while True:
            d = _damped_solve(hf, dh, lam, neg_g)
            if d is not None:
                pn = list(p)
                for k, dk in zip(free, d, strict=True):
                    pn[k] += dk
                pn = [min(max(v, lo_k), hi_k) for v, (lo_k, hi_k) in zip(pn, bounds, strict=True)]
                rn, base_n, pw_n = _residuals(pts, pn)
                cn = _soft_l1(rn, f2)
                if cn < cost:
                    # Nielsen's damping update: follow how well the model predicted the gain.
                    pred = _predicted_gain(gf, hf, d)
                    rho = (cost - cn) / pred if pred > 0 else 0.0
                    lam *= max(1.0 / 3.0, 1.0 - (2.0 * rho - 1.0) ** 3)
                    nu = 2.0
                    break
            lam *= nu
            nu *= 2.0
            if lam > 1e12:
                return p, cost  # no step lowers the cost: a (bounded) minimum
        gain = cost - cn
        small = True
        for a, b in zip(pn, p, strict=True):
            if not abs(a - b) <= 1e-10 * (abs(a) + 1e-10):
                small = False
                break
        p, r, cost, base, pw = pn, rn, cn, base_n, pw_n
        if gain <= ftol * cost or small:
            break
    return p, cost


_ALPHAS = np.geomspace(0.03, 2.5, 36)
_S0S = np.geomspace(1e-4, 0.9, 12)
_GRID_ALPHA = np.repeat(_ALPHAS, _S0S.size)[:, None]
_GRID_NEG_ALPHA = -_GRID_ALPHA
_GRID_S0 = np.tile(_S0S, _ALPHAS.size)[:, None]


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
    sq = (e[:, None] + a[:, None] * b - y) ** 2
    cost = (sq if unit else w * sq).sum(1)
    k = int(np.argmin(cost))
    return np.array([e[k], max(a[k], 1e-12), alpha[k, 0], s0[k, 0]])
