"""The background worker and the internal-error guard: stop, two-phase waits, counted drops,
fork and shutdown safety, ticks on a clock, and errors logged once and counted."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

import runwatch.worker as worker_module
from runwatch.guard import Guard, error_counts, internal_errors
from runwatch.worker import Drops, Worker


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


@pytest.fixture
def quick_first_phase(monkeypatch):
    """The quiet first phase of flush/close in 10 ms instead of half a second."""
    monkeypatch.setattr(worker_module, "FIRST_WAIT_S", 0.01)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# -- the queue and the stop ---------------------------------------------------------------------
def test_items_are_handled_in_order_and_close_runs_on_stop_after_them():
    seen: list[object] = []
    w = Worker("t-order", seen.append, on_stop=lambda: seen.append("stopped"))
    assert w.start()
    for i in range(100):
        assert w.submit(i)
    assert w.close(5.0)
    assert seen == [*range(100), "stopped"]
    assert not w.alive and w.handled == 100


def test_submit_after_close_is_counted_as_worker_dead_not_raised():
    w = Worker("t-closed", lambda item: None)
    w.start()
    assert w.close(5.0)
    assert w.close(5.0)  # again: only reports
    assert not w.submit("late")
    assert w.drops.snapshot() == {"worker_dead": 1}


def test_a_worker_never_started_refuses_and_closes_at_once():
    w = Worker("t-unstarted", lambda item: None)
    assert not w.submit(1) and not w.flush(1.0)
    assert w.close(1.0)
    assert w.drops.snapshot() == {"worker_dead": 1}


def test_a_handler_error_is_logged_once_counted_and_the_loop_goes_on(caplog):
    seen = []

    def handle(item):
        if item % 2:
            raise ValueError(f"odd {item}")
        seen.append(item)

    w = Worker("t-errors", handle, logger=logging.getLogger("runwatch.test"))
    w.start()
    for i in range(6):
        w.submit(i)
    assert w.close(5.0)
    assert seen == [0, 2, 4] and w.errors.count == 3
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 1 and "odd 1" in logged[0].getMessage() and logged[0].exc_info


# -- two-phase waits -----------------------------------------------------------------------------
def test_flush_waits_for_a_blocked_handler_in_two_phases(quick_first_phase, caplog):
    caplog.set_level(logging.DEBUG, logger="runwatch")
    release = threading.Event()
    w = Worker("t-flush", lambda item: release.wait(10))
    w.start()
    w.submit("slow")
    w.submit("next")
    assert not w.flush(timeout=0.05)  # the handler still blocks
    assert any("2 items pending in t-flush" in r.getMessage() for r in caplog.records)
    release.set()
    assert w.flush(timeout=5.0)
    assert w.pending() == 0
    assert w.close(5.0)


def test_close_counts_what_is_still_pending_when_time_runs_out(quick_first_phase, caplog):
    caplog.set_level(logging.INFO, logger="runwatch")
    release = threading.Event()
    drops = Drops()
    w = Worker("t-close", lambda item: release.wait(10), drops=drops, unit="points")
    w.start()
    for i in range(3):
        w.submit(i)
    assert not w.close(0.05)
    assert w.lost == 3 and drops.snapshot() == {"queue_full": 3}
    assert any(
        "3 points pending in t-close, waiting up to" in r.getMessage() for r in caplog.records
    )
    release.set()
    wait_for(lambda: not w.alive)


def test_flush_ticks_so_batched_state_is_written():
    batch, written = [], []

    def flush():
        written.extend(batch)
        batch.clear()

    w = Worker("t-batch", batch.append, tick=flush, interval=3600.0)
    w.start()
    w.submit(1)
    w.submit(2)
    assert w.flush(5.0) and written == [1, 2]
    assert w.close(5.0)


# -- counted drops -------------------------------------------------------------------------------
def test_a_full_queue_counts_queue_full_and_never_blocks():
    release = threading.Event()
    w = Worker("t-full", lambda item: release.wait(10), maxsize=2)
    w.start()
    assert w.submit(1) and w.submit(2)
    t0 = time.monotonic()
    assert not w.submit(3) and not w.submit(4)
    assert time.monotonic() - t0 < 0.5
    assert w.drops.snapshot() == {"queue_full": 2}
    release.set()
    assert w.close(5.0)


def test_a_failed_start_ends_the_worker_and_counts_what_was_queued(caplog):
    go = threading.Event()

    def on_start():
        go.wait(10)
        raise OSError("store gone")

    stopped = []
    w = Worker("t-start", lambda item: None, on_start=on_start, on_stop=lambda: stopped.append(1))
    w.start()
    w.submit(1)
    w.submit(2)
    go.set()
    wait_for(lambda: not w.alive)
    assert not w.submit(3)
    assert w.drops.snapshot() == {"worker_dead": 3}
    assert w.errors.count == 1 and stopped == []  # no on_stop after a failed start
    assert any("store gone" in r.getMessage() for r in caplog.records)


def test_thread_start_refused_at_shutdown_means_disabled_not_a_crash(monkeypatch, caplog):
    def refuse(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    w = Worker("t-shutdown", lambda item: None)
    assert not w.start()
    assert not w.submit(1) and w.drops.snapshot() == {"worker_dead": 1}
    assert w.close(1.0)
    assert any("interpreter shutdown" in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_refuses_items_and_the_parent_goes_on():
    seen: list[int] = []
    w = Worker("t-fork", seen.append)
    w.start()
    w.submit(1)
    assert w.flush(5.0)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the thread does not exist here
        ok = (
            not w.alive
            and not w.submit(2)
            and w.drops.snapshot() == {"worker_dead": 1}
            and w.close(1.0)
        )
        os.write(write, b"ok" if ok else b"bad")
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 8) == b"ok" and status == 0
    os.close(read)
    assert w.submit(3) and w.close(5.0)
    assert seen == [1, 3] and w.drops.snapshot() == {}


# -- ticks ---------------------------------------------------------------------------------------
def test_ticks_come_every_interval_and_at_once_when_asked():
    ticks = []
    w = Worker("t-tick", tick=lambda: ticks.append(1), interval=0.01, first_tick=0.0)
    w.start()
    wait_for(lambda: len(ticks) >= 3)
    assert w.close(5.0)

    asked = []
    w = Worker("t-wake", lambda item: item == "full", tick=lambda: asked.append(1))
    w.start()
    w.submit("not yet")
    assert w.flush(5.0) and len(asked) == 1  # the flush's own tick
    w.submit("full")  # the handler asks for a tick
    wait_for(lambda: len(asked) == 2)
    w.wake()
    wait_for(lambda: len(asked) == 3)
    assert w.close(5.0)


def test_the_tick_returns_when_it_next_wants_to_run():
    ticks = []

    def tick():
        ticks.append(1)
        return 0.0 if len(ticks) < 5 else None  # more work: at once; then the interval

    w = Worker("t-delay", tick=tick, interval=3600.0, first_tick=0.0)
    w.start()
    wait_for(lambda: len(ticks) == 5)
    time.sleep(0.05)
    assert len(ticks) == 5
    assert w.close(5.0)


@pytest.mark.parametrize("idle", [False, True])
def test_an_idle_tick_waits_for_an_interval_without_items(idle):
    clock = FakeClock()
    ticks = []
    w = Worker(
        "t-idle",
        lambda item: None,
        tick=lambda: ticks.append(clock.now),
        interval=100.0,
        tick_when_idle=idle,
        clock=clock,
    )
    w.start()
    clock.now = 99.0
    w.submit("a")
    wait_for(lambda: w.handled == 1)
    clock.now = 100.5
    w.submit("b")
    wait_for(lambda: w.handled == 2)
    assert w.close(5.0)
    # On a plain clock the tick was due at 100; counted from the last item it is not.
    assert ticks == ([] if idle else [100.5])


def test_a_tick_error_is_counted_and_the_next_tick_comes_as_usual():
    calls = []

    def tick():
        calls.append(1)
        raise RuntimeError("bug")

    w = Worker("t-tick-error", tick=tick, interval=0.005, first_tick=0.0)
    w.start()
    wait_for(lambda: len(calls) >= 3)
    assert w.close(5.0)
    assert w.errors.count == len(calls)


# -- the guard -----------------------------------------------------------------------------------
def test_the_guard_logs_once_with_traceback_and_counts_every_error(caplog):
    caplog.set_level(logging.DEBUG, logger="runwatch")
    guard = Guard("test: dividing", logging.getLogger("runwatch.test"))
    before = error_counts().get("test: dividing", 0)
    for _ in range(3):
        with guard:
            1 / 0  # noqa: B018
    assert guard.count == 3
    assert error_counts()["test: dividing"] == before + 3
    records = [r for r in caplog.records if "test: dividing" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.ERROR, logging.DEBUG, logging.DEBUG]
    assert records[0].exc_info and "ZeroDivisionError" in records[0].getMessage()


def test_the_guard_as_a_decorator_returns_none_after_an_error():
    guard = Guard("test: decorated")

    @guard
    def parse(text):
        return int(text)

    assert parse("7") == 7
    assert parse("seven") is None and guard.count == 1


def test_the_guard_lets_interrupts_through():
    guard = Guard("test: interrupt")
    with pytest.raises(KeyboardInterrupt), guard:
        raise KeyboardInterrupt
    assert guard.count == 0


def test_internal_errors_is_one_guard_per_site():
    assert internal_errors("test: shared") is internal_errors("test: shared")
    assert internal_errors("test: shared") is not internal_errors("test: other")
