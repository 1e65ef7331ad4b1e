"""The writer: drains the log queue, checks and batches points, writes the backend.

Everything ``run.log`` skipped happens here: step and name checks, value coercion (including
``.item()`` on tensors), grouping by series, restart detection (a step lower than the last
starts a new attempt), and one store transaction per flush. The thread wakes on its own clock
(:class:`runwatch.hook.drain.Drain`, never on a ``run.log``) every ``flush_interval`` seconds,
takes what is queued and writes it, and writes at once when ``max_batch_points`` are
buffered, so a point waits at most about ``flush_interval`` plus one write before it is
durable (at most 0.25 s plus one write while the training thread holds the GIL without a
break, see ``runwatch.hook.drain``). The common call (plain int step, float values, the
same names as its neighbours) is taken a whole run of calls at a time, column by column
(:meth:`Writer._take_many`), so the writer holds the GIL about half a microsecond per call.

A backend that fails (a store locked, read-only or on a full disk; a server down) is retried
with backoff a bounded number of times; then the batch is dropped and counted under the
backend's reason, and the run goes on.

Step context (``run.log(..., context=)``, ``run.context``) arrives as :class:`ContextUpdate`
items: the writer checks the values, merges them into the context in force at the next logged
step, and keeps a row (:class:`~runwatch.store.context.StepContext`) only when the merged
context differs from the last one kept, so an unchanged context costs nothing downstream.

The thread, its queue, the stop and the two-phase wait at finish are a
:class:`runwatch.hook.drain.Drain`; this module is its handler (``_take_many``, the queued
calls) and its tick (``_flush``).
"""

from __future__ import annotations

import itertools
import logging
import operator
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from runwatch.guard import Guard
from runwatch.hook._log_gate import Flow
from runwatch.hook.backend import Backend, BackendError
from runwatch.hook.cpu_wait import CPU_WAIT_METRIC, CpuWait
from runwatch.hook.drain import Drain, Followed
from runwatch.hook.drops import DropCounter
from runwatch.hook.values import RefusedValue, name_problem, to_float
from runwatch.model import Event, SeriesBatch, SeriesPoints
from runwatch.store import labels_key, store_label
from runwatch.store.context import (
    MAX_CONTEXT_KEYS,
    MAX_CONTEXT_TEXT,
    StepContext,
    context_problem,
)

log = logging.getLogger("runwatch.hook")

_REFUSED_NAME = object()
_OTHER_RANKS_METRIC = object()
_NUMBERS = frozenset({float, int})  # what the column path takes; the rest goes one by one
_chain = itertools.chain.from_iterable
MAX_DRAIN_INTERVAL_S = 0.25
"""The longest the writer stretches its interval to when the training thread holds the GIL
(``runwatch.hook.drain``): the old fixed interval, so such a loop pays no more than before
and loses no more on SIGKILL."""
CPU_WAIT_INTERVAL_S = 0.25
"""Seconds between CPU wait samples: as before the writer drained on its own clock, because
the busy-host detector counts its quiet time in samples (``runwatch.detect.busy``)."""


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


class _SeriesBuffer:
    __slots__ = ("labels", "metric", "steps", "times", "values")

    def __init__(self, metric: str, labels: dict[str, Any]) -> None:
        self.metric = metric
        self.labels = labels
        self.steps: list[int] = []
        self.times: list[float] = []
        self.values: list[float] = []


