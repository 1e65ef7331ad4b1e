"""A rank other than 0: what it keeps (``per_rank``), what it drops (counted, named once),
and ``run.section`` timing its own work, through the real hook and store."""

from __future__ import annotations

import logging
import time

import runwatch


def test_a_non_zero_rank_keeps_per_rank_metrics_and_counts_what_it_drops(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    db = str(tmp_path / "r.db")
    caplog.set_level(logging.WARNING, logger="runwatch")
    run = runwatch.init(name="ddp", store=db, per_rank=["compute_time"], cpu_wait=False)
    for step in range(20):
        run.log({"loss": 1.0, "compute_time": 0.01}, step=step)
    run.finish()
    assert run.stats()["dropped"] == {"other_rank": 20}
    warnings = [r.getMessage() for r in caplog.records if "does not keep" in r.getMessage()]
    assert len(warnings) == 1 and "'loss'" in warnings[0] and "per_rank" in warnings[0]
    with runwatch.open_store(db, readonly=True) as store:
        assert set(store.series("ddp")["metric"]) == {"compute_time"}


def test_run_section_logs_each_steps_own_time_and_wait(tmp_path):
    db = str(tmp_path / "s.db")
    run = runwatch.init(name="loop", store=db, cpu_wait=False)
    for step in range(5):
        with run.section("compute"):
            time.sleep(0.02)
        with run.section("wait"):
            time.sleep(0.005)
        run.log({"loss": 1.0}, step=step)
    run.finish()
    with runwatch.open_store(db, readonly=True) as store:
        compute = store.read_series("loop", "step_time_compute")
        wait = store.read_series("loop", "comm_wait_time")
    assert compute["step"].tolist() == wait["step"].tolist() == list(range(5))
    assert (compute["value"] >= 0.02).all() and (wait["value"] >= 0.005).all()
    assert (compute["value"] > wait["value"]).all()
