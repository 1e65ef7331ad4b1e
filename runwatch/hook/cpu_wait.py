"""How long the training process's threads waited for a CPU: the time they were runnable
but not running, per second of wall time, from Linux's per-thread scheduler statistics.

Why: on a shared machine a run's step time rises when other processes take its cores.
That slowdown is real but it is not the run's fault, and a step-time alarm that cannot
tell the two apart cries wolf on every busy machine. Every thread counts: a PyTorch step
waits for its slowest intra-op thread, not only for the Python one. The writer reads this
once per flush (tens of microseconds every 0.25 s, off the training thread) and logs it
as :data:`CPU_WAIT_METRIC` at the first step of the interval it covers; the Monitor holds
the step-time and throughput alarms of steps that waited (``runwatch.detect.busy``).

Where ``/proc/<pid>/task/<tid>/schedstat`` cannot be read (not Linux, a kernel without
scheduler statistics) :meth:`CpuWait.open` returns None and nothing is logged.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger("runwatch.hook")

CPU_WAIT_METRIC = "host_cpu_wait"
"""Seconds the process's threads waited for a CPU per second of an interval (0.45: on
average 0.45 of a thread was kept off a core; above 1 when several were)."""


class CpuWait:
    """The process's CPU wait since the last reading, summed over its threads."""

    def __init__(self, pid: int, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._tasks = f"/proc/{pid}/task"
        self._clock = clock
        self._fds: dict[str, int] = {}  # thread id -> its open schedstat
        self._waited: dict[str, int] = {}  # thread id -> its wait (ns) at the last reading
        self._then = clock()
        self._sum_waits()

    @classmethod
    def open(cls, pid: int | None = None) -> CpuWait | None:
        """A reader for process ``pid`` (default: this one), or None if this system does
        not keep per-thread scheduler statistics."""
        try:
            reader = cls(os.getpid() if pid is None else pid)
        except OSError as exc:
            log.debug("no CPU wait readings: %s", exc)
            return None
        if not reader._fds:
            return None
        return reader

    def _sum_waits(self) -> int:
        """Each live thread's wait added since the last call (a new thread's, since it
        began); the threads that ended are let go."""
        tids = os.listdir(self._tasks)
        added = 0
        waited = {}
        for tid in tids:
            fd = self._fds.get(tid)
            try:
                if fd is None:
                    fd = self._fds[tid] = os.open(f"{self._tasks}/{tid}/schedstat", os.O_RDONLY)
                # schedstat: time on a CPU, time waiting on a run queue (ns), time slices
                now = int(os.pread(fd, 128, 0).split()[1])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended meanwhile
            waited[tid] = now
            added += now - self._waited.get(tid, 0)
        for tid in self._fds.keys() - waited.keys():
            os.close(self._fds.pop(tid))
        self._waited = waited
        return added

    def read(self) -> float | None:
        """Seconds waited per second since the last reading; None if no time passed or
        the process cannot be read."""
        try:
            added = self._sum_waits()
        except OSError:
            return None
        now = self._clock()
        elapsed, self._then = now - self._then, now
        if elapsed <= 0:
            return None
        return max(added, 0) / elapsed

    def close(self) -> None:
        """Let go of the statistics files."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._tasks = "/nonexistent"
