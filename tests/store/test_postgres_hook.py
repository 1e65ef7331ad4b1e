"""``runwatch.init(store="postgresql://...")``: the hook writes to a real PostgreSQL database,
with live detection, and no message shows the URL's password."""

from __future__ import annotations

import logging

import runwatch


def test_a_run_logs_into_postgresql_with_live_detection(pg_url, caplog):
    caplog.set_level(logging.DEBUG, logger="runwatch")
    run = runwatch.init(name="pg-run", store=pg_url, cpu_wait=False)
    for step in range(50):
        run.log({"loss": 3.0 / (step + 1)}, step=step)
    run.log({"loss": float("nan")}, step=50)
    run.finish()
    with runwatch.open_store(pg_url, readonly=True) as store:
        assert store.read_series("pg-run", "loss")["step"].tolist() == list(range(51))
        found = store.anomalies("pg-run")
    assert found[["detector", "start_step"]].values.tolist() == [["nonfinite", 50]]
    password = pg_url.split(":")[2].split("@")[0]
    assert password not in caplog.text
