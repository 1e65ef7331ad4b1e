"""End to end: `runwatch dashboard` in a subprocess, driven by real headless Chromium.

Screenshots of every page are kept under test-artifacts/ (gitignored) for people to look at.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runwatch.dashboard import inbox
from runwatch.dashboard.streamlit_internals import COMPILE_HINT
from runwatch.store import open_store

from .conftest import dashboard_server

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs the Debian chromium package at /usr/bin/chromium"
)


@pytest.fixture
def server(fresh_demo_db: Path) -> Iterator[tuple[str, Path]]:
    with dashboard_server(fresh_demo_db, 8599) as url:
        yield url, fresh_demo_db


def test_pages_in_a_real_browser_and_a_benign_verdict_is_stored(server) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, db = server
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM))
        page = browser.new_page(viewport={"width": 1500, "height": 2200})
        try:
            started = time.monotonic()
            response = page.goto(f"{url}/run")
            chart = page.locator(".js-plotly-plot").first
            chart.wait_for(state="visible", timeout=30_000)
            drawn = time.monotonic() - started
            expect(chart.get_by_text("loss", exact=True).first).to_be_visible()
            expect(chart.get_by_text("critical incident")).to_be_visible(timeout=30_000)
            expect(chart.get_by_text("restart #2 (resume)")).to_be_visible()
            # A first look (issue 17): the run's title is the top of the page, with no stray
            # text above it; the last step's age has no arrow; info-level markers are off;
            # the loss panel opens past the initial fall (a double click shows it all).
            title_y = page.get_by_role("heading", name="demo-400", level=1).bounding_box()["y"]
            main = page.locator("[data-testid=stMain]")
            above = [
                el.inner_text()
                for el in main.locator("[data-testid=stMarkdownContainer]").all()
                if el.bounding_box() and el.bounding_box()["y"] < title_y
            ]
            assert not above, above
            card = main.locator("[data-testid=stMetric]", has_text="Last step")
            expect(card.get_by_test_id("stMetricDelta")).to_have_text(re.compile(r"^\d.* ago$"))
            assert card.locator("svg").count() == 0  # no arrow
            assert "- ago" not in main.inner_text()
            expect(chart.get_by_text("info incident")).to_have_count(0)
            y_range = chart.evaluate("gd => gd._fullLayout.yaxis.range")
            with open_store(db, readonly=True) as store:
                loss = store.read_series("demo-400", "loss")["value"]
            assert y_range[1] < loss.max()  # the start of the fall is above the top edge
            assert y_range[0] < loss.iloc[len(loss) // 2 :].min()  # the rest is in view
            # The clock's escaped colons (ui.clock_text) show as plain colons.
            clock = page.get_by_text(re.compile(r"^updated \d\d:\d\d:\d\d$"))
            expect(clock.first).to_be_visible()
            # The Run page's HTML tells the browser to fetch plotly.js with the page shell.
            assert "/PlotlyChart." in response.headers.get("link", "")
            # ... and serves it with the compile hint in front, through Streamlit's own app.
            chunk = response.headers["link"].split(">", 1)[0].lstrip("<")
            served = page.request.get(f"{url}/{chunk.removeprefix('./')}")
            assert served.ok and served.body().startswith(COMPILE_HINT)
            # The incident list under the chart is a Markdown table with severity badges;
            # the anomalies, one by one, are folded away under it.
            table = page.get_by_role("table").first
            expect(table.get_by_text("loss non-finite episode", exact=False)).to_be_visible()
            expect(page.get_by_text(re.compile(r"^Anomalies, one by one \(\d+\)$"))).to_be_visible()
            page.wait_for_timeout(1500)
            page.screenshot(path=str(ARTIFACTS / "run.png"), full_page=True)
            chart.locator(".nsewdrag").first.dblclick()  # plotly: autorange, all the data
            page.wait_for_function(
                "top => document.querySelector('.js-plotly-plot')._fullLayout.yaxis.range[1] > top",
                arg=float(loss.max()),
            )

            page.goto(f"{url}/anomalies")
            with open_store(db, readonly=True) as store:
                ordered = inbox.importance_order(store.incidents())
            top = int(ordered["id"].iloc[0])
            card = page.locator(f".st-key-incident-{top}")
            expect(card).to_be_visible(timeout=30_000)
            card.locator(".js-plotly-plot").first.wait_for(state="visible")
            page.wait_for_timeout(1000)
            page.screenshot(path=str(ARTIFACTS / "anomalies.png"), full_page=True)
            opened = len(ordered)
            expect(page.get_by_text(f"Inbox · {opened} open incidents")).to_be_visible()
            card.get_by_placeholder("why: e.g. known bad shard").fill("known bad shard")
            card.get_by_placeholder("why: e.g. known bad shard").press("Enter")
            card.get_by_role("button", name="Benign", exact=True).click()
            expect(page.get_by_text(f"Inbox · {opened - 1} open incidents")).to_be_visible(
                timeout=20_000
            )
            with open_store(db, readonly=True) as store:
                verdicts = store.verdicts()
                status = store.incidents().set_index("id").loc[top, "status"]
            assert verdicts[["incident_id", "verdict", "note"]].values.tolist() == [
                [top, "benign", "known bad shard"]
            ]
            assert status == "benign"
            page.screenshot(path=str(ARTIFACTS / "anomalies-after-verdict.png"), full_page=True)

            for path, name in (("", "runs"), ("compare", "compare")):
                response = page.goto(f"{url}/{path}")
                assert ("link" in response.headers) == (path == "compare")
                page.locator(".js-plotly-plot, [data-testid=stDataFrame]").first.wait_for(
                    state="visible", timeout=30_000
                )
                page.wait_for_timeout(1500)
                page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
        finally:
            browser.close()
    assert drawn < 15, f"the Run page took {drawn:.1f} s to draw"
