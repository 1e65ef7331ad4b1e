"""Prometheus ``/metrics`` over a store, built with prometheus-client.

The store is the single source of truth, so the exporter is a custom collector that reads it
at scrape time (a cheap set of queries, cached for ``min_interval`` seconds so several
scrapers cost one read): nothing has to be kept in step in memory, and ``runwatch serve``,
an in-process run (``runwatch.init(prometheus_port=...)``) and a sidecar on a store file
all export the same series.

Metrics (label ``run`` everywhere it applies; ``project`` where known):

- ``runwatch_metric_value{run, project, metric, rank, host, gpu}``: latest value per series
- ``runwatch_run_step{run, project}``: current (last logged) step
- ``runwatch_run_last_log_timestamp_seconds{run, project}``: wall time of the last point
- ``runwatch_run_info{run, project, status}``: 1 per run (status running/finished/...)
- ``runwatch_anomalies_open{run, severity, detector}``: open live anomaly episodes
- ``runwatch_alerts_sent_total{channel}``, ``runwatch_alerts_failed_total{channel}``,
  ``runwatch_alerts_pending{channel}``, ``runwatch_alert_attempts_total{channel, outcome}``
- ``runwatch_points_dropped_total{run, reason}``: refused or lost points
- ``runwatch_forecast_eta_seconds{run, metric}``: wall-clock ETA to the planned final step

Only runs that are running, or ended within ``recent`` seconds, export per-series values and
forecasts, so a store holding a year of runs does not become a cardinality bomb.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runwatch.model import LABEL_KEYS
from runwatch.store import Store

log = logging.getLogger("runwatch.alerting")

LiveDrops = Callable[[], Mapping[str, Mapping[str, int]]]
"""run name -> {reason: count} not yet in the store (an in-process run's own counter)."""


class StoreCollector(Collector):
    """Yields runwatch's metrics from the store at ``store_path`` on each scrape."""

    def __init__(
        self,
        store_path: str,
        *,
        live_drops: LiveDrops | None = None,
        min_interval: float = 1.0,
        recent: float = 3600.0,
        forecast_interval: float = 60.0,
        max_series: int = 5000,
    ) -> None:
        self._path = store_path
        self._live_drops = live_drops
        self._min_interval = min_interval
        self._recent = recent
        self._forecast_interval = forecast_interval
        self._max_series = max_series
        self._lock = threading.Lock()
        self._cache: tuple[float, list[Metric]] | None = None
        self._etas: dict[str, tuple[float, dict[str, float]]] = {}
        self._store: Store | None = None

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            now = time.monotonic()
            if self._cache is None or now - self._cache[0] >= self._min_interval:
                try:
                    self._cache = (now, self._read())
                except Exception as exc:  # a scrape must answer even if the store is busy
                    log.warning("runwatch: /metrics could not read %s: %s", self._path, exc)
                    if self._cache is None:
                        return iter(())
            return iter(self._cache[1])

    def _open(self) -> Store:
        if self._store is None:
            self._store = Store(self._path, readonly=True)
        return self._store

    def _read(self) -> list[Metric]:
        store = self._open()
        runs, open_rows, drop_rows, attempts = store.status_snapshot()
        wall = time.time()
        recent = [r for r in runs if r[3] == "running" or (r[6] or wall) >= wall - self._recent]
        out: list[Metric] = []

        step = GaugeMetricFamily("runwatch_run_step", "Last logged step", labels=["run", "project"])
        last = GaugeMetricFamily(
            "runwatch_run_last_log_timestamp_seconds",
            "Wall time of the last logged point",
            labels=["run", "project"],
        )
        info = GaugeMetricFamily(
            "runwatch_run_info", "1 per run, with its status", labels=["run", "project", "status"]
        )
        for _id, name, project, status, last_step, last_time, _end in runs:
            info.add_metric([name, project, status], 1)
            if last_step is not None:
                step.add_metric([name, project], float(last_step))
            if last_time is not None:
                last.add_metric([name, project], float(last_time))
        out += [step, last, info]
        out.append(self._values(store, recent))

        anomalies = GaugeMetricFamily(
            "runwatch_anomalies_open",
            "Open anomaly episodes found live",
            labels=["run", "severity", "detector"],
        )
        for name, severity, detector, n in open_rows:
            anomalies.add_metric([name, severity, detector], n)
        out.append(anomalies)

        out += self._alerts(store.outbox_counts(), attempts)

        dropped = CounterMetricFamily(
            "runwatch_points_dropped", "Points refused or lost, by reason", labels=["run", "reason"]
        )
        totals: dict[tuple[str, str], int] = {(n, r): int(c) for n, r, c in drop_rows}
        for run, counts in (self._live_drops() if self._live_drops else {}).items():
            for reason, n in counts.items():
                totals[(run, reason)] = totals.get((run, reason), 0) + int(n)
        for (run, reason), n in sorted(totals.items()):
            dropped.add_metric([run, reason], n)
        out.append(dropped)
        out.append(self._forecasts(store, [r for r in recent if r[3] == "running"]))
        return out

    def _values(self, store: Store, runs: list[tuple[Any, ...]]) -> Metric:
        gauge = GaugeMetricFamily(
            "runwatch_metric_value",
            "Latest logged value per run and series",
            labels=["run", "project", "metric", *LABEL_KEYS],
        )
        if not runs:
            return gauge
        by_id = {r[0]: (r[1], r[2]) for r in runs}
        for run_id, metric, labels, value in store.latest_values(list(by_id), self._max_series):
            name, project = by_id[run_id]
            label_values = [str(labels[k]) if labels.get(k) is not None else "" for k in LABEL_KEYS]
            gauge.add_metric([name, project, metric, *label_values], value)
        return gauge

    @staticmethod
    def _alerts(
        counts: dict[tuple[str, str], int], attempts: list[tuple[Any, ...]]
    ) -> list[Metric]:
        sent = CounterMetricFamily(
            "runwatch_alerts_sent", "Alert messages delivered", labels=["channel"]
        )
        failed = CounterMetricFamily(
            "runwatch_alerts_failed", "Alert messages given up on", labels=["channel"]
        )
        pending = GaugeMetricFamily(
            "runwatch_alerts_pending", "Alert messages waiting in the outbox", labels=["channel"]
        )
        for channel in sorted({c for c, _ in counts}):
            sent.add_metric([channel], counts.get((channel, "sent"), 0))
            failed.add_metric([channel], counts.get((channel, "failed"), 0))
            pending.add_metric([channel], counts.get((channel, "pending"), 0))
        tries = CounterMetricFamily(
            "runwatch_alert_attempts", "Delivery attempts", labels=["channel", "outcome"]
        )
        for channel, ok, n in attempts:
            tries.add_metric([channel, "ok" if ok else "error"], n)
        return [sent, failed, pending, tries]

    def _forecasts(self, store: Store, runs: list[tuple[Any, ...]]) -> Metric:
        gauge = GaugeMetricFamily(
            "runwatch_forecast_eta_seconds",
            "Wall-clock seconds until the planned final step, from the observed step rate",
            labels=["run", "metric"],
        )
        now = time.monotonic()
        for _id, name, *_ in runs:
            cached = self._etas.get(name)
            if cached is None or now - cached[0] >= self._forecast_interval:
                cached = (now, _etas(store, name))
                self._etas[name] = cached
            for metric, eta in cached[1].items():
                gauge.add_metric([name, metric], eta)
        return gauge


def _etas(store: Store, run: str) -> dict[str, float]:
    """ETA per loss metric of ``run`` (none when there is too little data to fit)."""
    from runwatch.detect.roles import role_of
    from runwatch.pipeline.analysis import forecast_run

    out: dict[str, float] = {}
    try:
        metrics = [m for m in store.series(run)["metric"].unique() if role_of(m) == "loss"]
    except Exception:
        return out
    for metric in metrics[:3]:
        try:
            eta = forecast_run(store, run, metric, save=False).eta_seconds
        except Exception as exc:
            log.debug("no forecast for %s/%s: %s", run, metric, exc)
            continue
        if eta is not None and math.isfinite(eta):
            out[metric] = float(eta)
    return out


@dataclass
class Exporter:
    """A running ``/metrics`` server; ``port`` is the bound one (useful with port 0)."""

    port: int
    registry: CollectorRegistry
    _server: Any
    _thread: threading.Thread

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def start_exporter(
    store_path: str,
    port: int = 0,
    addr: str = "127.0.0.1",
    *,
    live_drops: LiveDrops | None = None,
    min_interval: float = 1.0,
) -> Exporter:
    """Serve the store's metrics at ``http://addr:port/metrics`` on a daemon thread.

    ``runwatch serve`` calls this; ``runwatch.init(prometheus_port=P)`` calls it for its run.
    It binds 127.0.0.1 by default: exposing it wider is a deliberate choice (``addr``).
    """
    Store(store_path).close()  # create / migrate the store, so the read-only scrape works
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store_path, live_drops=live_drops, min_interval=min_interval))
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return Exporter(server.server_port, registry, server, thread)


def metrics_asgi_app(store_path: str, *, min_interval: float = 1.0) -> Any:
    """The same ``/metrics`` as an ASGI app, for ``runwatch serve`` to mount on its port."""
    from prometheus_client import make_asgi_app

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store_path, min_interval=min_interval))
    return make_asgi_app(registry=registry)
