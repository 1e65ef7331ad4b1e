"""The embedded store: one SQLite file in WAL mode, the single source of truth.

WAL lets the dashboard and ``runwatch analyze`` read while a training process writes;
``synchronous=NORMAL`` makes a commit survive the process being killed (it reaches the WAL
in the OS page cache) at a fraction of the cost of FULL, which only adds safety against a
power cut. Every write method is one transaction.

One ``Store`` wraps one connection and is meant for one thread at a time (a lock guards the
connection so accidental sharing is safe, not fast). Open one per thread or process.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from runwatch.model import LABEL_KEYS, RUN_STATUSES, Event
from runwatch.store.context import ContextTables
from runwatch.store.downsample import minmax_downsample
from runwatch.store.errors import RunExistsError, RunNotFoundError, StoreError
from runwatch.store.incidents import IncidentTables
from runwatch.store.ingest import IngestTables
from runwatch.store.judgements import JudgementTables
from runwatch.store.outbox import OutboxTables
from runwatch.store.points import (
    BlockAppender,
    PointArrays,
    attempt_cutoffs,
    empty_points,
    latest_points,
    live_order,
    mark_superseded,
    read_arrays,
    read_summarized,
    superseded_mask,
)
from runwatch.store.points import read_blocks as _read_blocks
from runwatch.store.schema import migrate
from runwatch.store.status import StatusTables
from runwatch.store.tail import TailTables

if TYPE_CHECKING:
    import pandas as pd  # imported where frames are built: the hook's writes need none

log = logging.getLogger("runwatch.store")

DEFAULT_STORE = "runwatch.db"
PG_URL_PREFIXES = ("postgresql://", "postgres://")
SERIES_COLUMNS = ("metric", *LABEL_KEYS)
MIGRATION_WAIT_S = 30.0


def labels_key(labels: Mapping[str, Any] | None) -> str:
    """Canonical JSON for a label set (sorted, None values left out).

    >>> labels_key({"rank": 3, "host": None})
    '{"rank":3}'
    """
    if not labels:
        return "{}"
    clean = {k: v for k, v in sorted(labels.items()) if v is not None}
    return json.dumps(clean, separators=(",", ":"), default=str)


def primary_series(rows: Iterable[tuple[int, str]]) -> int:
    """Of a run's series of one metric, ``(id, labels key)``, the one that stands for the
    run: the unlabelled one, else one with no rank (a single process: only its host), else
    the lowest rank's (rank 0 logs the run-level metrics), the first created on a tie.

    >>> primary_series([(7, '{"host":"a","rank":1}'), (9, '{"host":"b","rank":0}')])
    9
    >>> primary_series([(7, '{"host":"a","rank":0}'), (8, "{}")])
    8
    """

    def order(row: tuple[int, str]) -> tuple[bool, int, int]:
        labels = json.loads(row[1])
        rank = labels.get("rank")
        place = -1 if rank is None else rank if isinstance(rank, int) else 2**62
        return (bool(labels), place, row[0])

    return min(rows, key=order)[0]


class Store(
    JudgementTables,
    IncidentTables,
    OutboxTables,
    IngestTables,
    StatusTables,
    ContextTables,
    TailTables,
):
    """A runwatch store in one SQLite file (created, and migrated, on open).

    ``Store("postgresql://...")`` makes a :class:`runwatch.store.postgres.PostgresStore`
    instead: every caller that opens a store by path takes a URL as well.
    """

    def __new__(cls, path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> Store:
        if cls is Store and isinstance(path, str) and path.startswith(PG_URL_PREFIXES):
            from runwatch.store.postgres import PostgresStore

            return super().__new__(PostgresStore)
        return super().__new__(cls)

    def __init__(
        self, path: str | os.PathLike[str], *, readonly: bool = False, busy_timeout_s: float = 5.0
    ) -> None:
        self.path = str(path)
        self.readonly = readonly
        if readonly and not Path(self.path).exists():
            raise StoreError(
                f"{self.path}: no such store (create it with a run, "
                "`runwatch import` or `runwatch demo`)"
            )
        try:
            self._conn = self._connect(busy_timeout_s)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: cannot open as a runwatch store: {exc}") from exc
        self._lock = threading.RLock()
        self._series_ids: dict[tuple[int, str, str], int] = {}
        self._attempts_started: set[tuple[int, int]] = set()
        self._appender = BlockAppender(self._conn)

    def _connect(self, busy_timeout_s: float) -> sqlite3.Connection:
        """Open the connection; a writer also switches the file to WAL and migrates it.

        Several threads or processes may open a new store at once (a run, its alert sender,
        the exporter), and whoever switches it to WAL or migrates it holds a lock for a
        moment. SQLite does not always wait on that lock (a journal-mode change can fail at
        once), so the set-up is retried for up to ``MIGRATION_WAIT_S``.
        """
        if self.readonly:
            uri = f"file:{Path(self.path).resolve()}?mode=ro"
            conn = sqlite3.connect(
                uri,
                uri=True,
                isolation_level=None,
                check_same_thread=False,
                timeout=busy_timeout_s,
            )
            try:
                self._check_readable(conn)
            except BaseException:
                conn.close()
                raise
            return conn
        deadline = time.monotonic() + MIGRATION_WAIT_S
        delay = 0.02
        while True:
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_s
            )
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA foreign_keys=ON")
                migrate(conn, self.path)
                return conn
            except sqlite3.OperationalError as exc:
                conn.close()
                if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
            except BaseException:
                conn.close()
                raise

    def _check_readable(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            raise StoreError(f"{self.path}: not a runwatch store (no schema version)")

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT), rolled back on any error.

        Nested use joins the outer transaction, so ``runwatch import`` can wrap a whole file
        in one transaction and leave nothing half-written when a line is malformed.
        """
        with self._lock:
            if self._conn.in_transaction:
                yield self._conn
                return
            self._begin()
            try:
                yield self._conn
                self._commit()
            except BaseException:
                self._rollback()
                self._appender.forget()
                self._series_ids.clear()
                self._attempts_started.clear()
                raise

    # -- dialect hooks (runwatch/store/postgres.py overrides them) ---------------------------
    def _begin(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def _commit(self) -> None:
        self._conn.execute("COMMIT")

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def _frame(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        """A query's rows as a frame (column names as the query gives them)."""
        import pandas as pd

        return pd.read_sql_query(sql, self._conn, params=params)

    # -- runs and attempts -----------------------------------------------------------------
    def start_run(
        self,
        name: str,
        *,
        project: str | None = None,
        config: Mapping[str, Any] | None = None,
        resume: bool | None = None,
        now: float | None = None,
    ) -> tuple[int, int]:
        """Create the run, or resume it with a new attempt; return (run_id, attempt).

        ``resume=None`` (default) resumes a run of the same name; ``False`` refuses to;
        ``True`` resumes, creating the run if it does not exist.
        """
        now = time.time() if now is None else now
        with self.transaction() as conn:
            row = conn.execute("SELECT id FROM runs WHERE name = ?", (name,)).fetchone()
            if row is None:
                cur = conn.execute(
                    "INSERT INTO runs (name, project, config, status, start_time) "
                    "VALUES (?, ?, ?, 'running', ?)",
                    (name, project, json.dumps(dict(config or {}), default=str), now),
                )
                run_id = int(cur.lastrowid)  # type: ignore[arg-type]
                attempt = self._insert_attempt(conn, run_id, None, now, "start")
                self._insert_event(conn, run_id, attempt, Event("start", None, now))
                return run_id, attempt
            if resume is False:
                raise RunExistsError(
                    f"{self.path}: a run named {name!r} exists; pass resume=True (or leave "
                    "resume unset) to continue it as a new attempt, or choose another name"
                )
            run_id = int(row[0])
            attempt = self._insert_attempt(conn, run_id, None, now, "resume")
            conn.execute(
                "UPDATE runs SET status = 'running', end_time = NULL WHERE id = ?", (run_id,)
            )
            if config:
                conn.execute(
                    "UPDATE runs SET config = ? WHERE id = ?",
                    (json.dumps(dict(config), default=str), run_id),
                )
            self._insert_event(conn, run_id, attempt, Event("resume", None, now))
            return run_id, attempt

    def begin_attempt(
        self,
        run_id: int,
        start_step: int | None,
        reason: str,
        now: float | None = None,
        message: str = "",
    ) -> int:
        """Record a restart of the run's process (steps went back); return the new attempt."""
        now = time.time() if now is None else now
        with self.transaction() as conn:
            attempt = self._insert_attempt(conn, run_id, start_step, now, reason)
            self._insert_event(conn, run_id, attempt, Event("restart", start_step, now, message))
            return attempt

    def set_attempt_start(self, run_id: int, attempt: int, start_time: float) -> None:
        """Move an attempt's start to ``start_time``, with the start, resume or restart event
        that opened it, and the run's start when it is the run's first attempt.

        For ``runwatch import``: it creates an attempt when the file's steps go back, and
        learns when that attempt began (its earliest row) only afterwards.
        """
        with self.transaction() as conn:
            row = conn.execute(
                "SELECT start_time FROM attempts WHERE run_id = ? AND attempt = ?",
                (run_id, attempt),
            ).fetchone()
            if row is None:
                raise StoreError(f"{self.path}: run id {run_id} has no attempt {attempt}")
            # The opening event was stored with the attempt's start time, exactly.
            conn.execute(
                "UPDATE events SET time = ? WHERE run_id = ? AND attempt = ? AND time = ? "
                "AND kind IN ('start', 'resume', 'restart')",
                (start_time, run_id, attempt, row[0]),
            )
            conn.execute(
                "UPDATE attempts SET start_time = ? WHERE run_id = ? AND attempt = ?",
                (start_time, run_id, attempt),
            )
            conn.execute(
                "UPDATE runs SET start_time = ? WHERE id = ? AND ? = "
                "(SELECT MIN(attempt) FROM attempts WHERE run_id = ?)",
                (start_time, run_id, attempt, run_id),
            )

    @staticmethod
    def _insert_attempt(
        conn: sqlite3.Connection, run_id: int, start_step: int | None, now: float, reason: str
    ) -> int:
        (last,) = conn.execute(
            "SELECT COALESCE(MAX(attempt), 0) FROM attempts WHERE run_id = ?", (run_id,)
        ).fetchone()
        attempt = int(last) + 1
        conn.execute(
            "INSERT INTO attempts (run_id, attempt, start_step, start_time, reason) "
            "VALUES (?, ?, ?, ?, ?)",
            (run_id, attempt, start_step, now, reason),
        )
        return attempt

    def set_run_status(self, run_id: int, status: str, now: float | None = None) -> None:
        if status not in RUN_STATUSES:
            raise ValueError(f"unknown run status {status!r}; valid: {', '.join(RUN_STATUSES)}")
        now = time.time() if now is None else now
        end = None if status == "running" else now
        with self.transaction() as conn:
            conn.execute(
                "UPDATE runs SET status = ?, end_time = ? WHERE id = ?", (status, end, run_id)
            )

    def run_id(self, name: str) -> int:
        """The id of the run called ``name``; :class:`RunNotFoundError` names the others."""
        with self._lock:
            row = self._conn.execute("SELECT id FROM runs WHERE name = ?", (name,)).fetchone()
            if row is None:
                known = [r[0] for r in self._conn.execute("SELECT name FROM runs ORDER BY id")]
                raise RunNotFoundError(self.path, name, known)
            return int(row[0])

    def runs(self) -> pd.DataFrame:
        """One row per run: name, project, status, times, last step, attempts, points."""

        sql = """
            SELECT r.id AS run_id, r.name, r.project, r.status, r.start_time, r.end_time,
                   r.last_step, r.last_time, r.config,
                   (SELECT COUNT(*) FROM attempts a WHERE a.run_id = r.id) AS attempts,
                   (SELECT COALESCE(SUM(b.n), 0) FROM point_blocks b
                      JOIN series s ON s.id = b.series_id WHERE s.run_id = r.id) AS points,
                   (SELECT COUNT(*) FROM series s WHERE s.run_id = r.id) AS series
            FROM runs r ORDER BY r.id"""
        with self._lock:
            return self._frame(sql)

    def attempts(self, run: str | int) -> pd.DataFrame:

        run_id = self._resolve(run)
        with self._lock:
            return self._frame(
                "SELECT attempt, start_step, start_time, reason FROM attempts WHERE run_id = ? "
                "ORDER BY attempt",
                (run_id,),
            )

    def _attempt_starts(self, run_id: int) -> dict[int, int | None]:
        rows = self._conn.execute(
            "SELECT attempt, start_step FROM attempts WHERE run_id = ?", (run_id,)
        ).fetchall()
        return {int(a): (None if s is None else int(s)) for a, s in rows}

    def _resolve(self, run: str | int) -> int:
        return run if isinstance(run, int) else self.run_id(run)

    # -- series ------------------------------------------------------------------------------
    def _read_series_id(
        self, run_id: int, metric: str, labels: Mapping[str, Any] | None
    ) -> int | None:
        """The series a read means (caller holds the lock): with ``labels``, exactly that
        one (``{}``: the unlabelled series); with None, the run's own series of ``metric``
        (``primary_series``), so a run pushed through ``runwatch serve``, whose series
        carry a host and rank, reads like one logged in-process."""
        if labels is not None:
            row = self._conn.execute(
                "SELECT id FROM series WHERE run_id = ? AND metric = ? AND labels = ?",
                (run_id, metric, labels_key(labels)),
            ).fetchone()
            return None if row is None else int(row[0])
        rows = self._conn.execute(
            "SELECT id, labels FROM series WHERE run_id = ? AND metric = ?", (run_id, metric)
        ).fetchall()
        return primary_series(rows) if rows else None

    def series_id(self, run_id: int, metric: str, labels: Mapping[str, Any] | None = None) -> int:
        """Id of the series (metric + labels) of a run, created on first use."""
        key = (run_id, metric, labels_key(labels))
        cached = self._series_ids.get(key)
        if cached is not None:
            return cached
        with self._lock:
            self._conn.execute(
                "INSERT INTO series (run_id, metric, labels) VALUES (?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                key,
            )
            (sid,) = self._conn.execute(
                "SELECT id FROM series WHERE run_id = ? AND metric = ? AND labels = ?", key
            ).fetchone()
        self._series_ids[key] = int(sid)
        return int(sid)

    def series(self, run: str | int) -> pd.DataFrame:
        """The run's series: series_id, metric, one column per label, points stored."""
        import pandas as pd

        run_id = self._resolve(run)
        with self._lock:
            rows = self._conn.execute(
                "SELECT s.id, s.metric, s.labels, COALESCE(SUM(b.n), 0) FROM series s "
                "LEFT JOIN point_blocks b ON b.series_id = s.id WHERE s.run_id = ? "
                "GROUP BY s.id ORDER BY s.metric, s.labels",
                (run_id,),
            ).fetchall()
        records = []
        for sid, metric, labels, n in rows:
            rec: dict[str, Any] = {"series_id": sid, "metric": metric, "points": int(n)}
            parsed = json.loads(labels)
            for k in LABEL_KEYS:
                rec[k] = parsed.get(k)
            records.append(rec)
        columns = ["series_id", "metric", *LABEL_KEYS, "points"]
        return pd.DataFrame.from_records(records, columns=columns)

    # -- writing points and events ----------------------------------------------------------
    def write(
        self,
        run_id: int,
        attempt: int,
        points: Mapping[int, PointArrays],
        events: Iterable[Event] = (),
        now: float | None = None,
    ) -> None:
        """Append points (series_id -> arrays) and events in ONE transaction."""
        last_step: int | None = None
        last_time: float | None = None
        first_step: int | None = None
        filled = [a for a in points.values() if len(a[0])]
        if filled:
            # One concatenation, not NumPy calls per series: the live writer comes here
            # every 0.08 s with a few points per series, holding the GIL.
            steps = np.concatenate([a[0] for a in filled])
            last_step, first_step = int(steps.max()), int(steps.min())
            newest = float(np.fmax.reduce(np.concatenate([a[1] for a in filled])))
            last_time = newest if newest == newest else None  # NaN: no time known
        started = (run_id, attempt) in self._attempts_started
        with self.transaction() as conn:
            self._appender.prepare(attempt, points)
            for sid, arrays in points.items():
                self._appender.append(sid, attempt, arrays)
            self._appender.flush()
            for event in events:
                self._insert_event(conn, run_id, attempt, event)
            if first_step is not None and not started:
                conn.execute(
                    "UPDATE attempts SET start_step = ? WHERE run_id = ? AND "
                    "attempt = ? AND start_step IS NULL",
                    (first_step, run_id, attempt),
                )
            if last_step is not None:
                # The batch is the newest data, so its highest step is the run's step now,
                # even after a restart sent the steps back.
                conn.execute(
                    "UPDATE runs SET last_step = ?, last_time = COALESCE(?, last_time) "
                    "WHERE id = ?",
                    (last_step, last_time, run_id),
                )
        if first_step is not None:
            self._attempts_started.add((run_id, attempt))  # its start_step is set for good

    def seal_open_blocks(self, run_id: int) -> None:
        """Seal every open block of a run (its newest points, stored raw while it writes):
        when it finishes, so the points it keeps are compressed and summarized."""
        with self.transaction() as conn:
            keys = conn.execute(
                "SELECT DISTINCT b.series_id, b.attempt FROM point_blocks b "
                "JOIN series s ON s.id = b.series_id WHERE s.run_id = ? AND b.sealed = 0",
                (run_id,),
            ).fetchall()
            for series_id, attempt in keys:
                self._appender.seal(int(series_id), int(attempt))
            self._appender.flush()

    def add_events(self, run_id: int, attempt: int | None, events: Iterable[Event]) -> None:
        with self.transaction() as conn:
            for event in events:
                self._insert_event(conn, run_id, attempt, event)

    @staticmethod
    def _insert_event(
        conn: sqlite3.Connection, run_id: int, attempt: int | None, event: Event
    ) -> None:
        conn.execute(
            "INSERT INTO events (run_id, attempt, kind, step, time, rank, host, message, attrs) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                attempt,
                event.kind,
                event.step,
                event.time,
                event.rank,
                event.host,
                event.message,
                json.dumps(event.attrs, default=str),
            ),
        )

    def record_drops(self, run_id: int, counts: Mapping[str, int]) -> None:
        """Add to the run's counts of points refused or lost, by reason."""
        if not counts:
            return
        with self.transaction() as conn:
            conn.executemany(
                "INSERT INTO drops (run_id, reason, count) VALUES (?, ?, ?) "
                "ON CONFLICT (run_id, reason) DO UPDATE SET count = drops.count + excluded.count",
                [(run_id, reason, n) for reason, n in counts.items() if n],
            )

    def drops(self, run: str | int) -> dict[str, int]:
        run_id = self._resolve(run)
        with self._lock:
            return dict(
                self._conn.execute(
                    "SELECT reason, count FROM drops WHERE run_id = ?", (run_id,)
                ).fetchall()
            )

    # -- reading points ----------------------------------------------------------------------
    def read_series(
        self,
        run: str | int,
        metric: str,
        labels: Mapping[str, Any] | None = None,
        *,
        start: int | None = None,
        end: int | None = None,
        max_points: int | None = None,
        all_attempts: bool = False,
    ) -> pd.DataFrame:
        """One series as a frame of step, time, value, attempt (sorted by step): the one
        with exactly ``labels``, or with None the run's own (``primary_series``).

        The latest attempt wins and a repeated step keeps its last value. With
        ``all_attempts=True`` every stored point comes back with a ``superseded`` column
        (redone steps, for drawing them faded). ``max_points`` downsamples keeping each
        bucket's min, max and first NaN, so no spike is lost.
        """
        import pandas as pd

        run_id = self._resolve(run)
        with self._lock:
            sid = self._read_series_id(run_id, metric, labels)
            if sid is None:
                return pd.DataFrame(
                    {
                        "step": pd.Series(dtype="int64"),
                        "time": pd.Series(dtype="float64"),
                        "value": pd.Series(dtype="float64"),
                        "attempt": pd.Series(dtype="int64"),
                    }
                )
            summarized = None
            if max_points is not None and not all_attempts:
                summarized = read_summarized(self._conn, sid, start, end, max_points)
            raw = (
                summarized
                if summarized is not None
                else _read_blocks(self._conn, [sid], start, end)
            )
            starts = self._attempt_starts(run_id)
        if all_attempts:
            frame = raw.assign(superseded=mark_superseded(raw, starts))
            frame = frame.sort_values(["step", "attempt"], kind="stable").reset_index(drop=True)
        else:
            frame = latest_points(raw, starts)
        frame = frame.drop(columns="series_id")
        if max_points is not None:
            frame = minmax_downsample(frame, max_points)
        return frame

    def read_redone(
        self,
        run: str | int,
        metric: str,
        labels: Mapping[str, Any] | None = None,
        *,
        start: int | None = None,
        end: int | None = None,
        max_points: int | None = None,
    ) -> pd.DataFrame:
        """Only the superseded points of a series (steps a later attempt redid: lost work).

        Reads only the blocks that can hold them, so drawing a restart's redone steps on a
        million-step chart does not decode the whole earlier attempt.
        """
        import pandas as pd

        run_id = self._resolve(run)
        with self._lock:
            sid = self._read_series_id(run_id, metric, labels)
            starts = self._attempt_starts(run_id)
            cutoffs = attempt_cutoffs(starts)
            parts = []
            for attempt, cutoff in cutoffs.items():
                if sid is None or cutoff == np.inf:
                    continue
                lo = int(cutoff) if start is None else max(int(cutoff), int(start))
                # Only this attempt's blocks: the later attempts' blocks (most of a long
                # run) hold no redone steps of it and are not decoded.
                frame = _read_blocks(self._conn, [sid], lo, end, attempt=attempt)
                if len(frame):
                    parts.append(frame)
        frame = pd.concat(parts, ignore_index=True) if parts else empty_points()
        frame = frame.assign(superseded=True).sort_values(["step", "attempt"], kind="stable")
        frame = frame.drop(columns="series_id").reset_index(drop=True)
        if max_points is not None:
            frame = minmax_downsample(frame, max_points)
        return frame

    def read_points(
        self,
        run: str | int,
        metrics: Sequence[str] | None = None,
        *,
        start: int | None = None,
        end: int | None = None,
        all_attempts: bool = False,
    ) -> pd.DataFrame:
        """Every live point of a run in long format: metric, rank, host, gpu, step, time, value.

        Sorted by step, then metric and labels: the order a live run delivers them in, so a
        replay of this frame sees what the live Monitor saw. ``all_attempts=True`` returns
        every stored point in the order the attempts wrote them, with a ``superseded`` column.
        """
        import pandas as pd

        run_id = self._resolve(run)
        catalogue = self.series(run_id)
        if metrics is not None:
            catalogue = catalogue[catalogue["metric"].isin(list(metrics))]
        with self._lock:
            raw = read_arrays(self._conn, catalogue["series_id"].tolist(), start, end)
            starts = self._attempt_starts(run_id)
        # Built column by column from the arrays, each taken once in the final order: a
        # merge and a sort over the long frame would copy all of it three times over.
        if all_attempts:
            order = np.lexsort((raw["series_id"], raw["step"], raw["attempt"]))
        else:
            order = live_order(raw, starts)
        sids = raw.pop("series_id")[order]
        catalogue = catalogue.drop(columns="points").reset_index(drop=True)
        where = pd.Index(catalogue["series_id"]).get_indexer(sids)
        frame = {c: catalogue[c].take(where).reset_index(drop=True) for c in SERIES_COLUMNS}
        for c in ("step", "time", "value", "attempt"):
            frame[c] = raw.pop(c)[order]
        if all_attempts:
            frame["superseded"] = superseded_mask(frame["step"], frame["attempt"], starts)
        return pd.DataFrame(frame, copy=False)

    # -- events ------------------------------------------------------------------------------
    def events(self, run: str | int, kinds: Sequence[str] | None = None) -> pd.DataFrame:

        run_id = self._resolve(run)
        sql = (
            "SELECT id, attempt, kind, step, time, rank, host, message, attrs FROM events "
            "WHERE run_id = ?"
        )
        params: list[Any] = [run_id]
        if kinds:
            sql += f" AND kind IN ({','.join('?' * len(kinds))})"
            params.extend(kinds)
        with self._lock:
            return self._frame(sql + " ORDER BY time, id", params)
