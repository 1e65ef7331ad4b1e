"""Pure rules behind the incident inbox and the Run page's incident marks (no Streamlit).

What a person reads off the inbox (which incident comes first, what its hypotheses say,
which of its members are listed, which of a run's anomalies are drawn and as what) is decided
here, on plain frames, so each rule is unit-tested without a browser.

Frames are the store's: ``Store.incidents`` (id, run, title, status, severity, first_step,
last_step, count, hypotheses, details, verdict, ...), ``Store.incident_members`` (kind,
member_id, what, metric, step, end_step, severity, message, ...) and ``Store.anomalies``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from runwatch.dashboard.shaping import SEVERITY_BADGE, markdown_text
from runwatch.model import FAILURE_EVENTS, INCIDENT_STATUSES, severity_rank
from runwatch.store.incidents import importance_order

STATUS_BADGE = {"open": "gray", "benign": "green", "real": "red", "watch": "blue"}
"""Streamlit badge colours per incident status."""
JUDGED: tuple[str, ...] = tuple(s for s in INCIDENT_STATUSES if s != "open")
"""The verdicts a person can give, as the inbox's buttons and its "judged" filter."""
CHART_PAD = 60
"""Steps of context, at least, on each side of an incident's span in its small chart."""
MEMBER_COLUMNS = ("step", "severity", "what", "metric", "message")
NO_HYPOTHESES = (
    "No hypotheses: no attribute (host, rank, GPU, step context) whose exposure is known "
    "to compare the occurrences against."
)


def filter_incidents(
    incidents: pd.DataFrame,
    runs: Sequence[str] = (),
    severities: Sequence[str] = (),
    judged: Sequence[str] = JUDGED,
) -> pd.DataFrame:
    """The incidents the inbox shows: of the chosen runs and severities (none chosen: all),
    every open one, and the judged ones whose status is in ``judged``.

    >>> f = pd.DataFrame({"run": ["a", "a", "b"], "severity": ["info", "warning", "info"],
    ...     "status": ["open", "benign", "real"]})
    >>> filter_incidents(f, judged=("real",))["status"].tolist()
    ['open', 'real']
    """
    if incidents.empty:
        return incidents
    keep = (incidents["status"] == "open") | incidents["status"].isin(list(judged))
    if runs:
        keep &= incidents["run"].isin(list(runs))
    if severities:
        keep &= incidents["severity"].isin(list(severities))
    return incidents[keep]


def badge(kind: str, value: str) -> str:
    """A coloured Streamlit badge for a severity (``kind="severity"``) or a status."""
    colors = SEVERITY_BADGE if kind == "severity" else STATUS_BADGE
    return f":{colors.get(value, 'gray')}-badge[{value}]"


def steps_text(first: Any, last: Any) -> str:
    """'step 1,200' or 'steps 300–1,100' (or '' when the incident has no step).

    >>> steps_text(300, 1100), steps_text(5, 5), steps_text(None, None)
    ('steps 300–1,100', 'step 5', '')
    """
    if first is None or pd.isna(first):
        return ""
    first, last = int(first), int(last if last is not None and pd.notna(last) else first)
    return f"step {first:,}" if first == last else f"steps {first:,}–{last:,}"


def headline(incident: pd.Series | dict[str, Any]) -> str:
    """The card's first line as Markdown: severity and status badges, then the title."""
    return (
        f"{badge('severity', incident['severity'])} {badge('status', incident['status'])} "
        f"**{markdown_text(incident['title'])}**"
    )


def facts(incident: pd.Series | dict[str, Any]) -> str:
    """'run r · 4 members · steps 300–1,100 · #12 · still active': the card's second line."""
    count = int(incident["count"])
    parts = [
        f"run {incident['run']}",
        f"{count:,} member{'s' if count != 1 else ''}",
        steps_text(incident["first_step"], incident["last_step"]),
        f"#{int(incident['id'])}",
    ]
    if bool(incident.get("is_active", False)):
        parts.append("still active")
    return " · ".join(p for p in parts if p)


def hypothesis_lines(incident: pd.Series | dict[str, Any], limit: int = 3) -> list[str]:
    """The incident's candidate causes as Markdown lines, best first: cause, score and
    evidence; then the one-line summary ("likely ..." or "no clear cause ..."). An incident
    without any says why (``NO_HYPOTHESES``).

    >>> hypothesis_lines({"hypotheses": [], "details": {}}) == [NO_HYPOTHESES]
    True
    """
    details = incident.get("details") or {}
    lines = [
        f"**{markdown_text(h['cause'])}** (score {float(h['score']):.1f}): "
        f"{markdown_text(h['evidence'])}"
        for h in (incident.get("hypotheses") or [])[:limit]
    ]
    summary = details.get("summary")
    if summary:
        lines.append(f"*{markdown_text(summary)}*")
    if not lines:
        lines.append(NO_HYPOTHESES)
    return lines


