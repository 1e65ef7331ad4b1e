"""Scaling a loss curve over model size, step by step: what a run of another size is
expected to reach, from the curves of the sizes a family has.

Four laws, in the parameter count N:

- ``"loglog"``: log L a straight line in log N (Kaplan's form, L ∝ N^-a), least squares
  over every size. Two sizes are enough; it cannot bend, so far beyond the family it is
  optimistic where the loss nears its floor.
- ``"floor"``: L = E + A·N^-a (Chinchilla's form), with the floor E between 0 and the
  lowest loss, fitted by least squares at each step (a grid over a; E and A are linear).
  It needs three sizes, and four to be told apart from the line by the family's own
  leave-one-out errors (``runwatch.expect.family_fit`` chooses).
- ``"prior"``: the same form with a fixed at ``PRIOR_EXPONENT``, Chinchilla's published
  exponent for parameters: with two or three sizes a floor cannot be measured, but the
  loss does flatten towards one, which the line cannot show.
- ``"shared"``: L = g(s) + A·N^-a with A and a the same at every step from
  ``SHARED_FROM`` of the run on, g free per step (Chinchilla's separable form, the data and
  schedule term in g): the gap between sizes is measured over the later steps together,
  not at each step alone. Before that share, the gap at each step is the shared one
  scaled by how far apart the sizes' curves are there. It needs three sizes, like
  ``"floor"``.

The per-step laws are evaluated on at most ``GRID_POINTS`` log-spaced steps and carried to
every step as a ratio to the largest size's curve, which keeps the cost flat in the run's
length.

>>> import numpy as np
>>> n = np.array([1e6, 4e6, 16e6])
>>> curves = np.array([[4.0, 3.0], [3.6, 2.7], [3.24, 2.43]])  # 0.9x per 4x at each step
>>> np.round(scale_to(curves, n, 64e6, "loglog"), 3).tolist()
[2.916, 2.187]
"""

from __future__ import annotations

import numpy as np

LAWS = ("loglog", "floor", "prior", "shared")
FLOORED = ("floor", "prior", "shared")
"""The laws with a floor that a larger model's loss flattens towards; the line has none."""
GRID_POINTS = 512
EXPONENTS = np.geomspace(0.02, 2.0, 48)
"""The exponents a the floor law's grid tries."""
PRIOR_EXPONENT = 0.34
"""The prior law's a: Hoffmann et al. 2022 (Chinchilla), the fit of L(N, D) over 400+
runs, alpha = 0.34. Not fitted to any family here (bench/README-forecast-family.md)."""
SHARED_FROM = 0.5
"""The share of the steps from which the shared law's gap between sizes is measured: the
second half of the run. Measured from a tenth on, the gap was too wide for the steps
between a tenth and a half, and a run's level at a quarter of its steps was misread by it
(``bench/README-forecast-family.md``)."""


def scale_to(curves: np.ndarray, params: np.ndarray, target: float, law: str) -> np.ndarray:
    """``curves`` (sizes x steps, the sizes' expected losses at the target's steps) carried
    to ``target`` params by ``law``; one size is returned as it is."""
    if curves.shape[0] == 1:
        return curves[0]
    if law not in LAWS:
        raise ValueError(f"unknown size law {law!r}; valid: {', '.join(LAWS)}")
    if law in ("floor", "shared") and curves.shape[0] < 3:
        law = "loglog"
    if law == "shared":
        return _shared(curves, params, target)
    n_steps = curves.shape[1]
    grid = _grid(n_steps)
    sub = np.maximum(curves[:, grid], 1e-12)
    if law == "loglog":
        out = _loglog(sub, params, target)
    else:
        grid_a = EXPONENTS if law == "floor" else np.array([PRIOR_EXPONENT])
        out = _floor(sub, params, target, grid_a)
    # Carried to every step as a ratio to the largest size's curve (smooth in the step).
    ratio = np.log(np.maximum(out, 1e-12)) - np.log(sub[-1])
    full = np.interp(np.arange(n_steps), grid, ratio)
    return curves[-1] * np.exp(full)


