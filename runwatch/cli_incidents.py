"""``runwatch incidents`` and ``runwatch verdict``: a run's incidents, and judging them.

``incidents --format json`` (one object per incident per line) is a public contract
(docs/architecture.md, "Contracts"): extend it, never break it. The table and the markdown
report are for people and may change. Every format lists the most important first: open
before judged, then the most severe, then the most recent.

A verdict is checked before anything is written: the run must exist and the incident must be
one of that run's, so a mistyped id cannot judge another run's incident.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runwatch.model import FAILURE_EVENTS, INCIDENT_STATUSES, json_plain
from runwatch.store import STORE_HELP, default_store, is_store_url, open_store, store_label
from runwatch.store.incidents import INCIDENT_SOURCES, importance_order
from runwatch.store.judgements import VERDICTS

if TYPE_CHECKING:
    import pandas as pd

    from runwatch.store import Store

EXIT_OK = 0

MAX_MEMBERS = 20
"""Members printed per incident (JSON and markdown); ``members_total`` says how many there are."""

MAX_TIMELINE = 50
"""Occurrences shown in a markdown timeline; the rest are counted."""

TIMELINE_COLUMNS = {
    "step": "step",
    "attempt": "attempt",
    "rank": "rank",
    "host": "host",
    "steps_lost": "steps lost",
}

STATUS_CHOICES = ("open", "all", *(s for s in INCIDENT_STATUSES if s != "open"))


class IncidentInputError(ValueError):
    """A verdict for an incident the run does not have: one line on stderr, exit 2."""


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``incidents`` and ``verdict`` to the ``runwatch`` subcommands."""
    inc = sub.add_parser(
        "incidents",
        help="list a run's incidents and their likely causes",
        description="List the incidents of a run (anomalies and failure events believed to "
        "share one cause, formed by live detection or `runwatch analyze`), most important "
        "first: open before judged, then by severity, then the most recent. json: one object "
        "per incident per line; markdown: a report to paste into a postmortem.",
    )
    _db_arg(inc)
    inc.add_argument("--run", required=True, metavar="NAME")
    inc.add_argument(
        "--status",
        choices=STATUS_CHOICES,
        default="open",
        help="which incidents: open (default), all, or those judged benign, real or watch",
    )
    inc.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    inc.add_argument(
        "--source",
        choices=INCIDENT_SOURCES,
        help="formed live or by replay (default: the live ones if the run has any)",
    )

    ver = sub.add_parser(
        "verdict",
        help="judge an incident: benign, real or watch",
        description="Store a verdict on one of a run's incidents; it becomes the incident's "
        "status. benign: later members fold in quietly (unless a more severe one comes); "
        "real: recurrences keep alerting, and the note should name the root cause; watch: "
        "keep an eye on it.",
    )
    _db_arg(ver)
    ver.add_argument("--run", required=True, metavar="NAME")
    ver.add_argument(
        "--incident", required=True, type=int, metavar="ID", help="see `runwatch incidents`"
    )
    ver.add_argument("verdict", choices=VERDICTS, metavar="VERDICT", help=", ".join(VERDICTS))
    ver.add_argument("--note", default="", metavar="TEXT", help="why; for real: the root cause")
    ver.add_argument(
        "--author", default=os.environ.get("USER"), metavar="NAME", help="who (default: $USER)"
    )
    return {"incidents": cmd_incidents, "verdict": cmd_verdict}


def _db_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        default=default_store(),
        metavar="DB",
        help=STORE_HELP,
    )


