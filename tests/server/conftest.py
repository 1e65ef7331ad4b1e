"""Fixtures: a real ``runwatch serve`` process on 127.0.0.1 (a free port), its token and store."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

TOKEN = "test-token-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``python -m runwatch.cli serve`` as a subprocess; start, SIGKILL, restart, stop."""

    def __init__(self, db: Path, token_file: Path, *extra: str) -> None:
        self.db = db
        self.token_file = token_file
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> None:
        cmd = [
            sys.executable,
            "-m",
            "runwatch.cli",
            "serve",
            "--db",
            str(self.db),
            "--port",
            str(self.port),
            "--token-file",
            str(self.token_file),
            *self.extra,
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read().decode() if self.proc.stdout else ""
                raise RuntimeError(f"runwatch serve exited with {self.proc.returncode}: {out}")
            try:
                if httpx.get(f"{self.url}/api/v1/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("runwatch serve did not answer in time")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode

    def client(self, token: str | None = TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10.0)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture
def server(tmp_path: Path, token_file: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path / "served.db", token_file, "--no-detect")
    proc.start()
    yield proc
    rc = proc.stop()
    assert rc in (0, -signal.SIGTERM)


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for a module's tests (each uses its own run names and client ids)."""
    root = tmp_path_factory.mktemp("shared")
    token = root / "token"
    token.write_text(TOKEN + "\n")
    proc = ServerProcess(root / "served.db", token, "--no-detect")
    proc.start()
    yield proc
    assert proc.stop() in (0, -signal.SIGTERM)
