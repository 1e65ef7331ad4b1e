"""Benchmark: ``runwatch watch --log FILE`` latency, a NaN line appended -> anomaly stored.

    python bench/watch_log_latency.py [--trials 20] [--poll 0.2]

``runwatch watch --log train.log --preset nanogpt`` runs as a subprocess, with its default
settings unless ``--poll`` says otherwise; this process appends nanoGPT ``iter N: loss x,
time Tms, mfu m%`` lines to the file as a training job's stdout would (each line flushed),
five normal steps then one with ``loss nan``, and times from the NaN line's flush until a
``nonfinite`` anomaly at that step is in the store. Goal (issue 19): p99 <= 1 s.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runwatch.store import Store  # noqa: E402


def _stored(db: Path, step: int) -> bool:
    try:
        with Store(db, readonly=True) as store:
            for run in store.runs()["name"]:
                found = store.anomalies(run)
                hit = found["detector"].str.contains("nonfinite") & (found["start_step"] == step)
                if hit.any():
                    return True
    except Exception:  # the store or the run not made yet
        pass
    return False


def watch_latency(trials: int, poll: float | None) -> list[float]:
    latencies = []
    with tempfile.TemporaryDirectory() as tmp:
        log, db = Path(tmp) / "train.log", Path(tmp) / "watch.db"
        log.touch()
        cmd = [sys.executable, "-m", "runwatch.cli", "watch", "--log", str(log)]
        cmd += ["--preset", "nanogpt", "--db", str(db)]
        if poll is not None:
            cmd += ["--poll", str(poll)]
        watcher = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.DEVNULL)
        try:
            step = 0
            with log.open("a") as out:
                for _ in range(trials + 1):  # the first trial warms up (imports, run start)
                    for _ in range(5):
                        out.write(f"iter {step}: loss {3.0 / (step + 1):.4f}, time 100.00ms, ")
                        out.write("mfu 30.00%\n")
                        out.flush()
                        step += 1
                    out.write(f"iter {step}: loss nan, time 100.00ms, mfu 30.00%\n")
                    out.flush()
                    flushed, nan_step = time.perf_counter(), step
                    step += 1
                    while not _stored(db, nan_step):
                        if time.perf_counter() - flushed > 30:
                            raise RuntimeError(f"no anomaly for the NaN at step {nan_step} in 30 s")
                        time.sleep(0.01)
                    latencies.append(time.perf_counter() - flushed)
        finally:
            watcher.terminate()
            watcher.wait(30)
    return latencies[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--poll", type=float, default=None, help="watch --poll (default: its own)")
    args = parser.parse_args()
    lat = np.array(watch_latency(args.trials, args.poll))
    setting = "default --poll" if args.poll is None else f"--poll {args.poll} (not the default)"
    print(
        f"| watch --log, NaN line -> anomaly stored ({setting}) | trials | p50 s | p99 s |", end=""
    )
    print(" max s |")
    print("|---|---|---|---|---|")
    p50, p99 = np.percentile(lat, [50, 99])
    print(f"| nanogpt preset | {len(lat)} | {p50:.3f} | {p99:.3f} | {lat.max():.3f} |")


if __name__ == "__main__":
    main()
