"""Generic detection for a metric of no known role: rises and drops against its own history."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from runwatch.detect._spike_core import SpikeCore
from runwatch.detect.base import (
    CoreDetector,
    Signal,
    check_choice,
    check_lengths,
    check_number,
    signals_of,
)

DIRECTIONS = ("up", "down")


class Change(CoreDetector):
    """A spike or a level shift, one way, in a metric runwatch knows nothing else about.

    ``direction="up"`` watches for rises (named ``rise``: an error rate, a perplexity, a
    latency), ``"down"`` for drops (``drop``: an accuracy, a reward); a metric whose name
    says neither gets both. Each value is compared, in linear units, with the median of the
    last ``center_window`` learned values carried along the series' trend (the median first
    difference), scaled by robust noise (the MAD of first differences): a schedule or a
    steady climb is not a change, nor is a change under ``min_change`` of the baseline's
    size (the noise scale is floored there). A lasting shift stays one episode until ``adapt_after``
    points, then the new level is accepted.

    A series is judged only once it has both risen and fallen: until then it is a counter
    or a clock (consumed samples, elapsed time), whose level means nothing. Severity: info,
    and warning once the episode's peak is ``warn_change`` of the baseline's size and
    ``warn_sigmas`` noise sigmas out; never critical, since nothing says how much this
    metric matters. ``details``: ``change`` (relative, signed), ``z``, ``duration``,
    ``peak`` and ``adapted``.

    >>> import random
    >>> rng = random.Random(1)
    >>> acc = [0.8 + 0.01 * rng.gauss(0, 1) for _ in range(120)]
    >>> acc[100:] = [0.3] * 20
    >>> d = Change("down")
    >>> hits = [(s, sig) for s, v in enumerate(acc) if (sig := d.update(s, v))]
    >>> hits[0][0], hits[0][1].severity, round(hits[0][1].details["change"], 1)
    (100, 'warning', -0.6)
    """

    quiet = 5

    def __init__(
        self,
        direction: str = "up",
        threshold: float = 6.0,
        continue_threshold: float = 3.0,
        window: int = 64,
        center_window: int = 16,
        min_points: int = 32,
        min_change: float = 0.01,
        adapt_after: int = 200,
        warn_change: float = 0.5,
        warn_sigmas: float = 20.0,
    ) -> None:
        check_choice("direction", direction, DIRECTIONS)
        check_number("threshold", threshold, low=0.5)
        check_number("continue_threshold", continue_threshold, low=0.1, high=threshold)
        check_number("window", window, low=4, integer=True)
        check_number("center_window", center_window, low=1, high=window, integer=True)
        check_number("min_points", min_points, low=center_window, high=window, integer=True)
        check_number("min_change", min_change, low=0.0)
        check_number("adapt_after", adapt_after, low=1, integer=True)
        check_number("warn_change", warn_change, low=0.0)
        check_number("warn_sigmas", warn_sigmas, low=threshold)
        self.direction = direction
        self.threshold = threshold
        self.continue_threshold = continue_threshold
        self.window = window
        self.center_window = center_window
        self.min_points = min_points
        self.min_change = min_change
        self.adapt_after = adapt_after
        self.warn_change = warn_change
        self.warn_sigmas = warn_sigmas
        self.name = "rise" if direction == "up" else "drop"
        self._sign = 1.0 if direction == "up" else -1.0
        super().__init__()

    def _reset(self) -> None:
        self._core = SpikeCore(
            self.threshold,
            self.continue_threshold,
            self.window,
            self.center_window,
            self.min_points,
            0.0,
            self.adapt_after,
            False,
            True,
            2,
            True,
            self.min_change / self.threshold,
        )
        self._prev = math.nan  # the last finite value, while not yet judging
        self._rose = self._fell = self._judging = False

    def update(self, step: int, value: float) -> Signal | None:
        if not self._judging and not self._moved_both_ways(value):
            return None
        rec = self._core.update(step, self._sign * value)
        return None if rec is None else self._signal(value, rec)

    def update_many(
        self,
        steps: Sequence[int],
        values: Sequence[float],
        on_error: Callable[[int], None] | None = None,
    ) -> list[tuple[int, Signal]]:
        check_lengths(steps, values)
        v = np.asarray(values, dtype=np.float64)
        start = 0 if self._judging else self._first_judged(v)
        if start >= len(v):
            return []
        recs = self._core.update_many(steps[start:], self._sign * v[start:])
        shifted = ((i + start, rec) for i, rec in recs)
        return signals_of(shifted, values, self._signal, on_error)

    def _moved_both_ways(self, value: float) -> bool:
        """Note ``value``'s move from the last one; True once the series went both ways."""
        if not math.isfinite(value):
            return False
        prev, self._prev = self._prev, value
        self._rose = self._rose or value > prev
        self._fell = self._fell or value < prev
        self._judging = self._rose and self._fell
        return self._judging

    def _first_judged(self, v: np.ndarray) -> int:
        """The index of the first value of ``v`` judged: ``_moved_both_ways``, vectorised
        (the state after ``v[:index]`` as that loop would leave it)."""
        finite = np.flatnonzero(np.isfinite(v))
        if not len(finite):
            return len(v)
        seq = np.concatenate(([self._prev], v[finite]))
        moves = np.diff(seq)  # the first is NaN while no value came before: neither way
        ups = np.flatnonzero(moves > 0)
        downs = np.flatnonzero(moves < 0)
        first_up = -1 if self._rose else (ups[0] if len(ups) else None)
        first_down = -1 if self._fell else (downs[0] if len(downs) else None)
        if first_up is None or first_down is None:
            self._prev = float(seq[-1])
            self._rose = self._rose or bool(len(ups))
            self._fell = self._fell or bool(len(downs))
            return len(v)
        first = max(first_up, first_down)
        self._judging, self._rose, self._fell = True, True, True
        self._prev = float(seq[first + 1])
        return int(finite[first])

    def _signal(self, value: float, rec: tuple) -> Signal:
        """The Signal of a flagged point from its ``SpikeCore`` record (in signed units)."""
        center, scale, z, run, adapted, peak_dev, peak_value, _log = rec
        sign = self._sign
        expected = sign * center
        size = abs(expected)
        change = (value - expected) / size if size else math.copysign(math.inf, sign)
        peak_change = peak_dev / size if size else math.inf
        peak_z = peak_dev / scale
        large = peak_change >= self.warn_change and peak_z >= self.warn_sigmas
        severity = "warning" if large else "info"
        bound = sign * (center + self.threshold * scale)
        word = "rise" if sign > 0 else "drop"
        msg = f"{word}: {value:.4g} vs baseline {expected:.4g} ({change:+.0%}, {z:.1f} sigma)"
        if run > 1:
            msg += f", {run} points so far"
        return Signal(
            severity,
            z,
            value,
            expected,
            bound if sign < 0 else None,
            bound if sign > 0 else None,
            msg,
            {
                "change": change,
                "z": z,
                "duration": run,
                "peak": sign * peak_value,
                "adapted": adapted,
            },
        )
