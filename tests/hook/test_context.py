"""Step context from the hook: run.log(context=) and run.context(), in a real SQLite store
and through a real ``runwatch serve``."""

from __future__ import annotations

import gzip
import json
import logging

import numpy as np
import pandas as pd
import pytest

import runwatch
from runwatch.store import open_store

from ..server.conftest import TOKEN, ServerProcess, server, token_file  # noqa: F401


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(name, raising=False)


def _rows(db, run="r"):
    """(step, rank or None, context) of each stored row."""
    with open_store(str(db), readonly=True) as store:
        frame = store.contexts(run)
    ranks = [None if r is pd.NA else int(r) for r in frame["rank"].tolist()]
    return list(zip(frame["step"].tolist(), ranks, frame["context"].tolist(), strict=True))


def test_an_unchanged_context_is_stored_once_and_each_change_once(tmp_path):
    db = tmp_path / "ctx.db"
    with runwatch.init("r", store=db, monitor=False) as run:
        context = {"shard": "s1", "source": "web"}
        for step in range(100):
            if step == 40:
                context = {"shard": "s2", "source": "web"}
            if step == 70:
                context["shard"] = "s3"  # the same dict, changed in place
            run.log({"loss": 1.0}, step=step, context=context)
    assert _rows(db) == [
        (0, None, {"shard": "s1", "source": "web"}),
        (40, None, {"shard": "s2", "source": "web"}),
        (70, None, {"shard": "s3", "source": "web"}),
    ]


def test_run_context_merges_from_the_next_logged_step_and_none_removes(tmp_path):
    db = tmp_path / "ctx.db"
    with runwatch.init("r", store=db, monitor=False) as run:
        run.log({"loss": 1.0}, step=0)
        run.context(shard="s1", epoch=0)
        run.log({"loss": 1.0}, step=1)
        run.log({"loss": 1.0}, step=2)
        run.context({"data/source": "books"}, epoch=1)
        run.context(shard=None)
        run.log({"loss": 1.0}, step=5)
        run.log({"loss": 1.0}, step=6, context={"epoch": 1})  # no change: nothing stored
    assert _rows(db) == [
        (1, None, {"shard": "s1", "epoch": 0}),
        (5, None, {"epoch": 1, "data/source": "books"}),
    ]


def test_refused_values_are_counted_and_the_good_keys_kept(tmp_path, caplog):
    db = tmp_path / "ctx.db"
    caplog.set_level(logging.WARNING, logger="runwatch.hook")
    with runwatch.init("r", store=db, monitor=False) as run:
        run.log({"loss": 1.0}, step=0, context={"shard": "s1", "ids": [1, 2]})
        run.log({"loss": 1.0}, step=1, context="s2")
        run.log({"loss": 1.0}, step=2, context={"shard": float("nan"), "arr": np.ones(3)})
        run.context(**{"": 1})
        run.log({"loss": 1.0}, step=3, context={"shard": np.float64(2.5), "ok": True})
        run.flush()
        dropped = run.stats()["dropped"]
    assert dropped == {"bad_context": 5}
    assert _rows(db) == [(0, None, {"shard": "s1"}), (3, None, {"shard": 2.5, "ok": True})]
    assert "step context 'ids': value is a list" in caplog.text
    assert "context= needs a dict of str, int, float or bool values; got a str" in caplog.text
    with open_store(str(db), readonly=True) as store:
        assert store.drops("r") == {"bad_context": 5}
        assert len(store.read_series("r", "loss")) == 4  # the points were all kept


