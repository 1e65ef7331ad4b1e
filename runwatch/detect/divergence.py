"""Divergence: a sustained rise of the smoothed loss."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from runwatch.detect._divergence_kernel import quiet
from runwatch.detect.base import (
    Detector,
    Signal,
    check_choice,
    check_number,
    ema_step,
    kernel_loop,
    noise_step,
)


class Divergence(Detector):
    """A sustained rise of the smoothed (log) loss above its best recent level.

    The loss is smoothed by a running median of ``median_window`` points (so one or two
    spikes do not move it at all) followed by an EMA of ``span`` points. The reference is
    the lowest block mean of the smoothed value over roughly the last ``ref_blocks * block``
    points after ``warmup`` (a block mean, so the reference is not the luckiest noisy dip).
    The rise above it must exceed both ``threshold`` sigmas of the EMA's own noise and
    ``min_rise`` (log units, 0.05 = 5%) for ``patience`` points in a row: warning, and
    critical once the smoothed loss is ``critical_ratio`` times the reference.

    Catches: a run going wrong (loss creeping or jumping up and staying up).
    Misses: single spikes (Spike); a loss that stops falling but does not rise (see
    CurveDeviation); rises smaller than ``min_rise``; anything in the first ``warmup`` points.

    Baseline protection: while it alarms the reference is frozen (old blocks do not roll
    out), so a rising loss cannot become the new normal. The cost: after a real lasting
    shift up (a harder data mix) it keeps alarming until ``adapt_after`` flagged points,
    then takes the new level as the reference.

    >>> import random
    >>> rng = random.Random(1)
    >>> d = Divergence()
    >>> curve = [3.0 - 0.001 * i + 0.01 * rng.gauss(0, 1) for i in range(400)]
    >>> curve += [curve[-1] * (1 + 0.004 * i) for i in range(100)]
    >>> hits = [s for s, v in enumerate(curve) if d.update(s, v)]
    >>> hits[0], d.divergences
    (447, 1)
    """

    name = "divergence"
    quiet = 20

    def __init__(
        self,
        span: int = 20,
        threshold: float = 6.0,
        min_rise: float = 0.05,
        patience: int = 5,
        warmup: int = 100,
        median_window: int = 5,
        block: int = 256,
        ref_blocks: int = 16,
        critical_ratio: float = 1.5,
        adapt_after: int = 2000,
        space: str = "auto",
    ) -> None:
        check_number("span", span, low=1, integer=True)
        check_number("threshold", threshold, low=0.0)
        check_number("min_rise", min_rise, low=0.0)
        check_number("patience", patience, low=1, integer=True)
        check_number("warmup", warmup, low=0, integer=True)
        check_number("median_window", median_window, low=1, integer=True)
        check_number("block", block, low=1, integer=True)
        check_number("ref_blocks", ref_blocks, low=1, integer=True)
        check_number("critical_ratio", critical_ratio, low=1.0)
        check_number("adapt_after", adapt_after, low=1, integer=True)
        check_choice("space", space, ("auto", "log", "linear"))
        self.span = span
        self.threshold = threshold
        self.min_rise = min_rise
        self.patience = patience
        self.warmup = warmup
        self.median_window = median_window
        self.block = block
        self.ref_blocks = ref_blocks
        self.critical_ratio = critical_ratio
        self.adapt_after = adapt_after
        self.space = space
        super().__init__()

    def _reset(self) -> None:
        self._alpha = 2.0 / (self.span + 1.0)
        self._beta = 1.0 - self._alpha
        self._ema_sd = math.sqrt(self._alpha / (2.0 - self._alpha))
        self._log = self.space != "linear"
        self._n = 0
        self._ema = math.nan
        self._prev = math.nan
        self._recent: list[float] = []
        self._absdiff = math.nan
        self._blocks: list[float] = []
        self._cur_sum = 0.0
        self._cur_n = 0
        self._over = 0
        self._flagged = 0
        self._divergences = 0

    @property
    def divergences(self) -> int:
        """How many times a divergence was declared."""
        return self._divergences

    @property
    def smoothed(self) -> float:
        """The current smoothed value (log space if the detector works in logs)."""
        return self._ema

    def _reference(self) -> float:
        if self._blocks:
            return min(self._blocks)
        return self._cur_sum / self._cur_n if self._cur_n else math.inf

    def update(self, step: int, value: float) -> Signal | None:
        if not math.isfinite(value):
            return None
        if self._log and value <= 0:
            if self.space == "log":
                return None
            self._log = False
            self._reset_state_linear()
        x = math.log(value) if self._log else value
        self._n += 1
        if self._n == 1:
            self._ema = self._prev = x
            return None
        d = abs(x - self._prev)
        self._prev = x
        self._absdiff = noise_step(self._absdiff, d)
        sigma = 0.886 * self._absdiff  # mean |diff| -> Gaussian sigma of one point
        recent = self._recent
        recent.append(x)
        if len(recent) > self.median_window:
            del recent[0]
        srt = sorted(recent)
        self._ema = ema_step(self._ema, srt[len(srt) // 2], self._alpha, self._beta)
        if self._n <= self.warmup:
            return None
        ref = self._reference()
        rise = self._ema - ref if math.isfinite(ref) else 0.0
        need = max(self.threshold * sigma * self._ema_sd, self.min_rise if self._log else 0.0)
        if rise <= need:
            self._over = 0
            self._flagged = 0
            self._learn(self._ema)
            return None
        return self._rising(value, ref, rise, need, sigma)

    def _rising(
        self, value: float, ref: float, rise: float, need: float, sigma: float
    ) -> Signal | None:
        """The smoothed value is above the reference by more than ``need``."""
        self._over += 1
        if self._over < self.patience:
            return None
        if self._over == self.patience:
            self._divergences += 1
        self._flagged += 1
        if self._flagged >= self.adapt_after:
            self._blocks.clear()
            self._cur_sum, self._cur_n = self._ema, 1
            self._flagged = 0
        return self._signal(value, ref, rise, need, sigma)

    def update_many(
        self,
        steps: Sequence[int],
        values: Sequence[float],
        on_error: Callable[[int], None] | None = None,
    ) -> list[tuple[int, Signal]]:
        """``update`` point by point, with the unflagged points done by a compiled loop
        (``_divergence_kernel.quiet``: the same operations, the same result); only a
        flagged point, or the end of log space, goes through ``update`` itself."""

        def start() -> Callable[[int], int]:
            vals = np.ascontiguousarray(values, dtype=float)
            return lambda i: quiet(self, vals, i)

        return kernel_loop(self, start, self.update, steps, values, on_error)

    def _reset_state_linear(self) -> None:
        self._n = 0
        self._blocks.clear()
        self._cur_sum, self._cur_n = 0.0, 0
        self._absdiff = math.nan
        self._over = 0

    def _learn(self, ema: float) -> None:
        self._cur_sum += ema
        self._cur_n += 1
        if self._cur_n >= self.block:
            self._blocks.append(self._cur_sum / self._cur_n)
            if len(self._blocks) > self.ref_blocks:
                del self._blocks[0]
            self._cur_sum, self._cur_n = 0.0, 0

    def _signal(self, value: float, ref: float, rise: float, need: float, sigma: float) -> Signal:
        score = rise / max(sigma * self._ema_sd, 1e-12)
        if self._log:
            expected, upper, smoothed = math.exp(ref), math.exp(ref + need), math.exp(self._ema)
            ratio = math.exp(rise)
            sev = "critical" if ratio >= self.critical_ratio else "warning"
            msg = (
                f"divergence: smoothed loss {smoothed:.4g} is x{ratio:.3f} its best {expected:.4g}"
            )
        else:
            expected, upper, smoothed, ratio = ref, ref + need, self._ema, math.nan
            sev = "warning"
            msg = f"divergence: smoothed value {smoothed:.4g} rose {rise:.3g} above {expected:.4g}"
        return Signal(
            sev,
            score,
            value,
            expected,
            None,
            upper,
            msg,
            {"rise_ratio": ratio, "smoothed": smoothed, "points_rising": self._over},
        )
