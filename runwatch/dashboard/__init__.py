"""The runwatch web dashboard (Streamlit): runs, one run, the anomaly inbox, comparisons.

``app.py`` only routes; each page is one file under ``views/``; ``data.py`` holds every
cached read; ``charts*.py`` and ``shaping.py`` are pure (no Streamlit) and unit-tested.
The store path reaches the app through the ``RUNWATCH_DASHBOARD_DB`` environment variable,
set by ``runwatch dashboard --db`` (and by tests), so no browser can point the server at
another file.
"""

from pathlib import Path

APP_PATH = Path(__file__).with_name("app.py")
DB_ENV = "RUNWATCH_DASHBOARD_DB"


def app_icon() -> str:
    """The page icon (one place: the app sets it, the server warms Streamlit up for it)."""
    return "📈"


__all__ = ["APP_PATH", "DB_ENV", "app_icon"]
