"""The ring ``run.log`` writes plain numbers to, and runwatch's process reads
(``runwatch.hook._ring``, ``runwatch.hook.ring_feed``): order, wrap-around, marks of queued
items, bounds, and a reader started again mid-ring."""

from __future__ import annotations

import math
import mmap
import os
from typing import Any

import numpy as np

from runwatch.hook._log_gate import RunGate
from runwatch.hook._ring import HEADER_BYTES, RingReader, RingWriter
from runwatch.hook.ring_feed import RingFeed


class _Gate(RunGate):
    """``run.log``'s compiled path writing to ``ring``, its queue a list."""

    def __init__(self, ring: RingWriter) -> None:
        self._ring = ring
        self._accepting = True
        self._put = ring.put_marked
        self._wake_at = 1 << 40


def _ring(data_bytes: int) -> tuple[int, RingWriter, list[Any], list[Any]]:
    fd = os.memfd_create("test-ring")
    os.ftruncate(fd, HEADER_BYTES + data_bytes)
    queued: list[Any] = []
    full: list[Any] = []
    return fd, RingWriter(mmap.mmap(fd, 0), queued.append, full.append), queued, full


def _read_all(feed: RingFeed) -> list[Any]:
    items: list[Any] = []
    feed.read(lambda batch, points: items.extend(batch))
    return items


def test_plain_calls_are_read_in_order_across_the_wrap_with_queued_items_in_their_place():
    fd, ring, queued, full = _ring(4096)  # about 80 small records: wraps many times
    gate = _Gate(ring)
    feed = RingFeed(fd)
    logged: list[Any] = []
    for step in range(500):
        values: dict[str, Any] = {"loss": 1.0 / (step + 1), "tokens": step, "ok": True}
        if step % 7 == 0:
            values["grad_norm"] = np.float32(0.5)  # not a plain number: the queue
        if step == 250:
            values["loss"] = math.nan
        gate.log(values, step=step)
        logged.append((step, values))
        if step % 25 == 24:  # the child reads now and then; its writer stores at once
            feed.arrived([item for _, item in queued], [mark for mark, _ in queued])
            queued.clear()
            got = _read_all(feed)
            feed.stored()
            assert [item[0] for item in got] == [s for s, _ in logged]
            for (step_read, _, read), (_, sent) in zip(got, logged, strict=True):
                assert list(read) == list(sent)  # the caller's key order
                for key, value in sent.items():
                    assert read[key] == float(value) or (math.isnan(read[key]) and step_read == 250)
            logged.clear()
    assert not full


def test_a_queued_item_holds_back_what_was_logged_after_it_until_it_arrives():
    fd, ring, queued, _ = _ring(1 << 16)
    gate = _Gate(ring)
    feed = RingFeed(fd)
    gate.log({"loss": 1.0}, step=0)
    gate.log({"loss": np.float64(2.0)}, step=1)  # NumPy's float64 is not exactly a float
    gate.log({"loss": 3.0}, step=2)
    assert [item[0] for item in _read_all(feed)] == [0]
    ((mark, item),) = queued
    feed.arrived([item], [mark])
    assert [item[0] for item in _read_all(feed)] == [1, 2]


def test_past_its_limit_calls_take_the_queue_and_past_its_size_they_are_refused():
    _, ring, queued, full = _ring(4096)
    ring.limit = 1024
    gate = _Gate(ring)
    for step in range(300):
        gate.log({"loss": 1.0}, step=step)
    in_ring = 300 - len(queued) - len(full)
    assert 1024 // 40 - 1 <= in_ring <= 1024 // 40  # one value: 24 + 16 bytes a call
    # then marks (16 bytes) to the ring's end, then refused: the reader stopped reading
    assert len(queued) == (4096 - 24 - 40 * in_ring) // 16 and full
    assert [item[0] for _, item in queued] == list(range(in_ring, in_ring + len(queued)))
    assert [item[0] for item in full] == list(range(in_ring + len(queued), 300))


def test_a_closed_ring_counts_its_unstored_points_and_sends_the_rest_to_the_queue():
    fd, ring, queued, _ = _ring(1 << 16)
    gate = _Gate(ring)
    reader = RingReader(mmap.mmap(fd, 0))
    for step in range(10):
        gate.log({"a": 1.0, "b": 2.0}, step=step)
    reader.read(0)
    head = reader.position
    reader.keep(head)  # steps 0-9 stored
    for step in range(10, 20):
        gate.log({"a": 1.0, "b": 2.0}, step=step)
    assert ring.close(after_step=14) == 10  # steps 15-19, two points each
    gate.log({"a": 1.0}, step=20)
    assert ring.head == head + 10 * 56 and [item[0] for _, item in queued] == [20]


