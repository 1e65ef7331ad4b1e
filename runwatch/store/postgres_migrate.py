"""``runwatch migrate``: move an embedded SQLite store into a PostgreSQL one, verified.

Every table is copied with its ids (so anomalies, incidents, verdicts and alerts keep
pointing at the same rows), in foreign-key order, by binary COPY in chunks of rows. Each
chunk commits together with a progress row (``runwatch_migration``), so a migration that
was stopped (Ctrl-C, a lost connection, a killed process) resumes where it stopped when the
same command is run again, and nothing is ever half-copied. A session advisory lock makes a
second ``migrate`` into the same database refuse at once instead of interleaving.

When every table is copied, the identity sequences are moved past the copied ids and the
result is verified: per table, the row count and a SHA-256 over every row (ordered by id,
or sorted when a table has none) must be equal on both sides, and so must the point count.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runwatch.store.errors import StoreError
from runwatch.store.postgres import (
    ID_TABLES,
    ROWID_TABLES,
    PostgresStore,
    _translated_errors,
    redact_url,
)
from runwatch.store.schema import SCHEMA_VERSION

log = logging.getLogger("runwatch.store.migrate")

COPY_LOCK = 0x72756E63  # "runc": one migrate into a database at a time
CHUNK_ROWS = 2000
"""Rows per committed chunk: point blocks are up to ~40 KiB, so a chunk is tens of MiB."""

# Parents before children (the PostgreSQL schema enforces the references).
TABLE_ORDER = (
    "runs",
    "attempts",
    "series",
    "point_blocks",
    "events",
    "anomalies",
    "incidents",
    "incident_members",
    "verdicts",
    "alert_outbox",
    "alert_attempts",
    "alert_silences",
    "drops",
    "expected_curves",
    "ingest_clients",
    "run_launches",
    "step_context",
)
_PG_TYPES = {
    "bigint": "int8",
    "integer": "int4",
    "double precision": "float8",
    "text": "text",
    "bytea": "bytea",
}
_PROGRESS_DDL = """
CREATE TABLE IF NOT EXISTS runwatch_migration (
    source      TEXT NOT NULL,
    tbl         TEXT NOT NULL,
    last_key    BIGINT NOT NULL,
    rows        BIGINT NOT NULL,
    done        BOOLEAN NOT NULL,
    PRIMARY KEY (source, tbl)
)"""


@dataclass
class MigrationReport:
    """What a migration copied and what its verification found."""

    source: str
    target: str
    rows: dict[str, int] = field(default_factory=dict)
    copied: dict[str, int] = field(default_factory=dict)
    points: int = 0
    resumed: bool = False
    seconds: float = 0.0
    verified: bool = False
    mismatches: list[str] = field(default_factory=list)

    @property
    def points_per_s(self) -> float:
        return self.points / self.seconds if self.seconds > 0 else 0.0


class MigrationError(StoreError):
    """A migration that cannot start or whose result does not verify."""


def _source(path: str) -> sqlite3.Connection:
    """Open the SQLite store read-only, first bringing it to this runwatch's schema."""
    from runwatch.store.sqlite import Store

    if not Path(path).is_file():
        raise MigrationError(f"{path}: no such store to migrate from")
    Store(path).close()  # migrates an older store in place, refuses a newer one
    conn = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version != SCHEMA_VERSION:  # pragma: no cover - Store() just made it so
        raise MigrationError(f"{path}: schema version {version}, expected {SCHEMA_VERSION}")
    return conn


def _columns(src: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in src.execute(f"PRAGMA table_info({table})")]


def _has_rowid(src: sqlite3.Connection, table: str) -> bool:
    try:
        src.execute(f"SELECT rowid FROM {table} LIMIT 1")
    except sqlite3.OperationalError:
        return False  # a WITHOUT ROWID table
    return True


def _pg_types(pg: Any, table: str, columns: Sequence[str]) -> list[str]:
    rows = pg.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = %s",
        (table,),
    ).fetchall()
    found = dict(rows)
    return [_PG_TYPES[found[c]] for c in columns]


