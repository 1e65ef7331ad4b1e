"""Downsampling that keeps every spike: per step bucket, the min and the max point.

Plain striding or random sampling (TensorBoard keeps 1,000 random samples per tag) drops a
one-step spike in a million steps with near certainty; LTTB keeps the visual shape but may
still pick the wrong point in a dense bucket. Keeping each bucket's argmin and argmax, and the
first non-finite point when there is one (a NaN loss is the most important point on the
chart), guarantees that every extreme survives, in at most ``max_points`` points.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd  # imported where frames are built: the hook's writes need none


def minmax_downsample(frame: pd.DataFrame, max_points: int, x: str = "step") -> pd.DataFrame:
    """Return at most ``max_points`` rows of ``frame`` (sorted by ``x``) keeping extremes.

    >>> import pandas as pd
    >>> steps = np.arange(1_000_000)
    >>> values = np.ones(1_000_000); values[123_457] = 50.0; values[777] = np.nan
    >>> small = minmax_downsample(pd.DataFrame({"step": steps, "value": values}), 4000)
    >>> len(small) <= 4000, 123_457 in set(small["step"]), 777 in set(small["step"])
    (True, True, True)
    """
    if max_points < 3:
        raise ValueError(f"max_points must be >= 3 to keep min, max and NaN, got {max_points}")
    n = len(frame)
    if n <= max_points:
        return frame.reset_index(drop=True)
    values = frame["value"].to_numpy(dtype=np.float64)
    xs = frame[x].to_numpy(dtype=np.float64)
    nonfinite = ~np.isfinite(values)
    per_bucket = 3 if nonfinite.any() else 2
    n_buckets = max_points // per_bucket
    edges = np.linspace(xs[0], xs[-1], n_buckets + 1)
    bucket = np.clip(np.searchsorted(edges, xs, side="right") - 1, 0, n_buckets - 1)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    keep = np.zeros(n, dtype=bool)
    # Finite extremes: NaN/Inf are replaced so that argmin/argmax see only real numbers.
    low = np.where(nonfinite, np.inf, values)
    high = np.where(nonfinite, -np.inf, values)
    ends = np.r_[starts[1:], n]
    keep[segment_argext(low, starts, ends, np.minimum)] = True
    keep[segment_argext(high, starts, ends, np.maximum)] = True
    if per_bucket == 3:
        first_bad = first_flagged(nonfinite, starts, ends)
        keep[first_bad[first_bad >= 0]] = True
    return frame.iloc[np.flatnonzero(keep)].reset_index(drop=True)


def segment_argext(
    values: np.ndarray, starts: np.ndarray, ends: np.ndarray, ufunc: np.ufunc
) -> np.ndarray:
    """Index of each segment's min (or max), vectorised with ``ufunc.reduceat``."""
    ext = ufunc.reduceat(values, starts)
    seg = np.repeat(np.arange(len(starts)), ends - starts)
    hits = np.flatnonzero(values == ext[seg])
    # first hit per segment
    first = np.full(len(starts), -1, dtype=np.int64)
    hit_seg = seg[hits]
    order = np.flatnonzero(np.r_[True, hit_seg[1:] != hit_seg[:-1]])
    first[hit_seg[order]] = hits[order]
    # a segment of only non-finite values has no finite extreme: fall back to its start
    missing = first < 0
    first[missing] = starts[missing]
    return first


def first_flagged(flags: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    idx = np.flatnonzero(flags)
    seg = np.searchsorted(starts, idx, side="right") - 1
    first = np.full(len(starts), -1, dtype=np.int64)
    if len(idx):
        order = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])
        first[seg[order]] = idx[order]
    return first
