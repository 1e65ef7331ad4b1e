"""DCGM readings polled from Prometheus into a run: what ``runwatch.init(dcgm=URL)`` starts.

A background worker asks Prometheus, every ``interval_s`` seconds (15 s, the DCGM exporter's
usual scrape interval), for the latest readings of the GPUs of some hosts (the run's own host
by default) and logs them into the run with ``run.log_labeled`` under rank, host and gpu
labels, as the NVML sampler does; a GPU's last-XID gauge changing to a non-zero value becomes
an ``xid`` event. Only one process of a job polls (rank 0), so a 1,000-rank job asks
Prometheus once per interval, not 1,000 times.

Why not raise: Prometheus being down, or a URL pointing at something else, must never cost
the training run anything. The first failed poll logs one warning (the URL and the error),
later ones are counted and logged at DEBUG, and polling goes on at the interval; when
Prometheus answers again that is logged once too. A runwatch bug in a poll is caught by the
worker's guard (``runwatch.guard``).

>>> class Source:  # a Prometheus that knows one hot GPU with XID 79
...     def gpus(self, at=None, hosts=None):
...         return [GpuReading("n1", 1, {"gpu_temp_c": 91.0, "gpu_last_xid": 79.0})]
>>> class Sink:
...     def __init__(self): self.points, self.events = [], []
...     def log_labeled(self, data, labels, step=None): self.points.append((labels, data))
...     def event(self, kind, step=None, message="", **attrs): self.events.append(attrs)
>>> sink = Sink()
>>> poller = DcgmPoller(sink, "http://prom:9090", hosts=["n1"], dcgm=Source(),
...                     ranks=RankMap.block(["n1"], per_host=8))
>>> poller.poll_once(); poller.poll_once()
>>> sink.points[0][0], len(sink.points), len(sink.events), sink.events[0]["xid"]
({'rank': 1, 'host': 'n1', 'gpu': 1}, 2, 1, 79)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from runwatch.collectors.dcgm import (
    DcgmSource,
    GpuReading,
    PrometheusError,
    PrometheusSource,
    RankMap,
    check_url,
)
from runwatch.collectors.nvml import CRITICAL_XIDS
from runwatch.collectors.sampler import LabeledSink
from runwatch.worker import Worker

log = logging.getLogger("runwatch.collectors")

DEFAULT_INTERVAL_S = 15.0
"""The DCGM exporter's usual scrape interval: polling faster only reads the same samples."""

EMPTY_WARN_S = 60.0
"""How long Prometheus may answer with no DCGM series for the hosts before that is a warning
(a target just added is first scraped a few seconds after Prometheus loads it)."""


class Outage:
    """One warning per outage of Prometheus: the first failure is a warning naming the URL
    and the error, later ones DEBUG, and the first success after it one INFO line.

    Parameters
    ----------
    url : str
        The Prometheus URL, for the messages.
    interval_s : float
        The polling interval, for the messages.
    logger : logging.Logger
        Where the messages go.
    """

    def __init__(self, url: str, interval_s: float, logger: logging.Logger) -> None:
        self.url = url
        self.interval_s = interval_s
        self.log = logger
        self.down = False
        self.failures = 0

    def failed(self, reason: str) -> None:
        self.failures += 1
        if self.down:
            self.log.debug("runwatch: DCGM poll of %s failed again: %s", self.url, reason)
            return
        self.down = True
        self.log.warning(
            "runwatch: cannot read DCGM metrics from Prometheus at %s (%s); trying again "
            "every %g s",
            self.url,
            reason,
            self.interval_s,
        )

    def answered(self) -> None:
        if self.down:
            self.down = False
            self.log.info("runwatch: Prometheus at %s answers again", self.url)


class XidWatch:
    """The exporter gauges each GPU's *last* XID; a change to a non-zero value is one XID.

    A non-zero value seen first also counts: the exporter cannot say when it happened, and
    a GPU that reported an XID is worth a look as a run starts on it.
    """

    def __init__(self) -> None:
        self._last: dict[Any, float] = {}

    def new(self, key: Any, value: float | None) -> int | None:
        """The XID ``key``'s gauge now reports, if it is a new one; else None."""
        if value is None or value != value:
            return None
        before = self._last.get(key, 0.0)
        self._last[key] = value
        if value != before and value > 0:
            return int(value)
        return None


def xid_message(xid: int, host: str, gpu: int) -> tuple[str, bool]:
    """The event message for XID ``xid`` on a GPU, and whether the XID is critical."""
    critical = xid in CRITICAL_XIDS
    return f"{'critical ' if critical else ''}XID {xid} on {host} GPU {gpu} (DCGM)", critical


def gpu_labels(reading: GpuReading, ranks: RankMap | None) -> dict[str, Any]:
    """Series labels of a GPU. ``rank`` is None (left out) for a GPU no rank drives, so the
    polling process's own rank never lands on another GPU's series."""
    rank = ranks.rank(reading.host, reading.gpu) if ranks is not None else None
    return {"rank": rank, "host": reading.host, "gpu": reading.gpu}


