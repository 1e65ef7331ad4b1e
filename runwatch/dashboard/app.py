"""The dashboard's entry script: it only routes.

Every page is one file under ``views/`` and is listed in ``PAGES`` -- the one place a new
page (telemetry, fleet) is added.
"""

from __future__ import annotations

import streamlit as st

from runwatch.dashboard import APP_ICON, ui

PAGES: list[tuple[str, str, str, str]] = [
    # (file relative to this script, title, url path, icon)
    ("views/runs.py", "Runs", "runs", ":material/monitoring:"),
    ("views/run.py", "Run", "run", ":material/show_chart:"),
    ("views/anomalies.py", "Anomalies", "anomalies", ":material/notification_important:"),
    ("views/compare.py", "Compare", "compare", ":material/stacked_line_chart:"),
    ("views/fleet.py", "Fleet", "fleet", ":material/dns:"),
]

st.set_page_config(page_title="runwatch", page_icon=APP_ICON, layout="wide")
ui.settings_sidebar()
pages = [
    st.Page(path, title=title, url_path=url, icon=icon, default=i == 0)
    for i, (path, title, url, icon) in enumerate(PAGES)
]
st.navigation(pages).run()
