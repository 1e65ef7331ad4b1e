"""Message bodies, one per channel type. The generic webhook schema is a public contract.

Generic webhook, schema ``runwatch.alert/v1`` (also sent as header ``X-Runwatch-Schema``);
fields are only ever added within v1, never renamed or removed::

    {
      "schema": "runwatch.alert/v1",
      "idempotency_key": "rw-…",            # also the Idempotency-Key header; equal on retries
      "status": "firing" | "resolved",       # firing if any alert in the message fires
      "group_key": "…", "group_labels": {"run": …, "detector": …, "metric": …},
      "summary": "[CRITICAL] gpt-small: nonfinite on loss: 512 alerts, ranks 0-511, from step 1234",
      "counts": {"firing": 512, "resolved": 0, "total": 512, "shown": 50},
      "truncated_alerts": 462,               # alerts left out of "alerts" (max_alerts)
      "links": {"dashboard": "http://…/runs?run=gpt-small" | null},
      "sequence": 1,                         # 1: the group's first message; 2, 3 …: updates
      "incident": {                          # the incident, when the message is about one
        "id": 4, "run": …, "title": "50 non-finite loss values, steps 100–198 …",
        "status": "open" | "real" | "watch" | "benign", "severity": "critical",
        "count": 50,                         # members in all (anomalies and failure events)
        "first_step": 100, "last_step": 198, "is_active": true,
        "summary": "9 of 9 crashes in steps reading shard s17 …" | null,  # top hypothesis
        "top_hypothesis": {"cause": "shard=s17", "score": 31.2, "evidence": "…"} | null,
        "verdict_note": … | null, "reopened": … | null
      } | null,
      "incidents": [{…as "incident"…}],      # every incident the alerts belong to
      "alerts": [{
        "id": 17,                            # the anomaly's row id in the store (null: event)
        "event_id": null | 9,                # a failure event's row id (detector: its kind)
        "incident_id": 4 | null,
        "status": "firing" | "resolved", "fingerprint": "…16 hex…",
        "run": …, "project": …, "detector": …, "metric": …, "severity": "critical",
        "labels": {"alertname": …, "run": …, "rank": "3", …},
        "step": 1234, "start_step": 1234, "end_step": 1234,
        "observed": "nan" | 2.9, "expected": 2.31 | null, "lower": 2.1 | null,
        "upper": 2.5 | null, "score": 1000.0,  # non-finite numbers are strings ("nan", "inf")
        "message": "non-finite value (nan) at step 1234",
        "summary": "gpt-small: nonfinite on loss (rank 3): nan at step 1234",
        "starts_at": "2026-…Z", "ends_at": null | "2026-…Z",
        "links": {"dashboard": … | null}
      }]
    }

With the default ``group_by: [run, incident]`` a message is about one incident: ``summary``
leads with its title, ``group_key`` is stable for it (a receiver can update one ticket per
group key) and ``sequence`` says whether it is new.

Slack gets Block Kit (a header, the summary, the incident with its likely cause, up to ten
alerts as short lines, a dashboard button), short enough to read on a phone.
``alertmanager_webhook`` is Alertmanager's own webhook payload, version 4, so receivers
written for Alertmanager work unchanged; ``alertmanager`` is the list of postable alerts for
Alertmanager's ``/api/v2/alerts``; Alertmanager resolves an alert it has not heard of for
``resolve_timeout`` (default 5m), so give routes to such a channel a ``repeat_interval``
below that. Alertmanager bodies carry the incident as the ``incident`` label and as
annotations (``incident_title``, ``incident_count``, ``incident_status``,
``incident_summary``).
"""

from __future__ import annotations

import time
from typing import Any

from runwatch.alerting.alert import Alert
from runwatch.alerting.grouping import Notification
from runwatch.alerting.rules import Channel
from runwatch.model import severity_rank

SCHEMA = "runwatch.alert/v1"
_ZERO_TIME = "0001-01-01T00:00:00Z"
_ICON = {
    "critical": ":red_circle:",
    "warning": ":large_orange_circle:",
    "info": ":large_blue_circle:",
}


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    ms = round((t % 1) * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{ms:03d}Z"


def ranges(values: list[str]) -> str:
    """Compress ranks into ranges: ``["0", "1", "2", "7"]`` -> ``"0-2, 7"``.

    >>> ranges(["3", "0", "1", "2", "7", "x"])
    '0-3, 7, x'
    """
    nums = sorted({int(v) for v in values if v.lstrip("-").isdigit()})
    words = sorted({v for v in values if not v.lstrip("-").isdigit()})
    parts: list[str] = []
    for n in nums:
        if parts and parts[-1][1] == n - 1:
            parts[-1] = (parts[-1][0], n)
        else:
            parts.append((n, n))  # type: ignore[arg-type]
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in parts]  # type: ignore[misc]
    return ", ".join(text + words)


