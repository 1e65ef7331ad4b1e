"""Live detection in a child process (``runwatch.live_process``): the default place."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import runwatch
from runwatch.live_process import FrameReader, _RecordSender

CURVE_WITH_FAULTS = [
    {"loss": 3.0 / (1 + step) ** 0.3 + (4.0 if step == 300 else 0.0), "grad_norm": 1.0}
    for step in range(600)
] + [{"loss": float("nan"), "grad_norm": 1.0}]


def _children() -> list[str]:
    """The command lines of this process's children."""
    pid = os.getpid()
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            for child in f.read().split():
                with open(f"/proc/{child}/cmdline", "rb") as g:
                    found.append(g.read().replace(b"\0", b" ").decode())
    return found


def _episodes(db: Path, name: str) -> list[tuple[str, str, int, str]]:
    with runwatch.open_store(db) as store:
        frame = store.anomalies(name)
    columns = (frame["detector"], frame["metric"], frame["start_step"].astype(int))
    return sorted(zip(*columns, frame["severity"], strict=True))


def _log_all(run: Any) -> None:
    for step, data in enumerate(CURVE_WITH_FAULTS):
        run.log(data, step=step)


def test_default_run_detects_in_a_child_process_and_finds_what_a_thread_finds(
    tmp_path: Path,
) -> None:
    db = tmp_path / "run.db"
    # No CPU-wait series: whether this busy machine made the two runs wait is not the point.
    run = runwatch.init("child", store=db, cpu_wait=False)
    assert any("runwatch.live_process" in cmd for cmd in _children())
    _log_all(run)
    run.finish()
    assert not any("runwatch.live_process" in cmd for cmd in _children())  # it exited
    assert "runwatch-detect" not in {t.name for t in threading.enumerate()}
    with runwatch.init("thread", store=db, live_detection="thread", cpu_wait=False) as run:
        _log_all(run)
    found = _episodes(db, "child")
    assert ("spike", "loss", 300) in {episode[:3] for episode in found}
    assert ("nonfinite", "loss", 600, "critical") in found
    assert found == _episodes(db, "thread")


