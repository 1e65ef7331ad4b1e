"""Default rules, real path: a NaN pages within seconds, and a storm of them is one message.

``runwatch.init(webhook=URL)`` with the packaged rules, a real HTTP receiver on 127.0.0.1.
The bound here is generous (3 s) so a loaded machine does not fail it; the figure itself
(p99 <= 1 s) is measured by ``bench/alert_latency.py``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import runwatch
from runwatch.alerting.rules import default_rules_text, parse_rules

BOUND_S = 3.0


@pytest.fixture(autouse=True)
def _packaged_rules(monkeypatch: Any) -> None:
    monkeypatch.delenv("RUNWATCH_ALERTS", raising=False)
    monkeypatch.delenv("RUNWATCH_WEBHOOK_URL", raising=False)
    monkeypatch.setenv("RUNWATCH_WEBHOOK_SECRET", "hunter2-signing-key")


def _healthy(step: int) -> dict[str, float]:
    return {"loss": 3.0 / (1 + step) ** 0.3, "grad_norm": 1.0}


def _nan_alerts(received: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for r in received for a in r["body"]["alerts"] if a["detector"] == "nonfinite"]


def _nan_messages(received: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in received if _nan_alerts([r])]


def test_nan_reaches_the_webhook_within_the_bound_with_default_rules(
    receiver: Any, tmp_path: Path
) -> None:
    run = runwatch.init("gpt", store=tmp_path / "run.db", webhook=receiver.url)
    for step in range(100):
        run.log(_healthy(step), step=step)
    logged = time.time()
    run.log({"loss": float("nan"), "grad_norm": 1.0}, step=100)
    # The run goes on (at about 50 steps/s) while the alert travels.
    step = 101
    while not receiver.received and time.time() - logged < 3 * BOUND_S:
        run.log(_healthy(step), step=step)
        step += 1
        time.sleep(0.02)
    try:
        assert receiver.received, "no alert within 9 s"
        first = receiver.received[0]
        assert first["time"] - logged < BOUND_S
        # A lone NaN followed by finite losses in the same flush is an episode that has
        # already closed: it is told (as resolved, with its numbers), not dropped.
        alert = first["body"]["alerts"][0]
        assert (alert["detector"], alert["metric"], alert["step"]) == ("nonfinite", "loss", 100)
        assert alert["severity"] == "critical"
    finally:
        run.finish()
    assert receiver.bad_signatures == 0


def test_a_nan_storm_folds_into_one_message_and_updates(receiver: Any, tmp_path: Path) -> None:
    run = runwatch.init("gpt", store=tmp_path / "run.db", webhook=receiver.url)
    for step in range(100):
        run.log(_healthy(step), step=step)
    # 50 NaNs in about 2 s: every other step, at 50 steps/s.
    nan_steps = list(range(100, 200, 2))
    for step in range(100, 200):
        if step in nan_steps:
            run.log({"loss": float("nan"), "grad_norm": 1.0}, step=step)
        else:
            run.log(_healthy(step), step=step)
        time.sleep(0.02)
    for step in range(200, 250):
        run.log(_healthy(step), step=step)
        time.sleep(0.02)
    assert receiver.wait_for(lambda r: _nan_messages(r.received), BOUND_S)
    during = len(_nan_messages(receiver.received))
    run.finish()
    # One message at once; the rest of the storm folds into its group, which is looked at
    # again after group_interval (30 s) or when the run finishes -- not 50 messages: the
    # first, then the one that says the group resolved.
    assert during == 1
    messages = _nan_messages(receiver.received)
    assert len(messages) == 2
    assert messages[0]["body"]["status"] == "firing"
    assert messages[-1]["body"]["status"] == "resolved"  # told when it closes
    steps = [a["step"] for a in _nan_alerts(messages)]
    assert all(100 <= s < 200 for s in steps)
    assert receiver.bad_signatures == 0


def test_default_rules_route_critical_at_once_and_warnings_after_group_wait() -> None:
    rules = parse_rules(default_rules_text(), webhook="http://127.0.0.1:1/h", env={})
    base = {"run": "r", "detector": "nonfinite", "metric": "loss"}
    [critical] = rules.routes_for(base | {"severity": "critical"})
    [warning] = rules.routes_for(base | {"severity": "warning"})
    assert (critical.group_wait, critical.group_interval) == (0.0, 30.0)
    assert (warning.group_wait, warning.group_interval) == (10.0, 60.0)
    assert critical.channels == warning.channels == ("default",)
    assert rules.routes_for(base | {"severity": "info"}) == []


OLD_DEFAULTS = """version: 1
defaults: {group_by: [run, detector, metric], group_wait: 10s, group_interval: 1m,
           repeat_interval: 4h, send_resolved: true}
channels:
  default: {type: webhook, url_env: RUNWATCH_WEBHOOK_URL}
routes:
  - match: {min_severity: warning}
    channels: [default]
"""


def test_an_old_rules_file_still_means_what_it_did() -> None:
    # The format did not change: a file without a critical route waits group_wait for all.
    rules = parse_rules(OLD_DEFAULTS, "old.yaml", webhook="http://127.0.0.1:1/h", env={})
    labels = {"run": "r", "detector": "nonfinite", "metric": "loss", "severity": "critical"}
    [route] = rules.routes_for(labels)
    assert (route.group_wait, route.group_interval) == (10.0, 60.0)
