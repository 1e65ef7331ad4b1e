"""End to end in real headless Chromium: the family curve's caption on the Run page and the
run against its family's line on the Compare page (`runwatch dashboard` in a subprocess)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import dashboard_server
from .test_family_pages import family_db  # noqa: F401 (the fixture)

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs the Debian chromium package at /usr/bin/chromium"
)


def test_family_caption_and_scaling_view_in_a_real_browser(family_db) -> None:  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with dashboard_server(family_db, 8619) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM))
        page = browser.new_page(viewport={"width": 1500, "height": 1800})
        try:
            page.goto(f"{url}/run?run=xl")
            chart = page.locator(".js-plotly-plot").first
            chart.wait_for(state="visible", timeout=30_000)
            expect(page.get_by_text("Expected curve from the family: s, m, l")).to_be_visible(
                timeout=30_000
            )
            expect(chart.get_by_text("expected (family)")).to_be_visible()
            page.screenshot(path=str(ARTIFACTS / "run-family.png"), full_page=True)

            page.goto(f"{url}/compare")
            expect(page.get_by_text("above the line: worse than its size predicts")).to_be_visible(
                timeout=30_000
            )
            scaling = page.locator(".js-plotly-plot").last
            expect(scaling.get_by_text("xl forecast")).to_be_visible()
            page.screenshot(path=str(ARTIFACTS / "compare-family.png"), full_page=True)
        finally:
            browser.close()
