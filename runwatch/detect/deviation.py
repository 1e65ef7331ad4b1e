"""Expected-curve deviation: the smoothed loss leaves the band of the expected curve."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import numpy as np

from runwatch.detect._deviation_kernel import ABOVE, STALLED, Run
from runwatch.detect.base import (
    Detector,
    LRAware,
    Signal,
    check_lengths,
    check_number,
    ema_step,
    noise_step,
    update_points,
)
from runwatch.expect.binning import LogBins
from runwatch.expect.lrlaw import AreaLaw, fit_area_law
from runwatch.expect.powerlaw import PowerLaw, fit_power_law
from runwatch.expect.reference import ReferenceCurve

log = logging.getLogger("runwatch.detect")


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
    the first ``min_points`` points; without a logged LR the drop of an LR anneal is only
    info ("better than expected"), and with it, a plateau that the LR explains (an LR
    stuck at 0 is expected to stall the loss: ``LRSanity`` on the LR series reports it).

    Baseline protection: points whose smoothed value is in the upper ``1 - learn_frac`` of
    the band or above it are not binned, so a plateau is not fitted as the new normal. The
    cost: after a real lasting shift it warns until ``adapt_after`` flagged points (or
    until the step is twice the last learned one), then fits afresh from the new level.

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
        self._reference: _ReferenceLaw | None = None
        super().__init__()

    def use_reference(self, curve: ReferenceCurve) -> None:
        """Judge by ``curve`` (an earlier run's, in this run's steps) instead of a fit."""
        self._reference = _ReferenceLaw(curve)

    def _reset(self) -> None:
        self._alpha = 2.0 / (self.span + 1.0)
        self._beta = 1.0 - self._alpha
        self._ema_sd = math.sqrt(self._alpha / (2.0 - self._alpha))
        self._bins = LogBins()
        self._by_area = False
        self._n = 0
        self._next_fit = self.min_points
        self._law: PowerLaw | AreaLaw | None = None
        self._fit_step = 0.0
        self._ema = math.nan
        self._exp_ema = math.nan
        self._last_learned = 0.0
        self._prev = math.nan
        self._absdiff = math.nan
        self._recent: list[float] = []
        self._over = 0
        self._under = 0
        self._flagged = 0
        self._n_fits = 0
        self._n_untrusted = 0
        self._hist: list[tuple[int, float, float]] = []  # step, smoothed, S1
        self._stalled = 0
        self._val_err = 0.0
        self._s2_seen = 0.0
        self._last_fit: PowerLaw | None = None
        self._last_fit_step = 0.0

    @property
    def law(self) -> PowerLaw | AreaLaw | None:
        """The current expected curve (None before the first fit)."""
        return self._law

    @property
    def n_fits(self) -> int:
        return self._n_fits

    def expected(self, step: int) -> float | None:
        """The expected value at ``step`` from the current fit (None without one)."""
        if self._reference is not None:
            return self._reference.curve.at(step)
        law = self._law
        if law is None:
            return None
        if isinstance(law, AreaLaw):
            ar = self._areas_now(step)
            return None if ar is None else law.part(*ar) + law.E
        return float(law.predict(np.array([float(step)]))[0])

    def _smooth(self, x: float) -> float:
        if self._n == 1:
            self._ema = self._prev = x
            self._recent = [x]
            return x
        d = abs(x - self._prev)
        self._prev = x
        self._absdiff = noise_step(self._absdiff, d)
        recent = self._recent
        recent.append(x)
        if len(recent) > 5:
            del recent[0]
        srt = sorted(recent)
        self._ema = ema_step(self._ema, srt[len(srt) // 2], self._alpha, self._beta)
        return self._ema

    @property
    def n_untrusted(self) -> int:
        """How many refits were not trusted (they failed to predict the newest bins)."""
        return self._n_untrusted

    def _refit(self, step: float) -> None:
        bs, bv, _, *areas = self._bins.arrays()
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
            self._law = None
            return
        pred = _predict(prev, bs[new], [a[new] for a in ar])
        fwd = np.abs(pred - bv[new]) / np.maximum(np.abs(bv[new]), 1e-12)
        val_err = max(float(np.median(err)), float(np.median(fwd)))
        if val_err > self.max_val_err:
            self._n_untrusted += 1
            self._law = None
            return
        self._law = law
        self._s2_seen = float(ar[1].max()) if ar else 0.0
        self._val_err = val_err
        self._fit_step = max(float(step), 1.0)

    def update(self, step: int, value: float) -> Signal | None:
        if not math.isfinite(value):
            return None
        return self._update(step, value, self._areas_now(step))

    def _update(self, step: int, value: float, ar: tuple[float, float] | None) -> Signal | None:
        """``update`` of a finite point whose LR areas ``ar`` are known (None: no LR)."""
        self._n += 1
        ema = self._smooth(value)
        if self._reference is not None:
            ar = None
            law = self._reference if step <= self._reference.curve.last_step else None
            self._fit_step = max(self._reference.curve.last_step, 1.0)
        else:
            if ar is not None and not self._by_area:
                self._start_by_area()
            if self._n >= self._next_fit:
                self._refit(step)
                self._next_fit = int(self._n * self.refit_growth) + 1
            if self._law is not None and step > 2.0 * self._last_learned:
                # Too far beyond what the fit has seen (a huge step gap): refit first.
                self._law = None
            law = self._law
        if law is None:
            self._exp_ema = math.nan
            self._over = self._under = self._flagged = 0
            self._learn(step, value, ar)
            return None
        if law.__class__ is PowerLaw:  # _part, inlined: the common case, per point
            part = law.A * max(step + law.s0, 1e-9) ** -law.alpha
        else:
            part = _part(law, step, ar)
        exp_raw = float(part + law.E)
        if math.isnan(self._exp_ema):
            self._exp_ema = exp_raw
        else:
            self._exp_ema = ema_step(self._exp_ema, exp_raw, self._alpha, self._beta)
        exp_v = self._exp_ema
        sigma = 0.886 * self._absdiff * self._ema_sd
        extrap = math.log(max(step, self._fit_step) / self._fit_step)
        half = max(
            self.band_sigmas * sigma,
            (self.rel_margin + self._val_err + self.extrap_rel * extrap) * abs(exp_v),
        )
        fall = part
        new_anneal = False
        if isinstance(law, AreaLaw):
            # An anneal beyond any the fit has seen: its predicted drop is not trusted,
            # and a loss falling faster than expected meanwhile is no news.
            new_anneal = ar[1] > self._s2_seen
            half += self.unseen_anneal * law.C * max(ar[1] - self._s2_seen, 0.0)
            fall = law.forward(ar[0])
        if ema > exp_v + half:
            self._over += 1
            self._under = 0
            if self._over < self.patience:
                return None
            self._flagged += 1
            sig = self._signal(step, value, ema, exp_v, half, "above", self._over)
            if self._flagged >= self.adapt_after and self._reference is None:
                self._start_afresh()
                self._over = self._flagged = 0
            return sig
        self._over = self._flagged = 0
        stalled = self._stall_check(step, ema, law, sigma, fall, ar)
        if stalled is not None:
            return stalled
        if ema <= exp_v + self.learn_frac * half:
            self._learn(step, value, ar)
        if ema < exp_v - half and not new_anneal:
            self._under += 1
            if self._under >= self.patience:
                return self._signal(step, value, ema, exp_v, half, "below", self._under)
        else:
            self._under = 0
        return None

    def update_many(
        self,
        steps: Sequence[int],
        values: Sequence[float],
        on_error: Callable[[int], None] | None = None,
        areas: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> list[tuple[int, Signal]]:
        """``update`` point by point, the points that need no Python compiled (same result).

        ``runwatch.detect._deviation_kernel`` runs every point as ``update`` does, up to
        the first that Python must run: a refit, the first point with an LR, an "above"
        flag that starts afresh, a law term that would overflow. That point goes through
        ``update`` itself, and the kernel goes on after it; the points it flags come back
        as events whose signals are built here. Needs int steps (within 2^53) and float
        values (what batch replay gives), and a state of such points; otherwise the
        plain loop.

        ``areas``: each point's S1 and S2 as the LR clock gave them live (NaN: no LR yet;
        ``runwatch.expect.lrclock.areas_at``); required once the detector's clock has the
        LR (in a replay it has already been fed the whole LR series).
        """
        self._need_areas(areas)
        check_lengths(steps, values)
        s1, s2 = (None, None) if areas is None else (np.asarray(a, dtype=float) for a in areas)
        run = None
        if self._batchable():
            st, vs = (x if type(x) is list else list(x) for x in (steps, values))
            run = Run(self, st, vs, s1, s2)
        if run is None or not run.ok:
            return self._loop(steps, values, areas, on_error)
        out: list[tuple[int, Signal]] = []
        j, m = 0, len(values)
        while True:
            j = run.run(j)
            for ev in run.events:
                i = ev[0]
                out.append((i, self._event_signal(steps[i], values[i], ev)))
            run.events.clear()
            if j == m:
                return out
            ar = None if s1 is None or s1[j] != s1[j] else (float(s1[j]), float(s2[j]))
            try:
                sig = self._update(steps[j], values[j], ar)
            except Exception:
                if on_error is None:
                    raise
                on_error(j)
                # The rest through the plain loop: update may have stopped half way.
                tail = None if areas is None else (areas[0][j + 1 :], areas[1][j + 1 :])
                rest = self._loop(
                    steps[j + 1 :], values[j + 1 :], tail, lambda k, j=j: on_error(j + 1 + k)
                )
                return out + [(j + 1 + k, s) for k, s in rest]
            if sig is not None:
                out.append((j, sig))
            j += 1

    def _batchable(self) -> bool:
        """Can the kernel hold this state? Not with a reference curve, nor with the int
        sums and values that ``update`` calls on int values or float steps leave (the
        kernel writes floats back, and sums a bin's steps as ints)."""
        return (
            self._reference is None
            and all(type(v) is float for v in (self._ema, self._prev, self._absdiff))
            and all(type(v) is float for v in self._recent)
            and all(type(h[0]) is int for h in self._hist)
            and all(type(b[0]) is int for b in self._bins._bins.values())
        )

    def _event_signal(self, step: int, value: float, ev: tuple) -> Signal:
        """The signal of a point the kernel flagged (``Run.events``)."""
        if ev[1] == STALLED:
            _, _, ema, s_then, e_then, d_exp, d_obs = ev
            return self._stall_signal(step, ema, s_then, e_then, d_exp, d_obs)
        _, kind, count, ema, exp_v, half = ev
        side = "above" if kind == ABOVE else "below"
        return self._signal(step, value, ema, exp_v, half, side, count)

    def _loop(
        self,
        steps: Sequence[int],
        values: Sequence[float],
        areas: tuple[np.ndarray, np.ndarray] | None,
        on_error: Callable[[int], None] | None,
    ) -> list[tuple[int, Signal]]:
        """``update`` point by point, with the given areas instead of the clock's."""
        if areas is None:
            return Detector.update_many(self, steps, values, on_error)
        s1l, s2l = areas[0].tolist(), areas[1].tolist()
        per_point = [None if a != a else (a, b) for a, b in zip(s1l, s2l, strict=True)]
        return update_points(self._update, steps, values, per_point, on_error)

    def _start_by_area(self) -> None:
        """The LR has arrived: from here the bins keep each point's areas too."""
        self._by_area = True
        self._start_afresh()
        self._hist = []

    def _start_afresh(self) -> None:
        self._bins = LogBins(extra=2 if self._by_area else 0)
        self._law = None
        self._next_fit = self._n + self.min_points

    def _stall_check(
        self,
        step: int,
        ema: float,
        law: PowerLaw | AreaLaw,
        sigma: float,
        now: float,
        ar: tuple[float, float] | None,
    ):
        """Has the loss stopped falling where the curve expects it to fall?

        Compares the fall of the smoothed loss over the last ``stall_window`` points with
        the fall the expected curve predicts over the same steps: a slope test, so it does
        not depend on the fit's level being right, only on its slope. ``now`` is the law
        less its constant at this point; with the LR-aware law, its forward-area term only,
        so an anneal's extra drop is never required.
        """
        hist = self._hist
        hist.append((step, ema, ar[0] if ar is not None else math.nan))
        if len(hist) > self.stall_window:
            del hist[0]
        else:
            return None
        s_then, e_then, s1_then = hist[0]
        if s_then >= step:
            return None
        then = law.forward(s1_then) if isinstance(law, AreaLaw) else _part(law, s_then, None)
        d_exp = then - now
        d_obs = e_then - ema
        need = max(self.band_sigmas * math.sqrt(2.0) * sigma, self.stall_min * abs(ema))
        if d_exp > need and d_obs < self.stall_frac * d_exp:
            self._stalled += 1
            if self._stalled >= self.patience:
                return self._stall_signal(step, ema, s_then, e_then, d_exp, d_obs)
            return None
        self._stalled = 0
        return None

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

    def _learn(self, step: int, value: float, ar: tuple[float, float] | None) -> None:
        if self._by_area:
            self._bins.add(step, value, *ar)
        else:
            self._bins.add(step, value)
        if step > self._last_learned:
            self._last_learned = float(step)

    def _signal(
        self,
        step: int,
        value: float,
        ema: float,
        exp_v: float,
        half: float,
        side: str,
        count: int,
    ) -> Signal:
        """An above-the-band warning or below-the-band info; ``count``: points in a row on
        that side."""
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
            {"smoothed": ema, "relative_deviation": rel, "side": side, "fit_step": self._fit_step},
        )


class _ReferenceLaw:
    """A reference run's curve in the place of a fitted law (constant 0: all of it is
    the part that varies)."""

    E = 0.0

    def __init__(self, curve: ReferenceCurve) -> None:
        self.curve = curve


def _part(law, step: int, ar: tuple[float, float] | None) -> float:
    """The law less its constant at one point (the batch path forms the same floats)."""
    if isinstance(law, _ReferenceLaw):
        return law.curve.at(step)
    if isinstance(law, AreaLaw):
        return law.part(*ar)
    return law.A * max(step + law.s0, 1e-9) ** -law.alpha


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
