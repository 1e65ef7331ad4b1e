"""Forecast of the final loss when the LR is logged (issue 3's LR-aware law).

Runs whose loss follows the law of Tissue et al. 2024 under five schedules
(``bench/lr_schedules.py``: constant, cosine to 10% and to 0, warmup-stable-decay, step
decay; 3 noise levels x ``--seeds`` seeds x 20,000 steps), the demo run (``runwatch demo``:
its loss is a power law in the summed LR alone, no annealing term, under a cosine), and
the one real run that logs its LR (llm.c GPT-2 124M, cosine to 0, from
``../shared/data/real_runs``). Each is forecast at 10%, 25%, 50% and 75% of its steps for
its last step, three ways, side by side:

- ``power law``: the robust power law in the step, LR ignored (what a run without an LR
  gets; the anchor);
- ``LR flat``: the LR-aware law with the LR held at its last value (runwatch before the
  schedule projection);
- ``runwatch``: ``runwatch.expect.forecast`` with the LR logged so far (projected to the
  last step, and the law only when the anneal seen is enough to know its term).

Prints, per schedule and fraction, the median absolute error of the final value (% of
it; final = median of the last 1% of points) and the share of forecasts whose 90% band
holds it.

    /work/venv/bin/python bench/forecast_lr.py [--seeds 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lr_schedules import NOISES, SCHEDULES, run  # noqa: E402  (bench/ is this folder)

from runwatch.demo.scenario import demo_scenario  # noqa: E402
from runwatch.expect import bin_arrays, fit_lr_law, forecast  # noqa: E402
from runwatch.expect.forecast import FIT_FROM, _band_fn  # noqa: E402

LLMC = ROOT.parent / "shared" / "data" / "real_runs" / "mng_llmc_gpt2_124m.csv"
FRACTIONS = (0.10, 0.25, 0.50, 0.75)

Curve = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""(loss steps, loss values, lr steps, lr values) of one run."""


def synthetic(schedule: str, seeds: int) -> Iterator[Curve]:
    for noise in NOISES:
        for seed in range(seeds):
            df = run(schedule, 20_000, seed, noise)
            loss, lr = df[df["metric"] == "loss"], df[df["metric"] == "lr"]
            yield (
                loss["step"].to_numpy(),
                loss["value"].to_numpy(),
                lr["step"].to_numpy(),
                lr["value"].to_numpy(),
            )


def llmc() -> Iterator[Curve]:
    df = pd.read_csv(LLMC)
    loss = df[df["metric"] == "train_loss"].sort_values("step", kind="stable")
    lr = df[df["metric"] == "lr"].sort_values("step", kind="stable")
    yield (
        loss["step"].to_numpy(),
        loss["value"].to_numpy(float),
        lr["step"].to_numpy(),
        lr["value"].to_numpy(float),
    )


def demo() -> Iterator[Curve]:
    """The demo run as the store reads it: the latest value of each step (the restart's
    redone steps replace the first attempt's), the NaN left in (forecast skips it)."""
    loss: dict[int, float] = {}
    lr: dict[int, float] = {}
    for item in demo_scenario(3000):
        loss[item.step], lr[item.step] = item.metrics["loss"], item.metrics["lr"]
    steps = np.array(sorted(loss))
    yield (
        steps,
        np.array([loss[k] for k in steps]),
        steps,
        np.array([lr[k] for k in steps]),
    )


def lr_held_flat(s, v, ls, lv, up: int, fin: int) -> tuple[float, float, float]:
    """(predicted, lower, upper) of the LR-aware law with the LR held flat after ``up``:
    runwatch's forecast before the schedule projection (same bins, same band)."""
    sel = (s <= up) & (s >= FIT_FROM * up) & np.isfinite(v)
    bs, bv, _ = bin_arrays(s[sel], v[sel])
    seen = ls <= up
    law = fit_lr_law(bs, bv, ls[seen], lv[seen], horizon=fin)
    m, lo, hi = _band_fn(law.predict, law.sigma, up)(np.array([float(fin)]))
    return float(m[0]), float(lo[0]), float(hi[0])


def ways(s, v, ls, lv, up: int, fin: int) -> dict[str, tuple[float, float, float]]:
    def triple(f) -> tuple[float, float, float]:
        return f.predicted, f.lower, f.upper

    return {
        "power law": triple(forecast(s, v, upto=up, final_step=fin)),
        "LR flat": lr_held_flat(s, v, ls, lv, up, fin),
        "runwatch": triple(forecast(s, v, upto=up, final_step=fin, lr_steps=ls, lr_values=lv)),
    }


def table(name: str, curves: Callable[[], Iterator[Curve]]) -> None:
    for frac in FRACTIONS:
        errs: dict[str, list[float]] = {}
        held: dict[str, list[bool]] = {}
        for s, v, ls, lv in curves():
            finite = v[np.isfinite(v)]
            final = float(np.median(finite[-max(5, finite.size // 100) :]))
            fin = int(s[-1])
            up = int(s[0] + frac * (fin - s[0]))
            for way, (m, lo, hi) in ways(s, v, ls, lv, up, fin).items():
                errs.setdefault(way, []).append(abs(m - final) / abs(final) * 100)
                held.setdefault(way, []).append(lo <= final <= hi)
        cells = "  ".join(
            f"{statistics.median(errs[w]):7.2f}% {np.mean(held[w]):4.2f}" for w in errs
        )
        print(f"{name:13} {frac:4.0%}  {cells}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6)
    args = ap.parse_args()
    ways_ = ("power law", "LR flat", "runwatch")
    print(
        f"synthetic: {len(SCHEDULES)} schedules x {len(NOISES)} noise levels x {args.seeds} "
        "seeds x 20,000 steps; the demo run; real: llm.c GPT-2 124M (cosine to 0)"
    )
    print("median |error| of the final value and 90% band coverage, per way of forecasting")
    print(f"{'run':13} {'fit':4}  " + "  ".join(f"{w:>13}" for w in ways_))
    for schedule in SCHEDULES:
        table(schedule, lambda schedule=schedule: synthetic(schedule, args.seeds))
    table("demo", demo)
    table("llm.c (real)", llmc)


if __name__ == "__main__":
    main()
