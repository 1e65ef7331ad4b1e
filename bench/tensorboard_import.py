"""Benchmark: a TensorBoard logdir into the store, and ``runwatch watch`` latency.

Import: a logdir of 1M scalars (4 run dirs x 5 tags x 50,000 steps, written once by torch's
``SummaryWriter`` into ``--logdir``, kept for later runs; writing it takes ~80 s) is imported
by ``import_logdir`` into a fresh SQLite store, against the anchor ``tbparse.SummaryReader(
logdir).scalars`` (the same logdir into a pandas DataFrame), in the same run. Also
measured as an anchor: TensorBoard's record reader alone over one run dir (the floor both
share: its CRC checks are pure Python without TensorFlow). Wall and CPU time per case, the
median and spread over the repeats. Goal: import faster than tbparse.

Watch latency: ``runwatch watch`` runs as a subprocess on a logdir being written; each
trial writes a few finite losses, then a NaN, ``flush()``es the writer and times until a
``nonfinite`` anomaly at that step is in the store. p50/p99/max over ``--trials``. Goal:
p99 <= 1 s (from the flush).

    python bench/tensorboard_import.py [--repeats 3] [--tbparse-repeats 3] [--trials 20]

Both take 20-35 s a pass here (tbparse up to 75 s when the machine is busy); the two cases
are interleaved, so a noisy moment hits both.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runwatch.collectors.tensorboard import EventFile, event_files, import_logdir  # noqa: E402
from runwatch.store import Store  # noqa: E402

RUNS, TAGS, STEPS = 4, 5, 50_000
SCALARS = RUNS * TAGS * STEPS


def make_logdir(root: Path) -> None:
    """Write the 1M-scalar logdir once; a ``.complete`` marker says it is whole."""
    if (root / ".complete").exists():
        return
    from torch.utils.tensorboard import SummaryWriter

    print(f"writing {SCALARS:,} scalars into {root} (once, ~80 s)...", flush=True)
    for r in range(RUNS):
        writer = SummaryWriter(str(root / f"run{r}"), max_queue=10_000, flush_secs=600)
        for step in range(STEPS):
            writer.add_scalar("train/loss", 3.0 * (step + 10) ** -0.1, step)
            writer.add_scalar("train/grad_norm", 1.0 + 0.001 * (step % 100), step)
            writer.add_scalar("train/lr", 3e-4, step)
            writer.add_scalar("perf/tokens_per_s", 1e5, step)
            writer.add_scalar("perf/step_time", 0.1, step)
        writer.close()
    (root / ".complete").write_text("ok")


def timed(fn) -> tuple[float, float, object]:
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def runwatch_import(logdir: Path) -> int:
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "bench.db") as store:
        summary = import_logdir(store, logdir)
        return sum(summary.points.values())


def tbparse_read(logdir: Path) -> int:
    from tbparse import SummaryReader

    return len(SummaryReader(str(logdir)).scalars)


def reader_only(logdir: Path) -> int:
    n = 0
    for _, path in event_files(logdir / "run0"):
        file = EventFile(path)
        for _ in file.events():
            n += 1
        file.close()
    return n


def import_cases(logdir: Path, repeats: int, tb_repeats: int) -> list[dict]:
    results = {
        "runwatch import_logdir -> SQLite": [],
        "anchor: tbparse SummaryReader(...).scalars": [],
    }
    fns = {
        "runwatch import_logdir -> SQLite": runwatch_import,
        "anchor: tbparse SummaryReader(...).scalars": tbparse_read,
    }
    for i in range(max(repeats, tb_repeats)):  # interleaved: a noisy moment hits both
        for name, fn in fns.items():
            if i >= (tb_repeats if "tbparse" in name else repeats):
                continue
            wall, cpu, n = timed(lambda fn=fn: fn(logdir))
            assert n == SCALARS, f"{name} read {n} scalars, not {SCALARS}"
            results[name].append((wall, cpu))
            print(f"  {name}: {wall:.1f} s", flush=True)
    wall, cpu, n = timed(lambda: reader_only(logdir))
    rows = []
    for name, runs in results.items():
        walls = [w for w, _ in runs]
        cpus = [c for _, c in runs]
        rows.append(
            {
                "case": name,
                "n": len(runs),
                "wall": statistics.median(walls),
                "lo": min(walls),
                "hi": max(walls),
                "cpu": statistics.median(cpus),
            }
        )
    rows.append(
        {
            "case": f"anchor: TensorBoard record reader alone, run0 ({n:,} records) x{RUNS}",
            "n": 1,
            "wall": wall * RUNS,
            "lo": wall * RUNS,
            "hi": wall * RUNS,
            "cpu": cpu * RUNS,
        }
    )
    return rows


def watch_latency(trials: int) -> list[float]:
    from torch.utils.tensorboard import SummaryWriter

    latencies = []
    with tempfile.TemporaryDirectory() as tmp:
        root, db = Path(tmp) / "logs", Path(tmp) / "watch.db"
        writer = SummaryWriter(str(root / "live"), flush_secs=3600)
        watcher = subprocess.Popen(
            [sys.executable, "-m", "runwatch.cli", "watch", str(root), "--db", str(db)],
            cwd=ROOT,
            stderr=subprocess.DEVNULL,
        )
        try:
            step = 0
            for _ in range(trials + 1):  # the first trial warms up (imports, run start)
                for _ in range(5):
                    writer.add_scalar("loss", 3.0 / (step + 1), step)
                    step += 1
                writer.add_scalar("loss", math.nan, step)
                writer.flush()
                flushed = time.perf_counter()
                nan_step = step
                step += 1
                while True:
                    try:
                        with Store(db) as store:
                            found = store.anomalies("live")
                        hit = (found["detector"].str.contains("nonfinite")) & (
                            found["start_step"] == nan_step
                        )
                        if hit.any():
                            break
                    except Exception:  # the store or the run not made yet
                        pass
                    if time.perf_counter() - flushed > 30:
                        raise RuntimeError(f"no anomaly for the NaN at step {nan_step} in 30 s")
                    time.sleep(0.01)
                latencies.append(time.perf_counter() - flushed)
        finally:
            writer.close()
            watcher.terminate()
            watcher.wait(30)
    return latencies[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default="/tmp/runwatch-bench-tb-1m")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tbparse-repeats", type=int, default=3)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "tensorboard_import.md"))
    args = parser.parse_args()
    logdir = Path(args.logdir)
    make_logdir(logdir)
    started = time.perf_counter()
    rows = import_cases(logdir, args.repeats, args.tbparse_repeats)
    lat = sorted(watch_latency(args.trials))
    p50 = statistics.median(lat)
    p99 = lat[min(len(lat) - 1, math.ceil(0.99 * len(lat)) - 1)]
    ours = rows[0]["wall"]
    lines = [
        "# TensorBoard logdir import and watch latency",
        "",
        f"`python bench/tensorboard_import.py --repeats {args.repeats} --tbparse-repeats "
        f"{args.tbparse_repeats} --trials {args.trials}` ({os.cpu_count()} noisy cores; "
        f"{time.perf_counter() - started:.0f} s). Logdir: {SCALARS:,} scalars, {RUNS} run "
        f"dirs x {TAGS} tags x {STEPS:,} steps, written by torch's SummaryWriter.",
        "",
        "| case | n | wall median s | wall min-max s | CPU median s | scalars/s | vs import |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['n']} | {r['wall']:.1f} | {r['lo']:.1f}-{r['hi']:.1f} | "
            f"{r['cpu']:.1f} | {SCALARS / r['wall']:,.0f} | {r['wall'] / ours:.2f}x |"
        )
    verdict = "met" if rows[0]["wall"] < rows[1]["wall"] else "NOT met"
    lines += [
        "",
        f"Goal, import faster than tbparse: **{verdict}** "
        f"({rows[1]['wall'] / ours:.1f}x faster by wall medians, "
        f"{rows[1]['cpu'] / rows[0]['cpu']:.1f}x by CPU medians, the fairer figure on a busy "
        "machine).",
        "",
        "| watch latency (NaN scalar flushed -> nonfinite anomaly stored) | trials | p50 s | "
        "p99 s | max s |",
        "|---|---|---|---|---|",
        f"| `runwatch watch LOGDIR` (default --poll 0.2) | {len(lat)} | {p50:.2f} | "
        f"{p99:.2f} | {lat[-1]:.2f} |",
        "",
        f"Goal, p99 <= 1 s: **{'met' if p99 <= 1.0 else 'NOT met'}**.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
