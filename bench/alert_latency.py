"""NaN -> webhook latency with the packaged default rules, and a NaN storm (issue 17, item 7).

    python bench/alert_latency.py [--trials 20] [--rules FILE] [--root PATH] [--label NAME]
                                  [--kind nan|crash]

Each trial is a real run: ``runwatch.init(name, store=<new db>, webhook=URL)`` with no rules
file (the packaged defaults), a loop logging loss, lr and grad_norm at about 50 steps/s, and
a NaN loss at a random step (1 to 3 s into the run). The latency is the receiver's clock at
receipt of the first message naming that NaN minus the time just before ``run.log(NaN)``
(same host clock; the receiver runs in a subprocess on 127.0.0.1). The path: the hook's
writer flush, live detection on its own thread, the alert engine (grouping), the outbox,
the sender, HTTP. ``--kind crash`` logs ``run.event("crash", ...)`` instead of the NaN and
waits for the message naming a crash (a failure event: live detection forms its incident,
then the engine reads it; code before alerts per incident sends nothing for it).

Storm check (once): 50 NaNs in 2 s in one run (every other step at 50 steps/s); counts the
messages the receiver gets before ``run.finish()`` and after it, to show the storm folds, and
what the messages say of the storm's incident (group keys, the incident's id and count in
the last message; code before alerts per incident sends no incident).

``--rules FILE`` passes ``alerts=FILE`` instead of the packaged defaults (e.g. the old
default file, to measure the code before this change on today's code); ``--root PATH``
imports runwatch from PATH (a worktree of an older commit, built).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STEPS_PER_S = 50.0


# -- the receiver (its own process) -------------------------------------------------------------
def serve_receiver(port: int) -> None:
    """Record (receipt time, path, body) of every POST; GET returns them as JSON."""
    got: list[dict[str, Any]] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            now = time.time()
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
            with lock:
                got.append({"t": now, "path": self.path, "body": parsed})
            self._answer(b"{}")

        def do_GET(self) -> None:
            with lock:
                data = json.dumps([g for g in got if g["path"] == self.path]).encode()
            self._answer(data)

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
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-receiver", str(self.port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def received(self, path: str) -> list[dict[str, Any]]:
        import httpx

        return httpx.get(self.url(path), timeout=5).json()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


# -- the run ------------------------------------------------------------------------------------
def _point(step: int) -> dict[str, float]:
    return {
        "loss": 3.0 / (1 + step) ** 0.3 + 0.01 * random.random(),
        "lr": 3e-4,
        "grad_norm": 1.0 + 0.1 * random.random(),
    }


def _names_nan(message: dict[str, Any], step: int, detector: str = "nonfinite") -> bool:
    body = message["body"] or {}
    return any(
        a.get("detector") == detector and a.get("step") == step for a in body.get("alerts", [])
    )


CRASH = "RuntimeError: CUDA error: an illegal memory access was encountered"


def one_trial(
    receiver: Receiver, tmp: Path, i: int, rules: str | None, kind: str = "nan"
) -> float | None:
    import runwatch

    path = f"trial{i}"
    run = runwatch.init(f"t{i}", store=tmp / f"t{i}.db", webhook=receiver.url(path), alerts=rules)
    nan_step = random.randint(int(STEPS_PER_S), int(3 * STEPS_PER_S))
    start = time.perf_counter()
    logged = None
    latency = None
    step = 0
    while True:
        if step == nan_step and kind == "crash":
            run.log(_point(step), step=step)
            logged = time.time()
            run.event("crash", step=step, message=CRASH)
        elif step == nan_step:
            logged = time.time()
            run.log({"loss": float("nan"), "lr": 3e-4, "grad_norm": 1.0}, step=step)
        else:
            run.log(_point(step), step=step)
        step += 1
        if logged is not None and step % 5 == 0:
            detector = "crash" if kind == "crash" else "nonfinite"
            hits = [m for m in receiver.received(path) if _names_nan(m, nan_step, detector)]
            if hits:
                latency = hits[0]["t"] - logged
                break
            if time.time() - logged > 30:
                break
        time.sleep(max(0.0, start + step / STEPS_PER_S - time.perf_counter()))
    run.finish()
    return latency


def storm(receiver: Receiver, tmp: Path, rules: str | None) -> dict[str, Any]:
    """50 NaNs in 2 s (every other step at 50 steps/s), then 3 s of healthy steps."""
    import runwatch

    path = "storm"
    run = runwatch.init("storm", store=tmp / "storm.db", webhook=receiver.url(path), alerts=rules)
    start = time.perf_counter()
    first_nan = 100
    first_logged = None
    for step in range(first_nan + 100 + 150):
        if first_nan <= step < first_nan + 100 and step % 2 == 0:
            if first_logged is None:
                first_logged = time.time()
            run.log({"loss": float("nan"), "lr": 3e-4, "grad_norm": 1.0}, step=step)
        else:
            run.log(_point(step), step=step)
        time.sleep(max(0.0, start + (step + 1) / STEPS_PER_S - time.perf_counter()))
    before_finish = receiver.received(path)
    run.finish()
    time.sleep(0.5)
    everything = receiver.received(path)
    alerts = sum(len((m["body"] or {}).get("alerts", [])) for m in everything)
    assert first_logged is not None
    last = (everything[-1]["body"] or {}) if everything else {}
    incident = last.get("incident") or {}
    return {
        "group_keys": len({(m["body"] or {}).get("group_key") for m in everything}),
        "incident": incident.get("id"),
        "incident_count": incident.get("count"),
        "nans": 50,
        "during_run": len(before_finish),
        "at_finish": len(everything) - len(before_finish),
        "total": len(everything),
        "alerts_in_messages": alerts,
        "first_after_s": (everything[0]["t"] - first_logged) if everything else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--rules", help="an alert rules file instead of the packaged defaults")
    parser.add_argument("--root", help="import runwatch from this directory")
    parser.add_argument("--label", default="this code")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--no-storm", action="store_true")
    parser.add_argument("--kind", choices=("nan", "crash"), default="nan")
    parser.add_argument("--serve-receiver", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_receiver:
        serve_receiver(args.serve_receiver)
        return
    sys.path.insert(0, args.root or str(ROOT))
    os.environ.pop("RUNWATCH_ALERTS", None)
    random.seed(args.seed)
    import numpy as np

    import runwatch

    print(f"runwatch from {Path(runwatch.__file__).parent}; rules: {args.rules or 'packaged'}")
    receiver = Receiver()
    try:
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            lat: list[float] = []
            missed = 0
            for i in range(args.trials):
                got = one_trial(receiver, tmp, i, args.rules, args.kind)
                if got is None:
                    missed += 1
                else:
                    lat.append(got)
                print(f"  trial {i}: {got if got is None else round(got, 3)} s", flush=True)
            a = np.array(lat if lat else [float("nan")])
            print(
                f"| {args.label} | {len(lat)} (missed {missed}) | {np.median(a):.3f} | "
                f"{np.percentile(a, 90):.3f} | {np.percentile(a, 99):.3f} | {a.max():.3f} |"
            )
            if not args.no_storm:
                s = storm(receiver, tmp, args.rules)
                print(
                    f"storm | {args.label} | {s['nans']} NaNs in 2 s | messages during the run "
                    f"{s['during_run']}, at finish {s['at_finish']}, total {s['total']} | "
                    f"first after {s['first_after_s']:.3f} s | group keys {s['group_keys']}, "
                    f"incident {s['incident']} with {s['incident_count']} members |"
                )
    finally:
        receiver.close()


if __name__ == "__main__":
    main()
