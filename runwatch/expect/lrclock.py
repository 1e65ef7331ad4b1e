"""The LR areas of Tissue et al. 2024 as a run goes: S1 (summed LR) and S2 (annealing).

``runwatch.expect.lr_areas`` computes them over a whole logged schedule; the Monitor needs
them point by point, at bounded cost, for the expected-curve detector of each loss series.
An :class:`LRClock` is fed the run's LR as it is logged and answers "S1 and S2 at step s"
from what it has been fed so far: the LR is interpolated linearly between logged steps (the
recurrences of ``lr_areas``, summed in closed form over a gap) and held flat past the last
logged step. Raw LR units: the fits normalise the areas themselves.

Replay gets the same numbers: :func:`areas_at` gives, for each point of a series, what
:meth:`LRClock.areas` answered live when that point came (the LR points fed before it).
"""

from __future__ import annotations

import math
from collections import deque
from functools import cache

import numpy as np

from runwatch.expect._lrclock import Areas
from runwatch.expect.lrlaw import DECAY

MAX_GAP = 50_000
"""Past this many steps the annealing momentum has decayed to nothing (0.999^50000)."""

State = tuple[int, float, float, float, float]
"""(step, lr, S1, S2, momentum) right after an LR point."""


@cache
def _areas() -> Areas:
    """The recurrences (compiled, ``_lrclock.pyx``), made on first use: their table of
    decay sums is not worth forming for a run that logs no LR."""
    return Areas(DECAY, MAX_GAP)


class LRClock:
    """S1 and S2 at any step, from the LR points fed so far.

    Memory is bounded: the last ``keep`` states are kept, which is how far a restart can
    rewind exactly (an older rewind restarts from the oldest state kept).

    Parameters
    ----------
    keep : int
        How many states (one per LR point) to keep for ``areas`` and ``rewind``.

    >>> c = LRClock()
    >>> for s in range(4):
    ...     c.add(s, 1.0 - 0.25 * s)
    >>> s1, s2 = c.areas(3)
    >>> round(s1, 3), round(s2, 4)
    (2.5, 1.499)
    >>> c.areas(5)[0]  # held flat at 0.25 past the last LR point
    3.0
    """

    def __init__(self, keep: int = 4096) -> None:
        self.keep = keep
        self._states: deque[State] = deque(maxlen=keep)

    def __bool__(self) -> bool:
        return bool(self._states)

    @property
    def last(self) -> State | None:
        """The state after the last LR point (None before the first)."""
        return self._states[-1] if self._states else None

    def add(self, step: int, lr: float) -> None:
        """Take the LR logged at ``step`` (finite; steps must not go back, see ``rewind``).

        A repeated step keeps the LR first logged for it.
        """
        step = int(step)
        lr = float(lr)
        if not math.isfinite(lr):
            raise ValueError(f"learning rate at step {step} is {lr}, not a finite number")
        state = _areas().add(self._states[-1] if self._states else None, step, lr)
        if state is not None:
            self._states.append(state)

    def add_many(self, steps: np.ndarray, lrs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``add`` for each finite LR of a series, in order (batch replay's LR feed: the
        same states, by the same compiled step). Returns the index of the point that made
        each new state (an int array) and the states as rows (step, lr, S1, S2, momentum).
        """
        made, states = _areas().advance(
            self.last,
            np.ascontiguousarray(steps, dtype=np.int64),
            np.ascontiguousarray(lrs, dtype=float),
        )
        for step, lr, s1, s2, m in states[-self.keep :].tolist():
            self._states.append((int(step), lr, s1, s2, m))
        return made, states

    def areas(self, step: int) -> tuple[float, float] | None:
        """S1 and S2 at ``step`` from the latest state at or before it (None: no LR yet)."""
        states = self._states
        if not states:
            return None
        st = states[-1]
        if st[0] > step:
            st = next((x for x in reversed(states) if x[0] <= step), states[0])
        return _areas().flat(st, int(step))

    def rewind(self, step: int) -> None:
        """A restart: forget the states at or after ``step`` (the oldest is always kept)."""
        states = self._states
        while len(states) > 1 and states[-1][0] >= step:
            states.pop()


def areas_at(
    states: np.ndarray, state_rows: np.ndarray, rows: np.ndarray, steps: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """What ``LRClock.areas`` answered for points at ``rows``/``steps`` of a replay in
    which the clock made ``states`` (rows of step, lr, S1, S2, momentum) at ``state_rows``
    (NaN where no LR had come yet), by the same compiled step.

    Parameters
    ----------
    states : numpy.ndarray
        The clock's states, one row each, as ``LRClock.add_many`` returns them.
    state_rows : numpy.ndarray
        The row of the replay that made each state, increasing.
    rows, steps : numpy.ndarray
        The points' rows in the replay and their steps.
    """
    if len(states) == 0:
        return np.full(len(rows), math.nan), np.full(len(rows), math.nan)
    idx = np.searchsorted(state_rows, rows, side="left") - 1
    return _areas().flat_many(
        np.ascontiguousarray(states, dtype=float),
        np.ascontiguousarray(idx, dtype=np.int64),
        np.ascontiguousarray(np.asarray(steps).astype(np.int64)),
    )
