"""A sender process killed with SIGKILL mid-delivery: a new process sends what was pending."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

from runwatch.store import open_store

SENDER = textwrap.dedent(
    """
    import sys, time
    from runwatch.alerting.rules import load_rules
    from runwatch.alerting.sender import Sender

    sender = Sender(sys.argv[1], load_rules(sys.argv[2], env={}), lease_margin=0.5)
    sender.start()
    print("started", flush=True)
    time.sleep(120)
    """
)


def start_sender(store_path: str, rules: Path, script: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(script), store_path, str(rules)],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    return proc


def test_sender_killed_mid_delivery_resumes_after_restart(
    receiver: Any, store_path: str, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        f"""version: 1
channels:
  hook: {{type: webhook, url: "{receiver.url}", secret: hunter2-signing-key,
          timeout: 500ms, concurrency: 2}}
routes:
  - channels: [hook]
"""
    )
    script = tmp_path / "sender.py"
    script.write_text(SENDER)
    keys = [f"rw-crash-{i:04d}" for i in range(300)]
    with open_store(store_path) as store:
        store.enqueue_alerts((k, "hook", f'{{"i": {i}}}', "") for i, k in enumerate(keys))
    receiver.delay = 0.01  # slow enough to be killed in the middle

    first = start_sender(store_path, rules, script)
    try:
        assert receiver.wait_for(lambda r: len(r.keys()) >= 40, 20)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    assert first.returncode == -signal.SIGKILL
    got_before = len(set(receiver.keys()))
    assert got_before < 300
    with open_store(store_path) as store:
        assert store.pending_alerts() > 0

    killed_at = time.monotonic()
    second = start_sender(store_path, rules, script)
    try:
        assert receiver.wait_for(lambda r: len(set(r.keys())) == 300, 30)
        with open_store(store_path) as store:
            deadline = time.monotonic() + 10
            while store.pending_alerts() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert store.pending_alerts() == 0
            assert set(store.outbox()["status"]) == {"sent"}
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(10)
    assert time.monotonic() - killed_at < 20
    counts = Counter(receiver.keys())
    assert set(counts) == set(keys)  # nothing lost
    # At-least-once: only messages in flight when the first process died can come twice,
    # at most one claim (2 workers x 4 rounds).
    assert sum(n - 1 for n in counts.values()) <= 8
    assert receiver.bad_signatures == 0
