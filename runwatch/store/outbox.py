"""The alert outbox and silences: the store's delivery tables.

An alert is written here *before* anything tries to send it, so a process killed mid-delivery
loses nothing: the next process that sends for this store finds the row still ``pending``.
Rows are *claimed* by pushing ``next_try`` past a lease (not by a separate status), so a
sender that dies while holding a claim simply lets the lease run out and the row becomes due
again -- no cleanup step, and two senders on one store never claim the same row at once
(claiming is one ``BEGIN IMMEDIATE`` transaction). Every attempt is a row in
``alert_attempts``.

Payloads hold the rendered message body and the channel's *name*; URLs and secrets stay in
the rules file, so neither the store nor the dashboard can leak them.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd  # imported where frames are built: the hook's writes need none


OUTBOX_STATUSES = ("pending", "sent", "failed")


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One message waiting to go out through one channel."""

    id: int
    key: str
    channel: str
    payload: str
    attempts: int
    created: float


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """What one delivery attempt did to its row: ``status`` is the row's new status."""

    outbox_id: int
    ok: bool
    detail: str
    status: str
    next_try: float


class OutboxTables:
    """Mixin for :class:`runwatch.store.sqlite.Store`: the alert outbox and silences."""

    _conn: sqlite3.Connection

    # -- the outbox --------------------------------------------------------------------------
    def enqueue_alerts(
        self, messages: Iterable[tuple[str, str, str, str]], now: float | None = None
    ) -> int:
        """Insert (idempotency key, channel, payload, summary) rows; return how many were new.

        A key already present is ignored, so writing the same message twice is harmless.
        """
        now = time.time() if now is None else now
        rows = [(k, c, p, s, now, now) for k, c, p, s in messages]
        with self.transaction() as conn:  # type: ignore[attr-defined]
            before = conn.total_changes
            conn.executemany(
                "INSERT INTO alert_outbox (idempotency_key, channel, payload, summary, "
                "status, attempts, next_try, created) VALUES (?, ?, ?, ?, 'pending', 0, ?, ?) "
                "ON CONFLICT DO NOTHING",
                rows,
            )
            return conn.total_changes - before

    def claim_alerts(
        self, channel: str, limit: int, lease: float, now: float | None = None
    ) -> list[OutboxRow]:
        """Take up to ``limit`` due rows of ``channel`` for ``lease`` seconds, oldest first."""
        now = time.time() if now is None else now
        if limit <= 0:
            return []
        with self.transaction() as conn:  # type: ignore[attr-defined]
            found = conn.execute(
                "SELECT id, idempotency_key, channel, payload, attempts, created FROM alert_outbox "
                "WHERE status = 'pending' AND next_try <= ? AND channel = ? ORDER BY id LIMIT ?",
                (now, channel, limit),
            ).fetchall()
            conn.executemany(
                "UPDATE alert_outbox SET next_try = ? WHERE id = ?",
                [(now + lease, row[0]) for row in found],
            )
        return [OutboxRow(*row) for row in found]

    def record_attempts(self, results: Sequence[AttemptResult], now: float | None = None) -> None:
        """Record attempts and move their rows on (sent, failed, or pending until next_try)."""
        now = time.time() if now is None else now
        if not results:
            return
        with self.transaction() as conn:  # type: ignore[attr-defined]
            conn.executemany(
                "INSERT INTO alert_attempts (outbox_id, time, ok, detail) VALUES (?, ?, ?, ?)",
                [(r.outbox_id, now, int(r.ok), r.detail) for r in results],
            )
            conn.executemany(
                "UPDATE alert_outbox SET attempts = attempts + 1, status = ?, next_try = ?, "
                "last_error = ?, sent_at = ? WHERE id = ?",
                [
                    (
                        r.status,
                        r.next_try,
                        None if r.ok else r.detail,
                        now if r.status == "sent" else None,
                        r.outbox_id,
                    )
                    for r in results
                ],
            )

    def defer_alerts(self, ids: Sequence[int], next_try: float) -> None:
        """Give claimed rows back without an attempt (a rate limit said not yet)."""
        with self.transaction() as conn:  # type: ignore[attr-defined]
            conn.executemany(
                "UPDATE alert_outbox SET next_try = ? WHERE id = ? AND status = 'pending'",
                [(next_try, i) for i in ids],
            )

    def pending_alerts(self, channels: Sequence[str] | None = None) -> int:
        """How many rows still wait to be sent (through ``channels``, if given)."""
        sql = "SELECT COUNT(*) FROM alert_outbox WHERE status = 'pending'"
        params: list[Any] = []
        if channels is not None:
            sql += f" AND channel IN ({','.join('?' * len(channels))})"
            params.extend(channels)
        with self._lock:  # type: ignore[attr-defined]
            return int(self._conn.execute(sql, params).fetchone()[0])

    def next_alert_due(self, channel: str) -> float | None:
        """When the earliest pending row of ``channel`` becomes due (None if there is none)."""
        with self._lock:  # type: ignore[attr-defined]
            (due,) = self._conn.execute(
                "SELECT MIN(next_try) FROM alert_outbox WHERE status = 'pending' AND channel = ?",
                (channel,),
            ).fetchone()
        return None if due is None else float(due)

    def outbox(self, status: str | None = None, channel: str | None = None) -> pd.DataFrame:
        """Outbox rows (without payloads): id, key, channel, summary, status, attempts, times."""

        sql = (
            "SELECT id, idempotency_key, channel, summary, status, attempts, next_try, created, "
            "sent_at, last_error FROM alert_outbox WHERE 1 = 1"
        )
        params: list[Any] = []
        if status is not None:
            if status not in OUTBOX_STATUSES:
                raise ValueError(f"unknown status {status!r}; valid: {', '.join(OUTBOX_STATUSES)}")
            sql += " AND status = ?"
            params.append(status)
        if channel is not None:
            sql += " AND channel = ?"
            params.append(channel)
        with self._lock:  # type: ignore[attr-defined]
            return self._frame(sql + " ORDER BY id", params)  # type: ignore[attr-defined]

    def outbox_payload(self, outbox_id: int) -> dict[str, Any]:
        with self._lock:  # type: ignore[attr-defined]
            row = self._conn.execute(
                "SELECT payload FROM alert_outbox WHERE id = ?", (outbox_id,)
            ).fetchone()
        if row is None:
            raise KeyError(f"no outbox row with id {outbox_id}")
        return json.loads(row[0])

    def alert_attempts(self, outbox_id: int | None = None) -> pd.DataFrame:

        sql = "SELECT outbox_id, time, ok, detail FROM alert_attempts"
        params: tuple[Any, ...] = ()
        if outbox_id is not None:
            sql += " WHERE outbox_id = ?"
            params = (outbox_id,)
        with self._lock:  # type: ignore[attr-defined]
            return self._frame(sql + " ORDER BY time, rowid", params)  # type: ignore[attr-defined]

    def outbox_counts(self) -> dict[tuple[str, str], int]:
        """(channel, status) -> rows: what the exporter reports as sent, failed, pending."""
        with self._lock:  # type: ignore[attr-defined]
            rows = self._conn.execute(
                "SELECT channel, status, COUNT(*) FROM alert_outbox GROUP BY channel, status"
            ).fetchall()
        return {(c, s): int(n) for c, s, n in rows}

    # -- silences ----------------------------------------------------------------------------
    def add_silence(
        self,
        matchers: Mapping[str, str],
        ends_at: float,
        *,
        comment: str = "",
        author: str | None = None,
        starts_at: float | None = None,
    ) -> int:
        """Store a silence: alerts whose labels match every matcher are muted until ``ends_at``."""
        if not matchers:
            raise ValueError("a silence needs at least one matcher (run, detector, metric, ...)")
        now = time.time()
        starts_at = now if starts_at is None else starts_at
        if ends_at <= starts_at:
            raise ValueError("a silence must end after it starts")
        with self.transaction() as conn:  # type: ignore[attr-defined]
            cur = conn.execute(
                "INSERT INTO alert_silences (matchers, starts_at, ends_at, comment, author, "
                "created) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    json.dumps(dict(matchers), sort_keys=True),
                    starts_at,
                    ends_at,
                    comment,
                    author,
                    now,
                ),
            )
            return int(cur.lastrowid)  # type: ignore[arg-type]

    def silences(self, *, active_at: float | None = None) -> list[dict[str, Any]]:
        """Every silence (or those active at ``active_at``), oldest first."""
        sql = (
            "SELECT id, matchers, starts_at, ends_at, comment, author, created FROM alert_silences"
        )
        params: tuple[Any, ...] = ()
        if active_at is not None:
            sql += " WHERE starts_at <= ? AND ends_at > ?"
            params = (active_at, active_at)
        with self._lock:  # type: ignore[attr-defined]
            rows = self._conn.execute(sql + " ORDER BY id", params).fetchall()
        keys = ("id", "matchers", "starts_at", "ends_at", "comment", "author", "created")
        out = [dict(zip(keys, row, strict=True)) for row in rows]
        for rec in out:
            rec["matchers"] = json.loads(rec["matchers"])
        return out

    def expire_silence(self, silence_id: int, now: float | None = None) -> None:
        """End a silence now; :class:`KeyError` if there is no such silence."""
        now = time.time() if now is None else now
        with self.transaction() as conn:  # type: ignore[attr-defined]
            cur = conn.execute(
                "UPDATE alert_silences SET ends_at = CASE WHEN ends_at < ? THEN ends_at ELSE ? END "
                "WHERE id = ?",
                (now, now, silence_id),
            )
            if cur.rowcount == 0:
                raise KeyError(f"no silence with id {silence_id}")
