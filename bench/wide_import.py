"""Benchmark: a wide CSV of 1M rows x 10 metrics into a store, against the same data in long
format (issue 19's goal: >= 1M points/s).

The data: steps 0..N-1 and 10 float metrics (a noisy decaying curve each), about 3% of the
cells blank (not logged), written once as a wide CSV (``step,m0..m9``) and once as long
format (``run,step,metric,value``, one row per non-blank cell) with pyarrow's CSV writer.

Cases, interleaved round-robin for ``--repeats`` rounds into a fresh store each time:

- ``wide (import_wide)``: :func:`runwatch.collectors.wide.import_wide` in this process;
- ``wide (runwatch import)``: the CLI in a child process (interpreter start-up included);
- ``long (runwatch import)``: the anchor, the same points as long-format CSV through the CLI.

Points/s counts the points stored (read back once per case) over the wall time. Results to
stdout as a Markdown table; ``--out`` writes it to a file too.

    python bench/wide_import.py [--rows 1000000] [--metrics 10] [--repeats 3] [--out F]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runwatch.collectors.wide import import_wide  # noqa: E402
from runwatch.store import open_store  # noqa: E402

GOAL = 1_000_000.0


def make_data(rows: int, metrics: int, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    steps = np.arange(rows, dtype=np.int64)
    cols = []
    for i in range(metrics):
        curve = 2.0 + (i + 1) * np.exp(-steps / (rows / 5)) + rng.normal(0, 0.05, rows)
        curve[rng.random(rows) < 0.03] = np.nan  # blank: not logged at this step
        cols.append(curve)
    return steps, cols


def write_files(tmp: Path, steps: np.ndarray, cols: list[np.ndarray]) -> tuple[Path, Path, int]:
    names = [f"m{i}" for i in range(len(cols))]
    wide = tmp / "wide.csv"
    table = pa.table(
        {
            "step": steps,
            **{n: pa.array(c, from_pandas=True) for n, c in zip(names, cols, strict=True)},
        }
    )
    pcsv.write_csv(table, wide)  # nulls are written as empty cells
    long = tmp / "long.csv"
    parts = []
    for name, col in zip(names, cols, strict=True):
        keep = ~np.isnan(col)
        n = int(keep.sum())
        parts.append(
            pa.table(
                {
                    "run": pa.array(["bench"] * n),
                    "step": steps[keep],
                    "metric": pa.array([name] * n),
                    "value": col[keep],
                }
            )
        )
    points = sum(len(p) for p in parts)
    # unquoted, as a user's long file is (the long reader re-reads quoted chunks row by row)
    pcsv.write_csv(pa.concat_tables(parts), long, pcsv.WriteOptions(quoting_style="none"))
    return wide, long, points


def stored(db: Path, run: str) -> int:
    with open_store(str(db), readonly=True) as store:
        return int(store.runs().set_index("name").loc[run, "points"])


def case_library(wide: Path, db: Path) -> float:
    store = open_store(str(db))
    began = time.perf_counter()
    with store:
        import_wide(store, wide, run_name="bench")
    return time.perf_counter() - began


def case_cli(src: Path, db: Path, extra: list[str]) -> float:
    cmd = [sys.executable, "-m", "runwatch.cli", "import", str(src), "--db", str(db), *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    began = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--metrics", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        began = time.perf_counter()
        wide, long, points = write_files(tmp, *make_data(args.rows, args.metrics))
        made = time.perf_counter() - began
        cases = {
            "wide (import_wide)": lambda db: case_library(wide, db),
            "wide (runwatch import)": lambda db: case_cli(wide, db, ["--run", "bench"]),
            "long (runwatch import), anchor": lambda db: case_cli(long, db, []),
        }
        times: dict[str, list[float]] = {c: [] for c in cases}
        for r in range(args.repeats):
            for case, run in cases.items():
                db = tmp / f"{r}-{len(times[case])}-{case.split()[0]}.db"
                times[case].append(run(db))
                got = stored(db, "bench")
                if got != points:
                    raise SystemExit(f"{case}: stored {got} points, expected {points}")
                db.unlink()
        size = {"wide": wide.stat().st_size, "long": long.stat().st_size}

    lines = [
        "# Wide CSV import: `bench/wide_import.py`",
        "",
        f"- Command: `python bench/wide_import.py --rows {args.rows} --metrics {args.metrics} "
        f"--repeats {args.repeats}`",
        f"- Machine: {platform.machine()}, {os.cpu_count()} shared cores, Python "
        f"{platform.python_version()}, pyarrow {pa.__version__}",
        f"- Data: {args.rows:,} rows x {args.metrics} metrics, ~3% blank: {points:,} points; "
        f"wide CSV {size['wide'] / 2**20:.0f} MiB, long CSV {size['long'] / 2**20:.0f} MiB "
        f"(made in {made:.1f} s)",
        f"- Goal: >= {GOAL:,.0f} points/s. Every case stored all {points:,} points "
        "(read back and checked).",
        "",
        "| case | median s | min-max s | points/s (median) | vs anchor |",
        "| --- | --- | --- | --- | --- |",
    ]
    anchor = statistics.median(times["long (runwatch import), anchor"])
    for case, ts in times.items():
        med = statistics.median(ts)
        lines.append(
            f"| {case} | {med:.2f} | {min(ts):.2f}-{max(ts):.2f} | {points / med:,.0f} | "
            f"{anchor / med:.2f}x |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
