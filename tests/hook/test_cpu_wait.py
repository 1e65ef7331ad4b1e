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

HOG = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"


def _work(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(2_000))


def _compute() -> None:
    """A fixed amount of work: slower when the core is shared."""
    for _ in range(40):
        sum(range(2_000))


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
            hog = subprocess.Popen([sys.executable, "-c", HOG])
            try:
                time.sleep(0.2)  # the hog is on core 0
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
                began = time.perf_counter()
                _compute()
                run.log({"step_time_s": time.perf_counter() - began}, step=step)
                step += 1
            hog = subprocess.Popen([sys.executable, "-c", HOG])
            try:
                time.sleep(0.3)  # the hog is spinning on core 0
                busy_from = step
                for busy_step in range(step, step + 200):
                    began = time.perf_counter()
                    _compute()
                    run.log({"step_time_s": time.perf_counter() - began}, step=busy_step)
            finally:
                hog.kill()
                hog.wait()
    finally:
        os.sched_setaffinity(0, before)
    store = runwatch.open_store(db, readonly=True)
    live = store.anomalies("live", source="live")
    assert "host_busy" in set(live["detector"])
    # Whatever the machine did to the quiet steps, the steps slowed by the hog are held.
    timing = live[(live["detector"] == "regression") & (live["severity"] != "info")]
    assert (timing["start_step"] < busy_from).all()
    replay = analyze_frame(store.read_points("live"))
    assert sorted(zip(live["detector"], live["metric"], live["start_step"], strict=True)) == (
        sorted((a.detector, a.metric, a.start_step) for a in replay)
    )
