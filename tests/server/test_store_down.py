"""``runwatch serve`` on PostgreSQL when the database goes away: 503 with Retry-After, not 500,
and what was stored before is still there when the database comes back."""

from __future__ import annotations

import httpx
import pytest

from runwatch.store import Store
from runwatch.store.postgres_local import LocalCluster, find_bindir

from .conftest import ServerProcess
from .test_api import _batch, _start


def test_a_database_gone_mid_run_answers_503_then_takes_the_retry(tmp_path, token_file):
    if find_bindir() is None:
        pytest.fail("PostgreSQL server binaries not found: apt-get install postgresql")
    # fsync on: a crash of a test cluster without it loses commits (the run's row), which a
    # real database would not.
    cluster = LocalCluster(fsync=True).start()
    server = None
    try:
        url = cluster.create_database("served")
        server = ServerProcess(url, token_file, "--no-detect")
        server.start()
        # The server waits up to its connect timeout (10 s) for the database before saying 503.
        with server.client() as client:
            client.timeout = httpx.Timeout(40.0)
            run = _start(client, "r", client_id="c1")
            batches = f"/api/v1/runs/{run['run_id']}/batches"
            assert client.post(batches, json=_batch(0, "c1")).status_code == 200
            cluster.pause()
            down = client.post(batches, json=_batch(1, "c1", start=3))
            assert down.status_code == 503, down.text
            assert down.headers["Retry-After"] == "1"
            assert down.json()["error"] == "store unavailable"
            assert cluster.password not in down.text  # the URL's password is never echoed
            cluster.resume()
            again = client.post(batches, json=_batch(1, "c1", start=3))
            assert again.status_code == 200, again.text
        with Store(url, readonly=True) as store:
            assert store.read_series("r", "loss")["step"].tolist() == list(range(6))
    finally:
        if server is not None:
            server.stop()
        cluster.stop()
