"""Anomalies and the verdicts people give them: the store's judgement tables.

Anomalies are stored by ``source``: ``live`` for what the in-process or server Monitor found
while the run was written, ``replay`` for what ``runwatch analyze`` found. A replay replaces
the run's earlier replay results (so re-running analyze never piles up duplicates) and leaves
live anomalies and every verdict alone.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from runwatch.model import Anomaly, severity_rank

if TYPE_CHECKING:
    import pandas as pd  # imported where frames are built: the hook's writes need none

VERDICTS = ("benign", "real", "watch")
ANOMALY_SOURCES = ("live", "replay")


def _anomaly_row(anomaly: Anomaly) -> tuple[Any, ...]:
    return (
        anomaly.detector,
        anomaly.metric,
        json.dumps(anomaly.labels, sort_keys=True, default=str),
        anomaly.start_step,
        anomaly.end_step,
        anomaly.severity,
        anomaly.score,
        anomaly.observed,
        anomaly.expected,
        anomaly.lower,
        anomaly.upper,
        anomaly.message,
        int(anomaly.is_open),
        json.dumps(anomaly.details, default=str),
    )


class JudgementTables:
    """Mixin for :class:`runwatch.store.sqlite.Store`: anomalies, verdicts, expected curves."""

    _conn: sqlite3.Connection

    def save_anomalies(
        self,
        run_id: int,
        source: str,
        anomalies: Iterable[Anomaly],
        ids: dict[int, int] | None = None,
        *,
        replace: bool = False,
    ) -> None:
        """Insert or update anomalies of a run in one transaction.

        ``ids`` maps ``id(anomaly)`` to its row id, so an episode that is still open is
        updated in place as it grows; pass the same dict on every call. ``replace=True``
        first deletes the run's earlier anomalies from this source (and their verdicts stay
        only if they point at live anomalies).
        """
        if source not in ANOMALY_SOURCES:
            raise ValueError(f"unknown anomaly source {source!r}; valid: {ANOMALY_SOURCES}")
        ids = {} if ids is None else ids
        now = time.time()
        with self.transaction() as conn:  # type: ignore[attr-defined]
            if replace:
                # Incidents hold members by row id: the next forming re-finds them by key.
                for table in ("verdicts", "incident_members"):
                    conn.execute(
                        f"DELETE FROM {table} WHERE anomaly_id IN (SELECT id FROM anomalies "
                        "WHERE run_id = ? AND source = ?)",
                        (run_id, source),
                    )
                conn.execute(
                    "DELETE FROM anomalies WHERE run_id = ? AND source = ?", (run_id, source)
                )
            for anomaly in anomalies:
                row = _anomaly_row(anomaly)
                known = ids.get(id(anomaly))
                if known is None:
                    cur = conn.execute(
                        "INSERT INTO anomalies (run_id, source, detector, metric, labels, "
                        "start_step, end_step, severity, score, observed, expected, lower, upper, "
                        "message, is_open, details, created, updated) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (run_id, source, *row, now, now),
                    )
                    ids[id(anomaly)] = int(cur.lastrowid)  # type: ignore[arg-type]
                else:
                    conn.execute(
                        "UPDATE anomalies SET detector = ?, metric = ?, labels = ?, "
                        "start_step = ?, end_step = ?, severity = ?, score = ?, observed = ?, "
                        "expected = ?, lower = ?, upper = ?, message = ?, is_open = ?, "
                        "details = ?, updated = ? WHERE id = ?",
                        (*row, now, known),
                    )

    def anomalies(
        self,
        run: str | int | None = None,
        *,
        source: str | None = None,
        min_severity: str | None = None,
    ) -> pd.DataFrame:
        """Anomalies (with the run name and the latest verdict on each), newest step last."""

        sql = """
            SELECT a.id, r.name AS run, a.source, a.detector, a.metric, a.labels, a.start_step,
                   a.end_step, a.severity, a.score, a.observed, a.expected, a.lower, a.upper,
                   a.message, a.is_open, a.details,
                   (SELECT v.verdict FROM verdicts v WHERE v.anomaly_id = a.id
                     ORDER BY v.time DESC, v.id DESC LIMIT 1) AS verdict
            FROM anomalies a JOIN runs r ON r.id = a.run_id WHERE 1 = 1"""
        params: list[Any] = []
        if run is not None:
            sql += " AND a.run_id = ?"
            params.append(self._resolve(run))  # type: ignore[attr-defined]
        if source is not None:
            sql += " AND a.source = ?"
            params.append(source)
        with self._lock:  # type: ignore[attr-defined]
            frame = self._frame(sql + " ORDER BY a.start_step, a.id", params)  # type: ignore[attr-defined]
        if min_severity is not None:
            floor = severity_rank(min_severity)
            frame = frame[frame["severity"].map(severity_rank) >= floor].reset_index(drop=True)
        frame["labels"] = frame["labels"].map(json.loads)
        frame["details"] = frame["details"].map(json.loads)
        frame["is_open"] = frame["is_open"].astype(bool)
        return frame

    def add_verdict(
        self,
        verdict: str,
        *,
        anomaly_id: int | None = None,
        incident_id: int | None = None,
        note: str = "",
        author: str | None = None,
    ) -> int:
        """Store a person's judgement (benign / real / watch) on an anomaly or incident."""
        if verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {verdict!r}; valid: {', '.join(VERDICTS)}")
        if (anomaly_id is None) == (incident_id is None):
            raise ValueError("give exactly one of anomaly_id and incident_id")
        with self.transaction() as conn:  # type: ignore[attr-defined]
            table, noun, key = (
                ("anomalies", "anomaly", anomaly_id)
                if anomaly_id is not None
                else ("incidents", "incident", incident_id)
            )
            if conn.execute(f"SELECT 1 FROM {table} WHERE id = ?", (key,)).fetchone() is None:
                raise KeyError(f"no {noun} with id {key}")
            cur = conn.execute(
                "INSERT INTO verdicts (anomaly_id, incident_id, verdict, note, author, time) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (anomaly_id, incident_id, verdict, note, author, time.time()),
            )
            if incident_id is not None:
                self.set_incident_status(conn, incident_id, verdict)  # type: ignore[attr-defined]
            return int(cur.lastrowid)  # type: ignore[arg-type]

    def verdicts(self, anomaly_id: int | None = None) -> pd.DataFrame:

        sql = "SELECT id, anomaly_id, incident_id, verdict, note, author, time FROM verdicts"
        params: tuple[Any, ...] = ()
        if anomaly_id is not None:
            sql += " WHERE anomaly_id = ?"
            params = (anomaly_id,)
        with self._lock:  # type: ignore[attr-defined]
            return self._frame(sql + " ORDER BY time, id", params)  # type: ignore[attr-defined]

    def save_expected_curve(
        self,
        run_id: int,
        metric: str,
        model: str,
        upto: int,
        final_step: int,
        curve: pd.DataFrame,
        family: list[str] | None = None,
    ) -> None:
        """Store (replacing) the expected curve of a run's metric: step, expected, lower,
        upper; ``family``: the runs a family curve came from (kept in the curve's JSON)."""
        payload: dict[str, Any] = {
            c: curve[c].astype(float).tolist() for c in ("expected", "lower", "upper")
        }
        payload["step"] = curve["step"].astype(int).tolist()
        if family:
            payload["family"] = list(family)
        with self.transaction() as conn:  # type: ignore[attr-defined]
            conn.execute(
                "INSERT INTO expected_curves (run_id, metric, model, upto, final_step, curve, "
                "created) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, metric) DO UPDATE "
                "SET model = excluded.model, upto = excluded.upto, "
                "final_step = excluded.final_step, curve = excluded.curve, "
                "created = excluded.created",
                (run_id, metric, model, upto, final_step, json.dumps(payload), time.time()),
            )

    def expected_curve(self, run: str | int, metric: str) -> tuple[dict[str, Any], pd.DataFrame]:
        """(model, upto, final_step, and family for a family curve) and the curve frame; an
        empty frame when none is stored."""
        import pandas as pd

        run_id = self._resolve(run)  # type: ignore[attr-defined]
        with self._lock:  # type: ignore[attr-defined]
            row = self._conn.execute(
                "SELECT model, upto, final_step, curve FROM expected_curves "
                "WHERE run_id = ? AND metric = ?",
                (run_id, metric),
            ).fetchone()
        if row is None:
            return {}, pd.DataFrame(columns=["step", "expected", "lower", "upper"])
        meta = {"model": row[0], "upto": row[1], "final_step": row[2]}
        payload = json.loads(row[3])
        if "family" in payload:
            meta["family"] = payload.pop("family")
        return meta, pd.DataFrame(payload)
