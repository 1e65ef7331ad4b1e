"""The runwatch web dashboard (Streamlit): runs, one run, the anomaly inbox, comparisons.

``app.py`` only routes; each page is one file under ``views/``; ``data.py`` holds every
cached read; ``charts*.py`` and ``shaping.py`` are pure (no Streamlit) and unit-tested.
The store path reaches the app through the ``RUNWATCH_DASHBOARD_DB`` environment variable,
set by ``runwatch dashboard --db`` (and by tests), so no browser can point the server at
another file.
"""

from pathlib import Path

APP_PATH = Path(__file__).with_name("app.py")
SERVE_PATH = Path(__file__).with_name("asgi_app.py")
"""What ``streamlit run`` is given: the router wrapped in runwatch's ASGI app."""
DB_ENV = "RUNWATCH_DASHBOARD_DB"
CHART_PAGES = ("run", "anomalies", "compare", "fleet")
"""Url paths of the pages that draw plotly charts (see ``app.PAGES``): their HTML tells the
browser to fetch plotly.js at once (``streamlit_internals.py``)."""
APP_ICON = "📈"
"""The page icon (one place: the app sets it, the server warms Streamlit up for it)."""


__all__ = ["APP_ICON", "APP_PATH", "CHART_PAGES", "DB_ENV", "SERVE_PATH"]
