"""Spikes in a loss or grad norm against a robust local baseline (log space)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from runwatch.detect._spike_core import SpikeCore
from runwatch.detect.base import (
    CoreDetector,
    Signal,
    check_choice,
    check_lengths,
    check_number,
    signals_of,
)


class Spike(CoreDetector):
    """Upward spikes against the median of recent points, scaled by robust local noise.

    Each value (its log, when the series is positive) is compared with the median of the
    last ``center_window`` accepted values; the noise scale is the MAD of first differences
    over the last ``window`` accepted values, so a falling loss does not inflate it. A point
    ``threshold`` noise-sigmas above (and at least ``min_delta`` above) opens a spike; the
    spike goes on while points stay ``continue_threshold`` sigmas above. Severity: info for
    a short blip, warning once its peak reaches ``warn_ratio`` times the baseline or it
    lasts ``sustain`` points with a peak of ``sustain_ratio`` times the baseline (in linear
    space: twice ``threshold`` sigmas), or ``shift_after`` steps and ``shift_points``
    points with a peak of ``shift_ratio`` (a lasting rise too small for one point to show:
    a level shift; in steps, so a run logged every 10 or 500 steps is judged as one logged
    every step),
    critical at ``critical_ratio``. ``details`` holds the magnitude (``ratio``, ``z``), the
    ``duration`` in points and the ``peak``; whether the run recovered is known when the
    episode closes (the Monitor records it).

    Catches: single-step and short loss/grad-norm spikes from the first point (delay 0).
    Misses: downward dips (never flagged); slow rises (see Divergence); spikes smaller
    than ``threshold`` local sigmas; anything during the first ``min_points`` points.

    Baseline protection: flagged points are not learned, so a spike cannot teach the
    baseline that a higher loss is normal. The cost: after a real, lasting level shift the
    detector keeps flagging until ``adapt_after`` consecutive flagged points, then accepts
    the new level (``details['adapted']``) and warms up again.

    Also keeps the OLMo 2 spike score of the series (``spike_score``), a run-level figure.
    State and step are compiled (``SpikeCore``); this class validates, and words signals.

    Parameters
    ----------
    threshold : float
        Noise sigmas above the baseline median that open a spike (>= 0.5).
    continue_threshold : float
        Noise sigmas above it that keep a spike going (0.1 to ``threshold``).
    window : int
        Accepted values the noise scale is measured over (>= 4).
    center_window : int
        Accepted values the baseline median is taken over (1 to ``window``).
    min_points : int
        Values learned before anything is judged (``center_window`` to ``window``).
    min_delta : float
        Smallest deviation from the median (log or linear units) that is a spike (>= 0).
    sustain : int
        Points after which a spike of ``sustain_ratio`` is a warning (>= 1).
    sustain_ratio : float
        Peak over baseline that makes a lasting spike a warning (>= 1).
    shift_after : int
        Training steps after which a spike of ``shift_ratio`` is a warning, a level shift
        (>= 1), once it also spans ``shift_points`` points.
    shift_points : int
        Fewest points a level shift spans (>= 1).
    shift_ratio : float
        Peak over baseline that makes a spike of ``shift_after`` points a warning (>= 1).
    warn_ratio : float
        Peak over baseline that makes any spike a warning (>= 1).
    critical_ratio : float
        Peak over baseline that makes a spike critical (>= ``warn_ratio``).
    adapt_after : int
        Consecutive flagged points after which the new level is accepted (>= 1).
    space : {"auto", "log", "linear"}
        Judge log values ("auto": while the series stays positive) or the values.
    score_window : int
        Rolling window of the spike score (>= 2).

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
        shift_after: int = 50,
        shift_points: int = 5,
        shift_ratio: float = 1.05,
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
        check_number("shift_after", shift_after, low=1, integer=True)
        check_number("shift_points", shift_points, low=1, integer=True)
        check_number("shift_ratio", shift_ratio, low=1.0)
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
        self.shift_after = shift_after
        self.shift_points = shift_points
        self.shift_ratio = shift_ratio
        self._episode_from = 0  # step of the current spike's first point
        self.warn_ratio = warn_ratio
        self.critical_ratio = critical_ratio
        self.adapt_after = adapt_after
        self.space = space
        self.score_window = score_window
        super().__init__()

    def _reset(self) -> None:
        self._core = SpikeCore(
            self.threshold,
            self.continue_threshold,
            self.window,
            self.center_window,
            self.min_points,
            self.min_delta,
            self.adapt_after,
            self.space == "log",
            self.space == "linear",
            self.score_window,
        )

    @property
    def spike_score(self) -> float:
        """OLMo 2 spike score of the series: share of points > 7σ from the rolling mean."""
        return self._core.spike_score

    @property
    def n_spikes(self) -> int:
        """How many spikes (episodes inside this detector) were opened."""
        return self._core.n_spikes

    @property
    def in_spike(self) -> bool:
        return self._core.in_spike

    @property
    def log_space(self) -> bool:
        """True while the detector works on log values (the series has stayed positive)."""
        return self._core.log_space

    def update(self, step: int, value: float) -> Signal | None:
        rec = self._core.update(step, value)
        return None if rec is None else self._signal(value, (step, rec))

    def update_many(
        self,
        steps: Sequence[int],
        values: Sequence[float],
        on_error: Callable[[int], None] | None = None,
    ) -> list[tuple[int, Signal]]:
        """``CoreDetector.update_many``, with each flagged point's step beside its record
        (a level shift is judged by the steps its spike has lasted)."""
        check_lengths(steps, values)
        records = [
            (i, rec if isinstance(rec, Exception) else (int(steps[i]), rec))
            for i, rec in self._core.update_many(steps, values)
        ]
        return signals_of(records, values, self._signal, on_error)

    def _signal(self, value: float, stepped: tuple[int, tuple]) -> Signal:
        """The Signal of a flagged point from its step and ``SpikeCore`` record."""
        step, (center, scale, z, run, adapted, peak_dev, peak_value, log) = stepped
        if run == 1:
            self._episode_from = step
        # The steps the spike covers, each point counting for the gap between its points.
        covered = (step - self._episode_from) * run / (run - 1) if run > 1 else 1
        shifted = run >= self.shift_points and covered >= self.shift_after
        if log:
            expected = _exp(center)
            lower = _exp(center - self.threshold * scale)
            upper = _exp(center + self.threshold * scale)
            peak_ratio = _exp(peak_dev)
            ratio = value / expected
            lasting = run >= self.sustain and peak_ratio >= self.sustain_ratio
            lasting |= shifted and peak_ratio >= self.shift_ratio
        else:
            expected, lower = center, center - self.threshold * scale
            upper = center + self.threshold * scale
            peak_ratio = ratio = math.nan  # without logs a ratio means nothing
            lasting = run >= self.sustain and peak_dev >= 2 * self.threshold * scale
        if peak_ratio >= self.critical_ratio:
            severity = "critical"
        elif peak_ratio >= self.warn_ratio or lasting:
            severity = "warning"
        else:
            severity = "info"
        space = "log" if log else "linear"
        size = f"x{ratio:.2f}, " if log else ""
        # Past ``shift_after`` steps it is no longer a spike but a new level.
        kind = "level shift" if shifted else "spike"
        msg = f"{kind}: {value:.4g} vs baseline {expected:.4g} ({size}{z:.1f} sigma)"
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
                "peak": peak_value,
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
