"""Non-finite values: NaN or ±Inf in any metric."""

from __future__ import annotations

import math

from runwatch.detect.base import Detector, Signal, check_severity

NONFINITE_SCORE = 1000.0
"""The score of a non-finite point: finite, so JSON output stays standard."""


class NonFinite(Detector):
    """Flags NaN and ±Inf at the step they appear (delay 0), critical by default.

    Catches: a NaN/Inf loss, grad norm or any other metric, from the first bad point.
    Misses: values that are finite but absurd (a loss of 1e30); the spike and divergence
    detectors look at those. It keeps no baseline, so there is nothing to protect.

    >>> d = NonFinite()
    >>> [d.update(s, v) for s, v in enumerate([2.0, 1.9])]
    [None, None]
    >>> sig = d.update(2, float("nan"))
    >>> sig.severity, sig.details["kind"], d.n_nonfinite
    ('critical', 'nan', 1)
    """

    name = "nonfinite"
    quiet = 5

    def __init__(self, severity: str = "critical") -> None:
        check_severity("severity", severity)
        self.severity = severity
        super().__init__()

    def _reset(self) -> None:
        self._n_nonfinite = 0

    @property
    def n_nonfinite(self) -> int:
        """How many non-finite points were seen."""
        return self._n_nonfinite

    def update(self, step: int, value: float) -> Signal | None:
        if math.isfinite(value):
            return None
        self._n_nonfinite += 1
        kind = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return Signal(
            self.severity,
            NONFINITE_SCORE,
            value,
            message=f"non-finite value ({kind}) at step {step}",
            details={"kind": kind},
        )
