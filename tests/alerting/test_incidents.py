"""Alerts per incident (issue 17, item 7): one message per incident, then updates; verdicts
feed back (benign folds quietly, real alerts, a reopened incident alerts again).

A real store: episodes are saved and the run's incidents formed by the same calls live
detection makes (``save_anomalies``, ``refresh_incidents``), then handed to the engine. The
packaged default rules, a fake clock, and a real HTTP receiver that gets what is sent (its
signature check is left to the tests on real time: the fake clock's timestamps are stale).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import runwatch
from runwatch.alerting.alert import alert_from_anomaly
from runwatch.alerting.engine import AlertEngine
from runwatch.alerting.grouping import Notification
from runwatch.alerting.payloads import alertmanager_alerts, alertmanager_webhook, slack
from runwatch.alerting.rules import load_rules, parse_rules
from runwatch.model import Anomaly, Event
from runwatch.pipeline.incidents import refresh_incidents
from runwatch.store import open_store


class LiveRun:
    """What live detection does for the run ``gpt``: store episodes, form incidents, then
    tell the engine; the engine's messages are delivered to the receiver."""

    def __init__(self, store_path: str, engine: AlertEngine, clock: Any) -> None:
        self.store_path = store_path
        self.engine = engine
        self.clock = clock
        self.ids: dict[int, int] = {}
        self.kept: list[Anomaly] = []  # ``ids`` is keyed by id(anomaly): keep them alive

    def episode(
        self,
        step: int,
        detector: str = "spike",
        severity: str = "warning",
        observed: float = 9.0,
        is_open: bool = False,
    ) -> int:
        anomaly = Anomaly(
            detector=detector,
            metric="loss",
            start_step=step,
            end_step=step,
            severity=severity,
            score=7.5,
            observed=observed,
            message=f"loss {detector} at step {step}",
            labels={},
            expected=3.0,
            lower=2.8,
            upper=3.2,
            is_open=is_open,
        )
        self.kept.append(anomaly)
        return self._save(anomaly)

    def close(self, row: int, end_step: int) -> None:
        """The open episode stored as ``row`` ends at ``end_step``."""
        [anomaly] = [a for a in self.kept if self.ids[id(a)] == row]
        anomaly.end_step, anomaly.is_open = end_step, False
        self._save(anomaly)

    def failure(self, kind: str, step: int, message: str, at: float, rank: int = 0) -> None:
        """A failure event logged at time ``at``: stored, incidents formed, alerting told."""
        with open_store(self.store_path) as store:
            run_id = store.run_id("gpt")
            store.add_events(run_id, 1, [Event(kind, step, at, message, rank, "node-3")])
            refresh_incidents(store, run_id, "live")
        self.engine.observe("gpt", "lm", [], failures=True)

    def _save(self, anomaly: Anomaly) -> int:
        with open_store(self.store_path) as store:
            run_id = store.run_id("gpt")
            store.save_anomalies(run_id, "live", [anomaly], self.ids)
            refresh_incidents(store, run_id, "live")
        row = self.ids[id(anomaly)]
        self.engine.observe("gpt", "lm", [(row, anomaly)])
        return row

    def send(self) -> int:
        """Flush what is due and deliver it; the number of messages written."""
        written = self.engine.tick()
        delivered = sum(1 for _ in iter(self.engine.sender.run_once, False))
        assert delivered >= min(written, 1)  # the receiver took what was written
        return written

    def incident(self, row: int) -> tuple[int, str]:
        with open_store(self.store_path) as store:
            found = store.incident_of(row)
        assert found is not None
        return found

    def verdict(self, incident: int, verdict: str, note: str = "") -> None:
        with open_store(self.store_path) as store:
            store.add_verdict(verdict, incident_id=incident, note=note, author="test")


@pytest.fixture
def live(store_path: str, clock: Any, receiver: Any) -> Iterator[LiveRun]:
    rules = load_rules(webhook=receiver.url, env={"RUNWATCH_WEBHOOK_SECRET": receiver.secret})
    engine = AlertEngine(rules, store_path, clock=clock, rng=random.Random(1), start=False)
    yield LiveRun(store_path, engine, clock)
    engine.sender.close()


def bodies(receiver: Any) -> list[dict[str, Any]]:
    return [r["body"] for r in receiver.received]


