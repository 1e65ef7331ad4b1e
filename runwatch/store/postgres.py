"""The shared store: the same tables and the same :class:`Store` API on PostgreSQL.

``Store("postgresql://user@host/db")`` (or ``open_store``, ``--db``, ``$RUNWATCH_STORE``)
returns a :class:`PostgresStore`. The SQL is the SQLite store's: :class:`PgConnection` gives
psycopg 3 the few sqlite3 habits the table mixins rely on (``?`` marks, ``lastrowid``,
``total_changes``, ``in_transaction``), and the schema is the SQLite migrations with the
column types mapped (``pg_migration``), so one migration list serves both backends.

Writes keep SQLite's meaning: a write transaction takes one advisory lock, so writers are
serialized as under SQLite's ``BEGIN IMMEDIATE`` and the read-then-write steps of the mixins
(next attempt number, a client's last sequence) stay correct with many connections. Point
blocks go in by binary COPY at commit. Connections come from a psycopg_pool pool per URL.
Passwords never reach a log or an error message: the store's ``path`` is the redacted URL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np

from runwatch.store.errors import SchemaTooNewError, StoreError, StoreUnavailableError
from runwatch.store.points import BlockAppender
from runwatch.store.run_locks import RunLocks
from runwatch.store.schema import MIGRATIONS, SCHEMA_VERSION
from runwatch.store.sqlite import Store

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("runwatch.store.postgres")

WRITE_LOCK = 0x72756E77  # "runw": the one advisory lock every write transaction takes
MIGRATE_LOCK = 0x72756E6D  # "runm": schema migrations
POOL_MAX = int(os.environ.get("RUNWATCH_PG_POOL", "32"))
CONNECT_TIMEOUT_S = 10

# Tables whose rows have an ``id``: an INSERT into one returns it (sqlite3's lastrowid).
ID_TABLES = frozenset(
    {
        "runs",
        "series",
        "point_blocks",
        "events",
        "anomalies",
        "incidents",
        "verdicts",
        "alert_outbox",
        "alert_silences",
    }
)
# Tables the SQLite code orders by ``rowid``: on PostgreSQL they get an identity column so named.
ROWID_TABLES = ("step_context", "alert_attempts")


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (userinfo and ``?password=``).

    >>> redact_url("postgresql://me:s3cret@db:5432/rw?password=x&sslmode=require")
    'postgresql://me:***@db:5432/rw?password=***&sslmode=require'
    >>> redact_url("postgresql://me@db/rw")
    'postgresql://me@db/rw'
    """
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        netloc = f"{userinfo}@{host}"
    query = parts.query
    if query:
        pairs = [
            (k, "***" if k.lower() == "password" else v)
            for k, v in parse_qsl(query, keep_blank_values=True)
        ]
        query = urlencode(pairs, safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


class RedactedURL(str):
    """A database URL that reads as its redacted form but still opens the database.

    ``PostgresStore.path`` is one: every message, log line and f-string that names the store
    shows ``***`` for the password, while code that reopens the store from its path (the
    server's live detection does ``Store(store.path)``) still connects. Any string made from
    it (``str()``, concatenation) is the redacted text only.

    >>> u = RedactedURL("postgresql://me:pw@db/rw")
    >>> f"{u}", u.secret
    ('postgresql://me:***@db/rw', 'postgresql://me:pw@db/rw')
    """

    secret: str

    def __new__(cls, url: str) -> RedactedURL:
        if isinstance(url, RedactedURL):
            return url
        self = super().__new__(cls, redact_url(url))
        self.secret = url
        return self

    def __str__(self) -> str:
        return str.__str__(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (RedactedURL, (self.secret,))


# -- the SQL dialect ----------------------------------------------------------------------------
_INSERT_TABLE = re.compile(r"^\s*INSERT\s+INTO\s+(\w+)", re.IGNORECASE)


def translate(sql: str) -> str:
    """sqlite3 SQL to psycopg SQL: ``?`` marks become ``%s`` and a literal ``%`` doubles,
    except inside quoted strings; ``BEGIN IMMEDIATE`` is a plain ``BEGIN``.

    >>> translate("SELECT a FROM t WHERE b = ? AND c LIKE 'x%?'")
    "SELECT a FROM t WHERE b = %s AND c LIKE 'x%?'"
    """
    if sql.strip().upper() == "BEGIN IMMEDIATE":
        return "BEGIN"
    out = []
    quote = ""
    for ch in sql:
        if quote:
            out.append(ch)
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
            out.append(ch)
        elif ch == "?":
            out.append("%s")
        elif ch == "%":
            out.append("%%")
        else:
            out.append(ch)
    return "".join(out)


def pg_migration(sqlite_ddl: str) -> str:
    """One SQLite migration as PostgreSQL DDL: the same tables, PostgreSQL's column types.

    >>> pg_migration("CREATE TABLE t (n INTEGER, x REAL, b BLOB) WITHOUT ROWID")
    'CREATE TABLE t (n BIGINT, x DOUBLE PRECISION, b BYTEA)'
    """
    identity = "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"
    ddl = re.sub(r"\bINTEGER PRIMARY KEY\b", identity, sqlite_ddl)
    ddl = re.sub(r"\bINTEGER\b", "BIGINT", ddl)
    ddl = re.sub(r"\bREAL\b", "DOUBLE PRECISION", ddl)
    ddl = re.sub(r"\bBLOB\b", "BYTEA", ddl)
    ddl = re.sub(r"\)\s*WITHOUT ROWID", ")", ddl)
    for table in ROWID_TABLES:
        ddl = re.sub(
            rf"(CREATE TABLE {table} \()",
            r"\1\n    rowid       BIGINT GENERATED BY DEFAULT AS IDENTITY,",
            ddl,
        )
    return ddl


# PostgreSQL-only statements run after a version's migration (storage tuning, no new meaning).
PG_EXTRA: dict[int, tuple[str, ...]] = {
    # Blocks are already compressed by the codec: do not let TOAST try pglz on them again.
    1: ("ALTER TABLE point_blocks ALTER COLUMN data SET STORAGE EXTERNAL",),
    5: ("ALTER TABLE point_blocks ALTER COLUMN summary SET STORAGE EXTERNAL",),
}


def _statements(ddl: str) -> list[str]:
    return [s for s in ddl.split(";\n") if s.strip()]


def schema_version(conn: Any) -> int:
    """The store's schema version in a psycopg connection's database (0: no runwatch schema)."""
    row = conn.execute(
        "SELECT 1 FROM pg_tables WHERE schemaname = current_schema() "
        "AND tablename = 'runwatch_schema'"
    ).fetchone()
    if row is None:
        return 0
    row = conn.execute("SELECT version FROM runwatch_schema").fetchone()
    return 0 if row is None else int(row[0])


def migrate_pg(conn: Any, where: str) -> int:
    """Bring the database to :data:`SCHEMA_VERSION` in one transaction; return the version found.

    A database whose schema is newer than this runwatch's is refused (SchemaTooNewError).
    Two processes opening a new database at once: the advisory lock makes one migrate and
    the other see the result.
    """
    found = schema_version(conn)
    if found > SCHEMA_VERSION:
        raise SchemaTooNewError(where, found, SCHEMA_VERSION)
    if found == SCHEMA_VERSION:
        return found
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
        current = schema_version(conn)
        if current > SCHEMA_VERSION:
            raise SchemaTooNewError(where, current, SCHEMA_VERSION)
        if current == 0:
            conn.execute("CREATE TABLE runwatch_schema (version INTEGER NOT NULL)")
            conn.execute("INSERT INTO runwatch_schema VALUES (0)")
        for version in range(current, SCHEMA_VERSION):
            for statement in _statements(pg_migration(MIGRATIONS[version])):
                conn.execute(statement)
            for statement in PG_EXTRA.get(version + 1, ()):
                conn.execute(statement)
        conn.execute("UPDATE runwatch_schema SET version = %s", (SCHEMA_VERSION,))
    if current < SCHEMA_VERSION:
        log.info("%s: schema migrated from version %d to %d", where, current, SCHEMA_VERSION)
    return found


# -- connections --------------------------------------------------------------------------------
_pools: dict[str, Any] = {}
_pools_lock = threading.Lock()


def _configure(conn: Any) -> None:
    """Per-connection set-up: bools go in as 0/1 (SQLite's integer columns), numeric sums
    come back as int or float (not Decimal), as sqlite3 gives them."""
    from psycopg.adapt import Dumper, Loader
    from psycopg.pq import Format

    class BoolAsInt(Dumper):
        oid = 20  # int8
        format = Format.TEXT

        def dump(self, obj: Any) -> bytes:
            return b"1" if obj else b"0"

    class NumericAsNumber(Loader):
        def load(self, data: Any) -> Any:
            text = bytes(data).decode()
            try:
                return int(text)
            except ValueError:
                return float(text)

    conn.adapters.register_dumper(bool, BoolAsInt)
    conn.adapters.register_loader("numeric", NumericAsNumber)


def _connect_error(url: str, exc: Exception) -> StoreError:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return StoreError(f"{redact_url(url)}: cannot connect to PostgreSQL: {text}")


def get_pool(url: str) -> Any:
    """The process's connection pool for ``url`` (checked by a first direct connection, so a
    wrong host or password is one clear error, not a pool timeout)."""
    with _pools_lock:
        pool = _pools.get(url)
        if pool is not None:
            return pool
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError as exc:
            raise StoreError(
                "a postgresql:// store needs psycopg 3 and psycopg_pool: "
                "pip install 'runwatch[postgres]'"
            ) from exc
        try:
            psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S).close()
        except psycopg.Error as exc:
            raise _connect_error(url, exc) from None
        pool = ConnectionPool(
            url,
            min_size=1,
            max_size=POOL_MAX,
            kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S},
            configure=_configure,
            check=ConnectionPool.check_connection,
            name=f"runwatch-{len(_pools)}",
            open=True,
        )
        _pools[url] = pool
        return pool


