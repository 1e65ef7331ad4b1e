"""The hook across real processes: SIGKILL, fork, interpreter exit, uncaught exceptions."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import runwatch


def _python(code: str, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_sigkill_loses_at_most_the_last_second(db_path):
    # The child logs its wall clock as the value, so the store tells how recent the last
    # durable point is; it announces itself once the first points are surely written.
    child = _python(
        """
        import sys, time, runwatch
        run = runwatch.init(name="k", store=sys.argv[1])
        step = 0
        while True:
            run.log({"wall": time.time(), "loss": 1.0 / (step + 1)}, step=step)
            step += 1
            if step == 2000:
                run.flush(); print("ready", flush=True)
            time.sleep(0.0005)
        """,
        str(db_path),
    )
    assert child.stdout.readline().strip() == "ready"
    time.sleep(2.0)
    killed_at = time.time()
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    with runwatch.open_store(str(db_path)) as store:
        wall = store.read_series("k", "wall")["value"]
        assert killed_at - wall.max() <= 1.0
        assert wall.is_monotonic_increasing and len(wall) > 2000


def test_forked_child_neither_hangs_nor_writes_and_the_parent_goes_on(db_path):
    child = _python(
        """
        import os, sys, runwatch
        run = runwatch.init(name="f", store=sys.argv[1])
        run.log({"loss": 1.0}, step=0)
        pid = os.fork()
        if pid == 0:
            run.log({"loss": 99.0}, step=1)   # a DataLoader worker logging by mistake
            run.finish()
            print("child", run.stats()["dropped"], flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        run.log({"loss": 0.5}, step=1)
        run.finish()
        print("parent", run.stats()["dropped"], flush=True)
        """,
        str(db_path),
    )
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert "child {'forked_child': 1}" in out and "parent {}" in out
    with runwatch.open_store(str(db_path)) as store:
        assert store.read_series("f", "loss")["value"].tolist() == [1.0, 0.5]


def test_interpreter_exit_without_finish_flushes_everything(db_path):
    child = _python(
        """
        import sys, runwatch
        run = runwatch.init(name="x", store=sys.argv[1])
        for step in range(50_000):
            run.log({"loss": 1.0, "gn": 2.0}, step=step)
        """,
        str(db_path),
    )
    _, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    with runwatch.open_store(str(db_path)) as store:
        assert len(store.read_series("x", "gn")) == 50_000
        assert store.runs().iloc[0]["status"] == "finished"


def test_uncaught_exception_records_a_crash(db_path):
    child = _python(
        """
        import sys, runwatch
        run = runwatch.init(name="c", store=sys.argv[1])
        run.log({"loss": 1.0}, step=7)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
        """,
        str(db_path),
    )
    child.communicate(timeout=60)
    assert child.returncode == 1
    with runwatch.open_store(str(db_path)) as store:
        assert store.runs().iloc[0]["status"] == "crashed"
        crash = store.events("c", kinds=["crash"]).iloc[0]
        assert "illegal memory access" in crash["message"] and crash["step"] == 7
