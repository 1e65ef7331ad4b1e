"""The incident inbox page under Streamlit's AppTest, on the demo store (live incidents)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from runwatch.dashboard import DB_ENV, inbox
from runwatch.store import open_store

from .conftest import APP_DIR


def _inbox(db: Path, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv(DB_ENV, str(db))
    return AppTest.from_file(str(APP_DIR / "views/anomalies.py"), default_timeout=30)


def _card_ids(at: AppTest) -> list[int]:
    """Incident ids in the order their cards are drawn (their benign buttons' keys)."""
    return [int(b.key.removeprefix("benign-i")) for b in at.button if b.key.startswith("benign-i")]


def _stored(db: Path) -> list[dict]:
    with open_store(db, readonly=True) as store:
        return store.incidents().to_dict("records")


def test_inbox_orders_cards_and_a_verdict_moves_one_to_the_judged_list(
    fresh_demo_db, monkeypatch
) -> None:
    stored = _stored(fresh_demo_db)
    expected = inbox.importance_order(inbox.filter_incidents(pd.DataFrame(stored)))["id"].tolist()
    at = _inbox(fresh_demo_db, monkeypatch).run()
    assert not at.exception
    assert at.subheader[0].value == f"Inbox · {len(stored)} open incidents"
    assert _card_ids(at) == expected
    # The small charts: one per open card, each marking its members' steps.
    charts = [json.loads(el.proto.spec) for el in at.get("plotly_chart")][: len(expected)]
    assert all(any("member" in (t.get("name") or "") for t in c["data"]) for c in charts)

    worst = expected[0]
    at.text_input(key=f"inote-{worst}").set_value("the crash is known: rank 5's node")
    at.button(key=f"real-i{worst}").click().run()
    assert not at.exception
    after = {r["id"]: r for r in _stored(fresh_demo_db)}
    assert after[worst]["status"] == "real"
    assert after[worst]["verdict_note"] == "the crash is known: rank 5's node"
    assert at.subheader[0].value == f"Inbox · {len(stored) - 1} open incidents"
    assert at.subheader[1].value == "Judged · 1"
    assert _card_ids(at)[-1] == worst  # below the open ones
    # The judged filter hides it; the open ones stay.
    at.button_group(key="f_judged").set_value(["benign"]).run()
    assert not at.exception
    assert worst not in _card_ids(at) and len(_card_ids(at)) == len(stored) - 1


def test_an_incident_opened_from_the_run_page_comes_first(demo_db, monkeypatch) -> None:
    stored = _stored(demo_db)
    last = inbox.importance_order(pd.DataFrame(stored))["id"].tolist()[-1]
    at = _inbox(demo_db, monkeypatch)
    at.session_state["incident_id"] = last
    at.run()
    assert not at.exception
    assert _card_ids(at)[0] == last
