"""The writer: drains the log queue, checks and batches points, writes the backend.

Everything ``run.log`` skipped happens here: step and name checks, value coercion (including
``.item()`` on tensors), grouping by series, restart detection (a step lower than the last
starts a new attempt), and one store transaction per flush. A flush happens every
``flush_interval`` seconds or when ``max_batch_points`` are buffered, so a point waits at most
about ``flush_interval`` plus one write before it is durable.

A backend that fails (a store locked, read-only or on a full disk; a server down) is retried
with backoff a bounded number of times; then the batch is dropped and counted under the
backend's reason, and the run goes on.

Step context (``run.log(..., context=)``, ``run.context``) arrives as :class:`ContextUpdate`
items: the writer checks the values, merges them into the context in force at the next logged
step, and keeps a row (:class:`~runwatch.store.context.StepContext`) only when the merged
context differs from the last one kept, so an unchanged context costs nothing downstream.

The thread, its queue, the stop and the two-phase wait at finish are a
:class:`runwatch.worker.Worker`; this module is its handler (``_take``, one queued call) and
its tick (``_flush``).
"""

from __future__ import annotations

import logging
import operator
import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from runwatch.guard import Guard
from runwatch.hook.backend import Backend, BackendError
from runwatch.hook.cpu_wait import CPU_WAIT_METRIC, CpuWait
from runwatch.hook.drops import DropCounter
from runwatch.hook.values import RefusedValue, name_problem, to_float
from runwatch.model import Event, SeriesBatch, SeriesPoints
from runwatch.store import labels_key
from runwatch.store.context import (
    MAX_CONTEXT_KEYS,
    MAX_CONTEXT_TEXT,
    StepContext,
    context_problem,
)
from runwatch.worker import Worker

log = logging.getLogger("runwatch.hook")

_REFUSED_NAME = object()
_OTHER_RANKS_METRIC = object()


class BatchSink(Protocol):
    """Gets each written batch and its events in the writer thread (live detection); it must
    return quickly."""

    def __call__(self, batch: SeriesBatch, events: list[Event]) -> None: ...


class ContextUpdate:
    """Queued by ``run.log(context=)`` and ``run.context()``: ``values`` to merge into the
    step context at the next logged step (None removes a key), unchecked until the writer;
    ``log`` is the ``run.log`` call it came with, ``(step, time, data)``, if any. Its fields
    are set after it is made: no ``__init__`` to call in the training thread."""

    __slots__ = ("log", "time", "values")

    values: Any
    time: float
    log: tuple[Any, float, dict[Any, Any]] | None


def _plain(value: Any) -> Any:
    """A checked context value as its plain type (a NumPy float64 is a float subclass)."""
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return value if type(value) is kind else kind(value)
    return value


class Flow:
    """Counters shared by the training thread (``queued``) and the writer (``drained``)."""

    __slots__ = ("drained", "queued", "written")

    def __init__(self) -> None:
        self.queued = 0
        self.drained = 0
        self.written = 0


class _SeriesBuffer:
    __slots__ = ("labels", "metric", "steps", "times", "values")

    def __init__(self, metric: str, labels: dict[str, Any]) -> None:
        self.metric = metric
        self.labels = labels
        self.steps: list[int] = []
        self.times: list[float] = []
        self.values: list[float] = []


