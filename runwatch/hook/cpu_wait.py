"""How long the training process's threads waited for a CPU that other processes held:
the time they were runnable but not running (Linux's per-thread scheduler statistics),
at most the CPU time the rest of the host used, per second of wall time.

Why: on a shared machine a run's step time rises when other processes take its cores.
That slowdown is real but it is not the run's fault, and a step-time alarm that cannot
tell the two apart cries wolf on every busy machine. Every thread counts: a PyTorch step
waits for its slowest intra-op thread, not only for the Python one. The cap leaves out a
process competing with itself (more busy threads than cores): on an idle 2-core machine
the tiny-LM example's threads wait 0.07 s/s, and none of it is another process's doing.
The writer reads this
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
"""Seconds the process's threads waited for a CPU per second of an interval, at most the
CPU seconds per second other processes used (0.45: on average 0.45 of a thread was kept
off a core by them; above 1 when several were)."""
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


class CpuWait:
    """The process's CPU wait since the last reading, summed over its threads."""

    def __init__(self, pid: int, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._tasks = f"/proc/{pid}/task"
        self._clock = clock
        self._fds: dict[str, int] = {}  # thread id -> its open schedstat
        self._waited: dict[str, int] = {}  # thread id -> its wait (ns) at the last reading
        self._host = os.open("/proc/stat", os.O_RDONLY)
        self._own = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        self._busy_then = self._others_ticks()
        self._then = clock()
        self._sum_waits()

    @classmethod
    def open(cls, pid: int | None = None) -> CpuWait | None:
        """A reader for process ``pid`` (default: this one), or None if this system does
        not keep per-thread scheduler statistics."""
        try:
            reader = cls(os.getpid() if pid is None else pid)
        except (OSError, ValueError, IndexError) as exc:
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

    def _others_ticks(self) -> int:
        """CPU ticks the host spent busy, less this process's own, so far."""
        host = os.pread(self._host, 256, 0).split(b"\n", 1)[0].split()
        # cpu  user nice system idle iowait irq softirq steal ...: busy is all but idle, iowait
        busy = sum(int(x) for x in host[1:9]) - int(host[4]) - int(host[5])
        own = os.pread(self._own, 1024, 0).rsplit(b")", 1)[1].split()
        return busy - int(own[11]) - int(own[12])  # utime, stime (fields 14 and 15)

    def read(self) -> float | None:
        """Seconds waited for other processes per second since the last reading; None if
        no time passed or the process cannot be read."""
        try:
            added = self._sum_waits()
            busy = self._others_ticks()
        except (OSError, ValueError, IndexError):
            return None
        now = self._clock()
        elapsed, self._then = now - self._then, now
        others, self._busy_then = (busy - self._busy_then) * _TICK_S, busy
        if elapsed <= 0:
            return None
        waited = max(added, 0) / 1e9
        return min(waited, max(others, 0.0)) / (elapsed / 1e9)

    def close(self) -> None:
        """Let go of the statistics files."""
        for fd in [*self._fds.values(), self._host, self._own]:
            os.close(fd)
        self._fds.clear()
        self._tasks = "/nonexistent"
        self._host = self._own = -1
