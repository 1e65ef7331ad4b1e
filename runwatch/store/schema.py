"""The SQLite schema and its forward migrations.

The schema version lives in ``PRAGMA user_version``. ``MIGRATIONS[i]`` takes a store from
version ``i`` to ``i + 1``; a store opened by a newer runwatch is migrated in place, in one
transaction, and a store from a *newer* runwatch than this one is refused (we cannot know what
its tables mean). Never edit a released migration: append a new one.
"""

from __future__ import annotations

import sqlite3

from runwatch.store.errors import SchemaTooNewError

_V1 = """
CREATE TABLE runs (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    project     TEXT,
    config      TEXT NOT NULL DEFAULT '{}',
    status      TEXT NOT NULL DEFAULT 'running',
    start_time  REAL NOT NULL,
    end_time    REAL,
    last_step   INTEGER,
    last_time   REAL
);
CREATE TABLE attempts (
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    attempt     INTEGER NOT NULL,
    start_step  INTEGER,
    start_time  REAL NOT NULL,
    reason      TEXT NOT NULL,
    PRIMARY KEY (run_id, attempt)
) WITHOUT ROWID;
CREATE TABLE series (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    metric      TEXT NOT NULL,
    labels      TEXT NOT NULL DEFAULT '{}',
    UNIQUE (run_id, metric, labels)
);
-- Points live in compressed blocks (codec.py); sealed = 1 once a block is full-sized.
CREATE TABLE point_blocks (
    id          INTEGER PRIMARY KEY,
    series_id   INTEGER NOT NULL REFERENCES series(id),
    attempt     INTEGER NOT NULL,
    min_step    INTEGER NOT NULL,
    max_step    INTEGER NOT NULL,
    n           INTEGER NOT NULL,
    sealed      INTEGER NOT NULL,
    data        BLOB NOT NULL
);
CREATE INDEX point_blocks_by_series ON point_blocks (series_id, min_step);
CREATE TABLE events (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    attempt     INTEGER,
    kind        TEXT NOT NULL,
    step        INTEGER,
    time        REAL NOT NULL,
    rank        INTEGER,
    host        TEXT,
    message     TEXT NOT NULL DEFAULT '',
    attrs       TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX events_by_run ON events (run_id, time);
CREATE TABLE anomalies (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    source      TEXT NOT NULL,          -- 'live' (hook/serve) or 'replay' (runwatch analyze)
    detector    TEXT NOT NULL,
    metric      TEXT NOT NULL,
    labels      TEXT NOT NULL DEFAULT '{}',
    start_step  INTEGER NOT NULL,
    end_step    INTEGER NOT NULL,
    severity    TEXT NOT NULL,
    score       REAL,
    observed    REAL,
    expected    REAL,
    lower       REAL,
    upper       REAL,
    message     TEXT NOT NULL,
    is_open     INTEGER NOT NULL,
    details     TEXT NOT NULL DEFAULT '{}',
    created     REAL NOT NULL,
    updated     REAL NOT NULL
);
CREATE INDEX anomalies_by_run ON anomalies (run_id, source, start_step);
CREATE TABLE incidents (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    status      TEXT NOT NULL DEFAULT 'open',
    title       TEXT NOT NULL,
    hypotheses  TEXT NOT NULL DEFAULT '[]',
    created     REAL NOT NULL,
    updated     REAL NOT NULL
);
CREATE TABLE incident_members (
    incident_id INTEGER NOT NULL REFERENCES incidents(id),
    anomaly_id  INTEGER REFERENCES anomalies(id),
    event_id    INTEGER REFERENCES events(id)
);
CREATE TABLE verdicts (
    id          INTEGER PRIMARY KEY,
    anomaly_id  INTEGER REFERENCES anomalies(id),
    incident_id INTEGER REFERENCES incidents(id),
    verdict     TEXT NOT NULL CHECK (verdict IN ('benign', 'real', 'watch')),
    note        TEXT NOT NULL DEFAULT '',
    author      TEXT,
    time        REAL NOT NULL
);
CREATE TABLE alert_outbox (
    id          INTEGER PRIMARY KEY,
    idempotency_key TEXT NOT NULL UNIQUE,
    channel     TEXT NOT NULL,
    payload     TEXT NOT NULL,
    status      TEXT NOT NULL DEFAULT 'pending',
    attempts    INTEGER NOT NULL DEFAULT 0,
    next_try    REAL NOT NULL,
    created     REAL NOT NULL,
    last_error  TEXT
);
CREATE INDEX alert_outbox_pending ON alert_outbox (status, next_try);
CREATE TABLE alert_attempts (
    outbox_id   INTEGER NOT NULL REFERENCES alert_outbox(id),
    time        REAL NOT NULL,
    ok          INTEGER NOT NULL,
    detail      TEXT
);
CREATE TABLE drops (
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    reason      TEXT NOT NULL,
    count       INTEGER NOT NULL,
    PRIMARY KEY (run_id, reason)
) WITHOUT ROWID;
"""

