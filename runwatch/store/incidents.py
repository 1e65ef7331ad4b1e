"""Incidents: the store's record of what the incident grouping formed, and verdicts on them.

A run's incidents are kept per ``source`` (``live`` or ``replay``, as anomalies are) and are
replaced as a whole each time they are formed again (``save_incidents``). Rows are matched by
their key, or failing that by the members they share, so an incident keeps its id, status and
verdicts while it grows, merges or is re-formed by ``runwatch analyze``.

Status: ``open`` until a verdict; the latest verdict sets it. A ``benign`` incident folds new
members in quietly, unless one is more severe than anything it held when judged: then it is
``open`` again (a benign spike pattern must not hide a divergence).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from runwatch.model import INCIDENT_STATUSES, Incident, severity_rank

if TYPE_CHECKING:
    import pandas as pd

INCIDENT_SOURCES = ("live", "replay")

_COLUMNS = (
    "id, source, key, title, status, severity, first_step, last_step, count, signature, "
    "is_active, hypotheses, details, created, updated"
)


class IncidentTables:
    """Mixin for :class:`runwatch.store.sqlite.Store`: incidents and their members."""

    _conn: sqlite3.Connection

    def save_incidents(self, run_id: int, source: str, incidents: Sequence[Incident]) -> list[int]:
        """Make ``incidents`` the run's incidents from ``source``, in one transaction.

        Returns the ids of the incidents that are new or changed (title, severity, count,
        last step, activity or status): what an alert per incident is sent or updated for.
        Incidents no longer formed are deleted; their verdicts move to the incident that took
        most of their members.
        """
        if source not in INCIDENT_SOURCES:
            raise ValueError(f"unknown incident source {source!r}; valid: {INCIDENT_SOURCES}")
        now = time.time()
        changed: list[int] = []
        with self.transaction() as conn:  # type: ignore[attr-defined]
            old = {
                row[0]: row
                for row in conn.execute(
                    "SELECT id, key, title, severity, count, last_step, is_active, status, details "
                    "FROM incidents WHERE run_id = ? AND source = ?",
                    (run_id, source),
                )
            }
            by_key = {row[1]: iid for iid, row in old.items()}
            owner: dict[tuple[str, int], int] = {}
            old_members: dict[int, set[tuple[str, int]]] = {iid: set() for iid in old}
            for iid, aid, eid in conn.execute(
                "SELECT m.incident_id, m.anomaly_id, m.event_id FROM incident_members m "
                "JOIN incidents i ON i.id = m.incident_id WHERE i.run_id = ? AND i.source = ?",
                (run_id, source),
            ):
                member = ("anomaly", aid) if aid is not None else ("event", eid)
                owner[member] = iid
                old_members[iid].add(member)
            keys = {inc.key for inc in incidents}
            claimable = {iid for iid, row in old.items() if row[1] not in keys}
            kept: set[int] = set()
            for inc in incidents:
                iid = by_key.get(inc.key)
                if iid is None:
                    took = Counter(owner[m] for m in inc.members if owner.get(m) in claimable)
                    iid = took.most_common(1)[0][0] if took else None
                    if iid is not None:
                        claimable.discard(iid)
                members = set(inc.members)
                if iid is None:
                    iid = self._insert_incident(conn, run_id, source, inc, now)
                    changed.append(iid)
                else:
                    status, details = _status(old[iid], inc)
                    if _differs(old[iid], inc, status, members, old_members[iid]):
                        changed.append(iid)
                    self._update_incident(conn, iid, inc, status, details, now)
                if members != old_members.get(iid):
                    conn.execute("DELETE FROM incident_members WHERE incident_id = ?", (iid,))
                    conn.executemany(
                        "INSERT INTO incident_members (incident_id, anomaly_id, event_id) "
                        "VALUES (?, ?, ?)",
                        [
                            (
                                iid,
                                mid if kind == "anomaly" else None,
                                mid if kind == "event" else None,
                            )
                            for kind, mid in inc.members
                        ],
                    )
                kept.add(iid)
            for iid in set(old) - kept:
                target = _heir(old_members[iid], incidents, conn, run_id, source)
                if target is not None:
                    conn.execute(
                        "UPDATE verdicts SET incident_id = ? WHERE incident_id = ?", (target, iid)
                    )
                else:
                    conn.execute("DELETE FROM verdicts WHERE incident_id = ?", (iid,))
                conn.execute("DELETE FROM incident_members WHERE incident_id = ?", (iid,))
                conn.execute("DELETE FROM incidents WHERE id = ?", (iid,))
        return changed

    @staticmethod
    def _insert_incident(
        conn: sqlite3.Connection, run_id: int, source: str, inc: Incident, now: float
    ) -> int:
        cur = conn.execute(
            "INSERT INTO incidents (run_id, source, key, title, status, severity, first_step, "
            "last_step, count, signature, is_active, hypotheses, details, created, updated) "
            "VALUES (?, ?, ?, ?, 'open', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                source,
                inc.key,
                *_figures(inc),
                json.dumps(inc.details, default=str),
                now,
                now,
            ),
        )
        return int(cur.lastrowid)  # type: ignore[arg-type]

    @staticmethod
    def _update_incident(
        conn: sqlite3.Connection,
        iid: int,
        inc: Incident,
        status: str,
        details: dict[str, Any],
        now: float,
    ) -> None:
        conn.execute(
            "UPDATE incidents SET key = ?, title = ?, severity = ?, first_step = ?, "
            "last_step = ?, count = ?, signature = ?, is_active = ?, hypotheses = ?, "
            "status = ?, details = ?, updated = ? WHERE id = ?",
            (inc.key, *_figures(inc), status, json.dumps(details, default=str), now, iid),
        )

    def incidents(
        self,
        run: str | int | None = None,
        *,
        source: str | None = None,
        status: str | None = None,
    ) -> pd.DataFrame:
        """Incidents, one row each, with the run name and the latest verdict's note and
        author. ``source=None`` takes, per run, the live incidents if it has any, else the
        replayed ones (analyze finds the same again). ``status`` filters (open, benign,
        real, watch)."""

        if status is not None and status not in INCIDENT_STATUSES:
            raise ValueError(
                f"unknown incident status {status!r}; valid: {', '.join(INCIDENT_STATUSES)}"
            )
        cols = ", ".join(f"i.{c.strip()}" for c in _COLUMNS.split(","))
        sql = f"""
            SELECT {cols}, r.name AS run,
                   (SELECT v.note FROM verdicts v WHERE v.incident_id = i.id
                     ORDER BY v.time DESC, v.id DESC LIMIT 1) AS verdict_note,
                   (SELECT v.author FROM verdicts v WHERE v.incident_id = i.id
                     ORDER BY v.time DESC, v.id DESC LIMIT 1) AS verdict_author
            FROM incidents i JOIN runs r ON r.id = i.run_id WHERE 1 = 1"""
        params: list[Any] = []
        if run is not None:
            sql += " AND i.run_id = ?"
            params.append(self._resolve(run))  # type: ignore[attr-defined]
        if source is not None:
            sql += " AND i.source = ?"
            params.append(source)
        else:
            sql += (
                " AND (i.source = 'live' OR NOT EXISTS (SELECT 1 FROM incidents j "
                "WHERE j.run_id = i.run_id AND j.source = 'live'))"
            )
        with self._lock:  # type: ignore[attr-defined]
            frame = self._frame(sql + " ORDER BY i.first_step, i.id", params)  # type: ignore[attr-defined]
        if status is not None:
            frame = frame[frame["status"] == status].reset_index(drop=True)
        frame["hypotheses"] = frame["hypotheses"].map(json.loads)
        frame["details"] = frame["details"].map(json.loads)
        frame["is_active"] = frame["is_active"].astype(bool)
        frame["verdict"] = frame["status"].where(frame["status"] != "open", None)
        return frame

    def incident_members(self, incident_id: int) -> pd.DataFrame:
        """An incident's members in step order: anomalies and events in one frame
        (``kind`` says which; ``member_id`` is the anomaly's or event's row id)."""

        sql = """
            SELECT 'anomaly' AS kind, a.id AS member_id, a.detector AS what, a.metric,
                   a.labels, a.start_step AS step, a.end_step, a.severity, a.score,
                   a.observed, a.expected, a.message, a.is_open, NULL AS attempt,
                   NULL AS rank, NULL AS host, a.created AS time
            FROM incident_members m JOIN anomalies a ON a.id = m.anomaly_id
            WHERE m.incident_id = ?
            UNION ALL
            SELECT 'event', e.id, e.kind, NULL, '{}', e.step, e.step, NULL, NULL, NULL, NULL,
                   e.message, 0, e.attempt, e.rank, e.host, e.time
            FROM incident_members m JOIN events e ON e.id = m.event_id
            WHERE m.incident_id = ?"""
        with self._lock:  # type: ignore[attr-defined]
            frame = self._frame(sql, (incident_id, incident_id))  # type: ignore[attr-defined]
        frame["labels"] = frame["labels"].map(json.loads)
        frame["is_open"] = frame["is_open"].astype(bool)
        return frame.sort_values(["step", "time"], kind="stable").reset_index(drop=True)

    def incident_of(self, anomaly_id: int) -> tuple[int, str] | None:
        """(incident id, status) of the incident holding an anomaly, or None."""
        with self._lock:  # type: ignore[attr-defined]
            row = self._conn.execute(
                "SELECT i.id, i.status FROM incident_members m JOIN incidents i "
                "ON i.id = m.incident_id WHERE m.anomaly_id = ?",
                (anomaly_id,),
            ).fetchone()
        return None if row is None else (int(row[0]), str(row[1]))

    def set_incident_status(self, conn: sqlite3.Connection, incident_id: int, verdict: str) -> None:
        """Within ``add_verdict``'s transaction: the verdict becomes the status, and the
        severity it was given at is remembered (a later, worse member reopens it)."""
        row = conn.execute(
            "SELECT severity, details FROM incidents WHERE id = ?", (incident_id,)
        ).fetchone()
        details = json.loads(row[1])
        details["verdict_severity"] = row[0]
        conn.execute(
            "UPDATE incidents SET status = ?, details = ?, updated = ? WHERE id = ?",
            (verdict, json.dumps(details), time.time(), incident_id),
        )


def importance_order(incidents: pd.DataFrame, first: int | None = None) -> pd.DataFrame:
    """Incidents (``Store.incidents`` rows) most important first, as the command line and
    the inbox list them: open before judged; within each, the most severe, then the latest
    ``last_step``, then the newest id. ``first`` (an incident id, e.g. one opened from the
    Run page) goes to the top of its group.

    >>> import pandas as pd
    >>> f = pd.DataFrame({"id": [1, 2, 3, 4], "status": ["benign", "open", "open", "open"],
    ...     "severity": ["critical", "info", "warning", "warning"],
    ...     "last_step": [900, 950, 100, 400]})
    >>> importance_order(f)["id"].tolist()
    [4, 3, 2, 1]
    """
    import pandas as pd

    if incidents.empty:
        return incidents
    last = pd.to_numeric(incidents["last_step"], errors="coerce").fillna(-1)
    keys = pd.DataFrame(
        {
            "judged": (incidents["status"] != "open").astype(int).to_numpy(),
            "picked": (incidents["id"] != first).astype(int).to_numpy(),
            "severity": -incidents["severity"].map(_rank).to_numpy(),
            "last": -last.to_numpy(),
            "id": -incidents["id"].to_numpy(),
        },
        index=incidents.index,
    )
    order = keys.sort_values(list(keys.columns), kind="stable").index
    return incidents.loc[order].reset_index(drop=True)


def _rank(severity: Any) -> int:
    """A severity's rank; -1 for one this runwatch does not know (it sorts last)."""
    try:
        return severity_rank(str(severity))
    except ValueError:
        return -1


