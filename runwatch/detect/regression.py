"""Throughput / step-time regression: a change point, with the size of the change."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence

import numpy as np

from runwatch.detect.base import (
    Detector,
    Signal,
    check_lengths,
    check_number,
    guarded,
    windows,
)


class Regression(Detector):
    """A lasting change for the worse in throughput or step time (CUSUM on robust z).

    Works on log values turned so that "worse" is positive (slower steps, fewer tokens/s).
    Each point's robust z against the baseline (median and MAD of the last ``window``
    accepted points, scale floored at ``min_scale``) is clipped to ±``clip`` and fed to a
    one-sided CUSUM with allowance ``k``; a change is declared when the CUSUM passes ``h``
    *and* the median of the last ``recent`` points is at least ``min_change`` worse than
    the baseline. Clipping is what makes it better than the usual "median + 3·MAD" rule:
    an isolated slow step (a checkpoint, a periodic optimizer step, a data-shard load)
    adds at most ``clip - k`` and is forgotten, while a lasting 5% slowdown adds up fast.
    ``details['change']`` is the relative worsening in time per unit of work (0.05 = 5%
    slower; for throughput, 1/(1 - drop) - 1: a 31% drop in tokens/s is 0.45, and the
    message says "31.0% lower"); severity: info for the first ``persist - 1`` flagged
    points (bursts of slow steps are common and benign), then warning from
    ``warn_change``, critical from ``critical_change``, info below.

    Catches: a straggler GPU, a throttled node, a slower data path — lasting regressions.
    Misses: isolated slow steps (by design); regressions smaller than ``min_change``;
    slow drifts that the rolling baseline absorbs; anything in the first ``min_points``.

    Baseline protection: flagged points and bad outliers are not learned. The cost: after
    a real lasting change (a new cluster, a new config) it alarms until ``adapt_after``
    flagged points, then takes the new level as the baseline.

    >>> import random
    >>> rng = random.Random(2)
    >>> d = Regression(higher_is_better=False)
    >>> times = [1.0 + 0.01 * rng.gauss(0, 1) for _ in range(200)]
    >>> times[50] = times[120] = 4.0  # isolated slow steps: not a regression
    >>> times += [1.1 + 0.01 * rng.gauss(0, 1) for _ in range(50)]
    >>> hits = [(s, sig) for s, v in enumerate(times) if (sig := d.update(s, v))]
    >>> hits[0][0], hits[0][1].severity, hits[4][1].severity
    (204, 'info', 'warning')
    >>> round(hits[4][1].details["change"], 2)
    0.1
    """

    name = "regression"
    quiet = 10

    def __init__(
        self,
        higher_is_better: bool = False,
        window: int = 128,
        recent: int = 9,
        persist: int = 5,
        k: float = 1.0,
        h: float = 8.0,
        clip: float = 4.0,
        min_scale: float = 0.01,
        min_change: float = 0.03,
        warn_change: float = 0.05,
        critical_change: float = 0.5,
        min_points: int = 32,
        adapt_after: int = 500,
    ) -> None:
        if not isinstance(higher_is_better, bool):
            raise ValueError(
                f"higher_is_better={higher_is_better!r} is invalid; valid values: True, False"
            )
        check_number("window", window, low=8, integer=True)
        check_number("recent", recent, low=1, high=window, integer=True)
        check_number("persist", persist, low=1, integer=True)
        check_number("k", k, low=0.0)
        check_number("h", h, low=0.0)
        check_number("clip", clip, low=k)
        check_number("min_scale", min_scale, low=0.0)
        check_number("min_change", min_change, low=0.0)
        check_number("warn_change", warn_change, low=0.0)
        check_number("critical_change", critical_change, low=warn_change)
        check_number("min_points", min_points, low=recent, high=window, integer=True)
        check_number("adapt_after", adapt_after, low=1, integer=True)
        self.higher_is_better = higher_is_better
        self.window = window
        self.recent = recent
        self.persist = persist
        self.k = k
        self.h = h
        self.clip = clip
        self.min_scale = min_scale
        self.min_change = min_change
        self.warn_change = warn_change
        self.critical_change = critical_change
        self.min_points = min_points
        self.adapt_after = adapt_after
        super().__init__()

    def _reset(self) -> None:
        self._sign = -1.0 if self.higher_is_better else 1.0
        self._buf: list[float] = []
        self._recent: list[float] = []
        self._center = 0.0
        self._scale = self.min_scale
        self._since = 0
        self._cusum = 0.0
        self._flagged = 0
        self._changes = 0

    @property
    def cusum(self) -> float:
        return self._cusum

    @property
    def changes(self) -> int:
        """How many regressions were declared."""
        return self._changes

    def _refresh(self) -> None:
        med, mad = _median_mad(self._buf)
        self._center = med
        self._scale = max(1.4826 * mad, self.min_scale)

    def _learn(self, d: float) -> None:
        buf = self._buf
        buf.append(d)
        if len(buf) > self.window:
            del buf[0]
        self._since += 1
        if self._since >= 8 or len(buf) <= self.min_points:
            self._since = 0
            self._refresh()

    def update(self, step: int, value: float) -> Signal | None:
        if not (value > 0 and math.isfinite(value)):
            return None
        d = self._sign * math.log(value)
        rec = self._recent
        rec.append(d)
        if len(rec) > self.recent:
            del rec[0]
        if len(self._buf) < self.min_points:
            self._learn(d)
            return None
        z = (d - self._center) / self._scale
        zc = min(max(z, -self.clip), self.clip)
        self._cusum = max(0.0, self._cusum + zc - self.k)
        srt = sorted(rec)
        change = math.exp(srt[len(srt) // 2] - self._center) - 1.0
        if self._cusum <= self.h or change < self.min_change:
            if self._flagged:
                self._flagged = 0
            if z < self.clip:
                self._learn(d)
            return None
        if not self._flagged:
            self._changes += 1
        self._flagged += 1
        sig = self._signal(value, change)
        if self._flagged >= self.adapt_after:
            self._buf = list(rec)
            self._refresh()
            self._cusum = 0.0
            self._flagged = 0
        return sig

    def update_many(
        self,
        steps: Sequence[int],
        values: Sequence[float],
        on_error: Callable[[int], None] | None = None,
    ) -> list[tuple[int, Signal]]:
        """``update`` point by point, with the quiet stretches done in numpy (same result).

        In a quiet stretch every point is learned and the CUSUM stays at or below ``h``:
        the baselines (median and MAD of the last ``window`` learned points, redone every
        8) then follow from the values alone and are computed at once, the CUSUM in a
        plain loop. The stretch stops before the first point that is an outlier (not
        learned) or lifts the CUSUM above ``h``; that point goes through ``update``.
        """
        check_lengths(steps, values)
        if self.min_points >= self.window:  # pragma: no cover - the scale is redone per point
            return super().update_many(steps, values, on_error)
        out: list[tuple[int, Signal]] = []
        vals = np.asarray(values, dtype=float)
        idx = np.flatnonzero((vals > 0) & np.isfinite(vals))  # update ignores the others
        dl = self._sign * np.array(list(map(math.log, vals[idx].tolist())))
        idx_l = idx.tolist()
        p, chunk = 0, 32
        # A stretch is tried when its first point cannot lift the CUSUM above h: near h
        # a stretch would stop at once, so those points go through update.
        calm = self.h - (self.clip - self.k)
        while p < len(idx_l):
            if not self._flagged and len(self._buf) >= self.min_points and self._cusum <= calm:
                stop = min(len(idx_l), p + chunk)
                q = self._quiet_stretch(dl, p, stop)
                chunk = min(chunk * 2, 8192) if q == stop else 32
                if q > p:
                    p = q
                    continue
            i = idx_l[p]
            sig = guarded(self.update, steps[i], values[i], i, on_error)
            if sig is not None:
                out.append((i, sig))
            p += 1
        return out

    def _quiet_stretch(self, dl: np.ndarray, a: int, b: int) -> int:
        """Run points a..b-1 of ``dl`` as ``update`` would while the CUSUM stays at or
        below ``h``; return where that stops, with the state moved up to it.

        Which points are learned (not outliers) decides when the baseline is redone, and
        the baseline decides which points are outliers: guess, recompute, and keep the
        guess up to the first point it got wrong, until it holds (a point's baseline
        depends only on the points before it, so each round fixes at least one more).
        """
        buf = self._buf
        m, n = len(buf), b - a
        d = dl[a:b]
        learn = (d - self._center) / self._scale < self.clip  # the first guess
        while True:
            z, centers, scales, pos = self._zscores(d, learn)
            now = z < self.clip
            bad = np.flatnonzero(now != learn)
            if not bad.size:
                break
            learn[bad[0] :] = now[bad[0] :]
        zca = np.minimum(np.maximum(z, -self.clip), self.clip)
        zc = zca.tolist()
        cus = self._cusum
        k, h = self.k, self.h
        # From a CUSUM of 0, a point with zc <= k leaves it at 0 (0 + zc - k <= 0, and
        # max(0.0, NaN) is 0.0 too): only the points above k need the loop then.
        lift = np.flatnonzero(zca > k).tolist()
        lift.append(n)
        r = c = 0
        while c < n:
            if cus == 0.0:
                r = bisect.bisect_left(lift, c, r)
                c = lift[r]
                if c == n:
                    break
            nxt = max(0.0, cus + zc[c] - k)
            if nxt > h:
                break
            cus = nxt
            c += 1
        if c == 0:
            return a
        self._cusum = cus
        recent = self._recent
        recent.extend(d[:c].tolist())
        del recent[: max(0, len(recent) - self.recent)]
        nl = int(learn[:c].sum())
        if nl:
            seq = np.concatenate((np.array(buf), d[:c][learn[:c]]))
            self._buf = seq[max(0, m + nl - self.window) :].tolist()
        self._since = (self._since + nl) % 8
        r = int(np.searchsorted(pos, c, side="left"))  # refreshes before point c
        self._center, self._scale = float(centers[r]), float(scales[r])
        return a + c

    def _zscores(self, d: np.ndarray, learn: np.ndarray):
        """z of each point of ``d`` against the baseline in force before it, if the
        points in ``learn`` are the ones learned; with the baselines and where each one
        is redone (after the point at ``pos``)."""
        buf = self._buf
        m = len(buf)
        seq = np.concatenate((np.array(buf), d[learn]))
        # Redone after learning the points where the count since the last refresh
        # reaches 8, over the last ``window`` learned points.
        rec = np.arange(7 - self._since, int(learn.sum()), 8)
        pos = np.flatnonzero(learn)[rec]
        meds, mads = _baselines(seq, m + rec + 1, self.window)
        centers = np.concatenate(([self._center], meds))
        # max(1.4826 * mad, min_scale) for each (a MAD is >= 0: no signed zero to differ)
        scales = np.concatenate(([self._scale], np.maximum(1.4826 * mads, self.min_scale)))
        before = np.searchsorted(pos, np.arange(d.size), side="left")
        z = (d - centers[before]) / scales[before]
        return z, centers, scales, pos

    def _signal(self, value: float, change: float) -> Signal:
        c, s = self._center, self._clip_band()
        expected = math.exp(self._sign * c)
        a, b = math.exp(self._sign * (c - s)), math.exp(self._sign * (c + s))
        lower, upper = min(a, b), max(a, b)
        if self._flagged < self.persist:
            sev = "info"  # a burst of a few slow steps, not yet a regression
        elif change >= self.critical_change:
            sev = "critical"
        elif change >= self.warn_change:
            sev = "warning"
        else:
            sev = "info"
        # The recent median the change is measured on (not this one point's value).
        if self.higher_is_better:
            what, how = "throughput", f"{change / (1.0 + change):.1%} lower"
            recent = expected / (1.0 + change)
        else:
            what, how = "step time", f"{change:.1%} slower"
            recent = expected * (1.0 + change)
        msg = f"{what} regression: recent median {recent:.4g} vs baseline {expected:.4g} ({how})"
        return Signal(
            sev,
            self._cusum,
            value,
            expected,
            lower,
            upper,
            msg,
            {"change": change, "cusum": self._cusum, "points": self._flagged},
        )

    def _clip_band(self) -> float:
        return 3.0 * self._scale


def _baselines(seq: np.ndarray, ends: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Median and MAD (unscaled) of ``seq[max(0, e - window):e]`` for each end ``e``, as
    ``Regression._refresh`` forms them: the same order statistics of the same values."""
    meds: list[float] = []
    mads: list[float] = []
    full = ends >= window
    if full.any():
        rows = np.sort(windows(seq, window)[ends[full] - window], axis=1)
        h = window // 2
        med = rows[:, h] if window % 2 else 0.5 * (rows[:, h - 1] + rows[:, h])
        dev = np.abs(rows - med[:, None])
        if window % 2:
            mad = np.partition(dev, h, axis=1)[:, h]
        else:
            part = np.partition(dev, (h - 1, h), axis=1)
            mad = 0.5 * (part[:, h - 1] + part[:, h])
        if full.all():
            return med, mad
        it = iter(zip(med.tolist(), mad.tolist(), strict=True))
    for e, f in zip(ends.tolist(), full.tolist(), strict=True):
        if f:
            md, sc = next(it)
        else:
            md, sc = _median_mad(seq[:e].tolist())  # fewer than ``window`` learned yet
        meds.append(md)
        mads.append(sc)
    return np.array(meds, dtype=float), np.array(mads, dtype=float)


def _median_mad(vals: list[float]) -> tuple[float, float]:
    """Median and MAD (unscaled) of ``vals``; the middle order statistics of the
    deviations are picked by numpy."""
    srt = sorted(vals)
    n = len(srt)
    med = srt[n // 2] if n % 2 else 0.5 * (srt[n // 2 - 1] + srt[n // 2])
    dev = np.abs(np.array(srt) - med)
    h = n // 2
    if n % 2:
        return med, float(np.partition(dev, h)[h])
    part = np.partition(dev, (h - 1, h))
    return med, 0.5 * (float(part[h - 1]) + float(part[h]))
