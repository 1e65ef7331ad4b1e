"""Delivery through a real HTTP receiver on 127.0.0.1 that fails in every way, then recovers."""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from typing import Any

import pytest

from runwatch.alerting.engine import AlertEngine
from runwatch.alerting.rules import parse_rules
from runwatch.alerting.sender import Sender
from runwatch.store import open_store


def rules_for(
    url: str, extra: str = "", secret: str = "hunter2-signing-key", timeout: str = "300ms"
) -> Any:
    text = f"""version: 1
defaults: {{group_wait: 0, group_interval: 1s, group_by: ["..."]}}
channels:
  hook: {{type: webhook, url: "{url}", secret: {secret}, timeout: {timeout}, concurrency: 4{extra}}}
routes:
  - channels: [hook]
delivery: {{initial_backoff: 20ms, max_backoff: 200ms, max_age: 1h}}
"""
    return parse_rules(text, "r.yaml", env={})


def enqueue(store_path: str, n: int, now: float | None = None) -> list[str]:
    keys = [f"rw-test-{i:05d}" for i in range(n)]
    with open_store(store_path) as store:
        store.enqueue_alerts(
            ((k, "hook", f'{{"n": {i}}}', f"m{i}") for i, k in enumerate(keys)), now
        )
    return keys


def test_every_alert_arrives_once_by_key_through_500s_timeouts_and_refusals(
    receiver: Any, store_path: str, make_anomaly: Any
) -> None:
    receiver.script = ["500"] * 5 + ["hang"] * 3
    receiver.hang_for = 0.6
    engine = AlertEngine(rules_for(receiver.url), store_path)
    try:
        changes = [(i + 1, make_anomaly("spike", "loss", rank=i)) for i in range(60)]
        engine.observe("gpt", "lm", changes)
        assert receiver.wait_for(lambda r: r.requests >= 8, 10)
        receiver.stop()  # connections refused for a while
        time.sleep(0.5)
        receiver.start()
        assert engine.flush(timeout=20)
    finally:
        engine.close(5)
    with open_store(store_path) as store:
        outbox = store.outbox()
        attempts = store.alert_attempts()
    assert len(outbox) == 60 and set(outbox["status"]) == {"sent"}
    keys = receiver.keys()
    assert set(keys) == set(outbox["idempotency_key"])
    # At-least-once: a key arrives twice only when the receiver's answer never reached the
    # sender -- the 3 answered after the timeout, and at most the 4 requests in flight when
    # the receiver went down.
    twice = [k for k, n in Counter(keys).items() if n > 1]
    assert len(twice) <= 3 + 4
    assert receiver.bad_signatures == 0
    # Every attempt is recorded, with what went wrong.
    assert len(attempts) == int(outbox["attempts"].sum())
    details = " ".join(attempts.loc[attempts["ok"] == 0, "detail"])
    assert "HTTP 500" in details and "timeout after 0.3 s" in details
    assert (attempts["ok"] == 1).sum() == 60
    body = receiver.received[0]["body"]
    assert body["schema"] == "runwatch.alert/v1" and body["alerts"][0]["run"] == "gpt"
    assert receiver.received[0]["headers"]["X-Runwatch-Schema"] == "runwatch.alert/v1"


def test_refusing_receiver_probes_instead_of_hammering(receiver: Any, store_path: str) -> None:
    receiver.stop()
    keys = enqueue(store_path, 100)
    sender = Sender(store_path, rules_for(receiver.url), rng=random.Random(3))
    sender.start()
    try:
        time.sleep(0.6)
        with open_store(store_path) as store:
            tried = len(store.alert_attempts())
        assert 0 < tried < 40  # a few probes, not 100 messages over and over
        receiver.start()
        assert receiver.wait_for(lambda r: len(set(r.keys())) == 100, 10)
    finally:
        sender.close()
    assert sorted(receiver.keys()) == keys  # each exactly once: no answer came late


def test_a_refusal_fails_at_once_and_a_too_old_message_gives_up(
    receiver: Any, store_path: str, clock: Any
) -> None:
    receiver.script = ["400"]
    enqueue(store_path, 1, now=clock.now)
    sender = Sender(store_path, rules_for(receiver.url, timeout="10s"), clock=clock)
    assert sender.run_once() == 1
    with open_store(store_path) as store:
        row = store.outbox().iloc[0]
    assert row["status"] == "failed" and row["attempts"] == 1
    assert row["last_error"] == "HTTP 400: receiver error (refused)"

    receiver.stop()
    enqueue_key = "rw-old"
    with open_store(store_path) as store:
        store.enqueue_alerts([(enqueue_key, "hook", "{}", "old")], now=clock.now)
    sender.run_once()  # refused connection: pending, retried later
    clock.advance(3601)
    sender.run_once()
    sender.close()
    with open_store(store_path) as store:
        old = store.outbox().set_index("idempotency_key").loc[enqueue_key]
    assert old["status"] == "failed" and old["attempts"] == 2
    assert old["last_error"].endswith("(max_age reached)")


def test_rate_limit_holds_messages_back_and_drops_none(
    receiver: Any, store_path: str, clock: Any
) -> None:
    enqueue(store_path, 5, now=clock.now)
    rules = rules_for(receiver.url, extra=", rate_limit: {count: 2, per: 1m}", timeout="10s")
    sender = Sender(store_path, rules, clock=clock)
    try:
        assert sender.run_once() == 2
        assert sender.run_once() == 0
        clock.advance(30)
        assert sender.run_once() == 1
        clock.advance(60)
        assert sender.run_once() == 2
    finally:
        sender.close()
    assert len(set(receiver.keys())) == 5


def test_urls_and_secrets_never_reach_logs_or_the_store(
    receiver: Any, store_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    token = "T0001/B0002/xoxb-super-secret-token"
    url = f"http://127.0.0.1:{receiver.port}/services/{token}"
    receiver.script = ["500", "500"]
    enqueue(store_path, 3)
    caplog.set_level(logging.DEBUG)
    sender = Sender(store_path, rules_for(url, secret="sig-secret-42"), rng=random.Random(0))
    try:
        deadline = time.monotonic() + 10
        while len(set(receiver.keys())) < 3 and time.monotonic() < deadline:
            sender.run_once()
            time.sleep(0.05)
        receiver.stop()
        enqueue_more = "rw-down"
        with open_store(store_path) as store:
            store.enqueue_alerts([(enqueue_more, "hook", "{}", "x")])
        time.sleep(0.3)
        sender.run_once()
    finally:
        sender.close()
    assert len(set(receiver.keys())) == 3
    assert "HTTP Request" in caplog.text  # httpx did log its requests ...
    assert "xoxb-super-secret-token" not in caplog.text  # ... with the URL scrubbed
    assert "sig-secret-42" not in caplog.text
    with open_store(store_path) as store:
        texts = " ".join(str(v) for v in store.alert_attempts()["detail"])
        texts += " ".join(str(v) for v in store.outbox()["last_error"])
        payloads = [store.outbox_payload(int(i)) for i in store.outbox()["id"]]
    assert "HTTP 500" in texts and "ConnectError" in texts
    assert "super-secret" not in texts and "super-secret" not in str(payloads)
