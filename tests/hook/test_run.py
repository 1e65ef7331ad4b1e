"""The logging hook in-process: semantics of log/event/finish, bad input, failing stores."""

from __future__ import annotations

import logging
import os
import sqlite3
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import runwatch
from runwatch.hook.values import MAX_NAME_LENGTH, RefusedValue, name_problem, to_float


class FakeTensor:
    """Duck-typed like a torch tensor: .numel() and .item(), no torch import needed."""

    def __init__(self, values):
        self._values = list(values)

    def numel(self):
        return len(self._values)

    def item(self):
        if len(self._values) != 1:
            raise RuntimeError("a Tensor with 2 elements cannot be converted to Scalar")
        return self._values[0]


def _series(db_path, run, metric):
    with runwatch.open_store(str(db_path), readonly=True) as store:
        return store.read_series(run, metric)


def test_log_auto_increments_steps_like_wandb(db_path):
    with runwatch.init(name="r", store=db_path) as run:
        run.log({"loss": 3.0})
        run.log({"loss": 2.0})
        run.log({"loss": 1.5}, step=10)
        run.log({"loss": 1.0})
    got = _series(db_path, "r", "loss")
    assert got["step"].tolist() == [0, 1, 10, 11]
    assert got["value"].tolist() == [3.0, 2.0, 1.5, 1.0]


def test_nan_and_inf_are_stored_as_they_are(db_path):
    with runwatch.init(name="r", store=db_path) as run:
        run.log({"loss": float("nan"), "gn": float("inf")}, step=1)
        run.log({"loss": np.float32("nan"), "gn": -np.inf}, step=2)
    assert np.isnan(_series(db_path, "r", "loss")["value"]).all()
    assert _series(db_path, "r", "gn")["value"].tolist() == [np.inf, -np.inf]


def test_numpy_scalars_zero_d_arrays_and_tensors_are_numbers(db_path):
    with runwatch.init(name="r", store=db_path) as run:
        run.log(
            {
                "a": np.float16(0.5),
                "b": np.int64(7),
                "c": np.array(2.5),
                "d": FakeTensor([1.25]),
                "e": True,
                "f": np.bool_(False),
            },
            step=0,
        )
    for metric, expected in {"a": 0.5, "b": 7, "c": 2.5, "d": 1.25, "e": 1, "f": 0}.items():
        assert _series(db_path, "r", metric)["value"].tolist() == [expected]


def test_values_that_are_not_numbers_are_refused_counted_and_warned_once(db_path, caplog):
    caplog.set_level(logging.WARNING, logger="runwatch")
    with runwatch.init(name="r", store=db_path) as run:
        for step in range(3):
            run.log(
                {
                    "loss": 1.0,
                    "acc": "0.5",
                    "t": FakeTensor([1, 2]),
                    "n": None,
                    "l": [1.0],
                    "d": {"x": 1},
                },
                step=step,
            )
        run.flush()
        stats = run.stats()
    assert stats["dropped"] == {"bad_value": 15}
    warnings = [r.getMessage() for r in caplog.records if "got a" in r.getMessage()]
    assert len(warnings) == 5  # one per metric name, not per point
    assert any("'acc' got a str" in w for w in warnings)
    assert any("'t' got a FakeTensor with 2 elements" in w for w in warnings)
    assert _series(db_path, "r", "loss")["value"].tolist() == [1.0, 1.0, 1.0]
    with runwatch.open_store(str(db_path)) as store:
        assert store.drops("r") == {"bad_value": 15}


def test_bad_metric_names_are_refused(db_path, caplog):
    caplog.set_level(logging.WARNING, logger="runwatch")
    with runwatch.init(name="r", store=db_path) as run:
        run.log({"": 1.0, "x" * (MAX_NAME_LENGTH + 1): 1.0, "a\x00b": 1.0, 5: 1.0, "ok": 1.0})
        run.flush()
        assert run.stats()["dropped"] == {"bad_name": 4}
    assert any("is empty" in r.getMessage() for r in caplog.records)


def test_log_never_raises_on_nonsense(db_path):
    with runwatch.init(name="r", store=db_path) as run:
        run.log(None)
        run.log(3.0)
        run.log({"loss": 1.0}, step="ten")
        run.log({"loss": 1.0}, step=-4)
        run.log({"loss": 2.0}, step=np.int64(5))
        run.flush()
        dropped = run.stats()["dropped"]
    assert dropped["not_a_dict"] == 2 and dropped["bad_step"] == 2
    assert _series(db_path, "r", "loss")["step"].tolist() == [5]