# -- incidents -----------------------------------------------------------------------------
def cmd_incidents(args: argparse.Namespace) -> int:
    with open_store(args.db, readonly=True) as store:
        store.run_id(args.run)  # a clear error naming the runs there are
        status = None if args.status == "all" else args.status
        frame = importance_order(store.incidents(args.run, source=args.source, status=status))
        records = [incident_record(store, row) for row in frame.to_dict(orient="records")]
        history = store.verdicts() if args.format == "markdown" else None
        if not records:
            _hint_if_not_analyzed(store, args)
    if args.format == "json":
        for rec in records:
            print(json.dumps({k: v for k, v in rec.items() if k != "details"}))
    elif args.format == "markdown":
        print(markdown_report(args.run, records, history, args.status))
    elif records:
        print(incident_table(records))
    else:
        print(f"run {args.run!r}: no {'' if status is None else status + ' '}incidents")
    return EXIT_OK


def incident_record(store: Store, row: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON object of one incident (``members`` bounded, ``members_total`` all of them);
    the markdown report reads its ``details`` too, which the JSON output leaves out."""
    members = store.incident_members(int(row["id"]))
    status = row["status"]
    verdict = None
    if status != "open":
        verdict = {
            "verdict": status,
            "note": json_plain(row["verdict_note"]),
            "author": json_plain(row["verdict_author"]),
        }
    return {
        "run": row["run"],
        "id": int(row["id"]),
        "title": row["title"],
        "status": status,
        "severity": row["severity"],
        "first_step": _int(row["first_step"]),
        "last_step": _int(row["last_step"]),
        "count": int(row["count"]),
        "signature": json_plain(row["signature"]),
        "members": [member_record(m) for m in members.head(MAX_MEMBERS).to_dict(orient="records")],
        "members_total": len(members),
        "hypotheses": list(row["hypotheses"]),
        "verdict": verdict,
        "source": row["source"],
        "is_active": bool(row["is_active"]),
        "details": row["details"],
    }


def member_record(m: Mapping[str, Any]) -> dict[str, Any]:
    """One member: an anomaly episode, or a failure event with its attempt, rank and host."""
    is_event = m["kind"] == "event"
    severity = json_plain(m["severity"])
    if is_event and severity is None:
        severity = FAILURE_EVENTS.get(m["what"])
    out = {
        "kind": m["kind"],
        "id": int(m["member_id"]),
        "what": m["what"],
        "metric": json_plain(m["metric"]),
        "labels": dict(m["labels"]),
        "step": _int(m["step"]),
        "end_step": _int(m["end_step"]),
        "severity": severity,
        "message": json_plain(m["message"]),
    }
    if is_event:
        out.update(attempt=_int(m["attempt"]), rank=_int(m["rank"]), host=json_plain(m["host"]))
    return out


def _hint_if_not_analyzed(store: Store, args: argparse.Namespace) -> None:
    """Nothing stored for a run that has points and no anomalies: most likely it was never
    analysed (an imported run), so say how to form its incidents."""
    if not store.incidents(args.run, source=args.source).empty:
        return
    runs = store.runs()
    points = runs.loc[runs["name"] == args.run, "points"]
    if points.empty or int(points.iloc[0]) == 0 or not store.anomalies(args.run).empty:
        return
    print(
        f"runwatch incidents: run {args.run!r} has points but no anomalies or incidents "
        f"stored; run `runwatch analyze --db {store_label(args.db)} --run {args.run}` first",
        file=sys.stderr,
    )


def incident_table(records: Iterable[Mapping[str, Any]]) -> str:
    """A fixed-width table: id, severity, status, count, steps, title."""
    rows = [
        (
            str(r["id"]),
            r["severity"],
            r["status"],
            f"{r['count']:,}",
            steps_text(r["first_step"], r["last_step"]),
            r["title"] + (" (active)" if r["is_active"] else ""),
        )
        for r in records
    ]
    head = ("id", "severity", "status", "count", "steps", "title")
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(5)]
    right = (True, False, False, True, True)

    def line(row: tuple[str, ...]) -> str:
        cells = [
            cell.rjust(w) if r else cell.ljust(w)
            for cell, w, r in zip(row[:5], widths, right, strict=True)
        ]
        return "  ".join([*cells, row[5]])

    return "\n".join(line(row) for row in [head, *rows])


def steps_text(first: int | None, last: int | None) -> str:
    """``350-2,950``, one step alone, or ``-`` when the members had no step.

    >>> steps_text(350, 2950), steps_text(7, 7), steps_text(None, None)
    ('350-2,950', '7', '-')
    """
    if first is None and last is None:
        return "-"
    if first is None or last is None or first == last:
        return f"{first if last is None else last:,}"
    return f"{first:,}-{last:,}"


# -- markdown ------------------------------------------------------------------------------
def markdown_report(
    run: str,
    records: list[dict[str, Any]],
    verdicts: pd.DataFrame | None,
    status: str = "all",
) -> str:
    """An incident report to paste into a postmortem: per incident a heading, a summary,
    the timeline of occurrences, the members, the evidence for its causes and its verdicts."""
    which = "" if status == "all" else f"{status} "
    lines = [f"# Incidents of run `{run}`", ""]
    if not records:
        lines.append(f"No {which}incidents.")
        return "\n".join(lines)
    lines.append(
        f"{len(records)} {which}incident{'s' * (len(records) != 1)}, most important first."
    )
    for rec in records:
        history = None
        if verdicts is not None and not verdicts.empty:
            history = verdicts[verdicts["incident_id"] == rec["id"]]
        lines += ["", *_incident_markdown(rec, history)]
    return "\n".join(lines)


def _incident_markdown(rec: Mapping[str, Any], history: pd.DataFrame | None) -> list[str]:
    details = rec.get("details") or {}
    out = [f"## Incident {rec['id']}: {_md(rec['title'])}", ""]
    occurrences = int(details.get("occurrences", rec["count"]))
    facts = [
        f"**{rec['severity']}**",
        rec["status"],
        f"{occurrences:,} occurrence{'s' * (occurrences != 1)}",
        f"{rec['members_total']:,} member{'s' * (rec['members_total'] != 1)}",
        f"steps {steps_text(rec['first_step'], rec['last_step'])}",
        "still active" if rec["is_active"] else "ended",
        f"source {rec['source']}",
    ]
    out.append(" · ".join(facts) + ".")
    if rec.get("signature"):
        out += ["", f"Signature: `{_code(rec['signature'])}`"]
    if details.get("summary"):
        out += ["", f"Evidence in short: {_md(str(details['summary']))}."]
    if details.get("reopened"):
        out += ["", f"Reopened: {_md(str(details['reopened']))}."]

    out += ["", "### Timeline", "", *timeline_markdown(details.get("at") or [])]

    shown = rec["members"]
    out += ["", f"### Members ({len(shown):,} of {rec['members_total']:,})", ""]
    out += ["| step | kind | what | series | severity | message |", "|---:|---|---|---|---|---|"]
    for m in shown:
        out.append(
            "| "
            + " | ".join(
                [
                    steps_text(m["step"], m["end_step"]),
                    m["kind"],
                    _md(m["what"]),
                    _md(_where(m)),
                    _cell(m["severity"]),
                    _md(m["message"] or ""),
                ]
            )
            + " |"
        )
    if rec["members_total"] > len(shown):
        out.append(f"\n… and {rec['members_total'] - len(shown):,} more members.")

    out += ["", "### Evidence", ""]
    if rec["hypotheses"]:
        for h in rec["hypotheses"]:
            out.append(
                f"- **{_md(str(h['cause']))}** (score {h['score']}): {_md(str(h['evidence']))}"
            )
    else:
        out.append("No clear cause: no host, rank or step context explains the occurrences.")

    out += ["", "### Verdicts", ""]
    if history is None or history.empty:
        out.append("None yet.")
    else:
        out += ["| time (UTC) | verdict | author | note |", "|---|---|---|---|"]
        for v in history.to_dict(orient="records"):
            when = datetime.fromtimestamp(float(v["time"]), UTC).strftime("%Y-%m-%d %H:%M:%S")
            author = json_plain(v["author"])
            out.append(f"| {when} | {v['verdict']} | {_cell(author)} | {_md(v['note'] or '')} |")
    return out


def timeline_markdown(at: list[Mapping[str, Any]]) -> list[str]:
    """The occurrences: a table of step, attempt, rank, host and steps lost, without the
    columns no occurrence has (a recurring loss spike has only steps: one line then).

    >>> timeline_markdown([{"step": 350}, {"step": 450}])
    ['At steps 350, 450.']
    """
    if not at:
        return ["No occurrences recorded."]
    shown, more = at[:MAX_TIMELINE], len(at) - MAX_TIMELINE
    tail = ["", f"… and {more:,} more occurrences."] if more > 0 else []
    columns = [k for k in TIMELINE_COLUMNS if any(o.get(k) is not None for o in shown)]
    if columns in ([], ["step"]):
        steps = ", ".join(_cell(o.get("step")) for o in shown)
        noun = "step" if len(at) == 1 else "steps"
        return [f"At {noun} {steps}" + (f" and {more:,} more." if more > 0 else ".")]
    out = [
        "| " + " | ".join(TIMELINE_COLUMNS[k] for k in columns) + " |",
        "|" + "|".join("---" if k == "host" else "---:" for k in columns) + "|",
    ]
    out += ["| " + " | ".join(_cell(o.get(k)) for k in columns) + " |" for o in shown]
    return out + tail


def _where(m: Mapping[str, Any]) -> str:
    """The member's series (metric and labels) or, for an event, where it happened."""
    if m["kind"] == "event":
        parts = [f"{k}={m[k]}" for k in ("attempt", "rank", "host") if m.get(k) is not None]
        return " ".join(parts) or "-"
    labels = "".join(f" {k}={v}" for k, v in m["labels"].items() if v is not None)
    return f"{m['metric'] or ''}{labels}" or "-"


def _md(text: str) -> str:
    """Text safe inside a markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: str) -> str:
    return " ".join(str(text).split()).replace("`", "'")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else _md(value)


# -- verdict -------------------------------------------------------------------------------
def cmd_verdict(args: argparse.Namespace) -> int:
    if is_store_url(args.db) or not Path(args.db).exists():
        open_store(args.db, readonly=True).close()  # raises "no such store" with its hint
    with open_store(args.db) as store:
        check_incident_of_run(store, args.run, args.incident)
        try:
            store.add_verdict(
                args.verdict, incident_id=args.incident, note=args.note, author=args.author
            )
        except KeyError as exc:  # re-formed away since the check: nothing was written
            raise IncidentInputError(exc.args[0]) from None
    by = f" by {args.author}" if args.author else ""
    print(f"incident {args.incident} of run {args.run!r} is now {args.verdict}{by}")
    return EXIT_OK


def check_incident_of_run(store: Store, run: str, incident_id: int) -> None:
    """Raise :class:`IncidentInputError` unless ``incident_id`` is one of ``run``'s
    incidents (live or replayed); the message names the run's incidents or the owner."""
    import pandas as pd

    store.run_id(run)  # RunNotFoundError names the runs there are
    every = pd.concat([store.incidents(source=s) for s in INCIDENT_SOURCES], ignore_index=True)
    owner = every.loc[every["id"] == incident_id, "run"]
    if not owner.empty and owner.iloc[0] == run:
        return
    if not owner.empty:
        raise IncidentInputError(
            f"incident {incident_id} belongs to run {owner.iloc[0]!r}, not {run!r}"
        )
    own = sorted(int(i) for i in every.loc[every["run"] == run, "id"])
    shown = ", ".join(map(str, own[:20])) + (" ..." if len(own) > 20 else "")
    hint = f"its incidents: {shown}" if own else "it has none; run `runwatch analyze` first"
    raise IncidentInputError(f"run {run!r} has no incident {incident_id} ({hint})")


def _int(value: Any) -> int | None:
    value = json_plain(value)
    return None if value is None else int(value)
