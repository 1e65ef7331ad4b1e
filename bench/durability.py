"""Benchmark: how much a training process killed with SIGKILL loses, and a clean reopen.

A child process logs its own wall clock as a metric (plus three more scalars) at ~2,000
steps/s through ``run.log``; it is killed with SIGKILL at a random moment; the store is then
opened, checked (``PRAGMA integrity_check``) and the newest durable point compared with the
moment of the kill. The goal is at most 1 s lost. Repeats and prints the spread.

    python bench/durability.py [--repeats 10]
"""

from __future__ import annotations

import argparse
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


if __name__ == "__main__":
    main()
