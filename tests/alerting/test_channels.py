"""Payload shapes per channel type, signatures, and a real Alertmanager receiving our alerts."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from runwatch.alerting.alert import alert_from_anomaly
from runwatch.alerting.channels import deliver, sign, verify_signature
from runwatch.alerting.grouping import Notification
from runwatch.alerting.payloads import alertmanager_webhook, render, slack, webhook
from runwatch.alerting.rules import Channel, parse_rules

RULES = parse_rules(
    'version: 1\nchannels: {a: {type: webhook, url: "http://x/y"}}\nroutes: [{channels: [a]}]\n',
    "r.yaml",
    env={},
)


def note(
    make_anomaly: Any, n: int = 3, closed: int = 0, at: float = 1_800_000_000.5
) -> Notification:
    alerts = tuple(
        alert_from_anomaly(
            i + 1,
            make_anomaly("nonfinite", "loss", "critical", rank=i, is_open=i >= closed),
            "gpt",
            "lm",
            at,
        )
        for i in range(n)
    )
    return Notification(RULES.routes[0], "0:{}", {"run": "gpt", "detector": "nonfinite"}, alerts)


def test_webhook_schema_has_numbers_summary_and_links(make_anomaly: Any) -> None:
    body = webhook(note(make_anomaly, 3, closed=1), "rw-k", 2, "http://dash:8501/")
    assert body["schema"] == "runwatch.alert/v1" and body["idempotency_key"] == "rw-k"
    assert body["status"] == "firing"
    assert body["counts"] == {"firing": 2, "resolved": 1, "total": 3, "shown": 2}
    assert body["truncated_alerts"] == 1
    assert body["summary"].startswith("[CRITICAL] gpt: nonfinite on loss: 3 alerts (2 firing)")
    first = body["alerts"][0]
    assert first["observed"] == 9.0 and (first["expected"], first["lower"]) == (2.3, 2.1)
    assert (
        first["summary"]
        == "gpt: nonfinite on loss (rank 0): 9 vs expected 2.3 [2.1, 2.5] at step 100 (resolved)"
    )
    assert first["starts_at"] == "2027-01-15T08:00:00.500Z"
    assert first["links"]["dashboard"] == "http://dash:8501/runs?run=gpt&anomaly=1&step=100"
    json.dumps(body, allow_nan=False)  # standard JSON: no NaN anywhere


def test_nan_observed_is_sent_as_a_string(make_anomaly: Any) -> None:
    a = alert_from_anomaly(1, make_anomaly("nonfinite", observed=float("nan")), "gpt", None, 0)
    n = Notification(RULES.routes[0], "k", {}, (a,))
    body = webhook(n, "k", 50, None)
    assert body["alerts"][0]["observed"] == "nan"
    json.dumps(body, allow_nan=False)


def test_slack_is_block_kit_and_short(make_anomaly: Any) -> None:
    body = slack(note(make_anomaly, 30), 50, "http://dash")
    assert body["text"].startswith("[CRITICAL]")
    kinds = [b["type"] for b in body["blocks"]]
    assert kinds == ["header", "section", "section", "actions"]
    assert body["blocks"][0]["text"]["text"] == "CRITICAL: gpt"
    lines = body["blocks"][2]["text"]["text"].splitlines()
    assert len(lines) == 11 and lines[-1] == "… and 20 more"


def test_alertmanager_webhook_payload_is_version_4(make_anomaly: Any) -> None:
    body = alertmanager_webhook(note(make_anomaly, 2), "oncall", "k", 50, None)
    assert body["version"] == "4" and body["receiver"] == "oncall"
    assert set(body) == {
        "version", "groupKey", "truncatedAlerts", "status", "receiver", "groupLabels",
        "commonLabels", "commonAnnotations", "externalURL", "alerts",
    }  # fmt: skip
    alert = body["alerts"][0]
    assert set(alert) == {
        "status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint",
    }  # fmt: skip
    assert alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert body["commonLabels"]["severity"] == "critical" and "rank" not in body["commonLabels"]
    assert alert["annotations"]["summary"].startswith("gpt: nonfinite on loss (rank 0)")


def test_signature_verifies_and_rejects_tampering_and_replays() -> None:
    body = b'{"a": 1}'
    sig = sign("k", 1000, body)
    assert verify_signature("k", "1000", body, sig, now=1010)
    assert not verify_signature("k", "1000", body + b" ", sig, now=1010)
    assert not verify_signature("other", "1000", body, sig, now=1010)
    assert not verify_signature("k", "1000", body, sig, now=5000)  # too old: a replay
    assert not verify_signature("k", None, body, sig)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_real_alertmanager_accepts_our_alerts(make_anomaly: Any, tmp_path: Path) -> None:
    binary = shutil.which("prometheus-alertmanager")
    if binary is None:
        pytest.skip("prometheus-alertmanager not installed")
    port = _free_port()
    config = tmp_path / "am.yml"
    config.write_text("route: {receiver: blackhole}\nreceivers: [{name: blackhole}]\n")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'am'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client() as client:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    if client.get(f"{base}/-/ready", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.05)
            channel = Channel("am", "alertmanager", base)
            n = note(make_anomaly, 2, at=time.time())
            body = json.dumps(render(channel, n, "k", None)).encode()
            outcome = deliver(client, channel, "k", body)
            assert outcome.ok, outcome.detail
            listed = client.get(f"{base}/api/v2/alerts", timeout=5).json()
        ranks = sorted(a["labels"]["rank"] for a in listed)
        assert ranks == ["0", "1"]
        assert {a["labels"]["alertname"] for a in listed} == {"nonfinite"}
        assert listed[0]["annotations"]["summary"].startswith("gpt: nonfinite on loss")
    finally:
        proc.terminate()
        proc.wait(10)
