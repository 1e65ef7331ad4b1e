"""Shared fixtures: a temporary store path, the real-runs data folder, and a real PostgreSQL.

``pg_url`` is a fresh database on a throwaway cluster (``runwatch.store.postgres_local``:
initdb and pg_ctl as an unprivileged user, on a free port, in a temp dir), one cluster per
test session. Missing server binaries FAIL those tests rather than skip them: CI installs
Debian's ``postgresql`` (.ci/run), so a skip would hide a broken CI.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from runwatch.store.postgres_local import LocalCluster, find_bindir

REAL_RUNS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real_runs"
_names = itertools.count(1)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "runwatch.db"


@pytest.fixture
def real_runs() -> Path:
    if not REAL_RUNS.is_dir():
        pytest.skip(f"real training logs not found at {REAL_RUNS}")
    return REAL_RUNS


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


def _real_data_skip(report: pytest.TestReport) -> str | None:
    """The reason, if ``report`` is a test skipped for want of the real runs."""
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return None
    reason = str(report.longrepr[2])
    return reason if ("real_runs" in reason or "real training" in reason) else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    """Under CI the real-run tests (the detection goldens among them) must run: a skip for
    want of ``shared/data/real_runs`` beside the checkout fails there instead."""
    outcome = yield
    report = outcome.get_result()
    reason = _real_data_skip(report)
    if reason and os.environ.get("CI"):
        report.outcome = "failed"
        report.longrepr = f"CI runs the real-run tests, but: {reason}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say loudly, at the end, that the real-run tests did not run and why."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if _real_data_skip(r)]
    if skipped:
        terminalreporter.write_sep(
            "!",
            f"{len(skipped)} real-run tests (detection goldens, false-alarm rates) SKIPPED: "
            f"no {REAL_RUNS}; put shared/ beside the checkout to run them",
            red=True,
        )
