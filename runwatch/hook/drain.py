"""The writer's thread: it drains the run's queue on its own clock, never when a call wakes it.

Why not :class:`runwatch.worker.Worker` (a thread blocked in ``get()``): there every
``run.log`` put wakes the writer, which then takes the GIL from the training thread to handle
one item, and after milliseconds of training work the put itself runs on cold caches. At a
training cadence that made the hook 2-6x dearer than a bare queue put at the median and 100x
at p99 (bench/README-hook-cadence.md). Here the training thread only appends to a
``collections.deque`` no thread waits on; this thread sleeps ``interval`` seconds, takes what
is queued in one go and hands it to ``take`` as a list, so the GIL is taken a few times a
second instead of once a step.

The thread is woken early only by :meth:`Drain.flush`, :meth:`Drain.close` and
:meth:`Drain.wake` (the run calls it when its backlog passes a size threshold); the rest
(two-phase waits, counted drops, fork and shutdown safety) is as in ``runwatch.worker``.
"""

from __future__ import annotations

import _thread
import collections
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from runwatch.guard import Guard
from runwatch.hook._log_gate import take_batch
from runwatch.worker import DropSink, ended, wait_in_two_phases

_STOP = object()
CALM_DRAINS = 20
"""Drains in a row without waiting for the GIL before a stretched interval shrinks back."""
_drains: weakref.WeakSet[Drain] = weakref.WeakSet()


