"""Detection on runs logged every K steps, as trainers log them, against the code before.

    python bench/sparse_logging.py [--before WORKTREE] [--every 1,10,50]

1. ``bench/detection.py --every K`` on this tree and, with ``--before``, on a built
   worktree of the code before (the anchor), for each K: false alarms per 100k steps on
   the clean real runs and warning recall of the injected plateaus and level shifts (by
   size), held-in and held-out.
2. Healthy synthetic curves (40 seeded power laws, 5k-60k steps, per-step noise 0.2-3%),
   logged every K steps as window means: warning episodes of ``CurveDeviation`` with the
   default windows and with ``max_thinning=1`` (the windows in points, as before), and how
   many of the series got a fit at all. No fault is injected: every warning is false.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runwatch.detect.deviation import CurveDeviation  # noqa: E402

REAL_RUNS = ROOT.parent / "shared" / "data" / "real_runs"
ROW = re.compile(r"^(\S+|  \S+)\s+runwatch\(warn\+\)\s+(\d+)\s+([\d.]+)")
ALARMS = re.compile(r"false alarms per 100k steps, (held-\w+): ours ([\d.]+)")
KEPT = ("plateau", "level_shift", "  >=6x", "  +10%", "  +5%", "  +3%")


def detection_rows(tree: Path, every: int) -> dict[str, str]:
    """Figures of this tree's ``detection.py --every`` on ``tree``'s code (copied there
    when ``tree`` is another worktree): '<row> <set>' -> 'recall (n)'."""
    script = tree / "bench" / "detection_now.py"
    if tree == ROOT:
        script = ROOT / "bench" / "detection.py"
    else:
        shutil.copyfile(ROOT / "bench" / "detection.py", script)
    out = subprocess.run(
        [sys.executable, str(script), "--every", str(every), "--data", str(REAL_RUNS)],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    figures: dict[str, str] = {}
    held = "held-in"
    for line in out.splitlines():
        if (m := ALARMS.match(line)) is not None:
            figures[f"false alarms /100k {m[1]}"] = m[2]
        elif "held-out runs ==" in line:
            held = "held-out"
        elif (m := ROW.match(line)) is not None and m[1] in KEPT:
            figures[f"{m[1].strip()} {held}"] = f"{m[3]} ({m[2]})"
    return figures


def healthy_curves(count: int = 40) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    curves = []
    for _ in range(count):
        n = int(rng.choice([5000, 20000, 60000]))
        s = np.arange(1, n + 1)
        floor, scale = rng.uniform(1.5, 3.0), rng.uniform(3, 12)
        alpha, offset = rng.uniform(0.2, 0.6), rng.uniform(10, 500)
        noise = rng.choice([rng.uniform(0.002, 0.006), rng.uniform(0.006, 0.03)])
        curves.append(
            (s, (floor + scale * (s + offset) ** -alpha) * np.exp(noise * rng.normal(size=n)))
        )
    return curves


def synthetic_false_alarms(every: int, max_thinning: float) -> tuple[int, float, int]:
    """(warning episodes, per 100k steps, series with a fit) over the healthy curves."""
    episodes = steps = fitted = 0
    for s, v in healthy_curves():
        m = len(s) // every
        logged_steps = s[every - 1 :: every][:m].tolist()
        logged = v[: m * every].reshape(m, every).mean(axis=1).tolist()
        detector = CurveDeviation(max_thinning=max_thinning)
        last = None
        for step, value in zip(logged_steps, logged, strict=True):
            sig = detector.update(step, value)
            if sig is not None and sig.severity == "warning":
                episodes += last is None or step - last > detector.quiet * every
                last = step
        steps += len(s)
        fitted += detector.n_fits > 0
    return episodes, episodes / steps * 1e5, fitted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--before", type=Path, help="a built worktree of the code before (its runwatch is run)"
    )
    parser.add_argument("--every", default="1,10,50", help="logging intervals, comma-separated")
    args = parser.parse_args()
    began = time.perf_counter()
    cadences = [int(k) for k in args.every.split(",")]
    trees = {"now": ROOT} | ({"before": args.before} if args.before else {})
    print("== real runs (bench/detection.py --every K): warning recall (trials), false alarms")
    for every in cadences:
        got = {label: detection_rows(tree, every) for label, tree in trees.items()}
        print(f"\nlogged every {every} steps")
        print(f"{'figure':<32}" + "".join(f"{label:>14}" for label in trees))
        for key in got["now"]:
            print(f"{key:<32}" + "".join(f"{got[t].get(key, '-'):>14}" for t in trees))
    print("\n== healthy synthetic curves, CurveDeviation alone: warning episodes (all false)")
    print(f"{'every':>5} {'windows':<22} {'episodes':>8} {'per 100k':>9} {'fitted':>7}")
    for every in cadences:
        for label, thinning in (("default", 10.0), ("in points (before)", 1.0)):
            n, per, fitted = synthetic_false_alarms(every, thinning)
            print(f"{every:>5} {label:<22} {n:>8} {per:>9.2f} {fitted:>4}/40")
    print(f"\n({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
