"""What was stored after a position: the blocks and events a run's live detection has not seen.

Why: with several ``runwatch serve`` replicas on one database, each replica stores the batches
it receives, but one replica owns each run's live detection (``runwatch.server.ownership``).
The owner reads what the others stored for its run from here. Block and event ids grow in
commit order, since every write transaction takes the store's one write lock. A small
block merged into a sealed one comes back under a new id; the reader skips the points it
has fed already by their (attempt, step) per series.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

import numpy as np

from runwatch.model import Event
from runwatch.store.codec import decode_block


@dataclass(frozen=True, slots=True)
class TailBlock:
    """One stored block of a series, decoded."""

    block_id: int
    series_id: int
    metric: str
    labels: dict[str, Any]
    attempt: int
    steps: np.ndarray
    times: np.ndarray
    values: np.ndarray


class TailTables:
    """Reading a run's writes after a position (block id, event id). Mixed into ``Store``."""

    _conn: sqlite3.Connection
    _lock: Any

    def tail_position(self) -> tuple[int, int]:
        """The last block id and the last event id stored so far (0 for none)."""
        with self._lock:
            blocks = self._conn.execute("SELECT COALESCE(MAX(id), 0) FROM point_blocks")
            block = int(blocks.fetchone()[0])
            events = self._conn.execute("SELECT COALESCE(MAX(id), 0) FROM events")
            return block, int(events.fetchone()[0])

    def runs_written_after(self, block_id: int) -> tuple[set[int], int]:
        """The runs with a block stored after ``block_id``, and the last block id."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT s.run_id, MAX(b.id) FROM point_blocks b "
                "JOIN series s ON s.id = b.series_id WHERE b.id > ? GROUP BY s.run_id",
                (int(block_id),),
            ).fetchall()
        last = max((int(r[1]) for r in rows), default=int(block_id))
        return {int(r[0]) for r in rows}, last

    def blocks_after(self, run_id: int, block_id: int) -> list[TailBlock]:
        """The run's blocks stored after ``block_id``, in the order they were stored."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT b.id, b.series_id, s.metric, s.labels, b.attempt, b.data "
                "FROM point_blocks b JOIN series s ON s.id = b.series_id "
                "WHERE s.run_id = ? AND b.id > ? ORDER BY b.id",
                (int(run_id), int(block_id)),
            ).fetchall()
        out = []
        for bid, sid, metric, labels, attempt, data in rows:
            steps, times, values = decode_block(bytes(data))
            block = (int(bid), int(sid), metric, json.loads(labels), int(attempt))
            out.append(TailBlock(*block, steps, times, values))
        return out

    def events_after(self, run_id: int, event_id: int) -> list[tuple[int, Event]]:
        """The run's events stored after ``event_id``: (event id, event), in id order."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, kind, step, time, rank, host, message, attrs FROM events "
                "WHERE run_id = ? AND id > ? ORDER BY id",
                (int(run_id), int(event_id)),
            ).fetchall()
        return [
            (int(i), Event(kind, step, time, message, rank, host, json.loads(attrs or "{}")))
            for i, kind, step, time, rank, host, message, attrs in rows
        ]
