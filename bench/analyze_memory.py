"""Peak memory and wall time of ``runwatch analyze`` on a big run, before against after.

Builds the big run of ``bench/dashboard.py`` (``--steps`` steps x 10 metrics, two attempts,
a spike and a NaN) once and caches it under /tmp. Each repeat runs ``runwatch analyze
--format json`` in a fresh subprocess under ``/usr/bin/time -v`` on a fresh copy of the
store, once with the code of ``--before`` (a ``git worktree`` of the revision to compare
with) and once with this checkout, interleaved, so a busy machine hits both alike. It
reports the peak RSS and wall time (median and min-max over the repeats), and checks
that every run printed the same anomalies and stored the same rows (anomalies, expected
curves) as the first "before" run.

    git worktree add --detach /tmp/mem-base <rev>
    /work/venv/bin/python bench/analyze_memory.py --before /tmp/mem-base --repeats 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

CLI = "import sys; from runwatch.cli import main; sys.exit(main())"
STORED = {
    "anomalies": "SELECT * FROM anomalies",
    "expected_curves": "SELECT * FROM expected_curves",
}


def cached_store(steps: int, cache: Path) -> Path:
    db = cache / f"analyze_{steps}.db"
    if not db.exists():
        from dashboard import build

        cache.mkdir(parents=True, exist_ok=True)
        part = db.with_suffix(".part")
        part.unlink(missing_ok=True)
        started = time.perf_counter()
        build(part, steps)
        part.rename(db)
        print(f"built {db} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return db


def stored_rows(db: Path) -> dict[str, list[tuple]]:
    conn = sqlite3.connect(db)
    try:
        out = {}
        for name, sql in STORED.items():
            cur = conn.execute(sql)
            cols = [c[0] for c in cur.description]
            keep = [i for i, c in enumerate(cols) if c not in ("created", "updated")]
            out[name] = sorted((tuple(row[i] for i in keep) for row in cur), key=repr)
        return out
    finally:
        conn.close()


def run_once(code: Path, db: Path, work: Path) -> tuple[float, float, str, dict]:
    """(peak RSS MB, wall s, stdout, stored rows) of one ``runwatch analyze``."""
    copy = work / "run.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{copy}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(db, copy)
    env = {**os.environ, "PYTHONPATH": str(code)}
    cmd = ["/usr/bin/time", "-v", sys.executable, "-c", CLI, "analyze", "--db", str(copy)]
    cmd += ["--run", "big", "--format", "json"]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        raise SystemExit(f"analyze failed in {code}:\n{proc.stderr[-2000:]}")
    rss_kb = next(
        int(line.split(":")[1])
        for line in proc.stderr.splitlines()
        if "Maximum resident set size" in line
    )
    return rss_kb / 1024, wall, proc.stdout, stored_rows(copy)


def spread(xs: list[float], fmt: str) -> str:
    cells = (statistics.median(xs), min(xs), max(xs))
    return " ".join(f"{format(x, fmt):>8}" for x in cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", type=Path, default=Path("/tmp/mem-base"))
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/runwatch-bench"))
    args = parser.parse_args()
    if not (args.before / "runwatch").is_dir():
        raise SystemExit(
            f"{args.before}: no checkout (git worktree add --detach {args.before} REV)"
        )
    db = cached_store(args.steps, args.cache)
    before_rev = subprocess.run(
        ["git", "-C", str(args.before), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    after_rev = subprocess.run(
        ["git", "-C", str(args.after), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    results: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    reference: tuple[str, dict] | None = None
    same = True
    load = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for label, code in (("before", args.before), ("after", args.after)):
                load.append(os.getloadavg()[0])
                rss, wall, out, rows = run_once(code, db, Path(tmp))
                results[label].setdefault("rss", []).append(rss)
                results[label].setdefault("wall", []).append(wall)
                if reference is None:
                    reference = (out, rows)
                elif (out, rows) != reference:
                    same = False
                    print(f"{label}: results differ from the first run", file=sys.stderr)
    n_anomalies = len(reference[0].splitlines()) if reference else 0
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(
        f"python bench/analyze_memory.py --steps {args.steps} --repeats {args.repeats} "
        f"({stamp}, {os.cpu_count()} cores, load {min(load):.1f}-{max(load):.1f})"
    )
    print(
        f"run: {args.steps:,} steps x 10 metrics, two attempts; before = {before_rev}, "
        f"after = {after_rev}"
    )
    print(f"{'':8} {'':13} {'median':>8} {'min':>8} {'max':>8}")
    for label in ("before", "after"):
        print(f"{label:8} {'peak RSS MB':13} {spread(results[label]['rss'], '.0f')}")
        print(f"{label:8} {'wall s':13} {spread(results[label]['wall'], '.2f')}")
    ratio = statistics.median(results["after"]["rss"]) / statistics.median(results["before"]["rss"])
    print(f"peak RSS after/before (medians): {ratio:.2f}")
    verdict = "identical" if same else "DIFFERENT"
    print(
        f"results: {verdict} in every run ({n_anomalies} anomalies printed; stored rows of "
        f"{', '.join(STORED)} compared)"
    )


if __name__ == "__main__":
    main()
