"""The fleet view: stragglers, hangs and hardware faults across ranks, live or by replay.

The per-series Monitor sees one series at a time; these faults only show *across* ranks, so
they get their own small aggregator. :class:`FleetMonitor` takes the same calls as the Monitor
(``update(metric, labels, step, value, time)``, ``event(event)``, ``finish()``) plus
``tick(now)`` for the clock-driven hang check, so a live pipeline can feed both from one
stream. :func:`fleet_anomalies` is the replay (``runwatch analyze``): the same detectors fed
per step with NumPy rows, so a 4,096-rank run replays quickly; ``runwatch.pipeline.fleet``
runs them over a stored run.

Which series count: a *step-time* series (role ``step_time`` by name or config, e.g.
``step_time``, ``iteration_time_ms``) with a ``rank`` label feeds the straggler and hang
detectors; ``gpu_*`` series (from the NVML collector or DCGM) feed the hardware rules; ``xid``
events do too. ``runwatch.torch`` logs each rank's own time as ``step_time_compute`` (a step
time, so the straggler and hang detectors read it) and its all-reduce wait as
``comm_wait_time``: a straggler's message says which signal named it and whether it also
waited least, as a real straggler does. Where a rank logs its own time, that alone is its
heartbeat for the hang detector: the wall step time users log is the same on every rank of a
synchronous job, and would hide the rank the others wait for. Every anomaly names the rank
(and host and GPU where known) in ``labels``.

>>> import numpy as np, pandas as pd
>>> steps, ranks = np.meshgrid(np.arange(200), np.arange(8), indexing="ij")
>>> t = 1.0 + 0.0 * steps
>>> t[100:, 6] = 1.2
>>> pts = pd.DataFrame({"metric": "step_time", "step": steps.ravel(), "rank": ranks.ravel(),
...                     "value": t.ravel(), "time": steps.ravel() * 1.0})
>>> [(a.detector, a.labels, a.start_step) for a in fleet_anomalies(pts)]
[('straggler', {'rank': 6}, 100)]
"""

from __future__ import annotations

import logging
import math
import time as _time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from runwatch.detect.fleet.failures import FAILURE_KINDS
from runwatch.detect.fleet.hangs import HangDetector
from runwatch.detect.fleet.hardware import HardwareMonitor
from runwatch.detect.fleet.stragglers import StragglerDetector
from runwatch.detect.roles import role_of
from runwatch.model import LABEL_KEYS, Anomaly, Event, label_value

log = logging.getLogger("runwatch.detect.fleet")

OWN_TIME_METRIC = "step_time_compute"
"""Each rank's own time per step, as ``runwatch.torch`` measures it (role ``step_time``)."""
WAIT_METRIC = "comm_wait_time"
"""Each rank's wait in the step's all-reduce (``runwatch.torch``): the straggler waits least."""
OWN_TIME_SMOOTH = 9
"""Steps over which each rank's own time is floored (its minimum) before the straggler rule:
measured per step on a busy host it carries one-sided preemption spikes
(``StragglerDetector(smooth=...)``, ``bench/README-stragglers.md``)."""
WAIT_MEMORY = 500
"""Wait readings kept per rank (live) to say whether a named straggler also waited least."""


