"""Forecast: the expected curve fitted so far, the predicted final value with a 90% band,
the step at which a target is reached, and the wall-clock ETA."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from runwatch.expect.binning import bin_arrays
from runwatch.expect.lrlaw import LRLaw, fit_lr_law
from runwatch.expect.powerlaw import MIN_POINTS, TooLittleData, fit_power_law, residual_sigma
from runwatch.expect.reference import ReferenceCurve
from runwatch.expect.schedule import project_lr

log = logging.getLogger("runwatch.detect")

FIT_FROM = 0.4
"""Fit on the points after this share of the steps seen: the early, steep part of a loss
curve (warmup, the first fast drop) is not what decides where it ends."""

Z90 = 1.645
EXTRAP_REL = 0.05
"""Relative band half-width per e-fold of extrapolation (final_step / upto), calibrated on
the held-in real runs: a fit cannot know that a schedule will anneal later."""

KNOWN_ANNEAL = 0.5
"""The LR-aware law forecasts only when the anneal its fit saw (the growth of the
annealing area S2 over the fitted steps) is at least this share of the anneal still to
come: its annealing coefficient is learnt from the one and multiplied by the other.
Earlier, the power law in the step forecasts instead. A quarter of the way into a cosine
the law was 5% too low on synthetic runs that follow it exactly (150% at a tenth), the
power law 7% too high with a band that held the truth. Half-way into the demo run (whose
loss has no annealing term) a share of 0.25 let the law in and it missed by 6.4%, the
power law by 4.8% inside its band; 0.5 and 1.0 then made equally good choices at 50-75%
of the synthetic cosines, the demo and llm.c (bench/forecast_lr.py)."""


ANNEAL_ALLOWANCE = 0.05
"""How much lower than its fit a run may end, as a share of the predicted value, when the
forecast does not know the rest of its LR schedule (no LR logged, an LR held flat, or a
decay too little seen): an anneal still to come lowers the final loss by about that much.
Annealing was worth 1.9-3.7% of the final loss in the real families (constant LR against
cosine and WSD runs of the same length and size) and up to 4% beyond the power law in the
modded-nanogpt warmdowns (``bench/README-forecast-family.md``). The lower band end grows
to it over the steps still to come."""

UNSEEN_FALL_PER_EFOLD = 0.19
"""With the rest of the schedule unknown, the lower band end also reaches this share below
the mean per e-fold of steps still to come (capped at 90%): early on, a run's loss can fall
much faster later than anything its first steps show (a plateau, then structure learnt
late). The smallest share that holds every forecast at a tenth and a quarter of the real
CPU runs, training and held-out loss of both tasks' widths and schedules; the example's
runs (``bench/data/tiny_lm_forecast``) were the held-out check
(``bench/README-forecast-family.md``). Only the lower end moves: nothing flags a run for
ending lower than expected."""


@dataclass(frozen=True)
class Forecast:
    """Predicted value at ``final_step`` with a 90% band, and how to draw the curve."""

    predicted: float
    lower: float
    upper: float
    model: str
    eta_seconds: float | None
    target_step: int | None
    upto: int
    final_step: int
    _curve: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]] = field(
        repr=False, compare=False
    )
    lr_schedule: str | None = None
    """How the logged LR was carried to the final step ("logged", "flat", "cosine",
    "linear"; ``runwatch.expect.schedule``), "warmup" when its warmup ended inside the
    fitted steps (the power law then forecasts), None without an LR."""
    size_laws: tuple[str, ...] = ()
    """A family forecast over several sizes: the size law it chose, then the laws the
    family's own errors cannot rule out, whose expectations its band reaches."""
    size_law_weights: tuple[float, ...] = ()
    """The weights of ``size_laws`` in the predicted curve (empty: the first alone)."""

    def curve(self, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mean, lower, upper) of the expected curve at ``steps`` (90% band)."""
        return self._curve(np.asarray(steps, dtype=float))

    def lr_note(self) -> str | None:
        """What the forecast made of the logged LR, in words (None without one to say)."""
        if self.lr_schedule in ("cosine", "linear"):
            lr = f"the LR's {self.lr_schedule} decay carried on to step {self.final_step}"
            if self.model == "power_law":
                return f"{lr} is mostly still to come, too little seen to know its effect"
            return lr
        if self.lr_schedule == "flat" and self.model == "lr_law":
            return "the LR held at its last value (no decay to carry on)"
        if self.lr_schedule == "warmup":
            return "the LR's warmup is in the fitted steps, so its schedule is not known yet"
        return None


def _band_fn(
    predict: Callable[[np.ndarray], np.ndarray],
    sigma: float,
    upto: float,
    final: float,
    anneal: float = 0.0,
    now: float | None = None,
):
    """The curve and its 90% band: the fit's noise and its extrapolation; beyond ``upto``
    the lower end reaches ``anneal`` of the mean by ``final`` (an unknown anneal), and the
    upper end is never below ``now``, the level the run is at (a healthy loss does not end
    higher than it is; a fit's fall may be too steep)."""

    def curve(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mean = predict(steps)
        extrap = np.log(np.maximum(steps, upto) / max(upto, 1.0))
        half = Z90 * np.sqrt(sigma**2 + (EXTRAP_REL * extrap * np.abs(mean)) ** 2)
        lower, upper = mean - half, mean + half
        ahead = steps > upto
        if anneal > 0:
            ramp = np.clip((steps - upto) / max(final - upto, 1.0), 0.0, 1.0)
            lower = np.minimum(lower, mean - anneal * ramp * np.abs(mean))
            unseen = np.minimum(UNSEEN_FALL_PER_EFOLD * extrap, 0.9)
            lower = np.minimum(lower, mean - unseen * np.abs(mean))
        if now is not None:
            upper = np.where(ahead, np.maximum(upper, now), upper)
        return mean, lower, upper

    return curve


def eta_seconds(
    times: np.ndarray | None, steps: np.ndarray, upto: float, final: float
) -> float | None:
    """Wall-clock seconds from the last timed step (at most ``upto``) to ``final``, at the
    pace of the latest tenth of the timed points (None without two timed points or a
    pace).

    The recent pace, not the run's average: after a restart or a throughput change it is
    the honest one. The forecast, the dashboard and the Prometheus exporter all use this.
    """
    if times is None:
        return None
    t = np.asarray(times, dtype=float)
    s = np.asarray(steps, dtype=float)
    ok = np.isfinite(t) & (s <= upto)
    if ok.sum() < 2:
        return None
    s, t = s[ok], t[ok]
    first = s.size - max(2, s.size // 10)
    ds, dt = s[-1] - s[first], t[-1] - t[first]
    if final <= s[-1]:
        return 0.0
    if ds <= 0 or dt <= 0:
        return None
    return float((final - s[-1]) * dt / ds)


def forecast(
    steps,
    values,
    *,
    times=None,
    lr_steps=None,
    lr_values=None,
    upto: int | None = None,
    final_step: int | None = None,
    target: float | None = None,
    reference: ReferenceCurve | None = None,
) -> Forecast:
    """Fit the expected curve on points with step <= ``upto`` and forecast ``final_step``.

    Model: a reference run's curve if ``reference`` is given; else, when an LR is given,
    the LR-aware law on the LR projected to ``final_step`` (``project_lr``) if the anneal
    seen so far is enough to know its annealing term (``KNOWN_ANNEAL``); else the power
    law. Raises ``ValueError`` (``TooLittleData``) when
    fewer than ``MIN_POINTS`` usable points remain; a constant curve forecasts itself.

    >>> import numpy as np
    >>> s = np.arange(1, 2001)
    >>> y = 2.0 + 8.0 * (s + 10.0) ** -0.4
    >>> f = forecast(s, y, upto=500, final_step=2000)
    >>> f.model, bool(abs(f.predicted - y[-1]) < 0.01), bool(f.lower < y[-1] < f.upper)
    ('power_law', True, True)
    """
    s = np.asarray(steps, dtype=float)
    v = np.asarray(values, dtype=float)
    if s.shape != v.shape:
        raise ValueError(f"steps and values differ in length: {s.size} != {v.size}")
    ok = np.isfinite(s) & np.isfinite(v)
    if ok.sum() == 0:
        raise TooLittleData(0, MIN_POINTS, "finite points")
    up = float(np.max(s[ok]) if upto is None else upto)
    fin = float(up if final_step is None else final_step)
    sel = ok & (s <= up) & (s >= FIT_FROM * up)
    if sel.sum() < MIN_POINTS:
        sel = ok & (s <= up)
    if sel.sum() < MIN_POINTS:
        raise TooLittleData(int(sel.sum()), MIN_POINTS, "finite points up to the fit step")
    bs, bv, _ = bin_arrays(s[sel], v[sel])
    if bs.size < MIN_POINTS:
        # Few bins (sparse logging): fit the points themselves.
        bs, bv = s[sel], v[sel]
    lr_law, schedule = None, None
    if reference is None and lr_steps is not None and lr_values is not None:
        lr_law, schedule = _fit_lr_law(bs, bv, lr_steps, lr_values, up, fin)
    if reference is not None:
        mean_fn, sigma, model = reference.aligned(bs, bv), reference.sigma, "reference"
    elif lr_law is not None:
        mean_fn, sigma, model = lr_law.predict, lr_law.sigma, "lr_law"
    else:
        law = fit_power_law(bs, bv)
        mean_fn, sigma, model = law.predict, law.sigma, "power_law"
    unknown_anneal = model == "power_law" or (model == "lr_law" and schedule == "flat")
    anneal = ANNEAL_ALLOWANCE if unknown_anneal and fin > up else 0.0
    now = _level_now(s[sel], v[sel], up) if model != "reference" else None
    curve = _band_fn(mean_fn, sigma, up, fin, anneal, now)
    m, lo, hi = (float(a[0]) for a in curve(np.array([fin])))
    target_step = None
    if target is not None and math.isfinite(target):
        target_step = _target_step(mean_fn, target, up, max(fin, up) * 10.0)
    eta = eta_seconds(times, s, up, fin)
    return Forecast(m, lo, hi, model, eta, target_step, int(up), int(fin), curve, schedule)


def _fit_lr_law(
    bs: np.ndarray, bv: np.ndarray, lr_steps, lr_values, up: float, fin: float
) -> tuple[LRLaw | None, str | None]:
    """The LR-aware law fitted on the bins, with the LR logged up to ``up`` projected to
    ``fin``, and the projection's shape; the law is None when the anneal it saw is too
    little to know what the projected decay does (``KNOWN_ANNEAL``), the LR's warmup
    ends inside the fitted steps (lr_schedule "warmup"), or no LR point is finite."""
    horizon = int(max(fin, up))
    ls, lv = np.asarray(lr_steps, dtype=float), np.asarray(lr_values, dtype=float)
    known = ls <= up  # what was known at the fit step: ``upto`` is an honest what-if
    projected = project_lr(ls[known], lv[known], horizon)
    if projected.steps.size == 0:
        return None, None
    if projected.peak_step is not None and projected.peak_step > bs.min():
        return None, "warmup"  # fitted across the warmup, the law mistakes its shape
    law = fit_lr_law(bs, bv, projected.steps, projected.values, horizon=horizon)
    s2 = law.s2
    at = np.clip(np.array([bs.min(), up, horizon]).round().astype(int), 0, s2.size - 1)
    seen, coming = s2[at[1]] - s2[at[0]], s2[at[2]] - s2[at[1]]
    decays = projected.shape in ("cosine", "linear")  # held flat, no anneal is coming
    if decays and seen < KNOWN_ANNEAL * coming:
        log.debug("LR law not used: anneal seen %.3g, still to come %.3g", seen, coming)
        return None, projected.shape
    return law, projected.shape


def _level_now(fs: np.ndarray, fv: np.ndarray, up: float) -> float | None:
    """The highest level the run may be at by the fit step, at 90%: the median of its
    fitted points in the last tenth of the steps seen, plus that median's own noise (a
    noisy loss's last few bins can sit well below where the run is)."""
    late = fv[fs >= 0.9 * up]
    if late.size == 0:
        return None
    # A median's standard error is sqrt(pi/2) sigma/sqrt(n); a robust sigma, so a spike
    # does not widen it.
    error = math.sqrt(math.pi / 2) * residual_sigma(late) / math.sqrt(late.size)
    return float(np.median(late)) + Z90 * error


def _target_step(mean_fn, target: float, start: float, stop: float) -> int | None:
    """First step after ``start`` where the expected curve is at or below ``target``."""
    grid = np.unique(np.geomspace(max(start, 1.0), max(stop, start + 1.0), 512).round())
    mean = mean_fn(grid)
    hit = np.flatnonzero(mean <= target)
    return int(grid[hit[0]]) if hit.size else None
