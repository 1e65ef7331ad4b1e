"""``runwatch migrate``: an SQLite store into PostgreSQL, every table, resumable, verified."""

from __future__ import annotations

import numpy as np
import pandas as pd
import psycopg
import pytest

from runwatch.cli import main
from runwatch.store import open_store
from runwatch.store.context import StepContext
from runwatch.store.outbox import AttemptResult
from runwatch.store.points import SEAL_POINTS
from runwatch.store.postgres_migrate import (
    COPY_LOCK,
    TABLE_ORDER,
    MigrationError,
    migrate_store,
    verify,
)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    """A store with rows in every table: a demo run (anomalies, incidents, a restart) plus
    verdicts, alerts, silences, drops, a curve, ingest marks, launches and context."""
    path = str(tmp_path_factory.mktemp("src") / "runwatch.db")
    assert main(["demo", "--no-dashboard", "--steps", "300", "--db", path]) == 0
    with open_store(path) as store:
        run_id, attempt, _ = store.join_run("served", launch_id="job-1", world_size=2)
        sid = store.series_id(run_id, "loss", {"rank": 1, "host": "h"})
        steps = np.arange(3 * SEAL_POINTS + 5)
        with store.transaction():
            store.write(run_id, attempt, {sid: (steps, steps * 0.5, np.cos(steps / 9.0))})
            store.set_client_seqs({"client-a": (run_id, 41)}, now=1.0)
        aid = int(store.anomalies()["id"].iloc[0])
        store.add_verdict("benign", anomaly_id=aid, note="shard")
        store.enqueue_alerts([("k1", "slack", '{"a": 1}', "one"), ("k2", "slack", "{}", "two")])
        store.record_attempts([AttemptResult(1, True, "200", "sent", 0.0)])
        store.add_silence({"run": "served"}, ends_at=2e9, comment="noisy")
        store.record_drops(run_id, {"bad_value": 3})
        curve = pd.DataFrame(
            {"step": [1, 10], "expected": [3.0, 2.0], "lower": [2.0, 1.0], "upper": [4.0, 3.0]}
        )
        store.save_expected_curve(run_id, "loss", "power_law", 10, 100, curve)
        store.add_context(run_id, attempt, [StepContext(0, None, 1.0, {"shard": "s1"})])
    return path


def _counts(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in TABLE_ORDER}


def test_every_table_arrives_equal_and_the_store_reads_and_writes_the_same(source, pg_url):
    report = migrate_store(source, pg_url)
    assert report.verified and not report.resumed
    assert all(report.rows[t] > 0 for t in TABLE_ORDER), report.rows
    assert _counts(pg_url) == report.rows
    assert report.points > 3 * SEAL_POINTS
    with open_store(source, readonly=True) as a, open_store(pg_url) as b:
        pd.testing.assert_frame_equal(a.runs(), b.runs(), check_dtype=False)
        for name in a.runs()["name"]:
            pd.testing.assert_frame_equal(a.read_points(name), b.read_points(name))
            pd.testing.assert_frame_equal(a.anomalies(name), b.anomalies(name), check_dtype=False)
            pd.testing.assert_frame_equal(a.events(name), b.events(name), check_dtype=False)
        pd.testing.assert_frame_equal(a.outbox(), b.outbox(), check_dtype=False)
        # New rows take new ids after the copied ones.
        run_id, _ = b.start_run("after-migration")
        assert run_id == int(a.runs()["run_id"].max()) + 1


def test_a_stopped_migration_resumes_and_verifies(source, pg_url):
    chunks = []

    def stop_after_three(table: str, done: int, total: int) -> None:
        chunks.append(table)
        if len(chunks) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        migrate_store(source, pg_url, chunk_rows=2, progress=stop_after_three)
    partial = _counts(pg_url)
    assert 0 < sum(partial.values()) < sum(_counts_of_source(source).values())
    report = migrate_store(source, pg_url, chunk_rows=2)
    assert report.resumed and report.verified
    assert _counts(pg_url) == report.rows


def _counts_of_source(path: str) -> dict[str, int]:
    import sqlite3

    conn = sqlite3.connect(path)
    return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in TABLE_ORDER}


def test_a_second_migrate_at_once_is_refused(source, pg_url):
    with psycopg.connect(pg_url, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", (COPY_LOCK,))
        with pytest.raises(MigrationError, match="another `runwatch migrate`"):
            migrate_store(source, pg_url)
    assert sum(_counts(pg_url).values()) == 0  # nothing half-written


def test_a_database_with_other_runs_is_refused(source, pg_url):
    with open_store(pg_url) as store:
        store.start_run("someone-elses")
    with pytest.raises(MigrationError, match="already holds runs"):
        migrate_store(source, pg_url)


def test_verification_sees_one_changed_value(source, pg_url):
    import sqlite3

    migrate_store(source, pg_url)
    with psycopg.connect(pg_url, autocommit=True) as pg:
        pg.execute("UPDATE anomalies SET score = score + 1e-9 WHERE id = 1")
        problems = verify(sqlite3.connect(source), pg)
    assert len(problems) == 1 and problems[0].startswith("anomalies: same")
    assert problems[0].endswith("different contents (checksum)")


def test_the_command_reports_and_never_prints_the_password(source, pg_url, pg_cluster, capsys):
    assert main(["migrate", "--from", source, "--to", pg_url, "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "verified: counts and checksums equal" in out and "points/s" in out
    assert pg_cluster.password not in out + err
    assert main(["migrate", "--from", source, "--to", "/tmp/x.db"]) == 2
    assert "postgresql://" in capsys.readouterr().err
