"""Replay speed of the full default detector set on the 18 real runs (issue 3).

Measures ``analyze_frame`` over every real run (the same runs ``bench/detection.py``
loads: all metrics, 582k points), streaming (``fast=False``: every row through
``Monitor.update``) against batch (``fast=True``: ``Monitor.update_batch``), as points
per second of wall and CPU time: median and spread (min-max) of ``--repeats`` runs. The
machine is shared, so CPU time is the steadier figure.

The per-detector breakdown runs each default detector alone over every series of its
role, point by point (``update``) and batched (``update_many``), in microseconds per point
of that detector and in CPU seconds over all runs; "share" is the batched time against
the batch replay's total. The last line is the part of CurveDeviation's batched time
spent in its power-law refits (a cost per refit, not per point).

    /work/venv/bin/python bench/replay_speed.py            # 3 repeats
    /work/venv/bin/python bench/replay_speed.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from detection import DATA, load_runs  # noqa: E402  (bench/ is the script's own folder)

from runwatch.detect import analyze_frame  # noqa: E402
from runwatch.detect.deviation import CurveDeviation  # noqa: E402
from runwatch.detect.roles import DEFAULT_DETECTORS, role_of  # noqa: E402


def replay_times(runs: dict[str, pd.DataFrame], fast: bool) -> tuple[float, float]:
    """(wall, cpu) seconds of one replay of every run."""
    w0, c0 = time.perf_counter(), time.process_time()
    for df in runs.values():
        analyze_frame(df, fast=fast)
    return time.perf_counter() - w0, time.process_time() - c0


def series_of(runs: dict[str, pd.DataFrame]) -> list[tuple[str, list[int], list[float]]]:
    """(role, steps, values) per metric series, in replay order (stable by step)."""
    out = []
    for df in runs.values():
        for metric, g in df.groupby("metric", sort=False):
            order = np.argsort(g["step"].to_numpy(), kind="stable")
            st = g["step"].to_numpy()[order].astype(np.int64).tolist()
            v = g["value"].to_numpy(dtype=float)[order].tolist()
            out.append((role_of(str(metric)), st, v))
    return out


def per_detector(series) -> pd.DataFrame:
    """CPU seconds per default detector class, point by point and batched."""
    rows: dict[str, dict[str, float]] = {}
    for role, st, v in series:
        for k, det in enumerate(DEFAULT_DETECTORS[role]()):
            if k == 0:
                continue  # NonFinite: batch replay visits only the non-finite points
            name = type(det).__name__
            r = rows.setdefault(name, {"points": 0, "stream_s": 0.0, "batch_s": 0.0})
            r["points"] += len(v)
            upd = det.update
            c0 = time.process_time()
            for s, x in zip(st, v, strict=True):
                upd(s, x)
            r["stream_s"] += time.process_time() - c0
            fresh = DEFAULT_DETECTORS[role]()[k]
            c0 = time.process_time()
            fresh.update_many(st, v)
            r["batch_s"] += time.process_time() - c0
    df = pd.DataFrame.from_dict(rows, orient="index")
    df["stream_us"] = df["stream_s"] / df["points"] * 1e6
    df["batch_us"] = df["batch_s"] / df["points"] * 1e6
    return df.sort_values("batch_s", ascending=False)


class _TimedRefits(CurveDeviation):
    """CurveDeviation that adds up the CPU time of its power-law refits."""

    cpu = 0.0
    fits = 0

    def _refit(self, step: float) -> None:
        c0 = time.process_time()
        super()._refit(step)
        _TimedRefits.cpu += time.process_time() - c0
        _TimedRefits.fits += 1


def refit_cpu(series) -> tuple[float, int]:
    """CPU seconds and count of CurveDeviation's refits in a batched run over the loss
    series (the part of its time that does not scale with the points)."""
    _TimedRefits.cpu, _TimedRefits.fits = 0.0, 0
    for role, st, v in series:
        if role == "loss":
            _TimedRefits().update_many(st, v)
    return _TimedRefits.cpu, _TimedRefits.fits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    runs = load_runs(args.data)
    points = sum(len(d) for d in runs.values())
    print(f"{len(runs)} runs, {points:,} points, {args.repeats} repeats")
    print(f"{'path':10s} {'clock':5s} {'median pts/s':>13s} {'min':>10s} {'max':>10s}")
    totals = {}
    for fast, label in ((False, "streaming"), (True, "batch")):
        times = [replay_times(runs, fast) for _ in range(args.repeats)]
        for j, clock in enumerate(("wall", "cpu")):
            rates = [points / t[j] for t in times]
            print(
                f"{label:10s} {clock:5s} {statistics.median(rates):13,.0f} "
                f"{min(rates):10,.0f} {max(rates):10,.0f}"
            )
        totals[label] = statistics.median(t[1] for t in times)
    print(f"batch speed-up (CPU): x{totals['streaming'] / totals['batch']:.2f}")
    det = per_detector(series_of(runs))
    det["share"] = det["batch_s"] / totals["batch"]
    print("\nper detector (alone, CPU; us per point of the series it runs on):")
    print(
        det[["points", "stream_us", "batch_us", "stream_s", "batch_s", "share"]].to_string(
            float_format=lambda x: f"{x:.2f}"
        )
    )
    cpu, fits = refit_cpu(series_of(runs))
    print(
        f"CurveDeviation power-law refits: {cpu:.2f} s CPU ({fits} refits), "
        f"share {cpu / totals['batch']:.2f}"
    )


if __name__ == "__main__":
    main()
