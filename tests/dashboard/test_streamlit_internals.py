"""What runwatch takes from Streamlit internals: the versions it was checked on, the preload
and compile hints (chart pages name plotly.js in a ``Link`` header, other pages do not), the
warm-up and the in-process command line."""

from __future__ import annotations

import ast
import asyncio
import logging
import re
import sys
from pathlib import Path

import pytest
import streamlit
from packaging.version import Version

from runwatch.dashboard import APP_PATH, CHART_PAGES, SERVE_PATH
from runwatch.dashboard import streamlit_internals as internals
from runwatch.dashboard.streamlit_internals import (
    CHECKED_STREAMLIT,
    COMPILE_HINT,
    PreloadHints,
    link_header,
    plotly_chunks,
    streamlit_js_dir,
)


def test_the_installed_streamlit_is_one_the_internals_were_checked_on() -> None:
    low, high = (Version(v) for v in CHECKED_STREAMLIT)
    installed = Version(streamlit.__version__)
    assert low <= installed < high, (
        f"Streamlit {installed} is outside {low} <= v < {high}, the versions "
        "runwatch/dashboard/streamlit_internals.py was checked on. Re-check each item its "
        "docstring lists (tests/dashboard, incl. test_browser.py; bench/dashboard.py for the "
        "Run page's time), then update CHECKED_STREAMLIT."
    )


