"""The OLMo 2 "spike score": a run-level health figure, not an alarm."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from runwatch.detect._spike_kernel import score_many


class SpikeScore:
    """Share of points more than ``sigmas`` σ from the rolling mean of the last ``window``.

    OLMo 2 (Team OLMo, 2024) tracks this as a health figure for the loss and grad norm of a
    run: a stable run has a score near 0. Memory is the ring of the last ``window`` values;
    mean and variance come from running sums, rebuilt every ``window`` points so float
    drift cannot build up over a 10M-step run.

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
        self._ring: list[float] = []
        self._pos = 0
        self._sum = 0.0
        self._sumsq = 0.0
        self._since_rebuild = 0
        self._n = 0
        self._n_spikes = 0

    @property
    def score(self) -> float:
        """Share of the points seen so far that were spikes (0 when none were seen)."""
        return self._n_spikes / self._n if self._n else 0.0

    @property
    def n_spikes(self) -> int:
        return self._n_spikes

    @property
    def n(self) -> int:
        return self._n

    def update(self, value: float) -> bool:
        """Count one finite value; return True if it is a spike."""
        if not math.isfinite(value):
            return False
        self._n += 1
        if abs(value) > 1e100:
            # Squares would overflow the running sums: a spike, kept out of the window.
            self._n_spikes += 1
            return True
        ring = self._ring
        k = len(ring)
        spike = False
        if k >= 2:
            mean = self._sum / k
            var = max(self._sumsq / k - mean * mean, 0.0)
            spike = var > 0 and abs(value - mean) > self.sigmas * math.sqrt(var)
        if spike:
            self._n_spikes += 1
        if k < self.window:
            ring.append(value)
        else:
            old = ring[self._pos]
            ring[self._pos] = value
            self._pos = (self._pos + 1) % self.window
            self._sum -= old
            self._sumsq -= old * old
        self._sum += value
        self._sumsq += value * value
        self._since_rebuild += 1
        if self._since_rebuild >= self.window:
            self._since_rebuild = 0
            self._sum = math.fsum(ring)
            self._sumsq = math.fsum(v * v for v in ring)
        return spike

    def update_many(self, values: Sequence[float]) -> int:
        """``update`` over many values in order, compiled; return how many spikes.

        Bit for bit what ``update`` gives: the same additions to the running sums in
        the same order, and ``math.fsum``'s algorithm at each rebuild.
        """
        return score_many(self, np.asarray(values, dtype=float))
