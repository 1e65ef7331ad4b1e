"""Throughput / step-time regression: a change point, with the size of the change."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from runwatch.detect._regression_kernel import Quiet
from runwatch.detect.base import Detector, Signal, check_number, kernel_loop


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
        """``update`` point by point, with the unflagged points done by a compiled loop
        (``_regression_kernel.Quiet``: the same operations, the same result); only a
        flagged point, or one ``update`` raises on, goes through ``update`` itself."""

        def start() -> Callable[[int], int]:
            vals = np.ascontiguousarray(values, dtype=float)
            quiet = Quiet(self)
            return lambda i: quiet.run(vals, i)

        return kernel_loop(self, start, self.update, steps, values, on_error)

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
