"""What a run gets beyond logging: live detection, alerting and ``/metrics``, reference
curves and system metrics.

The hook (``runwatch.hook``) only logs and writes; it sits below detection and alerting and
imports neither. ``runwatch/__init__`` hands it :func:`attach`, which the hook calls once
per run at ``init()``. Everything heavy is imported when it is needed: detection on the
detection thread, alerting only with a webhook, rules file or Prometheus port, the sampler
only with ``system_metrics=True``, the DCGM poller only with ``dcgm=URL``. See
docs/architecture.md for the layers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from runwatch.model import Event, SeriesBatch

if TYPE_CHECKING:
    from runwatch.alerting.setup import RunAlerting
    from runwatch.expect.reference import ReferenceCurve
    from runwatch.hook.writer import WriterSettings
    from runwatch.live_process import LiveProcess
    from runwatch.pipeline.live import LiveDetection
    from runwatch.store.run_locks import RunLocks

log = logging.getLogger("runwatch.attach")

LIVE_DETECTION_PLACES = ("process", "thread")
"""Where a run's live detection can run: a child process (the default: it takes no GIL
from the training loop, ``runwatch.live_process``) or a thread of the training process."""


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
        dcgm: Mapping[str, Any] | None = None,
        live_detection: str = "process",
    ) -> None:
        self._monitor = monitor
        self._where = live_detection
        self._roles = roles
        self._references = references
        self._alert_options = {
            "webhook": webhook,
            "alerts": alerts,
            "prometheus_port": prometheus_port,
        }
        self._system_metrics = system_metrics
        self._interval = system_metrics_interval
        self._dcgm_options = dcgm
        self.alerting: RunAlerting | None = None
        self.detection: LiveDetection | None = None  # in a thread of this process
        self.process: LiveProcess | None = None  # or in a child process
        self._locks: RunLocks | None = None
        self.sampler: Any = None
        self.dcgm: Any = None

    def start(
        self,
        run: Any,
        run_id: int,
        store_path: str,
        embedded: bool,
        writer: WriterSettings | None = None,
    ) -> Callable[[SeriesBatch, list[Event]], None] | None:
        """Start alerting and live detection for ``run`` (stored as ``run_id``); return the
        writer's sink (None: nothing to feed). A bad rules file raises here.

        Detection runs in a child process (``runwatch.live_process``), with the alert
        engine it feeds and the run's writer (``writer``: its settings), unless
        ``live_detection="thread"`` or the child cannot start; the process is then the
        returned sink, and the hook forwards its queue there. A server runs its own
        detection: only the embedded store gets it here."""
        from runwatch.alerting.setup import configure

        detect = self._monitor and embedded
        if detect and self._where == "process":
            self.alerting = configure(run, **self._alert_options, engine=False)
            try:
                self.process = self._start_process(run, run_id, store_path, writer)
                return self.process
            except OSError as exc:
                log.warning(
                    "runwatch: cannot start live detection's process (%s); detecting in a "
                    "thread of this one",
                    exc,
                )
                if self.alerting is not None:
                    self.alerting.close(0.0)
        self.alerting = configure(run, **self._alert_options)
        if detect:
            from runwatch.store.run_locks import claim_live_detection

            owned, self._locks = claim_live_detection(store_path, run_id)
            if owned:
                from runwatch.pipeline.live import LiveDetection

                self.detection = LiveDetection(
                    store_path,
                    run_id,
                    self._roles,
                    on_change=self.alerting.on_change if self.alerting else None,
                    references=self._references,
                )
        return self.detection

    def _start_process(
        self, run: Any, run_id: int, store_path: str, writer: WriterSettings | None
    ) -> LiveProcess:
        from runwatch.live_process import LiveProcess

        options = self._alert_options
        return LiveProcess(
            {
                "store_path": store_path,
                "run_id": run_id,
                "name": run.name,
                "project": run.project,
                "roles": self._roles,
                "references": self._references,
                "alerts": (options["alerts"], options["webhook"]),  # resolved there
                "writer": writer,
            },
            run._drops,
        )

    def start_sampler(self, run: Any) -> None:
        """GPU (NVML) and host readings, and DCGM readings from Prometheus, on threads of
        their own, if asked for."""
        if self._system_metrics:
            from runwatch.collectors.sampler import start_system_metrics

            self.sampler = start_system_metrics(run, self._interval)
        if self._dcgm_options is not None:
            from runwatch.collectors.dcgm_poller import start_dcgm

            self.dcgm = start_dcgm(run, **self._dcgm_options)

    def stop_sampler(self) -> None:
        if self.sampler is not None:
            self.sampler.stop(1.0)
        if self.dcgm is not None:
            self.dcgm.stop(1.0)

    def close(self, timeout: float, alert_timeout: float) -> None:
        """Finish live detection (up to ``timeout`` s), then wait (bounded) for alerts."""
        if self.process is not None:
            self.process.close(timeout, alert_timeout)
        if self.detection is not None:
            self.detection.close(max(1.0, timeout))
        if self._locks is not None:
            self._locks.close()
        if self.alerting is not None:
            self.alerting.close(alert_timeout)

    def after_fork(self) -> None:
        """In a forked child the threads do not exist: forget them."""
        self.sampler = None
        self.dcgm = None
        if self.process is not None:
            self.process.after_fork()


def attach(
    *,
    name: str,
    store_path: str,
    embedded: bool,
    monitor: bool | Mapping[str, str] = True,
    reference: str | None = None,
    family: Sequence[str] | None = None,
    config: Mapping[str, Any] | None = None,
    webhook: str | None = None,
    alerts: Any = None,
    prometheus_port: int | None = None,
    system_metrics: bool = False,
    system_metrics_interval: float = 10.0,
    dcgm: str | None = None,
    dcgm_interval: float = 15.0,
    dcgm_hosts: Sequence[str] | None = None,
    live_detection: str | None = None,
) -> Attached:
    """The extras of run ``name``, checked before anything is written.

    ``monitor``: live detection (a mapping gives metric roles). ``reference``: judge each
    loss against that earlier run's curve; a wrong name, or ``monitor=False``, raises
    ``ValueError`` here. With a server (``embedded=False``) the server's detection reads
    the reference itself. ``family``: judge each loss against what those runs predict for
    this one (of ``config``: its params, total_steps and schedule), checked likewise.
    ``dcgm``: poll DCGM readings from that Prometheus (default
    ``$RUNWATCH_DCGM_URL``; a malformed URL raises ``ValueError`` here), see
    :func:`dcgm_options`. ``live_detection``: ``"process"`` (default, or
    ``$RUNWATCH_LIVE_DETECTION``) or ``"thread"``, where detection runs.
    """
    where = live_detection or os.environ.get("RUNWATCH_LIVE_DETECTION") or "process"
    if where not in LIVE_DETECTION_PLACES:
        raise ValueError(
            f"live_detection={where!r}: give one of {', '.join(LIVE_DETECTION_PLACES)}"
        )
    roles = monitor if isinstance(monitor, Mapping) else None
    if reference and not monitor:
        raise ValueError(
            f"reference={reference!r} needs live detection, and monitor=False turns it off"
        )
    if family and not monitor:
        raise ValueError(f"family={family!r} needs live detection, and monitor=False turns it off")
    if reference and family:
        raise ValueError("give reference= or family=, not both")
    references = None
    if (reference or family) and embedded:
        from runwatch.pipeline.analysis import reference_curves
        from runwatch.pipeline.family import family_references
        from runwatch.store import open_store

        with open_store(store_path) as store:
            if reference:
                references = reference_curves(store, reference, name, roles)
            else:
                references = family_references(store, family, name, config or {}, roles)
    return Attached(
        monitor=bool(monitor),
        roles=roles,
        references=references,
        webhook=webhook,
        alerts=alerts,
        prometheus_port=prometheus_port,
        system_metrics=system_metrics,
        system_metrics_interval=system_metrics_interval,
        dcgm=dcgm_options(dcgm, dcgm_interval, dcgm_hosts),
        live_detection=where,
    )


def dcgm_options(
    url: str | None,
    interval_s: float,
    hosts: Sequence[str] | None,
    env: Mapping[str, str] = os.environ,
) -> dict[str, Any] | None:
    """What the DCGM poller of this process gets, checked now; None: this process does not
    poll (no URL, ``dcgm=""``, or a rank other than 0: one poller per job is enough).

    The hosts are ``hosts`` (in the launcher's node order) or this host. A process started
    by a launcher maps (host, gpu) to ranks by block placement (GPU ``i`` of the ``k``-th
    host is rank ``k * G + i``, ``G`` from ``$LOCAL_WORLD_SIZE`` or the world size over the
    hosts); a single process labels GPUs by host and index only.

    Parameters
    ----------
    url : str, optional
        The Prometheus URL; None reads ``$RUNWATCH_DCGM_URL``.
    interval_s : float
        Seconds between polls.
    hosts : sequence of str, optional
        The hosts whose GPUs are read.
    env : mapping
        The environment (the launcher's variables).
    """
    if url is None:
        url = env.get("RUNWATCH_DCGM_URL") or None
    if url is None or url == "":
        return None
    from runwatch.collectors.dcgm import RankMap, check_url
    from runwatch.collectors.dcgm_poller import check_hosts, check_interval
    from runwatch.hook.ranks import rank_info

    url = check_url(url)
    interval_s = check_interval(interval_s)
    info = rank_info(env)
    hosts = check_hosts(hosts) if hosts is not None else [info.host]
    if info.rank not in (None, 0):
        return None
    ranks = None
    if info.rank is not None:
        per_host = _int(env.get("LOCAL_WORLD_SIZE"))
        if per_host is None and info.world_size:
            per_host = max(1, info.world_size // len(hosts))
        if per_host is not None:
            ranks = RankMap.block(hosts, per_host, info.world_size)
    return {"url": url, "interval_s": interval_s, "hosts": hosts, "ranks": ranks}


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None
