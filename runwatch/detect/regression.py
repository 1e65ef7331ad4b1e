"""Throughput / step-time regression: a change point, with the size of the change."""

from __future__ import annotations

import math

from runwatch.detect._regression_core import RegressionCore
from runwatch.detect.base import CoreDetector, Signal, check_number


class Regression(CoreDetector):
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

    Parameters
    ----------
    higher_is_better : bool
        True for throughput (a drop is worse), False for step time (a rise is worse).
    window : int
        Accepted points in the baseline (median and MAD), at least 8.
    recent : int
        Points whose median measures the change (at most ``window``).
    persist : int
        Flagged points in a row before a signal is more than info.
    k : float
        The CUSUM's allowance, in robust z.
    h : float
        The CUSUM's threshold.
    clip : float
        Each robust z is clipped to ±``clip`` (at least ``k``).
    min_scale : float
        Floor of the baseline's robust scale (log units).
    min_change : float
        The least relative worsening flagged (0.03 = 3% slower).
    warn_change, critical_change : float
        The relative worsening that makes a signal a warning, a critical.
    min_points : int
        Points learned before judging (between ``recent`` and ``window``).
    adapt_after : int
        Flagged points in a row after which the new level becomes the baseline.

    Examples
    --------
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
        self._core = RegressionCore(
            self.higher_is_better,
            self.window,
            self.recent,
            self.k,
            self.h,
            self.clip,
            self.min_scale,
            self.min_change,
            self.min_points,
            self.adapt_after,
        )

    @property
    def cusum(self) -> float:
        """The CUSUM of clipped robust z (0 after adapting to a lasting change)."""
        return self._core.cusum

    @property
    def changes(self) -> int:
        """How many regressions were declared."""
        return self._core.changes

    def _signal(self, value: float, rec: tuple[float, float, int, float, float]) -> Signal:
        """The Signal of a flagged point from the core's record of it."""
        change, cusum, points, c, scale = rec
        sign = -1.0 if self.higher_is_better else 1.0
        s = 3.0 * scale  # the band: 3 robust sigmas around the baseline
        expected = math.exp(sign * c)
        a, b = math.exp(sign * (c - s)), math.exp(sign * (c + s))
        lower, upper = min(a, b), max(a, b)
        if points < self.persist:
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
            cusum,
            value,
            expected,
            lower,
            upper,
            msg,
            {"change": change, "cusum": cusum, "points": points},
        )
