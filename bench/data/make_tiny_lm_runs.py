"""Train the example's tiny LM (``examples/train_tiny_lm.py``) under several lengths, batch
sizes and peak LRs, and keep each run's training loss and LR: a held-out check of the
single-run forecast bands (``bench/forecast_bands.py``) on the model users run first.

    python bench/data/make_tiny_lm_runs.py [--out bench/data/tiny_lm_forecast]

Each run goes through runwatch itself (a real store in a temporary folder), and is
exported from it with ``runwatch export``; only ``loss`` and ``lr`` are kept.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
RUNWATCH = str(Path(sys.executable).parent / "runwatch")  # the command, beside this Python
RUNS = (  # (steps, batch, peak LR)
    (1500, 8, "3e-3"),
    (1500, 32, "3e-3"),
    (3000, 8, "3e-3"),
    (3000, 16, "1e-3"),
    (1000, 8, "6e-3"),
    (2000, 16, "3e-3"),
    (1500, 8, "1e-3"),
    (4000, 8, "3e-3"),
    (1500, 64, "3e-3"),
    (3000, 32, "3e-3"),
    (2000, 64, "1e-3"),
    (1000, 32, "6e-3"),
    (4000, 32, "1e-3"),
    (2500, 64, "6e-3"),
    (1200, 16, "3e-3"),
    (3000, 64, "2e-3"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench/data/tiny_lm_forecast")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "runs.db")
        for steps, batch, lr in RUNS:
            name = f"tiny-lm-s{steps}-b{batch}-lr{lr}"
            began = time.perf_counter()
            train = [sys.executable, str(ROOT / "examples/train_tiny_lm.py")]
            options = {"--steps": steps, "--batch": batch, "--lr": lr, "--run": name}
            options |= {"--db": db, "--checkpoint-every": 10**9, "--checkpoint-dir": tmp}
            subprocess.run(
                train + [str(part) for pair in options.items() for part in pair],
                check=True,
                capture_output=True,
            )
            out = subprocess.run(
                [RUNWATCH, "export", "--db", db, "--run", name],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            points = pd.read_csv(io.StringIO(out))
            points = points[points["metric"].isin(["loss", "lr"])]
            points[["run", "step", "metric", "value"]].to_csv(
                args.out / f"{name}.csv.gz", index=False, float_format="%.6g"
            )
            print(f"{name}: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