class Flush:
    """A marker in the queue: ``done`` is set once everything before it is written."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class Followed:
    """What ``Run.follow`` adds to a drain: sources (a framework's own log) whose new items
    are taken at every wake-up, before the queue, counted as queued on ``flow`` (and so as
    pending to flush). A run that follows nothing pays nothing for it."""

    def __init__(self, flow: Any) -> None:
        self._flow = flow
        self._sources: list[Callable[[], list[Any]]] = []

    def add(self, drain: Drain, source: Callable[[], list[Any]]) -> None:
        """Take ``source()``'s ``(step, time, metrics)`` items at each of ``drain``'s wake-ups."""
        self._sources.append(source)
        drain.pull = self.pull

    def pull(self) -> list[Any]:
        items: list[Any] = []
        for source in self._sources:
            items.extend(source())
        if items:
            self._flow.add_queued(sum(len(item[2]) for item in items))
        return items


class Drain:
    """A daemon thread that takes everything queued every ``interval`` s, then ticks.

    While drains wait for the GIL (a training loop that never lets go of it) the interval
    stretches up to ``max_interval``: fewer hand-overs, later data (:meth:`_adapt`).

    ``take(items)`` gets the queued items (never a marker) in order, on the thread; a true
    result means "a batch is full", and ``tick()`` (the write) runs before the next items.
    ``pull`` (None until set: ``Run.follow``, a framework's own log read off the training
    thread), when set, returns more items at every wake-up, taken before the queue.
    ``tick`` also runs at every wake-up, even when nothing was queued; ``flush`` (default ``tick``)
    at each :class:`Flush` marker; ``on_stop`` at the end. ``backlog()`` is what ``close``
    counts as lost on timeout.
    """

    def __init__(
        self,
        name: str,
        take: Callable[[list[Any]], bool],
        *,
        tick: Callable[[], None],
        flush: Callable[[], None] | None = None,
        interval: float,
        max_interval: float | None = None,
        first_tick: float | None = None,
        on_stop: Callable[[], None] | None = None,
        drops: DropSink,
        backlog: Callable[[], int],
        unit: str = "points",
        chunk: int = 8192,
        logger: logging.Logger,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval={interval!r} is invalid; valid values: a number > 0")
        self.name = name
        self._take = take
        self._tick = tick
        self._flush = flush if flush is not None else tick
        self._base = interval
        self._max_interval = max(interval, max_interval or interval)
        self.interval = interval
        """Seconds between drains now: ``interval``, stretched under GIL contention."""
        self._calm = 0  # drains in a row without waiting for the GIL
        self._first = interval if first_tick is None else first_tick
        self._on_stop = on_stop
        self.pull: Callable[[], list[Any]] | None = None
        self.drops = drops
        self._backlog = backlog
        self.unit = unit
        self._chunk = chunk
        self.log = logger
        self.errors = Guard(f"in {name}", logger)
        self._items: collections.deque[Any] = collections.deque()
        self.put = self._items.append
        """The raw put for the hot path: a deque append that wakes no thread."""
        self._wakeup = _locked()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._pid = os.getpid()
        self.lost = 0
        self.drains = 0  # how many times the thread woke and took something
        # Wake-ups done: everything queued before one began is written once it is counted.
        self.rounds = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> bool:
        """Start the thread; False if it cannot (interpreter shutting down: disabled, logged)."""
        if self._thread is not None or self._closed:
            return self.alive
        thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:
            self.log.warning("runwatch: cannot start the %s thread (%s); disabled", self.name, exc)
            return False
        self._thread = thread
        _drains.add(self)
        return True

    @property
    def alive(self) -> bool:
        thread = self._thread
        return thread is not None and self._pid == os.getpid() and thread.is_alive()

    def wake(self) -> None:
        """Drain now rather than at the next tick (a backlog past its threshold)."""
        wakeup = self._wakeup
        if wakeup.locked():
            # RuntimeError: another thread released it first, and one wake is enough
            with contextlib.suppress(RuntimeError):
                wakeup.release()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything put so far is written; True if within ``timeout`` s."""
        if not self.alive:
            return False
        marker = Flush()
        self.put(marker)
        self.wake()

        def say() -> None:
            self.log.debug(
                "runwatch: %d %s pending in %s, waiting up to %.1f s",
                self._backlog(),
                self.unit,
                self.name,
                timeout,
            )

        return wait_in_two_phases(marker.done.wait, timeout, say)

    def close(self, timeout: float = 10.0) -> bool:
        """Stop after everything put is written; True if the thread ended in ``timeout`` s.

        Waits in two phases (the second logged); on timeout, what is pending is counted as
        dropped (``queue_full``, also in ``self.lost``) and the daemon thread is left to end.
        """
        thread = self._thread
        if thread is None or self._pid != os.getpid():
            self._closed = True
            return True
        if self._closed:
            return not thread.is_alive()
        self._closed = True
        self.put(_STOP)
        self.wake()

        def say() -> None:
            self.log.info(
                "runwatch: %d %s pending in %s, waiting up to %.0f s",
                self._backlog(),
                self.unit,
                self.name,
                timeout,
            )

        if wait_in_two_phases(ended(thread), timeout, say):
            return True
        lost = self._backlog()
        if lost > 0:
            self.lost += lost
            self.drops.add("queue_full", lost)
        return False

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
            if self._on_stop is not None:
                with self.errors:
                    self._on_stop()
        finally:
            self._count_leftovers()

    def _loop(self) -> None:
        items, clock, cpu = self._items, time.monotonic, time.thread_time
        chunk = self._chunk
        wait = self._first
        while True:
            if wait > 0:
                # One C call, woken early by a release (``wake``); either way the lock is
                # held again after it, and whatever was put before a release is seen below.
                self._wakeup.acquire(True, wait)
            started, cpu_started = clock(), cpu()
            took = self._take_pulled()
            # What is queued now, in chunks, so one burst never makes a giant batch.
            n = len(items)
            while n:
                batch = take_batch(items, min(n, chunk), _STOP, Flush)
                n -= len(batch)
                if self._handle(batch):
                    return
                took = True
            if took:
                self.drains += 1
            # Every wake-up ticks, even with nothing taken: what was written but not yet
            # judged (``Writer._judge``) must not wait for the next call.
            self._run_tick()
            self.rounds += 1
            now = clock()
            self._adapt(now - started - (cpu() - cpu_started))
            # A backlog that grew while we worked (a tight loop): go again at once.
            wait = 0.0 if len(items) >= chunk else self.interval - (now - started)

    def _adapt(self, waited: float) -> None:
        """Stretch the interval to ``max_interval`` when a drain spent an eighth of the
        interval off the CPU, waiting for the GIL: the training thread holds it, and every
        hand-over (each SQLite statement and compressed block gives the GIL up and takes it
        back) then waits out the switch interval and stops the training thread once.
        Shrink it back after ``CALM_DRAINS`` drains in a row that ran freely."""
        if waited > self._base / 8:
            self.interval = self._max_interval
            self._calm = 0
        elif self.interval > self._base:
            self._calm += 1
            if self._calm >= CALM_DRAINS:
                self.interval = self._base

    def _handle(self, batch: list[Any]) -> bool:
        """Hand ``batch`` to ``take``; a marker can only end it (``take_batch``): a flush
        runs after the items before it, the stop sentinel returns True (what was queued
        after it stays queued, and is counted as lost by ``_count_leftovers``)."""
        last = batch[-1]
        if last is not _STOP and type(last) is not Flush:
            self._take_guarded(batch)
            return False
        del batch[-1]
        self._take_guarded(batch)
        if last is _STOP:
            return True
        self._run_tick(self._flush)
        last.done.set()
        return False

    def _take_pulled(self) -> bool:
        """Take what ``pull`` returns, before the queue: at every wake-up, so also before a
        flush marker or the stop. True when it returned something."""
        if self.pull is None:
            return False
        items: list[Any] = []
        with self.errors:
            items = self.pull()
        self._take_guarded(items)
        return bool(items)

    def _take_guarded(self, items: list[Any]) -> None:
        if not items:
            return
        try:
            if self._take(items):
                self._run_tick()
        except Exception as exc:  # a runwatch bug must never kill the loop
            self.errors.report(exc)

    def _run_tick(self, tick: Callable[[], None] | None = None) -> None:
        try:
            (tick or self._tick)()
        except Exception as exc:  # logged once, counted; the next tick comes as usual
            self.errors.report(exc)

    def _count(self, items: list[Any]) -> None:
        n = sum(1 for item in items if item is not _STOP and type(item) is not Flush)
        if n:
            self.drops.add("worker_dead", n)

    def _count_leftovers(self) -> None:
        """Items put after the stop (or left by a crash) were never written: count them."""
        left = list(self._items)
        self._items.clear()
        self._count(left)

    def _after_fork_in_child(self) -> None:
        """The thread did not survive the fork: a fresh queue and wake-up, nothing accepted."""
        self._closed = True
        self._items = collections.deque()
        self.put = self._items.append
        self._wakeup = _locked()


def _locked() -> Any:
    """A lock held from the start: the drain thread's wake-up. ``threading.Event`` ran
    about 25 lines of Python under the GIL at every wait (``Condition.wait``); acquiring
    this with a timeout is one C call (bench/README-hook-cadence.md)."""
    lock = _thread.allocate_lock()
    lock.acquire()
    return lock


def _after_fork_in_child() -> None:
    for drain in list(_drains):
        drain._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
