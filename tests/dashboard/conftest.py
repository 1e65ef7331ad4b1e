"""Fixtures: a real demo store (through the hook, live detection on) and sibling runs."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from runwatch.dashboard.server import dashboard_command, free_port, url_of, wait_ready
from runwatch.demo.runner import run_demo
from runwatch.store import open_store

APP_DIR = Path(__file__).resolve().parents[2] / "runwatch" / "dashboard"


def write_run(db: Path, name: str, steps: int, config: dict, *, loss_scale: float = 1.0) -> None:
    """A finished run written through Store.write (arrays): fast, and exact."""
    with open_store(db) as store:
        run_id, attempt = store.start_run(name, project="sizes", config=config, now=1000.0)
        s = np.arange(1, steps + 1)
        t = 1000.0 + s * 0.5
        loss = loss_scale * (2.0 + 8.0 * (s + 10.0) ** -0.4)
        arrays = {
            store.series_id(run_id, "loss"): (s, t, loss),
            store.series_id(run_id, "lr"): (s, t, np.full(steps, 3e-4)),
        }
        store.write(run_id, attempt, arrays)
        store.set_run_status(run_id, "finished", now=t[-1])


@pytest.fixture(scope="session")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo scenario (400 steps): spike, NaN, crash + restart, slowdown; live anomalies."""
    path = tmp_path_factory.mktemp("demo") / "demo.db"
    run_demo(str(path), steps=400, name="demo-400")
    return path


@pytest.fixture
def fresh_demo_db(tmp_path: Path, demo_db: Path) -> Path:
    """A private copy of the demo store, for tests that write verdicts."""
    import shutil

    path = tmp_path / "demo.db"
    shutil.copy(demo_db, path)
    return path


@pytest.fixture(scope="session")
def siblings_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three finished runs of growing size with known params, for the scaling view."""
    path = tmp_path_factory.mktemp("siblings") / "siblings.db"
    for i, params in enumerate((1e7, 4e7, 1.6e8)):
        write_run(
            path,
            f"size-{i}",
            300,
            {"params": params, "tokens_per_step": 65536, "steps": 300},
            loss_scale=1.0 - 0.1 * i,
        )
    return path


@contextmanager
def dashboard_server(db: Path, port: int) -> Iterator[str]:
    """`runwatch dashboard` on ``db`` in a subprocess (the first free port from ``port``);
    yields its URL, and stops it (SIGTERM, then kill) after."""
    port = free_port("127.0.0.1", port)
    proc = subprocess.Popen(
        dashboard_command(db, port),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ},
    )
    url = url_of("127.0.0.1", port)
    try:
        if not wait_ready(url, timeout=60, proc=proc):
            proc.kill()
            out = proc.stdout.read().decode() if proc.stdout else ""
            pytest.fail(f"dashboard did not start: {out}")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
