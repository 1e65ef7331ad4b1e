"""Steps back in series that say something when they fall: a loss scale, a running total."""

from __future__ import annotations

import math

from runwatch.detect.base import Detector, Signal


class _StepBack(Detector):
    """Flags a finite value below the last finite one; subclasses word the Signal."""

    quiet = 5

    def _reset(self) -> None:
        self._last = math.nan

    def update(self, step: int, value: float) -> Signal | None:
        if not math.isfinite(value):
            return None
        last, self._last = self._last, value
        return self._signal(value, last) if value < last else None

    def _signal(self, value: float, last: float) -> Signal:
        raise NotImplementedError


class LossScaleDrop(_StepBack):
    """A mixed-precision loss scale that falls: the step's gradients overflowed (inf or NaN)
    and the step was skipped. Info, as fp16 training does this now and then by design;
    warning once the scale is at or below ``floor``, where overflow every step leaves
    nothing to train with.

    >>> d = LossScaleDrop()
    >>> [d.update(s, v) is not None for s, v in enumerate([65536.0, 65536.0, 32768.0])]
    [False, False, True]
    """

    name = "loss_scale_drop"

    def __init__(self, floor: float = 1.0) -> None:
        self.floor = floor
        super().__init__()

    def _signal(self, value: float, last: float) -> Signal:
        severity = "warning" if value <= self.floor else "info"
        msg = (
            f"loss scale fell from {last:.6g} to {value:.6g}: the gradients overflowed "
            "(inf or NaN in fp16) and the step was skipped"
        )
        return Signal(
            severity,
            last / value if value > 0 else math.inf,
            value,
            last,
            None,
            None,
            msg,
            {"from": last},
        )


class CounterReset(_StepBack):
    """A running total (consumed samples, tokens seen) that goes back: the run restarted from
    an earlier point, as a resume from a checkpoint does. Info: it tells when, not that
    something is wrong.

    >>> d = CounterReset()
    >>> [d.update(s, v) is not None for s, v in enumerate([100.0, 200.0, 120.0])]
    [False, False, True]
    """

    name = "counter_reset"

    def _signal(self, value: float, last: float) -> Signal:
        msg = f"went back from {last:.6g} to {value:.6g}: the run restarted from an earlier point"
        return Signal("info", 1.0, value, last, None, None, msg, {"from": last})
