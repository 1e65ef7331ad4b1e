"""Benchmark: what step context costs ``run.log`` (issue 17: "nothing measurable").

Five ways of logging the same 4 scalars per step, each into a fresh run (live detection
off, so only the hook is measured):

- ``no context``: ``run.log(d, step=i)``;
- ``same dict``: ``run.log(d, step=i, context=ctx)`` with one dict that never changes;
- ``equal new dict``: a new but equal dict every step (``{"shard": shard}`` built per step),
  so the training thread compares by equality, not identity;
- ``changes every 100`` and ``changes every step``: the shard changes (a row is stored).

Three loops, interleaved case by case and round-robin over ``--repeats`` (this 2-core machine
is shared and noisy):

- ``isolated``: calls back to back with the run's queue swapped for a discard, so only the
  training thread's own work is timed (no writer thread sharing the GIL and the cores); the
  fastest of 5 passes per repeat;
- ``tight``: calls back to back; the time of blocks of 1,000 calls, per call;
- ``per step``: one call after ~10 ms of busy work (a training step), timed alone, so the
  writer thread has drained the queue and the call meets cold caches, as in training.

Printed per case and loop, as a Markdown table: the wall time and the training thread's CPU
time of a call (``time.thread_time``: what the call itself costs, without preemption or
waits for the GIL, so steadier on a loaded machine), each the median over repeats of the
per-repeat median [min-max of the repeats] and its difference from ``no context``, and the
context rows the run stored (checked against what each case should store); then the fastest
block of the isolated loop per case, the least noisy figure when the machine is loaded.

    python bench/context_overhead.py [--repeats 5] [--tight-steps 50000] [--slow-steps 300]
        [--root PATH] [--loops isolated tight "per step"]

``--root`` measures another checkout (a "before" figure for ``no context``: a runwatch
without step context runs that case only), e.g. ``--root /tmp/rw/base``.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

if "--root" in sys.argv:  # before runwatch is imported: measure that checkout
    sys.path.insert(0, sys.argv[sys.argv.index("--root") + 1])

import runwatch
from runwatch.store import open_store

Step = dict[str, float]
BEST: dict[str, float] = {}  # run name -> the fastest block of the isolated loop, per call
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
    if "context" not in inspect.signature(runwatch.Run.log).parameters:
        return {"no context": (lambda run, d, i: run.log(d, step=i), 0)}  # before context
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


def tight(run: runwatch.Run, call: Call, steps: list[Step]) -> tuple[float, float]:
    """Median (wall, thread CPU) seconds per call over blocks of 1,000 back-to-back calls."""
    pc, cpu = time.perf_counter, time.thread_time
    wall, used = [], []
    for start in range(0, len(steps) - 999, 1000):
        t0, c0 = pc(), cpu()
        for i in range(start, start + 1000):
            call(run, steps[i], i)
        wall.append((pc() - t0) / 1000)
        used.append((cpu() - c0) / 1000)
    BEST[run.name] = min(BEST.get(run.name, np.inf), min(wall))
    return statistics.median(wall), statistics.median(used)


def per_step(
    run: runwatch.Run, call: Call, steps: list[Step], busy_s: float
) -> tuple[float, float]:
    """Median (wall, thread CPU) seconds of one call made after ``busy_s`` of busy work."""
    pc, cpu = time.perf_counter, time.thread_time
    wall, used = [], []
    for i, data in enumerate(steps):
        end = pc() + busy_s
        while pc() < end:  # a training step's work
            pass
        t0, c0 = pc(), cpu()
        call(run, data, i)
        c1, t1 = cpu(), pc()
        wall.append(t1 - t0)
        used.append(c1 - c0)
    return statistics.median(wall), statistics.median(used)


def measure(
    case: str, call: Call, steps: list[Step], loop: str, busy_s: float
) -> tuple[float, float, int]:
    """(wall, CPU) per call and the context rows stored, in a fresh run."""
    workdir = Path(tempfile.mkdtemp(prefix="rwctx-"))
    try:
        db = workdir / "ctx.db"
        name = f"{loop}:{case}"
        run = runwatch.init(name=name, store=db, monitor=False, max_pending_points=10**8)
        if loop == "isolated":
            # The queue swapped for a discard: only the training thread's own work is left,
            # with no writer thread to share the GIL or the cores with.
            # Cheap, so run 5 times: the fastest block is then a steadier figure.
            put, run._put = run._put, collections.deque(maxlen=1).append
            wall, used = min(tight(run, call, steps) for _ in range(5))
            run._put = put
        elif loop == "tight":
            wall, used = tight(run, call, steps)
        else:
            wall, used = per_step(run, call, steps, busy_s)
        run.finish()
        with open_store(str(db), readonly=True) as store:
            rows = len(store.contexts(name)) if hasattr(store, "contexts") else 0
        return wall, used, rows
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _spread(median: float, values: list[float]) -> str:
    return f"{median * 1e9:.0f} [{min(values) * 1e9:.0f}-{max(values) * 1e9:.0f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tight-steps", type=int, default=50_000)
    parser.add_argument("--slow-steps", type=int, default=300)
    parser.add_argument("--busy-ms", type=float, default=10.0)
    parser.add_argument("--root", help="the checkout to measure (default: this one)")
    parser.add_argument(
        "--loops", nargs="+", default=["isolated", "tight", "per step"], help="which loops"
    )
    args = parser.parse_args()
    sizes = {"isolated": args.tight_steps, "tight": args.tight_steps, "per step": args.slow_steps}
    loops = {loop: sizes[loop] for loop in args.loops}
    walls: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    stored: dict[tuple[str, str], tuple[int, int]] = {}
    for loop, n in loops.items():
        steps = make_steps(n)
        table = cases(n)
        names = list(table)
        for r in range(args.repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order
                call, expected = table[name]
                wall, used, rows = measure(name, call, steps, loop, args.busy_ms / 1000)
                walls.setdefault((loop, name), []).append(wall)
                cpus.setdefault((loop, name), []).append(used)
                stored[(loop, name)] = (rows, 0 if loop == "isolated" else expected)
            print(f"... {loop} repeat {r + 1}/{args.repeats} done", file=sys.stderr)

    print(
        f"\nrunwatch from {Path(runwatch.__file__).parents[1]}"
        f"\nrun.log of 4 scalars, live detection off; {args.repeats} repeats, cases "
        "interleaved; ns per call, median over repeats [min-max of the repeats]; wall: elapsed "
        "time, CPU: the training thread's CPU time in the call\n"
    )
    print("| loop | case | wall ns | vs none | CPU ns | vs none | rows stored |")
    print("|---|---|---|---|---|---|---|")
    for loop in loops:
        wall_base = statistics.median(walls[(loop, "no context")])
        cpu_base = statistics.median(cpus[(loop, "no context")])
        for name in cases(1):
            wall, used = walls[(loop, name)], cpus[(loop, name)]
            wall_med, cpu_med = statistics.median(wall), statistics.median(used)
            rows, expected = stored[(loop, name)]
            mark = "" if rows == expected else f" (expected {expected})"
            print(
                f"| {loop} | {name} | {_spread(wall_med, wall)} | "
                f"{(wall_med - wall_base) * 1e9:+.0f} | {_spread(cpu_med, used)} | "
                f"{(cpu_med - cpu_base) * 1e9:+.0f} | {rows}{mark} |"
            )
    best = {k.split(":", 1)[1]: v for k, v in BEST.items() if k.startswith("isolated:")}
    print(
        "\nisolated, the fastest block of 1,000 calls over all repeats (the least noisy "
        "figure on a loaded machine): "
        + ", ".join(f"{name} {best[name] * 1e9:.0f} ns" for name in cases(1) if name in best)
    )


if __name__ == "__main__":
    main()
