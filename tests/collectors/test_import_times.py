"""An imported run is dated by its file's own times, not by when it was imported.

The generated multi-restart scenario (bench/scenarios/multi_restart.py --small) is imported
into a real store, and the Fleet page's figures (``fleet_report``) are read back from it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from runwatch.collectors.importer import import_long_format
from runwatch.pipeline.fleet import fleet_report
from runwatch.store import open_store

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "bench" / "scenarios" / "multi_restart.py"
T0 = 1_750_000_000.0  # the scenario's first row (multi_restart.T0)
OPENING = ["start", "resume", "restart"]  # the events the store writes with an attempt


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> dict[str, Any]:
    """The small scenario imported into a fresh store: its attempts, rows and Fleet report."""
    tmp = tmp_path_factory.mktemp("import_times")
    src, truth = tmp / "scenario.jsonl", tmp / "truth.json"
    cmd = [sys.executable, str(GENERATOR), str(src), "--small", "--truth", str(truth)]
    subprocess.run(cmd, check=True, capture_output=True)
    times = [json.loads(line)["time"] for line in src.read_text().splitlines()]
    facts = json.loads(truth.read_text())
    with open_store(tmp / "runwatch.db") as store:
        import_long_format(store, src)
        run = facts["run"]
        return {
            "truth": facts,
            "file_times": (min(times), max(times)),
            "run": store.runs().set_index("name").loc[run],
            "attempts": store.attempts(run),
            "points": store.read_points(run, all_attempts=True),
            "events": store.events(run),
            "contexts": store.contexts(run),
            "report": fleet_report(store, run),
        }


def _earliest(frame: pd.DataFrame) -> pd.Series:
    return frame.dropna(subset=["time"]).groupby("attempt")["time"].min()


def test_each_attempt_starts_at_its_earliest_row_in_the_file(scenario):
    atts = scenario["attempts"].set_index("attempt")["start_time"]
    events = scenario["events"]
    own_events = events[~events["kind"].isin(OPENING)]
    first_point = _earliest(scenario["points"])
    earliest = (
        pd.concat([first_point, _earliest(own_events), _earliest(scenario["contexts"])])
        .groupby(level=0)
        .min()
    )
    assert len(atts) == scenario["truth"]["attempts"] == 20
    assert atts.index.tolist() == earliest.index.astype(int).tolist()
    np.testing.assert_array_equal(atts.to_numpy(), earliest.to_numpy())
    # Each attempt's first point comes within its first (slow, warm-up) step of its start.
    lag = first_point.to_numpy() - atts.to_numpy()
    assert (lag >= 0).all() and (lag < 5.0).all(), lag
    assert atts.iloc[0] == T0


def test_the_opening_events_carry_their_attempts_start(scenario):
    atts = scenario["attempts"].set_index("attempt")["start_time"]
    events = scenario["events"]
    opening = events[events["kind"].isin(OPENING)].set_index("attempt")["time"]
    assert sorted(opening.index.astype(int)) == atts.index.tolist()
    np.testing.assert_array_equal(opening.sort_index().to_numpy(), atts.to_numpy())


def test_the_run_spans_the_files_times(scenario):
    first, last = scenario["file_times"]
    run = scenario["run"]
    assert (run["start_time"], run["end_time"], run["status"]) == (first, last, "finished")


def test_fleet_figures_of_the_imported_run_are_sane(scenario):
    report = scenario["report"]
    first, last = scenario["file_times"]
    assert report.wall_s == pytest.approx(last - first)
    assert 0.0 <= report.goodput <= 1.0
    assert report.failures_n == scenario["truth"]["attempts"] - 1
    assert report.mtbf_s is not None and report.mtbf_s > 0
    assert report.uptime_s <= report.wall_s
    assert all(v >= 0 for v in report.badput.values()), report.badput


def _write_csv(path: Path, rows: list[tuple[Any, ...]], timed: bool) -> Path:
    header = "run,step,metric,value,rank,time" if timed else "run,step,metric,value,rank"
    body = [",".join(str(v) for v in (r if timed else r[:5])) for r in rows]
    path.write_text("\n".join([header, *body]) + "\n")
    return path


# Two ranks; the steps go back at step 1 (a restart). Rank 1's rows come later in the file
# but earlier in time, so the earliest time is not the first row's.
ROWS = [
    ("r", 0, "loss", 1.0, 0, 110.0),
    ("r", 0, "loss", 1.0, 1, 105.0),
    ("r", 1, "loss", 0.9, 0, 120.0),
    ("r", 1, "loss", 0.9, 1, 121.0),
    ("r", 2, "loss", 0.8, 0, 130.0),
    ("r", 2, "loss", 0.8, 1, 131.0),
    ("r", 1, "loss", 0.9, 0, 310.0),
    ("r", 1, "loss", 0.9, 1, 300.0),
    ("r", 2, "loss", 0.8, 0, 330.0),
    ("r", 2, "loss", 0.8, 1, 331.0),
]


def test_the_earliest_time_wins_over_the_first_row(db_path, tmp_path):
    src = _write_csv(tmp_path / "timed.csv", ROWS, timed=True)
    with open_store(db_path) as store:
        summary = import_long_format(store, src)
        assert summary.restarts == {"r": 1}
        assert store.attempts("r")["start_time"].tolist() == [105.0, 300.0]
        run = store.runs().iloc[0]
        assert (run["start_time"], run["end_time"]) == (105.0, 331.0)


def test_an_untimed_file_is_dated_by_the_import_as_before(db_path, tmp_path):
    src = _write_csv(tmp_path / "untimed.csv", ROWS, timed=False)
    before = time.time()
    with open_store(db_path) as store:
        import_long_format(store, src)
        after = time.time()
        starts = store.attempts("r")["start_time"].tolist()
        run = store.runs().iloc[0]
    assert len(starts) == 2
    assert all(before <= t <= after for t in [*starts, run["start_time"], run["end_time"]])


def test_an_appended_file_dates_its_attempt_and_keeps_the_runs_start(db_path, tmp_path):
    first = _write_csv(tmp_path / "first.csv", ROWS[:6], timed=True)
    later = [
        ("r", s, "loss", 0.5, rank, 1_000.0 + 10 * s + rank) for s in (3, 4) for rank in (0, 1)
    ]
    second = _write_csv(tmp_path / "second.csv", later, timed=True)
    with open_store(db_path) as store:
        import_long_format(store, first)
        import_long_format(store, second, append=True)
        atts = store.attempts("r")
        run = store.runs().iloc[0]
    assert atts["reason"].tolist() == ["start", "resume"]
    assert atts["start_time"].tolist() == [105.0, 1_030.0]
    assert (run["start_time"], run["end_time"]) == (105.0, 1_041.0)
