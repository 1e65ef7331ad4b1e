"""The incident inbox end to end: a real run with live detection and a webhook, the
dashboard in a subprocess, real headless Chromium, a real HTTP receiver.

A run with a recurring loss spike forms one live incident; a person marks it benign in the
browser; the run resumes and spikes again: the new spike folds into the same incident (its
count grows, it stays benign) and the receiver gets no message for it.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import runwatch
from runwatch.dashboard.data import LIVE_TTL
from runwatch.store import open_store

from .conftest import dashboard_server

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
SCREENSHOT = Path("/tmp/inbox.png")
RUN = "spiky"
# Alerts leave as soon as they are formed (no group wait), so anything that would be sent
# for the folded spike has been sent by the time finish() returns.
FAST_RULES = """version: 1
defaults: {group_wait: 0, group_interval: 1s}
channels:
  default: {type: webhook, url_env: RUNWATCH_WEBHOOK_URL}
routes:
  - match: {min_severity: warning}
    channels: [default]
"""

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs the Debian chromium package at /usr/bin/chromium"
)


def _receiver_class() -> Any:
    """The alerting tests' real webhook receiver (tests/alerting/conftest.py)."""
    path = Path(__file__).resolve().parents[1] / "alerting" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_alerting_receiver", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Receiver


@pytest.fixture
def receiver() -> Iterator[Any]:
    r = _receiver_class()()
    try:
        yield r
    finally:
        r.stop()


def _log(run: runwatch.Run, steps: range, spikes: set[int], rng: np.random.Generator) -> None:
    """A falling loss with a little noise; ×4 at the ``spikes`` steps (warnings)."""
    for step in steps:
        loss = 2.0 + 8.0 * (step + 10) ** -0.4 + rng.normal(0.0, 0.01)
        run.log({"loss": loss * (4.0 if step in spikes else 1.0), "lr": 3e-4}, step=step)


def _live_run(db: Path, rules: Path, url: str, steps: range, spikes: set[int]) -> None:
    rng = np.random.default_rng(steps.start)
    run = runwatch.init(RUN, store=db, webhook=url, alerts=rules)
    _log(run, steps, spikes, rng)
    run.finish()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    db = tmp_path / "inbox.db"
    open_store(db).close()  # the dashboard opens it read-only: it must exist
    with dashboard_server(db, 8610) as url:
        yield url, db


def test_benign_in_the_inbox_folds_the_next_spike_in_with_no_alert(
    server: tuple[str, Path], receiver: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, db = server
    rules = tmp_path / "fast.yaml"
    rules.write_text(FAST_RULES)
    _live_run(db, rules, receiver.url, range(1, 900), {300, 500, 700})
    with open_store(db, readonly=True) as store:
        (incident,) = store.incidents(RUN, source="live").itertuples(index=False)
    assert (incident.status, incident.count, incident.severity) == ("open", 3, "warning")
    iid = int(incident.id)
    # The pattern did alert while it was open: the receiver works and the rules match.
    assert receiver.received, "no message for the open incident"

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM))
        page = browser.new_page(viewport={"width": 1400, "height": 1300})
        try:
            page.goto(f"{url}/anomalies")
            card = page.locator(f".st-key-incident-{iid}")
            expect(card).to_be_visible(timeout=30_000)
            expect(page.get_by_text("Inbox · 1 open incident", exact=True)).to_be_visible()
            expect(card.get_by_text(re.compile(r"^3 loss spikes of ×"))).to_be_visible()
            expect(
                card.get_by_text(f"run {RUN} · 3 members · steps 300–700 · #{iid}")
            ).to_be_visible()
            expect(card.get_by_text("No hypotheses", exact=False)).to_be_visible()
            chart = card.locator(".js-plotly-plot")
            chart.wait_for(state="visible", timeout=30_000)
            # The small chart marks the three members on the loss curve.
            xs = chart.evaluate(
                "gd => gd._fullData.filter(t => t.name === 'warning member')"
                ".flatMap(t => Array.from(t.x))"
            )
            assert xs == [300, 500, 700]
            page.wait_for_timeout(800)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
            shutil.copy(SCREENSHOT, ARTIFACTS / "inbox.png")

            note = card.get_by_placeholder("why: e.g. known bad shard")
            note.fill("eval batches every 200 steps")
            note.press("Enter")
            card.get_by_role("button", name="Benign", exact=True).click()
            expect(page.get_by_text("Inbox · 0 open incidents")).to_be_visible(timeout=20_000)
            with open_store(db, readonly=True) as store:
                judged = store.incidents(RUN).set_index("id").loc[iid]
            assert judged["status"] == "benign"
            assert judged["verdict_note"] == "eval batches every 200 steps"

            # The run resumes (a new attempt) and spikes again at step 1100.
            sent = len(receiver.received)
            _live_run(db, rules, receiver.url, range(900, 1300), {1100})
            with open_store(db, readonly=True) as store:
                after = store.incidents(RUN, source="live")
                members = store.incident_members(iid)
                assert store.attempts(RUN)["attempt"].tolist() == [1, 2]
            assert after["id"].tolist() == [iid]  # folded in, not a new incident
            assert after["count"].iloc[0] == 4 and after["status"].iloc[0] == "benign"
            assert members["step"].tolist() == [300, 500, 700, 1100]
            # No message for the folded member (alerting skips benign incidents' members).
            assert receiver.received[sent:] == []

            # The inbox shows it judged, with its new member counted (once the page's
            # cached reads, taken when the verdict was stored, have expired).
            page.wait_for_timeout(1000 * LIVE_TTL + 500)
            page.reload()
            judged_card = page.locator(f".st-key-incident-{iid}")
            expect(page.get_by_text("Judged · 1")).to_be_visible(timeout=30_000)
            expect(judged_card.get_by_text(re.compile(r"^4 loss spikes of ×"))).to_be_visible()
            expect(judged_card.get_by_text(re.compile(r" · 4 members · "))).to_be_visible()
            expect(judged_card.get_by_text("benign by", exact=False)).to_be_visible()
            # Its current verdict is the highlighted button; another click would change it.
            current = judged_card.get_by_role("button", name="Benign", exact=True)
            expect(current).to_have_attribute("kind", "primary")
            page.screenshot(path=str(ARTIFACTS / "inbox-after-fold.png"), full_page=True)
        finally:
            browser.close()
