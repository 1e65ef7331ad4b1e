"""The OLMo 2 "spike score": a run-level health figure, not an alarm."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


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
        """``update`` over many finite values in order, in numpy; return how many spikes.

        Bit for bit what ``update`` gives: the running sums are formed by the same
        additions in the same order (a sequential cumulative sum, restarted from
        ``math.fsum`` at each rebuild). Falls back to ``update`` for huge values.
        """
        v = np.asarray(values, dtype=float)
        if v.size == 0:
            return 0
        if not np.all(np.isfinite(v)) or np.any(np.abs(v) > 1e100):
            return sum(self.update(x) for x in v.tolist())
        w = self.window
        ring = self._ring
        chrono = ring[self._pos :] + ring[: self._pos] if len(ring) == w else list(ring)
        l0 = len(chrono)
        seq = np.concatenate((np.asarray(chrono, dtype=float), v))
        m = v.size
        j = np.arange(m)
        k = np.minimum(l0 + j, w)  # ring size before point j
        full = l0 + j >= w  # point j replaces the oldest value
        old = np.where(full, seq[np.maximum(l0 + j - w, 0)], 0.0)
        # Rebuilds happen after the points where the count since the last one reaches w.
        first = w - self._since_rebuild - 1
        cuts = list(range(first, m, w))
        sums = np.empty(m)
        sumsqs = np.empty(m)
        s_now, q_now = self._sum, self._sumsq
        a = 0
        for b in [*(c + 1 for c in cuts), m]:
            if b <= a:
                continue
            fs, jj = full[a:b], np.arange(a, b)
            # Terms in the order update applies them: (-old, -old²) then (+v, +v²).
            idx = np.repeat(jj, np.where(fs, 2, 1))
            is_old = np.zeros(idx.size, dtype=bool)
            starts = np.cumsum(np.where(fs, 2, 1)) - np.where(fs, 2, 1)
            is_old[starts[fs]] = True
            ts = np.where(is_old, -old[idx], v[idx])
            tq = np.where(is_old, -(old[idx] * old[idx]), v[idx] * v[idx])
            cs = np.cumsum(np.concatenate(([s_now], ts)))
            cq = np.cumsum(np.concatenate(([q_now], tq)))
            # The sums a point is tested against are those before its own terms.
            sums[a:b] = cs[starts]
            sumsqs[a:b] = cq[starts]
            s_now, q_now = float(cs[-1]), float(cq[-1])
            if b - 1 in cuts:
                end = l0 + b
                last = seq[max(0, end - w) : end]
                s_now = math.fsum(last.tolist())
                q_now = math.fsum((last * last).tolist())
            a = b
        kk = np.maximum(k, 1)
        mean = sums / kk
        var = np.maximum(sumsqs / kk - mean * mean, 0.0)
        spike = (k >= 2) & (var > 0) & (np.abs(v - mean) > self.sigmas * np.sqrt(var))
        n_sp = int(spike.sum())
        self._n += m
        self._n_spikes += n_sp
        tail = seq[-w:].tolist()
        total = l0 + m
        if total < w:
            self._ring, self._pos = tail, 0
        else:
            pos = (self._pos + total - w) % w  # one step per replaced value
            self._ring, self._pos = tail[w - pos :] + tail[: w - pos], pos
        self._sum, self._sumsq = s_now, q_now
        self._since_rebuild = (self._since_rebuild + m) % w
        return n_sp
