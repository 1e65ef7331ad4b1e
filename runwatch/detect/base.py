"""The detector contract: one ``Signal`` type and the ``Detector`` base class.

Every detector is a small river-style class (STYLE.md): constructor arguments are stored as
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import sub as _sub
from typing import Any, ClassVar

from runwatch.expect.lrclock import LRClock
from runwatch.model import SEVERITIES

log = logging.getLogger("runwatch.detect")

__all__ = [
    "Detector",
    "Signal",
    "check_choice",
    "check_lengths",
    "check_number",
    "ema_step",
    "guarded",
    "kernel_loop",
    "noise_step",
    "plain_points",
    "robust_scale",
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


def update_points(
    update: Callable[[int, float, Any], Signal | None],
    steps: Sequence[int],
    values: Sequence[float],
    extra: Sequence[Any],
    on_error: Callable[[int], None] | None,
) -> list[tuple[int, Signal]]:
    """``update(step, value, extra[k])`` over the finite points, in order: the plain
    ``update_many`` loop of a detector whose update takes one more argument per point
    (the LR areas as they were live). A raising point goes to ``on_error`` and counts as
    unflagged, as in ``Detector.update_many``."""
    check_lengths(steps, values)
    out: list[tuple[int, Signal]] = []
    for k, (s, v) in enumerate(zip(steps, values, strict=True)):
        try:
            if not math.isfinite(v):
                continue
            sig = update(s, v, extra[k])
        except Exception:
            if on_error is None:
                raise
            on_error(k)
            continue
        if sig is not None:
            out.append((k, sig))
    return out


def guarded(
    update: Callable[[int, float], Signal | None],
    step: int,
    value: float,
    i: int,
    on_error: Callable[[int], None] | None,
) -> Signal | None:
    """``update(step, value)``; if it raises and ``on_error`` is given, report point ``i``
    to it and return None (the Monitor's guard: a detector bug must not end a replay)."""
    if on_error is None:
        return update(step, value)
    try:
        return update(step, value)
    except Exception:
        on_error(i)
        return None


def plain_points(steps: Sequence[int], values: Sequence[float]) -> bool:
    """True for what batch replay and live detection give: int steps and float values
    (exactly those types). The compiled kernels take only these; anything else (numpy
    scalars, int values, float steps) goes through ``update``, which keeps what it is given.

    >>> plain_points([1, 2], [0.5, 0.4]), plain_points([1, 2], [1, 2])
    (True, False)
    """
    return set(map(type, steps)) <= {int} and set(map(type, values)) <= {float}


def kernel_loop(
    det: Detector,
    start: Callable[[], Callable[[int], int]],
    update: Callable[[int, float], Signal | None],
    steps: Sequence[int],
    values: Sequence[float],
    on_error: Callable[[int], None] | None,
) -> list[tuple[int, Signal]]:
    """``update_many`` around a compiled kernel. On ``plain_points`` only (otherwise
    ``Detector.update_many``, point by point): ``start()`` readies the kernel and returns
    ``advance``, which moves the detector over the points from ``i`` that it does not flag
    and returns the first one ``update`` must see (``len(values)``: none is left); that
    point goes through ``update`` (``guarded``), and the kernel goes on after it. Returns
    ``(index, signal)`` for the flagged points."""
    check_lengths(steps, values)
    if not plain_points(steps, values):
        return Detector.update_many(det, steps, values, on_error)
    advance = start()
    out: list[tuple[int, Signal]] = []
    n = len(values)
    i = 0
    while (i := advance(i)) < n:
        sig = guarded(update, steps[i], values[i], i, on_error)
        if sig is not None:
            out.append((i, sig))
        i += 1
    return out


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


def robust_scale(values: list[float]) -> float:
    """Noise scale of a window from its first differences (MAD based, trend-robust).

    Differences remove a slow trend (a falling loss), so the scale measures point-to-point
    noise only; 1.0484 = 1 / (0.6745 * sqrt(2)) makes it a Gaussian sigma.
    """
    n = len(values)
    if n < 3:
        return 0.0
    diffs = sorted(map(abs, map(_sub, values[1:], values[:-1])))
    scale = 1.0484 * diffs[(n - 1) // 2]
    if scale == 0.0:
        # A quantised series (values printed to 2 decimals) has mostly zero differences:
        # its noise is at least half a quantum, not zero.
        nonzero = next((d for d in diffs if d > 0.0), 0.0)
        scale = 0.5 * nonzero
    return scale


NOISE_RATE = 0.01
"""How fast the smoothers' noise EMA follows the absolute first difference."""
NOISE_KEEP = 1.0 - NOISE_RATE
"""The noise EMA's weight on its current value (the compiled kernels take both from here)."""


def ema_step(e: float, x: float, alpha: float, beta: float) -> float:
    """One EMA step, ``alpha·x + beta·e`` (``beta`` = 1 - ``alpha``): the one form every
    EMA of the detectors takes; the compiled batch kernels form exactly these floats
    (``e + alpha·(x - e)`` would round differently)."""
    return alpha * x + beta * e


def noise_step(a: float, d: float) -> float:
    """The smoothers' noise EMA after one more absolute first difference ``d``: a slow EMA
    of ``d`` capped at 5 times the current mean, so one jump barely moves it (NaN ``a``:
    not started, ``d`` is the first)."""
    if a != a:
        return d
    t = 5.0 * a + 1e-12
    return ema_step(a, t if t < d else d, NOISE_RATE, NOISE_KEEP)
