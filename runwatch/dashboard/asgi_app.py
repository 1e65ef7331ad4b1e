"""What ``runwatch dashboard`` serves: Streamlit's own ASGI app around the router
(``app.py``), plus runwatch's preload hints for the pages that draw charts.

``streamlit run`` finds the ``st.App`` below by reading this file (it must stay a plain
``app = st.App(...)`` assignment) and serves it with the usual command-line flags. The
server process warms up here, before it listens, whoever started it (``runwatch
dashboard`` or the demo's child process).
"""

from __future__ import annotations

import streamlit as st
from starlette.middleware import Middleware

from runwatch.dashboard import APP_PATH, CHART_PAGES
from runwatch.dashboard.server import warm_up
from runwatch.dashboard.streamlit_internals import PreloadHints

warm_up()

app = st.App(APP_PATH, middleware=[Middleware(PreloadHints, pages=CHART_PAGES)])
