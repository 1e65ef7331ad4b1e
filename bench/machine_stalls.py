"""Benchmark: the machine's stalls, which decide a cadence p99 (issue 23).

On this machine, whatever runs first after a pause sometimes takes about 140 µs instead of
1-2 µs: no page fault, no context switch, no other thread. The share of calls that meet
such a stall grows with the pause before them, as if the stalls came some 14 times a
second and waited for the next call. This script measures that share for three probes
taken in turn after each pause, so a reader can tell the machine's p99 from runwatch's:

- ``nothing``: the timer read twice, no call between;
- ``bare put``: ``SimpleQueue.put((step, time.time(), d.copy()))``, the cadence bench's floor;
- ``run.log``: the same 4 scalars, default settings.

    python bench/machine_stalls.py [--seconds 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import queue
import statistics
import tempfile
import time

from hook_cadence import STALL_NS, pause  # bench/: a stall's threshold; busy or asleep

import runwatch

PAUSES = (
    ("1 ms busy", "busy", 0.001),
    ("5 ms busy", "busy", 0.005),
    ("20 ms busy", "busy", 0.020),
    ("5 ms asleep", "sleep", 0.005),
)


def measure(seconds: float, store: str) -> dict[str, dict[str, list[int]]]:
    """Per pause and probe, the nanoseconds of every call."""
    run = runwatch.init(name="stalls", store=store)
    bare: queue.SimpleQueue = queue.SimpleQueue()
    d = {"loss": 2.5, "grad_norm": 0.8, "lr": 3e-4, "tokens_per_s": 250_000.0}
    step = 0

    def nothing() -> None:
        return None

    def put() -> None:
        bare.put((step, time.time(), d.copy()))

    def log() -> None:
        run.log(d, step)

    probes = {"nothing": nothing, "bare put": put, "run.log": log}
    names = list(probes)
    clock = time.perf_counter_ns
    out: dict[str, dict[str, list[int]]] = {}
    for label, kind, seconds_each in PAUSES:
        ns: dict[str, list[int]] = {name: [] for name in names}
        for i in range(int(seconds / seconds_each)):
            pause(kind, seconds_each)
            name = names[i % len(names)]
            step += 1
            t = clock()
            probes[name]()
            ns[name].append(clock() - t)
        while not bare.empty():
            bare.get_nowait()
        out[label] = ns
    run.finish()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per pause and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            got = measure(args.seconds, os.path.join(tmp, f"stalls-{r}.db"))
            for label, ns in got.items():
                for name, calls in ns.items():
                    stalled = [x for x in calls if x > STALL_NS]
                    typical = statistics.median(stalled) / 1e3 if stalled else 0.0
                    rows.setdefault((label, name), []).append(
                        (100.0 * len(stalled) / len(calls), typical, len(calls))
                    )
    print(
        f"# machine stalls: {platform.node()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}\n"
    )
    print(
        f"`python bench/machine_stalls.py --seconds {args.seconds:g} --repeats {args.repeats}`"
        "; each repeat's figure, the probes taken in turn after each pause.\n"
    )
    print(
        f"| pause | probe | calls each | calls over {STALL_NS // 1000} µs, % "
        "| median of those, µs |"
    )
    print("|---|---|---|---|---|")
    for (label, name), per in rows.items():
        shares = " / ".join(f"{s:.1f}" for s, _, _ in per)
        typical = " / ".join(f"{t:.0f}" for _, t, _ in per)
        print(f"| {label} | {name} | {per[0][2]} | {shares} | {typical} |")


if __name__ == "__main__":
    main()