@dataclass(frozen=True)
class WriterSettings:
    """A run's writer as ``runwatch.init`` sets it up. The writer is built from it in the
    training process, or, sent through the pipe, in runwatch's process beside it
    (``runwatch.live_process``): one place for both."""

    attempt: int
    labels: dict[str, Any]
    keep_metric: Callable[[str], bool] | None
    flush_interval: float
    retries: int
    cpu_wait: bool
    """Log the CPU wait of the training process (``runwatch.hook.cpu_wait``)."""

    def build(
        self,
        backend: Backend,
        *,
        flow: Flow,
        drops: DropCounter,
        sink: BatchSink | None,
        pid: int | None = None,
    ) -> Writer:
        """The writer; ``pid`` is the training process (default: this one)."""
        return Writer(
            backend=backend,
            attempt=self.attempt,
            labels=dict(self.labels),
            keep_metric=self.keep_metric,
            flow=flow,
            drops=drops,
            flush_interval=self.flush_interval,
            retries=self.retries,
            sink=sink,
            cpu_wait=CpuWait.open(pid) if self.cpu_wait else None,
        )


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
        flush_interval: float = 0.08,
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
        self._clock = clock
        self._cpu_wait_due = clock() + CPU_WAIT_INTERVAL_S
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
        self._unjudged: list[tuple[SeriesBatch, list[Event]]] = []  # written, not yet judged
        self._contexts: list[StepContext] = []
        self._context: dict[str, Any] = {}  # the step context in force
        self._context_kept: dict[str, Any] | None = None  # the last one stored
        self._context_pending: dict[str, Any] | None = None  # to merge at the next step
        self._context_keys: set[str] = set()  # keys already checked
        self._buffered = 0
        self._followed = Followed(flow)
        self._sink_guard = Guard("feeding live detection a batch", log)
        self.last_step: int | None = None
        # Drained and flushed every flush_interval s, when a batch is full, on run.flush()
        # and at the stop. The first drain has a random phase, so that hundreds of ranks
        # started together do not all flush (and post to the server) at the same instant.
        self.worker = Drain(
            "runwatch-writer",
            self._take_many,
            tick=self._flush,
            flush=self._flush_all,
            interval=flush_interval,
            max_interval=MAX_DRAIN_INTERVAL_S,
            first_tick=flush_interval * (0.5 + random.random()),
            on_stop=self._last_flush,
            drops=drops,
            backlog=self._unwritten,
            unit="points",
            logger=log,
        )

    def follow(self, source: Callable[[], list[Any]]) -> None:
        """Take ``source()``'s items at every drain (``Run.follow``, :class:`Followed`)."""
        self._followed.add(self.worker, source)

    def _unwritten(self) -> int:
        return self._flow.queued - self._flow.written

    # -- the queued calls (on the worker's thread) ---------------------------------------------
    def _take_many(self, items: list[Any]) -> bool:
        """Take the queued calls in order; True when the batch is full (flush at once).

        Runs of plain ``run.log`` calls with the same names go by :meth:`_take_columns`;
        anything else (events, context, collectors, odd steps or values) one by one."""
        start = 0
        n = len(items)
        while start < n:
            end = start
            while end < n and type(items[end]) is tuple and len(items[end]) == 3:
                end += 1
            if end - start > 1:
                self._take_run(items[start:end] if start or end < n else items)
            elif end > start:
                self._take_one(items[start])
            if end < n:
                self._take_one(items[end])
                end += 1
            start = end
        return self._buffered >= self._max_batch

    def _take_one(self, item: Any) -> None:
        try:
            self._take(item)
        except Exception as exc:  # one bad item, logged and counted; the rest go on
            self.worker.errors.report(exc)

    def _take_run(self, run: list[tuple[Any, float, dict[Any, Any]]]) -> None:
        """Plain ``run.log`` calls: split where the names change, each part by columns."""
        keys = list(map(tuple, (item[2] for item in run)))
        start = 0
        for i in range(1, len(keys) + 1):
            if i == len(keys) or keys[i] != keys[start]:
                part = run[start:i]
                if len(part) == 1 or not self._take_columns(part, keys[start]):
                    for item in part:
                        self._take_one(item)
                start = i

    def _take_columns(self, run: list[tuple[Any, float, dict[Any, Any]]], names: tuple) -> bool:
        """Calls with the same ``names``, int steps that never go back and float or int
        values, taken column by column in C loops; False (nothing taken) when the run is
        not that, and the calls go one by one."""
        if self._context_pending is not None or not names:
            return False
        steps = [item[0] for item in run]
        if set(map(type, steps)) != {int}:
            return False
        low = steps[0] if self.last_step is None else self.last_step
        if steps[0] < low or steps[0] < 0 or steps != sorted(steps):
            return False
        flat = list(_chain(item[2].values() for item in run))
        if not set(map(type, flat)) <= _NUMBERS:
            return False
        k = len(names)
        try:
            columns = np.array(flat, dtype=np.float64).reshape(-1, k).T.tolist()
        except (OverflowError, ValueError, TypeError):  # an int too large for a float
            return False
        n = len(run)
        self._flow.drained += n * k
        self.last_step = steps[-1]
        if self._interval_step is None:
            self._interval_step = steps[0]
        times = [item[1] for item in run]
        buffers = self._buffers
        for name, values in zip(names, columns, strict=True):
            buf = buffers.get(name)
            if buf is None:
                buf = self._new_buffer(name, name, self._labels)
            if buf is _REFUSED_NAME:
                self._drops.add("bad_name", n)
                continue
            if buf is _OTHER_RANKS_METRIC:
                self._drops.add("other_rank", n)
                continue
            buf.steps.extend(steps)
            buf.times.extend(times)
            buf.values.extend(values)
        self._buffered += n * k
        return True

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
        if buf is _OTHER_RANKS_METRIC:  # by policy, counted; the policy warned once
            self._drops.add("other_rank")
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
        self._flush_all()
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
        """The clock's tick: write what is buffered; judge it live when a CPU wait sample
        is due (every 0.25 s), or at once when the run takes no samples."""
        self._write_buffered(judge=self._clock() >= self._cpu_wait_due)

    def _flush_all(self) -> None:
        """``run.flush()``, a restart, the stop: write and judge everything."""
        self._write_buffered(judge=True)

    def _write_buffered(self, judge: bool) -> None:
        """Write the buffers in one transaction, then maybe hand them to live detection.

        Why live detection may lag the store: a step's time is judged only once the CPU
        wait sample covering it is known (``runwatch.detect.busy``), and a sample reads
        every thread's scheduler statistics, one system call (one GIL hand-over) each, too
        dear for every 0.08 s drain. So batches written since the last sample wait, and go
        to detection together with the next one, merged (as the 0.25 s batches they were
        before), so live judges what replay of the store judges."""
        sampled = False
        if judge and self._cpu_wait is not None:
            if self._buffered:
                self._cpu_wait_due = self._clock() + CPU_WAIT_INTERVAL_S
                sampled = self._sample_cpu_wait()
            else:
                # Nothing new to write: judge what waits without a sample. A sample alone
                # would be a point at an old step, the batch's (and the run's) last step;
                # its steps stay under the previous sample, live and on replay alike.
                self._interval_step = None
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
        if batch or events or contexts:
            n_points = sum(len(series.steps) for series in batch) - sampled
            if self._write_with_retries(batch, events, n_points, contexts):
                self._flow.written += n_points
                if self._sink is not None and (batch or events):
                    self._unjudged.append((batch, events))
            elif contexts:  # lost with the batch: store the context in force again next step
                self._context_kept = None
                if self._context_pending is None:
                    self._context_pending = {}
        if judge or self._cpu_wait is None:
            self._judge()

    def _judge(self) -> None:
        """Hand the batches written since the last judgement to live detection, as one."""
        pending, self._unjudged = self._unjudged, []
        if len(pending) == 1:
            self._notify_sink(*pending[0])
        elif pending:
            self._notify_sink(*_merge(pending))

    def _last_flush(self) -> None:
        self._flush_all()
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
            store_label(self._backend.location),
            error,
            error.reason,
        )
        return False


def _merge(batches: list[tuple[SeriesBatch, list[Event]]]) -> tuple[SeriesBatch, list[Event]]:
    """Batches written one after another as one: each series' points end to end, in order,
    CPU wait first (the Monitor reads a step's wait before its time)."""
    parts: dict[tuple[str, str], list[SeriesPoints]] = {}
    events: list[Event] = []
    for batch, batch_events in batches:
        for series in batch:
            parts.setdefault((series.metric, labels_key(series.labels)), []).append(series)
        events.extend(batch_events)
    merged = []
    for group in parts.values():
        first = group[0]
        if len(group) > 1:
            first = SeriesPoints(
                first.metric,
                first.labels,
                np.concatenate([s.steps for s in group]),
                np.concatenate([s.times for s in group]),
                np.concatenate([s.values for s in group]),
            )
        merged.append(first)
    merged.sort(key=lambda series: series.metric != CPU_WAIT_METRIC)
    return merged, events