def test_no_other_module_reaches_into_streamlit_internals() -> None:
    """Only ``streamlit_internals.py`` imports Streamlit below its public ``st`` namespace or
    touches its private names."""
    package = Path(internals.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        if path.name == "streamlit_internals.py":
            continue
        text = path.read_text()
        if re.search(r"from streamlit[. ]|import streamlit\.|streamlit\.\w+\._|\bst\.\w*\._", text):
            offenders.append(path.name)
    assert not offenders, f"move these uses of Streamlit internals: {offenders}"


def test_the_warm_up_survives_a_streamlit_without_the_emoji_check(monkeypatch, caplog) -> None:
    internals.warm_up_streamlit("📈")
    monkeypatch.setitem(sys.modules, "streamlit.string_util", None)  # importing it fails
    with caplog.at_level(logging.INFO, logger="runwatch.dashboard"):
        internals.warm_up_streamlit("📈")
    assert "not warmed up" in caplog.text


def test_the_command_line_entry_point_is_there() -> None:
    from streamlit.web import cli as stcli

    assert callable(stcli.main.main)


def test_the_installed_streamlit_has_one_plotly_chunk_and_it_is_preloaded_first() -> None:
    chunks = plotly_chunks()
    assert chunks, "no PlotlyChart chunk in this Streamlit: the hint would silently vanish"
    assert re.fullmatch(r"static/js/PlotlyChart\.[\w-]+\.js", chunks[0])
    js_dir = streamlit_js_dir()
    assert all((js_dir / Path(c).name).is_file() for c in chunks)
    # The shell's own chunks (index.html loads them) are not named again.
    shell = (js_dir.parent.parent / "index.html").read_text()
    assert not any(f"./{c}" in shell for c in chunks)


def test_a_streamlit_without_the_chunk_gets_no_hint_and_a_warning(tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="runwatch.dashboard"):
        assert plotly_chunks(tmp_path) == ()
    assert "on demand" in caplog.text


def test_chunk_imports_are_read_from_the_chunk_and_the_shell_ones_left_out(tmp_path) -> None:
    js = tmp_path / "static" / "js"
    js.mkdir(parents=True)
    (tmp_path / "index.html").write_text('<script src="./static/js/shell.A1.js"></script>')
    for name in ("shell.A1.js", "extra.B2.js"):
        (js / name).write_text("")
    (js / "PlotlyChart.X9.js").write_text(
        'import{a}from"./shell.A1.js";import"./extra.B2.js";import{c}from"./gone.C3.js";var P=1'
    )
    assert plotly_chunks(js) == ("static/js/PlotlyChart.X9.js", "static/js/extra.B2.js")


def _headers(
    path: str,
    method: str = "GET",
    content_type: bytes = b"text/html; charset=utf-8",
    chunks: tuple[str, ...] = ("static/js/PlotlyChart.X9.js",),
) -> dict[bytes, bytes]:
    """The response headers a request gets through the middleware (a plain ASGI call)."""

    async def page(scope, receive, send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", content_type)],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    sent: list[dict] = []

    async def send(message) -> None:
        sent.append(message)

    hints = PreloadHints(page, pages=("run",), chunks=chunks)
    asyncio.run(hints({"type": "http", "method": method, "path": path}, None, send))
    return dict(sent[0]["headers"])


def test_the_hint_goes_on_chart_pages_html_only() -> None:
    hint = b"<./static/js/PlotlyChart.X9.js>; rel=modulepreload"
    assert _headers("/run")[b"link"] == hint
    assert _headers("/base/run", "HEAD")[b"link"] == hint  # under a base URL path too
    assert b"link" not in _headers("/")  # the runs table draws no chart
    assert b"link" not in _headers("/runs")
    assert b"link" not in _headers("/run", "POST")
    assert b"link" not in _headers("/run", content_type=b"text/plain")


def test_no_chunk_means_no_header() -> None:
    assert b"link" not in _headers("/run", chunks=())


def test_link_header_lists_every_chunk_relative_to_the_page() -> None:
    assert link_header(["static/js/a.js", "static/js/b.js"]) == (
        b"<./static/js/a.js>; rel=modulepreload, <./static/js/b.js>; rel=modulepreload"
    )


def _served(path: str, status: int = 200, method: str = "GET") -> tuple[dict, bytes]:
    """(headers, whole body) of a static file response in two body messages, as Starlette
    sends a file, through the middleware."""
    content = b"import{a}from'./x.js';var P=1;"

    async def static(scope, receive, send) -> None:
        body = content if status == 200 else b""
        headers = [(b"content-type", b"application/javascript"), (b"etag", b'"abc"')]
        headers += [(b"accept-ranges", b"bytes"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body[:10], "more_body": True})
        await send({"type": "http.response.body", "body": body[10:]})

    sent: list[dict] = []

    async def send(message) -> None:
        sent.append(message)

    hints = PreloadHints(static, pages=("run",), chunks=("static/js/PlotlyChart.X9.js",))
    asyncio.run(hints({"type": "http", "method": method, "path": path}, None, send))
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return dict(sent[0]["headers"]), body


def test_the_plotly_chunk_is_served_with_the_compile_hint_in_front() -> None:
    headers, body = _served("/static/js/PlotlyChart.X9.js")
    assert body == COMPILE_HINT + b"import{a}from'./x.js';var P=1;"
    assert int(headers[b"content-length"]) == len(body)
    assert b"etag" not in headers and b"accept-ranges" not in headers  # they describe the file
    assert headers[b"content-type"] == b"application/javascript"


def test_other_files_and_partial_responses_are_served_as_they_are() -> None:
    headers, body = _served("/static/js/Slider.A1.js")
    assert body == b"import{a}from'./x.js';var P=1;" and headers[b"etag"] == b'"abc"'
    headers, body = _served("/static/js/PlotlyChart.X9.js", status=304)
    assert body == b"" and headers[b"content-length"] == b"0" and b"etag" in headers
    _, body = _served("/static/js/PlotlyChart.X9.js", method="HEAD")
    assert not body.startswith(COMPILE_HINT)


def _pages() -> list[tuple[str, str]]:
    """(view file, url path) of every page listed in app.PAGES (read, not imported)."""
    tree = ast.parse(APP_PATH.read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "PAGES":
            return [(row[0], row[2]) for row in ast.literal_eval(node.value)]
    raise AssertionError("app.py has no PAGES list")


@pytest.mark.parametrize("view,url", _pages())
def test_chart_pages_are_exactly_the_pages_that_draw_plotly_charts(view, url) -> None:
    draws = "plotly_chart(" in (APP_PATH.parent / view).read_text()
    assert (url in CHART_PAGES) == draws, f"{view}: keep CHART_PAGES in step with the page"


def test_streamlit_finds_the_asgi_app_in_the_served_script() -> None:
    from streamlit.web.server.app_discovery import discover_asgi_app

    found = discover_asgi_app(SERVE_PATH)
    assert found.is_asgi_app and found.app_name == "app"
