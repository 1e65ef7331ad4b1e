"""Step context in a real store: rows as written, exposure per value, context at steps."""

from __future__ import annotations

import numpy as np
import pytest

from runwatch.store import Store
from runwatch.store.context import StepContext


@pytest.fixture
def store(store_url):
    with Store(store_url) as s:
        yield s


def _points_to(store: Store, run_id: int, attempt: int, last: int, first: int = 0) -> None:
    sid = store.series_id(run_id, "loss")
    steps = np.arange(first, last + 1)
    store.write(run_id, attempt, {sid: (steps, steps * 1.0, np.ones(len(steps)))})


def test_contexts_come_back_by_step_with_dicts(store):
    run_id, attempt = store.start_run("r")
    store.add_context(
        run_id,
        attempt,
        [
            StepContext(40, None, 2.0, {"shard": "s2", "epoch": 1}),
            StepContext(0, None, 1.0, {"shard": "s1", "epoch": 1}),
        ],
    )
    frame = store.contexts("r")
    assert list(frame.columns) == ["step", "attempt", "rank", "time", "context"]
    assert frame["step"].tolist() == [0, 40]
    assert frame["context"].tolist() == [
        {"shard": "s1", "epoch": 1},
        {"shard": "s2", "epoch": 1},
    ]
    assert frame["attempt"].tolist() == [attempt, attempt]
    assert frame["rank"].isna().all()


def test_exposure_counts_steps_until_next_row_or_last_step(store):
    run_id, attempt = store.start_run("r")
    _points_to(store, run_id, attempt, 99)
    store.add_context(
        run_id,
        attempt,
        [
            StepContext(0, None, None, {"shard": "s1", "fp8": False}),
            StepContext(30, None, None, {"shard": "s2", "fp8": False}),
            StepContext(90, None, None, {"shard": "s1", "fp8": True}),
        ],
    )
    exposure = store.context_exposure("r")
    assert exposure == {"shard": {"s1": 30 + 10, "s2": 60}, "fp8": {False: 90, True: 10}}


def test_exposure_sums_ranks_each_until_its_own_next_row(store):
    run_id, attempt = store.start_run("r")
    _points_to(store, run_id, attempt, 9)
    store.add_context(
        run_id,
        attempt,
        [
            StepContext(0, 0, None, {"shard": "a"}),
            StepContext(0, 1, None, {"shard": "b"}),
            StepContext(5, 0, None, {"shard": "b"}),
        ],
    )
    assert store.context_exposure(run_id) == {"shard": {"a": 5, "b": 5 + 10}}


def test_context_at_reads_rank_rows_then_run_wide_rows(store):
    run_id, attempt = store.start_run("r")
    _points_to(store, run_id, attempt, 50)
    store.add_context(
        run_id,
        attempt,
        [
            StepContext(10, None, None, {"shard": "run-wide"}),
            StepContext(0, 3, None, {"shard": "r3-first"}),
            StepContext(20, 3, None, {"shard": "r3-second"}),
        ],
    )
    got = store.context_at("r", [5, 10, 25, 19, 20, None], [None, None, 3, 3, 7, 3])
    assert got == [
        {},
        {"shard": "run-wide"},
        {"shard": "r3-second"},
        {"shard": "r3-first"},
        {"shard": "run-wide"},
        {},
    ]


def test_context_at_without_run_wide_rows_reads_lowest_rank_for_no_rank(store):
    run_id, attempt = store.start_run("r")
    store.add_context(
        run_id,
        attempt,
        [StepContext(0, 2, None, {"k": "two"}), StepContext(0, 1, None, {"k": "one"})],
    )
    assert store.context_at("r", [4, 4], [None, 2]) == [{"k": "one"}, {"k": "two"}]


def test_restart_supersedes_the_earlier_attempts_later_rows(store):
    run_id, first = store.start_run("r")
    _points_to(store, run_id, first, 80)
    store.add_context(
        run_id,
        first,
        [StepContext(0, None, None, {"shard": "s1"}), StepContext(70, None, None, {"s": "x"})],
    )
    second = store.begin_attempt(run_id, 50, "restart")
    _points_to(store, run_id, second, 99, first=50)
    store.add_context(run_id, second, [StepContext(50, None, None, {"shard": "s9"})])
    assert len(store.contexts("r")) == 3  # every row is kept
    assert store.context_at("r", [49, 75], [None, None]) == [{"shard": "s1"}, {"shard": "s9"}]
    assert store.context_exposure("r") == {"shard": {"s1": 50, "s9": 50}}


def test_context_at_refuses_steps_and_ranks_of_different_lengths(store):
    store.start_run("r")
    with pytest.raises(ValueError, match="differ in length"):
        store.context_at("r", [1, 2], [None])


def test_a_failed_transaction_leaves_no_context_rows(store):
    run_id, attempt = store.start_run("r")
    with pytest.raises(RuntimeError), store.transaction():
        store.add_context(run_id, attempt, [StepContext(0, None, None, {"k": 1})])
        raise RuntimeError("boom")
    assert store.contexts("r").empty


def test_a_rank_without_rows_reads_the_lowest_ranks_when_none_are_run_wide(store):
    run_id, attempt = store.start_run("r")
    store.add_context(
        run_id,
        attempt,
        [StepContext(0, 0, None, {"shard": "zero"}), StepContext(0, 1, None, {"shard": "one"})],
    )
    assert store.context_at("r", [3, 3], [5, 1]) == [{"shard": "zero"}, {"shard": "one"}]