def test_a_refused_call_with_a_length_leaves_nothing_pending(db_path):
    # A str or list has a len() but no dict copy: it is dropped, not counted as queued, so
    # flush() does not wait for points that will never come.
    with runwatch.init(name="r", store=db_path) as run:
        run.log({"loss": 1.0})
        run.log("loss")
        run.log([("loss", 1.0)])
        assert run.flush(timeout=5.0)
        stats = run.stats()
    assert stats["pending"] == 0 and stats["logged"] == 1
    assert stats["dropped"] == {"not_a_dict": 2}


def test_a_refused_call_with_a_context_leaves_nothing_pending(db_path):
    with runwatch.init(name="r", store=db_path, monitor=False) as run:
        run.log("loss", context={"shard": "s1"})
        run.log({"loss": 1.0}, context={"shard": "s2"})
        assert run.flush(timeout=5.0)
        stats = run.stats()
    assert stats["pending"] == 0 and stats["dropped"] == {"not_a_dict": 1}


def test_a_lower_step_starts_a_new_attempt_and_the_latest_wins(db_path):
    with runwatch.init(name="r", store=db_path) as run:
        for step in range(10):
            run.log({"loss": 1.0}, step=step)
        for step in range(5, 8):  # resumed from the checkpoint at step 5
            run.log({"loss": 2.0}, step=step)
        run.flush()
        assert run.stats()["attempt"] == 2
    got = _series(db_path, "r", "loss")
    assert got["value"].tolist() == [1.0] * 5 + [2.0] * 3
    with runwatch.open_store(str(db_path)) as store:
        events = store.events("r")
        assert "restart" in events["kind"].tolist()
        assert len(store.read_series("r", "loss", all_attempts=True)) == 13


def test_same_name_resumes_as_a_new_attempt(db_path):
    with runwatch.init(name="r", store=db_path) as run:
        run.log({"loss": 1.0}, step=0)
    with runwatch.init(name="r", store=db_path, resume=True) as run:
        run.log({"loss": 0.5}, step=1)
        run.flush()
        assert run.stats()["attempt"] == 2
    with pytest.raises(runwatch.store.RunExistsError):
        runwatch.init(name="r", store=db_path, resume=False)


def test_events_are_stored_with_step_and_attributes(db_path):
    with runwatch.init(name="r", store=db_path) as run:
        run.log({"loss": 1.0}, step=41)
        run.event("checkpoint", message="saved", path="/ckpt/41")
        run.event("xid", step=40, message="Xid 79", rank=3, host="node7", xid=79)
        with pytest.raises(ValueError, match="valid: start"):
            run.event("kaboom")
    with runwatch.open_store(str(db_path)) as store:
        events = store.events("r", kinds=["checkpoint", "xid"])
    assert events["step"].tolist() == [41, 40]
    assert events.iloc[1]["rank"] == 3 and events.iloc[1]["host"] == "node7"
    assert '"xid": 79' in events.iloc[1]["attrs"]


def test_exception_in_the_with_block_marks_the_run_crashed(db_path):
    with pytest.raises(ZeroDivisionError), runwatch.init(name="r", store=db_path) as run:
        run.log({"loss": 1.0})
        1 / 0  # noqa: B018
    with runwatch.open_store(str(db_path)) as store:
        assert store.runs().iloc[0]["status"] == "crashed"
        crash = store.events("r", kinds=["crash"])
        assert "ZeroDivisionError" in crash.iloc[0]["message"]


def test_log_after_finish_is_counted_not_raised(db_path):
    run = runwatch.init(name="r", store=db_path)
    run.finish()
    run.log({"loss": 1.0})
    assert run.stats()["dropped"] == {"finished": 1}


def test_queue_bound_drops_and_counts_instead_of_blocking(db_path):
    run = runwatch.init(name="r", store=db_path, max_pending_points=10, flush_interval=5.0)
    for step in range(10_000):
        run.log({"a": 1.0, "b": 2.0}, step=step)
    stats = run.stats()
    run.finish()
    assert stats["dropped"].get("queue_full", 0) > 0
    assert stats["logged"] + stats["dropped"]["queue_full"] == 20_000


