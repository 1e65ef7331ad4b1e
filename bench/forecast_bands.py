"""Single-run forecasts: point error and 90% band coverage at 10/25/50/75% of the steps.

    python bench/forecast_bands.py [--before REV_DIR]

On the real runs in ``shared/data/real_runs`` (the training loss, else the validation
loss; as ``bench/detection.py`` picks) and the real CPU runs in ``bench/data/cpu_families``
and ``bench/data/cpu_code_families`` (schedule runs: held-out loss, with cosine, WSD and
constant LRs; width runs: held-out and training loss), each forecast made as ``runwatch
forecast --upto`` makes it: on the points up to that step, the LR logged up to it, to the
run's last step. These set ``UNSEEN_FALL_PER_EFOLD``; "all" is them. The held-out checks
(``HELD_OUT``): 16 runs of ``examples/train_tiny_lm.py`` ("example",
``bench/data/tiny_lm_forecast``, training loss, batch 8 to 64), and the families made
after the value was set: manual pages ("man", ``bench/data/cpu_man_families``), the Perl
library ("perl") and C headers ("c"). The truth is the median of a run's last 2% of points
(at least 5): a batch-8 loss point is 17% noise. ``--before DIR`` also runs the same code
from a checkout of an earlier commit (a ``git worktree``, built in place) in a subprocess:
the anchor.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parents[1]
REAL = HERE.parent / "shared" / "data" / "real_runs"
CPU_SETS = {  # set label: folder of real CPU runs (the run names start with the label)
    "cpu": HERE / "bench" / "data" / "cpu_families",
    "code": HERE / "bench" / "data" / "cpu_code_families",
    "man": HERE / "bench" / "data" / "cpu_man_families",
    "perl": HERE / "bench" / "data" / "cpu_perl_families",
    "c": HERE / "bench" / "data" / "cpu_c_families",
}
HELD_OUT = ("example", "man", "perl", "c")
"""The sets that set nothing (their label's first word): the check, left out of "all"."""
EXAMPLE = HERE / "bench" / "data" / "tiny_lm_forecast"
FRACTIONS = (0.10, 0.25, 0.50, 0.75)


def load_runs() -> dict[str, tuple[pd.DataFrame, str, str]]:
    """run: (its points, the metric forecast, its set): the real runs, the CPU schedule
    runs, the CPU width runs (cosine-2000; held-out loss "<task> widths", training loss
    "<task> widths train") and the example's runs ("example", the held-out check)."""
    runs = {}
    for path in sorted(REAL.glob("*.csv")):
        if path.stem.startswith("incident_"):
            continue
        frame = pd.read_csv(path, usecols=["metric", "step", "value"])
        metrics = set(frame["metric"])
        metric = next((m for m in ("train_loss", "val_loss") if m in metrics), None)
        if metric is not None:
            runs[path.stem] = (frame, metric, "real")
    for label, folder in CPU_SETS.items():
        if not (folder / "runs.json").exists():
            continue
        for name in json.loads((folder / "runs.json").read_text()):
            frame = pd.read_csv(next(folder.glob(f"{name}.csv*")))
            if any(k in name for k in ("constant_4000", "cosine_4000", "wsd_3200_4000")):
                runs[name] = (frame, "val_loss", label)
            elif "cosine_2000" in name:
                runs[f"{name} val"] = (frame, "val_loss", f"{label} widths")
                runs[f"{name} train"] = (frame, "loss", f"{label} widths train")
    for path in sorted(EXAMPLE.glob("*.csv.gz")):
        runs[path.name.removesuffix(".csv.gz")] = (pd.read_csv(path), "loss", "example")
    return runs


def measure(root: Path) -> list[dict]:
    """Every forecast of every run at every fraction, with the code under ``root``."""
    sys.path.insert(0, str(root))
    from runwatch.expect import forecast

    rows = []
    for run, (frame, metric, which) in load_runs().items():
        g = frame[frame["metric"] == metric].sort_values("step", kind="stable")
        s, v = g["step"].to_numpy(float), g["value"].to_numpy(float)
        if np.nanmin(v) <= 0:
            continue  # an RL loss around zero: no curve to forecast
        final = float(np.median(v[-max(5, v.size // 50) :]))
        lr = frame[frame["metric"].isin(["lr", "learning_rate"])].sort_values("step")
        ls, lv = (None, None) if lr.empty else (lr["step"].to_numpy(), lr["value"].to_numpy())
        for frac in FRACTIONS:
            up = int(s[0] + frac * (s[-1] - s[0]))
            try:
                f = forecast(s, v, upto=up, final_step=int(s[-1]), lr_steps=ls, lr_values=lv)
            except ValueError:
                continue
            rows.append(
                {
                    "run": run,
                    "set": which,
                    "frac": frac,
                    "model": f.model,
                    "err": (f.predicted - final) / final * 100,
                    "covered": bool(f.lower <= final <= f.upper),
                    "half": (f.upper - f.lower) / 2 / final * 100,
                }
            )
    return rows


def table(rows: list[dict], label: str) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    held_out = frame["set"].str.split().str[0].isin(HELD_OUT)
    frame = pd.concat([frame, frame[~held_out].assign(set="all")])
    out = []
    for (which, frac), g in frame.groupby(["set", "frac"]):
        out.append(
            {
                "code": label,
                "runs of": which,
                "at": f"{frac:.0%}",
                "forecasts": len(g),
                "median |err| %": round(float(g["err"].abs().median()), 2),
                "coverage": f"{int(g['covered'].sum())}/{len(g)} ({g['covered'].mean():.0%})",
                "median band ±%": round(float(g["half"].median()), 2),
            }
        )
    return pd.DataFrame(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code before (anchor)")
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)  # one code, JSON out
    args = parser.parse_args()
    if args.root is not None:
        print(json.dumps(measure(args.root)))
        return
    began = time.perf_counter()
    codes = {"now": HERE} | ({"before": args.before} if args.before else {})
    tables, per_run = [], {}
    for label, root in codes.items():
        out = subprocess.run(
            [sys.executable, __file__, "--root", str(root)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows = json.loads(out)
        per_run[label] = pd.DataFrame(rows)
        tables.append(table(rows, label))
    pd.set_option("display.width", 200)
    now = per_run["now"]
    missed = now[~now["covered"]]
    print("forecasts whose band missed the final value (now):")
    print(missed.round(2).to_string(index=False) if len(missed) else "  none")
    print()
    print(pd.concat(tables).to_string(index=False))
    print(f"\n({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