def main_metric(
    members: pd.DataFrame, fallback: str | None = None, available: Sequence[str] | None = None
) -> str | None:
    """The metric an incident's small chart draws: the one most of its anomaly members are
    on (on a tie ``fallback`` if it is among them, else the first), else ``fallback`` (the
    run's loss, for crash incidents). Only ``available`` metrics count when given: a hang
    is flagged on a "progress" the run never logged as a series.

    >>> m = pd.DataFrame({"kind": ["anomaly", "anomaly", "anomaly", "event"],
    ...     "metric": ["step_time_s", "grad_norm", "loss", None]})
    >>> main_metric(m, "loss"), main_metric(m, "lr"), main_metric(m.iloc[3:], "loss")
    ('loss', 'step_time_s', 'loss')
    >>> main_metric(m, "loss", available=["grad_norm", "loss"])
    'loss'
    >>> main_metric(m.iloc[[0, 1]], "loss", available=["loss"])
    'loss'
    """
    metrics = members.loc[members["kind"] == "anomaly", "metric"].dropna() if len(members) else []
    if available is not None and len(metrics):
        metrics = metrics[metrics.isin(list(available))]
    if len(metrics) == 0:
        return fallback
    counts = pd.Series(metrics).value_counts(sort=False)
    tied = counts[counts == counts.max()].index.tolist()
    return fallback if fallback in tied else str(tied[0])


def chart_window(first: Any, last: Any, pad_min: int = CHART_PAD) -> tuple[int, int] | None:
    """The steps the small chart shows: the incident's span plus 15% of it (at least
    ``pad_min`` steps) on each side; None when the incident has no step.

    >>> chart_window(300, 1100), chart_window(10, 10)
    ((180, 1220), (0, 70))
    """
    if first is None or pd.isna(first):
        return None
    first = int(first)
    last = int(last) if last is not None and pd.notna(last) else first
    pad = max(pad_min, round(0.15 * (last - first)))
    return max(0, first - pad), last + pad


def member_marks(members: pd.DataFrame, metric: str | None) -> pd.DataFrame:
    """The members the small chart marks: step, severity, a hover label and the value the
    detector observed (where on the curve the mark sits).

    Anomalies on the drawn metric sit on its curve; events (crashes, OOMs) and anomalies on
    other metrics are marked at their step too, pinned to the top of the panel (``on_curve``
    False), so every member is visible on the one chart.
    """
    if members.empty:
        return pd.DataFrame(columns=["step", "severity", "label", "on_curve", "observed"])
    severity = member_severity(members)
    on_curve = (members["kind"] == "anomaly") & (members["metric"] == metric)
    label = [
        f"{what} on {m}: {msg}" if isinstance(m, str) else f"{what}: {msg}"
        for what, m, msg in zip(members["what"], members["metric"], members["message"], strict=True)
    ]
    return pd.DataFrame(
        {
            "step": pd.to_numeric(members["step"], errors="coerce").to_numpy(),
            "severity": severity.to_numpy(),
            "label": label,
            "on_curve": on_curve.to_numpy(),
            "observed": pd.to_numeric(
                members.get("observed", pd.Series(np.nan, index=members.index)), errors="coerce"
            ).to_numpy(),
        }
    ).dropna(subset=["step"])


def member_severity(members: pd.DataFrame) -> pd.Series:
    """Each member's severity: an anomaly's own, a failure event's by its kind
    (``model.FAILURE_EVENTS``; the events table stores none).

    >>> m = pd.DataFrame({"severity": ["info", None], "what": ["spike", "crash"]})
    >>> member_severity(m).tolist()
    ['info', 'critical']
    """
    by_kind = members["what"].map(lambda k: FAILURE_EVENTS.get(k, "warning"))
    return members["severity"].where(members["severity"].notna(), by_kind)


def member_rows(members: pd.DataFrame, limit: int = 20) -> pd.DataFrame:
    """The first ``limit`` members in step order, for ``markdown_table(...,
    raw=("severity",))``: step(s), a severity badge, what (detector or event kind), the
    metric or where (rank, host), and the message."""
    shown = members.head(limit)
    steps = [
        "" if pd.isna(a) else (f"{int(a):,}" if pd.isna(b) or a == b else f"{int(a):,}–{int(b):,}")
        for a, b in zip(shown["step"], shown["end_step"], strict=True)
    ]
    where = []
    for row in shown.itertuples(index=False):
        if isinstance(row.metric, str):
            where.append(row.metric)
        else:
            bits = [f"rank {int(row.rank)}" if pd.notna(row.rank) else ""]
            bits.append(str(row.host) if isinstance(row.host, str) else "")
            where.append(" ".join(b for b in bits if b))
    return pd.DataFrame(
        {
            "step": steps,
            "severity": [badge("severity", s) for s in member_severity(shown)],
            "what": shown["what"].to_numpy(),
            "metric": where,
            "message": shown["message"].fillna("").to_numpy(),
        },
        columns=list(MEMBER_COLUMNS),
    )


