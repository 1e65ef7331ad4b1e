"""Benchmark: the cost of logging, side by side with wandb, TensorBoard, MLflow and Aim.

Every tool logs the same values (4 scalars per step: a noisy power-law loss, grad norm, LR,
throughput, as Python floats) through its ordinary per-step API, in this one process, in
turn. Printed per tool: median and p99 latency of one step's logging call(s), the time to
finish, and bytes on disk per scalar. For runwatch also: the writer's sustained throughput
into SQLite and ``finish()`` with 1,000,000 points pending.

Anchors are optional (``pip install -e '.[bench]'`` plus torch for TensorBoard's
SummaryWriter, and ``aim``); a missing one is reported as such. Repeats each measurement and
prints the spread, because this 2-core machine is shared and noisy.

    python bench/log_overhead.py [--steps 20000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import runwatch

Step = dict[str, float]


def make_steps(n: int, seed: int = 0) -> list[Step]:
    rng = np.random.default_rng(seed)
    s = np.arange(n)
    loss = 2.0 + 9.0 * (s + 50.0) ** -0.4 + rng.normal(0, 0.02, n)
    grad = np.exp(rng.normal(-0.5, 0.3, n))
    lr = 3e-4 * np.minimum(1.0, (s + 1) / 500) * (0.5 + 0.5 * np.cos(np.pi * s / n))
    tps = 250_000 + rng.normal(0, 3000, n)
    return [
        {"loss": float(a), "grad_norm": float(b), "lr": float(c), "tokens_per_s": float(d)}
        for a, b, c, d in zip(loss, grad, lr, tps, strict=True)
    ]


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class Result:
    def __init__(self, name: str) -> None:
        self.name = name
        self.medians: list[float] = []
        self.p99s: list[float] = []
        self.finish: list[float] = []
        self.bytes_per_scalar: list[float] = []
        self.note = ""


def time_calls(steps: list[Step], call: Callable[[Step, int], None]) -> np.ndarray:
    pc = time.perf_counter
    lat = np.empty(len(steps))
    for i, data in enumerate(steps):
        t0 = pc()
        call(data, i)
        lat[i] = pc() - t0
    return lat


def bench_runwatch(steps: list[Step], workdir: Path, res: Result) -> None:
    db = workdir / "rw.db"
    run = runwatch.init(name="bench", store=db)
    lat = time_calls(steps, lambda d, i: run.log(d, step=i))
    t0 = time.perf_counter()
    run.finish()
    res.finish.append(time.perf_counter() - t0)
    res.medians.append(float(np.median(lat)))
    res.p99s.append(float(np.percentile(lat, 99)))
    res.bytes_per_scalar.append(
        sum(os.path.getsize(f"{db}{s}") for s in ("", "-wal") if os.path.exists(f"{db}{s}"))
        / (4 * len(steps))
    )


def bench_wandb(steps: list[Step], workdir: Path, res: Result) -> None:
    import wandb

    os.environ["WANDB_SILENT"] = "true"
    run = wandb.init(mode="offline", dir=str(workdir), project="bench")
    lat = time_calls(steps, lambda d, i: run.log(d, step=i))
    t0 = time.perf_counter()
    run.finish()
    res.finish.append(time.perf_counter() - t0)
    res.medians.append(float(np.median(lat)))
    res.p99s.append(float(np.percentile(lat, 99)))
    files = list(workdir.rglob("*.wandb"))
    res.bytes_per_scalar.append(sum(f.stat().st_size for f in files) / (4 * len(steps)))


def bench_tensorboard(steps: list[Step], workdir: Path, res: Result) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(workdir / "tb"))

    def call(d: Step, i: int) -> None:
        for k, v in d.items():
            writer.add_scalar(k, v, i)

    lat = time_calls(steps, call)
    t0 = time.perf_counter()
    writer.close()
    res.finish.append(time.perf_counter() - t0)
    res.medians.append(float(np.median(lat)))
    res.p99s.append(float(np.percentile(lat, 99)))
    res.bytes_per_scalar.append(dir_bytes(workdir / "tb") / (4 * len(steps)))


def _bench_mlflow(uri: str, steps: list[Step], workdir: Path, res: Result) -> None:
    import mlflow

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 keeps it, in maintenance mode
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("bench")
    with mlflow.start_run():
        before = dir_bytes(workdir)
        lat = time_calls(steps, lambda d, i: mlflow.log_metrics(d, step=i))
        t0 = time.perf_counter()
    res.finish.append(time.perf_counter() - t0)
    res.medians.append(float(np.median(lat)))
    res.p99s.append(float(np.percentile(lat, 99)))
    res.bytes_per_scalar.append((dir_bytes(workdir) - before) / (4 * len(steps)))


def bench_mlflow_file(steps: list[Step], workdir: Path, res: Result) -> None:
    _bench_mlflow((workdir / "mlruns").as_uri(), steps, workdir, res)


def bench_mlflow_sqlite(steps: list[Step], workdir: Path, res: Result) -> None:
    _bench_mlflow(f"sqlite:///{workdir / 'mlflow.db'}", steps, workdir, res)


def bench_aim(steps: list[Step], workdir: Path, res: Result) -> None:
    import aim

    run = aim.Run(repo=str(workdir / "aim"))

    def call(d: Step, i: int) -> None:
        for k, v in d.items():
            run.track(v, name=k, step=i)

    lat = time_calls(steps, call)
    t0 = time.perf_counter()
    run.close()
    res.finish.append(time.perf_counter() - t0)
    res.medians.append(float(np.median(lat)))
    res.p99s.append(float(np.percentile(lat, 99)))
    res.bytes_per_scalar.append(dir_bytes(workdir / "aim") / (4 * len(steps)))


def writer_throughput(points: int, workdir: Path, monitor: bool) -> tuple[float, float, float, int]:
    """(points/s written, seconds until written, finish() seconds, points pending at finish).

    The training thread logs ``points`` as fast as it can while the writer is starved of
    the GIL (a long switch interval), so nearly all of them are pending when ``finish()``
    is called; the time until every point is durable measures the writer alone (coercion,
    encoding, SQLite); ``finish()`` also waits for live detection when it is on.
    """
    steps = make_steps(points // 4, seed=1)
    run = runwatch.init(
        name="throughput", store=workdir / "tp.db", max_pending_points=points, monitor=monitor
    )
    old = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        for i, data in enumerate(steps):
            run.log(data, step=i)
    finally:
        sys.setswitchinterval(old)
    pending = run.stats()["pending"]
    t0 = time.perf_counter()
    done = threading.Event()
    written_at: list[float] = []

    def watch() -> None:
        while not done.is_set() and run.stats()["written"] < 4 * len(steps):
            time.sleep(0.005)
        written_at.append(time.perf_counter() - t0)

    watcher = threading.Thread(target=watch)
    watcher.start()
    run.finish()
    took = time.perf_counter() - t0
    done.set()
    watcher.join()
    assert run.stats()["written"] == 4 * len(steps), run.stats()
    return pending / written_at[0], written_at[0], took, pending


ANCHORS: list[tuple[str, Callable[[list[Step], Path, Result], None], int]] = [
    # (name, bench, max steps: the slow stores get fewer steps; latency is per call)
    ("runwatch", bench_runwatch, 10**9),
    ("wandb 0.31 offline", bench_wandb, 10**9),
    ("TensorBoard add_scalar x4", bench_tensorboard, 10**9),
    ("MLflow log_metrics (file)", bench_mlflow_file, 5000),
    ("MLflow log_metrics (sqlite)", bench_mlflow_sqlite, 1000),
    ("Aim track x4", bench_aim, 5000),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--throughput-points", type=int, default=1_000_000)
    parser.add_argument("--only", nargs="*", help="tool names to run (substring match)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results: list[Result] = []
    for name, bench, cap in ANCHORS:
        if args.only and not any(o.lower() in name.lower() for o in args.only):
            continue
        res = Result(name)
        steps = make_steps(min(args.steps, cap))
        for _ in range(args.repeats):
            workdir = Path(tempfile.mkdtemp(prefix="rwbench-"))
            try:
                bench(steps, workdir, res)
            except ImportError as exc:
                res.note = f"not installed ({exc.name})"
                break
            except Exception as exc:  # an anchor failing must not hide the others
                res.note = f"failed: {type(exc).__name__}: {str(exc)[:80]}"
                break
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
        results.append(res)
        print(f"... {name} done", file=sys.stderr)

    ours = next((r for r in results if r.name == "runwatch" and r.medians), None)
    print(
        f"\nlogging 4 scalars per step; {args.repeats} repeats; median over repeats "
        "[min-max of the repeats]\n"
    )
    header = (
        f"{'tool':30} {'median/step':>24} {'p99/step':>24} {'finish s':>9} "
        f"{'B/scalar':>9} {'x runwatch':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        if not r.medians:
            print(f"{r.name:30} {r.note}")
            continue
        med = statistics.median(r.medians) * 1e6
        p99 = statistics.median(r.p99s) * 1e6
        ratio = med / (statistics.median(ours.medians) * 1e6) if ours else float("nan")
        print(
            f"{r.name:30} {med:9.2f} us [{min(r.medians) * 1e6:.2f}-{max(r.medians) * 1e6:.2f}]"
            f" {p99:9.2f} us [{min(r.p99s) * 1e6:.1f}-{max(r.p99s) * 1e6:.1f}]"
            f" {statistics.median(r.finish):9.2f} {statistics.median(r.bytes_per_scalar):9.1f}"
            f" {ratio:10.0f}"
        )

    for monitor in (False, True):
        label = "on" if monitor else "off"
        print(f"\nrunwatch writer, live detection {label} (points pending at finish()):")
        rates = []
        for _ in range(args.repeats):
            workdir = Path(tempfile.mkdtemp(prefix="rwbench-"))
            try:
                rate, written, took, pending = writer_throughput(
                    args.throughput_points, workdir, monitor
                )
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            rates.append(rate)
            print(
                f"  {pending:>9,} pending -> all written in {written:.2f} s "
                f"({rate:,.0f} points/s); finish() returned after {took:.2f} s"
            )
        print(
            f"  median {statistics.median(rates):,.0f} points/s "
            f"[{min(rates):,.0f}-{max(rates):,.0f}]"
        )


if __name__ == "__main__":
    main()