def test_locked_store_costs_no_crash_and_counts_drops(db_path, caplog):
    caplog.set_level(logging.WARNING, logger="runwatch")
    run = runwatch.init(name="r", store=db_path, store_retries=1)
    blocker = sqlite3.connect(db_path, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        run.log({"loss": 1.0}, step=1)
        run.flush(timeout=30)
        assert run.stats()["dropped"] == {"store_error": 1}
    finally:
        blocker.rollback()
        blocker.close()
    run.log({"loss": 2.0}, step=2)  # the store is back: the run goes on
    run.finish()
    assert _series(db_path, "r", "loss")["value"].tolist() == [2.0]
    assert any("database is locked" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("pragma", "error"),
    [("PRAGMA query_only = 1", "readonly"), ("PRAGMA max_page_count = 1", "full")],
)
def test_read_only_or_full_store_costs_no_crash(db_path, caplog, pragma, error):
    caplog.set_level(logging.WARNING, logger="runwatch")
    # The writer in this process (live_detection="thread"), so that the test can reach its
    # connection; in live detection's process it is the same Writer, and the locked and
    # deleted store tests reach it there.
    run = runwatch.init(name="r", store=db_path, store_retries=0, live_detection="thread")
    run.log({"loss": 1.0}, step=0)
    run.flush()
    # a real SQLite read-only / disk-full condition on the writer's own connection
    if "max_page_count" in pragma:
        pages = run._backend.store._conn.execute("PRAGMA page_count").fetchone()[0]
        pragma = f"PRAGMA max_page_count = {pages}"
    run._backend.store._conn.execute(pragma)
    for step in range(1, 2000):
        run.log({"loss": float(step), "x": np.random.default_rng(step).random()}, step=step)
    run.flush()
    run.finish()
    assert run.stats()["dropped"].get("store_error", 0) > 0
    assert any(error in r.getMessage() for r in caplog.records)


def test_deleted_store_is_detected_and_counted(db_path, caplog):
    caplog.set_level(logging.WARNING, logger="runwatch")
    run = runwatch.init(name="r", store=db_path)
    run.log({"loss": 1.0}, step=0)
    run.flush()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{db_path}{suffix}"):
            os.remove(f"{db_path}{suffix}")
    run.log({"loss": 2.0}, step=1)
    run.flush()
    run.finish()
    assert run.stats()["dropped"] == {"store_gone": 1}
    assert any("deleted" in r.getMessage() for r in caplog.records)


def test_unopenable_store_disables_the_run_without_raising(tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="runwatch")
    run = runwatch.init(name="r", store=tmp_path / "no" / "such" / "dir" / "x.db")
    run.log({"loss": 1.0})
    run.finish()
    assert run.stats()["dropped"] == {"store_error": 1}
    assert any(
        "x.db" in r.getMessage() and "will not be recorded" in r.getMessage()
        for r in caplog.records
    )


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(-(2**80), 2**80), st.floats(), st.booleans()))
def test_every_python_number_coerces_or_is_refused_cleanly(value):
    try:
        result = to_float(value)
    except RefusedValue as refused:
        assert "too large" in refused.kind
        return
    assert isinstance(result, float)
    if isinstance(value, float):
        assert result == value or (result != result and value != value)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.none(), st.lists(st.floats()), st.binary()))
def test_non_numbers_are_refused(value):
    with pytest.raises(RefusedValue):
        to_float(value)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_name_validation_matches_its_rules(name):
    problem = name_problem(name)
    bad = (
        not name.strip()
        or len(name) > MAX_NAME_LENGTH
        or any(ord(c) < 32 or ord(c) == 127 for c in name)
    )
    assert (problem is not None) == bad


def test_collector_points_get_their_own_labels_and_never_start_an_attempt(db_path):
    with runwatch.init(name="r", store=db_path, labels={"host": "n1"}) as run:
        run.log({"loss": 2.0}, step=100)
        run.log_labeled({"gpu_temp_c": 61.0}, {"gpu": 0})
        run.log_labeled({"gpu_temp_c": 75.0}, {"gpu": 1}, step=3)  # a late reading
        run.log({"loss": 1.9}, step=101)
        run.flush()
        assert run.stats()["attempt"] == 1
    with runwatch.open_store(str(db_path)) as store:
        series = store.series("r").set_index(["metric", "gpu"])
        assert series.loc[("gpu_temp_c", 1), "host"] == "n1"
        gpu0 = store.read_series("r", "gpu_temp_c", {"host": "n1", "gpu": 0})
        gpu1 = store.read_series("r", "gpu_temp_c", {"host": "n1", "gpu": 1})
    assert (gpu0["step"].tolist(), gpu0["value"].tolist()) == ([100], [61.0])
    assert (gpu1["step"].tolist(), gpu1["value"].tolist()) == ([3], [75.0])


def test_system_metrics_option_collects_host_readings(db_path):
    with runwatch.init(
        name="r", store=db_path, system_metrics=True, system_metrics_interval=0.05
    ) as run:
        for step in range(5):
            run.log({"loss": 1.0}, step=step)
        deadline = time.monotonic() + 20
        while run._extras.sampler.polls < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    with runwatch.open_store(str(db_path)) as store:
        metrics = set(store.series("r")["metric"])
    assert any(m.startswith("host_") for m in metrics), metrics