def _converter(pg_type: str) -> Callable[[Any], Any]:
    if pg_type in ("int8", "int4"):
        return lambda v: None if v is None else int(v)
    if pg_type == "float8":
        return lambda v: None if v is None else float(v)
    if pg_type == "bytea":
        return lambda v: None if v is None else bytes(v)
    return lambda v: None if v is None else str(v)


def migrate_store(
    source: str,
    target: str,
    *,
    chunk_rows: int = CHUNK_ROWS,
    progress: Callable[[str, int, int], None] | None = None,
) -> MigrationReport:
    """Copy the SQLite store ``source`` into the PostgreSQL database ``target``; verify it.

    ``progress(table, rows copied so far, rows in table)`` is called after each chunk.
    """
    started = time.perf_counter()
    report = MigrationReport(source=source, target=redact_url(target))
    src = _source(source)
    key = str(Path(source).resolve())
    PostgresStore(target).close()  # creates or migrates the target schema
    import psycopg

    try:
        pg = psycopg.connect(target, autocommit=True)
    except psycopg.Error as exc:  # pragma: no cover - PostgresStore just connected
        raise MigrationError(f"{report.target}: cannot connect: {exc}") from None
    where = _Where(report.target)
    try:
        with _translated_errors(where):  # type: ignore[arg-type]
            if not pg.execute("SELECT pg_try_advisory_lock(%s)", (COPY_LOCK,)).fetchone()[0]:
                raise MigrationError(
                    f"{report.target}: another `runwatch migrate` is writing into this "
                    "database; wait for it to finish (it can be resumed if it was stopped)"
                )
            pg.execute(_PROGRESS_DDL)
            state = {
                tbl: (int(last), int(rows), bool(done))
                for tbl, last, rows, done in pg.execute(
                    "SELECT tbl, last_key, rows, done FROM runwatch_migration WHERE source = %s",
                    (key,),
                )
            }
            others = pg.execute(
                "SELECT COUNT(*) FROM runwatch_migration WHERE source <> %s", (key,)
            ).fetchone()[0]
            if not state and (others or pg.execute("SELECT 1 FROM runs LIMIT 1").fetchone()):
                raise MigrationError(
                    f"{report.target}: the database already holds runs; migrate into an "
                    "empty database (or re-run the interrupted migration from the same file)"
                )
            report.resumed = bool(state)
            for table in TABLE_ORDER:
                report.rows[table] = src.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                report.copied[table] = _copy_table(
                    src, pg, key, table, state.get(table), chunk_rows, progress
                )
            _advance_sequences(pg)
            report.points = int(
                src.execute("SELECT COALESCE(SUM(n), 0) FROM point_blocks").fetchone()[0]
            )
            report.mismatches = verify(src, pg)
            report.verified = not report.mismatches
    finally:
        pg.close()  # ends the session, and with it the advisory lock
        src.close()
    report.seconds = time.perf_counter() - started
    if not report.verified:
        raise MigrationError(
            f"{report.target}: the copy does not match {source}: " + "; ".join(report.mismatches)
        )
    return report


class _Where:
    def __init__(self, where: str) -> None:
        self.where = where


def _copy_table(
    src: sqlite3.Connection,
    pg: Any,
    key: str,
    table: str,
    state: tuple[int, int, bool] | None,
    chunk_rows: int,
    progress: Callable[[str, int, int], None] | None,
) -> int:
    """Copy one table (from where an earlier run stopped); return the rows copied now."""
    last, rows_done, done = state if state is not None else (-1, 0, False)
    if done:
        return 0
    columns = _columns(src, table)
    types = _pg_types(pg, table, columns)
    convert = [_converter(t) for t in types]
    cols = ", ".join(columns)
    total = src.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    copied = 0
    if not _has_rowid(src, table):  # the small keyed tables: one transaction
        rows = src.execute(f"SELECT {cols} FROM {table}").fetchall()
        with pg.transaction():
            _copy(pg, table, columns, types, convert, rows)
            _mark(pg, key, table, 0, len(rows), True)
        _report(progress, table, len(rows), total)
        return len(rows)
    while True:
        chunk = src.execute(
            f"SELECT rowid, {cols} FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT ?",
            (last, chunk_rows),
        ).fetchall()
        finished = len(chunk) < chunk_rows
        with pg.transaction():
            if chunk:
                _copy(pg, table, columns, types, convert, [r[1:] for r in chunk])
                last = int(chunk[-1][0])
            rows_done += len(chunk)
            _mark(pg, key, table, last, rows_done, finished)
        copied += len(chunk)
        _report(progress, table, rows_done, total)
        if finished:
            return copied


