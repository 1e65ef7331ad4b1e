"""Real clients (Run + HttpBackend) against a real server: ranks, restarts, outages."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from runwatch.hook.ranks import keeps_metric, rank_labels
from runwatch.hook.run import Run
from runwatch.hook.transport import HttpBackend
from runwatch.store import Store

from .conftest import TOKEN


def _rank_run(server, name, rank, world, launch, tmp_path, **backend_options):
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
    backend = HttpBackend(
        server.url,
        TOKEN,
        launch_id=launch,
        world_size=world,
        rank=rank,
        host="node-a",
        spill_dir=tmp_path / "spill",
        **backend_options,
    )
    return Run(
        name,
        backend=backend,
        labels=rank_labels(env, host="node-a"),
        monitor=False,
        flush_interval=0.05,
        cpu_wait=False,  # ranks simulated by threads of one process
    )


def _log_steps(run, rank, steps, pace=0.0):
    for step in steps:
        metrics = {"loss": 1.0 / (step + 1), "grad_norm": 0.5, "step_time": 0.1 + rank}
        run.log({k: v for k, v in metrics.items() if keeps_metric(k, rank)}, step=step)
        if pace:
            time.sleep(pace)


def test_all_ranks_join_one_run_and_attempt_with_their_own_labels(server, tmp_path):
    runs = [_rank_run(server, "job", r, 4, "launch-1", tmp_path) for r in range(4)]
    threads = [
        threading.Thread(target=_log_steps, args=(run, r, range(300))) for r, run in enumerate(runs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for run in runs:
        run.finish()
    assert {run.run_id for run in runs} == {runs[0].run_id}
    with Store(str(server.db), readonly=True) as store:
        series = store.series("job")
        assert len(store.attempts("job")) == 1
    per_metric = series.groupby("metric")["rank"].apply(sorted).to_dict()
    assert per_metric == {"grad_norm": [0], "loss": [0], "step_time": [0, 1, 2, 3]}
    assert (series["points"] == 300).all() and set(series["host"]) == {"node-a"}


def test_a_job_restart_is_a_new_attempt_and_redone_steps_are_lost_work(server, tmp_path):
    first = [_rank_run(server, "rs", r, 2, "L1", tmp_path) for r in range(2)]
    for r, run in enumerate(first):
        _log_steps(run, r, range(100))
        run.finish(status="crashed")
    again = [_rank_run(server, "rs", r, 2, "L2", tmp_path) for r in range(2)]
    for r, run in enumerate(again):
        _log_steps(run, r, range(60, 120))  # resumed from the checkpoint at step 60
        run.finish()
    with Store(str(server.db), readonly=True) as store:
        assert store.attempts("rs")["attempt"].tolist() == [1, 2]
        assert "restart" in store.events("rs")["kind"].tolist()
        live = store.read_series("rs", "loss", {"rank": 0, "host": "node-a"})
        every = store.read_series("rs", "loss", {"rank": 0, "host": "node-a"}, all_attempts=True)
    assert live["step"].tolist() == list(range(120))
    assert live.loc[live["step"] >= 60, "attempt"].eq(2).all()
    lost = every[every["superseded"]]
    assert lost["step"].tolist() == list(range(60, 100)) and lost["attempt"].eq(1).all()


def test_server_killed_mid_run_and_restarted_loses_and_duplicates_nothing(server, tmp_path):
    runs = [_rank_run(server, "kill", r, 4, "K", tmp_path, max_backoff_s=0.5) for r in range(4)]
    steps = 600
    threads = [
        threading.Thread(target=_log_steps, args=(run, r, range(steps), 0.005))
        for r, run in enumerate(runs)
    ]
    for t in threads:
        t.start()
    time.sleep(1.0)
    server.kill()
    time.sleep(2.0)
    server.start()
    for t in threads:
        t.join()
    for run in runs:
        run.finish(timeout=30)
        assert run.stats()["dropped"] == {}
    with Store(str(server.db), readonly=True) as store:
        series = store.series("kill")
        for rec in series.to_dict(orient="records"):
            labels = {"rank": rec["rank"], "host": rec["host"]}
            got = store.read_series("kill", rec["metric"], labels, all_attempts=True)
            assert rec["points"] == steps, rec  # stored exactly once: no loss, no duplicate
            assert got["step"].tolist() == list(range(steps))
            assert np.all(np.diff(got["time"].to_numpy()) >= 0)  # in log order
    assert len(series) == 6


def test_a_client_outliving_the_server_past_its_spill_limit_says_what_it_dropped(
    server, tmp_path, caplog
):
    caplog.set_level(logging.WARNING, logger="runwatch")
    run = _rank_run(
        server, "outage", 0, 1, None, tmp_path, spill_limit_bytes=20_000, max_backoff_s=0.2
    )
    _log_steps(run, 0, range(50))
    run.flush()
    server.kill()
    for chunk in range(40):  # ~3 points a step, many flushes while the server is gone
        _log_steps(run, 0, range(50 + 50 * chunk, 100 + 50 * chunk))
        run.flush()
    dropped = run.stats()["dropped"].get("spill_full", 0)
    assert dropped > 0
    spilled = run._backend.spill.points
    assert spilled > 0
    server.start()
    run.finish(timeout=30)
    logged = run.stats()["logged"]
    with Store(str(server.db), readonly=True) as store:
        stored = int(store.series("outage")["points"].sum())
        drops = store.drops("outage")
    assert stored + dropped == logged
    assert drops.get("spill_full") == dropped
    text = caplog.text
    assert "spill_full" in text and f"dropped {dropped} points" in text
    assert TOKEN not in text