def _started_again(fd, first, kept, names, skip_mark=0):
    """A reader started after ``first`` died, as a new child starts one, with the store
    holding ``loss`` up to step 6."""
    return RingFeed(
        fd,
        start=kept,
        until=first._reader.position,
        names=names,
        skip_mark=skip_mark,
        stored_step=6,
        stored_names=frozenset({"loss"}),
    )


def test_a_reader_started_again_skips_what_the_store_holds_and_items_sent_before():
    fd, ring, queued, _ = _ring(1 << 16)
    gate = _Gate(ring)
    first = RingFeed(fd)
    for step in range(10):
        gate.log({"loss": float(step)}, step=step)
    gate.log({"loss": np.float32(10.0)}, step=10)
    first.arrived([queued[0][1]], [queued[0][0]])
    _read_all(first)  # read to the end; the writer stored up to step 6, then died
    kept = ring.kept
    assert kept == 0
    for step in range(11, 13):
        gate.log({"loss": float(step)}, step=step)
    names = ring.key_names()
    again = _started_again(fd, first, kept, names, skip_mark=1)
    assert [item[0] for item in _read_all(again)] == [7, 8, 9, 11, 12]


def test_a_reader_started_again_keeps_a_later_log_at_the_stored_step():
    fd, ring, _, _ = _ring(1 << 16)
    gate = _Gate(ring)
    first = RingFeed(fd)
    for step in range(8):
        gate.log({"loss": float(step)}, step=step)
        if step == 6:  # an eval log after the training log, at the same step
            gate.log({"eval_loss": 3.0, "loss": 6.0}, step=step)
    _read_all(first)  # the writer stored up to step 6's training log, then died
    again = _started_again(fd, first, ring.kept, ring.key_names())
    assert [(step, values) for step, _, values in _read_all(again)] == [
        (6, {"eval_loss": 3.0}),
        (7, {"loss": 7.0}),
    ]


def test_names_are_read_back_whatever_their_order_and_whichever_str_objects_carry_them():
    fd, ring, _, _ = _ring(1 << 16)
    gate = _Gate(ring)
    feed = RingFeed(fd)
    logged = []
    for step in range(40):
        names = ["loss", "lr", "grad_norm"]
        if step % 3 == 1:
            names.reverse()
        if step % 5 == 2:  # equal names in new str objects, as a format string makes them
            names = ["".join(list(name)) for name in names]
        if step % 7 == 3:
            names = [*names, f"eval_{step}"]
        values = {name: float(step * 10 + k) for k, name in enumerate(names)}
        gate.log(values, step=step)
        logged.append((step, values))
    assert [(step, values) for step, _, values in _read_all(feed)] == logged


def test_a_closed_ring_counts_past_a_padding_record_at_the_very_end_of_the_mapping():
    fd, ring, _, _ = _ring(4096)
    ring.limit = 4096
    gate = _Gate(ring)
    reader = RingReader(mmap.mmap(fd, 0))
    gate.log(
        {"a": 1.0, "grad_norm": 2.0}, step=0
    )  # the names' records: 24 and 32 bytes; then 56 a call
    for step in range(1, 40):
        gate.log({"a": 1.0, "grad_norm": 2.0}, step=step)
    reader.read(0)
    reader.keep(reader.position)
    step = 40
    while ring.head < 4088:  # the last record ends 8 bytes before the ring's end
        gate.log({"a": 1.0, "grad_norm": 2.0}, step=step)
        step += 1
    assert ring.head == 4088
    gate.log({"a": 1.0, "grad_norm": 2.0}, step=step)  # padded: 8 bytes, the mapping's last
    assert ring.head == 4096 + 56
    assert ring.close() == 2 * (step - 40 + 1)


def test_a_followed_item_of_plain_numbers_is_written_as_a_call_and_anything_else_is_not():
    fd, ring, _, _ = _ring(4096)
    feed = RingFeed(fd)
    assert ring.put_item((3, 12.5, {"loss": 2.0, "epoch": 1}))
    refused = [
        [3, 12.5, {"loss": 2.0}],  # not a tuple
        (3, 12.5),
        (3, 12, {"loss": 2.0}),  # the time is not a float
        (3, 12.5, [("loss", 2.0)]),
        (3, 12.5, {"loss": np.float32(2.0)}),  # a value that is not a plain number
        ("3", 12.5, {"loss": 2.0}),
    ]
    assert [ring.put_item(item) for item in refused] == [False] * len(refused)
    assert _read_all(feed) == [(3, 12.5, {"loss": 2.0, "epoch": 1.0})]
