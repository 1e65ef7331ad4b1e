"""One background worker for every runwatch thread: a daemon thread around a queue and a clock.

The pattern is sentry-python's (``sentry_sdk/worker.py``): the caller only puts an item on a
queue and returns; the thread does the work, item by item, each inside the internal-error
guard (``runwatch.guard``), so a runwatch bug is logged once and counted and the loop goes
on. The six loops of a run and of ``runwatch serve`` (the hook's writer, live detection, the
alert engine and sender, the system-metrics sampler, the server's ingest writer) are each a
:class:`Worker` with their own handler; what differs between them is only:

- ``handle(item)``: one item's work. A true result asks for a tick at once (a batch is full).
- ``tick()``: work done on a clock (a flush, a poll, a hang check), every ``interval``
  seconds, when ``handle`` or :meth:`Worker.wake` asks, and for :meth:`Worker.flush`. It may
  return the seconds until it wants to run again.
- ``on_start`` / ``on_stop``: first and last on the thread (open a store, a final flush).

Shared by all of them:

- One stop sentinel. :meth:`Worker.close` queues it behind everything submitted, then waits
  in two phases: a short wait, then "N pending, waiting up to T s" in the log, then whatever
  is still pending when the time is up is counted as dropped.
- Counted drops: :meth:`Worker.submit` never blocks; an item it cannot take is counted by
  reason (``queue_full``, ``worker_dead``) in ``drops``, never lost silently.
- Fork and shutdown safety: a ``RuntimeError`` from ``Thread.start`` (the interpreter is
  shutting down) leaves the worker disabled, not crashed; in a forked child (a DataLoader
  worker) the thread does not exist, so the worker refuses items, counted ``worker_dead``.

Standard library only: it sits at the bottom of the layers, beside ``runwatch.model``.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from runwatch.guard import Guard

log = logging.getLogger("runwatch.worker")

FIRST_WAIT_S = 0.5
"""The first, quiet phase of ``flush`` and ``close``; then the wait is logged."""

_STOP = object()
_WAKE = object()
_EMPTY = object()
_workers: weakref.WeakSet[Worker] = weakref.WeakSet()


class DropSink(Protocol):
    """Where a worker counts what it refused or lost (``runwatch.hook.drops.DropCounter``)."""

    def add(self, reason: str, n: int = 1) -> None: ...


class Drops:
    """Counts by reason; a worker's own when no ``drops`` is given."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._counts[reason] = self._counts.get(reason, 0) + n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class _Flush:
    """A marker: set once every item queued before it is handled and a tick has run."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class Worker:
    """A daemon thread that handles submitted items in order and ticks on a clock.

    Parameters
    ----------
    name : str
        The thread's name; also names the worker in log messages.
    handle : callable, optional
        ``handle(item)``, on the thread, for each submitted item. A true result asks for a
        tick before the next item (a batch is full).
    tick : callable, optional
        ``tick()``, on the thread: every ``interval`` seconds, when ``handle`` or
        :meth:`wake` asks, and for :meth:`flush`. It returns the seconds until it next
        wants to run, or None for ``interval``.
    interval : float, optional
        Seconds between ticks; None: only when asked.
    first_tick : float, optional
        Seconds until the first tick (default ``interval``; 0: at once).
    tick_when_idle : bool
        Count ``interval`` from the last item handled, so the tick runs only after that
        long without items (a hang check).
    on_start, on_stop : callable, optional
        Called first and last on the thread. If ``on_start`` raises, the worker ends at
        once (logged and counted) and later items are dropped as ``worker_dead``;
        ``on_stop`` runs after the stop sentinel (a final flush), not after a failed start.
    maxsize : int
        Items waiting at most (0: no bound); :meth:`submit` counts the rest ``queue_full``.
    drops : DropSink, optional
        Where drops are counted (default: a :class:`Drops` of its own, ``worker.drops``).
    backlog : callable, optional
        How many units are still pending (default: items submitted and not handled); the
        log's "N pending" and the count of what ``close`` lost.
    unit : str
        The noun for ``backlog`` in the log ("points").
    lost_reason : str
        The drop reason for what is still pending when ``close`` times out.
    clock : callable
        Monotonic seconds, for the tick deadlines (a fake clock in tests).
    logger : logging.Logger, optional
        Where the worker logs (default ``runwatch.worker``); pass the owner's logger.
    """

    def __init__(
        self,
        name: str,
        handle: Callable[[Any], Any] | None = None,
        *,
        tick: Callable[[], float | None] | None = None,
        interval: float | None = None,
        first_tick: float | None = None,
        tick_when_idle: bool = False,
        on_start: Callable[[], None] | None = None,
        on_stop: Callable[[], None] | None = None,
        maxsize: int = 0,
        drops: DropSink | None = None,
        backlog: Callable[[], int] | None = None,
        unit: str = "items",
        lost_reason: str = "queue_full",
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
    ) -> None:
        if interval is not None and interval < 0:
            raise ValueError(f"interval={interval!r} is invalid; valid values: None or >= 0")
        self.name = name
        self._handle = handle
        self._tick = tick
        self._interval = interval
        self._first_tick = interval if first_tick is None else first_tick
        self._idle = tick_when_idle
        self._on_start = on_start
        self._on_stop = on_stop
        self._maxsize = maxsize
        self.drops: DropSink = drops if drops is not None else Drops()
        self._backlog = backlog
        self.unit = unit
        self._lost_reason = lost_reason
        self._clock = clock
        self.log = logger or log
        self.errors = Guard(f"in {name}", self.log)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.put = self._queue.put
        """The raw, uncounted put, for a hot path that bounds and counts itself (``run.log``)."""
        self._thread: threading.Thread | None = None
        self._accepting = False
        self._closed = False
        self._woken = False
        self._pid = os.getpid()
        self.submitted = 0
        self.handled = 0
        self.lost = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> bool:
        """Start the thread; False if it cannot (interpreter shutting down: disabled, logged).

        Starting a started worker does nothing.
        """
        if self._thread is not None or self._closed:
            return self.alive
        thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._accepting = True
        try:
            thread.start()
        except RuntimeError as exc:  # interpreter shutting down: disabled, not a crash
            self._accepting = False
            self.log.warning("runwatch: cannot start the %s thread (%s); disabled", self.name, exc)
            return False
        self._thread = thread
        _workers.add(self)
        return True

    @property
    def alive(self) -> bool:
        """Whether the thread is running (in this process)."""
        thread = self._thread
        return thread is not None and self._pid == os.getpid() and thread.is_alive()

    @property
    def accepting(self) -> bool:
        """Whether :meth:`submit` takes items (started, not closed, not forked)."""
        return self._accepting

    def pending(self) -> int:
        """Units still pending (``backlog``, or items submitted and not handled)."""
        if self._backlog is not None:
            return self._backlog()
        return max(self.submitted - self.handled, 0)

    def empty(self) -> bool:
        """Whether nothing is waiting in the queue right now (a handler batching a burst)."""
        return self._queue.empty()

    # -- called from any thread --------------------------------------------------------------
    def submit(self, item: Any) -> bool:
        """Queue ``item``; never blocks. False (counted) if the worker is not running or full."""
        if not self._accepting:
            self.drops.add("worker_dead")
            return False
        if self._maxsize and self.submitted - self.handled >= self._maxsize:
            self.drops.add("queue_full")
            return False
        self.submitted += 1
        self.put(item)
        return True

    def wake(self) -> None:
        """Ask for a tick soon; wake-ups pending at once are one tick."""
        if self._accepting and not self._woken:
            self._woken = True
            self.put(_WAKE)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every item submitted so far is handled and a tick has run; True if
        that happened within ``timeout`` s (waited in two phases, the second one logged)."""
        if not self.alive:
            return False
        marker = _Flush()
        self.put(marker)

        def say() -> None:
            self.log.debug(
                "runwatch: %d %s pending in %s, waiting up to %.1f s",
                self.pending(),
                self.unit,
                self.name,
                timeout,
            )

        return wait_in_two_phases(marker.done.wait, timeout, say)

    def close(self, timeout: float = 10.0) -> bool:
        """Stop after everything submitted is handled, then ``on_stop``; True if the thread
        ended within ``timeout`` s.

        The wait has two phases: a quiet one, then "N pending, waiting up to T s" in the log.
        If the time runs out, what is still pending is counted as dropped (``lost_reason``,
        also in ``self.lost``) and the thread is left to finish on its own (it is a daemon).
        Calling it again only reports whether the thread has ended.
        """
        self._accepting = False
        thread = self._thread
        if thread is None or self._pid != os.getpid():
            self._closed = True
            return True  # never started, or forked: no thread here to wait for
        if self._closed:
            return not thread.is_alive()
        self._closed = True
        self.put(_STOP)
        if thread is threading.current_thread():
            return True  # from a handler: the stop sentinel ends the loop after it

        def say() -> None:
            self.log.info(
                "runwatch: %d %s pending in %s, waiting up to %.0f s",
                self.pending(),
                self.unit,
                self.name,
                timeout,
            )

        if wait_in_two_phases(ended(thread), timeout, say):
            return True
        lost = self.pending()
        if lost > 0:
            self.lost += lost
            self.drops.add(self._lost_reason, lost)
        return False

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self._on_start is not None:
                try:
                    self._on_start()
                except Exception as exc:
                    self.errors.report(exc)
                    return
            self._loop()
            if self._on_stop is not None:
                with self.errors:
                    self._on_stop()
        finally:
            self._accepting = False
            self._count_leftovers()

    def _loop(self) -> None:
        q = self._queue
        clock = self._clock
        handle = self._handle
        interval = self._interval
        report = self.errors.report
        first = self._first_tick
        next_tick = None if self._tick is None or first is None else clock() + first
        while True:
            if next_tick is None:
                item = q.get()
            else:
                try:
                    item = q.get(timeout=max(0.0, next_tick - clock()))
                except queue.Empty:
                    item = _EMPTY
            due = handled = False
            # Take everything queued (a burst) before looking at the clock again.
            while item is not _EMPTY:
                if item is _STOP:
                    return
                if item is _WAKE:
                    self._woken = False
                    due = True
                elif type(item) is _Flush:
                    # Flush now, without moving the next tick: a flush asked for is extra.
                    self._run_tick()
                    item.done.set()
                else:
                    handled = True
                    try:
                        if handle(item):  # type: ignore[misc]
                            due = True
                    except Exception as exc:  # a runwatch bug must never kill the loop
                        report(exc)
                    finally:
                        self.handled += 1
                    if due:
                        break
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    item = _EMPTY
            if self._tick is None:
                continue
            if handled and self._idle and interval is not None:
                next_tick = clock() + interval
            if due or (next_tick is not None and clock() >= next_tick):
                delay = self._run_tick()
                if delay is None:
                    delay = interval
                next_tick = None if delay is None else clock() + delay

    def _run_tick(self) -> float | None:
        if self._tick is None:
            return None
        try:
            return self._tick()
        except Exception as exc:  # logged once, counted; the next tick comes as usual
            self.errors.report(exc)
            return None

    def _count_leftovers(self) -> None:
        """Items still queued when the thread ends were never handled: count them."""
        n = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP and item is not _WAKE and type(item) is not _Flush:
                n += 1
        if n:
            self.handled += n
            self.drops.add("worker_dead", n)

    def _after_fork_in_child(self) -> None:
        """The thread did not survive the fork; a fresh queue, so no lock is held by it."""
        self._accepting = False
        self._closed = True
        self._queue = queue.SimpleQueue()
        self.put = self._queue.put


def wait_in_two_phases(
    wait: Callable[[float], bool], timeout: float, say: Callable[[], None]
) -> bool:
    """``wait(seconds)`` (True once done) for up to ``timeout`` s: a short first wait, and
    only if that was not enough, ``say()`` (a log line naming what is pending) and the rest.
    Most waits end in the first phase, silently."""
    if wait(min(FIRST_WAIT_S, timeout)):
        return True
    say()
    return wait(max(0.0, timeout - FIRST_WAIT_S))


def ended(thread: threading.Thread) -> Callable[[float], bool]:
    """A ``wait`` for :func:`wait_in_two_phases`: join ``thread``, True if it ended."""

    def wait(seconds: float) -> bool:
        thread.join(seconds)
        return not thread.is_alive()

    return wait


def _after_fork_in_child() -> None:
    for worker in list(_workers):
        worker._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
