"""Benchmark: what step context costs ``run.log`` (issue 17: "nothing measurable").

Four ways of logging the same 4 scalars per step, each into a fresh run (live detection
off, so only the hook is measured):

- ``no context``: ``run.log(d, step=i)``;
- ``same dict``: ``run.log(d, step=i, context=ctx)`` with one dict that never changes;
- ``equal new dict``: a new but equal dict every step (``{"shard": shard}`` built per step),
  so the training thread compares by equality, not identity;
- ``changes every 100`` and ``changes every step``: the shard changes (a row is stored).

Two loops, interleaved case by case and round-robin over ``--repeats`` (this 2-core machine
is shared and noisy):

- ``tight``: calls back to back; the time of blocks of 1,000 calls, per call;
- ``per step``: one call after ~10 ms of busy work (a training step), timed alone, so the
  writer thread has drained the queue and the call meets cold caches, as in training.

Printed per case and loop: the median over repeats of the per-repeat median [min-max of the
repeats], and the difference from ``no context``; then the context rows stored per case.

    python bench/context_overhead.py [--repeats 5] [--tight-steps 50000] [--slow-steps 300]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import runwatch
from runwatch.store import open_store

Step = dict[str, float]
Call = Callable[[runwatch.Run, Step, int], None]


def make_steps(n: int, seed: int = 0) -> list[Step]:
    rng = np.random.default_rng(seed)
    s = np.arange(n)
    loss = 2.0 + 9.0 * (s + 50.0) ** -0.4 + rng.normal(0, 0.02, n)
    return [
        {"loss": float(a), "grad_norm": 0.8, "lr": 3e-4, "tokens_per_s": 250_000.0} for a in loss
    ]


def cases(n: int) -> dict[str, tuple[Call, int]]:
    """name -> (the call, the context rows it should store over ``n`` steps)."""
    same = {"shard": "s17", "source": "web"}
    equal = [{"shard": "s17", "source": "web"} for _ in range(n)]
    every_100 = [{"shard": f"s{i // 100}", "source": "web"} for i in range(n)]
    every_step = [{"shard": f"s{i}", "source": "web"} for i in range(n)]
    return {
        "no context": (lambda run, d, i: run.log(d, step=i), 0),
        "same dict": (lambda run, d, i: run.log(d, step=i, context=same), 1),
        "equal new dict": (lambda run, d, i: run.log(d, step=i, context=equal[i]), 1),
        "changes every 100": (
            lambda run, d, i: run.log(d, step=i, context=every_100[i]),
            (n + 99) // 100,
        ),
        "changes every step": (lambda run, d, i: run.log(d, step=i, context=every_step[i]), n),
    }


def tight(run: runwatch.Run, call: Call, steps: list[Step]) -> float:
    """Median seconds per call over blocks of 1,000 back-to-back calls."""
    pc = time.perf_counter
    per_call = []
    for start in range(0, len(steps) - 999, 1000):
        t0 = pc()
        for i in range(start, start + 1000):
            call(run, steps[i], i)
        per_call.append((pc() - t0) / 1000)
    return statistics.median(per_call)


def per_step(run: runwatch.Run, call: Call, steps: list[Step], busy_s: float) -> float:
    """Median seconds of one call made after ``busy_s`` of busy work."""
    pc = time.perf_counter
    lat = []
    for i, data in enumerate(steps):
        end = pc() + busy_s
        while pc() < end:  # a training step's work
            pass
        t0 = pc()
        call(run, data, i)
        lat.append(pc() - t0)
    return statistics.median(lat)


def measure(
    name: str, call: Call, steps: list[Step], loop: str, busy_s: float
) -> tuple[float, int]:
    workdir = Path(tempfile.mkdtemp(prefix="rwctx-"))
    try:
        db = workdir / "ctx.db"
        run = runwatch.init(name="ctx", store=db, monitor=False, max_pending_points=10**8)
        took = tight(run, call, steps) if loop == "tight" else per_step(run, call, steps, busy_s)
        run.finish()
        with open_store(str(db), readonly=True) as store:
            rows = len(store.contexts("ctx"))
        return took, rows
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tight-steps", type=int, default=50_000)
    parser.add_argument("--slow-steps", type=int, default=300)
    parser.add_argument("--busy-ms", type=float, default=10.0)
    args = parser.parse_args()
    loops = {"tight": args.tight_steps, "per step": args.slow_steps}
    results: dict[tuple[str, str], list[float]] = {}
    stored: dict[tuple[str, str], tuple[int, int]] = {}
    for loop, n in loops.items():
        steps = make_steps(n)
        table = cases(n)
        names = list(table)
        for r in range(args.repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order
                call, expected = table[name]
                took, rows = measure(name, call, steps, loop, args.busy_ms / 1000)
                results.setdefault((loop, name), []).append(took)
                stored[(loop, name)] = (rows, expected)
            print(f"... {loop} repeat {r + 1}/{args.repeats} done", file=sys.stderr)

    print(
        f"\nrun.log of 4 scalars, live detection off; {args.repeats} repeats, cases "
        "interleaved; median over repeats [min-max of the repeats]\n"
    )
    header = f"{'loop':9} {'case':20} {'per call':>24} {'vs no context':>14} {'rows':>7}"
    print(header)
    print("-" * len(header))
    for loop in loops:
        base = statistics.median(results[(loop, "no context")])
        for name in cases(1):
            got = results[(loop, name)]
            med = statistics.median(got)
            rows, expected = stored[(loop, name)]
            mark = "" if rows == expected else f" (expected {expected})"
            print(
                f"{loop:9} {name:20} {med * 1e9:8.0f} ns [{min(got) * 1e9:.0f}-"
                f"{max(got) * 1e9:.0f}] {(med - base) * 1e9:+11.0f} ns {rows:>7}{mark}"
            )


if __name__ == "__main__":
    main()