def test_recurring_spikes_of_one_incident_are_one_notification_then_updates(
    live: LiveRun, receiver: Any
) -> None:
    first = live.episode(150)
    assert live.send() == 0  # the warning route's group_wait (10 s)
    live.clock.advance(10)
    assert live.send() == 1
    for step in (350, 550, 750):  # three more within a minute: they fold into the group
        live.clock.advance(5)
        live.episode(step)
        assert live.send() == 0
    live.clock.advance(60)
    assert live.send() == 1  # one update for the three
    live.clock.advance(600)
    live.episode(950)  # a recurrence long after: an update at once, no new group_wait
    assert live.send() == 1
    got = bodies(receiver)
    assert len(got) == 3  # for 5 spikes
    incident, status = live.incident(first)
    assert status == "open"
    assert {b["group_key"] for b in got} == {got[0]["group_key"]}
    assert [b["sequence"] for b in got] == [1, 2, 3]
    assert [b["incident"]["id"] for b in got] == [incident] * 3
    assert [b["incident"]["count"] for b in got] == [1, 4, 5]
    assert [len(b["alerts"]) for b in got] == [1, 3, 1]
    assert {a["incident_id"] for b in got for a in b["alerts"]} == {incident}
    assert got[0]["group_labels"] == {"run": "gpt", "incident": str(incident)}
    last = got[-1]
    assert last["incident"]["title"].startswith("5 loss spikes of ×3, steps 150–950")
    assert last["summary"].startswith(f"[WARNING] gpt: incident {incident} (5 loss spikes")
    assert last["incidents"] == [last["incident"]]


def test_an_incident_fires_while_open_and_resolves_when_it_closes(
    live: LiveRun, receiver: Any
) -> None:
    row = live.episode(100, "nonfinite", "critical", float("nan"), is_open=True)
    assert live.send() == 1  # critical: no group_wait
    live.clock.advance(5)
    live.close(row, 140)
    assert live.send() == 0  # within the critical route's group_interval (30 s)
    live.clock.advance(25)
    assert live.send() == 1
    first, last = bodies(receiver)
    assert (first["status"], first["incident"]["is_active"]) == ("firing", True)
    assert (last["status"], last["incident"]["is_active"]) == ("resolved", False)
    assert first["group_key"] == last["group_key"] and last["sequence"] == 2
    assert last["alerts"][0]["end_step"] == 140


def test_an_incident_that_grows_without_a_new_alert_is_updated(
    live: LiveRun, receiver: Any
) -> None:
    live.episode(100, "nonfinite", "critical", float("nan"), is_open=True)
    assert live.send() == 1
    # An info loss spike just before the NaN joins its incident: no alert of its own (info
    # is not routed), but the incident now has two members.
    live.episode(90, "spike", "info", 4.0)
    live.clock.advance(30)
    assert live.send() == 1
    first, update = bodies(receiver)
    assert update["incident"]["id"] == first["incident"]["id"]
    assert (first["incident"]["count"], update["incident"]["count"]) == (1, 2)
    assert [a["detector"] for a in update["alerts"]] == ["nonfinite"]
    live.clock.advance(30)
    assert live.send() == 0  # nothing changed since


def test_benign_incident_folds_new_members_quietly_and_real_alerts_again(
    live: LiveRun, receiver: Any
) -> None:
    first = live.episode(150)
    live.clock.advance(10)
    assert live.send() == 1
    incident, _ = live.incident(first)
    live.verdict(incident, "benign", "the data loader's shard boundary")
    for step in (350, 550):
        live.clock.advance(120)
        row = live.episode(step)
        assert live.incident(row) == (incident, "benign")
        assert live.send() == 0
    live.clock.advance(3600)
    assert live.send() == 0  # still nothing: no reminder, no update of a benign incident
    assert len(receiver.received) == 1
    assert live.engine.folded == 2 and live.engine.folded_by_incident[incident] == 2
    with open_store(live.store_path) as store:
        [count] = store.incidents("gpt", source="live", status="benign")["count"]
    assert count == 3  # folded in, counted, visible

    live.verdict(incident, "real", "bad shard s17: the loader repeats its last batch")
    live.clock.advance(120)
    live.episode(750)
    assert live.send() == 1
    update = bodies(receiver)[-1]
    assert update["incident"]["id"] == incident and update["incident"]["status"] == "real"
    assert update["incident"]["count"] == 4
    assert update["incident"]["verdict_note"].startswith("bad shard s17")
    assert [a["step"] for a in update["alerts"]] == [750]


