"""The PostgreSQL store's own promises: clear errors, hidden passwords, schema versions,
concurrent first opens, and a database that goes away mid-batch (nothing half-written)."""

from __future__ import annotations

import logging
import threading

import numpy as np
import psycopg
import pytest

from runwatch.store import StoreError, open_store
from runwatch.store.postgres import (
    StoreUnavailableError,
    migrate_pg,
    pg_migration,
    redact_url,
    schema_version,
)
from runwatch.store.schema import MIGRATIONS, SCHEMA_VERSION


def _pts(n: int, first: int = 0):
    steps = np.arange(first, first + n, dtype=np.int64)
    return steps, steps * 1.0, np.sin(steps * 1.0)


def test_a_wrong_password_is_one_clear_error_that_never_shows_the_password(
    pg_cluster, pg_url, caplog
):
    url = pg_cluster.url(pg_url.rsplit("/", 1)[1], password="hunter2-wrong")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(StoreError, match="password authentication failed") as err:
        open_store(url)
    assert "hunter2" not in str(err.value) and ":***@" in str(err.value)
    assert "hunter2" not in caplog.text
    assert pg_cluster.password not in redact_url(pg_url)


def test_an_unreachable_server_is_a_clear_error(pg_cluster):
    url = f"postgresql://runwatch:pw@127.0.0.1:{pg_cluster.port + 1}/nowhere"
    with pytest.raises(StoreError, match="cannot connect to PostgreSQL"):
        open_store(url)


def test_readonly_open_of_an_empty_database_says_how_to_make_a_store(pg_url):
    with pytest.raises(StoreError, match="no runwatch store in this database"):
        open_store(pg_url, readonly=True)


def test_a_database_from_a_newer_runwatch_is_refused(pg_url):
    open_store(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE runwatch_schema SET version = %s", (SCHEMA_VERSION + 1,))
    for readonly in (False, True):
        with pytest.raises(StoreError, match="newer than this runwatch"):
            open_store(pg_url, readonly=readonly)


def test_a_version_1_database_is_migrated_forward_keeping_its_data(pg_url):
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE runwatch_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO runwatch_schema VALUES (1)")
        for statement in pg_migration(MIGRATIONS[0]).split(";\n"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("INSERT INTO runs (name, start_time) VALUES ('old', 1.0)")
    with open_store(pg_url) as store:
        assert store.runs()["name"].tolist() == ["old"]
        store.start_run("new")  # v3+ columns and v4 tables exist
        store.add_silence({"run": "old"}, ends_at=2e9)
        assert [s["matchers"] for s in store.silences()] == [{"run": "old"}]
    with psycopg.connect(pg_url) as conn:
        assert schema_version(conn) == SCHEMA_VERSION


def test_many_first_opens_at_once_migrate_once(pg_url):
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            open_store(pg_url).close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT COUNT(*) FROM runwatch_schema").fetchone()[0] == 1
        assert migrate_pg(conn, "here") == SCHEMA_VERSION  # nothing left to do


def test_a_database_gone_mid_batch_loses_the_batch_whole_and_the_store_recovers(pg_url):
    with open_store(pg_url) as store:
        run_id, attempt = store.start_run("r")
        sid = store.series_id(run_id, "loss")
        store.write(run_id, attempt, {sid: _pts(100)})
        pid = store._conn.raw.info.backend_pid
        with (
            pytest.raises(StoreUnavailableError, match="database unavailable"),
            store.transaction(),
        ):
            store.write(run_id, attempt, {sid: _pts(5000, first=100)})
            with psycopg.connect(pg_url, autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        # The next call gets a new connection; the batch is all absent, then goes in whole.
        assert len(store.read_series("r", "loss")) == 100
        store.write(run_id, attempt, {sid: _pts(5000, first=100)})
        got = store.read_series("r", "loss")
    assert got["step"].tolist() == list(range(5100))


def test_bytea_blocks_hold_the_codec_bytes_and_sql_dialect_is_shared(pg_url):
    with open_store(pg_url) as store:
        run_id, attempt = store.start_run("r")
        sid = store.series_id(run_id, "loss")
        assert store.series_id(run_id, "loss") == sid  # ON CONFLICT DO NOTHING path, cached
        store._series_ids.clear()
        assert store.series_id(run_id, "loss") == sid  # ... and from the table
        store.write(run_id, attempt, {sid: _pts(5000)})
        kinds = store._conn.execute(
            "SELECT pg_typeof(data)::text, sealed FROM point_blocks ORDER BY id"
        ).fetchall()
        assert kinds == [("bytea", 1), ("bytea", 0)]
        assert store.enqueue_alerts([("k1", "c", "{}", "s"), ("k1", "c", "{}", "s")]) == 1


@pytest.mark.parametrize("one_transaction", [False, True])
def test_writes_that_seal_many_series_at_once_read_back_exactly(pg_url, one_transaction):
    """The batched seal (one count query, one DELETE ... RETURNING per write) and, inside
    one outer transaction, the per-series path must both keep every point once, in order."""
    rng = np.random.default_rng(1)
    with open_store(pg_url) as store:
        run_id, attempt = store.start_run("r")
        sids = [store.series_id(run_id, f"m{i}", {"rank": 0}) for i in range(8)]
        values = {sid: rng.normal(size=5 * 2000) for sid in sids}

        def write_all() -> None:
            for b in range(5):
                steps = np.arange(b * 2000, (b + 1) * 2000)
                store.write(
                    run_id,
                    attempt,
                    {sid: (steps, steps * 1.0, values[sid][steps]) for sid in sids},
                )

        if one_transaction:
            with store.transaction():
                write_all()
        else:
            write_all()
        for i, sid in enumerate(sids):
            got = store.read_series("r", f"m{i}", {"rank": 0})
            assert got["step"].tolist() == list(range(10_000))
            assert np.array_equal(got["value"].to_numpy(), values[sid])
        sealed = store._conn.execute(
            "SELECT COUNT(*) FROM point_blocks WHERE sealed = 1"
        ).fetchone()[0]
    assert sealed == 8 * 2  # 10,000 points per series: two sealed blocks of 4,096 each


def test_the_store_path_shows_no_password_but_reopens_the_database(pg_url, pg_cluster):
    """The server's live detection reopens the store from ``store.path``: that must connect,
    while every message made from the path shows ``***``."""
    with open_store(pg_url) as store:
        store.start_run("r")
        path = store.path
        assert pg_cluster.password not in f"{path} {path!s} {[path]}"
        assert ":***@" in str(path)
    with open_store(path, readonly=True) as again:
        assert again.runs()["name"].tolist() == ["r"]
