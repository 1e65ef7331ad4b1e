"""Shared fixtures: a temporary store path, and the real-runs data folder."""

from __future__ import annotations

import os
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
