"""Forecast a run from its family: the whole curve from step 0, then updated by its own
points with the family as the prior.

Before the run logs a point, the expected curve is the family's law at the run's size and
planned LR (``runwatch.expect.family``). As points arrive, the run's level against that
curve (the median log ratio over its latest points) is measured and combined with the
prior (no offset, the family's own error) by precision, so a few noisy points move it
little and many move it to the run's own level. What the ratio cannot know, that the run's
shape drifts from the family's later on, widens the band with the steps still to come.
"""

from __future__ import annotations

import math

import numpy as np

from runwatch.expect.binning import bin_arrays
from runwatch.expect.family import Z90, FamilyFit, areas_at
from runwatch.expect.forecast import Forecast

UPDATE_FROM = 0.5
"""The run's level is measured on its points after this share of the steps seen so far."""

DRIFT_REL = 0.01
"""Relative drift per e-fold of steps (final step / steps seen) of a run's level against
its family's curve: what the level seen so far cannot tell about the rest
(``bench/README-forecast-family.md``)."""


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
    s1, s2 = areas_at(lr_steps, lr_share, final)
    prior = fit.expected(params, s1, s2)
    prior_sd = fit.half_width(params) / Z90
    seen = 0
    shift, level_sd = 0.0, prior_sd
    if steps is not None and values is not None and len(steps):
        st = np.asarray(steps, dtype=float)
        va = np.asarray(values, dtype=float)
        seen = int(np.nanmax(st) if upto is None else upto)
        shift, level_sd = _level(prior, st, va, seen, prior_sd)
    drift = DRIFT_REL if seen else 0.0
    start = max(seen, 1)

    def curve(at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        idx = np.clip(np.asarray(at, dtype=float).round().astype(int), 0, final)
        mean = prior[idx] * math.exp(shift)
        extrap = np.log(np.maximum(idx, start) / start)
        half = Z90 * np.sqrt(level_sd**2 + (drift * extrap) ** 2)
        return mean, mean * np.exp(-half), mean * np.exp(half)

    m, lo, hi = (float(a[0]) for a in curve(np.array([final])))
    target_step = None
    if target is not None and math.isfinite(target):
        below = np.flatnonzero(prior * math.exp(shift) <= target)
        target_step = int(below[below >= seen][0]) if (below >= seen).any() else None
    return Forecast(m, lo, hi, "family", eta_seconds, target_step, seen, final, curve)


def _level(
    prior: np.ndarray, steps: np.ndarray, values: np.ndarray, seen: int, prior_sd: float
) -> tuple[float, float]:
    """The run's log offset from the prior curve, and its sd, from its points up to
    ``seen``, combined with the prior (offset 0, sd ``prior_sd``) by precision."""
    ok = np.isfinite(steps) & np.isfinite(values) & (values > 0)
    ok &= (steps <= seen) & (steps >= UPDATE_FROM * seen)
    if ok.sum() < 3:
        return 0.0, prior_sd
    bs, bv, _ = bin_arrays(steps[ok], values[ok])
    idx = np.clip(bs.round().astype(int), 0, prior.size - 1)
    logs = np.log(bv) - np.log(np.maximum(prior[idx], 1e-12))
    offset = float(np.median(logs))
    spread = float(1.4826 * np.median(np.abs(logs - offset))) if logs.size > 2 else prior_sd
    obs_sd = max(spread / math.sqrt(logs.size), 1e-4)
    w_obs, w_prior = obs_sd**-2, prior_sd**-2 if prior_sd > 0 else 0.0
    combined = offset * w_obs / (w_obs + w_prior)
    return combined, (w_obs + w_prior) ** -0.5