class DcgmPoller:
    """Polls the DCGM readings of ``hosts`` from Prometheus into ``run`` on a worker thread.

    Parameters
    ----------
    run : Run
        Where the readings go (``log_labeled`` and ``event``; both never block).
    url : str
        The Prometheus URL (``http://prometheus:9090``); a malformed one raises
        ``ValueError`` here.
    hosts : sequence of str
        The hosts whose GPUs are read (the exporter's ``Hostname`` label).
    interval_s : float
        Seconds between polls (the first one at once).
    ranks : RankMap, optional
        (host, gpu) -> rank; None: no rank label (a single process: GPUs are not ranks).
    timeout_s : float, optional
        Seconds a query may take (default: the interval, between 1 and 10 s).
    dcgm : DcgmSource, optional
        The source to read (default: one over ``url``; a stub in tests).
    clock : callable
        Monotonic seconds, for how long Prometheus has had nothing for the hosts.
    """

    def __init__(
        self,
        run: LabeledSink,
        url: str,
        *,
        hosts: Sequence[str],
        interval_s: float = DEFAULT_INTERVAL_S,
        ranks: RankMap | None = None,
        timeout_s: float | None = None,
        dcgm: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = check_url(url)
        self.interval_s = check_interval(interval_s)
        self.hosts = check_hosts(hosts)
        self.run = run
        self.ranks = ranks
        self.clock = clock
        if dcgm is None:
            timeout = timeout_s if timeout_s is not None else min(10.0, max(1.0, interval_s))
            dcgm = DcgmSource(PrometheusSource(self.url, timeout_s=timeout))
        self.dcgm = dcgm
        self.outage = Outage(self.url, self.interval_s, log)
        self.xids = XidWatch()
        self.polls = 0
        self._empty_since: float | None = None
        self._empty_warned = False
        self._worker = Worker(
            "runwatch-dcgm",
            tick=self.poll_once,
            interval=self.interval_s,
            first_tick=0.0,
            logger=log,
        )

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> DcgmPoller:
        """Start polling (the first poll at once); a no-op while the interpreter shuts down."""
        self._worker.start()
        return self

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop polling; True if the thread ended within ``timeout`` s (a query in flight
        is left to time out on its own, and what it reads is dropped by the finished run)."""
        ended = self._worker.close(timeout)
        if ended:
            source = getattr(self.dcgm, "source", None)
            if isinstance(source, PrometheusSource):
                source.close()
        return ended

    @property
    def running(self) -> bool:
        return self._worker.alive

    def stats(self) -> dict[str, Any]:
        """Polls made, failed polls (Prometheus unreachable or refusing), internal errors."""
        return {
            "polls": self.polls,
            "failures": self.outage.failures,
            "errors": self._worker.errors.count,
        }

    # -- polling -----------------------------------------------------------------------------
    def poll_once(self) -> None:
        """Read the hosts' GPUs once and log them (what the thread does each tick)."""
        self.polls += 1
        try:
            gpus = self.dcgm.gpus(hosts=self.hosts)
        except PrometheusError as exc:  # down, or not Prometheus: warned once, polled again
            self.outage.failed(exc.reason)
            return
        self.outage.answered()
        self._note_empty(not gpus)
        run = self.run
        for reading in gpus:
            labels = gpu_labels(reading, self.ranks)
            if reading.values:
                run.log_labeled(dict(reading.values), labels)
            xid = self.xids.new((reading.host, reading.gpu), reading.values.get("gpu_last_xid"))
            if xid is not None:
                message, critical = xid_message(xid, reading.host, reading.gpu)
                run.event(
                    "xid",
                    message=message,
                    xid=xid,
                    gpu=reading.gpu,
                    critical=critical,
                    rank=labels["rank"],
                    host=reading.host,
                )

    def _note_empty(self, empty: bool) -> None:
        """Warn once if Prometheus has had no DCGM series for the hosts for a while: the
        exporter is not scraped, or its ``Hostname`` label is not the host name here."""
        if not empty:
            self._empty_since = None
            return
        now = self.clock()
        if self._empty_since is None:
            self._empty_since = now
        if not self._empty_warned and now - self._empty_since >= EMPTY_WARN_S:
            self._empty_warned = True
            log.warning(
                "runwatch: Prometheus at %s has no DCGM exporter series for host %s; is "
                "dcgm-exporter scraped, and is its Hostname label this name? (dcgm_hosts=[...] "
                "names the hosts)",
                self.url,
                ", ".join(self.hosts),
            )


def check_interval(interval_s: Any, name: str = "dcgm_interval") -> float:
    """``interval_s`` as a float if it is a number > 0; else ValueError naming ``name``."""
    if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)):
        raise ValueError(f"{name}={interval_s!r} is invalid; valid values: a number > 0")
    if not interval_s > 0 or interval_s == float("inf"):
        raise ValueError(f"{name}={interval_s!r} is invalid; valid values: a number > 0")
    return float(interval_s)


def check_hosts(hosts: Any) -> list[str]:
    """``hosts`` as a list of host names; ValueError for a bare string or an empty list."""
    if isinstance(hosts, str) or not isinstance(hosts, Iterable):
        raise ValueError(f"dcgm_hosts={hosts!r} is invalid; valid values: a list of host names")
    names = list(hosts)
    if not names or not all(isinstance(h, str) and h.strip() for h in names):
        raise ValueError(
            f"dcgm_hosts={hosts!r} is invalid; valid values: a non-empty list of host names"
        )
    return list(dict.fromkeys(names))


def start_dcgm(
    run: LabeledSink,
    url: str,
    *,
    hosts: Sequence[str],
    interval_s: float = DEFAULT_INTERVAL_S,
    ranks: RankMap | None = None,
) -> DcgmPoller:
    """Start polling the DCGM readings of ``hosts`` into ``run``; what
    ``runwatch.init(dcgm=URL)`` calls (``poller.stop()`` before ``run.finish()`` ends it)."""
    return DcgmPoller(run, url, hosts=hosts, interval_s=interval_s, ranks=ranks).start()
