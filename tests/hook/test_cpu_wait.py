"""The hook logs how long the training thread waited for a CPU, read from the kernel."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import runwatch
from runwatch.detect.busy import BUSY_WAIT
from runwatch.hook.cpu_wait import CPU_WAIT_METRIC, CpuWait

pytestmark = pytest.mark.skipif(CpuWait.open() is None, reason="no per-thread schedstat")

HOG = "import os\nos.sched_setaffinity(0, {0})\nprint(flush=True)\nwhile True:\n    pass\n"
"""A process spinning on core 0; the empty line it prints says it is there."""


def _work(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(2_000))


def _compute() -> None:
    """A fixed amount of work: slower when the core is shared."""
    for _ in range(40):
        sum(range(2_000))


def _timed_step(run, step: int) -> None:
    began = time.perf_counter()
    _compute()
    run.log({"step_time_s": time.perf_counter() - began}, step=step)


def _start_hog() -> subprocess.Popen[bytes]:
    """A process spinning on core 0, returned once it spins (its start takes ~30 ms on an
    idle machine, far longer on a loaded one)."""
    hog = subprocess.Popen([sys.executable, "-c", HOG], stdout=subprocess.PIPE)
    assert hog.stdout is not None
    if hog.stdout.readline() != b"\n":
        hog.kill()
        hog.wait()
        pytest.fail("the CPU hog did not start")
    return hog


def _step_until_the_wait_shows(run, store, step: int, timeout: float = 30.0) -> int:
    """Log timed steps from ``step`` until the store holds a CPU-wait sample of at least
    BUSY_WAIT at a later step; return the next step.

    A sample covers the time since the writer's previous one, and is logged at the first
    step logged after that one. One at a step after ``step`` covers only time the hog spun and this
    thread stepped, so the samples from it on, and the steps under them, are the hog's.
    Why not sleep instead: a sleeping thread waits for no CPU, so a sample whose interval
    holds the sleep reads below BUSY_WAIT and the first busy steps under it are judged."""
    first = step
    deadline = time.monotonic() + timeout
    while True:
        for _ in range(10):
            _timed_step(run, step)
            step += 1
        waits = store.read_points("live", [CPU_WAIT_METRIC], start=first + 1)["value"]
        if (waits >= BUSY_WAIT).any():
            return step
        if time.monotonic() > deadline:
            pytest.fail(f"no CPU wait of {BUSY_WAIT} s/s in {timeout} s: {waits.tolist()}")


def _spin_until_stored(store, step: int, timeout: float = 30.0) -> None:
    """Keep this thread on its core, logging nothing, until ``step`` is stored.

    The writer samples the CPU wait only when it has new points, before it writes them;
    so once the last step is stored, the sample over it was read while this thread still
    competed with the hog, and the run's finish (this thread asleep) adds none."""
    deadline = time.monotonic() + timeout
    while store.read_points("live", ["step_time_s"], start=step).empty:
        for _ in range(5):
            _compute()
        if time.monotonic() > deadline:
            pytest.fail(f"step {step} not stored in {timeout} s")


def _log_steps(run, first: int, seconds: float) -> int:
    step = first
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        _work(0.005)
        run.log({"step_time_s": 0.005}, step=step)
        step += 1
    return step


def test_a_process_competing_for_the_core_shows_as_cpu_wait(tmp_path):
    db = tmp_path / "wait.db"
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})  # this thread (the training loop) on core 0 only
    try:
        with runwatch.init(name="busy", store=db, monitor=False) as run:
            step = _log_steps(run, 0, 0.6)
            hog = _start_hog()
            try:
                busy_from = step
                step = _log_steps(run, step, 1.2)
            finally:
                hog.kill()
                hog.wait()
            logged = run.stats()["logged"]
    finally:
        os.sched_setaffinity(0, before)
    pts = runwatch.open_store(db, readonly=True).read_points("busy", [CPU_WAIT_METRIC])
    assert logged == step  # the samples are not counted as the run's points
    assert (pts["value"] >= 0.0).all()
    assert pts["step"].is_monotonic_increasing and pts["step"].iloc[0] == 0
    during = pts[pts["step"] >= busy_from + 10]["value"]
    assert len(during) >= 2
    assert during.median() >= max(BUSY_WAIT, 0.3)


def test_a_closed_reader_or_an_unknown_thread_reads_nothing():
    reader = CpuWait.open()
    assert reader is not None
    _work(0.01)
    first = reader.read()
    assert first is not None and first >= 0.0
    reader.close()
    assert reader.read() is None
    assert CpuWait.open(pid=2**22 + 12345) is None  # above any pid_max: no such process


def test_a_run_slowed_by_a_process_on_its_core_is_held_live_as_on_replay(tmp_path):
    """Live detection holds the steps a process on the same core slowed, names the busy
    host, and finds what replay of the stored points finds (tests/detect/test_busy_host.py
    shows that the same slowdown without the readings is a warning)."""
    from runwatch.detect import analyze_frame

    db = tmp_path / "live.db"
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    try:
        with runwatch.init(name="live", store=db) as run:
            step = 0
            end = time.perf_counter() + 2.0
            while time.perf_counter() < end or step < 300:
                _timed_step(run, step)
                step += 1
            hog = _start_hog()
            try:
                with runwatch.open_store(db, readonly=True) as watching:
                    step = _step_until_the_wait_shows(run, watching, step)
                    busy_from = step
                    for busy_step in range(busy_from, busy_from + 200):
                        _timed_step(run, busy_step)
                    _spin_until_stored(watching, busy_from + 199)
            finally:
                hog.kill()
                hog.wait()
    finally:
        os.sched_setaffinity(0, before)
    store = runwatch.open_store(db, readonly=True)
    live = store.anomalies("live", source="live")
    assert "host_busy" in set(live["detector"])
    # Whatever the machine did to the quiet steps (and to those stepped while the hog came
    # on), the steps slowed by the hog are held: not judged at all, so not even an info
    # regression starts among them (one does when holding is broken).
    timing = live[live["detector"] == "regression"]
    assert (timing["start_step"] < busy_from).all()
    replay = analyze_frame(store.read_points("live"))
    assert sorted(zip(live["detector"], live["metric"], live["start_step"], strict=True)) == (
        sorted((a.detector, a.metric, a.start_step) for a in replay)
    )
