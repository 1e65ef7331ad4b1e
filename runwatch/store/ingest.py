"""The store's tables for the ingest server: launches shared by ranks, client sequence marks.

Why these live in the store, not in the server's memory: a server killed with SIGKILL and
restarted must still (1) give the ranks of a running job the attempt they already share, and
(2) recognise a batch it stored just before dying when the client retries it. Both facts are
written in the same transaction as the data they describe (schema v4).

The launch protocol (what ``runwatch serve`` does on ``POST /api/v1/runs``):

- the first start of a run name creates the run and attempt 1;
- a start carrying a ``launch_id`` the run has seen joins that launch's attempt, so every rank
  of one job start (same torchrun rendezvous and restart count, same SLURM job and requeue
  count) shares one attempt;
- a start with a new ``launch_id`` is a new attempt: a ``restart`` event if the previous launch
  died (the run is still ``running``, or ``crashed``), a ``resume`` event if it had finished;
- without a ``launch_id``, a multi-rank start (``world_size > 1``) joins the latest attempt if
  it began less than ``join_window_s`` ago (first writer wins), else starts a new one; a
  single-process start is a new attempt, as with the embedded store.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping
from typing import Any

from runwatch.model import Event
from runwatch.store.errors import RunExistsError

RUN_SUMMARY_KEYS = (
    "run_id",
    "name",
    "project",
    "status",
    "start_time",
    "end_time",
    "last_step",
    "attempts",
    "series",
    "points",
)
"""The fields of :meth:`IngestTables.run_summary`, in order (also the API's run object)."""


class IngestTables:
    """Mixin for :class:`runwatch.store.Store` (uses its connection, lock and helpers)."""

    _conn: sqlite3.Connection
    path: str

    def join_run(
        self,
        name: str,
        *,
        project: str | None = None,
        config: Mapping[str, Any] | None = None,
        resume: bool | None = None,
        launch_id: str | None = None,
        world_size: int | None = None,
        join_window_s: float = 120.0,
        now: float | None = None,
    ) -> tuple[int, int, str]:
        """Create, join or resume the run per the launch protocol (module docstring).

        Returns (run_id, attempt, how) with how in ``created``, ``joined``, ``new_attempt``.
        """
        now = time.time() if now is None else now
        with self.transaction() as conn:  # type: ignore[attr-defined]
            row = conn.execute("SELECT id, status FROM runs WHERE name = ?", (name,)).fetchone()
            if row is None:
                cur = conn.execute(
                    "INSERT INTO runs (name, project, config, status, start_time) "
                    "VALUES (?, ?, ?, 'running', ?)",
                    (name, project, json.dumps(dict(config or {}), default=str), now),
                )
                run_id = int(cur.lastrowid)  # type: ignore[arg-type]
                attempt = self._insert_attempt(conn, run_id, None, now, "start")  # type: ignore[attr-defined]
                self._insert_event(conn, run_id, attempt, Event("start", None, now))  # type: ignore[attr-defined]
                self._map_launch(conn, run_id, launch_id, attempt, now)
                return run_id, attempt, "created"
            run_id, status = int(row[0]), row[1]
            if launch_id is not None:
                known = conn.execute(
                    "SELECT attempt FROM run_launches WHERE run_id = ? AND launch_id = ?",
                    (run_id, launch_id),
                ).fetchone()
                if known is not None:
                    return run_id, int(known[0]), "joined"
            elif world_size is not None and world_size > 1:
                latest = conn.execute(
                    "SELECT attempt, start_time FROM attempts WHERE run_id = ? "
                    "ORDER BY attempt DESC LIMIT 1",
                    (run_id,),
                ).fetchone()
                if latest is not None and now - float(latest[1]) <= join_window_s:
                    return run_id, int(latest[0]), "joined"
            if resume is False:
                raise RunExistsError(
                    f"a run named {name!r} exists; pass resume=True (or leave resume unset) "
                    "to continue it as a new attempt, or choose another name"
                )
            kind = "resume" if status == "finished" else "restart"
            attempt = self._insert_attempt(conn, run_id, None, now, kind)  # type: ignore[attr-defined]
            message = f"launch {launch_id}" if launch_id else ""
            self._insert_event(conn, run_id, attempt, Event(kind, None, now, message))  # type: ignore[attr-defined]
            conn.execute(
                "UPDATE runs SET status = 'running', end_time = NULL WHERE id = ?", (run_id,)
            )
            if config:
                conn.execute(
                    "UPDATE runs SET config = ? WHERE id = ?",
                    (json.dumps(dict(config), default=str), run_id),
                )
            self._map_launch(conn, run_id, launch_id, attempt, now)
            return run_id, attempt, "new_attempt"

    @staticmethod
    def _map_launch(
        conn: sqlite3.Connection, run_id: int, launch_id: str | None, attempt: int, now: float
    ) -> None:
        if launch_id is not None:
            conn.execute(
                "INSERT INTO run_launches (run_id, launch_id, attempt, created) "
                "VALUES (?, ?, ?, ?) "
                "ON CONFLICT (run_id, launch_id) DO UPDATE SET attempt = excluded.attempt, "
                "created = excluded.created",
                (run_id, launch_id, attempt, now),
            )

    def advance_attempt(
        self,
        run_id: int,
        from_attempt: int,
        step: int | None,
        message: str = "",
        now: float | None = None,
    ) -> tuple[int, bool]:
        """A rank saw its step go back while in ``from_attempt``: the first such rank makes
        the next attempt (and its restart event); the others get that same attempt.

        Returns (attempt, created)."""
        now = time.time() if now is None else now
        with self.transaction() as conn:  # type: ignore[attr-defined]
            (latest,) = conn.execute(
                "SELECT COALESCE(MAX(attempt), 0) FROM attempts WHERE run_id = ?", (run_id,)
            ).fetchone()
            if int(latest) > from_attempt:
                return int(latest), False
            attempt = self._insert_attempt(conn, run_id, step, now, "restart")  # type: ignore[attr-defined]
            self._insert_event(conn, run_id, attempt, Event("restart", step, now, message))  # type: ignore[attr-defined]
            conn.execute(
                "UPDATE run_launches SET attempt = ? WHERE run_id = ? AND attempt = ?",
                (attempt, run_id, from_attempt),
            )
            return attempt, True

    def attempt_numbers(self, run_id: int) -> set[int]:
        """The attempts a run has (a batch naming another one is refused)."""
        with self._lock:  # type: ignore[attr-defined]
            rows = self._conn.execute(
                "SELECT attempt FROM attempts WHERE run_id = ?", (run_id,)
            ).fetchall()
        return {int(r[0]) for r in rows}

    def client_seqs(self, client_ids: Iterable[str]) -> dict[str, int]:
        """Highest stored batch sequence number of each known client."""
        ids = list(client_ids)
        if not ids:
            return {}
        out: dict[str, int] = {}
        with self._lock:  # type: ignore[attr-defined]
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                marks = ",".join("?" * len(chunk))
                out.update(
                    (str(c), int(s))
                    for c, s in self._conn.execute(
                        f"SELECT client_id, last_seq FROM ingest_clients "
                        f"WHERE client_id IN ({marks})",
                        chunk,
                    )
                )
        return out

    def set_client_seqs(self, marks: Mapping[str, tuple[int, int]], now: float) -> None:
        """Record {client_id: (run_id, last_seq)}; call inside the batch's transaction."""
        self._conn.executemany(
            "INSERT INTO ingest_clients (client_id, run_id, last_seq, updated) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (client_id) DO UPDATE SET "
            "run_id = excluded.run_id, last_seq = excluded.last_seq, updated = excluded.updated",
            [(c, r, s, now) for c, (r, s) in marks.items()],
        )

    def run_summary(self, run_id: int) -> dict[str, Any] | None:
        """One run's row as ``runs()`` gives it, without scanning the other runs."""
        sql = """
            SELECT r.id, r.name, r.project, r.status, r.start_time, r.end_time, r.last_step,
                   (SELECT COUNT(*) FROM attempts a WHERE a.run_id = r.id),
                   (SELECT COUNT(*) FROM series s WHERE s.run_id = r.id),
                   (SELECT COALESCE(SUM(b.n), 0) FROM point_blocks b
                      JOIN series s ON s.id = b.series_id WHERE s.run_id = r.id)
            FROM runs r WHERE r.id = ?"""
        with self._lock:  # type: ignore[attr-defined]
            row = self._conn.execute(sql, (run_id,)).fetchone()
        if row is None:
            return None
        return dict(zip(RUN_SUMMARY_KEYS, row, strict=True))

    def run_status(self, run_id: int) -> str | None:
        """The run's status, or None if there is no such run (a cheap existence check)."""
        with self._lock:  # type: ignore[attr-defined]
            row = self._conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else str(row[0])