class Writer:
    """The one thing that talks to the run's backend, on its own thread (``self.worker``).

    ``worker.put`` is the run's queue; ``worker.start()``, ``worker.flush(timeout)`` and
    ``worker.close(timeout)`` run it (see the module docstring).
    """

    def __init__(
        self,
        *,
        backend: Backend,
        attempt: int,
        labels: dict[str, Any],
        flow: Flow,
        drops: DropCounter,
        flush_interval: float = 0.25,
        max_batch_points: int = 250_000,
        retries: int = 3,
        retry_backoff: float = 0.1,
        sink: BatchSink | None = None,
        keep_metric: Callable[[str], bool] | None = None,
        cpu_wait: CpuWait | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._cpu_wait = cpu_wait
        self._interval_step: int | None = None  # the first step logged since the last flush
        self.attempt = attempt
        self._labels = labels
        self._flow = flow
        self._drops = drops
        self._max_batch = max_batch_points
        self._retries = retries
        self._backoff = retry_backoff
        self._sink = sink
        self._keep_metric = keep_metric
        self._buffers: dict[str, Any] = {}
        if cpu_wait is not None:
            # First of the buffers, so its series sorts first within a step on replay: the
            # Monitor knows a step's CPU wait before it judges the step's time.
            self._buffers[CPU_WAIT_METRIC] = _SeriesBuffer(CPU_WAIT_METRIC, labels)
        self._events: list[Event] = []
        self._contexts: list[StepContext] = []
        self._context: dict[str, Any] = {}  # the step context in force
        self._context_kept: dict[str, Any] | None = None  # the last one stored
        self._context_pending: dict[str, Any] | None = None  # to merge at the next step
        self._context_keys: set[str] = set()  # keys already checked
        self._buffered = 0
        self._sink_guard = Guard("feeding live detection a batch", log)
        self.last_step: int | None = None
        # Flushed every flush_interval s, when a batch is full, on run.flush() and at the
        # stop. The first flush has a random phase, so that hundreds of ranks started
        # together do not all flush (and post to the server) at the same instant.
        self.worker = Worker(
            "runwatch-writer",
            self._take,
            tick=self._flush,
            interval=flush_interval,
            first_tick=flush_interval * (0.5 + random.random()),
            on_stop=self._last_flush,
            drops=drops,
            backlog=self._unwritten,
            unit="points",
            clock=clock,
            logger=log,
        )

    def _unwritten(self) -> int:
        return self._flow.queued - self._flow.written

    # -- one queued item (on the worker's thread) ----------------------------------------------
    def _take(self, item: Any) -> bool:
        """Take one queued call; True when the batch is full (the worker flushes at once)."""
        if type(item) is tuple:
            if len(item) == 3:
                self._take_log(*item)
            else:
                self._take_labeled(*item)
        elif type(item) is ContextUpdate:
            self._take_context(item)
            if item.log is not None:
                self._take_log(*item.log)
        elif isinstance(item, Event):
            if item.rank is None and item.host is None and self._labels:
                # an event belongs to the process that logged it: its rank and host
                item = replace(item, rank=self._labels.get("rank"), host=self._labels.get("host"))
            self._events.append(item)
        return self._buffered >= self._max_batch

    def _take_log(self, step: Any, stamp: float, data: dict[Any, Any]) -> None:
        n = len(data)
        self._flow.drained += n
        if type(step) is not int:
            try:
                step = operator.index(step.item() if hasattr(step, "item") else step)
            except (TypeError, ValueError, RuntimeError):
                self._refuse_step(step, n)
                return
        if step < 0:
            self._refuse_step(step, n)
            return
        if self.last_step is not None and step < self.last_step:
            self._restart(step)
        self.last_step = step
        if self._interval_step is None:
            self._interval_step = step
        if self._context_pending is not None:
            self._apply_context(step, stamp)
        buffers = self._buffers
        for name, value in data.items():
            buf = buffers.get(name)
            if buf is None:
                buf = self._new_buffer(name, name, self._labels)
            self._append(buf, name, step, stamp, value)
        self._buffered += n

    def _take_labeled(
        self, step: int, stamp: float, data: dict[Any, Any], labels: dict[str, Any]
    ) -> None:
        """Points of a collector (a GPU, a host): their own labels, no restart detection."""
        self._flow.drained += len(data)
        merged = {**self._labels, **labels}
        suffix = labels_key(merged)
        for name, value in data.items():
            key = (name, suffix)
            buf = self._buffers.get(key)
            if buf is None:
                buf = self._new_buffer(key, name, merged)
            self._append(buf, name, step, stamp, value)
        self._buffered += len(data)

    def _append(self, buf: Any, name: Any, step: int, stamp: float, value: Any) -> None:
        if buf is _REFUSED_NAME:
            self._drops.add("bad_name")
            return
        if buf is _OTHER_RANKS_METRIC:  # by policy, not an error: not counted as dropped
            return
        if type(value) is not float:
            try:
                value = to_float(value)
            except RefusedValue as refused:
                self._drops.add("bad_value")
                self._drops.warn_once(
                    f"value:{name}",
                    "runwatch: metric %r got a %s, not a number; dropped and counted "
                    "(bad_value) now and every time it happens again",
                    name,
                    refused.kind,
                )
                return
        buf.steps.append(step)
        buf.times.append(stamp)
        buf.values.append(value)

    def _take_context(self, update: ContextUpdate) -> None:
        """Check an update's keys and values; keep the good ones for the next step. The
        training thread queues only dicts (``Run.log`` and ``Run.context`` refuse the rest)."""
        values = update.values
        pending = self._context_pending if self._context_pending is not None else {}
        for key, value in values.items():
            if type(value) is str and key in self._context_keys and len(value) <= MAX_CONTEXT_TEXT:
                pending[key] = value  # the common case: a known key, a short str
                continue
            problem = context_problem(key, value)
            full = len(self._context_keys) >= MAX_CONTEXT_KEYS
            if problem is None and full and key not in self._context_keys:
                problem = f"the context already had {MAX_CONTEXT_KEYS} keys, the most it may"
            if problem is not None:
                self._drops.add("bad_context")
                self._drops.warn_once(
                    f"context:{key!r}",
                    "runwatch: step context %r: %s; that key is dropped and counted "
                    "(bad_context) now and every time it happens again",
                    key,
                    problem,
                )
                continue
            pending[key] = _plain(value)
            self._context_keys.add(key)
        self._context_pending = pending

    def _apply_context(self, step: int, stamp: float) -> None:
        """Merge what is pending into the context in force at ``step``; keep a row if the
        result differs from the last row kept."""
        context = self._context
        for key, value in self._context_pending.items():  # type: ignore[union-attr]
            if value is None:
                context.pop(key, None)
            else:
                context[key] = value
        self._context_pending = None
        if context == self._context_kept:
            return
        kept = dict(context)
        self._context_kept = kept
        row = StepContext(step, self._labels.get("rank"), stamp, kept)
        rows = self._contexts
        if rows and rows[-1].step == step:  # changed twice at one step: the last one holds
            rows[-1] = row
        else:
            rows.append(row)

    def _refuse_step(self, step: Any, n: int) -> None:
        self._drops.add("bad_step", n)
        self._drops.warn_once(
            "step",
            "runwatch: step %r is not a non-negative integer; that call's %d points "
            "were dropped (bad_step)",
            step,
            n,
        )

    def _new_buffer(self, key: Any, name: Any, labels: dict[str, Any]) -> Any:
        problem = name_problem(name)
        if problem is not None:
            self._buffers[key] = _REFUSED_NAME
            self._drops.warn_once(
                f"name:{name!r}",
                "runwatch: metric name %r %s; its points are dropped (bad_name)",
                name,
                problem,
            )
            return _REFUSED_NAME
        if self._keep_metric is not None and not self._keep_metric(name):
            # a run-level metric on a rank other than 0: rank 0 logs it (runwatch.hook.ranks)
            self._buffers[key] = _OTHER_RANKS_METRIC
            return _OTHER_RANKS_METRIC
        buf = _SeriesBuffer(name, labels)  # its series row is made at flush time
        self._buffers[key] = buf
        return buf

    def _restart(self, step: int) -> None:
        """The step went back: the process resumed from a checkpoint; start a new attempt."""
        self._flush()
        previous = self.last_step
        message = f"step went back from {previous} to {step}: new attempt (restart)"
        try:
            self.attempt = self._backend.begin_attempt(step, message)
        except BackendError as exc:
            self.attempt += 1
            log.warning("runwatch: could not record the restart: %s", exc)
        log.info("runwatch: %s", message)
        if self._context:  # the new attempt starts with the context in force, stored again
            self._context_kept = None
            if self._context_pending is None:
                self._context_pending = {}
        self._notify_sink([], [Event("restart", step, time.time(), message)])

    # -- flushing ----------------------------------------------------------------------------
    def _flush(self) -> None:
        sampled = self._cpu_wait is not None and self._sample_cpu_wait()
        batch: list[SeriesPoints] = []
        for buf in self._buffers.values():
            if buf is _REFUSED_NAME or buf is _OTHER_RANKS_METRIC or not buf.steps:
                continue
            n = len(buf.steps)
            batch.append(
                SeriesPoints(
                    buf.metric,
                    buf.labels,
                    np.fromiter(buf.steps, dtype=np.int64, count=n),
                    np.fromiter(buf.times, dtype=np.float64, count=n),
                    np.fromiter(buf.values, dtype=np.float64, count=n),
                )
            )
            buf.steps, buf.times, buf.values = [], [], []
        events, self._events = self._events, []
        contexts, self._contexts = self._contexts, []
        self._buffered = 0
        if not batch and not events and not contexts:
            return
        n_points = sum(len(series.steps) for series in batch) - sampled
        if self._write_with_retries(batch, events, n_points, contexts):
            self._flow.written += n_points
            self._notify_sink(batch, events)
        elif contexts:  # lost with the batch: store the context in force again next step
            self._context_kept = None
            if self._context_pending is None:
                self._context_pending = {}

    def _last_flush(self) -> None:
        self._flush()
        if self._cpu_wait is not None:
            self._cpu_wait.close()

    def _sample_cpu_wait(self) -> bool:
        """The training thread's CPU wait since the last sample, as a point at the first
        step logged since then; nothing while no step is logged. True: a point was added
        (it is not counted among the run's logged points)."""
        step, self._interval_step = self._interval_step, None
        if step is None:
            return False
        share = self._cpu_wait.read()  # type: ignore[union-attr]
        if share is None:
            return False
        buf = self._buffers[CPU_WAIT_METRIC]
        buf.steps.append(step)
        buf.times.append(time.time())
        buf.values.append(share)
        return True

    def _notify_sink(self, batch: SeriesBatch, events: list[Event]) -> None:
        if self._sink is None:
            return
        with self._sink_guard:  # detection must never cost the run its points
            self._sink(batch, events)

    def _write_with_retries(
        self, batch: SeriesBatch, events: list[Event], n: int, contexts: list[StepContext]
    ) -> bool:
        delay = self._backoff
        for attempt in range(self._retries + 1):
            try:
                if contexts:  # only then: a backend written before step context still works
                    self._backend.write(self.attempt, batch, events, contexts=contexts)
                else:
                    self._backend.write(self.attempt, batch, events)
                return True
            except BackendError as exc:
                error = exc
                if not exc.retry:
                    break
                if attempt < self._retries:
                    time.sleep(delay)
                    delay *= 2
        self._drops.add(error.reason, n)
        self._drops.warn_once(
            f"{error.reason}:{error}",
            "runwatch: could not write %d points to %s (%s); dropped and counted (%s)",
            n,
            self._backend.location,
            error,
            error.reason,
        )
        return False
