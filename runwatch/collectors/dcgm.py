"""Prometheus as a source: NVIDIA DCGM exporter metrics through the Prometheus HTTP API.

The path for fleets too big for one process to poll: every node already runs
``dcgm-exporter``, Prometheus (or Thanos, Mimir, VictoriaMetrics -- same API) scrapes it, and
runwatch asks PromQL for the GPU readings of the hosts in a job. The exporter labels each series
with ``Hostname`` and ``gpu`` (the index on the host); :class:`RankMap` turns those into the
job's ranks, so a DCGM reading lands on the same series labels (rank, host, gpu) as the
training process's own step times.

Readings come back in the NVML collector's metric names (``gpu_temp_c``...), so the hardware
rules and the dashboard treat both sources alike. Absent values (a metric the exporter is not
configured to export) are simply missing. A run polls it with ``runwatch.init(dcgm=URL)``
and ``runwatch serve --dcgm URL`` (:mod:`runwatch.collectors.dcgm_poller`).

>>> RankMap.by_host_order([("node-b", 0), ("node-a", 1), ("node-a", 0)]).rank("node-b", 0)
2
>>> print(host_selector(["node-b", "node-a.cluster"]))
Hostname=~"node-a\\\\.cluster|node-b"
"""

from __future__ import annotations

import logging
import math
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:  # pandas only for the DataFrame readers: a run's poller does without it
    import pandas as pd

log = logging.getLogger("runwatch.collectors")

