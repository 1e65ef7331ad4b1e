"""The store's status reads for the Prometheus exporter: every run's position, the open
live anomalies, drops, alert attempts, and each recent series' latest value."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from runwatch.store.codec import decode_block


class StatusSnapshot(NamedTuple):
    """One consistent read of what ``/metrics`` reports about the runs."""

    runs: list[tuple[Any, ...]]
    """(id, name, project or '', status, last_step, last_time, end_time) per run."""
    open_anomalies: list[tuple[str, str, str, int]]
    """(run, severity, detector, count) of the open episodes found live."""
    drops: list[tuple[str, str, int]]
    """(run, reason, count) as recorded at the end of each run."""
    alert_attempts: list[tuple[str, int, int]]
    """(channel, ok, count) of every delivery attempt."""


class StatusTables:
    """Mixed into ``Store``: reads over the runs, anomalies, drops and outbox tables."""

    def status_snapshot(self) -> StatusSnapshot:
        """Everything ``/metrics`` reports about the runs, read under one lock."""
        conn = self._conn  # type: ignore[attr-defined]
        with self._lock:  # type: ignore[attr-defined]
            runs = conn.execute(
                "SELECT id, name, COALESCE(project, ''), status, last_step, last_time, end_time "
                "FROM runs"
            ).fetchall()
            open_rows = conn.execute(
                "SELECT r.name, a.severity, a.detector, COUNT(*) FROM anomalies a "
                "JOIN runs r ON r.id = a.run_id WHERE a.is_open = 1 AND a.source = 'live' "
                "GROUP BY r.name, a.severity, a.detector"
            ).fetchall()
            drop_rows = conn.execute(
                "SELECT r.name, d.reason, d.count FROM drops d JOIN runs r ON r.id = d.run_id"
            ).fetchall()
            attempts = conn.execute(
                "SELECT o.channel, t.ok, COUNT(*) FROM alert_attempts t "
                "JOIN alert_outbox o ON o.id = t.outbox_id GROUP BY o.channel, t.ok"
            ).fetchall()
        return StatusSnapshot(runs, open_rows, drop_rows, attempts)

    def latest_values(
        self, run_ids: Sequence[int], limit: int
    ) -> list[tuple[int, str, dict[str, Any], float]]:
        """(run id, metric, labels, value) of each series of ``run_ids``: the value at its
        highest step in its latest attempt; at most ``limit`` series."""
        if not run_ids:
            return []
        marks = ",".join("?" * len(run_ids))
        with self._lock:  # type: ignore[attr-defined]
            rows = self._conn.execute(  # type: ignore[attr-defined]
                f"""SELECT s.run_id, s.metric, s.labels, b.data FROM series s
                JOIN (SELECT series_id, data, ROW_NUMBER() OVER (PARTITION BY series_id
                      ORDER BY attempt DESC, max_step DESC, id DESC) AS rn FROM point_blocks
                      WHERE series_id IN (SELECT id FROM series WHERE run_id IN ({marks})))
                  b ON b.series_id = s.id AND b.rn = 1
                LIMIT ?""",
                (*run_ids, limit),
            ).fetchall()
        out = []
        for run_id, metric, labels, blob in rows:
            steps, _times, values = decode_block(blob)
            if not len(steps):
                continue
            at = int(len(steps) - 1 - steps[::-1].argmax())  # last occurrence of the max step
            out.append((run_id, metric, json.loads(labels), float(values[at])))
        return out
