"""``Run.follow``: points read from a framework's own log on the writer thread, not logged
from the training thread."""

from __future__ import annotations

import threading
from collections import deque

import runwatch


def _series(db_path, run, metric):
    with runwatch.open_store(str(db_path), readonly=True) as store:
        return store.read_series(run, metric)


class Source:
    """A framework's log: the training thread appends, the source hands them out once."""

    def __init__(self):
        self.entries: deque = deque()
        self.threads: set[str] = set()

    def __call__(self):
        self.threads.add(threading.current_thread().name)
        items = []
        while self.entries:
            items.append(self.entries.popleft())
        return items


def test_followed_items_are_stored_with_their_own_times_off_the_training_thread(db_path):
    source = Source()
    with runwatch.init(name="r", store=db_path) as run:
        run.follow(source)
        for step in range(1, 6):
            source.entries.append((step, 1000.0 + step, {"loss": 5.0 - step}))
        assert run.flush()
        assert run.stats()["pending"] == 0 and run.stats()["written"] == 5
        assert run.step == 6  # a log without step= goes on after what was followed
        source.entries.append((9, 1009.0, {"loss": 0.5}))
    loss = _series(db_path, "r", "loss")
    assert loss["step"].tolist() == [1, 2, 3, 4, 5, 9]  # the last one read at finish
    assert loss["time"].tolist() == [1001.0, 1002.0, 1003.0, 1004.0, 1005.0, 1009.0]
    # read by the thread that drains the run's queue (it forwards to the writer in live
    # detection's process by default), never by the training thread
    assert source.threads == {"runwatch-forward"}


def test_a_failing_source_loses_nothing_logged_and_the_run_goes_on(db_path, caplog):
    def broken():
        raise RuntimeError("the framework's log moved")

    with runwatch.init(name="r", store=db_path) as run:
        run.follow(broken)
        for step in range(3):
            run.log({"loss": 1.0}, step=step)
        assert run.flush()
    assert _series(db_path, "r", "loss")["step"].tolist() == [0, 1, 2]
    assert "the framework's log moved" in caplog.text


def test_a_finished_run_follows_nothing(db_path):
    source = Source()
    run = runwatch.init(name="r", store=db_path)
    run.finish()
    run.follow(source)
    source.entries.append((1, 1.0, {"loss": 1.0}))
    assert source.threads == set() and len(source.entries) == 1