# v2: the expected curve of a metric (fitted by analyze/forecast/live detection), sampled for
# drawing, so the dashboard shows it without refitting.
_V2 = """
CREATE TABLE expected_curves (
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    metric      TEXT NOT NULL,
    model       TEXT NOT NULL,
    upto        INTEGER NOT NULL,
    final_step  INTEGER NOT NULL,
    curve       TEXT NOT NULL,          -- JSON {"step": [...], "expected": [...], ...}
    created     REAL NOT NULL,
    PRIMARY KEY (run_id, metric)
) WITHOUT ROWID;
"""

# v3: alert silences (``runwatch silence``), and when each outbox row was delivered plus a
# one-line summary of it, so the dashboard can list alerts without parsing payloads (the
# payload never holds a URL or secret: those stay in the rules file).
_V3 = """
CREATE TABLE alert_silences (
    id          INTEGER PRIMARY KEY,
    matchers    TEXT NOT NULL,          -- JSON {"run": "gpt-*", "severity": "warning", ...}
    starts_at   REAL NOT NULL,
    ends_at     REAL NOT NULL,
    comment     TEXT NOT NULL DEFAULT '',
    author      TEXT,
    created     REAL NOT NULL
);
ALTER TABLE alert_outbox ADD COLUMN sent_at REAL;
ALTER TABLE alert_outbox ADD COLUMN summary TEXT NOT NULL DEFAULT ''
"""

# v4: the ingest server (``runwatch serve``). ``ingest_clients`` holds each client's highest
# stored batch sequence number, written in the same transaction as the batch's points, so a
# batch retried after a timeout or replayed from a spill file is stored once, even across a
# server restart. ``run_launches`` maps a job launch (all ranks of one torchrun/SLURM/MPI job
# start) to the attempt its ranks share, so 256 ranks starting a run make one attempt.
_V4 = """
CREATE TABLE ingest_clients (
    client_id   TEXT PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    last_seq    INTEGER NOT NULL,
    updated     REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE run_launches (
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    launch_id   TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    created     REAL NOT NULL,
    PRIMARY KEY (run_id, launch_id)
) WITHOUT ROWID;
"""

# v5: a sealed block's extremes (min, max and first non-finite point of every 32 points),
# so a full-range chart of a million steps reads 1/10 of the data and still shows each spike.
_V5 = """
ALTER TABLE point_blocks ADD COLUMN summary BLOB
"""

# v6: incidents as formed from a run's anomalies and events (``runwatch incidents``): a stable
# key per source (so a re-analysis keeps the verdicts given), their figures, and the step
# context the user logs (``run.log(..., context=)``), one row per change, per rank where given.
_V6 = """
ALTER TABLE incidents ADD COLUMN source TEXT NOT NULL DEFAULT 'live';
ALTER TABLE incidents ADD COLUMN key TEXT NOT NULL DEFAULT '';
ALTER TABLE incidents ADD COLUMN severity TEXT NOT NULL DEFAULT 'info';
ALTER TABLE incidents ADD COLUMN first_step INTEGER;
ALTER TABLE incidents ADD COLUMN last_step INTEGER;
ALTER TABLE incidents ADD COLUMN count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE incidents ADD COLUMN signature TEXT;
ALTER TABLE incidents ADD COLUMN is_active INTEGER NOT NULL DEFAULT 1;
ALTER TABLE incidents ADD COLUMN details TEXT NOT NULL DEFAULT '{}';
CREATE UNIQUE INDEX incidents_by_key ON incidents (run_id, source, key);
CREATE INDEX incident_members_by_incident ON incident_members (incident_id);
CREATE TABLE step_context (
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    attempt     INTEGER,
    rank        INTEGER,
    step        INTEGER NOT NULL,
    time        REAL,
    context     TEXT NOT NULL           -- JSON {"shard": "s17", ...}: holds until the next row
);
CREATE INDEX step_context_by_run ON step_context (run_id, step)
"""

MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4, _V5, _V6)
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection, path: str) -> int:
    """Bring the store at ``conn`` to :data:`SCHEMA_VERSION`; return the version found."""
    found = conn.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        raise SchemaTooNewError(path, found, SCHEMA_VERSION)
    if found == SCHEMA_VERSION:
        return found
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Re-read under the write lock: another process may have migrated meanwhile.
        current = conn.execute("PRAGMA user_version").fetchone()[0]
        for version in range(current, SCHEMA_VERSION):
            for statement in MIGRATIONS[version].split(";\n"):
                if statement.strip():
                    conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return found
