"""What a run gets beyond logging: live detection, alerting and ``/metrics``, reference
curves and system metrics.

The hook (``runwatch.hook``) only logs and writes; it sits below detection and alerting and
imports neither. ``runwatch/__init__`` hands it :func:`attach`, which the hook calls once
per run at ``init()``. Everything heavy is imported when it is needed: detection on the
detection thread, alerting only with a webhook, rules file or Prometheus port, the sampler
only with ``system_metrics=True``. See docs/architecture.md for the layers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from runwatch.model import Event, SeriesBatch

if TYPE_CHECKING:
    from runwatch.alerting.setup import RunAlerting
    from runwatch.expect.reference import ReferenceCurve
    from runwatch.pipeline.live import LiveDetection

log = logging.getLogger("runwatch.attach")


class Attached:
    """One run's extras; the hook drives them through ``start``, ``stop_sampler``,
    ``close`` and ``after_fork``."""

    def __init__(
        self,
        *,
        monitor: bool,
        roles: Mapping[str, str] | None,
        references: Mapping[str, ReferenceCurve] | None,
        webhook: str | None,
        alerts: Any,
        prometheus_port: int | None,
        system_metrics: bool,
        system_metrics_interval: float,
    ) -> None:
        self._monitor = monitor
        self._roles = roles
        self._references = references
        self._alert_options = {
            "webhook": webhook,
            "alerts": alerts,
            "prometheus_port": prometheus_port,
        }
        self._system_metrics = system_metrics
        self._interval = system_metrics_interval
        self.alerting: RunAlerting | None = None
        self.detection: LiveDetection | None = None
        self.sampler: Any = None

    def start(
        self, run: Any, run_id: int, store_path: str, embedded: bool
    ) -> Callable[[SeriesBatch, list[Event]], None] | None:
        """Start alerting and live detection for ``run`` (stored as ``run_id``); return the
        writer's sink (None: nothing to feed). A bad rules file raises here."""
        from runwatch.alerting.setup import configure

        self.alerting = configure(run, **self._alert_options)
        # A server runs its own detection: only the embedded store gets it here.
        if self._monitor and embedded:
            from runwatch.pipeline.live import LiveDetection

            self.detection = LiveDetection(
                store_path,
                run_id,
                self._roles,
                on_change=self.alerting.on_change if self.alerting else None,
                references=self._references,
            )
        return self.detection

    def start_sampler(self, run: Any) -> None:
        """GPU (NVML) and host readings on a thread of their own, if asked for."""
        if self._system_metrics:
            from runwatch.collectors.sampler import start_system_metrics

            self.sampler = start_system_metrics(run, self._interval)

    def stop_sampler(self) -> None:
        if self.sampler is not None:
            self.sampler.stop(1.0)

    def close(self, timeout: float, alert_timeout: float) -> None:
        """Finish live detection (up to ``timeout`` s), then wait (bounded) for alerts."""
        if self.detection is not None:
            self.detection.close(max(1.0, timeout))
        if self.alerting is not None:
            self.alerting.close(alert_timeout)

    def after_fork(self) -> None:
        """In a forked child the threads do not exist: forget them."""
        self.sampler = None


def attach(
    *,
    name: str,
    store_path: str,
    embedded: bool,
    monitor: bool | Mapping[str, str] = True,
    reference: str | None = None,
    webhook: str | None = None,
    alerts: Any = None,
    prometheus_port: int | None = None,
    system_metrics: bool = False,
    system_metrics_interval: float = 10.0,
) -> Attached:
    """The extras of run ``name``, checked before anything is written.

    ``monitor``: live detection (a mapping gives metric roles). ``reference``: judge each
    loss against that earlier run's curve; a wrong name, or ``monitor=False``, raises
    ``ValueError`` here. With a server (``embedded=False``) the server's detection reads
    the reference itself.
    """
    roles = monitor if isinstance(monitor, Mapping) else None
    if reference and not monitor:
        raise ValueError(
            f"reference={reference!r} needs live detection, and monitor=False turns it off"
        )
    references = None
    if reference and embedded:
        from runwatch.pipeline.analysis import reference_curves
        from runwatch.store import open_store

        with open_store(store_path) as store:
            references = reference_curves(store, reference, name, roles)
    return Attached(
        monitor=bool(monitor),
        roles=roles,
        references=references,
        webhook=webhook,
        alerts=alerts,
        prometheus_port=prometheus_port,
        system_metrics=system_metrics,
        system_metrics_interval=system_metrics_interval,
    )
