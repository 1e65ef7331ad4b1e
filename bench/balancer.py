"""HTTP load balancers for the ``replicas`` phase of bench/ingest.py.

``Haproxy`` runs the real thing (what users put in front of several ``runwatch serve``), when the
``haproxy`` binary is installed: round robin per request, health checks on ``/api/v1/health``,
and a request whose connection to a dead replica fails retried on another. ``TcpBalancer`` is the
fallback for machines without it: a round-robin TCP proxy (asyncio, in a thread) that skips a
backend it cannot connect to. Both expose ``url``, ``proc`` (for CPU sampling, or None),
``start()``, ``stats()`` and ``stop()``.
"""

from __future__ import annotations

import asyncio
import csv
import io
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(port: int, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"balancer not listening on {port}")


HAPROXY_CONFIG = """\
global
    maxconn 4096
    stats socket {socket} mode 600 level admin

defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 60s
    timeout http-keep-alive 120s
    retries 3
    option redispatch 1

frontend runwatch
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /api/v1/health
    http-check expect status 200
    default-server inter 500ms fall 2 rise 2
{servers}
"""


class Haproxy:
    """``haproxy -db`` (foreground) with a generated config and a stats socket."""

    def __init__(self, ports: list[int], root: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.socket = root / f"haproxy-{self.port}.sock"
        self.config = root / f"haproxy-{self.port}.cfg"
        servers = "\n".join(f"    server r{i} 127.0.0.1:{p} check" for i, p in enumerate(ports))
        self.config.write_text(
            HAPROXY_CONFIG.format(socket=self.socket, port=self.port, servers=servers)
        )
        self.proc: subprocess.Popen[bytes] | None = None
        version = subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout
        words = version.split()
        self.name = f"HAProxy {words[2]}" if len(words) > 2 else "HAProxy"

    @staticmethod
    def available() -> bool:
        return shutil.which("haproxy") is not None

    def start(self) -> Haproxy:
        self.proc = subprocess.Popen(
            ["haproxy", "-db", "-f", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_listening(self.port)
        return self

    def stats(self) -> dict[str, int]:
        """Backend totals: requests, retries, redispatches, 5xx answered, failed responses."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(self.socket))
            sock.sendall(b"show stat\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        rows = list(csv.DictReader(io.StringIO(data.decode().lstrip("# "))))
        total = next(r for r in rows if r["pxname"] == "replicas" and r["svname"] == "BACKEND")
        front = next(r for r in rows if r["pxname"] == "runwatch" and r["svname"] == "FRONTEND")

        def num(row: dict[str, str], key: str) -> int:
            return int(row.get(key) or 0)

        return {
            "requests": num(front, "req_tot"),
            "retries": num(total, "wretr"),
            "redispatches": num(total, "wredis"),
            "5xx to clients": num(front, "hrsp_5xx"),
            "connection errors": num(total, "econ"),
            "response errors": num(total, "eresp"),
            # what the replicas took, as HAProxy saw it (ms; mean of the last 1,024 requests,
            # and the maximum): separates server time from time spent in the clients
            "server response ms, recent mean": num(total, "rtime"),
            "server response ms, max": num(total, "rtime_max"),
        }

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


class TcpBalancer:
    """Round-robin TCP proxy: each client connection goes to the next backend that accepts a
    connection; when that backend dies, the client's connection drops and its reconnect goes
    to a live one. Runs in this process (``proc`` is None), so it shares the bench's CPU."""

    name = "round-robin TCP balancer (bench/balancer.py, asyncio)"
    proc = None

    def __init__(self, ports: list[int], root: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ports = ports
        self._next = 0
        self.counts = {"connections": 0, "backends skipped": 0, "refused": 0}
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @staticmethod
    def available() -> bool:
        return True

    def start(self) -> TcpBalancer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counts["connections"] += 1
        for _ in range(len(self.ports)):
            port = self.ports[self._next % len(self.ports)]
            self._next += 1
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port), 1.0
                )
                break
            except (OSError, TimeoutError):
                self.counts["backends skipped"] += 1
        else:
            self.counts["refused"] += 1
            writer.close()
            return
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    def stats(self) -> dict[str, int]:
        return dict(self.counts)

    def stop(self) -> None:
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
