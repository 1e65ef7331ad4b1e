"""The drain thread's compiled helpers (``take_batch``, ``write_now``) and what a drain does
at a flush marker and at its stop, with a real thread and a real pipe."""

from __future__ import annotations

import collections
import logging
import os
import threading

import pytest

from runwatch.hook import drain as drain_module
from runwatch.hook._log_gate import take_batch, write_now
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


def test_write_now_takes_what_the_pipe_takes_and_names_a_closed_reader():
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        assert write_now(write_fd, b"frame") == 5
        assert os.read(read_fd, 16) == b"frame"
        data = bytearray(os.urandom(1 << 20))
        sent = write_now(write_fd, data)
        assert 0 < sent < len(data)  # a pipe holds less than a MiB
        assert write_now(write_fd, data) == 0  # full: nothing written, no error
        received = bytearray()
        reader = threading.Thread(target=lambda: received.extend(os.read(read_fd, sent)))
        reader.start()
        reader.join(5.0)
        assert bytes(received) == bytes(data[: len(received)])
        os.close(read_fd)
        read_fd = -1
        with pytest.raises(BrokenPipeError):
            write_now(write_fd, b"x")
    finally:
        os.close(write_fd)
        if read_fd >= 0:
            os.close(read_fd)
