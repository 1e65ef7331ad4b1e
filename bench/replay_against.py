"""Batch replay speed of this checkout against another one, interleaved in the same run.

Each repeat replays every real run (``analyze_frame``, the default detectors, batch path)
once with this checkout's ``runwatch`` and once with ``--before``'s, each in a fresh
subprocess, alternating which goes first; prints points per second of CPU and wall time
(median and min-max) and the ratio. The other checkout must be built in place
(``python setup.py build_ext --inplace``). It also checks that both find the same
episodes (detector, metric, labels, first and last step, severity) on every run.

    .venv/bin/python bench/replay_against.py --before /path/to/old/checkout --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEASURE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from detection import DATA, load_runs  # the tree's own bench: it puts the tree first
import runwatch
from runwatch.detect import analyze_frame
assert runwatch.__file__.startswith(sys.argv[2]), (runwatch.__file__, sys.argv[2])
runs = load_runs(DATA)
points = sum(len(d) for d in runs.values())
found = {}
w0, c0 = time.perf_counter(), time.process_time()
for name, df in runs.items():
    found[name] = analyze_frame(df)
wall, cpu = time.perf_counter() - w0, time.process_time() - c0
episodes = {
    name: sorted(
        [a.detector, a.metric, sorted(a.labels.items()), a.start_step, a.end_step, a.severity]
        for a in anomalies
    )
    for name, anomalies in found.items()
}
print(json.dumps({"points": points, "wall": wall, "cpu": cpu, "episodes": episodes},
                 default=str))
"""


def replay(tree: Path) -> dict:
    """One batch replay of every real run with ``tree``'s runwatch, in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tree / "bench"), str(tree)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tree,
    )
    return json.loads(out.stdout.splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="the other checkout")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    trees = {"before": args.before.resolve(), "after": ROOT}
    got: dict[str, list[dict]] = {"before": [], "after": []}
    for r in range(args.repeats):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for name in order:
            got[name].append(replay(trees[name]))
    points = got["after"][0]["points"]
    print(f"{points:,} points, {args.repeats} repeats, batch replay of every real run")
    print(f"{'tree':8s} {'clock':5s} {'median pts/s':>13s} {'min':>10s} {'max':>10s}")
    medians = {}
    for name in ("before", "after"):
        for clock in ("cpu", "wall"):
            rates = [points / g[clock] for g in got[name]]
            medians[(name, clock)] = statistics.median(rates)
            print(
                f"{name:8s} {clock:5s} {statistics.median(rates):13,.0f} "
                f"{min(rates):10,.0f} {max(rates):10,.0f}"
            )
    print(f"after / before (CPU): x{medians[('after', 'cpu')] / medians[('before', 'cpu')]:.2f}")
    same = got["before"][0]["episodes"] == got["after"][0]["episodes"]
    n = sum(len(v) for v in got["after"][0]["episodes"].values())
    print(f"episodes: {n} after; identical to before on every run: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
