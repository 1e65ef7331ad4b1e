"""Benchmark: what one wake-up of a drain thread costs while the training loop holds the GIL.

Every run has a drain thread in the training process (``runwatch-forward``), woken every
0.08 s by default whether anything was logged or not. Its wake-up is a cost of having
runwatch at all, paid by a loop that logs nothing: the thread's CPU, and the time the loop
waits for the GIL while the thread runs Python. Measured here, each version in fresh
processes taken in turn: a real :class:`runwatch.hook.drain.Drain` with nothing to take,
woken on its clock for ``--seconds`` while the main thread runs a pure-Python loop (it holds
the GIL and allocates nothing); printed per version, the drain thread's CPU per wake-up
and the loop's GIL wait per wake-up (its wall time less its CPU and runnable time, from
the scheduler's statistics), each the median over repeats. ``--before`` is a checkout of
an older runwatch (built), the anchor.

    python bench/drain_wake.py [--before /tmp/prev] [--seconds 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from hook_cadence import schedstat  # bench/: the scheduler's statistics of one thread

HERE = Path(__file__).resolve().parent
INTERVAL = 0.08


def child(src: str, seconds: float) -> dict[str, float]:
    sys.path.insert(0, src)
    from runwatch.hook.drain import Drain

    class NoDrops:
        def add(self, reason: str, n: int) -> None:
            pass

    drain = Drain(
        "bench-drain",
        lambda items: False,
        tick=lambda: None,
        interval=INTERVAL,
        drops=NoDrops(),
        backlog=lambda: 0,
        logger=logging.getLogger("bench"),
    )
    drain.start()
    time.sleep(0.3)
    me = threading.get_native_id()
    theirs = drain._thread.native_id
    rounds0, (cpu0, queued0), theirs0 = drain.rounds, schedstat(me), schedstat(theirs)[0]
    wall0 = time.perf_counter()
    end = wall0 + seconds
    x = 0
    for _ in itertools.repeat(None, 10**12):  # holds the GIL, allocates nothing
        x ^= 1
        if not x and time.perf_counter() >= end:
            break
    wall = time.perf_counter() - wall0
    cpu, queued = schedstat(me)
    wakes = drain.rounds - rounds0
    drain_cpu = schedstat(theirs)[0] - theirs0
    drain.close()
    gil_wait = wall - (cpu - cpu0) - (queued - queued0)
    return {
        "src": src,
        "wakes": wakes,
        "drain cpu us per wake": drain_cpu / wakes * 1e6,
        "loop gil wait us per wake": gil_wait / wakes * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="/tmp/prev", help="checkout of an older runwatch")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.seconds)))
        return
    versions = {"this checkout": str(HERE.parent)}
    if Path(args.before, "runwatch").is_dir():
        versions["before"] = args.before
    got: dict[str, list[dict[str, float]]] = {v: [] for v in versions}
    for _ in range(args.repeats):
        for version, src in versions.items():
            out = subprocess.run(
                [sys.executable, __file__, "--child", src, "--seconds", str(args.seconds)],
                capture_output=True,
                text=True,
                check=True,
            )
            got[version].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"# drain wake-up: {platform.node()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}\n\n"
        f"`python bench/drain_wake.py --seconds {args.seconds:g} --repeats {args.repeats}`; "
        f"a drain woken every {INTERVAL} s with nothing to take, the loop holding the GIL.\n"
    )
    print(
        "| version | wake-ups per repeat | drain CPU µs per wake-up, median (each) "
        "| loop's GIL wait µs per wake-up, median (each) |"
    )
    print("|---|---|---|---|")
    for version, runs in got.items():
        cpu = [r["drain cpu us per wake"] for r in runs]
        gil = [r["loop gil wait us per wake"] for r in runs]
        print(
            f"| {version} | {statistics.median(r['wakes'] for r in runs):.0f} | "
            f"{statistics.median(cpu):.1f} ({' / '.join(f'{c:.0f}' for c in cpu)}) | "
            f"{statistics.median(gil):.1f} ({' / '.join(f'{g:.0f}' for g in gil)}) |"
        )


if __name__ == "__main__":
    main()
