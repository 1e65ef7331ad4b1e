"""How long the training thread waited for a CPU: the share of wall time it was runnable
but not running, from Linux's per-thread scheduler statistics.

Why: on a shared machine a run's step time rises when other processes take its cores.
That slowdown is real but it is not the run's fault, and a step-time alarm that cannot
tell the two apart cries wolf on every busy machine. The writer reads this once per flush
(a few microseconds every 0.25 s, off the training thread) and logs it as
:data:`CPU_WAIT_METRIC` at the first step of the interval it covers; the Monitor holds the
step-time and throughput alarms of steps whose thread waited (``runwatch.detect.busy``).

Where ``/proc/<pid>/task/<tid>/schedstat`` cannot be read (not Linux, a kernel without
scheduler statistics) :meth:`CpuWait.open` returns None and nothing is logged.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger("runwatch.hook")

CPU_WAIT_METRIC = "host_cpu_wait"
"""The share (0-1) of an interval the training thread spent waiting for a CPU."""


class CpuWait:
    """The training thread's CPU wait, as a share of the time since the last reading."""

    def __init__(self, fd: int, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._fd = fd
        self._clock = clock
        self._last = (clock(), self._waited_ns())

    @classmethod
    def open(cls, tid: int | None = None) -> CpuWait | None:
        """A reader for thread ``tid`` (default: the calling thread), or None if this
        system does not keep per-thread scheduler statistics."""
        tid = threading.get_native_id() if tid is None else tid
        path = f"/proc/{os.getpid()}/task/{tid}/schedstat"
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            log.debug("no CPU wait readings: %s", exc)
            return None
        try:
            return cls(fd)
        except (OSError, ValueError) as exc:
            os.close(fd)
            log.debug("no CPU wait readings from %s: %s", path, exc)
            return None

    def _waited_ns(self) -> int:
        # schedstat: time on the CPU, time waiting on a run queue (both ns), time slices
        return int(os.pread(self._fd, 128, 0).split()[1])

    def read(self) -> float | None:
        """The share of the time since the last reading that the thread waited for a CPU;
        None if no time passed or the thread is gone."""
        try:
            waited = self._waited_ns()
        except (OSError, ValueError, IndexError):
            return None
        now = self._clock()
        then, waited_then = self._last
        self._last = (now, waited)
        if now <= then:
            return None
        return min(max((waited - waited_then) / (now - then), 0.0), 1.0)

    def close(self) -> None:
        """Let go of the statistics file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
