"""Page furniture shared by every view: the store path, errors with hints, the run picker,
and the live-refresh setting.

Expected failures (no store, a file that is not a store, an unknown run) become an
``st.error`` with what to do next and stop the page; a person never sees a traceback for a
mistake they can fix.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st

from runwatch.dashboard import DB_ENV, data
from runwatch.store import DEFAULT_STORE, RunNotFoundError, StoreError

REFRESH_CHOICES = {"off": None, "1 s": "1s", "2 s": "2s", "5 s": "5s", "15 s": "15s"}
DEFAULT_REFRESH = "2 s"


def store_path() -> str:
    """The store this server shows (``$RUNWATCH_DASHBOARD_DB``, else ./runwatch.db)."""
    return os.environ.get(DB_ENV) or DEFAULT_STORE


def hint_for(exc: Exception, db: str) -> str:
    if isinstance(exc, RunNotFoundError):
        return "Pick another run in the Runs page; the run may have been written to another store."
    return (
        f"Point the dashboard at a runwatch store: `runwatch dashboard --db PATH`. To make one, "
        f"`runwatch demo --db {db} --no-dashboard`, or log a run with "
        f"`runwatch.init(store='{db}')`."
    )


@contextmanager
def guarded(db: str) -> Iterator[None]:
    """Turn store errors raised inside the block into a message with a hint, and stop."""
    try:
        yield
    except StoreError as exc:
        st.error(f"**{exc}**\n\n{hint_for(exc, db)}", icon="🚫")
        st.stop()


def open_or_stop(db: str) -> None:
    """Check the store opens before drawing anything."""
    with guarded(db):
        data.reader(db)


def settings_sidebar() -> None:
    """Live refresh interval and the name verdicts are signed with (shared by all pages)."""
    with st.sidebar:
        st.caption(f"store: `{store_path()}`")
        st.selectbox(
            "Live refresh",
            list(REFRESH_CHOICES),
            index=list(REFRESH_CHOICES).index(DEFAULT_REFRESH),
            key="refresh",
            help="Panels re-read the store in place at this interval; the page never reloads.",
        )
        st.text_input("Your name (signs verdicts)", value=os.environ.get("USER", ""), key="author")


def run_every() -> str | None:
    return REFRESH_CHOICES.get(st.session_state.get("refresh", DEFAULT_REFRESH))


def author() -> str | None:
    return st.session_state.get("author") or os.environ.get("USER") or None


def pick_run(db: str, label: str = "Run") -> str:
    """A run picker that remembers the choice across pages and in the URL (``?run=``)."""
    runs = data.runs(db)
    if runs.empty:
        st.info("This store has no runs yet. Start one (`runwatch demo`) and it appears here.")
        st.stop()
    names = runs["name"].tolist()[::-1]  # newest first
    wanted = st.session_state.get("run") or st.query_params.get("run")
    if wanted and wanted not in names:
        missing = RunNotFoundError(db, wanted, names)
        st.error(f"**{missing}**\n\n{hint_for(missing, db)}", icon="🚫")
        wanted = None
    # No key: the index follows the run chosen on another page (a new default, a new widget).
    choice = st.selectbox(label, names, index=names.index(wanted) if wanted else 0)
    st.session_state["run"] = choice
    st.query_params["run"] = choice
    return choice


EMOJI_SHORTCODE = re.compile(r":(?!material/|streamlit:)[\w+-][\w_+-]*:")
"""What Streamlit's markdown (1.67) takes for an emoji shortcode such as ``:smile:``. A text
it matches makes the element load the emoji plugin, a chunk of its own, and show a skeleton
until it has; on a page that also loads plotly.js that is a few tenths of a second."""


def clock_text(seconds: float | None = None) -> str:
    """``updated HH:MM:SS`` as markdown, with the colons escaped: ``12:34:56`` would read as
    the shortcode ``:34:`` (see ``EMOJI_SHORTCODE``); the escaped text shows the same."""
    clock = time.strftime("%H:%M:%S", time.localtime(seconds))
    return "updated " + clock.replace(":", "\\:")


def updated_caption() -> None:
    st.caption(clock_text())
