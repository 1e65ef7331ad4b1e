"""Store fixtures: ``store_url`` runs a test on both backends, SQLite and real PostgreSQL.

The PostgreSQL side is a throwaway cluster (``runwatch.store.postgres_local``: initdb and
pg_ctl as an unprivileged user, on a free port, in a temp dir), one per test session, with a
fresh database per test. Missing server binaries FAIL the PostgreSQL tests rather than skip
them: CI installs Debian's ``postgresql`` (.ci/run), so a skip would hide a broken CI.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from runwatch.store.postgres_local import LocalCluster, find_bindir

_names = itertools.count(1)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[LocalCluster]:
    if find_bindir() is None:
        pytest.fail(
            "PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin/initdb): "
            "apt-get install postgresql (CI installs it in .ci/run)"
        )
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"the postgres extra is not installed ({exc}): pip install -e '.[test]'")
    cluster = LocalCluster(fsync=False).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def pg_url(pg_cluster: LocalCluster) -> Iterator[str]:
    """A fresh, empty database on the session's cluster; dropped afterwards."""
    from runwatch.store.postgres import close_pool

    name = f"t{next(_names)}"
    url = pg_cluster.create_database(name)
    yield url
    close_pool(url)
    pg_cluster.drop_database(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a contract test opens its store: an SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "runwatch.db")
    return request.getfixturevalue("pg_url")
