"""Shared helpers for the detection tests: real runs, seeded synthetic curves."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
REAL_RUNS = REPO.parent / "shared/data/real_runs"


def real_run(name: str) -> pd.DataFrame:
    path = REAL_RUNS / f"{name}.csv"
    if not path.is_file():
        pytest.skip(f"real training curves not found at {path} (shared/ beside the repo)")
    return pd.read_csv(path)


def real_run_names() -> list[str]:
    if not REAL_RUNS.is_dir():
        return []
    return sorted(p.stem for p in REAL_RUNS.glob("*.csv"))


def bench_module(script: str = "detection"):
    """A bench script as a module: bench/detection.py for its table of real events in the
    clean curves, bench/lr_schedules.py for its synthetic schedule runs."""
    name = f"runwatch_bench_{script}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / f"bench/{script}.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[name] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


def loss_curve(n: int = 2000, seed: int = 0, noise: float = 0.01) -> np.ndarray:
    """A seeded power-law loss curve with multiplicative noise."""
    rng = np.random.default_rng(seed)
    s = np.arange(1, n + 1, dtype=float)
    return (2.0 + 8.0 * (s + 50.0) ** -0.4) * np.exp(noise * rng.standard_normal(n))


def canon(anomalies) -> list[str]:
    """Anomalies as comparable strings (NaN observed values compare equal this way)."""
    import json

    return [
        json.dumps(
            {**a.to_json_dict("r"), "details": a.details, "open": a.is_open},
            default=str,
            sort_keys=True,
        )
        for a in anomalies
    ]
