"""The LR schedule still to come, projected from the LR logged so far.

A forecast with the LR-aware law needs the LR up to the final step, and a run logs it only
up to now. Held flat, a cosine schedule's coming decay (and the lower loss it brings) is
missed: on synthetic runs that follow the law exactly, a cosine run forecast at half its
steps came out 7-8% too high with a band that never held the true final loss.
Most decays are a cosine or a straight line from the peak to a floor at the planned last
step, so the logged decay is matched against both (the floor fitted, between 0 and the
LR now) and the closer one continues it. A schedule that has not decayed yet (a
warmup-stable-decay run in its stable phase, a constant LR, a warmup still rising), or
decays in another shape (steps, inverse square root), is held flat: the coming decay
cannot be known from it. Where the LR peaked is kept: a law fitted across the warmup
mistakes its shape (``runwatch.expect.forecast``).

>>> import numpy as np
>>> s = np.arange(0, 3001)
>>> lr = 1e-3 * (0.1 + 0.45 * (1 + np.cos(np.pi * s / 10000)))  # cosine to 10%, 10k steps
>>> p = project_lr(s, lr, final_step=10000)
>>> p.shape, int(p.steps[-1]), round(float(p.values[-1] / 1e-3), 3)
('cosine', 10000, 0.1)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLAT_BELOW = 0.02
"""A decay since the peak smaller than this share of the peak is no decay yet: held flat."""

MATCH_WITHIN = 0.02
"""A shape continues the schedule only if it matches the logged decay within this RMS
(share of the peak); the logged LR is often rounded, so an exact match is not asked."""


PROJECTED_POINTS = 2048
"""Points the projection is given by (at most; one per step on a shorter stretch)."""


@dataclass(frozen=True, slots=True)
class ProjectedLR:
    """The logged LR, then the projection to the final step (sorted by step; the LR is
    linear between points, as ``lr_areas`` reads it)."""

    steps: np.ndarray
    values: np.ndarray
    shape: str
    """"logged" (nothing to project), "flat", "cosine" or "linear"."""
    peak_step: float | None = None
    """Where the logged LR peaked (the end of its warmup; the last step while it rises)."""
    floor: float | None = None
    """The fitted LR at the final step (cosine and linear only)."""


def _shapes(t: np.ndarray) -> dict[str, np.ndarray]:
    """Each decay shape's share of (peak - floor) left at progress t in [0, 1]."""
    return {"cosine": 0.5 * (1.0 + np.cos(np.pi * t)), "linear": 1.0 - t}


def project_lr(lr_steps, lr_values, final_step: int) -> ProjectedLR:
    """The LR at every step from the last logged one to ``final_step``, continuing the
    logged decay since the peak as a cosine or a line to a fitted floor, else flat."""
    ls = np.asarray(lr_steps, dtype=float)
    lv = np.asarray(lr_values, dtype=float)
    ok = np.isfinite(ls) & np.isfinite(lv)
    ls, lv = ls[ok], lv[ok]
    order = np.argsort(ls, kind="stable")
    ls, lv = ls[order], lv[order]
    if ls.size == 0:
        return ProjectedLR(ls, lv, "logged")
    top = int(np.argmax(lv))
    peak, peak_step = float(lv[top]), float(ls[top])
    if ls[-1] >= final_step:
        return ProjectedLR(ls, lv, "logged", peak_step)
    ds, dv = ls[top:], lv[top:]
    flat = ProjectedLR(ls, lv, "flat", peak_step)
    if peak <= 0 or dv.size < 3 or dv[-1] >= (1.0 - FLAT_BELOW) * peak:
        return flat
    progress = (ds - peak_step) / (final_step - peak_step)
    best: tuple[float, str, float] | None = None
    for name, left in _shapes(progress).items():
        gone = 1.0 - left
        floor = float(np.dot(dv - peak * left, gone) / max(float(np.dot(gone, gone)), 1e-300))
        floor = min(max(floor, 0.0), float(dv[-1]))
        rms = float(np.sqrt(np.mean((peak * left + floor * gone - dv) ** 2))) / peak
        if best is None or rms < best[0]:
            best = (rms, name, floor)
    rms, name, floor = best  # type: ignore[misc]
    if rms > MATCH_WITHIN:
        return flat
    # lr_areas interpolates linearly between points: a few thousand carry either shape to
    # within 1e-6 of its peak, where one per step would cost memory on a 10M-step run.
    coming = np.unique(np.linspace(ls[-1] + 1.0, final_step, PROJECTED_POINTS).round())
    left = _shapes((coming - peak_step) / (final_step - peak_step))[name]
    values = peak * left + floor * (1.0 - left)
    return ProjectedLR(np.r_[ls, coming], np.r_[lv, values], name, peak_step, floor)