DCGM_METRICS: dict[str, tuple[str, float]] = {
    # DCGM field -> (runwatch metric, scale)
    "DCGM_FI_DEV_GPU_TEMP": ("gpu_temp_c", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("gpu_power_w", 1.0),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("gpu_power_limit_w", 1.0),
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util_pct", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gpu_mem_util_pct", 1.0),
    "DCGM_FI_DEV_FB_USED": ("gpu_mem_used_gib", 1.0 / 1024.0),  # MiB
    "DCGM_FI_DEV_SM_CLOCK": ("gpu_clock_sm_mhz", 1.0),
    "DCGM_FI_DEV_XID_ERRORS": ("gpu_last_xid", 1.0),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("gpu_ecc_corrected", 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("gpu_ecc_uncorrected", 1.0),
    "DCGM_FI_DEV_RETIRED_SBE": ("gpu_retired_pages_sbe", 1.0),
    "DCGM_FI_DEV_RETIRED_DBE": ("gpu_retired_pages_dbe", 1.0),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("gpu_remapped_rows_corr", 1.0),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("gpu_remapped_rows_unc", 1.0),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gpu_remap_failure", 1.0),
}
"""The DCGM exporter fields read by default, and the NVML collector's name for each."""


_RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")
_LONG_QUERY = 4000
"""Queries longer than this (a selector naming many hosts) go as a POST form, not in a URL."""


class PrometheusError(RuntimeError):
    """The Prometheus API refused a query or could not be reached; carries the query."""

    def __init__(self, url: str, query: str, reason: str) -> None:
        super().__init__(f"{url}: query {query!r} failed: {reason}")
        self.url = url
        self.query = query
        self.reason = reason


def check_url(url: str) -> str:
    """``url`` without a trailing slash if it is an http(s) URL with a host; else ValueError.

    >>> check_url("http://prometheus:9090/")
    'http://prometheus:9090'
    >>> check_url("prometheus:9090")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: Prometheus URL 'prometheus:9090' is malformed: it needs http:// or https://...
    """
    problem = None
    if not isinstance(url, str):
        problem = f"it is a {type(url).__name__}, not a str"
    else:
        try:
            parts = urllib.parse.urlsplit(url.strip())
            parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
        except ValueError as exc:
            problem = str(exc)
        else:
            if parts.scheme not in ("http", "https") or not parts.hostname:
                problem = "it needs http:// or https:// and a host (e.g. http://prometheus:9090)"
            elif any(c.isspace() for c in url.strip()):
                problem = "it contains white space"
    if problem is not None:
        raise ValueError(f"Prometheus URL {url!r} is malformed: {problem}")
    return url.strip().rstrip("/")


def _promql_string(text: str) -> str:
    """``text`` as a double-quoted PromQL string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def host_selector(hosts: Iterable[str]) -> str:
    """A label matcher for the exporter series of ``hosts`` (their ``Hostname`` label)."""
    names = sorted({str(h) for h in hosts})
    if not names:
        raise ValueError("host_selector needs at least one host name")
    if len(names) == 1:
        return f"Hostname={_promql_string(names[0])}"
    pattern = "|".join("".join("\\" + c if c in _RE2_SPECIAL else c for c in h) for h in names)
    return f"Hostname=~{_promql_string(pattern)}"


@dataclass(frozen=True)
class RankMap:
    """(host, gpu) -> rank. Build it from the job's own series (each rank logs its host and
    local GPU) or, when the launcher placed ranks host by host, from the sorted host list."""

    ranks: Mapping[tuple[str, int], int]

    @classmethod
    def by_host_order(cls, pairs: Iterable[tuple[str, int]]) -> RankMap:
        """torchrun/SLURM block placement: hosts sorted by name, GPUs by index."""
        ordered = sorted({(str(h), int(g)) for h, g in pairs})
        return cls({pair: i for i, pair in enumerate(ordered)})

    @classmethod
    def block(cls, hosts: Sequence[str], per_host: int, world_size: int | None = None) -> RankMap:
        """Block placement over ``hosts`` in the launcher's node order: GPU ``i`` of the
        ``k``-th host is rank ``k * per_host + i`` (ranks from ``world_size`` on do not exist).

        >>> RankMap.block(["n1", "n0"], per_host=2).rank("n0", 1)
        3
        """
        ranks: dict[tuple[str, int], int] = {}
        for k, host in enumerate(dict.fromkeys(str(h) for h in hosts)):
            for gpu in range(per_host):
                rank = k * per_host + gpu
                if world_size is None or rank < world_size:
                    ranks[(host, gpu)] = rank
        return cls(ranks)

    @classmethod
    def by_local_order(cls, pairs: Iterable[tuple[int, str]]) -> RankMap:
        """From the (rank, host) pairs a job logged: on each host, its ranks in order drive
        GPUs 0, 1, ... (``LOCAL_RANK`` is the CUDA device, as torchrun and SLURM set it up).

        >>> RankMap.by_local_order([(9, "n1"), (8, "n1"), (0, "n0")]).rank("n1", 1)
        9
        """
        per_host: dict[str, set[int]] = {}
        for rank, host in pairs:
            per_host.setdefault(str(host), set()).add(int(rank))
        return cls(
            {
                (host, gpu): rank
                for host, ranks in per_host.items()
                for gpu, rank in enumerate(sorted(ranks))
            }
        )

    def rank(self, host: str, gpu: int) -> int | None:
        return self.ranks.get((str(host), int(gpu)))


class PrometheusSource:
    """A minimal client of the Prometheus HTTP API (``/api/v1/query``, ``query_range``).

    Parameters
    ----------
    url : str
        The server's base URL (``http://prometheus:9090``); a malformed one raises
        ``ValueError`` here.
    timeout_s : float
        Seconds a query may take before it fails (:class:`PrometheusError`).
    client : httpx.Client, optional
        The HTTP client to use (default: one of its own, closed by :meth:`close`).
    """

    def __init__(
        self, url: str, *, timeout_s: float = 10.0, client: httpx.Client | None = None
    ) -> None:
        self.url = check_url(url)
        self.timeout_s = timeout_s
        self._client = client or httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self._client.close()

    def query(self, promql: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant query: ``[(labels, value), ...]`` (NaN kept as NaN)."""
        params: dict[str, Any] = {"query": promql}
        if at is not None:
            params["time"] = at
        data = self._get("/api/v1/query", params, promql)
        try:
            return [(r["metric"], float(r["value"][1])) for r in data.get("result", [])]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise PrometheusError(self.url, promql, f"malformed reply ({exc!r})") from None

    def query_range(
        self, promql: str, start: float, end: float, step_s: float
    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """A range query: ``[(labels, [(time, value), ...]), ...]``."""
        params = {"query": promql, "start": start, "end": end, "step": step_s}
        data = self._get("/api/v1/query_range", params, promql)
        try:
            return [
                (r["metric"], [(float(t), float(v)) for t, v in r["values"]])
                for r in data.get("result", [])
            ]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise PrometheusError(self.url, promql, f"malformed reply ({exc!r})") from None

    def _get(self, path: str, params: dict[str, Any], promql: str) -> dict[str, Any]:
        try:
            if len(promql) > _LONG_QUERY:  # the API takes a form too, with no URL limit
                resp = self._client.post(self.url + path, data=params)
            else:
                resp = self._client.get(self.url + path, params=params)
        except httpx.HTTPError as exc:
            raise PrometheusError(self.url, promql, str(exc) or type(exc).__name__) from exc
        try:
            body = resp.json()
        except ValueError:
            raise PrometheusError(self.url, promql, f"HTTP {resp.status_code}, not JSON") from None
        if not isinstance(body, dict):
            raise PrometheusError(self.url, promql, f"HTTP {resp.status_code}, not an API reply")
        if body.get("status") != "success":
            raise PrometheusError(self.url, promql, str(body.get("error") or resp.status_code))
        data = body.get("data")
        if not isinstance(data, dict):
            raise PrometheusError(self.url, promql, "malformed reply (no data)")
        return data


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU's latest readings: its host (the exporter's ``Hostname``), its index on the
    host, and ``{runwatch metric: value}`` (NaN kept as NaN)."""

    host: str
    gpu: int
    values: dict[str, float] = field(default_factory=dict)


class DcgmSource:
    """GPU readings of a fleet from DCGM exporter metrics in Prometheus, mapped to ranks.

    Parameters
    ----------
    source : PrometheusSource or str
        The Prometheus server (or its URL).
    selector : str
        Extra label matchers narrowing the series (``'Hostname=~"node-(1|2)"'``,
        ``'job="dcgm"'``).
    ranks : RankMap, optional
        (Hostname, gpu) -> rank; default: :meth:`RankMap.by_host_order` over the GPUs found.
    metrics : mapping
        DCGM field -> (runwatch metric, scale); default :data:`DCGM_METRICS`.
    """

    def __init__(
        self,
        source: PrometheusSource | str,
        *,
        selector: str = "",
        ranks: RankMap | None = None,
        metrics: Mapping[str, tuple[str, float]] = DCGM_METRICS,
    ) -> None:
        self.source = PrometheusSource(source) if isinstance(source, str) else source
        self.selector = selector
        self.ranks = ranks
        self.metrics = dict(metrics)

    def promql(self, hosts: Iterable[str] | None = None) -> str:
        """One query for every field: a ``__name__`` regex, so one round trip per poll;
        ``hosts`` narrows it to those hosts' GPUs."""
        names = "|".join(self.metrics)
        matchers = [f'__name__=~"{names}"']
        if self.selector:
            matchers.append(self.selector)
        if hosts is not None:
            matchers.append(host_selector(hosts))
        return "{" + ",".join(matchers) + "}"

    def gpus(self, at: float | None = None, hosts: Iterable[str] | None = None) -> list[GpuReading]:
        """The latest readings, one :class:`GpuReading` per GPU, sorted by host and index
        (one query; raises :class:`PrometheusError`)."""
        rows = self.source.query(self.promql(hosts), at)
        found: dict[tuple[str, int], dict[str, float]] = {}
        for labels, value in rows:
            name = labels.get("__name__", "")
            if name not in self.metrics or "Hostname" not in labels or "gpu" not in labels:
                continue
            try:
                key = (labels["Hostname"], int(labels["gpu"]))
            except ValueError:  # a MIG instance or a bad label: not a GPU index
                continue
            metric, scale = self.metrics[name]
            found.setdefault(key, {})[metric] = value * scale if not math.isnan(value) else value
        return [GpuReading(host, gpu, values) for (host, gpu), values in sorted(found.items())]

    def readings(self, at: float | None = None) -> pd.DataFrame:
        """The latest readings: columns metric, rank, host, gpu, value, time (long format)."""
        import pandas as pd

        when = at if at is not None else time.time()
        records = [
            {"metric": metric, "host": g.host, "gpu": g.gpu, "value": value, "time": when}
            for g in self.gpus(at)
            for metric, value in g.values.items()
        ]
        frame = pd.DataFrame.from_records(
            records, columns=["metric", "host", "gpu", "value", "time"]
        )
        ranks = self.ranks or RankMap.by_host_order(zip(frame["host"], frame["gpu"], strict=True))
        frame.insert(
            1, "rank", [ranks.rank(h, g) for h, g in zip(frame["host"], frame["gpu"], strict=True)]
        )
        return frame.sort_values(["rank", "metric"], kind="stable").reset_index(drop=True)

    def xid_events(self, start: float, end: float, step_s: float = 15.0) -> pd.DataFrame:
        """XIDs seen in [start, end]: each change of ``DCGM_FI_DEV_XID_ERRORS`` (the exporter
        gauges the last XID) to a non-zero value is one event, with rank, host and gpu."""
        import pandas as pd

        extra = f",{self.selector}" if self.selector else ""
        series = self.source.query_range(
            f'{{__name__="DCGM_FI_DEV_XID_ERRORS"{extra}}}', start, end, step_s
        )
        records = []
        for labels, values in series:
            host, gpu = labels.get("Hostname"), labels.get("gpu")
            if host is None or gpu is None:
                continue
            before = 0.0
            for t, v in values:
                if v != before and v > 0:
                    rank = self.ranks.rank(host, int(gpu)) if self.ranks else None
                    records.append(
                        {"time": t, "xid": int(v), "host": host, "gpu": int(gpu), "rank": rank}
                    )
                before = v
        return pd.DataFrame.from_records(
            records, columns=["time", "xid", "host", "gpu", "rank"]
        ).sort_values("time", kind="stable")