def test_benign_incident_that_gets_worse_is_open_again_and_alerts(
    live: LiveRun, receiver: Any
) -> None:
    first = live.episode(150)
    live.clock.advance(10)
    assert live.send() == 1
    incident, _ = live.incident(first)
    live.verdict(incident, "benign")
    # The loss goes non-finite 20 steps after the spike: the spike's consequence, so the
    # same incident, now critical -- worse than when it was judged.
    live.clock.advance(120)
    row = live.episode(170, detector="nonfinite", severity="critical", observed=float("nan"))
    assert live.incident(row) == (incident, "open")
    assert live.send() == 1  # the critical route: at once
    msg = bodies(receiver)[-1]
    assert msg["incident"]["id"] == incident and msg["incident"]["status"] == "open"
    assert "after the benign verdict" in msg["incident"]["reopened"]
    assert [(a["step"], a["severity"]) for a in msg["alerts"]] == [(170, "critical")]


def test_a_silence_on_the_incident_label_mutes_that_incident_only(
    live: LiveRun, receiver: Any
) -> None:
    first = live.episode(150)
    incident, _ = live.incident(first)
    with open_store(live.store_path) as store:
        store.add_silence({"incident": str(incident)}, live.clock.now + 3600)
    live.clock.advance(2)  # past the engine's silence refresh
    other = live.episode(5000, detector="nonfinite", severity="critical", observed=float("nan"))
    live.clock.advance(10)
    assert live.send() == 1
    [msg] = bodies(receiver)
    assert msg["incident"]["id"] == live.incident(other)[0] != incident


def test_an_explicit_group_by_is_kept_and_messages_name_every_incident(
    store_path: str, clock: Any, receiver: Any
) -> None:
    rules = parse_rules(
        f"""version: 1
defaults: {{group_by: [run, detector, metric], group_wait: 30s, group_interval: 5m}}
channels:
  ops: {{type: webhook, url: "{receiver.url}"}}
routes:
  - channels: [ops]
""",
        "team.yaml",
        env={},
    )
    engine = AlertEngine(rules, store_path, clock=clock, start=False)
    live = LiveRun(store_path, engine, clock)
    try:
        a = live.episode(150)
        b = live.episode(5000, observed=40.0, severity="critical")  # another shape
        clock.advance(30)
        assert live.send() == 1
    finally:
        engine.sender.close()
    [msg] = bodies(receiver)
    assert msg["group_labels"] == {"run": "gpt", "detector": "spike", "metric": "loss"}
    ids = sorted({live.incident(a)[0], live.incident(b)[0]})
    assert len(ids) == 2
    assert msg["incident"] is None
    assert [i["id"] for i in msg["incidents"]] == ids


def _note(incident: dict[str, Any]) -> Notification:
    rules = parse_rules(
        'version: 1\nchannels: {a: {type: webhook, url: "http://x/y"}}\n'
        "routes: [{channels: [a]}]\n",
        "r.yaml",
        env={},
    )
    anomaly = Anomaly("spike", "loss", 350, 350, "warning", 7.5, 9.0, "loss spike", {}, 3.0)
    alert = alert_from_anomaly(11, anomaly, "gpt", "lm", 1_800_000_000.0)
    alert.labels["incident"] = str(incident["id"])
    return Notification(
        rules.routes[0], "0:k", {"run": "gpt", "incident": "4"}, (alert,), (incident,), 2
    )


INCIDENT = {
    "id": 4,
    "run": "gpt",
    "title": "3 loss spikes of ×3, steps 150–550, about every 200 steps",
    "status": "open",
    "severity": "warning",
    "count": 3,
    "first_step": 150,
    "last_step": 550,
    "is_active": False,
    "summary": "3 of 3 spikes in steps reading shard s17, which is 4% of steps",
    "top_hypothesis": {"cause": "shard=s17", "score": 12.0, "evidence": "3 of 3 ..."},
    "verdict_note": None,
    "reopened": None,
}


