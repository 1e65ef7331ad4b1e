"""The public face of a detector whose state and per-point step live in a compiled core."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from runwatch.detect.base import Detector, Signal, check_lengths


class CoreDetector(Detector):
    """A detector whose state and step are a compiled core's; the class itself only
    validates parameters, builds the core (``_core``, in ``_reset``) and turns the core's
    flag records into Signals (``_signal``).

    The core's ``update(step, value)`` returns None or a flag record (a tuple), and its
    ``update_many(steps, values)`` returns ``(index, record)`` for the flagged points,
    where the record of a point the step raised at is that exception.
    """

    _core: Any

    def update(self, step: int, value: float) -> Signal | None:
        rec = self._core.update(step, value)
        return None if rec is None else self._signal(value, rec)

    def update_many(
        self,
        steps: Sequence[int],
        values: Sequence[float],
        on_error: Callable[[int], None] | None = None,
    ) -> list[tuple[int, Signal]]:
        """``update`` over many points in order, the core's loop doing the points it does
        not flag; see ``Detector.update_many`` for the contract. A flagged point's Signal
        carries the value as given (``values[index]``)."""
        check_lengths(steps, values)
        out: list[tuple[int, Signal]] = []
        for i, rec in self._core.update_many(steps, values):
            try:
                if isinstance(rec, Exception):
                    raise rec
                out.append((i, self._signal(values[i], rec)))
            except Exception:
                if on_error is None:
                    raise
                on_error(i)
        return out

    def _signal(self, value: float, rec: tuple[Any, ...]) -> Signal:
        """The Signal of a flagged point with ``value``, from the core's record of it."""
        raise NotImplementedError
