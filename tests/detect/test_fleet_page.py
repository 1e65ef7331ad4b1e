"""The Fleet dashboard page renders a multi-rank run: heatmap, episodes, failure figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from runwatch.dashboard import charts_fleet
from runwatch.model import Event
from runwatch.store import open_store

PAGE = Path(__file__).resolve().parents[2] / "runwatch/dashboard/views/fleet.py"


@pytest.fixture
def fleet_db(db_path):
    store = open_store(str(db_path))
    run_id, a1 = store.start_run("fleet", now=0.0)
    steps = np.arange(300)
    for rank in range(8):
        sid = store.series_id(
            run_id, "step_time", {"rank": rank, "host": f"n{rank // 4}", "gpu": rank % 4}
        )
        value = np.where((rank == 6) & (steps >= 100), 1.3, 1.0)
        store.write(run_id, a1, {sid: (steps, 10.0 + steps * 1.0, value)})
    store.add_events(run_id, a1, [Event("crash", 299, 400.0, "boom", rank=6)])
    store.close()
    return db_path


def test_fleet_page_shows_the_straggler_and_the_failure(fleet_db, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("RUNWATCH_DASHBOARD_DB", str(fleet_db))
    at = AppTest.from_file(str(PAGE), default_timeout=60).run()
    assert not at.exception, at.exception
    charts = at.get("plotly_chart")
    assert len(charts) == 3
    heat = json.loads(charts[0].proto.spec)["data"][0]
    assert heat["type"] == "heatmap" and len(heat["y"]) == 8
    table = at.dataframe[0].value
    row = table[table["detector"] == "straggler"].iloc[0]
    assert (row["rank"], row["host"], row["gpu"], row["from step"]) == (6, "n1", 2, 100)
    assert next(m.value for m in at.metric) == "1"


def test_relative_matrix_keeps_the_worst_ranks_when_there_are_too_many():
    import pandas as pd

    steps, ranks = np.meshgrid(np.arange(10), np.arange(50), indexing="ij")
    value = np.ones(steps.shape)
    value[:, 33] = 2.0
    pts = pd.DataFrame({"step": steps.ravel(), "rank": ranks.ravel(), "value": value.ravel()})
    m = charts_fleet.relative_matrix(pts, max_ranks=5, max_steps=4)
    assert 33 in m.index and m.shape == (5, 4)
