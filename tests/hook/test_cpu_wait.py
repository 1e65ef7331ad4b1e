"""The hook logs how long the training thread waited for a CPU, read from the kernel."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import runwatch
from runwatch.detect.busy import BUSY_SHARE
from runwatch.hook.cpu_wait import CPU_WAIT_METRIC, CpuWait

pytestmark = pytest.mark.skipif(CpuWait.open() is None, reason="no per-thread schedstat")

HOG = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"


def _work(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
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
    assert pts["value"].between(0.0, 1.0).all()
    assert pts["step"].is_monotonic_increasing and pts["step"].iloc[0] == 0
    during = pts[pts["step"] >= busy_from + 10]["value"]
    assert len(during) >= 2
    assert during.median() >= max(BUSY_SHARE, 0.3)


def test_a_closed_reader_or_an_unknown_thread_reads_nothing():
    reader = CpuWait.open()
    assert reader is not None
    _work(0.01)
    first = reader.read()
    assert first is not None and 0.0 <= first <= 1.0
    reader.close()
    assert reader.read() is None
    assert CpuWait.open(tid=2**31 - 1) is None
