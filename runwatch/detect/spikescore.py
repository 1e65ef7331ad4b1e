"""The OLMo 2 "spike score": a run-level health figure, not an alarm."""

from __future__ import annotations

from collections.abc import Sequence

from runwatch.detect._spike_core import ScoreCore


class SpikeScore:
    """Share of points more than ``sigmas`` σ from the rolling mean of the last ``window``.

    OLMo 2 (Team OLMo, 2024) tracks this as a health figure for the loss and grad norm of a
    run: a stable run has a score near 0. Memory is the ring of the last ``window`` values;
    mean and variance come from running sums, rebuilt every ``window`` points so float
    drift cannot build up over a 10M-step run. The state and the step are compiled
    (``ScoreCore``); ``Spike`` keeps the same score of its series.

    Parameters
    ----------
    window : int
        How many recent values the rolling mean and variance cover (>= 2).
    sigmas : float
        How far from the rolling mean, in standard deviations, a value is a spike (> 0).

    >>> s = SpikeScore(window=10, sigmas=3.0)
    >>> for i in range(40):
    ...     _ = s.update(1.0 + 0.01 * (i % 3))
    >>> s.update(50.0), s.n_spikes, round(s.score, 4)
    (True, 1, 0.0244)
    """

    def __init__(self, window: int = 1000, sigmas: float = 7.0) -> None:
        if not isinstance(window, int) or window < 2:
            raise ValueError(f"window={window!r} is invalid; valid values: an integer >= 2")
        if not isinstance(sigmas, (int, float)) or not sigmas > 0:
            raise ValueError(f"sigmas={sigmas!r} is invalid; valid values: a number > 0")
        self.window = window
        self.sigmas = sigmas
        self._reset()

    def _reset(self) -> None:
        self._core = ScoreCore(self.window, self.sigmas)

    @property
    def score(self) -> float:
        """Share of the points seen so far that were spikes (0 when none were seen)."""
        n = self._core.n
        return self._core.n_spikes / n if n else 0.0

    @property
    def n_spikes(self) -> int:
        return self._core.n_spikes

    @property
    def n(self) -> int:
        return self._core.n

    def update(self, value: float) -> bool:
        """Count one finite value; return True if it is a spike."""
        return self._core.update(value)

    def update_many(self, values: Sequence[float]) -> int:
        """``update`` over many values in order, compiled; return how many spikes."""
        return self._core.update_many(values)
