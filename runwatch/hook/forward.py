"""The training process's side of a run whose writer runs in live detection's process.

The writer's Python (checking values, building columns, the store's statements, each a GIL
hand-over) took the GIL from the training loop at every drain (``bench/README-hook-cadence.md``).
A plain ``run.log`` call writes its numbers to a ring in shared memory
(``runwatch.hook._ring``), which the child reads on its own clock: no thread here touches
them. A framework's log this run follows (``Run.follow``) goes there too, from the drain
thread, when its values are plain numbers. Everything else (a tensor value, a context, an
event) is queued with its place marked in the ring, and the queue is drained on the
writer's clock (:class:`~runwatch.hook.drain.Drain`): a drain pickles what was queued, as it
was queued, and writes it to the child's pipe, one C call and one system call. The child runs
the :class:`~runwatch.hook.writer.Writer`, the store and live detection. ``flush()`` and
``finish()`` wait for the child to say the points are stored; drops it counts come back with
that answer.

A value with ``.item()`` (a tensor, a NumPy number) is read here, on this thread, as the
writer would read it; one that pickle cannot take is sent refused, so the writer counts it
as it counts any value that is not a number.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from runwatch.hook._log_gate import Flow
from runwatch.hook._ring import RingWriter
from runwatch.hook.drain import Drain
from runwatch.hook.drops import DropCounter
from runwatch.hook.frames import frame
from runwatch.hook.values import Refused, RefusedValue, to_float
from runwatch.hook.writer import ContextUpdate

log = logging.getLogger("runwatch.hook")


@runtime_checkable
class Channel(Protocol):
    """The pipe to the child (``runwatch.live_process.LiveProcess``)."""

    on_counters: Callable[[dict[str, Any]], None] | None
    """Called with the child's writer's counters (``written``, ``dropped``, ``attempt``,
    ``last_step``) each time it sends them: every second, at a sync, at its end."""

    def open_ring(
        self, append: Callable[[Any], None], on_full: Callable[[Any], None]
    ) -> RingWriter:
        """The ring the child reads, written here; ``append`` queues a marked item, and
        ``on_full`` gets one the ring had no room to mark."""
        ...

    def send_items(
        self, message: bytes, points: int, last_mark: int, last_step: int | None
    ) -> None:
        """Queue one drain's items, a whole frame (``("items", items, points, marks)``) for
        the child; never blocks. ``last_mark``: its items' highest mark in the ring;
        ``last_step``: the step of its last item, if it has one."""
        ...

    def sync(self, timeout: float, head: int) -> bool:
        """Wait until the child stored everything sent and the ring up to ``head`` (bytes);
        False after ``timeout``."""
        ...


class Forwarder:
    """Stands where the :class:`~runwatch.hook.writer.Writer` stands for a ``Run``: it has
    a ``worker`` (the drain thread), ``attempt``, ``last_step`` and ``follow``."""

    def __init__(
        self,
        channel: Channel,
        *,
        flow: Flow,
        drops: DropCounter,
        attempt: int,
        flush_interval: float,
        max_interval: float,
        flush_timeout: float,
    ) -> None:
        self._channel = channel
        self._flow = flow
        self._drops = drops
        self._flush_timeout = flush_timeout
        channel.on_counters = self._apply
        self.attempt = attempt
        self.last_step: int | None = None
        self._items: list[Any] = []
        self._points = 0
        self._marks: list[int] = []  # each of ``_items``'s mark in the ring
        self._sources: list[Callable[[], list[Any]]] = []
        self.worker = Drain(
            "runwatch-forward",
            self._take,
            tick=self._send,
            flush=self._sync,
            interval=flush_interval,
            max_interval=max_interval,
            on_stop=self._send,
            drops=drops,
            backlog=lambda: flow.queued - flow.written,
            unit="points",
            logger=log,
        )
        self.ring = channel.open_ring(self.worker.put, self._full)
        """Where ``run.log`` writes plain numbers, and ``ring.put_marked`` queues the rest."""

    def follow(self, source: Callable[[], list[Any]]) -> None:
        """As ``Writer.follow``: ``source()``'s items are taken at every drain, here, each
        marked in the ring where it is read (and counted as queued)."""
        self._sources.append(source)
        self.worker.pull = self._pull

    def _pull(self) -> list[tuple[int, Any]]:
        """The sources' new items: in the ring when they are plain numbers, as ``run.log``
        writes them (handed over, and kept there if runwatch's process dies), else each
        with its mark, to be sent."""
        marked, ringed, n = [], [], 0
        put, mark_next = self.ring.put_item, self.ring.mark
        for source in self._sources:
            for item in source():
                n += len(item[2])
                if put(item):
                    ringed.append(item)
                    continue
                mark = mark_next()
                if mark:
                    marked.append((mark, item))
                else:
                    self._full(item)
        self._flow.add_queued(n)
        if ringed:
            self._flow.add_drained(ringed)
        return marked

    def _full(self, item: Any) -> None:
        """``item`` found no room for its mark: runwatch's process has stopped reading."""
        self._drops.add("queue_full", self._flow.add_drained([item]))
        self._drops.warn_once(
            "ring full",
            "runwatch: runwatch's process stopped reading what this one logs; dropping "
            "points (counted as queue_full)",
        )

    def _take(self, marked: list[tuple[int, Any]]) -> bool:
        """Queued ``(mark, item)`` pairs (``RingWriter.put_marked``, :meth:`_pull`)."""
        items = [item for _, item in marked]
        self._points += self._flow.add_drained(items)
        self._items.extend(items)
        self._marks.extend(mark for mark, _ in marked)
        return len(self._items) >= 65_536

    def _send(self) -> None:
        items, self._items = self._items, []
        marks, self._marks = self._marks, []
        points, self._points = self._points, 0
        if not items:
            return
        try:
            message = frame(("items", items, points, marks), _Pickler)
        except Exception:  # something pickle cannot take: item by item, refusing it
            sendable = [_sendable(item) for item in items]
            message = frame(("items", sendable, points, marks), _Pickler)
        last = items[-1]
        step = last[0] if type(last) is tuple else getattr(last, "step", None)
        self._channel.send_items(message, points, max(marks), step if type(step) is int else None)

    def _sync(self) -> None:
        """At ``flush()``: send, then wait for the child to have stored it all, and the
        ring as far as it was written now."""
        head = self.ring.head
        self._send()
        self._channel.sync(self._flush_timeout, head)

    def _apply(self, counters: dict[str, Any]) -> None:
        """The child's writer's counters, as it sends them (every second, at a sync, at its
        end; on the channel's thread); an older set never moves them back."""
        if counters["written"] < self._flow.written:
            return
        self._flow.written = counters["written"]
        self.attempt = counters["attempt"]
        self.last_step = counters["last_step"]
        self._drops.set_remote(counters["dropped"])


class _Pickler(pickle.Pickler):
    """Pickles plain items at C speed (``reducer_override`` is not asked about ints, floats,
    strs, dicts and tuples); a value with ``.item()`` (a tensor, a NumPy number) is read
    here, so the child never imports torch or touches a GPU."""

    def reducer_override(self, obj: Any) -> Any:
        item = getattr(obj, "item", None)
        if not callable(item):
            return NotImplemented
        try:
            number = to_float(obj)  # refuses what the writer would refuse, by its kind
        except RefusedValue as refused:
            return Refused, (refused.kind,)
        inner = item()  # an int stays an int: it may be a step
        return (int, (inner,)) if type(inner) is int else (float, (number,))


def _sendable(item: Any) -> Any:
    """``item`` if it pickles; else a ``run.log`` item with the values that do not pickle
    refused, or the item's type name (refused by the writer as an unknown item)."""
    try:
        frame(item, _Pickler)
        return item
    except Exception:
        pass
    if type(item) is tuple and len(item) >= 3 and type(item[2]) is dict:
        return (*item[:2], _refusing(item[2]), *item[3:])
    if type(item) is ContextUpdate:
        update = ContextUpdate()
        update.time = item.time
        update.values = _refusing(item.values) if type(item.values) is dict else item.values
        update.log = _sendable(item.log) if item.log is not None else None
        return update if _pickles(update) else None
    return None  # an event whose attributes do not pickle: not sent


def _refusing(values: dict[Any, Any]) -> dict[Any, Any]:
    """``values`` with each value that does not pickle refused."""
    return {
        key: value if _pickles(value) else Refused(type(value).__name__)
        for key, value in values.items()
    }


def _pickles(value: Any) -> bool:
    try:
        frame(value, _Pickler)
        return True
    except Exception:
        return False
