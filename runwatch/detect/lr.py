"""Learning-rate sanity: the logged LR departs from its own schedule."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from runwatch.detect._lr_kernel import learn_quiet
from runwatch.detect.base import Detector, Signal, check_number, kernel_loop


class LRSanity(Detector):
    """The LR jumps off the line its own recent points draw, or drops to zero abruptly.

    Each point is predicted by extending the slope of the last ``slope_points`` accepted
    points (linear warmup, cosine and linear decay are all locally straight); the residual
    is judged against the peak LR seen so far. Upward jumps of more than ``jump_tol`` of
    the peak are warnings; an LR that falls to (near) zero from above ``zero_from`` of the
    peak is a warning ("goes to zero early"); a large downward step that stays above zero
    is info, because step-decay schedules do exactly that. An LR that has never been above
    zero after ``zero_run`` points is a warning too (a run that cannot learn).

    Catches: an LR that jumps (a schedule restarted by a resume bug, a wrong scale),
    vanishes mid-run (LR stuck at 0) or was never set (0 from the start). The loss
    detectors, which judge the loss by the LR once it is logged, expect no progress from
    an LR of zero: this detector is where such a plateau shows.
    Misses: a schedule that is wrong but smooth (a too-slow decay); downward steps (info);
    anything in the first ``min_points`` points; a smooth decay to zero is legitimate.

    Baseline protection: flagged points do not move the prediction line, so a jumped LR
    stays flagged while it lasts. The cost: a deliberate new schedule (cosine with warm
    restarts) is flagged until ``adapt_after`` points, then accepted.

    >>> d = LRSanity()
    >>> lrs = [min(1.0, (i + 1) / 50) * 3e-4 for i in range(200)]
    >>> lrs[150:160] = [9e-4] * 10
    >>> lrs[180:] = [0.0] * 20
    >>> hits = [(s, sig.severity) for s, v in enumerate(lrs) if (sig := d.update(s, v))]
    >>> hits[0], hits[10], len(hits)
    ((150, 'warning'), (180, 'warning'), 30)
    """

    name = "lr_sanity"
    quiet = 5

    def __init__(
        self,
        jump_tol: float = 0.2,
        zero_frac: float = 1e-3,
        zero_from: float = 0.05,
        slope_points: int = 8,
        min_points: int = 16,
        adapt_after: int = 50,
        zero_run: int = 500,
    ) -> None:
        check_number("jump_tol", jump_tol, low=0.0)
        check_number("zero_frac", zero_frac, low=0.0, high=1.0)
        check_number("zero_from", zero_from, low=zero_frac, high=1.0)
        check_number("slope_points", slope_points, low=2, integer=True)
        check_number("min_points", min_points, low=slope_points, integer=True)
        check_number("adapt_after", adapt_after, low=1, integer=True)
        check_number("zero_run", zero_run, low=1, integer=True)
        self.zero_run = zero_run
        self.jump_tol = jump_tol
        self.zero_frac = zero_frac
        self.zero_from = zero_from
        self.slope_points = slope_points
        self.min_points = min_points
        self.adapt_after = adapt_after
        super().__init__()

    def _reset(self) -> None:
        self._steps: list[int] = []
        self._vals: list[float] = []
        self._n = 0
        self._peak = 0.0
        self._flagged = 0
        self._zero = False

    @property
    def peak(self) -> float:
        """The highest accepted LR so far."""
        return self._peak

    def _learn(self, step: int, value: float) -> None:
        self._steps.append(step)
        self._vals.append(value)
        if len(self._vals) > self.slope_points:
            del self._steps[0]
            del self._vals[0]
        self._n += 1
        if value > self._peak:
            self._peak = value

    def rewind(self, step: int) -> None:
        # A resume restarts the schedule from the checkpoint: predict afresh.
        self._steps.clear()
        self._vals.clear()

    def update(self, step: int, value: float) -> Signal | None:
        if not math.isfinite(value):
            return None
        if self._peak <= 0 and value <= 0:
            # Never above zero yet: a warmup from 0 leaves this at once, a missing LR not.
            self._learn(step, value)
            if self._n < self.zero_run:
                return None
            return Signal(
                "warning",
                float(self._n),
                value,
                None,
                None,
                None,
                f"lr has been {value:.3g} for all of the first {self._n} points: "
                "the model is not learning",
                {"points": self._n},
            )
        vals, steps = self._vals, self._steps
        if self._n < self.min_points or len(vals) < 2:
            self._learn(step, value)
            return None
        gap = steps[-1] - steps[0]
        slope = (vals[-1] - vals[0]) / gap if gap > 0 else 0.0
        pred = vals[-1] + slope * (step - steps[-1])
        peak = self._peak
        resid = (value - pred) / peak if peak > 0 else 0.0
        last = vals[-1]
        sig = None
        if value <= self.zero_frac * peak:
            if last > self.zero_from * peak or self._zero:
                self._zero = True
                sig = self._signal("warning", value, pred, resid, "lr dropped to zero")
        elif resid > self.jump_tol:
            sig = self._signal("warning", value, pred, resid, "lr jumped up")
        elif resid < -self.jump_tol:
            # Step-decay schedules drop like this: worth a look, not an alarm; learned.
            self._learn(step, value)
            self._flagged = 0
            return self._signal("info", value, pred, resid, "lr dropped abruptly")
        if sig is None:
            self._flagged = 0
            self._zero = False
            self._learn(step, value)
            return None
        self._flagged += 1
        if self._flagged >= self.adapt_after:
            self._flagged = 0
            self._zero = False
            steps.clear()
            vals.clear()
            self._learn(step, value)
        return sig

    def update_many(
        self,
        steps: Sequence[int],
        values: Sequence[float],
        on_error: Callable[[int], None] | None = None,
    ) -> list[tuple[int, Signal]]:
        """``update`` point by point, with the points it only learns from done in compiled
        code (``_lr_kernel.learn_quiet``: the same floats); each point it could flag goes
        through ``update`` itself."""

        def start() -> Callable[[int], int]:
            st = np.asarray(steps, dtype=np.int64)
            vs = np.asarray(values, dtype=float)
            return lambda i: learn_quiet(self, st, vs, i)

        return kernel_loop(self, start, self.update, steps, values, on_error)

    def _signal(self, sev: str, value: float, pred: float, resid: float, what: str) -> Signal:
        tol = self.jump_tol * self._peak
        return Signal(
            sev,
            abs(resid),
            value,
            pred,
            max(pred - tol, 0.0),
            pred + tol,
            f"{what}: {value:.3g} where its schedule predicts {pred:.3g}",
            {"relative_residual": resid, "peak_lr": self._peak},
        )
