"""Prometheus as a source: NVIDIA DCGM exporter metrics through the Prometheus HTTP API.

The path for fleets too big for one process to poll: every node already runs
``dcgm-exporter``, Prometheus (or Thanos, Mimir, VictoriaMetrics -- same API) scrapes it, and
runwatch asks PromQL for the GPU readings of the hosts in a job. The exporter labels each series
with ``Hostname`` and ``gpu`` (the index on the host); :class:`RankMap` turns those into the
job's ranks, so a DCGM reading lands on the same series labels (rank, host, gpu) as the
training process's own step times.

Readings come back in the NVML collector's metric names (``gpu_temp_c``...), so the hardware
rules and the dashboard treat both sources alike. Absent values (a metric the exporter is not
configured to export) are simply missing.

>>> RankMap.by_host_order([("node-b", 0), ("node-a", 1), ("node-a", 0)]).rank("node-b", 0)
2
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
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


class PrometheusError(RuntimeError):
    """The Prometheus API refused a query or could not be reached; carries the query."""

    def __init__(self, url: str, query: str, reason: str) -> None:
        super().__init__(f"{url}: query {query!r} failed: {reason}")
        self.url = url
        self.query = query
        self.reason = reason


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

    def rank(self, host: str, gpu: int) -> int | None:
        return self.ranks.get((str(host), int(gpu)))


class PrometheusSource:
    """A minimal client of the Prometheus HTTP API (``/api/v1/query``, ``query_range``)."""

    def __init__(
        self, url: str, *, timeout_s: float = 10.0, client: httpx.Client | None = None
    ) -> None:
        self.url = url.rstrip("/")
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
        return [(r["metric"], float(r["value"][1])) for r in data.get("result", [])]

    def query_range(
        self, promql: str, start: float, end: float, step_s: float
    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """A range query: ``[(labels, [(time, value), ...]), ...]``."""
        params = {"query": promql, "start": start, "end": end, "step": step_s}
        data = self._get("/api/v1/query_range", params, promql)
        return [
            (r["metric"], [(float(t), float(v)) for t, v in r["values"]])
            for r in data.get("result", [])
        ]

    def _get(self, path: str, params: dict[str, Any], promql: str) -> dict[str, Any]:
        try:
            resp = self._client.get(self.url + path, params=params)
        except httpx.HTTPError as exc:
            raise PrometheusError(self.url, promql, str(exc)) from exc
        try:
            body = resp.json()
        except ValueError:
            raise PrometheusError(self.url, promql, f"HTTP {resp.status_code}, not JSON") from None
        if body.get("status") != "success":
            raise PrometheusError(self.url, promql, str(body.get("error") or resp.status_code))
        return body["data"]


class DcgmSource:
    """GPU readings of a fleet from DCGM exporter metrics in Prometheus, mapped to ranks.

    ``selector`` narrows the series (``'Hostname=~"node-(1|2)"'``, ``'job="dcgm"'``);
    ``ranks`` maps (Hostname, gpu) to ranks (default: :meth:`RankMap.by_host_order` over the
    GPUs found).
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

    def promql(self) -> str:
        """One query for every field: a ``__name__`` regex, so one round trip per poll."""
        names = "|".join(self.metrics)
        extra = f",{self.selector}" if self.selector else ""
        return f'{{__name__=~"{names}"{extra}}}'

    def readings(self, at: float | None = None) -> pd.DataFrame:
        """The latest readings: columns metric, rank, host, gpu, value, time (long format)."""
        rows = self.source.query(self.promql(), at)
        when = at if at is not None else time.time()
        records = []
        for labels, value in rows:
            name = labels.get("__name__", "")
            if name not in self.metrics or "Hostname" not in labels or "gpu" not in labels:
                continue
            metric, scale = self.metrics[name]
            records.append(
                {
                    "metric": metric,
                    "host": labels["Hostname"],
                    "gpu": int(labels["gpu"]),
                    "value": value * scale if not math.isnan(value) else value,
                    "time": when,
                }
            )
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