def test_a_rank_stores_its_own_context_and_a_restart_stores_it_again(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    db = tmp_path / "ctx.db"
    with runwatch.init("r", store=db, monitor=False, all_ranks=True) as run:
        for step in range(10):
            run.log({"loss": 1.0}, step=step, context={"shard": "a" if step < 6 else "b"})
        for step in range(5, 8):  # resumed from a checkpoint at step 5
            run.log({"loss": 1.0}, step=step, context={"shard": "b"})
    with open_store(str(db), readonly=True) as store:
        frame = store.contexts("r")
        at = store.context_at("r", [5, 7], [3, 3])
    assert frame[["step", "attempt", "rank"]].values.tolist() == [[0, 1, 3], [5, 2, 3], [6, 1, 3]]
    assert frame["context"].tolist() == [{"shard": "a"}, {"shard": "b"}, {"shard": "b"}]
    assert at == [{"shard": "b"}, {"shard": "b"}]  # the restarted attempt's context wins


def test_context_through_runwatch_serve_per_rank(
    server: ServerProcess,  # noqa: F811
    monkeypatch,
    tmp_path,
):
    monkeypatch.setenv("RUNWATCH_LAUNCH_ID", "job-7")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RUNWATCH_SPILL_DIR", str(tmp_path / "spill"))
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        with runwatch.init(name="ddp", url=server.url, token=TOKEN) as run:
            for step in range(30):
                shard = f"r{rank}-{step // 10}"
                run.log({"loss": 3.0, "step_time_s": 0.5}, step=step, context={"shard": shard})
            assert run.stats()["dropped"] == {}
    with open_store(str(server.db), readonly=True) as store:
        frame = store.contexts("ddp")
        exposure = store.context_exposure("ddp")
    got = sorted(zip(frame["rank"].tolist(), frame["step"].tolist(), strict=True))
    assert got == [(0, 0), (0, 10), (0, 20), (1, 0), (1, 10), (1, 20)]
    assert set(frame["attempt"].tolist()) == {1}
    assert exposure == {"shard": {f"r{r}-{i}": 10 for r in (0, 1) for i in range(3)}}


def test_a_retried_batch_stores_its_context_once(server: ServerProcess):  # noqa: F811
    with server.client() as http:
        started = http.post("/api/v1/runs", json={"name": "retry", "client_id": "c-1"}).json()
        body = {
            "client_id": "c-1",
            "seq": started["next_seq"],
            "attempt": started["attempt"],
            "series": [{"metric": "loss", "steps": [0], "times": [1.0], "values": [2.0]}],
            "contexts": [{"step": 0, "rank": 1, "time": 1.0, "context": {"shard": "s9"}}],
        }
        data = gzip.compress(json.dumps(body).encode())
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        url = f"/api/v1/runs/{started['run_id']}/batches"
        replies = [http.post(url, content=data, headers=headers).json() for _ in range(2)]
        bad = dict(body, seq=body["seq"] + 1, contexts=[{"step": 1, "context": {"k": [1]}}])
        refused = http.post(url, json=bad)
    assert [r["stored"] for r in replies] == [1, 0]
    assert refused.status_code == 422
    with open_store(str(server.db), readonly=True) as store:
        frame = store.contexts("retry")
    assert frame["context"].tolist() == [{"shard": "s9"}]
    assert frame["rank"].tolist() == [1]


def test_a_context_holds_at_most_100_keys(tmp_path):
    db = tmp_path / "ctx.db"
    with runwatch.init("r", store=db, monitor=False) as run:
        run.log({"loss": 1.0}, step=0, context={f"k{i}": i for i in range(101)})
        run.flush()
        assert run.stats()["dropped"] == {"bad_context": 1}
    (row,) = _rows(db)
    assert len(row[2]) == 100 and "k100" not in row[2]


def test_the_module_level_log_passes_the_context_on(tmp_path):
    import runwatch
    from runwatch.store import open_store

    db = str(tmp_path / "rw.db")
    with runwatch.init(name="module", store=db, monitor=False):
        runwatch.log({"loss": 1.0}, step=0, context={"shard": "s01"})
        runwatch.log({"loss": 0.9}, step=1, context={"shard": "s02"})
    with open_store(db) as store:
        assert [c["shard"] for c in store.contexts("module")["context"]] == ["s01", "s02"]
