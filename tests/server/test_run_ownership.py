"""Two ``runwatch serve`` replicas with live detection on one PostgreSQL database: each run's
Monitor runs on one of them; when that one is SIGKILLed the other takes the run over, and
the run's live anomalies equal a replay of the whole run, none lost or doubled (issue 20)."""

from __future__ import annotations

import json
import math
import time

import pytest

from runwatch.pipeline.analysis import analyze_run
from runwatch.store import Store
from runwatch.store.run_locks import run_owner

from .conftest import ServerProcess
from .test_api import _start

STEPS = 600
SPIKE_AT = 150
NAN_AT = 450


def _loss(step: int) -> float:
    if step == NAN_AT:
        return math.nan
    base = 1.0 + 3.0 * math.exp(-step / 120) + 0.02 * math.sin(step * 1.7)
    return base * (4.0 if step == SPIKE_AT else 1.0)


def _post(client, run_id: int, seq: int, start: int, n: int = 50) -> None:
    steps = list(range(start, start + n))
    batch = {
        "client_id": "c1",
        "seq": seq,
        "attempt": 1,
        "series": [
            {
                "metric": "loss",
                "labels": {"rank": 0, "host": "h"},
                "steps": steps,
                "times": [1.7e9 + s for s in steps],
                "values": [_loss(s) for s in steps],
            }
        ],
        "events": [],
    }
    reply = client.post(  # json.dumps writes NaN, as the hook does
        f"/api/v1/runs/{run_id}/batches",
        content=json.dumps(batch),
        headers={"Content-Type": "application/json"},
    )
    assert reply.status_code == 200, reply.text


def _wait(what, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what.__name__}")


def _shape(anomalies) -> list[tuple]:
    return sorted((a[0], a[1], int(a[2]), int(a[3]), a[4]) for a in anomalies)


def test_a_killed_owner_hands_the_run_over_and_live_equals_replay(token_file, pg_url):
    url = pg_url
    servers: list[ServerProcess] = []
    try:
        servers = [ServerProcess(url, token_file) for _ in range(2)]
        for server in servers:
            server.start()
        clients = [server.client() for server in servers]
        run_id = _start(clients[0], "r", client_id="c1")["run_id"]
        # A balancer's round robin: batches alternate between the replicas.
        for seq, start in enumerate(range(0, 300, 50)):
            _post(clients[seq % 2], run_id, seq, start)

        def owner() -> int | None:
            return run_owner(url, run_id)

        first = _wait(owner)
        by_pid = {s.proc.pid: s for s in servers}
        assert first in by_pid  # one of the two replicas owns it, not both

        def spike_stored() -> bool:
            with Store(url, readonly=True) as store:
                live = store.anomalies("r", source="live")
            return bool((live["detector"] == "spike").any())

        _wait(spike_stored)
        by_pid[first].kill()
        survivor = next(s for s in servers if s.proc.pid != first)
        client = clients[servers.index(survivor)]
        for seq, start in enumerate(range(300, STEPS, 50), start=6):
            _post(client, run_id, seq, start)
        assert _wait(owner) == survivor.proc.pid
        reply = client.post(f"/api/v1/runs/{run_id}/finish", json={"status": "finished"})
        assert reply.status_code == 200, reply.text
        _wait(lambda: owner() is None)  # the owner read the finish and let the run go
        with Store(url, readonly=True) as store:
            live = store.anomalies("r", source="live")
            replay = analyze_run(store, "r", save=False).anomalies
        rows = list(
            zip(
                live["detector"], live["metric"], live["start_step"], live["end_step"],
                live["severity"], strict=True,
            )
        )  # fmt: skip
        assert len(set((r[0], r[1], r[2]) for r in rows)) == len(rows)  # none doubled
        assert not live["is_open"].any()
        expected = [(a.detector, a.metric, a.start_step, a.end_step, a.severity) for a in replay]
        assert _shape(rows) == _shape(expected)
        assert {"spike", "nonfinite"} <= set(live["detector"])
    finally:
        for server in servers:
            if server.proc is not None and server.proc.poll() is None:
                server.stop()
