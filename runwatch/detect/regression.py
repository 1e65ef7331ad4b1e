"""Throughput / step-time regression: a change point, with the size of the change."""

from __future__ import annotations

import math

from runwatch.detect._regression_core import RegressionCore
from runwatch.detect.base import CoreDetector, Signal, check_number


class Regression(CoreDetector):
    """A lasting change for the worse in throughput or step time (CUSUM on robust z), warned
    about only when it is unusual for this run at some time scale.

    Works on log values turned so that "worse" is positive (slower steps, fewer tokens/s).
    Each point's robust z against the baseline (median and MAD of the last ``window``
    accepted points, scale floored at ``min_scale``) is clipped to ±``clip`` and fed to a
    one-sided CUSUM with allowance ``k``; a point is flagged when the CUSUM passes ``h``
    *and* the median of the last ``recent`` points is at least ``min_change`` worse than
    the baseline. Clipping forgets an isolated slow step (a checkpoint, a data-shard load)
    while a lasting 5% slowdown adds up fast.

    The calibration: for each time scale in ``scales`` the detector keeps the run's own
    history of *shifts* (the median of the last ``scale`` points minus the baseline, log
    units), one every ``stride`` points, each learned ``lag`` points late. A flagged
    point is *unusual* when some scale's shift passes ``margin`` x the ``quantile`` of
    that scale's history, floored at ``warn_change`` and at ``noise_margin`` x the
    ``noise_quantile`` of single points' shifts (where one step in four is 20% slow, a
    60% slower median is usual). Nothing is unusual before ``min_history`` shifts are
    known: a run is not judged against itself until it has a history. Only an unusual
    slowdown is more than info: a run whose step time wanders by 30% in bursts (a shared,
    loaded machine) needs a bigger or longer change than a quiet GPU job.

    ``details['change']`` is the relative worsening in time per unit of work (0.05 = 5%
    slower; for throughput, 1/(1 - drop) - 1: a 31% drop in tokens/s is 0.45, and the
    message says "31.0% lower"); ``details['lost']`` the share of throughput lost,
    ``details['unusual']``, ``'scale'``, ``'shift'`` and ``'usual'`` the calibration.
    Severity grows with the loss: info for the first ``persist - 1`` flagged points and
    for any change usual for this run; warning from ``warn_change``; critical from
    ``critical_change`` once flagged for ``critical_after`` points in a row.

    Catches: a straggler GPU, a throttled node, a slower data path -- lasting regressions.
    Misses: isolated slow steps (by design); regressions smaller than ``min_change``;
    slow drifts that the rolling baseline absorbs; anything in the first ``min_points``;
    as a warning, slowdowns no bigger than those the run has already had at that scale
    (measured in bench/README-throughput.md).

    Baseline protection: flagged points and bad outliers are not learned, nor are unusual
    shifts calibrated. The cost: after a real lasting change (a new cluster, a new config)
    it alarms until ``adapt_after`` flagged points, then takes the new level as the
    baseline.

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
        The relative worsening that makes an unusual signal a warning, a critical.
    min_points : int
        Points learned before judging (between ``recent`` and ``window``).
    adapt_after : int
        Flagged points in a row after which the new level becomes the baseline.
    scales : tuple of three int
        The time scales (points) of the calibration, increasing, each at least 2.
    history : int
        Shifts kept per time scale.
    stride : int
        A shift is kept every ``stride`` points.
    quantile : float
        The quantile of a scale's past shifts that is "usual", in (0, 1].
    margin : float
        How many times the usual shift an unusual one is (at least 1).
    min_history : int
        Shifts known before the history counts (at most ``history``).
    critical_after : int
        Flagged points in a row before a signal can be critical (at least ``persist``).
    lag : int
        Points a shift waits before it is learned (at most 256 x ``stride``), so that a
        slowdown's onset is not part of the history it is judged against.
    noise_quantile, noise_margin : float
        The quantile of single points' shifts, and the multiple of it, that floor every
        scale's threshold (``noise_margin`` 0: no such floor).

    Examples
    --------
    >>> import random
    >>> rng = random.Random(2)
    >>> d = Regression(higher_is_better=False)
    >>> times = [1.0 + 0.01 * rng.gauss(0, 1) for _ in range(300)]
    >>> times[50] = times[120] = 4.0  # isolated slow steps: not a regression
    >>> times += [1.1 + 0.01 * rng.gauss(0, 1) for _ in range(50)]
    >>> hits = [(s, sig) for s, v in enumerate(times) if (sig := d.update(s, v))]
    >>> hits[0][0], hits[0][1].severity, hits[4][1].severity
    (304, 'info', 'warning')
    >>> round(hits[4][1].details["change"], 2), hits[4][1].details["unusual"]
    (0.1, True)
    """

    name = "regression"
    quiet = 10

    def __init__(
        self,
        higher_is_better: bool = False,
        window: int = 256,
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
        scales: tuple[int, int, int] = (8, 32, 128),
        history: int = 512,
        stride: int = 4,
        quantile: float = 0.99,
        margin: float = 2.0,
        min_history: int = 16,
        critical_after: int = 20,
        noise_quantile: float = 0.75,
        noise_margin: float = 3.0,
        lag: int = 64,
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
        ok = isinstance(scales, tuple) and len(scales) == 3
        if ok:
            try:
                for s in scales:
                    check_number("scales", s, low=2, integer=True)
            except ValueError:
                ok = False
        if not ok or list(scales) != sorted(set(scales)):
            raise ValueError(
                f"scales={scales!r} is invalid; valid values: a tuple of three increasing "
                "integers, each at least 2"
            )
        check_number("history", history, low=1, integer=True)
        check_number("stride", stride, low=1, integer=True)
        check_number("quantile", quantile, low=0.0, high=1.0)
        if quantile == 0.0:
            raise ValueError(f"quantile={quantile!r} is invalid; valid values: in (0, 1]")
        check_number("margin", margin, low=1.0)
        check_number("min_history", min_history, low=1, high=history, integer=True)
        check_number("critical_after", critical_after, low=persist, integer=True)
        check_number("noise_quantile", noise_quantile, low=0.0, high=1.0)
        check_number("noise_margin", noise_margin, low=0.0)
        check_number("lag", lag, low=0, high=256 * stride, integer=True)
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
        self.scales = scales
        self.history = history
        self.stride = stride
        self.quantile = quantile
        self.margin = margin
        self.min_history = min_history
        self.critical_after = critical_after
        self.noise_quantile = noise_quantile
        self.noise_margin = noise_margin
        self.lag = lag
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
            tuple(self.scales),
            self.history,
            self.stride,
            self.quantile,
            self.margin,
            self.min_history,
            math.log1p(self.warn_change),
            self.noise_quantile,
            self.noise_margin,
            self.lag // self.stride,
        )

    @property
    def cusum(self) -> float:
        """The CUSUM of clipped robust z (0 after adapting to a lasting change)."""
        return self._core.cusum

    @property
    def changes(self) -> int:
        """How many regressions were declared."""
        return self._core.changes

    def usual_change(self) -> list[float | None]:
        """Per time scale, the relative worsening this run has made usual (the calibrated
        threshold as a change: 0.2 = 20% slower), None before its history counts."""
        out: list[float | None] = []
        for i in range(3):
            t = self._core.usual(i)
            out.append(None if t is None else math.expm1(t))
        return out

    def _signal(self, value: float, rec: tuple) -> Signal:
        """The Signal of a flagged point from the core's record of it."""
        change, cusum, points, c, scale, unusual, shift, usual, at = rec
        sign = -1.0 if self.higher_is_better else 1.0
        s = 3.0 * scale  # the band: 3 robust sigmas around the baseline
        expected = math.exp(sign * c)
        a, b = math.exp(sign * (c - s)), math.exp(sign * (c + s))
        lower, upper = min(a, b), max(a, b)
        if points < self.persist or not unusual:
            sev = "info"  # a burst of a few slow steps, or no slower than usual here
        elif change >= self.critical_change and points >= self.critical_after:
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
        shift_x = math.exp(shift)
        if math.isinf(usual):
            why, usual_change = "not calibrated yet", None
        else:
            usual_change = math.expm1(usual)
            word = "unusual" if unusual else "usual"
            why = f"{word} for this run: threshold {usual_change + 1.0:.2f}x"
        why = f"{at}-step median {shift_x:.2f}x baseline, {why}"
        msg = (
            f"{what} regression: recent median {recent:.4g} vs baseline {expected:.4g} "
            f"({how}; {why})"
        )
        return Signal(
            sev,
            cusum,
            value,
            expected,
            lower,
            upper,
            msg,
            {
                "change": change,
                "lost": change / (1.0 + change),
                "cusum": cusum,
                "points": points,
                "unusual": bool(unusual),
                "scale": at,
                "shift": shift_x - 1.0,
                "usual": usual_change,
            },
        )
