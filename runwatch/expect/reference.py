"""Reference mode: the expected curve is an earlier, known-good run's curve."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from runwatch.expect.binning import bin_arrays
from runwatch.expect.powerlaw import MIN_POINTS, TooLittleData, residual_sigma


class ReferenceCurve:
    """An earlier run's curve, binned in log(step) and interpolated, aligned by step.

    ``sigma`` is the reference's own spread around its binned curve (value units).
    ``aligned(steps, values)`` returns the reference shifted by the median offset of the
    current run over its observed steps, for people comparing a new config against a
    known-good one (same shape, maybe another level); ``offset=False`` skips the shift.
    ``rel_band``: the curve's own 90% half-width, a share of its value (a family
    forecast's band; 0 for a known-good run's curve), which the expected-curve detector
    adds to its margin. ``first_step``: where the curve starts to be known (a family law
    is fitted on its runs' later steps); the detector does not judge before it.

    >>> import numpy as np
    >>> s = np.arange(1, 1001)
    >>> ref = ReferenceCurve(s, 3.0 + 5.0 / np.sqrt(s))
    >>> round(float(ref.predict(np.array([400.0]))[0]), 2)
    3.25
    """

    def __init__(
        self,
        steps,
        values,
        *,
        offset: bool = True,
        rel_band: float = 0.0,
        first_step: float = 0.0,
    ) -> None:
        bs, bv, _ = bin_arrays(np.asarray(steps, float), np.asarray(values, float))
        if bs.size < MIN_POINTS // 2:
            raise TooLittleData(int(bs.size), MIN_POINTS // 2, "reference bins")
        self._steps, self._values = bs, bv
        self._log_steps = np.log1p(bs)
        self.offset = offset
        self.rel_band = float(rel_band)
        self.first_step = float(first_step)
        res = np.asarray(values, float) - self.predict(np.asarray(steps, float))
        res = res[np.isfinite(res)]
        self.sigma = residual_sigma(res) if res.size else 0.0

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, metric: str, **kw) -> ReferenceCurve:
        """From a long-format frame (columns metric, step, value) of the earlier run."""
        sub = frame[frame["metric"] == metric]
        return cls(sub["step"].to_numpy(float), sub["value"].to_numpy(float), **kw)

    def predict(self, steps: np.ndarray) -> np.ndarray:
        """The reference at ``steps`` (interpolated in log step, flat beyond its ends)."""
        return np.interp(np.log1p(np.maximum(steps, 0)), self._log_steps, self._values)

    @property
    def last_step(self) -> float:
        """The last step the reference covers (it is held flat beyond)."""
        return float(self._steps[-1])

    def at(self, step: float) -> float:
        """The reference at one step (what the expected-curve detector asks, point by point)."""
        return float(np.interp(math.log1p(max(step, 0)), self._log_steps, self._values))

    def aligned(self, steps: np.ndarray, values: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        shift = 0.0
        if self.offset and len(steps):
            d = np.asarray(values, float) - self.predict(np.asarray(steps, float))
            d = d[np.isfinite(d)]
            shift = float(np.median(d)) if d.size else 0.0
        return lambda s: self.predict(s) + shift