class FleetMonitor:
    """Straggler, hang and hardware detection over a stream of per-rank points and events.

    ``config`` maps metric names or patterns to roles, as for the Monitor (only
    ``step_time`` matters here). ``straggler``/``hang``/``hardware`` give the prototype
    detectors (cloned per metric where needed); ``clock`` drives ``tick()`` live.
    """

    def __init__(
        self,
        config: Mapping[str, str] | None = None,
        *,
        straggler: Mapping[str, Any] | None = None,
        hang: Mapping[str, Any] | None = None,
        hardware: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = _time.monotonic,
    ) -> None:
        self.config = dict(config or {})
        self.clock = clock
        self._straggler_params = dict(straggler or {})
        self.hangs = HangDetector(clock=clock, **dict(hang or {}))
        self.hardware = HardwareMonitor(**dict(hardware or {}))
        self._stragglers: dict[str, StragglerDetector] = {}
        self._pending: dict[str, tuple[int, dict[int, float]]] = {}
        self._cols: dict[Any, int] = {}
        self._labels: list[dict[str, Any]] = []
        self._roles: dict[str, bool] = {}
        self._gpu_step: int | None = None
        self._failed = False  # the attempt ended in a failure: no progress is expected
        self._anomalies: list[Anomaly] = []
        self._seen: set[int] = set()
        self._waits: dict[int, deque[tuple[int, float]]] = {}
        # Rank columns that log their own time: it alone is their hang heartbeat (update,
        # step_row; the module docstring says why).
        self._timed: set[int] = set()

    # -- results ---------------------------------------------------------------------------
    @property
    def anomalies(self) -> list[Anomaly]:
        """Every fleet episode so far, in the order it opened."""
        return list(self._anomalies)

    # -- input -----------------------------------------------------------------------------
    @staticmethod
    def reads(metric: str, labels: Mapping[str, Any] | None) -> bool:
        """Whether ``update`` does anything with a series' points: a GPU metric, or any
        metric of a rank. A caller feeding many points skips the others (most of a
        single-process run's) without a call per point."""
        return metric.startswith("gpu_") or label_value((labels or {}).get("rank")) is not None

    def update(
        self,
        metric: str,
        labels: Mapping[str, Any] | None,
        step: int,
        value: float,
        time: float | None = None,
    ) -> list[Anomaly]:
        """Feed one point; return the fleet episodes opened, updated or closed by it."""
        labels = labels or {}
        out: list[Anomaly] = []
        if metric.startswith("gpu_"):
            if self._gpu_step is not None and step > self._gpu_step:
                out += self.hardware.end_step(self._gpu_step)
            self._gpu_step = int(step)
            out += self.hardware.update(metric, labels, int(step), value)
            return self._keep(out)
        rank = label_value(labels.get("rank"))
        if rank is not None and metric == WAIT_METRIC:
            self.wait(self._col(labels), int(step), float(value))
            return out
        if rank is None or not self._is_step_time(metric):
            return out
        col = self._col(labels)
        step = int(step)
        if metric == OWN_TIME_METRIC:
            self._timed.add(col)
        if metric == OWN_TIME_METRIC or col not in self._timed:
            self.hangs.beat(col, step, now=time)
        pending = self._pending.get(metric)
        if pending is not None and step > pending[0]:
            out += self._flush(metric)
            pending = None
        if pending is None:
            pending = (step, {})
            self._pending[metric] = pending
        if step == pending[0]:
            pending[1][col] = float(value)
        return self._keep(out)

    def wait(self, col: int, step: int, value: float) -> None:
        """Take one rank's all-reduce wait at ``step`` (it explains a straggler; it names none:
        the healthy ranks are the ones that wait)."""
        q = self._waits.get(col)
        if q is None:
            q = self._waits[col] = deque(maxlen=WAIT_MEMORY)
        q.append((int(step), float(value)))

    def step_row(
        self, metric: str, step: int, columns: np.ndarray, values: np.ndarray, time: float
    ) -> list[Anomaly]:
        """Feed one step of a step-time metric for many rank columns at once (replay)."""
        beating = columns[np.isfinite(values)]
        if metric == OWN_TIME_METRIC:
            self._timed.update(beating.tolist())
        elif self._timed:
            beating = beating[~np.isin(beating, list(self._timed))]
        self.hangs.beat_many(beating, int(step), now=time)
        row = np.full(len(self._labels), np.nan)
        row[columns] = values
        return self._keep(self._detector(metric).update(int(step), row))

    def event(self, event: Event) -> list[Anomaly]:
        """Take a run event: XIDs go to the hardware rules; a restart starts the fleet over."""
        out: list[Anomaly] = []
        if event.kind == "xid":
            attrs = event.attrs or {}
            code = attrs.get("xid")
            if code is not None:
                labels = {"rank": event.rank, "host": event.host, "gpu": attrs.get("gpu")}
                labels = {k: label_value(v) for k, v in labels.items()}
                labels = {k: v for k, v in labels.items() if v is not None}
                out += self.hardware.xid(labels, int(event.step or 0), int(code))
        elif event.kind in FAILURE_KINDS and not self._failed:
            # Progress that stopped before the failure was a hang (ranks waiting out the
            # NCCL timeout); after it the job is down until it restarts, which is no hang.
            out += self.hangs.check(event.time if event.time == event.time else None)
            self._failed = True
        elif event.kind in ("restart", "resume"):
            now = event.time if event.time == event.time else None
            if not self._failed:
                out += self.hangs.check(now)
            self._failed = False
            for metric in list(self._pending):
                out += self._flush(metric)
            for det in self._stragglers.values():
                out += det.finish()
                det.reset()
            self.hangs.restart()
        return self._keep(out)

    def tick(self, now: float | None = None) -> list[Anomaly]:
        """The clock-driven check (call every few seconds live): has progress stopped?"""
        if self._failed:
            return []
        return self._keep(self.hangs.check(now))

    def finish(self, now: float | None = None) -> list[Anomaly]:
        """Flush and close every open episode; ``now`` runs a last hang check first."""
        out: list[Anomaly] = []
        if now is not None and not self._failed:
            out += self.hangs.check(now)
        for metric in list(self._pending):
            out += self._flush(metric)
        if self._gpu_step is not None:
            out += self.hardware.end_step(self._gpu_step)
        for det in self._stragglers.values():
            out += det.finish()
        out += self.hangs.finish()
        out += self.hardware.finish()
        return self._keep(out)

    # -- internals -------------------------------------------------------------------------
    def _is_step_time(self, metric: str) -> bool:
        known = self._roles.get(metric)
        if known is None:
            known = self._roles[metric] = role_of(metric, self.config) == "step_time"
        return known

    def _col(self, labels: Mapping[str, Any]) -> int:
        rank = label_value(labels.get("rank"))
        col = self._cols.get(rank)
        if col is None:
            col = self._cols[rank] = len(self._labels)
            named = {k: label_value(labels.get(k)) for k in LABEL_KEYS}
            named = {k: v for k, v in named.items() if v is not None}
            self._labels.append(named)
            self.hangs.set_labels(col, named)
            for det in self._stragglers.values():
                det.set_labels(col, named)
        return col

    def _detector(self, metric: str) -> StragglerDetector:
        det = self._stragglers.get(metric)
        if det is None:
            params = dict(self._straggler_params)
            if metric == OWN_TIME_METRIC:
                params.setdefault("smooth", OWN_TIME_SMOOTH)
                # smoothed readings run together: 7 in a row is no longer a short burst
                params.setdefault("short_ratio", 1e9)
            det = StragglerDetector(metric=metric, **params)
            for col, named in enumerate(self._labels):
                det.set_labels(col, named)
            self._stragglers[metric] = det
        return det

    def _flush(self, metric: str) -> list[Anomaly]:
        step, values = self._pending.pop(metric)
        row = np.full(len(self._labels), np.nan)
        for col, v in values.items():
            row[col] = v
        return self._detector(metric).update(step, row)

    def _explain(self, a: Anomaly) -> None:
        """Say which signal named a straggler, and whether its wait agrees (least wait)."""
        if a.details.get("signal"):
            return
        own = a.metric == OWN_TIME_METRIC
        a.details["signal"] = a.metric
        what = "its own compute time" if own else "its step time"
        note = f"named by {what} ({a.metric})"
        col = a.details.get("column")
        lo, hi = a.start_step, a.details.get("detected_at", a.end_step)
        mine = _window(self._waits.get(col), lo, hi) if col is not None else []
        others = [v for c, q in self._waits.items() if c != col for v in _window(q, lo, hi)]
        if mine and others:
            ratio = float(np.median(mine)) / max(float(np.median(others)), 1e-12)
            a.details["wait_ratio"] = ratio
            agrees = ratio < 1.0
            a.details["wait_agrees"] = agrees
            note += (
                f"; it waits {'least' if agrees else 'no less than the others'} in the "
                f"all-reduce ({WAIT_METRIC} {ratio:.2f}x the other ranks')"
            )
        a.details["note"] = note
        a.message = f"{a.message}; {note}" if a.message else note

    def _keep(self, out: list[Anomaly]) -> list[Anomaly]:
        for a in out:
            if a.detector == StragglerDetector.name:
                self._explain(a)
            if id(a) not in self._seen:
                self._seen.add(id(a))
                self._anomalies.append(a)
        return out


