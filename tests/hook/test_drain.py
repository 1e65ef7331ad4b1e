"""The drain thread's compiled take of the queue (``take_batch``), and what a drain does at
a flush marker and at its stop, with a real thread."""

from __future__ import annotations

import collections
import logging

from runwatch.hook import drain as drain_module
from runwatch.hook._log_gate import take_batch
from runwatch.hook.drain import Drain, Flush
from runwatch.hook.drops import DropCounter

STOP = object()


def test_a_batch_ends_at_its_limit_or_at_the_first_marker_and_leaves_the_rest_queued():
    flush = Flush()
    items = collections.deque([1, 2, flush, 3, STOP, 4])
    assert take_batch(items, 2, STOP, Flush) == [1, 2]
    assert take_batch(items, 10, STOP, Flush) == [flush]
    assert take_batch(items, 10, STOP, Flush) == [3, STOP]
    assert list(items) == [4]
    assert take_batch(items, 10, STOP, Flush) == [4] and not items
    assert take_batch(items, 10, STOP, Flush) == []


def test_a_flush_writes_what_came_before_it_and_a_stop_counts_what_came_after():
    taken: list[int] = []
    flushed_after: list[list[int]] = []
    drops = DropCounter()
    drain = Drain(
        "runwatch-test-drain",
        lambda items: taken.extend(items) and False,
        tick=lambda: None,
        flush=lambda: flushed_after.append(list(taken)),
        interval=60.0,
        first_tick=0.0,  # the first wake-up drains at once: all below in one go
        drops=drops,
        backlog=lambda: 0,
        logger=logging.getLogger("runwatch.test"),
    )
    flush = Flush()
    for item in (0, 1, flush, 2, drain_module._STOP, 3, 4):
        drain.put(item)
    assert drain.start()
    assert flush.done.wait(5.0)
    drain._thread.join(5.0)
    assert flushed_after == [[0, 1]]
    assert taken == [0, 1, 2]
    assert drops.snapshot() == {"worker_dead": 2}  # the two put after the stop