def open_count(incidents: pd.DataFrame) -> int:
    """Incidents waiting for a verdict (status open): the Run page's "Open incidents"."""
    return 0 if incidents.empty else int((incidents["status"] == "open").sum())


MARK_COLUMNS = [
    "id",
    "metric",
    "start_step",
    "end_step",
    "severity",
    "observed",
    "message",
    "state",
    "incident",
]
"""What the run chart needs of a mark (``charts.anomaly_marks``), plus its incident."""


def incident_anomalies(
    anomalies: pd.DataFrame,
    incidents: pd.DataFrame,
    membership: pd.DataFrame,
    show_info: bool = False,
    event_metric: str | None = None,
) -> tuple[pd.DataFrame, int]:
    """The run chart's marks, one per member of each incident drawn, and how many
    incidents were left undrawn.

    An incident is drawn when it is warning or worse, or always with ``show_info``; its
    members take its severity, its status (as a triage state: a judged incident's marks
    fade) and its title, so a 37-spike pattern reads as one incident. Anomalies the
    incidents do not hold yet (live forming runs every few seconds) are drawn as themselves,
    by the same severity rule. Event members (crashes, OOMs, hangs) are marked on
    ``event_metric``'s panel (the top one) with a negative id (minus the event's id), so a
    crash-only incident is on the chart too. ``membership`` is ``data.incident_membership``:
    incident_id, kind, member_id, step, what, message.
    """
    drawn_ids = set()
    hidden = 0
    for row in incidents.itertuples(index=False):
        if show_info or severity_rank(row.severity) >= severity_rank("warning"):
            drawn_ids.add(int(row.id))
        else:
            hidden += 1
    is_anomaly = membership["kind"] == "anomaly"
    owner = dict(
        zip(
            membership.loc[is_anomaly, "member_id"],
            membership.loc[is_anomaly, "incident_id"],
            strict=True,
        )
    )
    by_id = incidents.set_index("id") if len(incidents) else incidents

    def as_incident(iid: int, message: str) -> dict[str, Any]:
        inc = by_id.loc[iid]
        return {
            "severity": inc["severity"],
            "state": "needs verdict" if inc["status"] == "open" else inc["status"],
            "message": f"incident #{iid}: {inc['title']} ({message})",
            "incident": iid,
        }

    rows = []
    for rec in anomalies.to_dict("records"):
        iid = owner.get(rec["id"])
        if iid is None or iid not in by_id.index:
            if show_info or rec["severity"] != "info":
                rows.append({**rec, "incident": None})
        elif iid in drawn_ids:
            rows.append({**rec, **as_incident(iid, rec["message"])})
    if event_metric is not None:
        events = membership[(membership["kind"] == "event") & membership["step"].notna()]
        for ev in events.itertuples(index=False):
            iid = int(ev.incident_id)
            if iid in drawn_ids and iid in by_id.index:
                step = int(ev.step)
                rows.append(
                    {
                        "id": -int(ev.member_id),
                        "metric": event_metric,
                        "start_step": step,
                        "end_step": step,
                        "observed": float("nan"),
                        **as_incident(iid, f"{ev.what}: {ev.message}"),
                    }
                )
    columns = list(dict.fromkeys([*anomalies.columns, *MARK_COLUMNS]))
    return pd.DataFrame(rows, columns=columns), hidden


def incident_rows(incidents: pd.DataFrame, limit: int) -> pd.DataFrame:
    """The Run page's incident list, for ``markdown_table(..., raw=("severity",
    "status"))``: open first, worst and latest first (``importance_order``), at most ``limit``."""
    shown = importance_order(incidents).head(limit)
    return pd.DataFrame(
        {
            "#": shown["id"].to_numpy(),
            "severity": [badge("severity", s) for s in shown["severity"]],
            "status": [badge("status", s) for s in shown["status"]],
            "incident": shown["title"].to_numpy(),
            "count": shown["count"].to_numpy(),
            "steps": [
                steps_text(a, b).removeprefix("steps ").removeprefix("step ")
                for a, b in zip(shown["first_step"], shown["last_step"], strict=True)
            ],
        }
    )
