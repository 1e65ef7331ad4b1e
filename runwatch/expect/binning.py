"""Log-spaced step bins: a bounded summary of a curve, for fitting at bounded cost.

A loss curve changes fast early and slowly late, so bins equally spaced in log(step)
keep the shape with a few hundred numbers however long the run is (8 bins per doubling of
the step: 10M steps -> under 200 bins).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

PER_OCTAVE = 8


def bin_index(step: float, per_octave: int = PER_OCTAVE) -> int:
    """The bin of ``step``: floor(per_octave * log2(step + 1))."""
    return int(per_octave * math.log2(max(step, 0) + 1.0))


def bin_arrays(
    steps: np.ndarray, values: np.ndarray, per_octave: int = PER_OCTAVE
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean step, median value and count per non-empty bin, for finite values only.

    The median keeps a spike inside a bin from moving the bin.

    >>> s, v, n = bin_arrays(np.arange(8), np.arange(8) * 1.0, per_octave=1)
    >>> s.tolist(), v.tolist(), n.tolist()
    ([0.0, 1.5, 4.5, 7.0], [0.0, 1.5, 4.5, 7.0], [1, 2, 4, 1])
    """
    steps = np.asarray(steps, dtype=float)
    values = np.asarray(values, dtype=float)
    ok = np.isfinite(values) & np.isfinite(steps)
    steps, values = steps[ok], values[ok]
    if steps.size == 0:
        empty = np.empty(0)
        return empty, empty, np.empty(0, dtype=int)
    idx = np.floor(per_octave * np.log2(np.maximum(steps, 0) + 1.0)).astype(np.int64)
    order = np.argsort(idx, kind="stable")
    idx, steps, values = idx[order], steps[order], values[order]
    cuts = np.flatnonzero(np.diff(idx)) + 1
    bounds = np.concatenate(([0], cuts, [idx.size]))
    n = np.diff(bounds)
    bs = np.add.reduceat(steps, bounds[:-1]) / n
    bv = np.array([np.median(values[a:b]) for a, b in itertools.pairwise(bounds)])
    return bs, bv, n


class LogBins:
    """Streaming version of ``bin_arrays`` (bin means, not medians, to stay O(1) per point).

    ``extra`` more numbers per point (the LR areas of the point, for the expected-curve
    detector) are averaged per bin beside the value and returned after the counts.

    >>> b = LogBins(per_octave=1)
    >>> for s in range(8):
    ...     b.add(s, float(s))
    >>> [x.tolist() for x in b.arrays()]
    [[0.0, 1.5, 4.5, 7.0], [0.0, 1.5, 4.5, 7.0], [1, 2, 4, 1]]
    """

    def __init__(self, per_octave: int = PER_OCTAVE, extra: int = 0) -> None:
        self.per_octave = per_octave
        self.extra = extra
        self._bins: dict[int, list[float]] = {}

    def add(self, step: float, value: float, *extra: float) -> None:
        k = bin_index(step, self.per_octave)
        b = self._bins.get(k)
        if b is None:
            self._bins[k] = [step, value, 1.0, *extra]
        else:
            b[0] += step
            b[1] += value
            b[2] += 1.0
            for i, x in enumerate(extra, 3):
                b[i] += x

    def add_many(self, steps: list[int], values: np.ndarray, *extra: np.ndarray) -> None:
        """``add`` over many points whose steps are Python ints in non-decreasing order.

        Bit for bit what ``add`` gives: each bin's step sum stays an int, its value sum is
        the same sequential float sum (a cumulative sum), and bins are created in the
        same order. Bin indices come from numpy and are checked with ``bin_index`` where
        they change (a log2 one ulp off would move a boundary point).
        """
        if not steps:
            return
        st = np.asarray(steps, dtype=np.int64)
        po = self.per_octave
        k = np.floor(po * np.log2(np.maximum(st, 0) + 1.0)).astype(np.int64)
        starts = np.flatnonzero(np.diff(k)) + 1
        bounds = [0, *starts.tolist(), k.size]
        ks = k[bounds[:-1]].tolist()
        for i, (a, b) in enumerate(itertools.pairwise(bounds)):
            if bin_index(steps[a], po) != ks[i] or bin_index(steps[b - 1], po) != ks[i]:
                cols = [c.tolist() for c in (values, *extra)]
                for s, *v in zip(steps, *cols, strict=True):
                    self.add(s, *v)  # pragma: no cover - numpy's log2 disagrees with math's
                return  # pragma: no cover
        bins = self._bins
        cols = (values, *extra)
        for kk, a, b in zip(ks, bounds[:-1], bounds[1:], strict=True):
            old = bins.get(kk)
            if old is None:
                sums = [float(np.cumsum(c[a:b])[-1]) for c in cols]
                bins[kk] = [steps[a] + sum(steps[a + 1 : b]), sums[0], float(b - a), *sums[1:]]
            else:
                old[0] += sum(steps[a:b])
                old[2] += float(b - a)
                for i, c in zip((1, *range(3, 3 + len(extra))), cols, strict=True):
                    old[i] = float(np.cumsum(np.concatenate(([old[i]], c[a:b])))[-1])

    def __len__(self) -> int:
        return len(self._bins)

    def arrays(self) -> tuple[np.ndarray, ...]:
        """Mean step, mean value, count, then the mean of each extra number, per bin."""
        keys = sorted(self._bins)
        if not keys:
            empty = np.empty(0)
            return (empty, empty, np.empty(0, dtype=int), *([empty] * self.extra))
        a = np.array([self._bins[k] for k in keys])
        n = a[:, 2]
        extra = tuple(a[:, i] / n for i in range(3, 3 + self.extra))
        return (a[:, 0] / n, a[:, 1] / n, n.astype(int), *extra)
