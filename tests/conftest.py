"""Shared fixtures: a temporary store path, and the real-runs data folder."""

from __future__ import annotations

from pathlib import Path

import pytest

REAL_RUNS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real_runs"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "runwatch.db"


@pytest.fixture
def real_runs() -> Path:
    if not REAL_RUNS.is_dir():
        pytest.skip(f"real training logs not found at {REAL_RUNS}")
    return REAL_RUNS
