"""Fixtures for alerting: a fake clock, a real HTTP receiver on 127.0.0.1, rules files."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runwatch.alerting.channels import (
    KEY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    verify_signature,
)
from runwatch.model import Anomaly


class FakeClock:
    """``clock()`` returns ``now``; tests move it with ``advance``."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Receiver:
    """A real webhook receiver: answers per a script of modes, records what arrived.

    Modes: ``ok`` (200), ``500``, ``400``, ``429``, ``hang`` (sleeps ``hang_for`` s, then
    200 -- the sender has timed out by then). ``stop()`` closes the socket so connections
    are refused; ``start()`` binds the same port again.
    """

    def __init__(self, secret: str | None = None) -> None:
        self.secret = secret
        self.script: list[str] = []
        self.default = "ok"
        self.hang_for = 1.0
        self.delay = 0.0
        self.received: list[dict[str, Any]] = []  # every request that got a 2xx
        self.requests = 0
        self.connections: set[socket.socket] = set()
        self.bad_signatures = 0
        self.lock = threading.Lock()
        self.port = _free_port()
        self._server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()  # no Nagle delay between the header and body writes
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with receiver.lock:
                    receiver.connections.add(self.connection)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                if len(body) < length:  # the sender died mid-request: nothing to answer
                    self.close_connection = True
                    return
                with receiver.lock:
                    receiver.requests += 1
                    mode = receiver.script.pop(0) if receiver.script else receiver.default
                if receiver.delay:
                    time.sleep(receiver.delay)
                if mode == "hang":
                    time.sleep(receiver.hang_for)
                    mode = "ok"  # too late: the sender gave up and will send it again
                    status = 200
                else:
                    status = 200 if mode == "ok" else int(mode)
                if status == 200:
                    ok_sig = receiver.secret is None or verify_signature(
                        receiver.secret,
                        self.headers.get(TIMESTAMP_HEADER),
                        body,
                        self.headers.get(SIGNATURE_HEADER),
                    )
                    with receiver.lock:
                        receiver.bad_signatures += not ok_sig
                        receiver.received.append(
                            {
                                "key": self.headers.get(KEY_HEADER),
                                "headers": dict(self.headers),
                                "body": json.loads(body),
                                "time": time.time(),
                            }
                        )
                answer = b'{"ok": true}' if status == 200 else b"receiver error"
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                """Quiet: the test checks what arrived, not the access log."""

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self.lock:  # kept-alive connections too: a stopped receiver refuses everything
            for conn in self.connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self.connections.clear()

    def keys(self) -> list[str]:
        with self.lock:
            return [r["key"] for r in self.received]

    def wait_for(self, predicate: Callable[[Receiver], bool], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.01)
        return predicate(self)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(secret="hunter2-signing-key")
    yield r
    r.stop()


@pytest.fixture
def store_path(tmp_path: Path) -> str:
    from runwatch.store import open_store

    path = str(tmp_path / "alerts.db")
    with open_store(path) as store:
        store.start_run("gpt", project="lm")
    return path


@pytest.fixture
def make_anomaly() -> Callable[..., Anomaly]:
    """``make_anomaly(detector, metric, severity, step, rank, is_open, observed)``."""
    return anomaly


def anomaly(
    detector: str = "spike",
    metric: str = "loss",
    severity: str = "warning",
    step: int = 100,
    rank: int | None = None,
    is_open: bool = True,
    observed: float = 9.0,
) -> Anomaly:
    labels = {} if rank is None else {"rank": rank}
    return Anomaly(
        detector=detector,
        metric=metric,
        start_step=step,
        end_step=step,
        severity=severity,
        score=7.5,
        observed=observed,
        message=f"{metric} {detector} at step {step}",
        labels=labels,
        expected=2.3,
        lower=2.1,
        upper=2.5,
        is_open=is_open,
    )