def test_slack_and_alertmanager_bodies_name_the_incident() -> None:
    note = _note(INCIDENT)
    body = slack(note, 50, None)
    texts = [b["text"]["text"] for b in body["blocks"] if b["type"] == "section"]
    assert texts[1] == (
        "*Incident 4*: 3 loss spikes of ×3, steps 150–550, about every 200 steps (3 in all, "
        "open)\n_Likely cause:_ 3 of 3 spikes in steps reading shard s17, which is 4% of steps"
    )
    assert body["text"].startswith("[WARNING] gpt: incident 4 (3 loss spikes of ×3")
    am = alertmanager_webhook(note, "ops", "rw-k", 50, None)
    assert am["groupLabels"] == {"run": "gpt", "incident": "4"}
    [alert] = am["alerts"]
    assert alert["labels"]["incident"] == "4"
    assert alert["annotations"]["incident_count"] == "3"
    assert alert["annotations"]["incident_summary"].startswith("3 of 3 spikes")
    [posted] = alertmanager_alerts(note, None)
    assert posted["annotations"]["incident_title"] == INCIDENT["title"]


# -- the real path: runwatch.init, live detection, incidents, the engine, HTTP ---------------
FOLD = """version: 1
defaults: {group_wait: 0s, group_interval: 1h}
channels:
  default: {type: webhook, url_env: RUNWATCH_WEBHOOK_URL, secret_env: RUNWATCH_WEBHOOK_SECRET}
routes:
  - match: {min_severity: warning}
    channels: [default]
"""


