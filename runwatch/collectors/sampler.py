"""The system-metrics sampler: a background thread that polls the collectors at an interval
and logs what they read through the run, under their own labels.

Why a thread of its own: a poll of eight GPUs is a few hundred NVML calls, and the training
loop must not pay for them; the sampler only ever calls ``run.log_labeled`` and ``run.event``,
which never block. Why 10 s by default: hardware faults (heat, ECC, power capping) build over
minutes, and at 10 s the collector's cost is negligible (``bench/results/fleet.md``).

Every poll runs inside one guard: a collector bug or a GPU falling off the bus is logged and
counted, and never reaches the training run.

>>> from runwatch.collectors.recorded_nvml import RecordedNvml
>>> class Sink:
...     def __init__(self): self.points, self.events = [], []
...     def log_labeled(self, data, labels, step=None): self.points.append((labels, data))
...     def event(self, kind, step=None, message="", **attrs): self.events.append((kind, attrs))
>>> nv = RecordedNvml.h100(gpus=2, frames=[{}, {"xids": [79]}])
>>> sink = Sink()
>>> s = Sampler(sink, nvml=nv, host=False)
>>> s.poll_once(); s.poll_once()
>>> len(sink.points), sink.events[0]
(4, ('xid', {'xid': 79, 'gpu': 0, 'critical': True}))
>>> s.stop()
True
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from runwatch.collectors.host import HostCollector
from runwatch.collectors.nvml import NvmlCollector
from runwatch.guard import Guard
from runwatch.worker import Worker

log = logging.getLogger("runwatch.collectors")

DEFAULT_INTERVAL_S = 10.0


class LabeledSink(Protocol):
    """What a collector logs into: a Run (``log_labeled`` and ``event`` never block)."""

    def log_labeled(
        self, data: dict[str, Any], labels: dict[str, Any], step: int | None = None
    ) -> None: ...

    def event(
        self, kind: str, step: int | None = None, message: str = "", **attrs: Any
    ) -> None: ...


class Sampler:
    """Polls NVML (when present) and the host every ``interval_s`` seconds on a daemon thread.

    ``nvml`` is the NVML module (default ``pynvml``; a :class:`RecordedNvml` in tests); absent
    NVML means one info message and host metrics only. ``clock`` times the host I/O rates.
    ``start()`` begins polling (the first poll at once); ``stop(timeout)`` ends it.
    """

    def __init__(
        self,
        run: LabeledSink,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        nvml: Any = None,
        gpu: bool = True,
        host: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (isinstance(interval_s, (int, float)) and interval_s > 0):
            raise ValueError(f"interval_s={interval_s!r} is invalid; valid values: a number > 0")
        self.run = run
        self.interval_s = float(interval_s)
        self.clock = clock
        self.polls = 0
        self.cpu_s = 0.0
        self._guards: dict[str, Guard] = {}
        # The first poll at once, then one every interval_s; stop() wakes it at once.
        self._worker = Worker(
            "runwatch-sampler",
            tick=self.poll_once,
            interval=self.interval_s,
            first_tick=0.0,
            logger=log,
        )
        self._lock = threading.Lock()
        self.gpus: NvmlCollector | None = None
        self.host: HostCollector | None = None
        # Decided once: which collectors exist. The poll loop never asks again.
        if gpu:
            collector = NvmlCollector(nvml)
            with self._guard("opening NVML"):
                if collector.open():
                    self.gpus = collector
        if host:
            with self._guard("opening the host collector"):
                self.host = HostCollector(clock=clock)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Sampler:
        """Start the polling thread (a no-op while the interpreter shuts down)."""
        self._worker.start()
        return self

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop polling and release NVML; True if the thread ended within ``timeout`` s."""
        ended = self._worker.close(timeout)
        if ended and self.gpus is not None:
            with self._lock, self._guard("closing NVML"):
                self.gpus.close()
        return ended

    @property
    def running(self) -> bool:
        return self._worker.alive

    @property
    def errors(self) -> int:
        """Errors caught so far (each site's first is logged, see ``runwatch.guard``)."""
        return sum(guard.count for guard in self._guards.values()) + self._worker.errors.count

    def stats(self) -> dict[str, Any]:
        """Polls made, errors caught, CPU seconds spent polling (this thread's time)."""
        return {
            "polls": self.polls,
            "errors": self.errors,
            "cpu_s": self.cpu_s,
            "cpu_s_per_poll": self.cpu_s / self.polls if self.polls else None,
            "core_fraction": (self.cpu_s / self.polls) / self.interval_s if self.polls else None,
            "gpus": len(self.gpus.devices) if self.gpus is not None else 0,
        }

    # -- polling -----------------------------------------------------------------------------
    def poll_once(self) -> None:
        """Read every collector once and log the readings (what the thread does each tick)."""
        started = time.thread_time()
        with self._lock:
            if self.gpus is not None and self.gpus.available:
                with self._guard("polling the GPUs"):
                    for labels, values in self.gpus.poll():
                        if values:
                            self.run.log_labeled(values, labels)
                with self._guard("reading XID events"):
                    for xid in self.gpus.poll_xids():
                        self.run.event(
                            "xid",
                            message=xid.message,
                            xid=xid.xid,
                            gpu=xid.gpu,
                            critical=xid.critical,
                        )
            if self.host is not None:
                with self._guard("polling the host"):
                    values = self.host.poll()
                    if values:
                        self.run.log_labeled(values, {})
        self.polls += 1
        self.cpu_s += time.thread_time() - started

    def _guard(self, what: str) -> Guard:
        """This sampler's guard for ``what``: a collector bug or a GPU falling off the bus is
        logged (once per site, as a warning: it is often the hardware) and counted."""
        guard = self._guards.get(what)
        if guard is None:
            guard = self._guards[what] = Guard(f"in system metrics, {what}", log, logging.WARNING)
        return guard


def start_system_metrics(
    run: LabeledSink,
    interval_s: float = DEFAULT_INTERVAL_S,
    nvml: Any = None,
    clock: Callable[[], float] = time.monotonic,
) -> Sampler:
    """Start polling GPUs (NVML) and the host for ``run`` every ``interval_s`` seconds.

    What ``runwatch.init(system_metrics=True)`` calls; ``sampler.stop()`` ends it (call it
    before ``run.finish()`` so the last readings are written).
    """
    return Sampler(run, interval_s=interval_s, nvml=nvml, clock=clock).start()
