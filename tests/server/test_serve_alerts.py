"""`runwatch serve --alerts`: a NaN pushed by a client becomes a webhook; /metrics is served."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import httpx

import runwatch

from .conftest import TOKEN, ServerProcess


class _Receiver(BaseHTTPRequestHandler):
    bodies: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        type(self).bodies.append(json.loads(self.rfile.read(length)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        """Quiet: the test checks what arrived, not the access log."""


def test_serve_routes_alerts_and_exports_metrics(tmp_path, token_file, monkeypatch):
    receiver = HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{receiver.server_port}/hook"
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "version: 1\n"
        "defaults: {group_by: [run, detector, metric], group_wait: 0s, group_interval: 1s,"
        " repeat_interval: 1h, send_resolved: true}\n"
        f"channels:\n  team:\n    type: webhook\n    url: {hook}\n"
        "routes:\n  - match: {min_severity: warning}\n    channels: [team]\n"
    )
    server = ServerProcess(tmp_path / "served.db", token_file, "--alerts", str(rules))
    server.start()
    try:
        monkeypatch.setenv("RUNWATCH_SPILL_DIR", str(tmp_path / "spill"))
        with runwatch.init(name="remote", url=server.url, token=TOKEN) as run:
            for step in range(50):
                run.log({"loss": 2.0 - 0.01 * step}, step=step)
            run.log({"loss": float("nan")}, step=50)
        deadline = time.monotonic() + 30
        while not _Receiver.bodies and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _Receiver.bodies, "no alert reached the webhook"
        text = json.dumps(_Receiver.bodies)
        assert "nonfinite" in text and "remote" in text
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        assert "runwatch_" in metrics and 'run="remote"' in metrics
    finally:
        server.stop()
        receiver.shutdown()
