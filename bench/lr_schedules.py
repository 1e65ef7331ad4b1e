"""Does an LR schedule look like an anomaly? Synthetic runs under common schedules,
replayed with and without their LR logged.

    python bench/lr_schedules.py [--seeds 6] [--steps 20000]

The loss follows the law of Tissue et al. 2024 (L = 2 + 8·(S1 + 50)^-0.3 - 0.4·S2/1000
over the LR areas, with multiplicative noise of 0.3%, 1% and 2%), so the schedule alone
moves it. Schedules after a 500-step warmup: constant, cosine to 10% and to 0,
warmup-stable-decay (last 20% linear to 0), step decay (x0.1 at 50% and 75%). The real
runs of ``bench/detection.py`` cannot answer this: only one of them logs its LR.
Prints, per schedule and with/without the LR series:

- clean runs: loss episodes (warning or worse, and info) per 100,000 steps;
- faults injected at 30% and 60% of the run (a plateau at the level it had there, a +3%
  level shift): recall (warning or worse on the loss, at or after the fault) and the
  median delay in steps and as a share of the steps remaining.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runwatch.detect import analyze_frame
from runwatch.expect import lr_areas

SCHEDULES = ("constant", "cosine", "cosine0", "wsd", "step")
NOISES = (0.003, 0.01, 0.02)


def run(schedule: str, n: int, seed: int, noise: float) -> pd.DataFrame:
    """One synthetic run: loss and lr at every step, in replay order."""
    rng = np.random.default_rng(seed)
    s = np.arange(n)
    peak = 3e-4
    lr = np.where(s < 500, peak * (s + 1) / 500, peak)
    t = np.clip((s - 500) / (n - 500), 0, 1)
    if schedule == "cosine":  # to 10% of the peak
        lr = np.where(s < 500, lr, peak * (0.1 + 0.45 * (1 + np.cos(np.pi * t))))
    elif schedule == "cosine0":  # to zero
        lr = np.where(s < 500, lr, peak * 0.5 * (1 + np.cos(np.pi * t)))
    elif schedule == "wsd":
        d0 = int(n * 0.8)
        lr = np.where(s < d0, lr, peak * np.maximum(1 - (s - d0) / (n - d0), 0.0))
    elif schedule == "step":  # x0.1 at half and at three quarters of the run
        lr = lr * np.where(s >= n // 2, 0.1, 1.0) * np.where(s >= 3 * n // 4, 0.1, 1.0)
    s1, s2 = lr_areas(s, lr, n - 1)
    loss = 2.0 + 8.0 * (s1 + 50) ** -0.3 - 0.4 * s2 / 1000
    loss = loss * (1 + noise * rng.standard_normal(n))
    return pd.DataFrame(
        {"metric": ["loss", "lr"] * n, "step": np.repeat(s, 2), "value": np.c_[loss, lr].ravel()}
    )


def inject(df: pd.DataFrame, fault: str, at: int, seed: int) -> pd.DataFrame:
    df = df.copy()
    hit = (df.metric == "loss") & (df.step >= at)
    if fault == "plateau":
        level = df.loc[hit & (df.step == at), "value"].iloc[0]
        noise = np.random.default_rng(seed).standard_normal(int(hit.sum()))
        df.loc[hit, "value"] = level * (1 + 0.01 * noise)
    else:
        df.loc[hit, "value"] *= 1.03
    return df


def loss_episodes(df: pd.DataFrame, with_lr: bool):
    frame = df if with_lr else df[df.metric != "lr"]
    return [a for a in analyze_frame(frame) if a.metric == "loss"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20_000)
    args = ap.parse_args()
    n = args.steps
    runs = f"{len(SCHEDULES)} schedules x {len(NOISES)} noise levels x {args.seeds} seeds"
    print(f"{runs}, {n:,} steps each")
    header = (
        f"{'schedule':9} {'LR':4} {'warn+/100k':>10} {'info/100k':>10} "
        f"{'fault recall':>12} {'delay med':>9} {'% remain':>9}"
    )
    print(header)
    print("-" * len(header))
    for schedule in SCHEDULES:
        for with_lr in (True, False):
            warn = info = steps = 0
            hits: list[tuple[int, int]] = []
            trials = 0
            for noise in NOISES:
                for seed in range(args.seeds):
                    df = run(schedule, n, seed, noise)
                    eps = loss_episodes(df, with_lr)
                    warn += sum(a.severity != "info" for a in eps)
                    info += sum(a.severity == "info" for a in eps)
                    steps += n
                    if noise != 0.01:
                        continue
                    for fault in ("plateau", "shift"):
                        for at in (int(0.3 * n), int(0.6 * n)):
                            trials += 1
                            found = [
                                a.start_step
                                for a in loss_episodes(inject(df, fault, at, seed), with_lr)
                                if a.severity != "info" and a.start_step >= at
                            ]
                            if found:
                                hits.append((min(found) - at, n - at))
            delays = [d for d, _ in hits]
            share = [d / rem for d, rem in hits]
            print(
                f"{schedule:9} {'yes' if with_lr else 'no':4} {warn / steps * 1e5:10.1f} "
                f"{info / steps * 1e5:10.1f} {len(hits) / trials:12.2f} "
                f"{statistics.median(delays) if delays else float('nan'):9.0f} "
                f"{100 * statistics.median(share) if share else float('nan'):8.1f}%"
            )


if __name__ == "__main__":
    main()
