"""The Run page's ETA card: the failure-aware ETA with its 90% band and the goodput."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from runwatch.dashboard import DB_ENV
from runwatch.model import Event
from runwatch.store import open_store

from .conftest import APP_DIR

TIMEOUT = 30


def _restarted_run(db: Path, status: str | None) -> None:
    """400 planned steps at 1 s each; a crash at step 120, 300 s down, back to step 100."""
    with open_store(db) as store:
        run_id, first = store.start_run("restarted", config={"total_steps": 400}, now=0.0)
        sid = store.series_id(run_id, "loss")
        s = np.arange(1, 120)
        store.write(run_id, first, {sid: (s, s * 1.0, 3.0 + 7.0 / s)})
        store.add_events(run_id, first, [Event("checkpoint", 100, 100.0)])
        store.add_events(run_id, first, [Event("crash", 120, 120.0, "CUDA error")])
        second = store.begin_attempt(run_id, 101, "restart", now=400.0)
        s = np.arange(101, 250)
        store.write(run_id, second, {sid: (s, 420.0 + (s - 101), 3.0 + 7.0 / s)})
        if status is not None:
            store.set_run_status(run_id, status, now=600.0)


def _eta_card(db: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(DB_ENV, str(db))
    at = AppTest.from_file(str(APP_DIR / "views/run.py"), default_timeout=TIMEOUT).run()
    assert not at.exception, [e.value for e in at.exception]
    return next(m for m in at.metric if m.label.startswith("ETA"))


def test_running_run_shows_the_eta_with_failures_its_band_and_goodput(tmp_path, monkeypatch):
    db = tmp_path / "r.db"
    _restarted_run(db, None)
    card = _eta_card(db, monkeypatch)
    assert card.label == "ETA (with failures)"
    assert "90%:" in card.delta and "goodput" in card.delta
    # 151 steps left at 1 s/step, plus a share of a ~320 s failure: over the 2.5 min of pace.
    assert card.value.endswith("min") and int(card.value.split()[0]) > 151 / 60


def test_finished_run_shows_done_and_its_goodput(tmp_path, monkeypatch):
    db = tmp_path / "f.db"
    _restarted_run(db, "finished")
    card = _eta_card(db, monkeypatch)
    assert card.value == "done"
    assert card.delta.startswith("goodput")


def test_the_run_page_shows_what_watches_each_series(tmp_path, monkeypatch):
    db = tmp_path / "w.db"
    with open_store(db) as store:
        run_id, attempt = store.start_run("w", config={"roles": {"reward": "other"}}, now=0.0)
        s = np.arange(1, 50)
        for metric in ("train/loss", "loss-scale", "reward", "_runtime"):
            sid = store.series_id(run_id, metric)
            store.write(run_id, attempt, {sid: (s, s * 1.0, 1.0 + 1.0 / s)})
    monkeypatch.setenv(DB_ENV, str(db))
    at = AppTest.from_file(str(APP_DIR / "views/run.py"), default_timeout=TIMEOUT).run()
    assert not at.exception, [e.value for e in at.exception]
    box = next(e for e in at.expander if e.label.startswith("What is watched"))
    assert box.label == "What is watched (4 series)"
    table = "\n".join(m.value for m in box.markdown).replace("\\_", "_")  # Markdown escapes
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.count("|") > 4}
    assert "loss_scale_drop" in rows["loss-scale"]
    assert "other (override)" in rows["reward"] and "drop" in rows["reward"]
    assert "index" in rows["_runtime"] and "spike" in rows["train/loss"]
