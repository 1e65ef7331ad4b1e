"""Everything runwatch does that relies on Streamlit internals, in one place.

Streamlit gives no public API for these, so each may break with a Streamlit release.
``CHECKED_STREAMLIT`` names the versions they were checked on, and
``tests/dashboard/test_streamlit_internals.py`` fails, naming this module, when the installed
Streamlit is outside that range. To widen it: run that test file and ``test_browser.py``, and
``bench/dashboard.py`` for the Run page's time (bench/README-dashboard.md).

1. **Preload hints** (``PreloadHints``, an ASGI middleware around Streamlit's app). The
   frontend fetches plotly.js, one of the largest chunks it has, only when the first chart
   element arrives over the websocket, well into a cold visit of the Run page. A ``Link:
   <...>; rel=modulepreload`` header on the HTML of the pages that draw charts lets the
   browser fetch and parse it (off the main thread) while the page shell loads; when the
   chart arrives, only running it is left. Pages without charts (the Runs table) do not get
   the header: there the download would only compete with the page. Relies on: the layout
   of Streamlit's static files and the name of its plotly chunk (``CHUNK_GLOB``); when the
   chunk is not found, no header is sent and pages load plotly.js on demand as before.
2. **Compile hint** (same middleware): the plotly chunk is served with V8's explicit compile
   hint in front (``COMPILE_HINT``), so Chromium compiles all of plotly.js on a background
   thread while it downloads instead of function by function on the main thread while it
   runs. To any other browser it is a comment. Relies on: rewriting that one asset.
3. **Warm-up** (``warm_up_streamlit``): loads the emoji catalog Streamlit checks the page
   icon against, before the first visitor pays for it. Relies on: ``streamlit.string_util``;
   when it is gone, the warm-up skips it.
4. **Running the server in this process** (``run_cli``): Streamlit's command line called as
   a function, so that ``runwatch dashboard`` is the server process. Relies on:
   ``streamlit.web.cli``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger("runwatch.dashboard")

CHECKED_STREAMLIT = ("1.67.0", "1.68")
"""Streamlit versions this module was checked on: ``CHECKED_STREAMLIT[0] <= v < [1]``."""

CHUNK_GLOB = "PlotlyChart.*.js"
COMPILE_HINT = b"//# allFunctionsCalledOnLoad\n"
"""V8's explicit compile hint (Chromium 136+): every function of the file is compiled eagerly."""
_IMPORT = re.compile(rb'(?:from|import)\s*"\./([\w.\-]+\.js)"')
_HEAD_BYTES = 8192
"""A bundler's chunk lists its static imports first; plotly.js itself follows."""


def streamlit_js_dir() -> Path:
    """Where the installed Streamlit keeps its frontend's JavaScript chunks."""
    import streamlit

    return Path(streamlit.__file__).parent / "static" / "static" / "js"


def plotly_chunks(js_dir: Path | None = None) -> tuple[str, ...]:
    """The plotly chart chunk and the chunks it imports that the page shell does not load
    itself, as URLs relative to the app's root (``static/js/...``); empty when this
    Streamlit has no such chunk.

    The shell's own chunks are left out: preloading them again would only let plotly.js
    compete with them for the first download slots.
    """
    js_dir = streamlit_js_dir() if js_dir is None else js_dir
    found = sorted(js_dir.glob(CHUNK_GLOB))
    if len(found) != 1:
        log.warning(
            "%d files match %s in %s; chart pages load plotly.js on demand",
            len(found),
            CHUNK_GLOB,
            js_dir,
        )
        return ()
    chunk = found[0]
    with chunk.open("rb") as f:
        head = f.read(_HEAD_BYTES)
    imports = [m.decode() for m in _IMPORT.findall(head)]
    index = js_dir.parent.parent / "index.html"
    shell = index.read_text(encoding="utf-8") if index.is_file() else ""
    names = [chunk.name] + [
        n for n in dict.fromkeys(imports) if (js_dir / n).is_file() and f"/{n}" not in shell
    ]
    return tuple(f"static/js/{n}" for n in names)


