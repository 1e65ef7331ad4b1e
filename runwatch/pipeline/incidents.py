"""Forming a stored run's incidents: its anomalies and failure events, grouped and explained.

The same function runs live (after the detection thread stores episodes) and on replay
(``runwatch analyze``), over what the store holds for the run, every attempt included: a
crash signature recurs across restarts, which no one process sees. Hypotheses get their
exposure here, from the store: the ranks on each host and the steps under each logged
context value (docs/architecture.md, "Incidents").
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from runwatch.detect.hypotheses import rank_hypotheses, summarize
from runwatch.detect.incidents import Member, form_incidents
from runwatch.model import FAILURE_EVENTS, Incident
from runwatch.store.sqlite import Store

log = logging.getLogger("runwatch.pipeline.incidents")

MAX_HYPOTHESES = 5
"""Hypotheses kept per incident, best first."""


def refresh_incidents(
    store: Store, run: str | int, source: str, roles: Mapping[str, str] | None = None
) -> list[int]:
    """Form the run's incidents from its ``source`` anomalies and its failure events, rank
    their hypotheses, and store them; return the ids of the incidents new or changed."""
    run_id = store.run_id(run) if isinstance(run, str) else run
    incidents = form_run_incidents(store, run_id, source, roles)
    return store.save_incidents(run_id, source, incidents)


def form_run_incidents(
    store: Store, run_id: int, source: str, roles: Mapping[str, str] | None = None
) -> list[Incident]:
    """The run's incidents as :func:`refresh_incidents` stores them (not stored)."""
    members = anomaly_members(store.anomalies(run_id, source=source))
    events = store.events(run_id, kinds=list(FAILURE_EVENTS))
    members += event_members(events)
    attempts = store.attempts(run_id)
    starts = {
        int(a): (None if s is None or s != s else int(s))
        for a, s in zip(attempts["attempt"], attempts["start_step"], strict=True)
    }
    series = store.series(run_id)
    ranks = series.dropna(subset=["rank"]).groupby("metric")["rank"].nunique().to_dict()
    incidents = form_incidents(members, roles, starts, ranks)
    explain(store, run_id, incidents, series)
    return incidents


def anomaly_members(frame: pd.DataFrame) -> list[Member]:
    """Stored anomalies as the grouping takes them."""
    out = []
    for row in frame.itertuples(index=False):
        labels = tuple(sorted((k, v) for k, v in row.labels.items() if v is not None))
        out.append(
            Member(
                kind="anomaly",
                id=int(row.id),
                what=row.detector,
                step=int(row.start_step),
                end_step=int(row.end_step),
                severity=row.severity,
                metric=row.metric,
                labels=labels,
                size=_ratio(row.observed, row.expected),
                is_open=bool(row.is_open),
                message=row.message,
                details=row.details,
            )
        )
    return out


def event_members(frame: pd.DataFrame) -> list[Member]:
    """Stored failure events (crash, OOM, NCCL timeout, hang, Xid, error log) as members."""
    out = []
    for row in frame.itertuples(index=False):
        labels = tuple(
            (k, v) for k, v in (("host", row.host), ("rank", _int(row.rank))) if v is not None
        )
        out.append(
            Member(
                kind="event",
                id=int(row.id),
                what=row.kind,
                step=_int(row.step),
                end_step=_int(row.step),
                severity=FAILURE_EVENTS[row.kind],
                labels=labels,
                message=row.message or row.kind,
                time=float(row.time),
                attempt=_int(row.attempt),
            )
        )
    return out


def explain(store: Store, run_id: int, incidents: list[Incident], series: pd.DataFrame) -> None:
    """Rank each incident's hypotheses against the run's exposure (``series``: the run's
    ``store.series``), in place."""
    needs = [inc for inc in incidents if inc.details.get("occurrences", 0) > 1]
    if not needs:
        return
    exposure = _exposure(store, run_id, series)
    for inc in needs:
        occurrences = [dict(o) for o in inc.details["at"]]
        if not occurrences:
            continue
        steps = [o.get("step") for o in occurrences]
        ranks = [o.get("rank") for o in occurrences]
        for occ, ctx in zip(occurrences, store.context_at(run_id, steps, ranks), strict=True):
            occ.update({k: v for k, v in ctx.items() if k not in occ})
        attrs = _covering(exposure, occurrences)
        if not attrs:
            continue
        noun = _plural(inc)
        try:
            ranked = rank_hypotheses(occurrences, attrs, noun=noun)
        except ValueError as exc:  # an exposure the store could not give: say so, go on
            log.info("no hypotheses for incident %s: %s", inc.key, exc)
            continue
        inc.hypotheses = [
            {"cause": h.cause, "score": round(h.score, 2), "evidence": h.evidence}
            for h in ranked[:MAX_HYPOTHESES]
        ]
        inc.details["summary"] = summarize(ranked)


def _exposure(store: Store, run_id: int, series: pd.DataFrame) -> dict[str, dict[Any, float]]:
    """Per attribute, each value's weight: ranks on a host, each rank and GPU once, steps
    under a context value."""
    pairs = series[[c for c in ("rank", "host", "gpu") if c in series.columns]]
    out: dict[str, dict[Any, float]] = {}
    ranks = pairs["rank"].dropna().unique() if "rank" in pairs else []
    if len(ranks):
        out["rank"] = {int(r): 1.0 for r in ranks}
    if "host" in pairs and pairs["host"].notna().any():
        with_host = pairs.dropna(subset=["host"])
        per_host = (
            with_host.dropna(subset=["rank"]).groupby("host")["rank"].nunique()
            if "rank" in with_host
            else pd.Series(dtype=float)
        )
        out["host"] = {h: float(max(1, per_host.get(h, 1))) for h in with_host["host"].unique()}
    for key, weights in store.context_exposure(run_id).items():
        out[key] = {v: float(w) for v, w in weights.items()}
    return out


def _covering(
    exposure: Mapping[str, Mapping[Any, float]], occurrences: list[dict[str, Any]]
) -> dict[str, dict[Any, float]]:
    """The attributes whose exposure covers every value the occurrences have; a value seen
    only in events (a host with no series) is added with the least weight."""
    out: dict[str, dict[Any, float]] = {}
    for attr, weights in exposure.items():
        have = {str(k): w for k, w in weights.items()}
        extra = {
            o[attr]: min(weights.values())
            for o in occurrences
            if o.get(attr) is not None and str(o[attr]) not in have
        }
        if len(weights) + len(extra) > 1:
            out[attr] = {**weights, **extra}
    return out


def _plural(inc: Incident) -> str:
    kinds = inc.details.get("kinds", [])
    if any(k.endswith(":crash") or k.endswith(":oom") for k in kinds):
        return "crashes"
    if any(k.startswith("event:") for k in kinds):
        return "failures"
    return "occurrences"


def _ratio(observed: Any, expected: Any) -> float | None:
    try:
        o, e = float(observed), float(expected)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(o) and math.isfinite(e)) or e == 0:
        return None
    return o / e


def _int(value: Any) -> int | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value)
