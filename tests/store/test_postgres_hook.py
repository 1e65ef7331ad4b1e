"""``runwatch.init(store="postgresql://...")``: the hook writes to a real PostgreSQL database,
with live detection, and no message shows the URL's password."""

from __future__ import annotations

import logging

import runwatch


def test_a_run_logs_into_postgresql_with_live_detection(pg_url, caplog):
    caplog.set_level(logging.DEBUG, logger="runwatch")
    run = runwatch.init(name="pg-run", store=pg_url, cpu_wait=False)
    for step in range(50):
        run.log({"loss": 3.0 / (step + 1)}, step=step)
    run.log({"loss": float("nan")}, step=50)
    run.finish()
    with runwatch.open_store(pg_url, readonly=True) as store:
        assert store.read_series("pg-run", "loss")["step"].tolist() == list(range(51))
        found = store.anomalies("pg-run")
        open_blocks = store._conn.execute(
            "SELECT COUNT(*) FROM point_blocks WHERE sealed = 0"
        ).fetchone()[0]
    assert open_blocks == 0  # the finished run's points are sealed
    assert found[["detector", "start_step"]].values.tolist() == [["nonfinite", 50]]
    password = pg_url.split(":")[2].split("@")[0]
    assert password not in caplog.text


def test_a_runs_live_detection_owns_the_run_while_it_runs(pg_url):
    """A ``runwatch serve`` replica on the same database leaves the run to the process that
    detects it (by default the run's child, ``runwatch.live_process``, or this one with
    ``live_detection="thread"``), and could take it over if that process died
    (tests/server/test_run_ownership.py)."""
    import os
    import time

    from runwatch.store.run_locks import run_owner

    for where in ("process", "thread"):
        name = f"pg-owned-{where}"
        run = runwatch.init(name=name, store=pg_url, cpu_wait=False, live_detection=where)
        run.log({"loss": 1.0}, step=0)
        run.flush()
        with runwatch.open_store(pg_url, readonly=True) as store:
            run_id = store.run_id(name)
        detector = run._extras.process._proc.pid if where == "process" else os.getpid()
        deadline = time.monotonic() + 30  # the child takes the lock once it has started
        while run_owner(pg_url, run_id) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert run_owner(pg_url, run_id) == detector
        run.finish()
        assert run_owner(pg_url, run_id) is None


def test_a_restarted_child_takes_the_run_back_and_detects_on_postgresql(pg_url):
    """The child killed mid-run: its session's lock goes with it, and the next child takes
    it, replays the run and finds a NaN logged after the kill."""
    import os
    import signal
    import time

    from runwatch.store.run_locks import run_owner

    run = runwatch.init(name="pg-restart", store=pg_url, cpu_wait=False)
    for step in range(50):
        run.log({"loss": 3.0 / (step + 1)}, step=step)
    assert run.flush()
    process = run._extras.process
    os.kill(process._proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while process.restarts < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.restarts == 1
    with runwatch.open_store(pg_url, readonly=True) as store:
        run_id = store.run_id("pg-restart")
    while run_owner(pg_url, run_id) != process._proc.pid and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run_owner(pg_url, run_id) == process._proc.pid
    for step in range(50, 100):
        run.log({"loss": float("nan") if step == 80 else 3.0 / (step + 1)}, step=step)
    run.finish()
    with runwatch.open_store(pg_url, readonly=True) as store:
        assert store.read_series("pg-restart", "loss")["step"].tolist() == list(range(100))
        found = store.anomalies("pg-restart")
    assert found[["detector", "start_step"]].values.tolist() == [["nonfinite", 80]]
