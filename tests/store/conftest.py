"""Store fixtures: ``store_url`` runs a test on both backends, SQLite and real PostgreSQL
(``pg_url``, from tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a contract test opens its store: an SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "runwatch.db")
    return request.getfixturevalue("pg_url")