def _window(q: Any, lo: int, hi: int) -> list[float]:
    """The readings of ``q`` ((step, value) pairs) at steps ``lo``..``hi``."""
    if not q:
        return []
    return [v for s, v in q if lo <= s <= hi and v == v]


def fleet_anomalies(
    points: pd.DataFrame,
    events: pd.DataFrame | None = None,
    config: Mapping[str, str] | None = None,
    *,
    now: float | None = None,
    monitor: FleetMonitor | None = None,
) -> list[Anomaly]:
    """Replay the fleet detectors over a run's points (long format with a ``rank`` column)
    and events; return every episode, closed, in the order it opened.

    Points of every attempt may be given (an ``attempt`` column): the ranks that were behind
    when a hang struck are in the attempt the restart superseded. ``now`` (default: the last
    event or point time) is when a last hang check runs.
    """
    fm = monitor if monitor is not None else FleetMonitor(config)
    if points is None or len(points) == 0:
        return []
    return replay_fleet(fm, points, events, now)


def fleet_metrics(series: pd.DataFrame, config: Mapping[str, str] | None = None) -> list[str]:
    """The metrics of a run's series catalogue (``Store.series``) that the fleet detectors
    read: ``gpu_*`` ones, and step-time ones that have a series with a ``rank`` label.

    >>> cat = pd.DataFrame({"metric": ["loss", "step_time", "step_time", "gpu_temp_c"],
    ...                     "rank": [None, None, 3, None]})
    >>> fleet_metrics(cat)
    ['gpu_temp_c', 'step_time']
    """
    metrics = series["metric"].astype(str)
    ranked = set(metrics[series["rank"].notna()]) if "rank" in series.columns else set()
    wanted = {m for m in metrics if m.startswith("gpu_")}
    wanted |= {m for m in ranked if role_of(m, config) == "step_time"}
    return sorted(wanted)