def test_the_environment_chooses_a_thread_and_a_bad_place_is_refused(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("RUNWATCH_LIVE_DETECTION", "thread")
    with runwatch.init("env", store=tmp_path / "run.db", cpu_wait=False) as run:
        assert not any("runwatch.live_process" in cmd for cmd in _children())
        run.log({"loss": float("nan")}, step=0)
    assert _episodes(tmp_path / "run.db", "env") == [("nonfinite", "loss", 0, "critical")]
    with pytest.raises(ValueError, match=r"live_detection='gpu'.*process, thread"):
        runwatch.init("bad", store=tmp_path / "run.db", live_detection="gpu")
    with runwatch.open_store(tmp_path / "run.db") as store:
        assert "bad" not in set(store.runs()["name"])  # refused before anything is written


def test_a_child_that_cannot_start_leaves_detection_in_a_thread(
    tmp_path: Path, monkeypatch: Any, caplog: Any
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    with (
        caplog.at_level(logging.WARNING, "runwatch"),
        runwatch.init("fallback", store=tmp_path / "run.db", cpu_wait=False) as run,
    ):
        run.log({"loss": float("nan")}, step=0)
    assert "cannot start live detection's process" in caplog.text
    assert _episodes(tmp_path / "run.db", "fallback") == [("nonfinite", "loss", 0, "critical")]


def test_log_records_of_the_child_reach_the_parents_loggers(caplog: Any) -> None:
    read_end, write_end = os.pipe()
    sender = _RecordSender(write_end)
    child_log = logging.getLogger("runwatch.pipeline.live")
    record = child_log.makeRecord(
        child_log.name, logging.WARNING, "live.py", 1, "behind by %d points", (5,), None
    )
    sender.handle(record)
    os.close(write_end)
    reader = FrameReader(read_end)
    messages = reader.read()
    assert reader.read() is None
    os.close(read_end)
    assert [kind for kind, _ in messages] == ["log"]
    with caplog.at_level(logging.WARNING, "runwatch"):
        received = logging.makeLogRecord(messages[0][1])
        logging.getLogger(received.name).handle(received)
    assert ("runwatch.pipeline.live", logging.WARNING, "behind by 5 points") in caplog.record_tuples


def test_a_killed_training_process_is_recorded_as_a_crash(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import sys, runwatch
                run = runwatch.init(name="killed", store=sys.argv[1])
                for step in range(300):
                    run.log({"loss": 3.0 / (1 + step) ** 0.3}, step=step)
                run.flush()
                print("ready", flush=True)
                sys.stdin.read()
                """
            ),
            str(db),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    with open(f"/proc/{child.pid}/task/{child.pid}/children") as f:
        detector = [int(pid) for pid in f.read().split()]
    assert len(detector) == 1
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    _wait_gone(detector[0], 30)
    with runwatch.open_store(db) as store:
        assert store.runs().set_index("name").loc["killed", "status"] == "crashed"
        crash = store.events("killed", kinds=["crash"]).iloc[0]
        assert f"pid {child.pid}" in crash["message"] and crash["step"] == 299
        incidents = store.incidents("killed")
    assert len(incidents) == 1 and incidents.iloc[0]["severity"] == "critical"


def _wait_gone(pid: int, timeout: float) -> None:
    """Wait for a process that is not our child to exit."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still running after {timeout} s")


def _kill_child_and_wait_for_restart(run: Any, restarts: int) -> None:
    """SIGKILL runwatch's process beside this one; wait until the run has noticed and
    started the next one (``restarts`` in all), or given up."""
    import time

    process = run._extras.process
    dead = process._proc
    os.kill(dead.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.restarts >= restarts or process._broken:
            return
        time.sleep(0.05)
    raise AssertionError("the run did not notice its process died")


def test_a_child_killed_mid_run_is_started_again_and_goes_on_writing_and_detecting(
    tmp_path: Path, caplog: Any
) -> None:
    db = tmp_path / "run.db"
    run = runwatch.init(name="restarted", store=str(db))
    for step in range(200):
        loss = float("nan") if step == 100 else 3.0 / (1 + step) ** 0.3
        run.log({"loss": loss}, step=step)
    assert run.flush()
    first = run._extras.process._proc.pid
    with caplog.at_level(logging.WARNING, "runwatch"):
        _kill_child_and_wait_for_restart(run, 1)
        assert run._extras.process._proc.pid != first
        for step in range(200, 400):
            loss = float("nan") if step == 300 else 3.0 / (1 + step) ** 0.3
            run.log({"loss": loss}, step=step)
        assert run.flush()
        stats = run.stats()
        run.finish()
    assert any("starting it again (1 of 3)" in m for m in caplog.messages)
    assert stats["written"] == 400 and not stats["dropped"]
    with runwatch.open_store(db) as store:
        assert store.runs().set_index("name").loc["restarted", "status"] == "finished"
        assert len(store.attempts("restarted")) == 1
        assert store.read_series("restarted", "loss")["step"].tolist() == list(range(400))
    # the NaN before the kill was replayed, not found again; the one after is found
    nonfinite = [e for e in _episodes(db, "restarted") if e[0] == "nonfinite"]
    assert [e[2] for e in nonfinite] == [100, 300]


def test_a_step_that_goes_back_after_a_restart_still_starts_a_new_attempt(
    tmp_path: Path,
) -> None:
    db = tmp_path / "run.db"
    run = runwatch.init(name="went-back", store=str(db))
    for step in range(200):
        run.log({"loss": 1.0}, step=step)
    assert run.flush()
    _kill_child_and_wait_for_restart(run, 1)
    for step in range(150, 250):  # resumed from a checkpoint at step 150
        run.log({"loss": 2.0}, step=step)
    assert run.flush()
    run.finish()
    with runwatch.open_store(db) as store:
        attempts = store.attempts("went-back")
        series = store.read_series("went-back", "loss")
    assert attempts["start_step"].tolist()[-1] == 150 and len(attempts) == 2
    assert series["step"].tolist() == list(range(250))
    assert series["value"].tolist() == [1.0] * 150 + [2.0] * 100


def test_a_child_that_keeps_dying_is_given_up_and_what_follows_is_counted(
    tmp_path: Path, caplog: Any
) -> None:
    run = runwatch.init(name="given-up", store=str(tmp_path / "run.db"))
    run.log({"loss": 1.0}, step=0)
    assert run.flush()
    with caplog.at_level(logging.WARNING, "runwatch"):
        for restarts in (1, 2, 3, 4):
            _kill_child_and_wait_for_restart(run, restarts)
        for step in range(1, 51):
            run.log({"loss": 1.0}, step=step)
        run.flush(timeout=1.0)
        stats = run.stats()
        run.finish()
    assert run._extras.process.restarts == 3
    assert any("4 times" in m and "no longer judged live" in m for m in caplog.messages)
    assert stats["dropped"]["worker_dead"] == 50


def _log_while_the_child_is_stopped_then_kill_it(
    run: Any, log_stopped: Callable[[int], None]
) -> None:
    """Steps 0-99 stored; steps 100-149 logged by ``log_stopped(step)`` while runwatch's
    process reads nothing, then it is killed and started again; steps 150-199 after."""
    for step in range(100):
        run.log({"loss": 1.0}, step=step)
    assert run.flush()
    os.kill(run._extras.process._proc.pid, signal.SIGSTOP)  # it reads nothing more
    for step in range(100, 150):
        log_stopped(step)
    time.sleep(0.5)  # several drains: all that takes the pipe is sent
    _kill_child_and_wait_for_restart(run, 1)
    deadline = time.monotonic() + 30
    while run._extras.process._orphaned and time.monotonic() < deadline:
        time.sleep(0.05)  # the new child has said what the store holds
    for step in range(150, 200):
        run.log({"loss": 1.0}, step=step)
    assert run.flush()


def test_points_in_the_ring_that_a_dead_child_never_stored_are_stored_by_the_next(
    tmp_path: Path,
) -> None:
    db = tmp_path / "run.db"
    run = runwatch.init(name="in-ring", store=str(db))
    _log_while_the_child_is_stopped_then_kill_it(
        run, lambda step: run.log({"loss": 1.0}, step=step)
    )
    stats = run.stats()
    run.finish()
    assert stats["dropped"] == {} and stats["written"] == 200
    with runwatch.open_store(db) as store:
        assert store.read_series("in-ring", "loss")["step"].tolist() == list(range(200))


def test_a_followed_log_outlives_a_child_that_died_before_storing_it(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    run = runwatch.init(name="followed", store=str(db))
    entries: list[tuple[int, float, dict[str, Any]]] = []

    def source() -> list[tuple[int, float, dict[str, Any]]]:
        taken = entries[:]
        del entries[: len(taken)]
        return taken

    run.follow(source)  # as the HF callback follows the Trainer's log_history
    _log_while_the_child_is_stopped_then_kill_it(
        run, lambda step: entries.append((step, time.time(), {"loss": 1.0}))
    )
    stats = run.stats()
    run.finish()
    assert stats["dropped"] == {} and stats["written"] == 200
    with runwatch.open_store(db) as store:
        assert store.read_series("followed", "loss")["step"].tolist() == list(range(200))


def test_points_sent_to_a_child_that_died_before_storing_them_are_counted_lost(
    tmp_path: Path,
) -> None:
    db = tmp_path / "run.db"
    run = runwatch.init(name="in-flight", store=str(db))
    # A NumPy number is not a plain float: it takes the queue and the pipe, not the ring.
    _log_while_the_child_is_stopped_then_kill_it(
        run, lambda step: run.log({"loss": np.float32(1.0)}, step=step)
    )
    stats = run.stats()
    run.finish()
    assert stats["dropped"] == {"worker_dead": 50} and stats["written"] == 150
    with runwatch.open_store(db) as store:
        steps = store.read_series("in-flight", "loss")["step"].tolist()
    assert steps == list(range(100)) + list(range(150, 200))


def test_a_message_to_a_parent_that_is_gone_is_dropped_rather_than_raised() -> None:
    read_end, write_end = os.pipe()
    sender = _RecordSender(write_end)
    assert sender.send(("counters", {"written": 1}))
    os.close(read_end)  # the training process was killed
    assert not sender.send(("counters", {"written": 2}))  # a broken pipe, not raised
    assert not sender.send(("counters", {"written": 3}))
    os.close(write_end)
