"""``runwatch serve --dcgm URL``: the server polls Prometheus for the GPUs of its running runs.

Every ``interval_s`` seconds a worker reads, from the store, the running runs and the hosts
their series name (``host`` labels), asks Prometheus once for those hosts' DCGM readings
(:class:`runwatch.collectors.dcgm.DcgmSource`), and writes each run the readings of its own
hosts as ``gpu_*`` series labelled rank, host and gpu, with XIDs as ``xid`` events, at the
run's last step. The ranks come from the run's own series: on each host, its ranks in order
drive GPUs 0, 1, ... (:meth:`RankMap.by_local_order`, torchrun's and SLURM's placement).

A run killed without a word stays "running" in the store; its hosts may since run other jobs.
So a run is polled only while its step moves: once its last step has stood still for
``stale_s`` seconds (a hang gets that long of readings), or if it had not logged for that long
when the server first saw it, it is left alone until its step moves again.

The readings go in through the server's ingest writer (``submit``), as a client's batches
do: one writer for the SQLite file, and the run's live detection (the fleet hardware rules)
and alerting see them. Failures are handled as in a run (:mod:`runwatch.collectors.dcgm_poller`):
Prometheus down is one warning, and polling goes on.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runwatch.collectors.dcgm import (
    DcgmSource,
    GpuReading,
    PrometheusError,
    PrometheusSource,
    RankMap,
    check_url,
)
from runwatch.collectors.dcgm_poller import (
    Outage,
    XidWatch,
    check_interval,
    gpu_labels,
    xid_message,
)
from runwatch.model import label_value
from runwatch.server.schemas import Batch
from runwatch.store import Store
from runwatch.worker import Worker

log = logging.getLogger("runwatch.server")

Submit = Callable[[int, list[Batch]], "concurrent.futures.Future[dict[str, int]]"]
"""``IngestWriter.submit``: store a run's batches (and feed its live detection)."""


STALE_S = 1800.0
"""Seconds a running run's step may stand still before its GPUs are no longer polled."""


@dataclass(frozen=True)
class Target:
    """A running run whose hosts' GPUs are polled: where its readings go."""

    run_id: int
    attempt: int
    step: int
    last_time: float | None
    hosts: frozenset[str]
    ranks: RankMap


