"""The detector contract: one ``Signal`` type and the ``Detector`` base class.

Every detector is a small river-style class (online-ml/river): constructor arguments are stored as
given and validated up front, private state is rebuilt by ``_reset()``, and one cheap
``update(step, value)`` returns either ``None`` (nothing flagged at this point) or a
``Signal``. The contract is fixed so the Monitor can group any detector's signals into
anomaly episodes without knowing what the detector does.
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from runwatch.expect.lrclock import LRClock
from runwatch.model import SEVERITIES

log = logging.getLogger("runwatch.detect")

__all__ = [
    "CoreDetector",
    "Detector",
    "LRAware",
    "Signal",
    "check_choice",
    "check_lengths",
    "check_number",
    "signals_of",
]


@dataclass(frozen=True, slots=True)
class Signal:
    """What a detector says about one point: flagged, how badly, against what expectation.

    ``expected``/``lower``/``upper`` are None where the detector has no expectation.
    ``details`` carries detector-specific figures (magnitude, duration, ...).
    """

    severity: str
    score: float
    observed: float | None
    expected: float | None = None
    lower: float | None = None
    upper: float | None = None
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)


class Detector:
    """Base class: parameters as given, private state, one cheap ``update``.

    Subclasses set ``name`` (the anomaly's ``detector`` field) and ``quiet`` (how many
    consecutive unflagged points close an episode in the Monitor), implement ``_reset`` and
    ``update``, and validate their parameters in ``__init__`` before calling ``_reset``.

    >>> class Always(Detector):
    ...     name = "always"
    ...     def update(self, step, value):
    ...         return Signal("info", 1.0, value)
    >>> Always().update(3, 1.5).score
    1.0
    """

    name: ClassVar[str] = "detector"
    quiet: ClassVar[int] = 5

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        """Rebuild the private state (called by ``__init__`` and ``reset``)."""

    def reset(self) -> None:
        """Forget everything learned so far."""
        self._reset()

    def update(self, step: int, value: float) -> Signal | None:
        """Learn from one point; return a Signal if it is flagged, else None."""
        raise NotImplementedError

    def update_many(
        self,
        steps: Sequence[int],
        values: Sequence[float],
        on_error: Callable[[int], None] | None = None,
    ) -> list[tuple[int, Signal]]:
        """``update`` over many points in order; return ``(index, signal)`` for the flagged.

        Exactly what calling ``update`` point by point gives (same signals, same state
        afterwards); batch replay uses it. A point whose ``update`` raises is reported to
        ``on_error(index)`` and counts as unflagged, as the Monitor does (without
        ``on_error`` the exception propagates). This default is that loop; a detector may
        override it with a vectorised path for its quiet stretches.
        """
        check_lengths(steps, values)
        out: list[tuple[int, Signal]] = []
        upd = self.update
        n = len(values)
        start = 0
        k = 0
        while True:
            # One try around the loop, not one call per point: a raising point is rare.
            try:
                for k in range(start, n):
                    sig = upd(steps[k], values[k])
                    if sig is not None:
                        out.append((k, sig))
            except Exception:
                if on_error is None:
                    raise
                on_error(k)
                start = k + 1
                continue
            return out

    def rewind(self, step: int) -> None:
        """The run went back to ``step`` (restart/resume): tolerate repeated steps.

        The default keeps the learned baseline: a resumed run continues the same curve.
        """

    def _get_params(self) -> dict[str, Any]:
        sig = inspect.signature(type(self).__init__)
        return {
            name: getattr(self, name)
            for name, p in sig.parameters.items()
            if name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD
        }

    def clone(self, **new_params: Any) -> Detector:
        """A fresh detector with the same parameters (optionally some replaced)."""
        params = copy.deepcopy(self._get_params())
        params.update(new_params)
        return type(self)(**params)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._get_params().items())
        return f"{type(self).__name__}({args})"


def check_lengths(steps: Sequence[int], values: Sequence[float]) -> None:
    """Misuse of ``update_many`` fails fast: one value per step."""
    if len(steps) != len(values):
        raise ValueError(f"steps and values differ in length: {len(steps)} != {len(values)}")


def signals_of(
    records: Iterable[tuple[int, Any]],
    values: Sequence[float],
    build: Callable[[float, Any], Signal],
    on_error: Callable[[int], None] | None,
) -> list[tuple[int, Signal]]:
    """``(index, Signal)`` from a core's ``(index, record)`` for its flagged points: what
    every core-backed ``update_many`` returns. A record that is an exception (the step
    raised there), or a ``build`` that raises, goes to ``on_error(index)`` and the point
    counts as unflagged; without ``on_error`` the exception propagates."""
    out: list[tuple[int, Signal]] = []
    for i, rec in records:
        try:
            if isinstance(rec, Exception):
                raise rec
            out.append((i, build(values[i], rec)))
        except Exception:
            if on_error is None:
                raise
            on_error(i)
    return out


class CoreDetector(Detector):
    """A detector whose state and per-point step are a compiled core's (``_core``, built in
    ``_reset``); the class validates parameters and turns the core's flag records into
    Signals (``_signal``).

    The core's ``update(step, value)`` returns None or a flag record, and its
    ``update_many(steps, values)`` returns ``(index, record)`` for the flagged points (a
    record may be the exception the step raised at that point).
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
        not flag (the contract of ``Detector.update_many``). A flagged point's Signal
        carries the value as given (``values[index]``)."""
        check_lengths(steps, values)
        return signals_of(self._core.update_many(steps, values), values, self._signal, on_error)

    def _signal(self, value: float, rec: Any) -> Signal:
        """The Signal of a flagged point with ``value``, from the core's record of it."""
        raise NotImplementedError


