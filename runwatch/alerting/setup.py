"""Wiring alerting and ``/metrics`` into a run, or into ``runwatch serve`` / ``watch``.

Decided once, at ``runwatch.init()``: if neither a webhook, a rules file nor a Prometheus
port is given (as arguments or in the environment), nothing here is imported or started,
so a run without alerting pays nothing. A bad rules file raises at ``init``, naming the file
and line, before the run starts: finding out at 3 a.m. is the failure we exist to prevent.

This module imports nothing heavy at module level; ``runwatch.hook.run`` imports it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runwatch.guard import internal_errors

if TYPE_CHECKING:
    from runwatch.alerting.engine import AlertEngine
    from runwatch.alerting.exporter import Exporter
    from runwatch.alerting.rules import Rules

log = logging.getLogger("runwatch.alerting")

ENV_WEBHOOK = "RUNWATCH_WEBHOOK_URL"
ENV_ALERTS = "RUNWATCH_ALERTS"


def resolve_rules(
    alerts: str | os.PathLike[str] | None = None, webhook: str | None = None
) -> Rules | None:
    """The rules a process should use: ``alerts`` (or $RUNWATCH_ALERTS), else the packaged
    defaults when a webhook is given (or $RUNWATCH_WEBHOOK_URL); None when neither is."""
    alerts = alerts if alerts is not None else os.environ.get(ENV_ALERTS) or None
    webhook = webhook if webhook is not None else os.environ.get(ENV_WEBHOOK) or None
    if alerts is None and webhook is None:
        return None
    from runwatch.alerting.rules import load_rules

    return load_rules(alerts, webhook=webhook)


def start_engine(rules: Rules, store_path: str, **kwargs: Any) -> AlertEngine:
    """An engine with its threads running; ``runwatch serve --alerts`` calls this."""
    from runwatch.alerting.engine import AlertEngine

    return AlertEngine(rules, os.fspath(store_path), **kwargs)


@dataclass
class RunAlerting:
    """What one run started: the engine (if alerting) and the exporter (if asked)."""

    engine: AlertEngine | None
    exporter: Exporter | None
    on_change: Callable[..., None] | None

    def close(self, timeout: float = 10.0) -> bool:
        """Flush and wait (bounded) for pending alerts, then stop the exporter."""
        done = self.engine is None
        if self.engine is not None:
            # finishing a run must not raise because alerting failed
            with internal_errors("closing alerting", log):
                done = self.engine.close(timeout)
        if self.exporter is not None:
            with internal_errors("stopping /metrics", log):
                self.exporter.close()
        return done


def configure(
    run: Any,
    *,
    webhook: str | None = None,
    alerts: str | os.PathLike[str] | None = None,
    prometheus_port: int | None = None,
    engine: bool = True,
) -> RunAlerting | None:
    """Alerting and ``/metrics`` for an in-process ``Run`` (None when neither is asked for).

    ``run`` needs ``name``, ``project``, ``store_path`` and ``stats()``. ``engine=False``:
    check the rules but start no engine (live detection's process runs it).
    """
    rules = resolve_rules(alerts, webhook)
    if rules is None and prometheus_port is None:
        return None
    alert_engine = exporter = None
    on_change = None
    if rules is not None and engine:
        alert_engine = start_engine(rules, run.store_path)
        on_change = alert_engine.bind(run.name, run.project)
    if prometheus_port is not None:
        from runwatch.alerting.exporter import start_exporter

        def live_drops() -> dict[str, dict[str, int]]:
            return {run.name: run.stats()["dropped"]}

        exporter = start_exporter(run.store_path, prometheus_port, live_drops=live_drops)
        log.info("runwatch: /metrics on http://127.0.0.1:%d/metrics", exporter.port)
    return RunAlerting(alert_engine, exporter, on_change)
