"""Alert delivery benchmark (issue 4): latency of the real path, and draining a backlog.

    python bench/alerts.py [--quick]

1. Latency: ``runwatch.init(webhook=..., alerts=<group_wait: 0>)`` in this process, a
   receiver in another process on 127.0.0.1. Each trial logs a NaN in a new metric (so each
   is a new group, sent at once with group_wait 0) and measures from just before
   ``run.log()`` to the receiver's receipt (same host clock): the hook's flush (every 0.25 s),
   live detection on its own thread, the engine, the outbox and the sender. Target: p99 <= 1 s.
   Anchor, same run: one bare httpx POST to the same receiver.
2. Backlog: 10,000 messages queued in the outbox while the receiver is down (the sender
   probing it), then the receiver comes back; time until every message has arrived, and how
   many arrived more than once (by idempotency key). Target: all, each once, in < 30 s.
   Anchor, same run: the same 10,000 POSTs sent by a bare loop of 4 threads with httpx.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import runwatch  # noqa: E402
from runwatch.alerting.rules import parse_rules  # noqa: E402
from runwatch.alerting.sender import Sender  # noqa: E402
from runwatch.store import open_store  # noqa: E402


# -- the receiver (runs in its own process) ---------------------------------------------------
def serve_receiver(port: int) -> None:
    keys: dict[str, int] = {}
    metrics: dict[str, float] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()  # headers and body go out as two writes: no Nagle delay between
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            now = time.time()
            key = self.headers.get("Idempotency-Key", "")
            with lock:
                keys[key] = keys.get(key, 0) + 1
                if body.startswith(b'{"schema"'):
                    metric = json.loads(body)["group_labels"].get("metric")
                    metrics.setdefault(metric, now)
            self._answer(b"{}")

        def do_GET(self) -> None:
            with lock:
                dup = sum(n - 1 for n in keys.values())
                stats = {"unique": len(keys), "duplicates": dup, "metrics": dict(metrics)}
            self._answer(json.dumps(stats).encode())

        def _answer(self, data: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer.allow_reuse_address = True
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print("ready", flush=True)
    server.serve_forever()


class Receiver:
    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-receiver", str(self.port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stats(self) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.port}/stats", timeout=5).json()


# -- 1. latency ----------------------------------------------------------------------------------
def bench_latency(trials: int, gap: float) -> dict[str, float]:
    receiver = Receiver()
    receiver.start()
    try:
        with httpx.Client() as client:  # the anchor: one bare POST
            client.post(receiver.url, content=b"{}")
            bare = []
            for _ in range(50):
                t = time.perf_counter()
                client.post(receiver.url, content=b"{}")
                bare.append(time.perf_counter() - t)
        with tempfile.TemporaryDirectory() as tmp:
            rules = Path(tmp) / "rules.yaml"
            rules.write_text(
                "version: 1\ndefaults: {group_wait: 0, group_interval: 1s}\n"
                "channels: {default: {type: webhook, url_env: RUNWATCH_WEBHOOK_URL}}\n"
                "routes: [{match: {min_severity: warning}, channels: [default]}]\n"
            )
            run = runwatch.init(
                "bench", store=Path(tmp) / "b.db", webhook=receiver.url, alerts=rules
            )
            logged: dict[str, float] = {}
            for i in range(trials):
                metric = f"probe_{i}"
                for step in range(i * 10, i * 10 + 9):
                    run.log({"loss": 2.0 + 0.01 * np.sin(step)}, step=step)
                logged[metric] = time.time()
                run.log({metric: float("nan")}, step=i * 10 + 9)
                time.sleep(gap)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                got = receiver.stats()["metrics"]
                if all(m in got for m in logged):
                    break
                time.sleep(0.1)
            run.finish()
        lat = np.array([got[m] - t for m, t in logged.items() if m in got])
        missing = len(logged) - len(lat)
    finally:
        receiver.stop()
    return {
        "trials": trials,
        "missing": missing,
        "p50": float(np.percentile(lat, 50)),
        "p90": float(np.percentile(lat, 90)),
        "p99": float(np.percentile(lat, 99)),
        "max": float(lat.max()),
        "bare_post_p50": float(np.median(bare)),
    }


# -- 2. backlog ----------------------------------------------------------------------------------
def bench_backlog(n: int, down_for: float) -> dict[str, float]:
    receiver = Receiver()
    try:
        return _backlog(receiver, n, down_for)
    finally:
        receiver.stop()


def _backlog(receiver: Receiver, n: int, down_for: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "backlog.db")
        rules = parse_rules(
            "version: 1\n"
            f'channels: {{hook: {{type: webhook, url: "{receiver.url}", timeout: 5s}}}}\n'
            "routes: [{channels: [hook]}]\n"
            "delivery: {initial_backoff: 500ms, max_backoff: 2s}\n",
            "bench",
            env={},
        )
        body = json.dumps({"backlog": True, "pad": "x" * 400})
        with open_store(db) as store:
            t = time.perf_counter()
            store.enqueue_alerts((f"rw-{i:06d}", "hook", body, "") for i in range(n))
            enqueue_s = time.perf_counter() - t
        sender = Sender(db, rules)
        sender.start()
        time.sleep(down_for)  # the receiver is down: the sender probes and backs off
        with open_store(db) as store:
            attempts_while_down = len(store.alert_attempts())
        receiver.start()
        up = time.perf_counter()
        deadline = up + 120
        while time.perf_counter() < deadline:
            stats = receiver.stats()
            if stats["unique"] >= n:
                break
            time.sleep(0.05)
        drained = time.perf_counter() - up
        sender.close()
        with open_store(db) as store:
            pending = store.pending_alerts()
    stats = receiver.stats()
    # Anchor: the same POSTs from a bare 4-thread httpx loop (no store, no retries).
    with httpx.Client() as client, ThreadPoolExecutor(4) as pool:
        t = time.perf_counter()
        list(pool.map(lambda i: client.post(receiver.url, content=body.encode()), range(n)))
        bare_s = time.perf_counter() - t
    receiver.stop()
    return {
        "messages": n,
        "enqueue_s": enqueue_s,
        "attempts_while_down": attempts_while_down,
        "drain_s": drained,
        "delivered_unique": stats["unique"],
        "duplicates": stats["duplicates"],
        "pending_after": pending,
        "bare_s": bare_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials, 2,000 messages")
    parser.add_argument("--serve-receiver", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_receiver:
        serve_receiver(args.serve_receiver)
        return
    os.environ.pop("RUNWATCH_ALERTS", None)
    trials = 40 if args.quick else 200
    lat = bench_latency(trials, gap=0.05)
    met = lat["p99"] <= 1 and not lat["missing"]
    print(f"\n1. run.log(NaN) -> webhook receipt, in-process, group_wait 0 ({trials} trials)")
    print(f"{'':28}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}  target")
    print(
        f"{'runwatch (real path)':28}{lat['p50']:9.3f}{lat['p90']:9.3f}{lat['p99']:9.3f}"
        f"{lat['max']:9.3f}  p99 <= 1 s: {'MET' if met else 'MISSED'}"
    )
    print(f"{'anchor: bare httpx POST':28}{lat['bare_post_p50']:9.4f}")
    print(f"{'anchor: hook flush interval':28}{0.25:9.3f}")
    if lat["missing"]:
        print(f"  {lat['missing']} alerts never arrived")

    n = 2000 if args.quick else 10_000
    back = bench_backlog(n, down_for=3.0)
    ok = (
        back["drain_s"] < 30
        and back["delivered_unique"] == n
        and back["duplicates"] == 0
        and back["pending_after"] == 0
    )
    print(f"\n2. {n:,} messages queued while the receiver is down (3 s), then it comes back")
    print(f"{'':34}{'seconds':>9}  notes")
    print(
        f"{'runwatch sender: all delivered':34}{back['drain_s']:9.2f}  "
        f"arrived: {back['delivered_unique']:,}, duplicates by key: {back['duplicates']}, "
        f"still pending: {back['pending_after']}, "
        f"attempts while down: {back['attempts_while_down']}; "
        f"target < 30 s, each once: {'MET' if ok else 'MISSED'}"
    )
    print(f"{'enqueue into the outbox':34}{back['enqueue_s']:9.2f}")
    print(f"{'anchor: bare 4-thread httpx loop':34}{back['bare_s']:9.2f}  no store, no retries")


if __name__ == "__main__":
    main()
