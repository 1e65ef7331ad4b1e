"""Stall: the loss stops improving at the pace its own earlier progress predicts."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from runwatch.detect import _stall_kernel
from runwatch.detect.base import (
    Detector,
    LRAware,
    Signal,
    check_lengths,
    check_number,
    guarded,
    robust_scale,
    update_points,
)

_LN2 = math.log(2.0)


class Stall(LRAware, Detector):
    """The (log) loss stops falling where its own earlier progress says it should fall.

    In log-step space a power law is close to a straight line over an octave or two, and
    a loss curve bends slowly, so the run's own recent past predicts its near future. The
    detector keeps bin means of the (log) loss on log-spaced steps (``per_octave`` bins per
    doubling, bounded memory) and two adjacent windows of the last ``2 W`` points, ``W`` =
    ``window_frac`` of the points seen (between ``min_window`` and ``max_window``). The
    reference slope is a least-squares line of the bin means against ln(step) over the
    ``ref_octaves`` octaves before the older window; the expected fall from the older to the
    newer window is that slope times the distance between their mean ln(step). The observed
    fall is the difference of the two window means (each point first clipped to the running
    median of 5 ± 3 noise sigmas, so a spike barely moves a mean). It flags (warning) when,
    for ``patience`` points in a row, the expected fall is clear of the noise - ``z``
    standard errors of the window-mean difference (noise: the robust scale of first
    differences), ``z_resid`` robust sigmas of the statistic's own past scatter on unflagged
    stretches (autocorrelated noise, curvature), and ``min_fall`` - and the observed fall
    is below ``stall_frac`` of it. A loss that rises is flagged too (it is not improving).

    An octave test runs beside it (``long_test``), for slow curves whose short windows
    cannot tell a plateau from noise: the same comparison between the older and the newer
    half of the last octave of steps (log-spaced bins of every point, bounded memory), with
    the reference slope from the learned bins before that octave and ``long_z_resid``
    robust sigmas of its own past scatter (the last two octaves of it), from
    ``long_min_points`` points on. Half an octave of points averages the noise
    down far more than a window of ``window_frac`` of the points, so a plateau on a noisy,
    slowly falling curve is found - later, but found.

    Catches: silent plateaus (a frozen layer, data stuck on a few shards, an LR stuck at 0
    that is not logged), from a few hundred points after they start, whatever the level
    of a fitted curve.
    Misses: a plateau while the loss was already nearly flat (the expected fall is then
    within the noise; on a warmup-stable-decay schedule that is the whole stable phase,
    until the decay that the plateau skips shows it); a slowdown to more than
    ``stall_frac`` of the expected pace; the first ``long_min_points`` points. Without a
    logged LR, a schedule that flattens the loss on purpose (a step decay, an LR annealed
    to zero at the very end) looks like a stall.

    LR schedules: once the run's learning rate is known (``use_lr``: the Monitor hands
    each loss series the run's :class:`~runwatch.expect.LRClock`), progress is measured
    against ln(S1), the summed LR, in place of ln(step): a step decay to 1% of the LR, or
    an LR annealed to zero, slows the loss on purpose and is then expected. When the LR
    first arrives the detector starts afresh. (An LR stuck at zero is then no stall either:
    ``LRSanity`` on the LR series reports it.)

    Baseline protection: while a stall is flagged, its points are not binned, so the
    reference slope stays the one from before the stall. The cost: after ``adapt_after``
    flagged points the detector forgets its reference and learns the curve afresh.

    >>> import random
    >>> rng = random.Random(4)
    >>> d = Stall()
    >>> s = range(1, 4001)
    >>> curve = [2.0 + 9.0 * i ** -0.4 * (1 + 0.005 * rng.gauss(0, 1)) for i in s]
    >>> curve[2000:] = [curve[1999] * (1 + 0.005 * rng.gauss(0, 1)) for _ in range(2000)]
    >>> hits = [(i, sig.severity) for i, v in zip(s, curve) if (sig := d.update(i, v))]
    >>> hits[0][0] > 2000, hits[0][1]
    (True, 'warning')
    """

    name = "stall"
    quiet = 50

    def __init__(
        self,
        window_frac: float = 0.07,
        min_window: int = 30,
        max_window: int = 1000,
        ref_octaves: float = 1.5,
        stall_frac: float = 0.25,
        z: float = 4.0,
        z_resid: float = 3.0,
        min_fall: float = 0.002,
        patience: int = 20,
        min_points: int = 1000,
        per_octave: int = 8,
        adapt_after: int = 5000,
        long_test: bool = True,
        long_z_resid: float = 1.5,
        long_min_points: int = 500,
    ) -> None:
        check_number("window_frac", window_frac, low=0.001, high=0.5)
        check_number("min_window", min_window, low=4, integer=True)
        check_number("max_window", max_window, low=min_window, integer=True)
        check_number("ref_octaves", ref_octaves, low=0.25, high=10.0)
        check_number("stall_frac", stall_frac, low=0.0, high=1.0)
        check_number("z", z, low=0.0)
        check_number("z_resid", z_resid, low=0.0)
        check_number("min_fall", min_fall, low=0.0)
        check_number("patience", patience, low=1, integer=True)
        check_number("min_points", min_points, low=2 * min_window, integer=True)
        check_number("per_octave", per_octave, low=1, high=64, integer=True)
        check_number("adapt_after", adapt_after, low=1, integer=True)
        self.window_frac = window_frac
        self.min_window = min_window
        self.max_window = max_window
        self.ref_octaves = ref_octaves
        self.stall_frac = stall_frac
        self.z = z
        self.z_resid = z_resid
        self.min_fall = min_fall
        self.patience = patience
        self.min_points = min_points
        self.per_octave = per_octave
        self.adapt_after = adapt_after
        self._by_lr = False  # steps measured in summed LR (S1), not in steps
        self._unit: float | None = None  # S1 of the first point measured so: "step 1"
        self.long_test = long_test
        self.long_z_resid = long_z_resid
        self.long_min_points = long_min_points
        super().__init__()

    def _reset(self) -> None:
        self._log = True
        self._n = 0
        self._x0 = math.nan  # offset: keeps the running sums small
        self._cx = 0.0  # running sum of clipped x - x0
        self._cl = 0.0  # running sum of ln(step)
        self._cum: deque[tuple[float, float]] = deque(maxlen=2 * self.max_window + 1)
        self._last5: deque[float] = deque(maxlen=5)
        self._noise_buf: deque[float] = deque(maxlen=128)
        self._sigma = 0.0
        self._since_noise = 0
        self._bins: dict[int, list[float]] = {}
        self._all_bins: dict[int, list[float]] = {}
        self._long = _LongTest()
        self._resid: deque[float] = deque(maxlen=64)
        self._resid_scale = 0.0
        self._resid_age = 0
        self._slope_cache: float | None = None
        self._slope_age = 0
        self._over = 0
        self._flagged = 0
        self._stalls = 0

    def _lr_coord(self, s1: float) -> float:
        """ln of where the point is, measured by LR: its summed LR in units of the first."""
        if self._unit is None:
            if not s1 > 0:
                return 0.0
            self._unit = s1
        c = s1 / self._unit
        return math.log(c) if c > 1 else 0.0

    @property
    def stalls(self) -> int:
        """How many stalls were declared."""
        return self._stalls

    def update(self, step: int, value: float) -> Signal | None:
        if not math.isfinite(value):
            return None
        ar = self._areas_now(step)
        return self._update(step, value, None if ar is None else ar[0])

    def _update(self, step: int, value: float, s1: float | None) -> Signal | None:
        """``update`` of a finite point whose summed LR ``s1`` is known (None: no LR)."""
        if s1 is not None and not self._by_lr:
            self._reset()
            self._by_lr = True
        if self._log and value <= 0:
            # A loss that can be <= 0 (an RL loss) is judged in linear space from now on.
            self._reset()
            self._log = False
        x = math.log(value) if self._log else value
        if self._n == 0:
            self._x0 = x
            self._cum.append((0.0, 0.0))
        self._n += 1
        # Clip to the running median of 5 +- 3 sigma: a spike barely moves a window mean.
        l5 = self._last5
        l5.append(x)
        med = sorted(l5)[len(l5) // 2]
        lim = 3.0 * self._sigma
        xc = min(max(x, med - lim), med + lim)
        self._cx += xc - self._x0
        ls = self._lr_coord(s1) if self._by_lr else (math.log(step) if step > 1 else 0.0)
        self._cl += ls
        self._cum.append((self._cx, self._cl))
        nb = self._noise_buf
        nb.append(x)
        self._since_noise += 1
        if self._since_noise >= 32 or self._n <= 128:
            self._since_noise = 0
            self._sigma = robust_scale(list(nb))
        k = int(self.per_octave * ls / _LN2)
        _add(self._all_bins, k, ls, self._long.clip(k, xc, self._sigma, self._all_bins))
        sig = None
        if self._n >= self.min_points:
            sig = self._check(step, value)
        if sig is None and self.long_test and self._n >= self.long_min_points:
            sig = self._check_long(k, value)
        if sig is None:
            self._learn(ls, x)
        return sig

    def update_many(
        self,
        steps: Sequence[int],
        values: Sequence[float],
        on_error: Callable[[int], None] | None = None,
        areas: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> list[tuple[int, Signal]]:
        """``update`` point by point, in one compiled loop over the series.

        See ``runwatch.detect._stall_kernel``: the same operations as ``update``, so the
        same signals and state; the signals are built here. The point where log space
        ends and the first point with an LR go through ``update`` (which starts afresh
        there). Needs int steps in order and float values (what batch replay gives);
        otherwise the plain loop. ``areas``: each point's LR areas as the clock gave them
        live (see ``CurveDeviation.update_many``); required once the detector's clock has
        the LR.
        """
        self._need_areas(areas)
        check_lengths(steps, values)
        s1 = None if areas is None else np.ascontiguousarray(areas[0], dtype=float)
        out: list[tuple[int, Signal]] = []
        i = 0
        while i < len(values):
            done = _stall_kernel.run(self, steps, values, s1, i)
            if done is None:  # not a replay's batch, or beyond the kernel: nothing fed
                rest = self._loop(
                    steps[i:],
                    values[i:],
                    None if s1 is None else s1[i:],
                    on_error and (lambda k, i=i: on_error(i + k)),
                )
                return out + [(i + k, s) for k, s in rest]
            i, flags = done
            for j, long, mean_a, mean_b, d_exp, d_obs, w in flags:
                out.append((j, self._signal(values[j], mean_a, mean_b, d_exp, d_obs, w, long)))
            if i < len(values):  # log space ends, or the LR arrives: update starts afresh
                s1_i = None if s1 is None or s1[i] != s1[i] else float(s1[i])
                sig = guarded(
                    lambda s, v, a=s1_i: self._update(s, v, a), steps[i], values[i], i, on_error
                )
                if sig is not None:
                    out.append((i, sig))
                i += 1
        return out

    def _loop(self, steps, values, s1: np.ndarray | None, on_error) -> list[tuple[int, Signal]]:
        """``update`` point by point, with the given summed LR instead of the clock's."""
        if s1 is None:
            return Detector.update_many(self, steps, values, on_error)
        per_point = [None if a != a else a for a in s1.tolist()]
        return update_points(self._update, steps, values, per_point, on_error)

    def _learn(self, ls: float, x: float) -> None:
        _add(self._bins, int(self.per_octave * ls / _LN2), ls, x)

    def _check_long(self, k: int, value: float) -> Signal | None:
        """The octave test: over the last octave of steps, has the loss fallen as far as
        its progress before that octave predicts?

        The octave is split into its older and newer half (``per_octave // 2`` bins each,
        the newest bin still filling); the window means come from every point's clipped
        value and the reference slope from the learned bins before the octave, so a
        plateau that began inside the octave cannot flatten its own reference.
        """
        lt = self._long
        if lt.k != k:
            self._new_octave(k)
        cur = self._all_bins[k]
        na, nb = lt.a[2], lt.b[2] + cur[2]
        if lt.slope is None or lt.slope >= 0 or min(na, nb) < self.min_window:
            lt.over = 0
            return None
        mean_a = lt.a[1] / na
        mean_b = (lt.b[1] + cur[1]) / nb
        d_exp = -lt.slope * ((lt.b[0] + cur[0]) / nb - lt.a[0] / na)
        d_obs = mean_a - mean_b
        se = self._sigma * math.sqrt(1.0 / na + 1.0 / nb)
        need = max(self.z * se, self.long_z_resid * lt.resid_scale, self.min_fall)
        if lt.resid_n < lt.MIN_RESID or not (d_exp > need and d_obs < self.stall_frac * d_exp):
            lt.over = 0
            if lt.sampled != k:
                lt.sampled = k
                lt.add_resid(d_obs - d_exp)
            return None
        lt.over += 1
        if lt.over < self.patience:
            return None
        if lt.over == self.patience:
            self._stalls += 1
        return self._signal(value, mean_a, mean_b, d_exp, d_obs, int(nb), True)

    def _new_octave(self, k: int) -> None:
        """The octave test moves to bin ``k``: the sums of its two halves, and the
        reference slope from the learned bins before the octave."""
        self._long.new_bin(k, self._all_bins, self.per_octave)
        self._long.slope = self._slope((k - self.per_octave) * _LN2 / self.per_octave)

    def _slope(self, ls_end: float) -> float | None:
        """Slope of x against ln(step) over the ``ref_octaves`` octaves before ``ls_end``.

        Only the bins that can hold a mean in that range are visited (a bin's mean lies in
        its own ln(step) range; one bin of margin each side for rounding and for ``int``
        truncating towards zero), in ascending order, which is the order they were made
        in while steps go forward; a run of 100k steps has ~130 bins, the range ~12.
        """
        if not math.isfinite(ls_end):
            return None  # no bin mean is in an empty or unbounded range
        lo = ls_end - self.ref_octaves * _LN2
        sx = sy = sxx = sxy = 0.0
        m = 0
        first = last = 0.0
        bins = self._bins
        per = self.per_octave / _LN2
        for k in range(math.floor(lo * per) - 1, math.ceil(ls_end * per) + 2):
            b = bins.get(k)
            if b is None:
                continue
            c = b[0] / b[2]
            if lo <= c < ls_end:
                y = b[1] / b[2]
                sx += c
                sy += y
                sxx += c * c
                sxy += c * y
                m += 1
                if m == 1 or c < first:
                    first = c
                if m == 1 or c > last:
                    last = c
        if m < 4 or last - first < 0.4 * self.ref_octaves * _LN2:
            return None
        den = m * sxx - sx * sx
        if den <= 0:
            return None
        return (m * sxy - sx * sy) / den

    def _check(self, step: int, value: float) -> Signal | None:
        w = min(max(int(self.window_frac * self._n), self.min_window), self.max_window)
        cum = self._cum
        if len(cum) < 2 * w + 1:
            self._over = 0
            return None
        c2x, c2l = cum[-1]
        c1x, c1l = cum[-1 - w]
        c0x, c0l = cum[-1 - 2 * w]
        mean_a = (c1x - c0x) / w
        mean_b = (c2x - c1x) / w
        ls_a = (c1l - c0l) / w
        ls_b = (c2l - c1l) / w
        # The older window starts about here (ln step of its first point, roughly).
        ls_start = ls_a - (ls_b - ls_a) / 2.0
        # The reference slope moves slowly: refreshed every 32 points (bounded cost).
        self._slope_age -= 1
        if self._slope_age <= 0:
            self._slope_cache = self._slope(ls_start)
            self._slope_age = 32
        slope = self._slope_cache
        if slope is None or slope >= 0:
            self._over = 0
            return None
        d_exp = -slope * (ls_b - ls_a)
        d_obs = mean_a - mean_b
        if ls_b - ls_a > 0.5 * _LN2:
            # The windows straddle a huge step gap: no local extrapolation is possible.
            self._over = 0
            return None
        se = self._sigma * math.sqrt(2.0 / w)
        need = max(self.z * se, self.z_resid * self._resid_scale, self.min_fall)
        if not (d_exp > need and d_obs < self.stall_frac * d_exp):
            self._over = 0
            self._flagged = 0
            # How far the observed fall strays from the expected one on an unflagged
            # stretch: the statistic's own noise (autocorrelated noise, curvature).
            self._resid_age -= 1
            if self._resid_age <= 0:
                self._resid_age = max(w // 4, 1)
                r = self._resid
                r.append(d_obs - d_exp)
                if len(r) >= 8:
                    self._resid_scale = _scatter(r)
            return None
        self._over += 1
        if self._over < self.patience:
            return None
        if self._over == self.patience:
            self._stalls += 1
        self._flagged += 1
        if self._flagged >= self.adapt_after:
            self._bins.clear()
            self._slope_cache, self._slope_age = None, 0
            self._over = self._flagged = 0
        return self._signal(value, mean_a, mean_b, d_exp, d_obs, w, False)

    def _signal(
        self,
        value: float,
        mean_a: float,
        mean_b: float,
        d_exp: float,
        d_obs: float,
        w: int,
        long: bool,
    ) -> Signal:
        """A stall's signal: the fall over the last ``w`` points, or over the last octave
        (``long``: the octave test flagged it)."""
        span = "the last octave" if long else f"the last {w} points"
        x0 = self._x0
        now = mean_b + x0
        exp_now = mean_a + x0 - d_exp
        upper = mean_a + x0 - self.stall_frac * d_exp
        if self._log:
            now, exp_now, upper = math.exp(now), math.exp(exp_now), math.exp(upper)
        score = d_exp / max(d_obs, 1e-12) if d_obs > 0 else 1000.0
        msg = (
            f"loss stopped improving: fell {d_obs:.3g} over {span} where its "
            f"earlier progress predicts {d_exp:.3g}" + (" (log units)" if self._log else "")
        )
        return Signal(
            "warning",
            min(score, 1000.0),
            value,
            exp_now,
            None,
            upper,
            msg,
            {"smoothed": now, "expected_fall": d_exp, "fall": d_obs, "window": w},
        )


def _add(bins: dict[int, list[float]], k: int, ls: float, x: float) -> None:
    b = bins.get(k)
    if b is None:
        bins[k] = [ls, x, 1.0]
    else:
        b[0] += ls
        b[1] += x
        b[2] += 1.0


class _LongTest:
    """State of the octave test: sums of the completed bins of the two half-octaves, the
    reference slope for the current bin, and the statistic's own scatter while unflagged."""

    MIN_RESID = 8
    """Samples of the statistic's scatter needed before the octave test may flag."""
    CLIP = 4.0
    """Noise sigmas above the last completed bin's mean where a point is capped."""

    __slots__ = (
        "a",
        "b",
        "clip_base",
        "clip_k",
        "k",
        "over",
        "resid",
        "resid_n",
        "resid_scale",
        "sampled",
        "slope",
    )

    def __init__(self) -> None:
        self.k = -1
        self.clip_k = -1
        self.clip_base = math.inf
        self.a = (0.0, 0.0, 0.0)
        self.b = (0.0, 0.0, 0.0)
        self.slope: float | None = None
        self.over = 0
        self.sampled = -1
        self.resid: deque[float] = deque(maxlen=16)
        self.resid_n = 0
        self.resid_scale = 0.0

    def clip(self, k: int, x: float, sigma: float, bins: dict[int, list[float]]) -> float:
        """``x`` capped at the mean of the last completed bin + ``CLIP`` noise sigmas.

        The median of 5 does not stop a spike of tens of points; this cap does, so a long
        spike cannot hold a half-octave mean up (a falling curve never reaches the cap, and
        a rising one is still seen rising).
        """
        if k != self.clip_k:
            self.new_clip_bin(k, bins)
        return min(x, self.clip_base + self.CLIP * sigma)

    def new_clip_bin(self, k: int, bins: dict[int, list[float]]) -> None:
        """The cap's base for the points of bin ``k``: the mean of the last bin before it."""
        self.clip_k = k
        prev = max((j for j in bins if j < k), default=None)
        self.clip_base = math.inf if prev is None else bins[prev][1] / bins[prev][2]

    def new_bin(self, k: int, bins: dict[int, list[float]], per_octave: int) -> None:
        """Sum the completed bins of the older ([k-P, k-P/2)) and newer ([k-P/2, k)) half."""
        half = per_octave // 2
        self.k = k
        self.a = _sum_bins(bins, k - per_octave, k - half)
        self.b = _sum_bins(bins, k - half, k)

    def add_resid(self, r: float) -> None:
        self.resid.append(r)
        self.resid_n = len(self.resid)
        if self.resid_n >= 2:
            self.resid_scale = _scatter(self.resid)


def _scatter(resid: Iterable[float]) -> float:
    """1.4826 x the MAD of ``resid`` about its (upper) median: the scatter of a test's
    statistic on unflagged stretches, shared by both tests and the batch path."""
    srt = sorted(resid)
    med = srt[len(srt) // 2]
    dev = sorted([abs(v - med) for v in srt])
    return 1.4826 * dev[len(dev) // 2]


def _sum_bins(bins: dict[int, list[float]], lo: int, hi: int) -> tuple[float, float, float]:
    ls = x = n = 0.0
    for j in range(lo, hi):
        b = bins.get(j)
        if b is not None:
            ls += b[0]
            x += b[1]
            n += b[2]
    return ls, x, n