def the_incident(note: Notification) -> dict[str, Any] | None:
    """The incident a message is about, when it is about exactly one."""
    return note.incidents[0] if len(note.incidents) == 1 else None


def group_summary(note: Notification) -> str:
    """One line for a whole message, with the numbers that matter (the incident first)."""
    text = _alerts_summary(note)
    incident = the_incident(note)
    if incident is None:
        return text
    head, _, rest = text.partition("] ")
    run = f"{incident['run']}: " if incident.get("run") else ""
    rest = rest[len(run) :] if run and rest.startswith(run) else rest
    return f"{head}] {run}incident {incident['id']} ({incident['title']}): {rest}"


def _alerts_summary(note: Notification) -> str:
    alerts = note.alerts
    worst = max(alerts, key=lambda a: severity_rank(a.severity))
    if len(alerts) == 1:
        return f"[{worst.severity.upper()}] {alerts[0].summary()}"
    runs = sorted({a.run for a in alerts})
    detectors = sorted({a.labels["detector"] for a in alerts})
    metrics = sorted({a.labels["metric"] for a in alerts})
    firing = sum(a.status == "firing" for a in alerts)
    text = (
        f"[{worst.severity.upper()}] {', '.join(runs[:3])}{' …' if len(runs) > 3 else ''}: "
        f"{', '.join(detectors[:3])} on {', '.join(metrics[:3])}"
        f"{' …' if len(metrics) > 3 else ''}: {len(alerts)} alerts ({firing} firing)"
    )
    ranks = [a.labels["rank"] for a in alerts if "rank" in a.labels]
    if ranks:
        text += f", ranks {ranges(ranks)}"
    text += f", from step {min(a.start_step for a in alerts)}"
    return text


def render(
    channel: Channel, note: Notification, key: str, dashboard_url: str | None
) -> dict[str, Any] | list[dict[str, Any]]:
    """The JSON body for ``channel`` (its ``type`` decides the shape)."""
    if channel.type == "slack":
        return slack(note, channel.max_alerts, dashboard_url)
    if channel.type == "alertmanager_webhook":
        return alertmanager_webhook(note, channel.name, key, channel.max_alerts, dashboard_url)
    if channel.type == "alertmanager":
        return alertmanager_alerts(note, dashboard_url)
    return webhook(note, key, channel.max_alerts, dashboard_url)


def _run_link(note: Notification, dashboard_url: str | None) -> str | None:
    if not dashboard_url:
        return None
    runs = sorted({a.run for a in note.alerts})
    return (
        note.alerts[0].link(dashboard_url)
        if len(note.alerts) == 1
        else (f"{dashboard_url.rstrip('/')}/runs?run={runs[0]}")
    )


def webhook(
    note: Notification, key: str, max_alerts: int, dashboard_url: str | None
) -> dict[str, Any]:
    shown = note.alerts[:max_alerts]
    firing = sum(a.status == "firing" for a in note.alerts)
    return {
        "schema": SCHEMA,
        "idempotency_key": key,
        "status": note.status,
        "group_key": note.group_key,
        "group_labels": note.group_labels,
        "summary": group_summary(note),
        "counts": {
            "firing": firing,
            "resolved": len(note.alerts) - firing,
            "total": len(note.alerts),
            "shown": len(shown),
        },
        "truncated_alerts": len(note.alerts) - len(shown),
        "links": {"dashboard": _run_link(note, dashboard_url)},
        "sequence": note.sequence,
        "incident": the_incident(note),
        "incidents": list(note.incidents),
        "alerts": [_webhook_alert(a, dashboard_url) for a in shown],
    }


