"""Hypotheses for a stored run's incidents: exposure from its ranks, hosts and step context."""

from __future__ import annotations

import numpy as np

from runwatch.model import Event
from runwatch.pipeline.incidents import refresh_incidents
from runwatch.store import open_store
from runwatch.store.context import StepContext


def _store_run(store, crashes) -> int:
    """A run of 8 ranks on 4 hosts whose shard changes every 100 steps (s00..s29), and a
    crash per ``(step, rank, host, message)``, each ending an attempt."""
    run_id, attempt = store.start_run("r")
    rows = [
        StepContext(s, None, float(s), {"shard": f"s{s // 100:02d}"}) for s in range(0, 3000, 100)
    ]
    store.add_context(run_id, attempt, rows)
    for rank in range(8):
        store.series_id(run_id, "step_time", {"rank": rank, "host": f"n{rank // 2}"})
    for i, (step, rank, host, message) in enumerate(crashes):  # each crash ends an attempt
        crash = Event("crash", step, 100.0 * (i + 1), message, rank=rank, host=host)
        store.add_events(run_id, attempt, [crash])
        attempt = store.begin_attempt(run_id, step - 50, "restart")
        # The restarted process logs its context again from where it resumed.
        resumed = [StepContext(step - 50, None, None, {"shard": f"s{(step - 50) // 100:02d}"})]
        store.add_context(run_id, attempt, resumed + [r for r in rows if r.step > step - 50])
    store.set_run_status(run_id, "crashed")
    with store.transaction() as conn:
        conn.execute("UPDATE runs SET last_step = 2999 WHERE id = ?", (run_id,))
    return run_id


def test_crashes_in_one_shard_on_every_host_blame_the_shard(tmp_path):
    rng = np.random.default_rng(3)
    crashes = [
        (
            1700 + int(rng.integers(0, 100)),
            r,
            f"n{r // 2}",
            f"IndexError: index {50257 + r} is out of bounds",
        )
        for r in range(8)
    ]
    with open_store(str(tmp_path / "rw.db")) as store:
        _store_run(store, crashes)
        refresh_incidents(store, "r", "live")
        (row,) = store.incidents("r").itertuples(index=False)
    top = row.hypotheses[0]
    assert top["cause"] == "shard=s17"
    assert top["score"] >= 2.0
    assert "8 of 8 crashes" in top["evidence"] and "spread over 4 hosts" in top["evidence"]
    assert row.details["summary"].startswith("likely shard=s17")


def test_crashes_on_one_host_blame_the_host_not_a_shard(tmp_path):
    crashes = [
        (
            150 + 290 * i,
            4 + i % 2,
            "n2",
            "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
        )
        for i in range(8)
    ]
    with open_store(str(tmp_path / "rw.db")) as store:
        _store_run(store, crashes)
        refresh_incidents(store, "r", "live")
        (row,) = store.incidents("r").itertuples(index=False)
    assert row.hypotheses[0]["cause"] == "host=n2"
    assert not any(h["cause"].startswith("shard=") and h["score"] >= 2 for h in row.hypotheses)
