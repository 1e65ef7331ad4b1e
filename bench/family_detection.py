"""Issue 18, item 5: how well a run is judged against its family (``analyze --family``).

    python bench/family_detection.py [--quick]

The healthy targets of ``bench/forecast_family.py`` (the real families' 400M runs from the
smaller sizes and their schedule transfers; the CPU families' largest widths and their
transfers) are replayed by the default Monitor through the product's path
(``analyze_run``), with the family and without it (the detector then fits the run's own
curve: the anchor). Counted on their loss metrics:

- false alarms: warning-or-worse ``curve_deviation`` episodes on the healthy runs, per
  100,000 steps;
- recall and delay on the same runs made worse, as a bad recipe or a bug would: every loss
  point raised by ``d`` from the start ("worse from the start": only a run's family can
  tell it is above where its size should be) or from 40% of its steps on ("worse from
  40%"). A fault is caught by a warning-or-worse ``curve_deviation`` episode on a loss
  metric that ends after it starts; the delay is from its start to the episode's start,
  as a share of the run's steps.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from forecast_family import CPU_SETS, REAL, Bench, cpu_families, real_families

from runwatch.pipeline.analysis import analyze_run

RAISES = (0.03, 0.06, 0.10)
SHIFT_AT = 0.4
WARN = ("warning", "critical")
LOSSES = ("loss", "val_loss")


def targets(bench: Bench) -> list[tuple[str, str, list[str]]]:
    """The forecast bench's named targets (not its inner rows): (kind, run, family); a
    real 400M run can be a size target and a transfer target, with another family."""
    return [(k, run, fam) for (k, run), fam in bench.families.items() if not k.endswith("inner")]


def flagged(bench: Bench, run: str, family: list[str] | None, after: int) -> dict[str, list[int]]:
    """Start steps of the warning-or-worse episodes on ``run``'s loss metrics that end at
    or after ``after``: the curve-deviation ones, and those of any detector."""
    found = analyze_run(bench.store, run, family=family, save=False).anomalies
    hits = [a for a in found if a.metric in LOSSES and a.severity in WARN and a.end_step >= after]
    return {
        "curve": sorted(a.start_step for a in hits if a.detector == "curve_deviation"),
        "any": sorted(a.start_step for a in hits),
    }


def worse_copy(bench: Bench, tmp: Path, run: str, raise_by: float, start: int) -> str:
    """``run`` with its loss metrics raised by ``raise_by`` from step ``start``, imported
    under a new name with the same config (once)."""
    name = f"{run}_worse{raise_by:g}_from{start}"
    if name in bench.configs:
        return name
    frame = bench.frames[run].copy()
    losses = frame["metric"].isin(["loss", "val_loss"]) & (frame["step"] >= start)
    frame.loc[losses, "value"] *= 1.0 + raise_by
    frame["run"] = name
    path = tmp / f"{name}.csv"
    frame.to_csv(path, index=False)
    bench.add(path, name, bench.configs[run])
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few real-family cases only")
    args = parser.parse_args()
    began = time.perf_counter()
    clean, faults = [], []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        bench = Bench(tmp / "families.db")
        if REAL.exists():
            real_families(bench, args.quick)
        for label, folder in CPU_SETS.items():
            cpu_families(bench, label, folder)
        for kind, run, family in targets(bench):
            total = int(bench.configs[run]["total_steps"])
            for mode, fam in (("family", family), ("own fit", None)):
                hits = flagged(bench, run, fam, 0)
                clean.append(
                    {
                        "kind": kind,
                        "run": run,
                        "mode": mode,
                        "family": ",".join(fam or ()),
                        "steps": total,
                        "alarms": len(hits["curve"]),
                        "any detector": len(hits["any"]),
                    }
                )
            for raise_by in RAISES:
                for shape, start in (("from the start", 0), ("from 40%", int(SHIFT_AT * total))):
                    worse = worse_copy(bench, tmp, run, raise_by, start)
                    for mode, fam in (("family", family), ("own fit", None)):
                        hits = flagged(bench, worse, fam, start)
                        rec = {
                            "kind": kind,
                            "run": run,
                            "shape": shape,
                            "raise": f"{raise_by:.0%}",
                            "mode": mode,
                            "family": ",".join(fam or ()),
                        }
                        for by, starts in hits.items():
                            late = (max(starts[0], start) - start) / total if starts else np.nan
                            rec |= {f"caught {by}": bool(starts), f"delay {by} %": 100 * late}
                        faults.append(rec)
        bench.store.close()
    print_tables(pd.DataFrame(clean), pd.DataFrame(faults))
    print(f"\n({time.perf_counter() - began:.0f} s)")


def print_tables(clean: pd.DataFrame, faults: pd.DataFrame) -> None:
    pd.set_option("display.width", 200)
    print("false alarms on the healthy targets: warning+ episodes on loss metrics")
    print("(alarms: curve_deviation's; any: any detector's)\n")
    by = clean.groupby(["kind", "mode"], sort=False).agg(
        runs=("run", "size"),
        steps=("steps", "sum"),
        alarms=("alarms", "sum"),
        any=("any detector", "sum"),
    )
    print(by.to_string())
    # A run that is two kinds of target is judged once on its own.
    once = clean.drop_duplicates(["run", "mode", "family"])
    total = once.groupby("mode", sort=False)[["steps", "alarms", "any detector"]].sum()
    for mode, rec in total.iterrows():
        curve, every = (rec[c] / rec["steps"] * 1e5 for c in ("alarms", "any detector"))
        print(
            f"all, {mode}: per 100k steps {curve:.2f} (curve_deviation), {every:.2f} (any), "
            f"over {rec['steps']} steps"
        )
    print("\nrecall and median delay (% of the run's steps) on the same runs made worse\n")
    once = faults.drop_duplicates(["run", "shape", "raise", "mode", "family"])
    by = once.groupby(["shape", "raise", "mode"], sort=False).agg(
        n=("caught curve", "size"),
        recall_curve=("caught curve", "mean"),
        delay_curve=("delay curve %", "median"),
        recall_any=("caught any", "mean"),
        delay_any=("delay any %", "median"),
    )
    print(by.round(2).to_string())
    kinds = faults.groupby(["kind", "shape", "raise", "mode"], sort=False)["caught any"].mean()
    print("\nrecall by family kind, any detector\n")
    print(kinds.unstack(["shape", "raise"]).round(2).to_string())


if __name__ == "__main__":
    main()