def _copy(
    pg: Any,
    table: str,
    columns: Sequence[str],
    types: Sequence[str],
    convert: Sequence[Callable[[Any], Any]],
    rows: Iterable[Sequence[Any]],
) -> None:
    with pg.cursor().copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as cp:
        cp.set_types(list(types))
        for row in rows:
            cp.write_row([f(v) for f, v in zip(convert, row, strict=True)])


def _mark(pg: Any, key: str, table: str, last: int, rows: int, done: bool) -> None:
    pg.execute(
        "INSERT INTO runwatch_migration (source, tbl, last_key, rows, done) "
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (source, tbl) DO UPDATE SET "
        "last_key = excluded.last_key, rows = excluded.rows, done = excluded.done",
        (key, table, last, rows, done),
    )


def _report(
    progress: Callable[[str, int, int], None] | None, table: str, n: int, total: int
) -> None:
    if progress is not None:
        progress(table, n, total)


def _advance_sequences(pg: Any) -> None:
    """Move each identity past the copied ids, so new rows do not collide with them."""
    for table in sorted(ID_TABLES):
        pg.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
            f"COALESCE((SELECT MAX(id) FROM {table}), 0) + 1, false)"
        )
    for table in ROWID_TABLES:
        pg.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'rowid'), "
            f"COALESCE((SELECT MAX(rowid) FROM {table}), 0) + 1, false)"
        )


# -- verification ------------------------------------------------------------------------------
def _digest_rows(rows: Iterable[Sequence[Any]], types: Sequence[str]) -> tuple[int, str]:
    """(count, SHA-256) of rows, each value normalized by its PostgreSQL column type."""
    convert = [_converter(t) for t in types]
    h = hashlib.sha256()
    n = 0
    for row in rows:
        n += 1
        for f, v in zip(convert, row, strict=True):
            v = f(v)
            if v is None:
                h.update(b"\x00N")
            elif isinstance(v, bytes):
                h.update(b"\x00B" + len(v).to_bytes(8, "little") + v)
            else:
                h.update(b"\x00V" + repr(v).encode())
        h.update(b"\x01")
    return n, h.hexdigest()


def _sorted_rows(rows: Iterable[Sequence[Any]], types: Sequence[str]) -> list[tuple[Any, ...]]:
    convert = [_converter(t) for t in types]
    normal = [tuple(f(v) for f, v in zip(convert, r, strict=True)) for r in rows]
    return sorted(normal, key=repr)


def verify(src: sqlite3.Connection, pg: Any) -> list[str]:
    """Differences between the SQLite store and the database, table by table (none: equal)."""
    problems = []
    for table in TABLE_ORDER:
        columns = _columns(src, table)
        types = _pg_types(pg, table, columns)
        cols = ", ".join(columns)
        if "id" in columns:
            order = " ORDER BY id"
            a_rows: Iterable[Any] = src.execute(f"SELECT {cols} FROM {table}{order}")
            b_rows: Iterable[Any] = pg.cursor().stream(f"SELECT {cols} FROM {table}{order}")
        else:
            a_rows = _sorted_rows(src.execute(f"SELECT {cols} FROM {table}"), types)
            b_rows = _sorted_rows(pg.execute(f"SELECT {cols} FROM {table}"), types)
        a_n, a_hash = _digest_rows(a_rows, types)
        b_n, b_hash = _digest_rows(b_rows, types)
        if a_n != b_n:
            problems.append(f"{table}: {a_n} rows in the source, {b_n} in the database")
        elif a_hash != b_hash:
            problems.append(f"{table}: same {a_n} rows but different contents (checksum)")
    a_points = src.execute("SELECT COALESCE(SUM(n), 0) FROM point_blocks").fetchone()[0]
    b_points = pg.execute("SELECT COALESCE(SUM(n), 0) FROM point_blocks").fetchone()[0]
    if int(a_points) != int(b_points):
        problems.append(f"points: {a_points} in the source, {b_points} in the database")
    return problems