def _webhook_alert(a: Alert, dashboard_url: str | None) -> dict[str, Any]:
    return {
        "id": None if a.event else a.id,
        "event_id": -a.id if a.event else None,
        "incident_id": a.incident,
        "status": a.status,
        "fingerprint": a.fingerprint,
        "run": a.run,
        "project": a.labels.get("project") or None,
        "detector": a.labels["detector"],
        "metric": a.labels["metric"],
        "severity": a.severity,
        "labels": dict(a.labels),
        "step": a.end_step,
        **a.numbers(),
        "message": a.message,
        "summary": a.summary(),
        "starts_at": iso(a.starts_at),
        "ends_at": iso(a.ends_at),
        "links": {"dashboard": a.link(dashboard_url)},
    }


def slack(note: Notification, max_alerts: int, dashboard_url: str | None) -> dict[str, Any]:
    summary = group_summary(note)
    worst = max(note.alerts, key=lambda a: severity_rank(a.severity)).severity
    state = "RESOLVED" if note.status == "resolved" else worst.upper()
    icon = ":white_check_mark:" if note.status == "resolved" else _ICON[worst]
    lines = [f"• {a.summary()}" for a in note.alerts[: min(max_alerts, 10)]]
    more = len(note.alerts) - len(lines)
    if more > 0:
        lines.append(f"… and {more} more")
    header = f"{state}: " + ", ".join(sorted({a.run for a in note.alerts}))[:140]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": header[:150], "emoji": True}},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"{icon} {summary}"[:3000]}},
    ]
    incident = the_incident(note)
    if incident is not None:
        blocks.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": _slack_incident(incident)}}
        )
    blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:3000]}})
    link = _run_link(note, dashboard_url)
    if link:
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": "Open dashboard"},
                        "url": link,
                    }
                ],
            }
        )
    return {"text": summary, "blocks": blocks}


def _slack_incident(incident: dict[str, Any]) -> str:
    """The incident in two short lines: what, how many, its status; the likely cause."""
    text = (
        f"*Incident {incident['id']}*: {incident['title']} "
        f"({incident['count']} in all, {incident['status']})"
    )
    if incident.get("summary"):
        text += f"\n_Likely cause:_ {incident['summary']}"
    return text[:3000]


def _am_alert(
    a: Alert, dashboard_url: str | None, incidents: tuple[dict[str, Any], ...] = ()
) -> dict[str, Any]:
    annotations = {"summary": a.summary(), "description": a.message}
    for k, v in a.numbers().items():
        if v is not None:
            annotations[k] = str(v)
    incident = next((i for i in incidents if i["id"] == a.incident), None)
    if incident is not None:
        annotations["incident_title"] = str(incident["title"])
        annotations["incident_count"] = str(incident["count"])
        annotations["incident_status"] = str(incident["status"])
        if incident.get("summary"):
            annotations["incident_summary"] = str(incident["summary"])
    return {
        "status": a.status,
        "labels": {k: v for k, v in a.labels.items() if v != ""},
        "annotations": annotations,
        "startsAt": iso(a.starts_at),
        "endsAt": iso(a.ends_at) or _ZERO_TIME,
        "generatorURL": a.link(dashboard_url) or "",
        "fingerprint": a.fingerprint,
    }


def _common(dicts: list[dict[str, str]]) -> dict[str, str]:
    if not dicts:
        return {}
    first = dicts[0]
    return {k: v for k, v in first.items() if all(d.get(k) == v for d in dicts[1:])}


def alertmanager_webhook(
    note: Notification, receiver: str, key: str, max_alerts: int, dashboard_url: str | None
) -> dict[str, Any]:
    alerts = [_am_alert(a, dashboard_url, note.incidents) for a in note.alerts]
    shown = alerts[:max_alerts]
    return {
        "version": "4",
        "groupKey": note.group_key,
        "truncatedAlerts": len(alerts) - len(shown),
        "status": note.status,
        "receiver": receiver,
        "groupLabels": {k: v for k, v in note.group_labels.items() if v != ""},
        "commonLabels": _common([a["labels"] for a in alerts]),
        "commonAnnotations": _common([a["annotations"] for a in alerts]),
        "externalURL": dashboard_url or "",
        "alerts": shown,
    }


def alertmanager_alerts(note: Notification, dashboard_url: str | None) -> list[dict[str, Any]]:
    """Postable alerts for ``POST /api/v2/alerts``: Alertmanager groups and routes them."""
    out = []
    for a in note.alerts:
        body = _am_alert(a, dashboard_url, note.incidents)
        del body["status"], body["fingerprint"]
        if a.ends_at is None:
            del body["endsAt"]
        out.append(body)
    return out
