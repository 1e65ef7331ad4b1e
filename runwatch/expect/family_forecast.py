"""Forecast a run from its family: the whole curve from step 0, then updated by its own
points with the family as the prior.

Before the run logs a point, the expected curve is the family's law at the run's size and
planned LR (``runwatch.expect.family``). As points arrive, the run's level against that
curve (the median log ratio over its latest points) is measured and, at each step ahead,
combined with the prior (no offset, the family's own size and transfer error) by
precision. The level's variance there is its noise plus how far a run's level drifts from
the family's curve by then, as a random walk in log steps (the family's own drift): near the
points seen the run's level rules, and towards the end the family's expectation weighs in
by how well each has foretold ends on the family's own runs. The band is that combination's
sd, widened for a base curve carried past the runs that measured it; the law's credit for
annealing beyond any run's (a longer cosine) lowers its lower end, and the size laws the
family cannot rule out (``FamilyFit.mixed_laws``, whose weighted mean the curve is) move
both ends.
"""

from __future__ import annotations

import math

import numpy as np

from runwatch.expect.family import Z90, FamilyFit, drift_span, level_offset, t90
from runwatch.expect.forecast import Forecast


def family_forecast(
    fit: FamilyFit,
    params: float,
    lr_steps: np.ndarray,
    lr_share: np.ndarray,
    final_step: int,
    *,
    steps: np.ndarray | None = None,
    values: np.ndarray | None = None,
    upto: int | None = None,
    target: float | None = None,
    eta_seconds: float | None = None,
) -> Forecast:
    """The run's expected curve and final value from ``fit``, updated by its points (with
    step <= ``upto``) when given. ``lr_share``: its LR as a share of the peak, to
    ``final_step`` (logged, then planned)."""
    final = int(final_step)
    prior = fit.expected(params, lr_steps, lr_share, final)
    prior_half = fit.half_width(params)
    prior_sd = prior_half / Z90
    dof = fit.prior_dof(params)
    scale = prior_half / t90(dof)  # the Student-t prior whose 90% half-width is the band's
    seen = 0
    level = None
    if steps is not None and values is not None and len(steps):
        st = np.asarray(steps, dtype=float)
        va = np.asarray(values, dtype=float)
        seen = int(np.nanmax(st) if upto is None else upto)
        level = level_offset(prior, st, va, seen, prior_sd)
    # The base curve carried past the runs that measured it: the level cannot tell it.
    far = fit.beyond_half(lr_steps, lr_share, final)
    # The lower end also reaches the law's credit for annealing no run has tested, and
    # both ends what the size laws the family cannot rule out expect; each curve is set to
    # the run's level where it has been seen.
    positive = np.where(prior > 0, prior, np.nan)  # ratios to a mean <= 0 are left out
    high, low = np.ones_like(prior), np.ones_like(prior)
    others = [fit.expected(params, lr_steps, lr_share, final, law_credit=True)]
    others += [fit.expected(params, lr_steps, lr_share, final, law=law) for law in fit.mixed_laws]
    for other in others:
        ratio = other / positive
        ratio /= ratio[min(seen, final)] if seen else 1.0
        high, low = np.fmax(high, ratio), np.fmin(low, ratio)

    # The log shift from the prior at every step 0..final, and its sd.
    every = np.arange(final + 1)
    if level is None:
        shift, sd = np.zeros(every.shape), np.full(every.shape, prior_sd)
    else:
        offset, obs_sd = level
        carry = fit.drift_half() / Z90 * drift_span(every, seen)
        shift, sd = _combine(offset, np.sqrt(obs_sd**2 + carry**2), scale, dof)
    expected = prior * np.exp(shift)
    half = np.sqrt((Z90 * sd) ** 2 + far**2)

    def curve(at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        idx = np.clip(np.asarray(at, dtype=float).round().astype(int), 0, final)
        mean = expected[idx]
        return mean, mean * low[idx] * np.exp(-half[idx]), mean * high[idx] * np.exp(half[idx])

    m, lo, hi = (float(a[0]) for a in curve(np.array([final])))
    target_step = None
    if target is not None and math.isfinite(target):
        below = np.flatnonzero(expected <= target)
        target_step = int(below[below >= seen][0]) if (below >= seen).any() else None
    laws = fit.size_laws if len(fit.sizes) > 1 else ()
    return Forecast(
        m,
        lo,
        hi,
        "family",
        eta_seconds,
        target_step,
        seen,
        final,
        curve,
        size_laws=laws,
        size_law_weights=fit.size_law_weights,
    )


def _combine(
    offset: float, level_sd: np.ndarray, scale: float, dof: int
) -> tuple[np.ndarray, np.ndarray]:
    """The log shift from the prior at each step, and its sd: the posterior of the run's
    offset there, from the offset measured (normal, sd ``level_sd``: its noise and how far
    a level drifts by then) and the family's prior (a Student-t at 0 with ``scale`` and
    ``dof``, as its band is). A gap the family's own errors explain is shrunk towards it;
    one far beyond them (a run that is not what its family predicts) is kept."""
    if scale <= 0:
        return np.full(level_sd.shape, offset), level_sd
    knots = np.unique(np.geomspace(1e-4, 1.0, 48) * max(float(level_sd.max()), 1e-4))
    z = np.linspace(-8.0, 8.0, 321)
    mean, sd = np.empty(knots.size), np.empty(knots.size)
    for k, lsd in enumerate(knots):
        theta = np.unique(np.r_[offset + lsd * z, scale * z])
        log_w = -0.5 * ((theta - offset) / lsd) ** 2
        log_w -= 0.5 * (dof + 1) * np.log1p((theta / scale) ** 2 / dof)
        w = np.exp(log_w - log_w.max())
        w = (w[1:] + w[:-1]) * np.diff(theta) / 2  # the mass of each interval
        mid = (theta[1:] + theta[:-1]) / 2
        mean[k] = float(np.sum(w * mid) / np.sum(w))
        sd[k] = math.sqrt(float(np.sum(w * (mid - mean[k]) ** 2) / np.sum(w)))
    return np.interp(level_sd, knots, mean), np.interp(level_sd, knots, sd)
