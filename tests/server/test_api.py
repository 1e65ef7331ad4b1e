"""The HTTP API against a real server process: auth, limits, malformed bodies, dedup."""

from __future__ import annotations

import gzip
import hmac
import json
import subprocess
import sys
import uuid

import pytest

from runwatch.server.auth import TokenCheck
from runwatch.server.errors import ApiError
from runwatch.store import Store

from .conftest import TOKEN


def _start(client, name, **extra):
    extra.setdefault("client_id", f"c-{name}")
    reply = client.post("/api/v1/runs", json={"name": name, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()


def _batch(seq, client_id, attempt=1, n=3, metric="loss", start=0):
    return {
        "client_id": client_id,
        "seq": seq,
        "attempt": attempt,
        "series": [
            {
                "metric": metric,
                "labels": {"rank": 0, "host": "h"},
                "steps": list(range(start, start + n)),
                "times": [1.7e9 + i for i in range(n)],
                "values": [float(i) for i in range(n)],
            }
        ],
        "events": [],
    }


def _points(server, name):
    with Store(str(server.db), readonly=True) as store:
        runs = store.runs()
        return int(runs.loc[runs["name"] == name, "points"].sum()) if not runs.empty else 0


def test_writes_without_or_with_a_wrong_token_are_refused_and_name_the_header(shared_server):
    server = shared_server
    for token in (None, "wrong-token", TOKEN + "x"):
        with server.client(token) as client:
            reply = client.post("/api/v1/runs", json={"name": "noauth"})
        assert reply.status_code == 401
        assert reply.json()["field"] == "Authorization"
        assert TOKEN not in reply.text
    with server.client() as client:
        reply = client.post(
            "/api/v1/runs", json={"name": "noauth"}, headers={"Authorization": TOKEN}
        )
        assert reply.status_code == 401  # not "Bearer <token>"
        assert client.get("/api/v1/health").status_code == 200  # health needs no token
    assert _points(server, "noauth") == 0


def test_token_is_compared_in_constant_time(monkeypatch):
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((type(a), type(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    check = TokenCheck("s3cret")
    check("Bearer s3cret")
    with pytest.raises(ApiError) as refused:
        check("Bearer s3creX")
    assert calls == [(bytes, bytes), (bytes, bytes)]
    assert "s3cret" not in str(refused.value)


def test_a_batch_is_stored_once_however_often_it_is_retried(shared_server):
    server = shared_server
    with server.client() as client:
        run = _start(client, "dedup", client_id="dd")
        url = f"/api/v1/runs/{run['run_id']}/batches"
        first = client.post(url, json=_batch(0, "dd"))
        again = client.post(url, json=_batch(0, "dd"))
        older = client.post(url, json=_batch(0, "dd", start=100))
        assert first.json() == {"batches": 1, "stored": 1, "duplicates": 0, "points": 3}
        assert again.json()["duplicates"] == 1 and older.json()["duplicates"] == 1
        # the next run start of this client continues its sequence
        assert _start(client, "dedup", client_id="dd", launch_id="L")["next_seq"] == 1
    assert _points(server, "dedup") == 3


def test_gzip_and_ndjson_bodies_are_accepted(shared_server):
    with shared_server.client() as client:
        run = _start(client, "gz")
        lines = b"\n".join(json.dumps(_batch(s, "gz", start=10 * s)).encode() for s in range(4))
        reply = client.post(
            f"/api/v1/runs/{run['run_id']}/batches",
            content=gzip.compress(lines),
            headers={"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"},
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["stored"] == 4
        points = client.get(
            f"/api/v1/runs/{run['run_id']}/points",
            params={"metric": "loss", "rank": 0, "host": "h"},
        ).json()
    assert points["steps"] == [0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32]


@pytest.mark.parametrize(
    ("mutate", "status", "field"),
    [
        (lambda b: b["series"][0]["values"].__setitem__(1, "x"), 422, "series[0].values[1]"),
        (lambda b: b["series"][0]["steps"].__setitem__(2, True), 422, "series[0].steps[2]"),
        (lambda b: b["series"][0]["steps"].__setitem__(0, -1), 422, "series[0].steps[0]"),
        (lambda b: b["series"][0]["values"].pop(), 422, "series[0]"),
        (lambda b: b["series"][0]["labels"].__setitem__("zone", "x"), 422, "series[0].labels.zone"),
        (lambda b: b.pop("client_id"), 422, "client_id"),
        (lambda b: b["events"].append({"kind": "boom", "time": 1.0}), 422, "events[0].kind"),
        (lambda b: b.__setitem__("attempt", 7), 409, "attempt"),
    ],
)
def test_a_malformed_batch_gets_a_4xx_naming_the_field_and_stores_nothing(
    shared_server, mutate, status, field
):
    server = shared_server
    name = f"bad-{uuid.uuid4().hex[:8]}"
    with server.client() as client:
        run = _start(client, name)
        good = _batch(1, name, start=50)
        bad = _batch(0, name)
        mutate(bad)
        body = (json.dumps(good) + "\n" + json.dumps(bad)).encode()
        reply = client.post(
            f"/api/v1/runs/{run['run_id']}/batches",
            content=body,
            headers={"Content-Type": "application/x-ndjson"},
        )
    assert reply.status_code == status, reply.text
    expect = field if status == 409 else f"line 2: {field}"
    assert reply.json()["field"] == expect
    assert _points(server, name) == 0  # the good first line was not stored either


def test_malformed_json_oversized_and_unsupported_bodies_are_refused(shared_server):
    server = shared_server
    with server.client() as client:
        run = _start(client, "big")
        url = f"/api/v1/runs/{run['run_id']}/batches"
        bad_json = client.post(
            url, content=b'{"client_id": ', headers={"Content-Type": "application/json"}
        )
        assert bad_json.status_code == 400 and bad_json.json()["field"] == "body"
        huge = b'{"x": "' + b"a" * (33 * 2**20) + b'"}'
        too_big = client.post(url, content=huge, headers={"Content-Type": "application/json"})
        assert too_big.status_code == 413 and too_big.json()["field"] == "body"
        bomb = gzip.compress(b" " * (300 * 2**20))  # 300 MiB of spaces in 300 KB
        inflated = client.post(
            url,
            content=bomb,
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )
        assert inflated.status_code == 413
        xml = client.post(url, content=b"<a/>", headers={"Content-Type": "text/xml"})
        assert xml.status_code == 415 and xml.json()["field"] == "Content-Type"
        no_run = client.post("/api/v1/runs/999/batches", json=_batch(0, "big"))
        assert no_run.status_code == 404 and no_run.json()["field"] == "run_id"
    assert _points(server, "big") == 0


def test_ranks_of_one_launch_share_an_attempt_and_a_new_launch_is_a_restart(shared_server):
    server = shared_server
    with server.client() as client:
        first = [
            _start(client, "job", launch_id="L1", world_size=4, rank=r, client_id=f"k{r}")
            for r in range(4)
        ]
        assert {s["attempt"] for s in first} == {1}
        assert [s["how"] for s in first] == ["created", "joined", "joined", "joined"]
        second = [
            _start(client, "job", launch_id="L2", world_size=4, rank=r, client_id=f"k{r}")
            for r in range(4)
        ]
        assert {s["attempt"] for s in second} == {2}
        # in-process restart seen by every rank: the first makes attempt 3, the rest join it
        run_id = first[0]["run_id"]
        made = [
            client.post(
                f"/api/v1/runs/{run_id}/attempts", json={"from_attempt": 2, "step": 5}
            ).json()
            for _ in range(4)
        ]
        assert made == [{"attempt": 3, "created": True}] + [{"attempt": 3, "created": False}] * 3
        exists = client.post("/api/v1/runs", json={"name": "job", "resume": False})
        assert exists.status_code == 409 and exists.json()["field"] == "resume"
    with Store(str(server.db), readonly=True) as store:
        kinds = store.events("job")["kind"].tolist()
    assert kinds == ["start", "restart", "restart"]


def test_serve_refuses_insecure_on_a_public_address_and_needs_a_token(tmp_path):
    def serve(*args):
        return subprocess.run(
            [sys.executable, "-m", "runwatch.cli", "serve", "--db", str(tmp_path / "x.db"), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin"},
        )

    public = serve("--insecure", "--host", "0.0.0.0")
    assert public.returncode == 2 and "loopback" in public.stderr
    no_token = serve()
    assert no_token.returncode == 2 and "token" in no_token.stderr
