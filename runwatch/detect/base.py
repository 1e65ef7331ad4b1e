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

import numpy as np
from scipy.signal import lfilter

from runwatch.expect.lrclock import LRClock
from runwatch.model import SEVERITIES

log = logging.getLogger("runwatch.detect")

__all__ = [
    "Detector",
    "Signal",
    "batch_ready",
    "check_choice",
    "check_lengths",
    "check_number",
    "ema_many",
    "ema_step",
    "guarded",
    "noise_many",
    "noise_step",
    "robust_scale",
    "robust_scales",
    "running_medians",
    "smooth_many",
    "smoothed_state",
    "windows",
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


def batch_ready(steps: Sequence[int], values: Sequence[float]) -> bool:
    """True when a vectorised ``update_many`` may run: int steps in order and float values,
    what batch replay gives. Anything else (numpy scalars, steps going back) takes the
    plain loop, whose ``update`` handles every case.

    >>> batch_ready([1, 2, 2], [0.5, 0.4, 0.3]), batch_ready([2, 1], [0.5, 0.4])
    (True, False)
    """
    check_lengths(steps, values)
    if not steps or set(map(type, steps)) != {int} or set(map(type, values)) != {float}:
        return False
    st = np.asarray(steps)
    return not bool(np.any(st[1:] < st[:-1]))


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


def windows(x: np.ndarray, size: int) -> np.ndarray:
    """Every ``size`` consecutive values of the 1-d ``x``, one window a row: a read-only
    view, what ``sliding_window_view`` gives without its ~15 us of checks (batch paths
    call this for every short stretch they test).

    >>> windows(np.arange(5.0), 3).tolist()
    [[0.0, 1.0, 2.0], [1.0, 2.0, 3.0], [2.0, 3.0, 4.0]]
    """
    x = np.ascontiguousarray(x)
    s = x.strides[0]
    v = np.ndarray((max(x.size - size + 1, 0), size), x.dtype, x, 0, (s, s))
    v.flags.writeable = False
    return v


def robust_scales(z: np.ndarray, ends: np.ndarray, window: int) -> list[float]:
    """``robust_scale`` of ``z[max(0, e - window):e]`` for each end ``e``, bit for bit: the
    same differences and the same order statistic, picked by ``np.partition`` (batch paths
    use it for a noise scale recomputed every few points)."""
    out: list[float] = []
    full = ends >= window
    vals: list[float] = []
    if full.any():
        d = np.abs(z[1:] - z[:-1])  # |z[i+1] - z[i]|, as robust_scale forms them
        rows = windows(d, window - 1)[ends[full] - window]
        kth = (window - 1) // 2
        med = 1.0484 * np.partition(rows, kth, axis=1)[:, kth]
        if full.all() and med.all():
            return med.tolist()  # full windows, none zero: nothing to redo one by one
        vals = med.tolist()
    it = iter(vals)
    for e, f in zip(ends.tolist(), full.tolist(), strict=True):
        v = next(it) if f else 0.0
        if not f or v == 0.0:
            v = robust_scale(z[max(0, e - window) : e].tolist())  # short window, or zero
        out.append(v)
    return out


def running_medians(prev: list[float], new: list[float], size: int) -> list[float]:
    """After each value of ``new``, ``sorted(w)[len(w) // 2]`` of the window ``w`` of the
    last ``size`` values (fewer at the start of a series; ``prev``: the values before).

    The running median that smoothers keep in a list, for a whole batch: full windows
    are sorted by numpy (a median is one of the values, so the result is exact).

    >>> running_medians([], [3.0, 1.0, 2.0, 9.0], 3)
    [3.0, 3.0, 2.0, 2.0]
    """
    seq = prev[max(0, len(prev) - size + 1) :] + new if size > 1 else list(new)
    off = len(seq) - len(new)
    out = [0.0] * len(new)
    for j in range(min(len(new), max(0, size - 1 - off))):
        p = off + j  # a window still short of ``size``: the series so far
        out[j] = sorted(seq[: p + 1])[(p + 1) // 2]
    first = max(0, size - 1 - off)
    if first < len(new):
        rows = np.sort(windows(np.array(seq), size), axis=1)[:, size // 2]
        out[first:] = rows[off + first - size + 1 :].tolist()
    return out


NOISE_RATE = 0.01
"""How fast the smoothers' noise EMA follows the absolute first difference."""
_NOISE_KEEP = 1.0 - NOISE_RATE


def ema_step(e: float, x: float, alpha: float, beta: float) -> float:
    """One EMA step, ``alpha·x + beta·e`` (``beta`` = 1 - ``alpha``): the one form every
    EMA of the detectors takes, streaming or batched, because ``ema_many`` forms exactly
    these floats (``e + alpha·(x - e)`` would round differently)."""
    return alpha * x + beta * e


def ema_many(e: float, x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """``ema_step`` after each of ``x`` (NaN ``e``: the EMA starts at ``x[0]``), bit for
    bit: ``lfilter`` computes ``beta·e`` then adds ``alpha·x``, the same two roundings
    (``tests/detect/test_batch.py`` checks it).

    >>> ema_many(float("nan"), np.array([1.0, 2.0, 4.0]), 0.5, 0.5).tolist()
    [1.0, 1.5, 2.75]
    """
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return np.empty(0)
    if e != e:
        return np.concatenate((x[:1], ema_many(float(x[0]), x[1:], alpha, beta)))
    return lfilter([alpha], [1.0, -beta], x, zi=[beta * e])[0]


def noise_step(a: float, d: float) -> float:
    """The smoothers' noise EMA after one more absolute first difference ``d``: a slow EMA
    of ``d`` capped at 5 times the current mean, so one jump barely moves it (NaN ``a``:
    not started, ``d`` is the first)."""
    if a != a:
        return d
    t = 5.0 * a + 1e-12
    return ema_step(a, t if t < d else d, NOISE_RATE, _NOISE_KEEP)


def noise_many(a: float, diffs: np.ndarray) -> np.ndarray:
    """``noise_step`` after each of ``diffs``, bit for bit: ``ema_many`` over the stretch
    up to the first capped difference (a jump: ~1 in 150 points of the real losses), that
    one by ``noise_step``, and on from there.

    >>> noise_many(float("nan"), np.array([0.2, 0.4, 9.0])).tolist()
    [0.2, 0.202, 0.21008000000001]
    """
    diffs = np.asarray(diffs, dtype=float)
    n = diffs.size
    out = np.empty(n)
    i = 0
    if n and a != a:
        a = out[0] = diffs[0]
        i = 1
    chunk = 256
    while i < n:
        seg = diffs[i : min(n, i + chunk)]
        ys = ema_many(a, seg, NOISE_RATE, _NOISE_KEEP)
        before = np.concatenate(([a], ys[:-1]))
        capped = seg > 5.0 * before + 1e-12
        c = int(np.argmax(capped)) if capped.any() else seg.size
        out[i : i + c] = ys[:c]
        if c < seg.size:
            out[i + c] = noise_step(float(before[c]), float(seg[c]))
            c += 1
            chunk = 256
        else:
            chunk = min(2 * chunk, 8192)
        a = float(out[i + c - 1])
        i += c
    return out


def smooth_many(
    absdiff: float, ema: float, alpha: float, beta: float, diffs: np.ndarray, medians
) -> tuple[np.ndarray, np.ndarray]:
    """The noise EMA and the smoothed value after each point, for a whole batch.

    The smoothers of CurveDeviation and Divergence keep ``absdiff``, the noise EMA of the
    absolute first differences (``diffs``, ``noise_step``), and ``ema``, an EMA
    (``ema_step``) of the running median (``medians``): the same floats as their own
    ``update`` forms. Returns (absdiffs, emas).

    >>> ads, emas = smooth_many(float("nan"), 1.0, 0.5, 0.5, [0.2, 0.4], [1.0, 2.0])
    >>> ads.tolist(), emas.tolist()
    ([0.2, 0.202], [1.0, 1.5])
    """
    return noise_many(absdiff, diffs), ema_many(ema, medians, alpha, beta)


def smoothed_state(
    d: Detector,
    n0: int,
    xs: list[float],
    absdiffs: np.ndarray,
    emas: np.ndarray,
    recent0: list[float],
    size: int,
    j: int,
) -> None:
    """Put the smoother's state of CurveDeviation or Divergence ``d`` where its ``update``
    leaves it after the first ``j`` of ``xs`` (``absdiffs``, ``emas``: from
    ``smooth_many``; ``n0``, ``recent0``: its count and running-median window before
    them; ``size``: that window's length)."""
    if j == 0:
        return
    d._n = n0 + j
    d._prev = xs[j - 1]
    d._absdiff = float(absdiffs[j - 1])
    d._ema = float(emas[j - 1])
    d._recent[:] = (recent0 + xs[max(0, j - size) : j])[-size:]