def replay_fleet(
    fm: FleetMonitor, points: pd.DataFrame, events: pd.DataFrame | None, now: float | None
) -> list[Anomaly]:
    """Feed ``points`` and ``events`` to ``fm`` in time order (step-time rows per step, GPU
    readings, events) and return what it flagged, for a replay or a stored run."""
    evs = _event_list(events)
    timeline: list[tuple[float, int, Any]] = [(e.time, 0, e) for e in evs]
    has_rank = "rank" in points.columns
    metrics = points["metric"].astype(str)
    if has_rank:
        for metric in sorted(metrics[points["rank"].notna()].unique()):
            if fm._is_step_time(metric):
                rows = points[(metrics == metric) & points["rank"].notna()]
                timeline += _step_rows(fm, metric, rows)
        waits = points[(metrics == WAIT_METRIC) & points["rank"].notna()]
        for rec in waits[["rank", "step", "value"]].itertuples(index=False):
            fm.wait(fm._col({"rank": rec.rank}), int(rec.step), float(rec.value))
    gpu = points[metrics.str.startswith("gpu_")]
    timeline.sort(key=lambda item: (item[0], item[1]))
    for t, kind, payload in timeline:
        if kind == 0:
            fm.event(payload)
        else:
            metric, step, cols, values = payload
            fm.tick(t)
            fm.step_row(metric, step, cols, values, t)
    if len(gpu):
        cols = [c for c in LABEL_KEYS if c in gpu.columns]
        ordered = gpu.sort_values("step", kind="stable")
        for rec in ordered[["metric", "step", "value", *cols]].itertuples(index=False):
            labels = {c: label_value(getattr(rec, c)) for c in cols}
            fm.update(
                rec.metric,
                {k: v for k, v in labels.items() if v is not None},
                int(rec.step),
                float(rec.value),
            )
    end = now
    if end is None:
        times = [t for t, _, _ in timeline if t == t]
        end = max(times) if times else None
    fm.finish(end)
    return fm.anomalies