def link_header(urls: Iterable[str]) -> bytes:
    """``Link`` header value: relative URLs resolve against the page's URL, as the
    ``./static/...`` references in Streamlit's own index.html do."""
    return ", ".join(f"<./{u}>; rel=modulepreload" for u in urls).encode("latin-1")


class PreloadHints:
    """ASGI middleware: a ``Link: rel=modulepreload`` header on the HTML of chart pages, and
    the compile hint on the plotly chunk itself.

    ``pages`` are url paths (``run``, ``compare``); a request is for one when its path's
    last segment is one of them. Only HTML responses get the header (the page's shell;
    Streamlit serves the same index.html for every page path).
    """

    def __init__(self, app: Any, pages: Iterable[str], chunks: Iterable[str] | None = None):
        self.app = app
        self.pages = frozenset(p.strip("/") for p in pages)
        # Decided once: the chunk's name does not change while the server runs.
        urls = plotly_chunks() if chunks is None else tuple(chunks)
        self.header = link_header(urls) if urls else b""
        self.eager_suffix = "/" + urls[0].rsplit("/", 1)[-1] if urls else None
        if urls:
            log.info("chart pages %s preload %s", sorted(self.pages), urls[0])

    def wants_hint(self, scope: dict[str, Any]) -> bool:
        if scope["type"] != "http" or scope.get("method") not in ("GET", "HEAD"):
            return False
        return scope.get("path", "").rstrip("/").rsplit("/", 1)[-1] in self.pages

    def wants_compile_hint(self, scope: dict[str, Any]) -> bool:
        return (
            self.eager_suffix is not None
            and scope["type"] == "http"
            and scope.get("method") == "GET"
            and scope.get("path", "").endswith(self.eager_suffix)
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.wants_compile_hint(scope):
            await self.app(scope, receive, with_compile_hint(send))
            return
        if not self.header or not self.wants_hint(scope):
            await self.app(scope, receive, send)
            return

        async def send_with_hint(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                html = any(
                    k.lower() == b"content-type" and v.startswith(b"text/html") for k, v in headers
                )
                if html:
                    message = {**message, "headers": [*headers, (b"link", self.header)]}
            await send(message)

        await self.app(scope, receive, send_with_hint)


def with_compile_hint(send: Any) -> Any:
    """``send`` for a static file response that puts ``COMPILE_HINT`` before its body.

    Only a full response (200) is changed: its length grows by the hint's, and its ETag
    and byte-range support are dropped, since both describe the file on disk. A 304 or 206
    passes through as it is.
    """
    pending = False

    async def send_hinted(message: dict[str, Any]) -> None:
        nonlocal pending
        if message["type"] == "http.response.start" and message.get("status") == 200:
            headers = []
            for key, value in message.get("headers", []):
                name = key.lower()
                if name == b"content-length":
                    value = str(int(value) + len(COMPILE_HINT)).encode("latin-1")
                elif name in (b"etag", b"accept-ranges"):
                    continue
                headers.append((key, value))
            message = {**message, "headers": headers}
            pending = True
        elif message["type"] == "http.response.body" and pending:
            pending = False
            message = {**message, "body": COMPILE_HINT + message.get("body", b"")}
        await send(message)

    return send_hinted


def warm_up_streamlit(page_icon: str) -> None:
    """Pay Streamlit's one-time cost of checking ``page_icon`` (its emoji catalog) now."""
    try:
        from streamlit.string_util import is_emoji
    except ImportError:
        log.info("streamlit.string_util.is_emoji is gone; the page icon is not warmed up")
        return
    is_emoji(page_icon)


def run_cli(args: list[str]) -> None:
    """``streamlit <args>`` in this process, until the server stops (blocks)."""
    from streamlit.web import cli as stcli

    stcli.main.main(args=args, prog_name="streamlit", standalone_mode=False)