def test_a_run_with_recurring_spikes_sends_one_message_and_an_update_at_finish(
    receiver: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("RUNWATCH_WEBHOOK_SECRET", receiver.secret)
    rules = tmp_path / "fold.yaml"
    rules.write_text(FOLD)
    rng = random.Random(0)
    run = runwatch.init("spiky", store=tmp_path / "run.db", webhook=receiver.url, alerts=rules)
    try:
        for step in range(1500):
            loss = 3.0 / (1 + step) ** 0.3 * (1 + 0.01 * rng.random())
            if step % 200 == 150:
                loss *= 3.0  # 7 spikes of x3: one recurring incident, warnings
            run.log({"loss": loss, "grad_norm": 1.0 + 0.05 * rng.random()}, step=step)
            if step % 200 == 151:
                time.sleep(0.3)  # let live detection see each spike on its own
        assert receiver.wait_for(lambda r: r.received, 10)
    finally:
        run.finish()
    got = bodies(receiver)
    with open_store(tmp_path / "run.db") as store:
        incidents = store.incidents("spiky", source="live")
    [incident] = incidents[incidents["severity"] == "warning"]["id"]
    # Not one per spike: the first at once, then one update at finish with what folded in.
    assert len(got) == 2
    assert got[0]["incident"]["count"] < got[1]["incident"]["count"]
    assert [b["sequence"] for b in got] == list(range(1, len(got) + 1))
    assert {b["incident"]["id"] for b in got} == {incident}
    assert got[-1]["incident"]["count"] == 7
    steps = {a["step"] for b in got for a in b["alerts"]}
    assert steps == {150, 350, 550, 750, 950, 1150, 1350}
    assert receiver.bad_signatures == 0


def _default_rules_run(receiver: Any, tmp_path: Path, monkeypatch: Any) -> runwatch.Run:
    """A run alerting the receiver by ``webhook=`` with the packaged default rules."""
    monkeypatch.delenv("RUNWATCH_ALERTS", raising=False)
    monkeypatch.setenv("RUNWATCH_WEBHOOK_SECRET", receiver.secret)
    return runwatch.init("gpt", store=tmp_path / "run.db", webhook=receiver.url)


def test_a_nan_names_its_incident_and_still_leaves_at_once_with_default_rules(
    receiver: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    run = _default_rules_run(receiver, tmp_path, monkeypatch)
    try:
        for step in range(100):
            run.log({"loss": 3.0 / (1 + step) ** 0.3}, step=step)
        run.log({"loss": float("nan")}, step=100)
        step = 101
        # Healthy steps at ~50/s while the alert travels; its time is bench/alert_latency.py's.
        while not receiver.received and step < 600:
            run.log({"loss": 3.0 / (1 + step) ** 0.3}, step=step)
            step += 1
            time.sleep(0.02)
        assert receiver.received, "no alert while the run went on"
    finally:
        run.finish()
    first = bodies(receiver)[0]
    assert [a["detector"] for a in first["alerts"]] == ["nonfinite"]
    incident = first["incident"]
    assert incident["severity"] == "critical" and incident["count"] == 1
    assert first["alerts"][0]["incident_id"] == incident["id"]
    assert first["group_labels"] == {"run": "gpt", "incident": str(incident["id"])}


CUDA_CRASH = "RuntimeError: CUDA error: an illegal memory access was encountered at 0x7f3a9c"


def test_a_crash_alerts_at_once_in_its_incident_and_a_recurrence_updates_it(
    store_path: str, clock: Any, receiver: Any
) -> None:
    clock.now = time.time()  # failure events carry wall-clock times
    rules = load_rules(webhook=receiver.url, env={"RUNWATCH_WEBHOOK_SECRET": receiver.secret})
    engine = AlertEngine(rules, store_path, clock=clock, start=False)
    live = LiveRun(store_path, engine, clock)
    try:
        old = CUDA_CRASH.replace("0x7f3a9c", "0x5e0010")  # the same signature
        live.failure("crash", 1200, old, at=clock.now - 600)
        assert live.send() == 0  # logged before this engine started: its process told it
        clock.advance(1)  # (one run's failure events are read at most twice a second)
        live.failure("crash", 2400, CUDA_CRASH, at=clock.now)
        assert live.send() == 1  # critical: no group_wait
        clock.advance(30)
        assert live.send() == 1  # told, so over: resolved at the next update
        clock.advance(600)
        live.failure("crash", 3600, CUDA_CRASH.replace("0x7f3a9c", "0x11aa02"), at=clock.now)
        assert live.send() == 1  # the same signature: the same incident, updated at once
    finally:
        engine.sender.close()
    first, resolved, again = bodies(receiver)
    alert = first["alerts"][0]
    assert (alert["detector"], alert["severity"], alert["step"]) == ("crash", "critical", 2400)
    assert alert["id"] is None and alert["event_id"] > 0
    assert alert["labels"]["rank"] == "0" and alert["labels"]["host"] == "node-3"
    assert alert["summary"] == f"gpt: crash (rank 0, host node-3): {CUDA_CRASH} at step 2400"
    assert first["status"] == "firing" and resolved["status"] == "resolved"
    incident = first["incident"]
    assert incident["severity"] == "critical" and incident["count"] == 2  # both attempts
    assert again["incident"]["id"] == incident["id"] and again["incident"]["count"] == 3
    assert [a["step"] for a in again["alerts"]] == [3600]
    assert again["group_key"] == first["group_key"] and again["sequence"] == 3


def test_a_crash_in_a_real_run_reaches_the_webhook_with_its_incident(
    receiver: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    run = _default_rules_run(receiver, tmp_path, monkeypatch)
    try:
        for step in range(50):
            run.log({"loss": 3.0 / (1 + step) ** 0.3}, step=step)
        run.event("crash", message=CUDA_CRASH, rank=3, host="node-1")
        assert receiver.wait_for(lambda r: r.received, 10), "no alert for the crash"
    finally:
        run.finish()
    first = bodies(receiver)[0]
    [alert] = first["alerts"]
    assert (alert["detector"], alert["severity"], alert["step"]) == ("crash", "critical", 49)
    assert first["incident"]["count"] == 1 and first["incident"]["id"] == alert["incident_id"]
    assert receiver.bad_signatures == 0


def test_a_storm_of_error_logs_with_one_signature_is_one_message(
    live: LiveRun, receiver: Any
) -> None:
    for i in range(30):  # 30 error lines in 6 s, one signature (numbers, addresses differ)
        live.failure("log", 100 + i, f"worker {i}: connection reset by 10.0.0.{i}", live.clock.now)
        assert live.send() == 0  # warnings: the route's group_wait (10 s) collects them
        live.clock.advance(0.2)
    live.clock.advance(10)
    assert live.send() == 1
    [msg] = bodies(receiver)
    assert msg["counts"]["total"] == 30 and msg["counts"]["firing"] == 30
    assert msg["incident"]["count"] == 30
    assert {a["detector"] for a in msg["alerts"]} == {"log"}
