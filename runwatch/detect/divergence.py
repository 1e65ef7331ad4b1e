"""Divergence: a sustained rise of the smoothed loss."""

from __future__ import annotations

import math

from runwatch.detect._divergence_core import DivergenceCore
from runwatch.detect.base import CoreDetector, Signal, check_choice, check_number


class Divergence(CoreDetector):
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

    Parameters
    ----------
    span : int
        Span of the EMA that follows the running median.
    threshold : float
        The rise needed, in sigmas of the EMA's own noise.
    min_rise : float
        The least rise flagged in log space (log units, 0.05 = 5%).
    patience : int
        Rising points in a row before a point is flagged.
    warmup : int
        Points before judging.
    median_window : int
        Points in the running median.
    block : int
        Points per block mean of the reference.
    ref_blocks : int
        Block means the reference is the lowest of.
    critical_ratio : float
        Smoothed loss over reference that makes a signal critical (log space).
    adapt_after : int
        Flagged points after which the current level becomes the reference.
    space : {"auto", "log", "linear"}
        Work on log values ("log": non-positive values are ignored), on the values
        ("linear"), or on log values until a value is not positive ("auto").

    Examples
    --------
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
        self._core = DivergenceCore(
            self.span,
            self.threshold,
            self.min_rise,
            self.patience,
            self.warmup,
            self.median_window,
            self.block,
            self.ref_blocks,
            self.adapt_after,
            self.space,
        )

    @property
    def divergences(self) -> int:
        """How many times a divergence was declared."""
        return self._core.divergences

    @property
    def smoothed(self) -> float:
        """The current smoothed value (log space if the detector works in logs)."""
        return self._core.smoothed

    @property
    def block_means(self) -> tuple[float, ...]:
        """The block means the reference is the lowest of, oldest first (at most
        ``ref_blocks``)."""
        return self._core.block_means

    def _signal(
        self, value: float, rec: tuple[float, float, float, float, float, int, bool]
    ) -> Signal:
        """The Signal of a flagged point from the core's record of it."""
        ref, rise, need, noise, ema, points, in_log = rec
        score = rise / max(noise, 1e-12)
        if in_log:
            expected, upper, smoothed = math.exp(ref), math.exp(ref + need), math.exp(ema)
            ratio = math.exp(rise)
            sev = "critical" if ratio >= self.critical_ratio else "warning"
            msg = (
                f"divergence: smoothed loss {smoothed:.4g} is x{ratio:.3f} its best {expected:.4g}"
            )
        else:
            expected, upper, smoothed, ratio = ref, ref + need, ema, math.nan
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
            {"rise_ratio": ratio, "smoothed": smoothed, "points_rising": points},
        )
