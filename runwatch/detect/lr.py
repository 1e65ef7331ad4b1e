"""Learning-rate sanity: the logged LR departs from its own schedule."""

from __future__ import annotations

from runwatch.detect._lr_core import Kind, LRCore
from runwatch.detect.base import CoreDetector, Signal, check_number

_FOUND = {
    Kind.TO_ZERO: ("warning", "lr dropped to zero"),
    Kind.JUMP_UP: ("warning", "lr jumped up"),
    Kind.DROP: ("info", "lr dropped abruptly"),
}
"""Severity and wording of each kind of departure from the schedule."""


class LRSanity(CoreDetector):
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

    State and step are compiled (``LRCore``); this class validates, and words signals.

    Parameters
    ----------
    jump_tol : float
        Residual, as a share of the peak LR, beyond which a point is off its schedule
        (>= 0).
    zero_frac : float
        Share of the peak LR at or below which the LR counts as zero (0 to 1).
    zero_from : float
        Share of the peak LR the previous point must be above for a fall to zero to be
        abrupt (``zero_frac`` to 1).
    slope_points : int
        Accepted points whose line predicts the next (>= 2).
    min_points : int
        Points learned before anything is judged (>= ``slope_points``).
    adapt_after : int
        Consecutive flagged points after which the new schedule is accepted (>= 1).
    zero_run : int
        Points of an LR never above zero after which that is a warning (>= 1).

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
        self._core = LRCore(
            self.jump_tol,
            self.zero_frac,
            self.zero_from,
            self.slope_points,
            self.min_points,
            self.adapt_after,
            self.zero_run,
        )

    @property
    def peak(self) -> float:
        """The highest accepted LR so far."""
        return self._core.peak

    def rewind(self, step: int) -> None:
        # A resume restarts the schedule from the checkpoint: predict afresh.
        self._core.rewind()

    def _signal(self, value: float, rec: tuple) -> Signal:
        """The Signal of a flagged point from its ``LRCore`` record."""
        kind, pred, resid, peak, n = rec
        if kind == Kind.NEVER_SET:
            return Signal(
                "warning",
                float(n),
                value,
                None,
                None,
                None,
                f"lr has been {value:.3g} for all of the first {n} points: "
                "the model is not learning",
                {"points": n},
            )
        severity, what = _FOUND[kind]
        tol = self.jump_tol * peak
        return Signal(
            severity,
            abs(resid),
            value,
            pred,
            max(pred - tol, 0.0),
            pred + tol,
            f"{what}: {value:.3g} where its schedule predicts {pred:.3g}",
            {"relative_residual": resid, "peak_lr": peak},
        )
