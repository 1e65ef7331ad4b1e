"""A busy host: steps during which the training process waited for a CPU.

The hook logs the process's CPU wait (``host_cpu_wait``: seconds its threads were
runnable but not running, per second) at the first step of each interval. A step whose
interval's wait reaches :data:`BUSY_WAIT` was slowed by other processes on the host, not
by the run: its step time and throughput are *held* (not judged, not learned) by the Monitor,
and :class:`HostBusy` reports the busy stretch itself, at info, with its cause named.
Measured in bench/README-throughput.md.
"""

from __future__ import annotations

import bisect

import numpy as np

from runwatch.detect.base import Detector, Signal, check_number

BUSY_WAIT = 0.1
"""The CPU wait (s/s) from which a step's time is the host's doing, not the run's."""


class HostBusy(Detector):
    """Flags CPU-wait samples of at least ``busy_wait`` (info: the host, not the run).

    >>> d = HostBusy()
    >>> d.update(0, 0.01) is None
    True
    >>> sig = d.update(40, 0.45)
    >>> sig.severity, sig.details["wait"]
    ('info', 0.45)
    """

    name = "host_busy"
    quiet = 2  # samples (one per 0.25 s flush), not steps

    def __init__(self, busy_wait: float = BUSY_WAIT) -> None:
        check_number("busy_wait", busy_wait, low=0.0)
        self.busy_wait = busy_wait
        super().__init__()

    def update(self, step: int, value: float) -> Signal | None:
        if not value >= self.busy_wait:
            return None
        return Signal(
            "info",
            value,
            value,
            0.0,
            0.0,
            self.busy_wait,
            f"the training process's threads waited {value:.2f} s per second for a CPU: "
            "other processes on this host are taking its cores; its step time and "
            "throughput are not judged meanwhile",
            {"wait": value},
        )


class BusyClock:
    """One process's CPU-wait samples: which steps are held.

    A sample at step ``f`` covers the steps from ``f`` to the next sample's step; a step
    is held when the latest sample at or before it reached ``busy_wait``. Points come in
    step order, so only the last samples are kept (``trim``); a batch adds all of its
    samples, asks about its steps, then trims.

    >>> c = BusyClock()
    >>> c.add(0, 0.0); c.add(30, 0.4); c.add(55, 0.02)
    >>> [c.held(s) for s in (10, 30, 54, 55)]
    [False, True, True, False]
    >>> c.held_many(np.array([29, 30, 60])).tolist()
    [False, True, False]
    """

    KEEP = 64

    def __init__(self, busy_wait: float = BUSY_WAIT) -> None:
        self.busy_wait = busy_wait
        self._steps: list[int] = []
        self._busy: list[bool] = []

    def add(self, step: int, wait: float) -> None:
        """A sample; one that does not come after the last (a restart) starts anew."""
        if self._steps and step <= self._steps[-1]:
            self.rewind(step)
        self._steps.append(step)
        self._busy.append(wait >= self.busy_wait)

    def add_many(self, steps: np.ndarray, waits: np.ndarray) -> None:
        """Samples in step order (``add`` one by one)."""
        for step, wait in zip(steps.tolist(), waits.tolist(), strict=True):
            self.add(step, wait)

    def trim(self) -> None:
        """Keep only the last ``KEEP`` samples (those a later point can still be under)."""
        if len(self._steps) > 2 * self.KEEP:
            del self._steps[: -self.KEEP], self._busy[: -self.KEEP]

    def held(self, step: int) -> bool:
        """Whether the point at ``step`` was slowed by a busy host."""
        i = bisect.bisect_right(self._steps, step) - 1
        return i >= 0 and self._busy[i]

    def held_many(self, steps: np.ndarray) -> np.ndarray:
        """``held`` for each of ``steps``, as a bool array."""
        idx = np.searchsorted(np.asarray(self._steps, dtype=np.int64), steps, side="right") - 1
        busy = np.asarray([*self._busy, False], dtype=bool)  # idx -1 reads the False
        return busy[idx]

    def rewind(self, step: int) -> None:
        """The run went back to ``step``: forget the samples from it on."""
        i = bisect.bisect_left(self._steps, step)
        del self._steps[i:], self._busy[i:]
