"""Two ``runwatch serve`` processes on one PostgreSQL database: a batch retried through the
other server is stored once, because each server reads the client's sequence mark inside the
batch's own transaction (issue 20: exactly-once across replicas)."""

from __future__ import annotations

from runwatch.store import Store

from .conftest import ServerProcess
from .test_api import _batch, _start


def test_a_batch_retried_through_another_server_is_stored_once(token_file, pg_url):
    url = pg_url
    servers = []
    try:
        servers = [ServerProcess(url, token_file, "--no-detect") for _ in range(2)]
        for server in servers:
            server.start()
        a, b = (server.client() for server in servers)
        with a, b:
            run = _start(a, "r", client_id="c1")
            batches = f"/api/v1/runs/{run['run_id']}/batches"
            assert a.post(batches, json=_batch(0, "c1")).json()["stored"] == 1
            again = b.post(batches, json=_batch(0, "c1")).json()  # the client failed over
            assert (again["stored"], again["duplicates"]) == (0, 1)
            assert b.post(batches, json=_batch(1, "c1", start=3)).json()["stored"] == 1
            back = a.post(batches, json=_batch(1, "c1", start=3)).json()
            assert (back["stored"], back["duplicates"]) == (0, 1)
        with Store(url, readonly=True) as store:
            rows = store.read_points("r", all_attempts=True)
        assert rows["step"].tolist() == list(range(6))  # each point once
    finally:
        for server in servers:
            if server.proc is not None:
                server.stop()
