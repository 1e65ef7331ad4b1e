"""Expected-curve deviation: the smoothed loss leaves the band of the expected curve."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import numpy as np

from runwatch.detect._deviation_core import ABOVE, REFIT_DUE, STALLED, CurveDeviationCore
from runwatch.detect.base import Detector, LRAware, Signal, check_lengths, check_number
from runwatch.expect.lrlaw import AreaLaw, fit_area_law
from runwatch.expect.powerlaw import PowerLaw, fit_power_law
from runwatch.expect.reference import ReferenceCurve

log = logging.getLogger("runwatch.detect")


CADENCE_POINTS = 8
"""The first points, whose median step gap is taken as the series' logging interval."""

CALIBRATED_GAP = 5
"""The longest logging interval of the real runs the point windows were set on (Megatron's
runs in shared/data/real_runs log every 5 steps): up to it the windows are kept as given."""


def _shifted(on_error: Callable[[int], None], offset: int) -> Callable[[int], None]:
    """``on_error`` for a slice of a series that starts at ``offset``."""
    return lambda j: on_error(j + offset)


class CurveDeviation(LRAware, Detector):
    """The smoothed loss stays outside the band of its expected curve for long enough.

    The expected curve is a robust power law in the step (``runwatch.expect``), refitted
    whenever the number of points has grown by ``refit_growth`` (bounded cost: it is fitted
    on log-spaced bins of the accepted points, fewer than 200 numbers for 10M steps). A fit
    uses the bins after ``fit_from`` of the steps seen and is validated out of sample: the
    previous fit predicts the bins that arrived since it was made, and the same law fitted
    without the newest third of the bins predicts them; the worst relative error widens
    the band (a curve that foresaw the recent past badly is trusted
    less); above ``max_val_err`` the fit is not used at all. The loss is smoothed (running
    median of 5, then an EMA of ``span`` points) and so is the expected value, so both lag
    alike on a steep curve. The band half-width is the larger of ``band_sigmas`` noise
    sigmas of the smoothed value and (``rel_margin`` + validation error + ``extrap_rel``
    per e-fold of extrapolation since the fit) of the level.
    ``patience`` points in a row above the band: warning ("worse than expected"); below
    the band: info ("better than expected": an annealing LR does that, see below). A slope
    test runs beside it: over the last ``stall_window`` points the smoothed loss must fall
    at least ``stall_frac`` of what the curve predicts for the same steps, whenever that
    predicted fall is clear of the noise and above ``stall_min`` of the level; otherwise
    the loss has stalled (warning). The slope test does not depend on the fit's level.

    Catches: silent plateaus (a frozen layer, data stuck on a few shards, an LR stuck at 0
    that is not logged), as a stall or a deviation above the band, and level shifts (a
    harder data mix).
    The curve is not extrapolated past twice the step of the last learned point: beyond
    that the detector stops judging and learns again (a bound on how long a wrong fit can
    keep alarming).

    Reference mode (``use_reference``): the expected curve is an earlier, known-good run's
    curve itself, not a fit, up to the last step it covers; the detector then says where
    this run is worse or better than that run, and never adapts to a lasting difference.

    LR schedules: once the run's learning rate is known (``use_lr``: the Monitor hands each
    loss series the run's :class:`~runwatch.expect.LRClock`), the expected curve is the
    LR-aware law of Tissue et al. 2024, L = E + A·S1^-α - C·S2 over the summed LR S1 and
    the annealing area S2 at each point, so warmup, cosine and warmup-stable-decay
    schedules are expected rather than flagged. When the LR first arrives the detector
    starts afresh (bins and fit) on that law. An anneal beyond the largest S2 the fit has
    seen (a decay that starts after thousands of constant-LR steps, where C cannot be
    known yet) widens the band by ``unseen_anneal`` of its predicted drop, and "better
    than expected" is not reported meanwhile.

    Misses: a plateau late in a run, where the expected curve is itself nearly flat (it is
    found only once the expected curve has fallen ``rel_margin`` below it); anything in
    the first ``min_points`` points (fewer, down to 100, for a series logged less often than
    every 5 steps: ``max_thinning``); without a logged LR the drop of an LR anneal is only
    info ("better than expected"), and with it, a plateau that the LR explains (an LR
    stuck at 0 is expected to stall the loss: ``LRSanity`` on the LR series reports it).

    Baseline protection: points whose smoothed value is in the upper ``1 - learn_frac`` of
    the band or above it are not binned, so a plateau is not fitted as the new normal. The
    cost: after a real lasting shift it warns until ``adapt_after`` flagged points (or
    until the step is twice the last learned one), then fits afresh from the new level.

    Parameters
    ----------
    span : int
        Points of the EMA that smooths the loss (after the running median of 5) and the
        expected value alike.
    band_sigmas : float
        The band's half-width in noise sigmas of the smoothed value (its lower bound).
    rel_margin : float
        The band's half-width relative to the level, before the validation error and the
        extrapolation are added.
    max_val_err : float
        A refit whose validation error (relative) is above this is not used.
    patience : int
        Points in a row outside the band, or stalled, before one is flagged.
    min_points : int
        Points before the first fit (and after starting afresh).
    fit_from : float
        A fit uses the bins after this fraction of the steps seen.
    refit_growth : float
        Refit when the number of points has grown by this factor.
    extrap_rel : float
        The band widens by this much of the level per e-fold of steps past the fit.
    learn_frac : float
        A point is learned only while its smoothed value is at most this fraction of the
        band's half-width above the expected value (baseline protection).
    stall_window : int
        Points over which the slope test compares the falls.
    stall_frac : float
        The smoothed loss must fall at least this fraction of the expected fall.
    stall_min : float
        The slope test runs only where the expected fall is above this fraction of the
        level.
    adapt_after : int
        Flagged points above the band after which the detector starts afresh.
    unseen_anneal : float
        Fraction of an unseen anneal's predicted drop that widens the band.
    max_thinning : float
        Most a sparse series' cadence divides ``min_points`` and ``stall_window`` by: a
        series logged every g > ``CALIBRATED_GAP`` steps keeps their length in steps, down
        to a ``1 / max_thinning`` share of their points. ``span`` and ``patience``, the
        evidence a flag needs, stay in points.

    Examples
    --------
    >>> import random
    >>> rng = random.Random(3)
    >>> d = CurveDeviation()
    >>> s = range(1, 3001)
    >>> curve = [2.0 + 9.0 * (i + 50) ** -0.35 * (1 + 0.01 * rng.gauss(0, 1)) for i in s]
    >>> curve[1500:] = [curve[1500]] * 1500  # plateau from step 1501
    >>> hits = [(i, sig.severity) for i, v in zip(s, curve) if (sig := d.update(i, v))]
    >>> hits[0]
    (1722, 'warning')
    """

    name = "curve_deviation"
    quiet = 50

    def __init__(
        self,
        span: int = 50,
        band_sigmas: float = 4.0,
        rel_margin: float = 0.005,
        max_val_err: float = 0.05,
        patience: int = 20,
        min_points: int = 1000,
        fit_from: float = 0.2,
        refit_growth: float = 1.5,
        extrap_rel: float = 0.02,
        learn_frac: float = 0.5,
        stall_window: int = 500,
        stall_frac: float = 0.25,
        stall_min: float = 0.004,
        adapt_after: int = 5000,
        unseen_anneal: float = 0.25,
        max_thinning: float = 10.0,
    ) -> None:
        check_number("span", span, low=1, integer=True)
        check_number("band_sigmas", band_sigmas, low=0.0)
        check_number("rel_margin", rel_margin, low=0.0)
        check_number("max_val_err", max_val_err, low=0.0)
        check_number("patience", patience, low=1, integer=True)
        check_number("min_points", min_points, low=10, integer=True)
        check_number("fit_from", fit_from, low=0.0, high=0.9)
        check_number("refit_growth", refit_growth, low=1.01)
        check_number("extrap_rel", extrap_rel, low=0.0)
        check_number("learn_frac", learn_frac, low=0.0, high=1.0)
        check_number("stall_window", stall_window, low=2, integer=True)
        check_number("stall_frac", stall_frac, low=0.0, high=1.0)
        check_number("stall_min", stall_min, low=0.0)
        check_number("adapt_after", adapt_after, low=1, integer=True)
        check_number("unseen_anneal", unseen_anneal, low=0.0)
        check_number("max_thinning", max_thinning, low=1.0)
        self.max_thinning = max_thinning
        self.unseen_anneal = unseen_anneal
        self.stall_window = stall_window
        self.stall_frac = stall_frac
        self.stall_min = stall_min
        self.extrap_rel = extrap_rel
        self.learn_frac = learn_frac
        self.span = span
        self.band_sigmas = band_sigmas
        self.rel_margin = rel_margin
        self.max_val_err = max_val_err
        self.patience = patience
        self.min_points = min_points
        self.fit_from = fit_from
        self.refit_growth = refit_growth
        self.adapt_after = adapt_after
        self._reference: ReferenceCurve | None = None
        super().__init__()

    def use_reference(self, curve: ReferenceCurve) -> None:
        """Judge by ``curve`` (an earlier run's, or a family's, in this run's steps)
        instead of a fit; a curve with its own band (``rel_band``) widens the margin."""
        widen = curve.rel_band > self._margin()
        self._reference = curve
        if widen:
            self._reset()  # the core takes its margin when it is made
            return
        self._ref_last = curve.last_step
        terms = [curve.at(s) for s in self._core.history_steps()]
        self._core.set_reference(max(self._ref_last, 1.0), terms)

    def _reset(self) -> None:
        self._thinning = 1.0
        self._first: list[tuple[float, float, float, float]] | None = []
        self._build_core()

    def _build_core(self) -> None:
        """A fresh core, the windows that say when judging starts thinned by the series'
        cadence (``_thinning``)."""

        def thin(points: int) -> int:
            return max(1, round(points / self._thinning))

        self._core = CurveDeviationCore(
            self.span,
            self.band_sigmas,
            self._margin(),
            self.patience,
            max(thin(self.min_points), CADENCE_POINTS),
            self.refit_growth,
            self.extrap_rel,
            self.learn_frac,
            thin(self.stall_window),
            self.stall_frac,
            self.stall_min,
            self.adapt_after,
            self.unseen_anneal,
        )
        self._n_fits = 0
        self._n_untrusted = 0
        self._last_fit: PowerLaw | AreaLaw | None = None
        self._last_fit_step = 0.0
        if self._reference is not None:
            self.use_reference(self._reference)

    def _margin(self) -> float:
        """``rel_margin``, or the reference curve's own band when that is wider."""
        ref = self._reference
        return max(self.rel_margin, ref.rel_band if ref is not None else 0.0)

    @property
    def law(self) -> PowerLaw | AreaLaw | None:
        """The current expected curve (None before the first fit)."""
        return self._core.law

    @property
    def n_fits(self) -> int:
        return self._n_fits

    @property
    def n_untrusted(self) -> int:
        """How many refits were not trusted (they failed to predict the newest bins)."""
        return self._n_untrusted

    @property
    def n_bins(self) -> int:
        """How many log bins hold the learned points (bounded: a few per doubling of the
        step)."""
        return self._core.n_bins

    def expected(self, step: int) -> float | None:
        """The expected value at ``step`` from the current fit (None without one)."""
        if self._reference is not None:
            return self._reference.at(step)
        law = self._core.law
        if law is None:
            return None
        if isinstance(law, AreaLaw):
            ar = self._areas_now(step)
            return None if ar is None else law.part(*ar) + law.E
        return float(law.predict(np.array([float(step)]))[0])

    def update(self, step: int, value: float) -> Signal | None:
        if not math.isfinite(value) or step < self._judged_from:
            return None
        ar = self._areas_now(step) if self._reference is None else None
        return self._point(step, value, *(ar or (math.nan, math.nan)))

    def _point(self, step: int, value: float, s1: float, s2: float) -> Signal | None:
        """One finite, judged point with its LR areas (NaN: none yet)."""
        rec = self._feed(step, value, s1, s2)
        if self._first is not None:
            self._learn_cadence(step, value, s1, s2)
        return None if rec is None else self._signal(step, value, rec)

    def _feed(self, step: float, value: float, s1: float, s2: float) -> tuple | None:
        """The core's record of one point, refitting first where the core asks for it."""
        if self._reference is not None:
            rec = self._core.update(step, value, ref=self._ref_at(step))
        else:
            rec = self._core.update(step, value, s1, s2)
        if rec is REFIT_DUE:
            self._refit(step)
            rec = self._core.resume()
        return rec

    def _learn_cadence(self, step: float, value: float, s1: float, s2: float) -> None:
        """Keep the first points until ``CADENCE_POINTS`` give the series' step gap g. A
        series logged more sparsely than ``CALIBRATED_GAP`` (a trainer logging every 50 or
        500 steps) is then judged with the windows, in steps, of one logged every
        ``CALIBRATED_GAP`` steps: the core is rebuilt with ``min_points`` and
        ``stall_window`` divided by g / ``CALIBRATED_GAP``, at most ``max_thinning``, and
        fed those points again (none of them can be flagged: ``min_points`` stays at least
        ``CADENCE_POINTS``)."""
        first = self._first
        assert first is not None
        first.append((step, value, s1, s2))
        if len(first) < CADENCE_POINTS:
            return
        self._first = None
        thinning = float(np.median(np.diff([p[0] for p in first]))) / CALIBRATED_GAP
        if thinning <= 1:
            return
        self._thinning = min(thinning, self.max_thinning)
        self._build_core()
        for point in first:
            self._feed(*point)

    def update_many(
        self,
        steps: Sequence[int],
        values: Sequence[float],
        on_error: Callable[[int], None] | None = None,
        areas: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> list[tuple[int, Signal]]:
        """``update`` point by point, in the compiled core (same signals, same state).

        The core runs every point as ``update`` does and stops only where a refit is due
        (done here, as ``update`` does it) or a point raised; the points it flags come
        back as records whose signals are built here.

        ``areas``: each point's S1 and S2 as the LR clock gave them live (NaN: no LR yet;
        ``runwatch.expect.lrclock.areas_at``); required once the detector's clock has the
        LR (in a replay it has already been fed the whole LR series).
        """
        self._need_areas(areas)
        check_lengths(steps, values)
        if self._judged_from > 0 and len(steps) and min(steps) < self._judged_from:
            return self._update_judged(steps, values, on_error, areas)
        if self._first is not None:
            return self._update_learning_cadence(steps, values, on_error, areas)
        return self._update_many_core(steps, values, on_error, areas)

    def _update_learning_cadence(self, steps, values, on_error, areas):
        """``update_many`` while the cadence is not known: the points that complete it one
        by one (as ``update`` takes them), the rest in the core."""
        out: list[tuple[int, Signal]] = []
        i, n = 0, len(values)
        while i < n and self._first is not None:
            value = float(values[i])
            if math.isfinite(value):
                s1, s2 = (float(a[i]) for a in areas) if areas is not None else (math.nan,) * 2
                try:
                    sig = self._point(steps[i], value, s1, s2)
                except Exception:
                    if on_error is None:
                        raise
                    on_error(i)
                else:
                    if sig is not None:
                        out.append((i, sig))
            i += 1
        if i < n:
            rest = None if areas is None else tuple(np.asarray(a)[i:] for a in areas)
            back = None if on_error is None else _shifted(on_error, i)
            got = self._update_many_core(steps[i:], values[i:], back, rest)
            out += [(i + j, sig) for j, sig in got]
        return out

    def _update_many_core(self, steps, values, on_error, areas):
        """``update_many`` on a detector that knows its cadence, in the compiled core."""
        st = np.ascontiguousarray(steps, dtype=np.float64)
        vs = np.ascontiguousarray(values, dtype=np.float64)
        s1 = s2 = refs = None
        if self._reference is not None:
            refs = np.array([self._ref_at(s) for s in steps], dtype=np.float64)
        elif areas is not None:
            s1, s2 = (np.ascontiguousarray(a, dtype=np.float64) for a in areas)
        core = self._core
        out: list[tuple[int, Signal]] = []
        j, m = 0, len(vs)
        while True:
            j, flags, exc = core.update_many(st, vs, s1, s2, refs, j)
            for i, rec in flags:
                self._signal_at(out, steps, values, i, rec, on_error)
            if j == m:
                return out
            if exc is None:  # point j waits for a refit
                try:
                    self._refit(steps[j])
                    rec = core.resume()
                except Exception:
                    if on_error is None:
                        raise
                    on_error(j)
                    rec = None
                if rec is not None:
                    self._signal_at(out, steps, values, j, rec, on_error)
            elif on_error is None:
                raise exc
            else:
                on_error(j)
            j += 1

    @property
    def _judged_from(self) -> float:
        """The first step judged: a reference curve's first known step (else 0)."""
        return self._reference.first_step if self._reference is not None else 0.0

    def _update_judged(self, steps, values, on_error, areas) -> list[tuple[int, Signal]]:
        """``update_many`` on the points from ``_judged_from`` on only: before it the
        reference is not known, and neither the run's smoothed value nor the expected
        one may start from there (they would lag apart)."""
        keep = np.flatnonzero(np.asarray(steps, dtype=np.float64) >= self._judged_from)
        back = None if on_error is None else (lambda j: on_error(int(keep[j])))
        sub = None if areas is None else tuple(np.asarray(a)[keep] for a in areas)
        got = self.update_many(
            [steps[i] for i in keep],
            [values[i] for i in keep],
            back,
            sub,  # type: ignore[arg-type]
        )
        return [(int(keep[i]), sig) for i, sig in got]

    def _ref_at(self, step: int) -> float:
        """The reference curve at ``step`` (NaN outside the steps it covers)."""
        ref = self._reference
        return ref.at(step) if ref.first_step <= step <= self._ref_last else math.nan

    def _refit(self, step: float) -> None:
        """Fit the expected curve on the core's bins, validate it out of sample (see the
        class docstring) and hand it to the core, or leave the core without a law."""
        bs, bv, _, *areas = self._core.bins()
        if bs.size == 0:
            return
        keep = bs >= self.fit_from * bs.max()
        bs, bv = bs[keep], bv[keep]
        ar = [a[keep] for a in areas]
        hold = max(3, bs.size // 3)
        if bs.size - hold < 6:
            return
        prev, prev_step = self._last_fit, self._last_fit_step
        try:
            check = _fit(bs[:-hold], bv[:-hold], [a[:-hold] for a in ar], prev)
            pred = _predict(check, bs[-hold:], [a[-hold:] for a in ar])
            err = np.abs(pred - bv[-hold:]) / np.maximum(np.abs(bv[-hold:]), 1e-12)
            law = _fit(bs, bv, ar, check)
        except ValueError as exc:
            log.debug("curve_deviation: no fit yet (%s)", exc)
            return
        self._n_fits += 1
        self._last_fit, self._last_fit_step = law, float(step)
        new = bs > prev_step
        if prev is None or not new.any():
            # Never judged by a curve that has not yet foreseen anything.
            self._core.drop_law()
            return
        pred = _predict(prev, bs[new], [a[new] for a in ar])
        fwd = np.abs(pred - bv[new]) / np.maximum(np.abs(bv[new]), 1e-12)
        val_err = max(float(np.median(err)), float(np.median(fwd)))
        if val_err > self.max_val_err:
            self._n_untrusted += 1
            self._core.drop_law()
            return
        s2_seen = float(ar[1].max()) if ar else 0.0
        self._core.set_law(law, val_err, s2_seen, max(float(step), 1.0))

    def _signal_at(
        self,
        out: list[tuple[int, Signal]],
        steps: Sequence[int],
        values: Sequence[float],
        i: int,
        rec: tuple,
        on_error: Callable[[int], None] | None,
    ) -> None:
        """Append point ``i``'s signal to ``out``; if building it raises, report ``i`` to
        ``on_error`` (the point counts as unflagged)."""
        try:
            out.append((i, self._signal(steps[i], values[i], rec)))
        except Exception:
            if on_error is None:
                raise
            on_error(i)

    def _signal(self, step: int, value: float, rec: tuple) -> Signal:
        """The signal of one of the core's flag records: an above-the-band warning, a
        below-the-band info (the record has the points in a row on that side) or a
        stall."""
        if rec[0] == STALLED:
            _, s_then, ema, e_then, d_exp, d_obs = rec
            if not isinstance(step, float) and s_then.is_integer():
                s_then = int(s_then)  # the step as it was given (the core keeps floats)
            return self._stall_signal(step, ema, s_then, e_then, d_exp, d_obs)
        kind, count, ema, exp_v, half, fit_step = rec
        side = "above" if kind == ABOVE else "below"
        sev = "warning" if side == "above" else "info"
        rel = (ema - exp_v) / abs(exp_v) if exp_v else math.inf
        score = abs(ema - exp_v) / half if half > 0 else 1000.0
        what = "worse" if side == "above" else "better"
        msg = (
            f"smoothed value {ema:.4g} is {what} than the expected curve {exp_v:.4g} "
            f"({rel:+.1%}) for {count} points"
        )
        return Signal(
            sev,
            score,
            value,
            exp_v,
            exp_v - half,
            exp_v + half,
            msg,
            {"smoothed": ema, "relative_deviation": rel, "side": side, "fit_step": fit_step},
        )

    def _stall_signal(
        self, step: int, ema: float, s_then: int, e_then: float, d_exp: float, d_obs: float
    ) -> Signal:
        msg = (
            f"loss stopped improving: fell {d_obs:.3g} over steps {s_then}-{step} "
            f"where the expected curve falls {d_exp:.3g}"
        )
        return Signal(
            "warning",
            d_exp / max(d_obs, 1e-12) if d_obs > 0 else 1000.0,
            ema,
            e_then - d_exp,
            None,
            e_then - self.stall_frac * d_exp,
            msg,
            {"smoothed": ema, "side": "stalled", "expected_fall": d_exp, "fall": d_obs},
        )


def _fit(bs: np.ndarray, bv: np.ndarray, areas: list[np.ndarray], start) -> PowerLaw | AreaLaw:
    """The power law in the step, or with the bins' LR areas the LR-aware law."""
    if areas:
        warm = start if isinstance(start, AreaLaw) else None
        return fit_area_law(areas[0], areas[1], bv, start=warm)
    return fit_power_law(bs, bv, start=start if isinstance(start, PowerLaw) else None)


def _predict(law: PowerLaw | AreaLaw, bs: np.ndarray, areas: list[np.ndarray]) -> np.ndarray:
    if isinstance(law, AreaLaw):
        return law.predict_areas(areas[0], areas[1])
    return law.predict(bs)
