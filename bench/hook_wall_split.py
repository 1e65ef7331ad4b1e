"""Benchmark: where the wall time ``run.log`` adds to a GIL-holding loop goes (issue 23).

``hook_cadence.py`` measures the wall time added per logged step at 1 ms steps, against a
bare queue put in the same blocks. On a shared machine that figure moves by ±10 µs per step
between blocks of the same code. This splits each block's wall time, from the loop thread's
scheduler statistics, into its CPU time, its runnable wait (another process had the core)
and the rest, the time it was off the CPU: in a loop that never sleeps nor does I/O, the
GIL wait. Runwatch can only add to the last and, by its call, to the first.

Each version runs in fresh processes, alternating; per process the median over block
triples (nothing, bare put, ``run.log``) of ``run.log`` less the bare put, in µs per step.

    python bench/hook_wall_split.py [--before CHECKOUT] [--repeats 3] [--blocks 20]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = ("wall", "cpu", "runnable", "off")


def child(src: str, blocks: int, steps: int) -> dict[str, float]:
    sys.path.insert(0, src)
    import runwatch

    assert runwatch.__file__.startswith(src), runwatch.__file__
    sys.path.insert(0, str(HERE))
    import hook_cadence as cadence

    run = runwatch.init(name="split", store=os.path.join(tempfile.mkdtemp(), "r.db"))
    bare: queue.SimpleQueue[object] = queue.SimpleQueue()
    step = [0]
    calls = {
        "none": None,
        "put": lambda d: bare.put((step[0], time.time(), d.copy())),
        "log": lambda d: run.log(d, step=step[0]),
    }
    n_work = cadence.calibrate_work()
    added: dict[str, dict[str, list[float]]] = {k: {p: [] for p in PARTS} for k in ("put", "log")}
    for b in range(blocks):
        parts: dict[str, dict[str, float]] = {}
        for kind in ("none", "put", "log") if b % 2 == 0 else ("log", "put", "none"):
            call = calls[kind]
            cpu0, runnable0 = cadence.schedstat()
            t = time.perf_counter()
            for _ in range(steps):
                cadence.work(n_work)
                d = cadence.values(step[0] + 1)
                if call is not None:
                    step[0] += 1
                    call(d)
            wall = time.perf_counter() - t
            cpu1, runnable1 = cadence.schedstat()
            cpu, runnable = cpu1 - cpu0, runnable1 - runnable0
            parts[kind] = {"wall": wall, "cpu": cpu, "runnable": runnable}
            parts[kind]["off"] = wall - cpu - runnable
            time.sleep(0.15)  # the block's points are written in this pause
            while not bare.empty():
                bare.get_nowait()
        for kind in ("put", "log"):
            for p in PARTS:
                added[kind][p].append((parts[kind][p] - parts["none"][p]) / steps * 1e6)
    run.finish()
    return {
        p: statistics.median(a - b for a, b in zip(added["log"][p], added["put"][p], strict=True))
        for p in PARTS
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a built checkout of the code before")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--block-steps", type=int, default=400)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.blocks, args.block_steps)))
        return
    versions = {"now": str(HERE.parent)}
    if args.before:
        versions["before"] = str(Path(args.before).resolve())
    results: dict[str, list[dict[str, float]]] = {name: [] for name in versions}
    for _ in range(args.repeats):
        for name, src in versions.items():
            cmd = [sys.executable, __file__, "--child", src, "--blocks", str(args.blocks)]
            cmd += ["--block-steps", str(args.block_steps)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            results[name].append(json.loads(out.strip().splitlines()[-1]))
    header = (
        "wall beyond the bare put, µs per step",
        "total",
        "loop's CPU",
        "runnable",
        "off (GIL)",
    )
    print("| " + " | ".join(header) + " |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        cells = [" / ".join(f"{r[p]:.1f}" for r in runs) for p in PARTS]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