def _grid(n_steps: int) -> np.ndarray:
    if n_steps <= GRID_POINTS:
        return np.arange(n_steps)
    inner = np.geomspace(1, n_steps - 1, GRID_POINTS - 1).round().astype(int)
    return np.unique(np.r_[0, inner])


def _loglog(y: np.ndarray, params: np.ndarray, target: float) -> np.ndarray:
    x = np.log(params)
    dx = x - x.mean()
    ly = np.log(y)
    slope = (dx[:, None] * (ly - ly.mean(axis=0))).sum(axis=0) / float((dx * dx).sum())
    return np.exp(ly.mean(axis=0) + slope * (np.log(target) - x.mean()))


def _floor(y: np.ndarray, params: np.ndarray, target: float, grid_a: np.ndarray) -> np.ndarray:
    """E + A·N^-a at each step (columns of ``y``), best over the exponents ``grid_a``."""
    scale = params.min()
    z = np.power((params / scale)[None, :], -grid_a[:, None])  # grid x sizes
    zt = np.power(target / scale, -grid_a)  # grid
    zm = z.mean(axis=1, keepdims=True)
    dz = z - zm
    ym = y.mean(axis=0)  # steps
    dy = y - ym  # sizes x steps
    a = (dz @ dy) / (dz * dz).sum(axis=1, keepdims=True)  # grid x steps
    a = np.maximum(a, 0.0)
    e = ym[None, :] - a * zm
    e = np.clip(e, 0.0, 0.999 * y.min(axis=0)[None, :])
    # With E clipped, A again by least squares through the clipped floor.
    a = np.maximum(((y[None, :, :] - e[:, None, :]) * z[:, :, None]).sum(axis=1), 0.0)
    a /= (z * z).sum(axis=1)[:, None]
    fit = e[:, None, :] + a[:, None, :] * z[:, :, None]  # grid x sizes x steps
    sse = ((fit - y[None, :, :]) ** 2).sum(axis=1)
    best = np.argmin(sse, axis=0)
    cols = np.arange(y.shape[1])
    return e[best, cols] + a[best, cols] * zt[best]


def _shared(curves: np.ndarray, params: np.ndarray, target: float) -> np.ndarray:
    """g(s) + A·N^-a, with A and a fitted by least squares over the steps from
    ``SHARED_FROM`` on (a grid over a; g and A are linear), carried to every step."""
    n_steps = curves.shape[1]
    start = int(SHARED_FROM * (n_steps - 1))
    cols = np.unique(np.linspace(start, n_steps - 1, min(GRID_POINTS, n_steps - start)).round())
    late = curves[:, cols.astype(int)]
    z = np.power((params / params.min())[None, :], -EXPONENTS[:, None])  # grid x sizes
    dz = z - z.mean(axis=1, keepdims=True)
    dy = late - late.mean(axis=0)
    amp = np.maximum((dz @ dy).sum(axis=1) / ((dz * dz).sum(axis=1) * late.shape[1]), 0.0)
    sse = ((dy[None, :, :] - amp[:, None, None] * dz[:, :, None]) ** 2).sum(axis=(1, 2))
    k = int(np.argmin(sse))
    zk, zt = z[k], (target / params.min()) ** -EXPONENTS[k]
    # The gap at each step: the shared one, scaled down where the sizes are closer together.
    spread = curves[0] - curves[-1]
    ref = float(np.mean(spread[start:]))
    scale = np.clip(spread / ref, 0.0, 1.0) if ref > 0 else np.ones(n_steps)
    gap = amp[k] * np.where(np.arange(n_steps) < start, scale, 1.0)
    base = (curves - gap[None, :] * zk[:, None]).mean(axis=0)
    return base + gap * zt