def _figures(inc: Incident) -> tuple[Any, ...]:
    return (
        inc.title,
        inc.severity,
        inc.first_step,
        inc.last_step,
        inc.count,
        inc.signature,
        int(inc.is_active),
        json.dumps(inc.hypotheses, default=str),
    )


def _status(old: tuple[Any, ...], inc: Incident) -> tuple[str, dict[str, Any]]:
    """The stored status, carried over; a benign incident that got worse is open again."""
    status, details = old[7], json.loads(old[8])
    judged_at = details.get("verdict_severity")
    merged = {**inc.details}
    if judged_at is not None:
        merged["verdict_severity"] = judged_at
    if status == "benign" and judged_at and severity_rank(inc.severity) > severity_rank(judged_at):
        merged["reopened"] = f"a {inc.severity} member after the benign verdict at {judged_at}"
        return "open", merged
    return status, merged


def _differs(
    old: tuple[Any, ...],
    inc: Incident,
    status: str,
    members: set[tuple[str, int]],
    old_members: set[tuple[str, int]],
) -> bool:
    _, _, title, severity, count, last_step, is_active, old_status, _ = old
    return (title, severity, count, last_step, bool(is_active), old_status) != (
        inc.title,
        inc.severity,
        inc.count,
        inc.last_step,
        inc.is_active,
        status,
    ) or members != old_members


def _heir(
    members: set[tuple[str, int]],
    incidents: Sequence[Incident],
    conn: sqlite3.Connection,
    run_id: int,
    source: str,
) -> int | None:
    """The id of the new incident holding most of a vanished incident's members."""
    best = max(incidents, key=lambda inc: len(members & set(inc.members)), default=None)
    if best is None or not members & set(best.members):
        return None
    row = conn.execute(
        "SELECT id FROM incidents WHERE run_id = ? AND source = ? AND key = ?",
        (run_id, source, best.key),
    ).fetchone()
    return None if row is None else int(row[0])
