"""/metrics: what it exports, promtool on the shipped rules, and a real Prometheus scrape."""

from __future__ import annotations

import math
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from runwatch.alerting.exporter import Exporter, start_exporter
from runwatch.model import Anomaly
from runwatch.store import open_store

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def filled_store(tmp_path: Path) -> str:
    path = str(tmp_path / "metrics.db")
    now = time.time()
    with open_store(path) as store:
        run_id, attempt = store.start_run("gpt", project="lm", config={"total_steps": 1000})
        steps = np.arange(1, 301)
        loss = 3.0 * steps**-0.3 + np.random.default_rng(0).normal(0, 0.002, 300)
        loss[-1] = math.nan
        times = now - 150 + steps * 0.5
        store.write(
            run_id,
            attempt,
            {
                store.series_id(run_id, "loss"): (steps, times, loss),
                store.series_id(run_id, "step_time", {"rank": 3}): (
                    steps,
                    times,
                    np.full(300, 0.5),
                ),
            },
        )
        open_ = dict(start_step=299, end_step=300, score=1000.0, observed=math.nan, message="x")
        store.save_anomalies(
            run_id,
            "live",
            [
                Anomaly("nonfinite", "loss", severity="critical", **open_),
                Anomaly("spike", "loss", severity="warning", **open_),
                Anomaly("spike", "loss", severity="warning", **open_, is_open=False),
            ],
        )
        store.record_drops(run_id, {"bad_value": 4})
        store.enqueue_alerts([("k1", "ops", "{}", ""), ("k2", "ops", "{}", "")])
    return path


@pytest.fixture
def exporter(filled_store: str) -> Iterator[Exporter]:
    exp = start_exporter(filled_store, 0, live_drops=lambda: {"gpt": {"queue_full": 2}})
    yield exp
    exp.close()


def scrape(port: int) -> dict[str, list[Any]]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def value(samples: list[Any], **labels: str) -> float:
    (hit,) = [s for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    return hit.value


def test_metrics_export_values_steps_anomalies_alerts_drops_and_eta(exporter: Exporter) -> None:
    m = scrape(exporter.port)
    assert value(m["runwatch_run_step"], run="gpt", project="lm") == 300
    assert value(m["runwatch_run_info"], run="gpt", status="running") == 1
    assert math.isnan(value(m["runwatch_metric_value"], run="gpt", metric="loss"))
    assert value(m["runwatch_metric_value"], metric="step_time", rank="3") == 0.5
    assert value(m["runwatch_anomalies_open"], severity="critical", detector="nonfinite") == 1
    assert value(m["runwatch_anomalies_open"], severity="warning", detector="spike") == 1
    assert value(m["runwatch_alerts_pending"], channel="ops") == 2
    assert value(m["runwatch_alerts_sent_total"], channel="ops") == 0
    assert value(m["runwatch_points_dropped_total"], reason="bad_value") == 4
    assert value(m["runwatch_points_dropped_total"], reason="queue_full") == 2
    eta = value(m["runwatch_forecast_eta_seconds"], run="gpt", metric="loss")
    assert 300 < eta < 400  # 700 steps to go at 2 steps/s


def test_promtool_accepts_the_shipped_prometheus_rules() -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    done = subprocess.run(
        ["promtool", "check", "rules", str(ROOT / "alerts" / "prometheus-rules.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 7 rules found" in done.stdout


def test_grafana_dashboard_queries_only_exported_metrics(exporter: Exporter) -> None:
    import json
    import re

    board = json.loads((ROOT / "dashboards" / "grafana" / "runwatch.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert exprs
    text = httpx.get(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10).text
    exported = {f.name for f in text_string_to_metric_families(text)}
    for expr in exprs:
        for name in re.findall(r"runwatch_[a-z_]+", expr):
            assert name.removesuffix("_total") in exported, (name, expr)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_real_prometheus_scrapes_metrics_and_answers_a_query(
    exporter: Exporter, tmp_path: Path
) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (Debian package prometheus)")
    port = _free_port()
    config = tmp_path / "prom.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{ROOT / 'alerts' / 'prometheus-rules.yaml'}]\n"
        "scrape_configs:\n"
        "  - job_name: runwatch\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exporter.port}']}}]\n"
    )
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/api/v1/query"
        result: list[Any] = []
        last_error: Exception | None = None
        deadline = time.monotonic() + 30  # the first sample takes ~5-6 s (target batching)
        while time.monotonic() < deadline and not result:
            try:
                answer = httpx.get(url, params={"query": "runwatch_run_step"}, timeout=2).json()
                result = answer["data"]["result"]
            except (httpx.HTTPError, KeyError, ValueError) as exc:  # not up yet: poll again
                last_error = exc
            if not result:
                time.sleep(0.25)
        assert result, f"Prometheus never returned runwatch_run_step (last error: {last_error})"
        assert result[0]["metric"]["run"] == "gpt" and float(result[0]["value"][1]) == 300
        alerts: list[Any] = []
        while time.monotonic() < deadline and not alerts:  # a for: 0s rule fires
            alerts = httpx.get(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=2).json()
            alerts = [a for a in alerts["data"]["alerts"] if a["state"] == "firing"]
            if not alerts:
                time.sleep(0.25)
        assert {a["labels"]["alertname"] for a in alerts} >= {"RunwatchCriticalAnomaly"}
    finally:
        proc.terminate()
        proc.wait(10)