def _step_rows(fm: FleetMonitor, metric: str, rows: pd.DataFrame) -> list[tuple[float, int, Any]]:
    """One timeline entry per (attempt, step): the ranks' values as a NumPy row."""
    out: list[tuple[float, int, Any]] = []
    label_cols = [c for c in LABEL_KEYS if c in rows.columns]
    firsts = rows.drop_duplicates("rank")[label_cols]
    for rec in firsts.itertuples(index=False):
        fm._col({c: getattr(rec, c) for c in label_cols})
    cols = rows["rank"].map(lambda r: fm._cols[label_value(r)]).to_numpy(dtype=np.int64)
    times = rows["time"].to_numpy(dtype=float) if "time" in rows else np.full(len(rows), np.nan)
    attempt = rows["attempt"].to_numpy() if "attempt" in rows else np.zeros(len(rows), int)
    frame = pd.DataFrame(
        {
            "a": attempt,
            "s": rows["step"].to_numpy(),
            "c": cols,
            "v": rows["value"].to_numpy(),
            "t": times,
        }
    ).sort_values(["a", "s"], kind="stable")
    keys = frame[["a", "s"]].to_numpy()
    bounds = np.flatnonzero(np.any(keys[1:] != keys[:-1], axis=1)) + 1
    c_all, v_all, t_all = frame["c"].to_numpy(), frame["v"].to_numpy(float), frame["t"].to_numpy()
    s_all = frame["s"].to_numpy()
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(frame)], strict=True):
        t = float(np.nanmax(t_all[lo:hi])) if np.isfinite(t_all[lo:hi]).any() else math.nan
        out.append((t, 1, (metric, int(s_all[lo]), c_all[lo:hi], v_all[lo:hi])))
    return out


def _event_list(events: pd.DataFrame | None) -> list[Event]:
    if events is None or len(events) == 0:
        return []
    import json

    out = []
    for rec in events.to_dict("records"):
        attrs = rec.get("attrs") or {}
        if isinstance(attrs, str):
            try:
                attrs = json.loads(attrs)
            except ValueError:
                attrs = {}
        step = label_value(rec.get("step"))
        t = rec.get("time")
        out.append(
            Event(
                kind=str(rec.get("kind")),
                step=None if step is None else int(step),
                time=float(t) if t is not None and t == t else math.nan,
                message=str(rec.get("message") or ""),
                rank=label_value(rec.get("rank")),
                host=label_value(rec.get("host")),
                attrs=dict(attrs),
            )
        )
    return out


def step_clock_metric(series: pd.DataFrame, config: Mapping[str, str] | None = None) -> str | None:
    """The metric that times the run's steps: a step-time series, else a loss, else the
    metric with the most points."""
    if series.empty:
        return None
    metrics = series.groupby("metric")["points"].sum().sort_values(ascending=False)
    for role in ("step_time", "loss"):
        for m in metrics.index:
            if role_of(str(m), config) == role:
                return str(m)
    return str(metrics.index[0])
