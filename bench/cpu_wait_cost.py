"""Benchmark: what reading the CPU wait costs a training loop.

The writer thread reads every thread's schedstat once per flush (``hook/cpu_wait.py``).
Printed: one reading's time with the process's threads as they are and with 64 extra idle
threads (a data loader's, NCCL's), and ``run.log`` per step at a training cadence (each
step does ~2 ms of Python work first, then logs 4 scalars) with the reading on (the
default) and off, in turn, repeated for the spread.

    python bench/cpu_wait_cost.py [--steps 3000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import runwatch  # noqa: E402
from runwatch.hook import run as hook_run  # noqa: E402
from runwatch.hook.cpu_wait import CpuWait  # noqa: E402


def reading_us(n: int = 2000) -> float:
    """Median microseconds of one ``CpuWait.read``."""
    reader = CpuWait.open()
    assert reader is not None, "no per-thread schedstat here"
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        reader.read()
        times.append(time.perf_counter() - t0)
    reader.close()
    return statistics.median(times) * 1e6


def _work() -> None:
    for _ in range(25):
        sum(range(2_000))


def log_per_step_us(steps: int, reading: bool) -> tuple[float, float]:
    """Median and p99 microseconds of ``run.log`` after each step's work."""
    with tempfile.TemporaryDirectory() as tmp:
        opener = CpuWait.open if reading else (lambda *a, **k: None)
        with mock.patch.object(hook_run.CpuWait, "open", opener):
            run = runwatch.init(name="cost", store=Path(tmp) / "c.db", monitor=False)
        times = []
        try:
            for step in range(steps):
                _work()
                t0 = time.perf_counter()
                run.log({"loss": 2.0, "grad_norm": 1.0, "lr": 3e-4, "tokens_per_s": 1e4}, step)
                times.append(time.perf_counter() - t0)
        finally:
            run.finish()
    times.sort()
    return statistics.median(times) * 1e6, times[int(0.99 * len(times))] * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    rows = {"one reading, this process's threads (us)": [], "same, 64 more threads (us)": []}
    for _ in range(args.repeats):
        rows["one reading, this process's threads (us)"].append(reading_us())
    stop = threading.Event()
    idle = [threading.Thread(target=stop.wait, daemon=True) for _ in range(64)]
    for t in idle:
        t.start()
    for _ in range(args.repeats):
        rows["same, 64 more threads (us)"].append(reading_us(500))
    stop.set()
    for reading in (True, False):
        name = "on (default)" if reading else "off"
        med, p99 = f"run.log median, reading {name} (us)", f"run.log p99, reading {name} (us)"
        rows.setdefault(med, [])
        rows.setdefault(p99, [])
    for _ in range(args.repeats):  # interleaved, so load changes hit both alike
        for reading in (True, False):
            name = "on (default)" if reading else "off"
            m, q = log_per_step_us(args.steps, reading)
            rows[f"run.log median, reading {name} (us)"].append(m)
            rows[f"run.log p99, reading {name} (us)"].append(q)
    print("| figure | median of repeats | min-max |")
    print("|---|---|---|")
    for name, xs in rows.items():
        print(f"| {name} | {statistics.median(xs):.2f} | {min(xs):.2f}-{max(xs):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