def close_pool(url: str) -> None:
    """Close the pool for ``url`` (tests dropping a database; a process going away)."""
    with _pools_lock:
        pool = _pools.pop(url, None)
    if pool is not None:
        pool.close()


class PgCursor:
    """The part of a sqlite3 cursor the store uses, over a psycopg cursor."""

    def __init__(self, cur: Any, lastrowid: int | None = None) -> None:
        self._cur = cur
        self.lastrowid = lastrowid

    @property
    def rowcount(self) -> int:
        return int(self._cur.rowcount)

    @property
    def description(self) -> Any:
        return self._cur.description

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cur.fetchall())


class PgConnection:
    """A pooled psycopg connection that speaks the sqlite3 dialect the table mixins use.

    A connection that broke (the server restarted) is replaced on the next statement outside
    a transaction; a statement that fails for want of the database raises
    :class:`StoreUnavailableError`, other database errors :class:`StoreError`.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.where = redact_url(url)
        self._pool = get_pool(url)
        self._raw: Any = None
        self.total_changes = 0
        self._cache: dict[str, str] = {}
        self._checkout()

    def _checkout(self) -> None:
        import psycopg
        from psycopg_pool import PoolTimeout

        try:
            self._raw = self._pool.getconn(timeout=CONNECT_TIMEOUT_S)
        except PoolTimeout as exc:
            raise StoreUnavailableError(
                f"{self.where}: no PostgreSQL connection within {CONNECT_TIMEOUT_S} s "
                f"(database down, or more than {POOL_MAX} stores open in this process)"
            ) from exc
        except psycopg.Error as exc:
            raise _connect_error(self.url, exc) from None

    def _live(self) -> Any:
        raw = self._raw
        if raw is None or raw.closed or raw.broken:
            if raw is not None:
                self._pool.putconn(raw)
                self._raw = None
            self._checkout()
        return self._raw

    @property
    def raw(self) -> Any:
        """The psycopg connection (for COPY and the migration)."""
        return self._live()

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        raw = self._raw
        if raw is None or raw.closed or raw.broken:
            return False  # a lost connection took its transaction with it
        return raw.info.transaction_status in (
            TransactionStatus.INTRANS,
            TransactionStatus.INERROR,
            TransactionStatus.ACTIVE,
        )

    def _sql(self, sql: str) -> str:
        out = self._cache.get(sql)
        if out is None:
            out = self._cache[sql] = translate(sql)
        return out

    def execute(self, sql: str, params: Sequence[Any] = ()) -> PgCursor:
        pg = self._sql(sql)
        lastrowid = None
        match = _INSERT_TABLE.match(pg)
        returning = (
            match is not None
            and match.group(1).lower() in ID_TABLES
            and "RETURNING" not in pg.upper()
        )
        if returning:
            pg += " RETURNING id"
        with self._errors():
            cur = self._live().cursor()
            cur.execute(pg, tuple(params))
            if match is not None:
                self.total_changes += max(cur.rowcount, 0)
            if returning:
                row = cur.fetchone()
                lastrowid = None if row is None else int(row[0])
        return PgCursor(cur, lastrowid)

    def executemany(self, sql: str, rows: Any) -> PgCursor:
        rows = [tuple(r) for r in rows]
        with self._errors():
            cur = self._live().cursor()
            if rows:
                cur.executemany(self._sql(sql), rows)
                self.total_changes += max(cur.rowcount, 0)
        return PgCursor(cur)

    def copy_rows(
        self, table: str, columns: Sequence[str], types: Sequence[str], rows: Any
    ) -> None:
        """Bulk insert by binary COPY (the point blocks)."""
        with self._errors():
            cur = self._live().cursor()
            with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as cp:
                cp.set_types(list(types))
                for row in rows:
                    cp.write_row(row)

    def frame(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        """A query's rows as a frame, as ``pandas.read_sql_query`` builds one from sqlite3."""
        import pandas as pd

        cur = self.execute(sql, params)
        columns = [d.name for d in cur.description]
        return pd.DataFrame.from_records(cur.fetchall(), columns=columns, coerce_float=True)

    def _errors(self) -> Any:
        return _translated_errors(self)

    def close(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            self._pool.putconn(raw)  # the pool rolls back an open transaction


class _translated_errors:
    """psycopg errors as store errors, naming the redacted URL."""

    def __init__(self, conn: PgConnection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is None:
            return False
        import psycopg

        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            raise StoreUnavailableError(
                f"{self.conn.where}: database unavailable: {first}"
            ) from exc
        if isinstance(exc, psycopg.Error):
            raise StoreError(f"{self.conn.where}: {first}") from exc
        return False


class CopyBlockAppender(BlockAppender):
    """:class:`BlockAppender` whose blocks go in by one COPY at the end of each write.

    Before a write, :meth:`prepare` learns in one query how many unsealed points each new
    series has, and reads (and deletes) in one more the unsealed blocks of every series the
    write will seal, so a write costs a fixed number of round trips, not two per series.
    """

    COLUMNS = ("series_id", "attempt", "min_step", "max_step", "n", "sealed", "data", "summary")
    TYPES = ("int8", "int8", "int8", "int8", "int8", "int8", "bytea", "bytea")

    def __init__(self, conn: PgConnection) -> None:
        super().__init__(conn)  # type: ignore[arg-type]
        self._taken: dict[tuple[int, int], Any] = {}

    def prepare(self, attempt: int, points: Any) -> None:
        from runwatch.store.codec import decode_block
        from runwatch.store.points import SEAL_POINTS

        unknown = [sid for sid in points if (sid, attempt) not in self._unsealed]
        if unknown:
            found = dict(
                self._conn.execute(
                    "SELECT series_id, SUM(n) FROM point_blocks WHERE attempt = ? "
                    "AND sealed = 0 AND series_id = ANY(?) GROUP BY series_id",
                    (attempt, unknown),
                ).fetchall()
            )
            for sid in unknown:
                self._unsealed[(sid, attempt)] = int(found.get(sid, 0))
        sealing = [
            sid
            for sid, arrays in points.items()
            if self._unsealed[(sid, attempt)] > 0
            and self._unsealed[(sid, attempt)] + len(arrays[0]) >= SEAL_POINTS
        ]
        if not sealing:
            return
        rows = self._conn.execute(
            "DELETE FROM point_blocks WHERE attempt = ? AND sealed = 0 AND series_id = ANY(?) "
            "RETURNING id, series_id, data",
            (attempt, sealing),
        ).fetchall()
        parts: dict[int, list[tuple[int, Any]]] = {}
        for block_id, sid, data in rows:
            parts.setdefault(sid, []).append((block_id, decode_block(data)))
        for sid, blocks in parts.items():
            decoded = [d for _, d in sorted(blocks, key=lambda b: b[0])]
            self._taken[(sid, attempt)] = tuple(
                np.concatenate([d[i] for d in decoded]) for i in range(3)
            )

    def _count_unsealed(self, series_id: int, attempt: int) -> int:
        self.flush()
        return super()._count_unsealed(series_id, attempt)

    def _take_unsealed(self, series_id: int, attempt: int):  # type: ignore[no-untyped-def]
        taken = self._taken.pop((series_id, attempt), None)
        if taken is not None:
            return taken
        self.flush()
        return super()._take_unsealed(series_id, attempt)

    def flush(self) -> None:
        if self._rows:
            rows, self._rows = self._rows, []
            self._conn.copy_rows("point_blocks", self.COLUMNS, self.TYPES, rows)  # type: ignore[attr-defined]

    def forget(self) -> None:
        self._taken.clear()
        super().forget()


class PostgresStore(Store):
    """A runwatch store in a PostgreSQL database (created, and migrated, on open)."""

    def __init__(self, path: str, *, readonly: bool = False, busy_timeout_s: float = 5.0) -> None:
        self.path = RedactedURL(path)
        self.url = self.path.secret
        self.readonly = readonly
        self._lock = threading.RLock()
        self._series_ids = {}
        self._attempts_started = set()
        self._conn = PgConnection(self.url)  # type: ignore[assignment]
        try:
            with _translated_errors(self._conn):
                version = schema_version(self._conn.raw)
                if readonly:
                    if version == 0:
                        raise StoreError(
                            f"{self.path}: no runwatch store in this database yet (open it "
                            "for writing once, e.g. `runwatch serve`, or `runwatch migrate`)"
                        )
                    if version > SCHEMA_VERSION:
                        raise SchemaTooNewError(self.path, version, SCHEMA_VERSION)
                else:
                    migrate_pg(self._conn.raw, self.path)
        except BaseException:
            self._conn.close()
            raise
        self._appender = CopyBlockAppender(self._conn)

    # -- the dialect hooks of Store --------------------------------------------------------------
    def _begin(self) -> None:
        self._conn.execute("BEGIN")
        self._conn.execute("SELECT pg_advisory_xact_lock(?)", (WRITE_LOCK,))

    def _commit(self) -> None:
        self._appender.flush()  # type: ignore[attr-defined]
        self._conn.execute("COMMIT")

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            # A lost connection took the transaction with it.
            with contextlib.suppress(StoreUnavailableError):
                self._conn.execute("ROLLBACK")

    def _frame(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        return self._conn.frame(sql, params)  # type: ignore[attr-defined]

    def run_locks(self) -> RunLocks:
        """A session of this process's run-ownership locks (``runwatch serve`` replicas)."""
        return RunLocks(self.url)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
