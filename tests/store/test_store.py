"""The SQLite store: runs and attempts, points, schema versions, bad files, concurrency."""

from __future__ import annotations

import sqlite3
import threading
import time

import numpy as np
import pandas as pd
import pytest

from runwatch.model import Anomaly
from runwatch.store import RunExistsError, RunNotFoundError, StoreError, open_store
from runwatch.store.points import SEAL_POINTS
from runwatch.store.schema import SCHEMA_VERSION


def _pts(steps, values, t0=1.7e9):
    steps = np.asarray(steps, dtype=np.int64)
    return steps, t0 + steps.astype(float), np.asarray(values, dtype=np.float64)


def test_new_store_is_wal_and_versioned(db_path):
    open_store(str(db_path)).close()  # creating the file is the act under test
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_store_from_a_newer_runwatch_is_refused(db_path):
    open_store(str(db_path)).close()  # creating the file is the act under test
    conn = sqlite3.connect(db_path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this runwatch"):
        open_store(str(db_path))


def test_a_file_that_is_not_sqlite_is_a_clear_error(db_path):
    db_path.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(StoreError, match=str(db_path)):
        open_store(str(db_path))


def test_readonly_open_of_a_missing_store_says_how_to_make_one(db_path):
    with pytest.raises(StoreError, match="no such store"):
        open_store(str(db_path), readonly=True)


def test_resume_starts_a_new_attempt_and_resume_false_refuses(store_url):
    with open_store(store_url) as store:
        assert store.start_run("r") == (1, 1)
        assert store.start_run("r") == (1, 2)
        with pytest.raises(RunExistsError, match="exists"):
            store.start_run("r", resume=False)
        kinds = store.events("r")["kind"].tolist()
        assert kinds == ["start", "resume"]


def test_points_round_trip_with_nan_and_inf(store_url):
    with open_store(store_url) as store:
        run_id, attempt = store.start_run("r")
        sid = store.series_id(run_id, "loss")
        store.write(run_id, attempt, {sid: _pts([0, 1, 2, 3], [3.0, np.nan, np.inf, -np.inf])})
        got = store.read_series("r", "loss")
    assert got["step"].tolist() == [0, 1, 2, 3]
    assert np.array_equal(got["value"], [3.0, np.nan, np.inf, -np.inf], equal_nan=True)


def test_latest_attempt_wins_and_redone_steps_stay_visible(store_url):
    with open_store(store_url) as store:
        run_id, a1 = store.start_run("r")
        sid = store.series_id(run_id, "loss")
        store.write(run_id, a1, {sid: _pts(range(10), [1.0] * 10)})
        a2 = store.begin_attempt(run_id, 6, "restart")
        store.write(run_id, a2, {sid: _pts(range(6, 12), [2.0] * 6)})
        live = store.read_series("r", "loss")
        everything = store.read_series("r", "loss", all_attempts=True)
    assert live["step"].tolist() == list(range(12))
    assert live["value"].tolist() == [1.0] * 6 + [2.0] * 6
    assert len(everything) == 16
    lost = everything[everything["superseded"]]
    assert lost["step"].tolist() == [6, 7, 8, 9] and set(lost["attempt"]) == {1}


def test_repeated_step_in_one_attempt_keeps_the_last_value(store_url):
    with open_store(store_url) as store:
        run_id, a1 = store.start_run("r")
        sid = store.series_id(run_id, "loss")
        store.write(run_id, a1, {sid: _pts([1, 2, 2], [1.0, 2.0, 2.5])})
        store.write(run_id, a1, {sid: _pts([2, 3], [2.7, 3.0])})
        got = store.read_series("r", "loss")
    assert got["value"].tolist() == [1.0, 2.7, 3.0]


def test_small_flushes_are_sealed_into_big_blocks_without_changing_reads(store_url):
    rng = np.random.default_rng(0)
    values = rng.normal(size=3 * SEAL_POINTS + 17)
    with open_store(store_url) as store:
        run_id, a1 = store.start_run("r")
        sid = store.series_id(run_id, "loss")
        for start in range(0, len(values), 97):
            chunk = slice(start, start + 97)
            store.write(run_id, a1, {sid: _pts(np.arange(len(values))[chunk], values[chunk])})
        got = store.read_series("r", "loss")
        blocks = store._conn.execute("SELECT sealed, COUNT(*) FROM point_blocks GROUP BY sealed")
        counts = dict(blocks.fetchall())
    assert np.array_equal(got["value"].to_numpy(), values)
    assert counts[1] == 3 and counts.get(0, 0) <= 1


def test_blocks_left_unsealed_by_a_killed_writer_are_merged_by_the_next(store_url):
    with open_store(store_url) as store:
        run_id, a1 = store.start_run("r")
        sid = store.series_id(run_id, "loss")
        store.write(run_id, a1, {sid: _pts(range(100), np.ones(100))})
    with open_store(store_url) as store:  # a new process's connection
        store.write(
            run_id, a1, {sid: _pts(range(100, SEAL_POINTS + 50), np.zeros(SEAL_POINTS - 50))}
        )
        got = store.read_series("r", "loss")
        sealed = store._conn.execute("SELECT COUNT(*) FROM point_blocks WHERE sealed=1").fetchone()
    assert len(got) == SEAL_POINTS + 50
    assert sealed[0] == 1


def test_range_reads_and_downsampled_reads(store_url):
    values = np.ones(200_000)
    values[123_456] = 99.0
    with open_store(store_url) as store:
        run_id, a1 = store.start_run("r")
        sid = store.series_id(run_id, "loss", {"rank": 0})
        store.write(run_id, a1, {sid: _pts(range(200_000), values)})
        window = store.read_series("r", "loss", {"rank": 0}, start=1000, end=1999)
        small = store.read_series("r", "loss", {"rank": 0}, max_points=500)
        other_rank = store.read_series("r", "loss", {"rank": 1})
    assert window["step"].tolist() == list(range(1000, 2000))
    assert len(small) <= 500 and 99.0 in small["value"].tolist()
    assert other_rank.empty


def test_read_points_is_long_format_in_step_order(store_url):
    with open_store(store_url) as store:
        run_id, a1 = store.start_run("r")
        loss = store.series_id(run_id, "loss")
        gn = store.series_id(run_id, "grad_norm", {"rank": 3, "host": "h1"})
        store.write(run_id, a1, {loss: _pts([0, 1], [2.0, 1.0]), gn: _pts([0, 1], [5.0, 6.0])})
        points = store.read_points("r")
    assert points.columns.tolist() == [
        "metric",
        "rank",
        "host",
        "gpu",
        "step",
        "time",
        "value",
        "attempt",
    ]
    assert points["step"].tolist() == [0, 0, 1, 1]
    assert points[points["metric"] == "grad_norm"]["rank"].tolist() == [3, 3]


def test_unknown_run_names_the_runs_there_are(store_url):
    with open_store(store_url) as store:
        store.start_run("alpha")
        with pytest.raises(RunNotFoundError, match="alpha"):
            store.read_series("beta", "loss")


def test_reader_works_while_a_writer_writes(store_url):
    with open_store(store_url) as store:
        run_id, a1 = store.start_run("r")
        sid = store.series_id(run_id, "loss")
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        with open_store(store_url) as writer:
            step = 0
            while not stop.is_set() and step < 100_000:
                writer.write(run_id, a1, {sid: _pts(range(step, step + 500), np.ones(500))})
                step += 500
                time.sleep(0.002)

    thread = threading.Thread(target=write)
    thread.start()
    seen = []
    try:
        with open_store(store_url, readonly=True) as reader:
            deadline = time.monotonic() + 20
            while len(set(seen)) < 5 and time.monotonic() < deadline:
                seen.append(len(reader.read_series("r", "loss")))
    except BaseException as exc:  # pragma: no cover - reported below
        errors.append(exc)
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert seen == sorted(seen) and seen[-1] > seen[0]
    assert all(n % 500 == 0 for n in seen)  # a reader never sees half a transaction


def test_anomalies_update_in_place_and_replay_replaces(store_url):
    with open_store(store_url) as store:
        run_id, _ = store.start_run("r")
        anomaly = Anomaly("spike", "loss", 10, 10, "warning", 7.0, 5.0, "loss spike")
        ids: dict[int, int] = {}
        store.save_anomalies(run_id, "live", [anomaly], ids)
        anomaly.end_step, anomaly.severity, anomaly.is_open = 14, "critical", False
        store.save_anomalies(run_id, "live", [anomaly], ids)
        store.save_anomalies(run_id, "replay", [anomaly])
        other = Anomaly("nonfinite", "loss", 20, 20, "critical", 1.0, float("nan"), "NaN loss")
        store.save_anomalies(run_id, "replay", [anomaly, other], replace=True)
        frame = store.anomalies("r")
        (aid,) = frame[frame["source"] == "live"]["id"].tolist()
        store.add_verdict("benign", anomaly_id=aid, note="data shard")
        with pytest.raises(ValueError, match="benign, real, watch"):
            store.add_verdict("fine", anomaly_id=aid)
        with pytest.raises(KeyError, match="no anomaly with id 999"):
            store.add_verdict("real", anomaly_id=999)
        after = store.anomalies("r", source="live")
    assert frame["source"].value_counts().to_dict() == {"live": 1, "replay": 2}
    live = frame[frame["source"] == "live"].iloc[0]
    assert (live["end_step"], live["severity"], live["is_open"]) == (14, "critical", False)
    assert after["verdict"].tolist() == ["benign"]


def test_drops_accumulate_by_reason(store_url):
    with open_store(store_url) as store:
        run_id, _ = store.start_run("r")
        store.record_drops(run_id, {"bad_value": 2})
        store.record_drops(run_id, {"bad_value": 3, "queue_full": 1})
        assert store.drops("r") == {"bad_value": 5, "queue_full": 1}


def test_runs_lists_points_series_and_attempts(store_url):
    with open_store(store_url) as store:
        run_id, a1 = store.start_run("r", project="p", config={"lr": 3e-4})
        sid = store.series_id(run_id, "loss")
        store.write(run_id, a1, {sid: _pts(range(5), np.ones(5))})
        store.start_run("r")
        runs = store.runs()
    row = runs.iloc[0]
    assert (row["name"], row["project"], row["attempts"], row["points"], row["last_step"]) == (
        "r",
        "p",
        2,
        5,
        4,
    )
    assert isinstance(runs, pd.DataFrame)


def test_a_runs_newest_points_are_raw_while_it_writes_and_sealed_when_it_finishes(db_path):
    import runwatch

    run = runwatch.init(name="sealed", store=str(db_path), cpu_wait=False)
    values = [3.0 / (s + 1) for s in range(40)]
    for step, value in enumerate(values):
        run.log({"loss": value, "lr": 1e-3}, step=step)
        if step % 10 == 9:
            run.flush()  # at least one open block per series per flush
    conn = sqlite3.connect(db_path)
    open_rows = conn.execute("SELECT sealed, substr(data, 1, 1) FROM point_blocks").fetchall()
    # The writer's own clock may write between two flushes too: more blocks, never fewer.
    assert len(open_rows) >= 8 and {r[0] for r in open_rows} == {0}
    assert {r[1] for r in open_rows} == {b"\x02"}  # raw: cheap for the writer
    with open_store(str(db_path), readonly=True) as store:
        while_open = store.read_series("sealed", "loss")
    run.finish()
    sealed = conn.execute("SELECT sealed, n, substr(data, 1, 1) FROM point_blocks").fetchall()
    assert sealed == [(1, 40, b"\x01")] * 2  # one compressed block per series
    with open_store(str(db_path), readonly=True) as store:
        done = store.read_series("sealed", "loss")
    assert done["value"].tolist() == values
    pd.testing.assert_frame_equal(done, while_open)


def test_sealing_a_short_series_leaves_the_next_points_open(db_path):
    store = open_store(str(db_path))
    run_id, attempt = store.start_run("short", project=None, config={}, resume=None)
    sid = store.series_id(run_id, "loss")
    store.write(run_id, attempt, {sid: _pts(range(5), np.arange(5.0))})
    store.seal_open_blocks(run_id)
    store.seal_open_blocks(run_id)  # nothing left to seal: no change
    store.write(run_id, attempt, {sid: _pts(range(5, 8), np.arange(5.0, 8.0))})
    rows = store._conn.execute("SELECT sealed, n FROM point_blocks ORDER BY id").fetchall()
    assert rows == [(1, 5), (0, 3)]
    assert store.read_series("short", "loss")["value"].tolist() == list(np.arange(8.0))
