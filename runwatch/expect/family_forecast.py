"""Forecast a run from its family: the whole curve from step 0, then updated by its own
points with the family as the prior.

Before the run logs a point, the expected curve is the family's law at the run's size and
planned LR (``runwatch.expect.family``). As points arrive, the run's level against that
curve (the median log ratio over its latest points) is measured and combined with the
prior (no offset, the family's own error) by precision, so a few noisy points move it
little and many move it to the run's own level. What the ratio cannot know, that the run's
shape drifts from the family's later on, widens the band with the steps still to come; the
law's credit for annealing beyond any run's (a longer cosine) lowers its lower end, and the
size laws the family cannot rule out (``FamilyFit.mixed_laws``, whose weighted mean the
curve is) move both ends.
"""

from __future__ import annotations

import math

import numpy as np

from runwatch.expect.family import Z90, FamilyFit, level_offset
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
    prior_sd = fit.half_width(params) / Z90
    seen = 0
    shift, level_sd = 0.0, prior_sd
    if steps is not None and values is not None and len(steps):
        st = np.asarray(steps, dtype=float)
        va = np.asarray(values, dtype=float)
        seen = int(np.nanmax(st) if upto is None else upto)
        shift, level_sd = level_offset(prior, st, va, seen, prior_sd)
    # What the level seen so far cannot tell about the rest: the family's own drift, and
    # the base curve carried past the runs that measured it.
    drift = fit.drift_half() if seen else 0.0
    far = fit.beyond_half(lr_steps, lr_share, final)
    start = max(seen, 1)
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

    def curve(at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        idx = np.clip(np.asarray(at, dtype=float).round().astype(int), 0, final)
        mean = prior[idx] * math.exp(shift)
        extrap = np.log(np.maximum(idx, start) / start)
        half = np.sqrt((Z90 * level_sd) ** 2 + (drift * extrap) ** 2 + far**2)
        return mean, mean * low[idx] * np.exp(-half), mean * high[idx] * np.exp(half)

    m, lo, hi = (float(a[0]) for a in curve(np.array([final])))
    target_step = None
    if target is not None and math.isfinite(target):
        below = np.flatnonzero(prior * math.exp(shift) <= target)
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
