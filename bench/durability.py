"""Benchmark: how much a training process killed with SIGKILL loses, and a clean reopen.

A child process logs its own wall clock as a metric (plus three more scalars) at ~2,000
steps/s through ``run.log``; it is killed with SIGKILL at a random moment; the store is then
opened, checked (``PRAGMA integrity_check``) and the newest durable point compared with the
moment of the kill. The goal is at most 1 s lost. Repeats and prints the spread.

Then the other way round: runwatch's process beside the training one (the writer and live
detection, ``runwatch.live_process``) is killed while the training process logs on; the
run starts another and finishes. Printed per kill: the longest stretch with no stored
point, the points logged but not stored, the points counted as lost (``worker_dead``), and
the run's status.

    python bench/durability.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

import runwatch

CHILD = textwrap.dedent(
    """
    import sys, time, runwatch
    run = runwatch.init(name="k", store=sys.argv[1])
    step = 0
    print("ready", flush=True)
    while True:
        run.log({"wall": time.time(), "loss": 1.0 / (step + 1), "gn": 0.5, "lr": 3e-4}, step=step)
        step += 1
        time.sleep(0.0005)
    """
)


TRAINING = textwrap.dedent(
    """
    import json, sys, time, runwatch
    run = runwatch.init(name="k", store=sys.argv[1])
    step, end = 0, time.monotonic() + float(sys.argv[2])
    print(run._extras.process._proc.pid, flush=True)
    while time.monotonic() < end:
        run.log({"wall": time.time(), "loss": 1.0 / (step + 1), "gn": 0.5, "lr": 3e-4}, step=step)
        step += 1
        time.sleep(0.0005)
    run.finish()
    print(json.dumps({**run.stats(), "restarts": run._extras.process.restarts}), flush=True)
    """
)


def one_helper_kill(workdir: Path, rng: random.Random) -> tuple[float, int, int, str, int]:
    """Kill runwatch's process 1-3 s into a 5 s run: (longest gap in s, points missing,
    points counted lost, run status, restarts)."""
    db = workdir / "k.db"
    training = subprocess.Popen(
        [sys.executable, "-c", TRAINING, str(db), "5"], stdout=subprocess.PIPE, text=True
    )
    assert training.stdout is not None
    helper = int(training.stdout.readline())
    time.sleep(rng.uniform(1.0, 3.0))
    os.kill(helper, signal.SIGKILL)
    stats = json.loads(training.stdout.readline())
    training.wait()
    with runwatch.open_store(str(db)) as store:
        wall = store.read_series("k", "wall")["value"].to_numpy()
        status = store.runs().set_index("name").loc["k", "status"]
    missing = stats["logged"] // 4 - len(wall)
    gap = float(np.max(np.diff(np.sort(wall))))
    return gap, missing, stats["dropped"].get("worker_dead", 0) // 4, status, stats["restarts"]


def one_kill(workdir: Path, rng: random.Random) -> tuple[float, int, str]:
    db = workdir / "k.db"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    time.sleep(rng.uniform(1.0, 4.0))
    # runwatch's own process beside the training one (since 2026-11-27 it runs the writer)
    # writes what reached it after the kill: what is durable is what it leaves behind.
    with open(f"/proc/{child.pid}/task/{child.pid}/children") as f:
        helpers = [int(pid) for pid in f.read().split()]
    killed_at = time.time()
    child.send_signal(signal.SIGKILL)
    child.wait()
    for pid in helpers:
        _wait_gone(pid, 30.0)
    conn = sqlite3.connect(db)
    integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
    conn.close()
    with runwatch.open_store(str(db)) as store:
        wall = store.read_series("k", "wall")["value"]
    return killed_at - float(wall.max()), len(wall), integrity


def _wait_gone(pid: int, timeout: float) -> None:
    """Wait for a process that is not our child to exit (or be a zombie)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(") ", 1)[1].startswith("Z"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    rng = random.Random(0)
    lost = []
    print(f"{'run':>4} {'seconds lost':>13} {'points kept':>12} integrity")
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            gap, kept, integrity = one_kill(Path(tmp), rng)
        lost.append(gap)
        print(f"{i:>4} {gap:13.3f} {kept:12,} {integrity}")
    print(
        f"\nseconds of points lost at SIGKILL: median {statistics.median(lost):.3f}, "
        f"max {max(lost):.3f} (goal <= 1.0) over {args.repeats} kills"
    )
    print(
        f"\n{'run':>4} {'longest gap s':>14} {'steps missing':>14} {'counted lost':>13} "
        "status    restarts  (runwatch's process killed, the training process logging on)"
    )
    gaps = []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            gap, missing, counted, status, restarts = one_helper_kill(Path(tmp), rng)
        gaps.append(gap)
        print(f"{i:>4} {gap:14.3f} {missing:14,} {counted:13,} {status:9} {restarts}")
    print(
        f"\nlongest stretch without stored points when runwatch's process is killed: "
        f"median {statistics.median(gaps):.3f} s, max {max(gaps):.3f} s over {args.repeats} kills"
    )


if __name__ == "__main__":
    main()