class LRAware:
    """A detector that judges the loss by the run's LR once it is logged.

    The Monitor hands each loss series' detectors of this kind the run's
    :class:`~runwatch.expect.LRClock` (``use_lr``); ``update`` asks it for the point's LR
    areas. Batch replay, whose clock has already been fed the whole LR series, passes
    each point's areas as they were live (``update_many(..., areas=)``) instead.
    """

    _clock: LRClock | None = None

    def use_lr(self, clock: LRClock) -> None:
        """Judge by ``clock`` (the run's LR, fed by the Monitor) once it has the LR."""
        self._clock = clock

    @property
    def lr_clock(self) -> LRClock | None:
        """The LR clock this detector judges by (None: by the step alone)."""
        return self._clock

    def _areas_now(self, step: int) -> tuple[float, float] | None:
        """S1 and S2 at ``step`` from the clock (None: no clock, or no LR yet)."""
        return self._clock.areas(step) if self._clock is not None else None

    def _need_areas(self, areas: object) -> None:
        if self._clock and areas is None:
            raise ValueError(
                f"a {type(self).__name__} whose LR clock has the LR needs the areas of a batch"
            )


def check_number(
    name: str, value: Any, *, low: float | None = None, high: float | None = None, integer=False
) -> None:
    """Reject a bad numeric parameter up front, naming the valid range."""
    kind = int if integer else (int, float)
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if ok and not integer:
        ok = math.isfinite(value)
    if ok and low is not None:
        ok = value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        rng = f"[{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
        what = "an integer" if integer else "a finite number"
        raise ValueError(f"{name}={value!r} is invalid; valid values: {what} in {rng}")


def check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    """Reject a parameter that is not one of ``choices``, naming them."""
    if value not in choices:
        raise ValueError(
            f"{name}={value!r} is invalid; valid values: {', '.join(map(repr, choices))}"
        )


def check_severity(name: str, value: Any) -> None:
    check_choice(name, value, SEVERITIES)


NOISE_RATE = 0.01
"""How fast the smoothers' noise EMA follows the absolute first difference (a slow EMA of
``|x - previous x|`` capped at 5 times its current value, so one jump barely moves it)."""
NOISE_KEEP = 1.0 - NOISE_RATE
"""The noise EMA's weight on its current value (the compiled cores take both from here)."""
