"""Spikes in a loss or grad norm against a robust local baseline (log space)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from runwatch.detect._spike_kernel import quiet_stretch
from runwatch.detect.base import (
    Detector,
    Signal,
    check_choice,
    check_number,
    kernel_loop,
    robust_scale,
)
from runwatch.detect.spikescore import SpikeScore


class Spike(Detector):
    """Upward spikes against the median of recent points, scaled by robust local noise.

    Each value (its log, when the series is positive) is compared with the median of the
    last ``center_window`` accepted values; the noise scale is the MAD of first differences
    over the last ``window`` accepted values, so a falling loss does not inflate it. A point
    ``threshold`` noise-sigmas above (and at least ``min_delta`` above) opens a spike; the
    spike goes on while points stay ``continue_threshold`` sigmas above. Severity: info for
    a short blip, warning once its peak reaches ``warn_ratio`` times the baseline or it
    lasts ``sustain`` points with a peak of ``sustain_ratio`` times the baseline (in linear
    space: twice ``threshold`` sigmas), critical at ``critical_ratio``. ``details`` holds the
    magnitude (``ratio``, ``z``), the ``duration`` in points and the ``peak``; whether the
    run recovered is known when the episode closes (the Monitor records it).

    Catches: single-step and short loss/grad-norm spikes from the first point (delay 0).
    Misses: downward dips (never flagged); slow rises (see Divergence); spikes smaller
    than ``threshold`` local sigmas; anything during the first ``min_points`` points.

    Baseline protection: flagged points are not learned, so a spike cannot teach the
    baseline that a higher loss is normal. The cost: after a real, lasting level shift the
    detector keeps flagging until ``adapt_after`` consecutive flagged points, then accepts
    the new level (``details['adapted']``) and warms up again.

    Also keeps the OLMo 2 spike score of the series (``spike_score``), a run-level figure.

    >>> import random
    >>> rng = random.Random(0)
    >>> d = Spike()
    >>> curve = [3.0 * (1 + 0.01 * rng.gauss(0, 1)) for _ in range(100)]
    >>> curve[80] *= 1.5
    >>> hits = [(s, d.update(s, v)) for s, v in enumerate(curve)]
    >>> [(s, sig.severity) for s, sig in hits if sig]
    [(80, 'info')]
    """

    name = "spike"
    quiet = 5

    def __init__(
        self,
        threshold: float = 4.5,
        continue_threshold: float = 2.5,
        window: int = 64,
        center_window: int = 16,
        min_points: int = 32,
        min_delta: float = 0.005,
        sustain: int = 4,
        sustain_ratio: float = 1.2,
        warn_ratio: float = 2.5,
        critical_ratio: float = 5.0,
        adapt_after: int = 200,
        space: str = "auto",
        score_window: int = 1000,
    ) -> None:
        check_number("threshold", threshold, low=0.5)
        check_number("continue_threshold", continue_threshold, low=0.1, high=threshold)
        check_number("window", window, low=4, integer=True)
        check_number("center_window", center_window, low=1, high=window, integer=True)
        check_number("min_points", min_points, low=center_window, high=window, integer=True)
        check_number("min_delta", min_delta, low=0.0)
        check_number("sustain", sustain, low=1, integer=True)
        check_number("sustain_ratio", sustain_ratio, low=1.0)
        check_number("warn_ratio", warn_ratio, low=1.0)
        check_number("critical_ratio", critical_ratio, low=warn_ratio)
        check_number("adapt_after", adapt_after, low=1, integer=True)
        check_choice("space", space, ("auto", "log", "linear"))
        check_number("score_window", score_window, low=2, integer=True)
        self.threshold = threshold
        self.continue_threshold = continue_threshold
        self.window = window
        self.center_window = center_window
        self.min_points = min_points
        self.min_delta = min_delta
        self.sustain = sustain
        self.sustain_ratio = sustain_ratio
        self.warn_ratio = warn_ratio
        self.critical_ratio = critical_ratio
        self.adapt_after = adapt_after
        self.space = space
        self.score_window = score_window
        super().__init__()

    def _reset(self) -> None:
        self._log = self.space != "linear"
        self._buf: list[float] = []
        self._scale = 0.0
        self._since_scale = 0
        self._run = 0
        self._peak_dev = 0.0
        self._peak_value = 0.0
        self._n_spikes = 0
        self._score = SpikeScore(self.score_window, 7.0)

    @property
    def spike_score(self) -> float:
        """OLMo 2 spike score of the series: share of points > 7σ from the rolling mean."""
        return self._score.score

    @property
    def n_spikes(self) -> int:
        """How many spikes (episodes inside this detector) were opened."""
        return self._n_spikes

    @property
    def in_spike(self) -> bool:
        return self._run > 0

    @property
    def log_space(self) -> bool:
        """True while the detector works on log values (the series has stayed positive)."""
        return self._log

    def _learn(self, x: float) -> None:
        buf = self._buf
        buf.append(x)
        if len(buf) > self.window:
            del buf[0]
        self._since_scale += 1
        if self._since_scale >= 8 or len(buf) <= self.min_points:
            self._since_scale = 0
            self._scale = robust_scale(buf)

    def update(self, step: int, value: float) -> Signal | None:
        if not math.isfinite(value):
            return None
        self._score.update(value)
        return self._judge(step, value)

    def _judge(self, step: int, value: float) -> Signal | None:
        """``update`` after the spike score has counted the (finite) value."""
        if self._log and value <= 0:
            if self.space == "log":
                return None  # a log-space detector cannot judge a non-positive value
            # A series that can be <= 0 (an RL loss) is judged in linear space from now on.
            self._log = False
            self._buf.clear()
            self._run = 0
        x = math.log(value) if self._log else value
        buf = self._buf
        if len(buf) < self.min_points:
            self._learn(x)
            return None
        recent = sorted(buf[-self.center_window :])
        k = len(recent)
        center = recent[k // 2] if k % 2 else 0.5 * (recent[k // 2 - 1] + recent[k // 2])
        scale = max(self._scale, 1e-12)
        dev = x - center
        z = dev / scale
        thr = self.continue_threshold if self._run else self.threshold
        if z < thr or dev < self.min_delta:
            self._run = 0
            self._learn(x)
            return None
        if not self._run:
            self._n_spikes += 1
            self._peak_dev = dev
            self._peak_value = value
        self._run += 1
        if dev > self._peak_dev:
            self._peak_dev, self._peak_value = dev, value
        run = self._run
        adapted = run >= self.adapt_after
        if adapted:
            # Accept the new level: the shift is real, stop shouting about it.
            self._run = 0
            buf.clear()
            self._learn(x)
        return self._signal(step, value, center, scale, z, run, adapted)

    def update_many(
        self,
        steps: Sequence[int],
        values: Sequence[float],
        on_error: Callable[[int], None] | None = None,
    ) -> list[tuple[int, Signal]]:
        """``update`` point by point, with the quiet points done by a compiled loop.

        Every point nothing is flagged on is learned, and the baseline median, the noise
        scale and the test of the next point follow from the values alone:
        ``quiet_stretch`` runs that loop in C (the same floats) and stops at the first
        point that is flagged or ends log space, which goes through ``_judge``.
        """

        def start() -> Callable[[int], int]:
            vals = np.asarray(values, dtype=float)
            # The spike score sees every finite value whatever the detector decides:
            # count them all at once; the points then skip it (``_judge``, not ``update``).
            self._score.update_many(vals)
            return lambda i: quiet_stretch(self, vals, i)

        return kernel_loop(self, start, self._judge, steps, values, on_error)

    def _signal(
        self, step: int, value: float, center: float, scale: float, z: float, run: int, adapted
    ) -> Signal:
        if self._log:
            expected = _exp(center)
            lower = _exp(center - self.threshold * scale)
            upper = _exp(center + self.threshold * scale)
            peak_ratio = _exp(self._peak_dev)
            ratio = value / expected
            lasting = run >= self.sustain and peak_ratio >= self.sustain_ratio
        else:
            expected, lower = center, center - self.threshold * scale
            upper = center + self.threshold * scale
            peak_ratio = ratio = math.nan  # without logs a ratio means nothing
            lasting = run >= self.sustain and self._peak_dev >= 2 * self.threshold * scale
        if peak_ratio >= self.critical_ratio:
            severity = "critical"
        elif peak_ratio >= self.warn_ratio or lasting:
            severity = "warning"
        else:
            severity = "info"
        space = "log" if self._log else "linear"
        size = f"x{ratio:.2f}, " if self._log else ""
        msg = f"spike: {value:.4g} vs baseline {expected:.4g} ({size}{z:.1f} sigma)"
        if run > 1:
            msg += f", {run} points so far"
        return Signal(
            severity,
            z,
            value,
            expected,
            lower,
            upper,
            msg,
            {
                "ratio": ratio,
                "peak_ratio": peak_ratio,
                "peak": self._peak_value,
                "z": z,
                "duration": run,
                "space": space,
                "adapted": adapted,
            },
        )


def _exp(x: float) -> float:
    """``math.exp``, infinite past the largest float instead of raising: a series that
    spans more than ~300 decades (a loss of 1e-300, then 1) still gets its signal."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf
