"""An alert: one anomaly episode as the alerting side sees it (labels, status, numbers).

The labels are what routes, silences, inhibition and grouping work on, as in Alertmanager;
the numbers (observed vs expected with its band, the steps) are what the message says. An
alert's identity is the anomaly's row id in the store, so an episode that grows or closes
updates the same alert rather than making a new one. The engine adds the ``incident`` label
(the id of the incident the episode belongs to) once the store has formed it.

A failure event (crash, OOM, NCCL timeout, hang, Xid, error log) that live detection put
into an incident is an alert too (``alert_from_event``): its ``detector`` label is the event
kind, and its id is the event's row id, negated, so it never collides with an anomaly's.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from runwatch.model import Anomaly


@dataclass(slots=True)
class Alert:
    """A firing or resolved alert; ``ends_at`` is set when the episode closed."""

    id: int
    labels: dict[str, str]
    status: str
    starts_at: float
    ends_at: float | None
    start_step: int
    end_step: int
    score: float
    observed: float | None
    expected: float | None
    lower: float | None
    upper: float | None
    message: str
    event: bool = False  # a failure event's alert: ``id`` is minus the event's row id

    @property
    def run(self) -> str:
        return self.labels["run"]

    @property
    def severity(self) -> str:
        return self.labels["severity"]

    @property
    def incident(self) -> int | None:
        """The id of the episode's incident, once the engine has looked it up."""
        value = self.labels.get("incident")
        return int(value) if value else None

    @property
    def fingerprint(self) -> str:
        """Alertmanager's notion: a stable hash of the label set (16 hex digits)."""
        text = json.dumps(self.labels, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def summary(self) -> str:
        """One line with the numbers: what, where, observed vs expected and band, when."""
        where = self.labels["metric"]
        extra = [f"{k} {self.labels[k]}" for k in ("rank", "host", "gpu") if self.labels.get(k)]
        if self.event:
            text = f"{self.run}: {self.labels['detector']}"
            text += f" ({', '.join(extra)})" if extra else ""
            text += f": {self.message}" if self.message else ""
            return text + f" at step {self.start_step}"
        if extra:
            where += f" ({', '.join(extra)})"
        text = f"{self.run}: {self.labels['detector']} on {where}"
        if self.observed is not None:
            text += f": {_num(self.observed)}"
            if self.expected is not None:
                text += f" vs expected {_num(self.expected)}"
            if self.lower is not None and self.upper is not None:
                text += f" [{_num(self.lower)}, {_num(self.upper)}]"
        steps = (
            f"step {self.start_step}"
            if self.start_step == self.end_step
            else f"steps {self.start_step}-{self.end_step}"
        )
        text += f" at {steps}"
        if self.status == "resolved":
            text += " (resolved)"
        return text

    def link(self, dashboard_url: str | None) -> str | None:
        if not dashboard_url:
            return None
        base = dashboard_url.rstrip("/")
        if self.event:
            return f"{base}/runs?run={quote(self.run)}&step={self.start_step}"
        return f"{base}/runs?run={quote(self.run)}&anomaly={self.id}&step={self.start_step}"

    def numbers(self) -> dict[str, Any]:
        return {
            "start_step": self.start_step,
            "end_step": self.end_step,
            "score": _json_num(self.score),
            "observed": _json_num(self.observed),
            "expected": _json_num(self.expected),
            "lower": _json_num(self.lower),
            "upper": _json_num(self.upper),
        }


def alert_from_anomaly(
    row_id: int, anomaly: Anomaly, run: str, project: str | None, now: float
) -> Alert:
    """The alert for an anomaly episode of ``run`` (``now`` is when it was seen)."""
    labels = {
        "alertname": anomaly.detector,
        "run": run,
        "project": project or "",
        "detector": anomaly.detector,
        "metric": anomaly.metric,
        "severity": anomaly.severity,
    }
    for key in ("rank", "host", "gpu"):
        value = anomaly.labels.get(key)
        if value is not None:
            labels[key] = str(value)
    return Alert(
        id=row_id,
        labels=labels,
        status="firing" if anomaly.is_open else "resolved",
        starts_at=now,
        ends_at=None if anomaly.is_open else now,
        start_step=int(anomaly.start_step),
        end_step=int(anomaly.end_step),
        score=float(anomaly.score),
        observed=anomaly.observed,
        expected=anomaly.expected,
        lower=anomaly.lower,
        upper=anomaly.upper,
        message=anomaly.message,
    )


def alert_from_event(
    event: dict[str, Any], severity: str, incident: int, run: str, project: str | None, now: float
) -> Alert:
    """The alert for a failure event of ``run`` (a row of ``store.incident_members``): firing
    when first told; the engine resolves it once told, as it is over when it is logged."""
    labels = {
        "alertname": str(event["what"]),
        "run": run,
        "project": project or "",
        "detector": str(event["what"]),
        "metric": "",
        "severity": severity,
    }
    for key in ("rank", "host"):
        value = event.get(key)
        if value is not None and value == value:  # None or NaN from the frame: absent
            labels[key] = str(int(value)) if key == "rank" else str(value)
    labels["incident"] = str(incident)
    step = event.get("step")
    step = int(step) if step is not None and step == step else 0
    return Alert(
        id=-int(event["member_id"]),
        labels=labels,
        status="firing",
        starts_at=now,
        ends_at=None,
        start_step=step,
        end_step=step,
        score=0.0,
        observed=None,
        expected=None,
        lower=None,
        upper=None,
        message=str(event.get("message") or ""),
        event=True,
    )


def _num(x: float) -> str:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x).lower()
    return f"{x:.4g}"


def _json_num(x: float | None) -> float | str | None:
    """JSON has no NaN: non-finite values (a NaN loss is the news) are sent as strings."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else str(x).lower()
