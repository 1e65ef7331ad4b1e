"""Rows of a batch as the Monitor's batch path needs them: a code per series, the LR clock's
state at each row, and the order in which episodes opened."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from runwatch.expect.lrclock import LRClock
from runwatch.model import Anomaly


def fold_codes(codes: list[np.ndarray]) -> np.ndarray:
    """A code per row, one per series, from a code per row of each column (the metric's,
    then each label's: ``pd.factorize`` codes, missing values alike): rows equal in every
    column share one, as ``groupby(dropna=False)`` groups them. Folded column by column
    (factorising each column's codes, not its object values, which a groupby would first
    turn into strings)."""
    out = codes[0]
    for c in codes[1:]:
        out = pd.factorize(out * (int(c.max()) + 1) + c)[0]  # < n: cannot overflow
    return out


def clock_states(clock: LRClock) -> tuple[np.ndarray, np.ndarray]:
    """The clock's state before a batch, as made by a row before all of it (row -1)."""
    last = clock.last
    if last is None:
        return np.empty((0, 5)), np.empty(0, dtype=np.int64)
    return np.array([last], dtype=float), np.array([-1], dtype=np.int64)


def feed_clock(
    clock: LRClock, rows: np.ndarray, st: np.ndarray, v: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Feed the LR series to the clock as ``Monitor.update`` does; return each state it
    made (rows of step, lr, S1, S2, momentum) and the row that made it, after the state it
    had before (row -1)."""
    before, before_rows = clock_states(clock)
    made, states = clock.add_many(st, v)
    return np.concatenate((before, states)), np.concatenate((before_rows, rows[made]))


@dataclass
class OpenOrder:
    """Where a batch's episodes opened, so they can be listed in the order streaming
    row by row would have opened them; and the spikes whose precursor links wait until
    every series has been fed."""

    row: int = 0
    """The row being judged."""
    order: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    """id(episode) -> (row, detector index, 0 for an episode / 1 for a precursor link)."""
    deferred: list[tuple[int, Any, int, Anomaly]] = field(default_factory=list)
    """(row, series, step, spike episode) to link once all series are fed."""