class ServerDcgm:
    """Polls DCGM readings from Prometheus into the running runs of a store.

    Parameters
    ----------
    db : str
        The server's store (read here, read-only, for the runs and their hosts).
    url : str
        The Prometheus URL; a malformed one raises ``ValueError`` here.
    submit : callable
        ``submit(run_id, batches)`` -> a future: the server's ingest writer.
    interval_s : float
        Seconds between polls (the first one at once).
    stale_s : float
        Seconds a run's step may stand still before it is no longer polled.
    dcgm : DcgmSource, optional
        The source to read (default: one over ``url``).
    clock : callable
        Wall-clock seconds (the store's times are wall times); a fake one in tests.
    """

    def __init__(
        self,
        db: str,
        url: str,
        submit: Submit,
        *,
        interval_s: float = 15.0,
        stale_s: float = STALE_S,
        dcgm: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.url = check_url(url)
        self.interval_s = check_interval(interval_s, "--dcgm-interval")
        self.submit = submit
        self.stale_s = stale_s
        self.clock = clock
        if dcgm is None:
            timeout = min(10.0, max(1.0, self.interval_s))
            dcgm = DcgmSource(PrometheusSource(self.url, timeout_s=timeout))
        self.dcgm = dcgm
        self.outage = Outage(self.url, self.interval_s, log)
        self.xids = XidWatch()
        self.polls = 0
        self.written = 0
        self._client_id = f"dcgm-{uuid.uuid4().hex[:16]}"
        self._seq = 0
        self._progress: dict[int, tuple[int, float]] = {}  # run -> (last step, seen since)
        self._store: Store | None = None
        self._worker = Worker(
            "runwatch-serve-dcgm",
            tick=self.poll_once,
            interval=self.interval_s,
            first_tick=0.0,
            on_start=self._open,
            on_stop=self._close,
            logger=log,
        )

    def start(self) -> ServerDcgm:
        self._worker.start()
        return self

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop polling; True if the thread ended within ``timeout`` s."""
        ended = self._worker.close(timeout)
        if ended:
            self._close()  # polled without the thread (a test): its store is still open
            source = getattr(self.dcgm, "source", None)
            if isinstance(source, PrometheusSource):
                source.close()
        return ended

    def _open(self) -> None:
        self._store = Store(self.db, readonly=True)

    def _close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    # -- polling -----------------------------------------------------------------------------
    def poll_once(self) -> None:
        """Read the running runs' GPUs once and write them into the runs."""
        self.polls += 1
        if self._store is None:
            self._open()
        assert self._store is not None
        now = self.clock()
        targets = [t for t in running_targets(self._store) if self._moving(t, now)]
        hosts = set().union(*(t.hosts for t in targets))
        if not hosts:
            return
        try:
            gpus = self.dcgm.gpus(hosts=sorted(hosts))
        except PrometheusError as exc:  # down, or not Prometheus: warned once, polled again
            self.outage.failed(exc.reason)
            return
        self.outage.answered()
        pending = []
        for target in targets:
            mine = [g for g in gpus if g.host in target.hosts]
            batch = self._batch(target, mine, now)
            if batch is None:
                continue
            try:
                pending.append((target, self.submit(target.run_id, [batch])))
            except Exception as exc:  # the server is busy or shutting down: next poll
                log.debug(
                    "runwatch serve: DCGM readings of run %d not taken: %s", target.run_id, exc
                )
        for target, future in pending:
            try:
                self.written += future.result(timeout=30.0)["points"]
            except Exception as exc:  # the run was removed, or its attempt changed
                log.debug("runwatch serve: DCGM readings of run %d refused: %s", target.run_id, exc)

    def _moving(self, target: Target, now: float) -> bool:
        """Whether ``target``'s step has moved within ``stale_s`` (see the module doc)."""
        seen = self._progress.get(target.run_id)
        if seen is None or seen[0] != target.step:
            since = now if seen is not None or target.last_time is None else target.last_time
            seen = self._progress[target.run_id] = (target.step, since)
        return now - seen[1] <= self.stale_s

    def _batch(self, target: Target, gpus: list[GpuReading], now: float) -> Batch | None:
        series: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        for reading in gpus:
            labels = {k: v for k, v in gpu_labels(reading, target.ranks).items() if v is not None}
            for metric, value in reading.values.items():
                series.append(
                    {
                        "metric": metric,
                        "labels": labels,
                        "steps": [target.step],
                        "times": [now],
                        "values": [float(value)],
                    }
                )
            key = (target.run_id, reading.host, reading.gpu)
            xid = self.xids.new(key, reading.values.get("gpu_last_xid"))
            if xid is not None:
                message, critical = xid_message(xid, reading.host, reading.gpu)
                events.append(
                    {
                        "kind": "xid",
                        "step": target.step,
                        "time": now,
                        "message": message,
                        "rank": labels.get("rank"),
                        "host": reading.host,
                        "attrs": {"xid": xid, "gpu": reading.gpu, "critical": critical},
                    }
                )
        if not series and not events:
            return None
        self._seq += 1
        return Batch.model_validate(
            {
                "client_id": self._client_id,
                "seq": self._seq,
                "attempt": target.attempt,
                "series": series,
                "events": events,
            }
        )


def running_targets(store: Store) -> list[Target]:
    """The running runs of ``store`` that name hosts in their series labels, with their
    latest attempt, last step and rank map."""
    runs = store.runs()
    out = []
    for row in runs[runs["status"] == "running"].to_dict("records"):
        run_id = int(row["run_id"])
        series = store.series(run_id)
        hosts: set[str] = set()
        pairs: set[tuple[int, str]] = set()
        for rank, host in zip(series["rank"], series["host"], strict=True):
            host = label_value(host)
            if host is None:
                continue
            hosts.add(str(host))
            rank = label_value(rank)
            if isinstance(rank, int):
                pairs.add((rank, str(host)))
        attempts = store.attempt_numbers(run_id)
        if not hosts or not attempts:
            continue
        step = label_value(row["last_step"])
        last_time = label_value(row["last_time"])
        out.append(
            Target(
                run_id=run_id,
                attempt=max(attempts),
                step=int(step) if isinstance(step, int) and step >= 0 else 0,
                last_time=float(last_time) if last_time is not None else None,
                hosts=frozenset(hosts),
                ranks=RankMap.by_local_order(pairs),
            )
        )
    return out
