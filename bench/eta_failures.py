"""The failure-aware ETA against the recent-pace ETA on replayed multi-restart runs (issue
18, item 6).

Generates ``bench/scenarios/multi_restart.py`` runs (20k steps, 19 crashes, each followed by
240-420 s of downtime, 600 s more for a hung GPU, and a restart from the last checkpoint),
imports each into a temporary SQLite store with ``runwatch import``, and from each quarter
of the run (upto = 25/50/75% of its final step, using only what was known then) predicts
the remaining wall time two ways:

- ``old``: ``runwatch.expect.forecast.eta_seconds`` (the remaining steps at the recent
  pace of the loss points; what ``runwatch forecast`` and the dashboard show today);
- ``new``: ``runwatch.pipeline.eta.eta_report`` (failures to come, 90% band, goodput).

The truth is the time from the kept curve's point at ``upto`` to the run's last point.
Prints one table per seed, a summary over seeds (median |error|, band coverage), the
same summary for other half-lives of the failure weight (``--shares``, as a share of the
running time so far; ``inf``: no fading), and the model alone on simulated runs whose
failures are a Poisson process (``--trials`` per cell: is the 90% band a 90% band?).

    .venv/bin/python bench/eta_failures.py [--seeds 17,18,19,20,21] [--steps 20000]
        [--shares 0.25,1,inf] [--trials 300] [--out bench/results/eta_failures.md]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import runwatch.expect.eta as eta_model  # noqa: E402
from runwatch.expect.forecast import eta_seconds  # noqa: E402
from runwatch.pipeline.eta import eta_report  # noqa: E402
from runwatch.store import open_store  # noqa: E402

RUN = "multi_restart"
QUARTERS = (0.25, 0.50, 0.75)
RUNWATCH = Path(sys.executable).with_name("runwatch")


def build(seed: int, steps: int, tmp: Path) -> Path:
    """Generate the scenario for ``seed`` and import it into a fresh store; its path."""
    jsonl, db = tmp / f"mr{seed}.jsonl", tmp / f"mr{seed}.db"
    gen = [sys.executable, str(ROOT / "bench/scenarios/multi_restart.py"), str(jsonl)]
    subprocess.run([*gen, "--seed", str(seed), "--steps", str(steps)], check=True)
    subprocess.run([str(RUNWATCH), "import", str(jsonl), "--db", str(db)], check=True)
    return db


def measure(db: Path, steps: int) -> list[dict]:
    """One row per quarter: truth, old and new ETA."""
    final = steps - 1
    with open_store(db, readonly=True) as store:
        loss = store.read_series(RUN, "loss")
        s, t = loss["step"].to_numpy(dtype=float), loss["time"].to_numpy(dtype=float)
        finish = float(t[-1])
        rows = []
        for q in QUARTERS:
            upto = int(q * final)
            now = float(t[s <= upto][-1])
            old = eta_seconds(t, s, upto, final)
            t0 = time.perf_counter()
            new = eta_report(store, RUN, upto=upto, final_step=final)
            took = time.perf_counter() - t0
            assert new is not None
            truth = finish - now
            rows.append(
                {
                    "quarter": q,
                    "upto": upto,
                    "truth": truth,
                    "old": old,
                    "old_err": (old - truth) / truth,
                    "new": new.eta_seconds,
                    "new_err": (new.eta_seconds - truth) / truth,
                    "lower": new.eta_lower,
                    "upper": new.eta_upper,
                    "inside": new.eta_lower <= truth <= new.eta_upper,
                    "goodput": new.goodput,
                    "failures": new.failures,
                    "rate": new.failure_rate_per_h,
                    "cost": new.cost_per_failure_s,
                    "took": took,
                }
            )
    return rows


def table(seed: int, rows: list[dict]) -> list[str]:
    out = [
        f"Seed {seed}:",
        "",
        "| quarter | actual remaining s | old ETA s (error) | new ETA s (error) | 90% band s "
        "| in band? | goodput so far | failures so far (rate /h, cost s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        out.append(
            f"| {r['quarter']:.0%} (step {r['upto']:,}) | {r['truth']:,.0f} "
            f"| {r['old']:,.0f} ({r['old_err']:+.1%}) | {r['new']:,.0f} ({r['new_err']:+.1%}) "
            f"| {r['lower']:,.0f} – {r['upper']:,.0f} | {'yes' if r['inside'] else 'no'} "
            f"| {r['goodput']:.1%} | {r['failures']} ({r['rate']:.2f}, {r['cost']:.0f}) |"
        )
    return out


def summary(results: dict[int, list[dict]]) -> list[str]:
    out = [
        "Over seeds, per quarter: median |error| of each ETA, and the share of the new band "
        "holding the truth:",
        "",
        "| quarter | runs | old median abs error | new median abs error | in 90% band |",
        "| --- | --- | --- | --- | --- |",
    ]
    every = [r for rows in results.values() for r in rows]
    for q in QUARTERS:
        rs = [r for r in every if r["quarter"] == q]
        out.append(
            f"| {q:.0%} | {len(rs)} | {statistics.median(abs(r['old_err']) for r in rs):.1%} "
            f"| {statistics.median(abs(r['new_err']) for r in rs):.1%} "
            f"| {sum(r['inside'] for r in rs)}/{len(rs)} |"
        )
    took = np.array([r["took"] for r in every])
    out += ["", f"`eta_report` took {np.median(took) * 1000:.0f} ms median per forecast."]
    return out


def sensitivity(dbs: dict[int, Path], steps: int, shares: list[float]) -> list[str]:
    """Median signed and absolute error and coverage per quarter, per half-life share."""
    out = [
        "Half-life of the failure weight (share of the running time so far; default "
        f"{eta_model.HALF_LIFE_SHARE}): median error (signed, absolute) and band coverage:",
        "",
        "| half-life share | " + " | ".join(f"{q:.0%}" for q in QUARTERS) + " |",
        "| --- |" + " --- |" * len(QUARTERS),
    ]
    default = eta_model.HALF_LIFE_SHARE
    try:
        for share in shares:
            eta_model.HALF_LIFE_SHARE = share
            every = [r for db in dbs.values() for r in measure(db, steps)]
            cells = []
            for q in QUARTERS:
                rs = [r for r in every if r["quarter"] == q]
                errs = [r["new_err"] for r in rs]
                cells.append(
                    f"{statistics.median(errs):+.1%}, {statistics.median(map(abs, errs)):.1%}, "
                    f"{sum(r['inside'] for r in rs)}/{len(rs)}"
                )
            out.append(f"| {share} | " + " | ".join(cells) + " |")
    finally:
        eta_model.HALF_LIFE_SHARE = default
    return out


def simulate(rng, rate_h: float, pace: float, final: int, ckpt: int, upto: int):
    """A run with Poisson failures (per hour of running), 200-400 s downtime and restarts
    from the last checkpoint: its attempt spans when it first reaches ``upto``, and the wall
    time from then to its end (as ``tests/expect/test_eta.py``)."""
    t, step, cut = 0.0, 0, None
    t0, t1, s0, s1 = [0.0], [], [0], []
    while step < final:
        run_steps = int(rng.exponential(3600.0 / rate_h) / pace)
        if cut is None and step + run_steps >= upto:
            cut = t + (upto - step) * pace
            spans = eta_model.AttemptSpans(t0, [*t1, cut], s0, [*s1, upto])
        if step + run_steps >= final:
            return spans, t + (final - step) * pace - cut
        step, t = step + run_steps, t + run_steps * pace
        if cut is None:
            t1.append(t)
            s1.append(step)
        t += rng.uniform(200.0, 400.0)
        step = step // ckpt * ckpt
        if cut is None:
            t0.append(t)
            s0.append(step)
    return spans, t - cut


def simulated(trials: int) -> list[str]:
    """Coverage and errors of ``failure_aware_eta`` on simulated Poisson runs (40k steps at
    0.5 s, checkpoints every 500 steps), per failure rate and forecast point."""
    out = [
        f"Simulated Poisson runs ({trials} per cell, 40,000 steps at 0.5 s, checkpoint every "
        "500): band coverage, median signed error, median |error|, median band width / truth:",
        "",
        "| failures per hour of running | 10% | 25% | 50% | 75% |",
        "| --- | --- | --- | --- | --- |",
    ]
    for rate in (0.2, 1.0, 2.0, 6.0):
        cells = []
        for upto in (4_000, 10_000, 20_000, 30_000):
            rng = np.random.default_rng(1)
            inside, errs, width = 0, [], []
            for _ in range(trials):
                spans, truth = simulate(rng, rate, 0.5, 40_000, 500, upto)
                e = eta_model.failure_aware_eta(
                    spans, pace=0.5, remaining_steps=40_000 - upto, checkpoint_every=500
                )
                inside += e.eta_lower <= truth <= e.eta_upper
                errs.append((e.eta_seconds - truth) / truth)
                width.append((e.eta_upper - e.eta_lower) / truth)
            cells.append(
                f"{inside / trials:.0%}, {np.median(errs):+.1%}, "
                f"{np.median(np.abs(errs)):.1%}, {np.median(width):.2f}"
            )
        out.append(f"| {rate} | " + " | ".join(cells) + " |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="17,18,19,20,21", help="comma-separated scenario seeds")
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--shares", default="0.25,1,inf", help="half-life shares to compare")
    ap.add_argument("--trials", type=int, default=300, help="simulated runs per cell (0: none)")
    ap.add_argument("--out", type=Path, help="write the tables as markdown here")
    args = ap.parse_args(argv)
    seeds = [int(x) for x in args.seeds.split(",")]
    results: dict[int, list[dict]] = {}
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        dbs = {seed: build(seed, args.steps, Path(tmp)) for seed in seeds}
        for seed, db in dbs.items():
            results[seed] = measure(db, args.steps)
        for seed, rows in results.items():
            lines += [*table(seed, rows), ""]
        lines += summary(results)
        shares = [float(x) for x in args.shares.split(",") if x]
        if shares:
            lines += ["", *sensitivity(dbs, args.steps, [eta_model.HALF_LIFE_SHARE, *shares])]
    if args.trials:
        lines += ["", *simulated(args.trials)]
    print("\n".join(lines))
    if args.out is not None:
        head = [
            "# Failure-aware ETA: `bench/eta_failures.py`",
            "",
            f"- Measured: {time.strftime('%Y-%m-%d')}",
            f"- Machine: {platform.machine()}, 2 shared cores",
            f"- Command: `python bench/eta_failures.py --seeds {args.seeds} "
            f"--steps {args.steps} --shares {args.shares} --trials {args.trials} "
            f"--out {args.out}`",
            "- Why and how: bench/README-eta.md",
            "",
            "Old = `eta_seconds` (remaining steps at the recent pace, the anchor); new = "
            "`eta_report` (failures to come, 90% band). Errors are (predicted - actual) / "
            "actual remaining wall time.",
            "",
        ]
        args.out.write_text("\n".join(head + lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
