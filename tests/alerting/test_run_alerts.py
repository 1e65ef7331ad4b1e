"""The real path: runwatch.init(webhook=..., alerts=...) -> run.log(NaN) -> webhook receipt."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

import runwatch
from runwatch.store import open_store

FAST = """version: 1
defaults: {group_wait: 0, group_interval: 1s}
channels:
  default: {type: webhook, url_env: RUNWATCH_WEBHOOK_URL, secret_env: RUNWATCH_WEBHOOK_SECRET}
routes:
  - match: {min_severity: warning}
    channels: [default]
"""


def test_nan_loss_reaches_the_webhook_and_finish_waits_for_it(
    receiver: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("RUNWATCH_WEBHOOK_SECRET", receiver.secret)
    rules = tmp_path / "fast.yaml"
    rules.write_text(FAST)
    db = tmp_path / "run.db"
    receiver.delay = 0.3  # finish() must wait for this answer
    run = runwatch.init("gpt", store=db, webhook=receiver.url, alerts=rules, prometheus_port=0)
    for step in range(200):
        run.log({"loss": 3.0 / (1 + step) ** 0.3}, step=step)
    run.log({"loss": float("nan")}, step=200)
    assert receiver.wait_for(lambda r: r.received, 10)
    port = run._extras.alerting.exporter.port
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert 'runwatch_run_step{project="",run="gpt"} 200.0' in metrics
    for step in range(201, 260):
        run.log({"loss": 3.0 / (1 + step) ** 0.3}, step=step)
    run.finish()  # closes the NaN episode: a resolved message, waited for
    bodies = [r["body"] for r in receiver.received]
    assert bodies[0]["status"] == "firing"
    alert = bodies[0]["alerts"][0]
    assert (alert["detector"], alert["metric"], alert["step"], alert["observed"]) == (
        "nonfinite",
        "loss",
        200,
        "nan",
    )
    assert bodies[-1]["status"] == "resolved"
    assert receiver.bad_signatures == 0
    with open_store(db) as store:
        assert store.pending_alerts() == 0
        assert set(store.outbox()["status"]) == {"sent"}


def test_finish_wait_for_alerts_is_bounded(receiver: Any, tmp_path: Path) -> None:
    rules = tmp_path / "fast.yaml"
    rules.write_text(FAST)
    receiver.stop()
    db = tmp_path / "run.db"
    run = runwatch.init("gpt", store=db, webhook=receiver.url, alerts=rules, alert_timeout=0.5)
    run.log({"loss": float("nan")}, step=0)
    started = time.monotonic()
    run.finish()
    assert time.monotonic() - started < 5
    with open_store(db) as store:
        assert store.pending_alerts() >= 1  # kept for the next process, not lost


def test_no_alerting_options_start_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("RUNWATCH_WEBHOOK_URL", raising=False)
    monkeypatch.delenv("RUNWATCH_ALERTS", raising=False)
    with runwatch.init("plain", store=tmp_path / "p.db") as run:
        assert run._extras.alerting is None


def test_bad_rules_file_fails_init_with_file_and_line(tmp_path: Path) -> None:
    rules = tmp_path / "bad.yaml"
    rules.write_text("version: 1\nroutes:\n  - channels: [x]\n    group_wait: soon\n")
    try:
        runwatch.init("bad", store=tmp_path / "b.db", alerts=rules)
    except ValueError as exc:
        assert str(exc).startswith(f"{rules}:")
    else:
        raise AssertionError("init accepted a bad rules file")


def test_a_killed_training_process_sends_a_crash_alert(
    receiver: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """Live detection's process outlives a SIGKILLed training process, records the crash and
    alerts on it: no other tool here tells anyone that the OOM killer took the run."""
    rules = tmp_path / "fast.yaml"
    rules.write_text(FAST)
    db = tmp_path / "run.db"
    env = {**os.environ, "RUNWATCH_WEBHOOK_SECRET": receiver.secret}
    script = (
        "import sys, runwatch\n"
        "run = runwatch.init('oom', store=sys.argv[1], webhook=sys.argv[2], alerts=sys.argv[3])\n"
        "for step in range(100):\n"
        "    run.log({'loss': 3.0 / (1 + step) ** 0.3}, step=step)\n"
        "run.flush()\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(db), receiver.url, str(rules)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    names_it = f"pid {child.pid}"
    assert receiver.wait_for(
        lambda r: any(names_it in json.dumps(m["body"]) for m in r.received), 30
    )
    # Firing, or already resolved when the child closed the run's episodes before the
    # engine's first send (a loaded machine): either way the message names the crash.
    bodies = [json.dumps(m["body"]) for m in receiver.received]
    assert any("crash" in body and names_it in body for body in bodies)
    assert receiver.bad_signatures == 0
