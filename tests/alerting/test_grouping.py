"""Grouping, inhibition, silences and resolved notifications, on a fake clock.

The engine writes to a real store's outbox; nothing is sent (the sender is not started),
so these tests read what *would* go out.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runwatch.alerting.engine import AlertEngine
from runwatch.alerting.rules import parse_rules
from runwatch.store import open_store

RULES = """version: 1
defaults: {group_wait: 30s, group_interval: 5m, repeat_interval: 4h}
channels:
  ops: {type: webhook, url: "http://127.0.0.1:9/x"}
routes:
  - match: {min_severity: warning}
    channels: [ops]
inhibit:
  - source: {severity: critical}
    target: {severity: warning}
    equal: [run]
"""


@pytest.fixture
def engine(store_path: str, clock: Any) -> Iterator[AlertEngine]:
    rules = parse_rules(RULES, "r.yaml", env={})
    eng = AlertEngine(rules, store_path, clock=clock, rng=random.Random(1), start=False)
    yield eng
    eng.sender.close()


def messages(store_path: str) -> list[dict]:
    with open_store(store_path) as store:
        rows = store.outbox()
        return [store.outbox_payload(int(i)) for i in rows["id"]]


def test_storm_of_1000_anomalies_from_512_ranks_is_one_message_per_group(
    engine: AlertEngine, clock: Any, store_path: str, make_anomaly: Callable[..., Any]
) -> None:
    anomaly = make_anomaly
    rng = random.Random(0)
    row = 0
    for batch in range(100):  # 1,000 anomalies within 10 s
        changes = []
        for _ in range(10):
            row += 1
            if row <= 512:
                changes.append((row, anomaly("spike", "loss", rank=row - 1, step=1000 + batch)))
            else:
                rank = rng.randrange(512)
                changes.append((row, anomaly("spike", "grad_norm", rank=rank, step=1000 + batch)))
        engine.observe("gpt", "lm", changes)
        assert engine.tick() == 0  # still inside group_wait
        clock.advance(0.1)
    clock.advance(26.0)  # both groups (the second began 5 s later) have waited 30 s
    assert engine.tick() == 2
    sent = messages(store_path)
    by_metric = {m["group_labels"]["metric"]: m for m in sent}
    assert set(by_metric) == {"loss", "grad_norm"}
    loss = by_metric["loss"]
    assert loss["counts"] == {"firing": 512, "resolved": 0, "total": 512, "shown": 50}
    assert loss["truncated_alerts"] == 462
    assert "512 alerts (512 firing), ranks 0-511, from step 1000" in loss["summary"]
    assert by_metric["grad_norm"]["counts"]["total"] == 488
    # The storm goes on, the groups do not change: nothing more until repeat_interval.
    clock.advance(300)
    engine.observe("gpt", "lm", [(1, anomaly("spike", "loss", rank=0, step=1200))])
    assert engine.tick() == 0
    clock.advance(4 * 3600)
    assert engine.tick() == 2  # a reminder of what still fires


def test_critical_for_a_run_mutes_its_warnings_until_it_resolves(
    engine: AlertEngine, clock: Any, store_path: str, make_anomaly: Callable[..., Any]
) -> None:
    anomaly = make_anomaly
    warnings = [(i + 1, anomaly("spike", "loss", rank=i)) for i in range(10)]
    engine.observe("gpt", "lm", warnings)
    engine.observe("other", "lm", [(50, anomaly("spike", "loss", rank=0))])
    engine.observe("gpt", "lm", [(99, anomaly("nonfinite", "loss", "critical", rank=3))])
    clock.advance(30)
    engine.tick()
    sent = messages(store_path)
    assert sorted((m["group_labels"]["run"], m["group_labels"]["detector"]) for m in sent) == [
        ("gpt", "nonfinite"),
        ("other", "spike"),
    ]
    # The critical closes: it is told as resolved, and gpt's warnings become visible.
    engine.observe(
        "gpt", "lm", [(99, anomaly("nonfinite", "loss", "critical", rank=3, is_open=False))]
    )
    clock.advance(300)
    engine.tick()
    new = messages(store_path)[len(sent) :]
    assert sorted((m["group_labels"]["detector"], m["status"]) for m in new) == [
        ("nonfinite", "resolved"),
        ("spike", "firing"),
    ]
    spike = next(m for m in new if m["group_labels"]["detector"] == "spike")
    assert spike["counts"]["total"] == 10


def test_episode_that_closes_is_told_resolved_once(
    engine: AlertEngine, clock: Any, store_path: str, make_anomaly: Callable[..., Any]
) -> None:
    anomaly = make_anomaly
    engine.observe("gpt", "lm", [(7, anomaly())])
    clock.advance(30)
    engine.tick()
    engine.observe("gpt", "lm", [(7, anomaly(is_open=False, step=100))])
    clock.advance(60)
    assert engine.tick() == 0  # group_interval (5m) has not passed
    clock.advance(240)
    assert engine.tick() == 1
    clock.advance(3600 * 5)
    assert engine.tick() == 0  # the group is gone: no reminders of resolved alerts
    first, second = messages(store_path)
    assert (first["status"], second["status"]) == ("firing", "resolved")
    assert second["alerts"][0]["ends_at"] is not None
    assert second["alerts"][0]["starts_at"] == first["alerts"][0]["starts_at"]


def test_nan_that_comes_and_goes_inside_group_wait_is_still_told(
    engine: AlertEngine, clock: Any, store_path: str, make_anomaly: Callable[..., Any]
) -> None:
    anomaly = make_anomaly
    nan = anomaly("nonfinite", "loss", "critical", observed=float("nan"))
    engine.observe("gpt", "lm", [(3, nan)])
    engine.observe("gpt", "lm", [(3, anomaly("nonfinite", "loss", "critical", is_open=False))])
    clock.advance(30)
    assert engine.tick() == 1
    (msg,) = messages(store_path)
    assert msg["status"] == "resolved" and msg["alerts"][0]["detector"] == "nonfinite"


def test_silence_mutes_matching_alerts_until_it_expires(
    engine: AlertEngine, clock: Any, store_path: str, make_anomaly: Callable[..., Any]
) -> None:
    anomaly = make_anomaly
    with open_store(store_path) as store:
        sid = store.add_silence(
            {"run": "gp*", "detector": "spike"}, clock.now + 3600, starts_at=clock.now - 1
        )
    engine.observe("gpt", "lm", [(1, anomaly("spike")), (2, anomaly("divergence"))])
    clock.advance(30)
    engine.tick()
    assert [m["group_labels"]["detector"] for m in messages(store_path)] == ["divergence"]
    with open_store(store_path) as store:
        store.expire_silence(sid, now=clock.now)
    clock.advance(300)
    engine.tick()
    assert [m["group_labels"]["detector"] for m in messages(store_path)][1:] == ["spike"]


def test_info_is_not_routed_and_escalation_moves_the_alert(
    engine: AlertEngine, clock: Any, store_path: str, make_anomaly: Callable[..., Any]
) -> None:
    anomaly = make_anomaly
    engine.observe("gpt", "lm", [(1, anomaly(severity="info"))])
    clock.advance(30)
    assert engine.tick() == 0
    engine.observe("gpt", "lm", [(1, anomaly(severity="critical"))])
    clock.advance(30)
    assert engine.tick() == 1
    (msg,) = messages(store_path)
    assert msg["alerts"][0]["severity"] == "critical"


def test_close_flushes_groups_without_waiting_for_group_wait(
    store_path: str, clock: Any, tmp_path: Path, make_anomaly: Callable[..., Any]
) -> None:
    anomaly = make_anomaly
    rules = parse_rules(RULES, "r.yaml", env={})
    eng = AlertEngine(rules, store_path, clock=clock, start=False)
    eng.observe("gpt", "lm", [(1, anomaly())])
    assert eng.tick() == 0
    assert eng.close(timeout=0.2) is False  # the receiver (port 9) is not there: stays pending
    with open_store(store_path) as store:
        assert store.pending_alerts() == 1
