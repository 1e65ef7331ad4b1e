"""Serving the dashboard: the Streamlit command line, the environment, readiness.

``runwatch dashboard`` runs Streamlit in its own process (so SIGTERM and Ctrl-C reach the
server directly and the process measured is the server); ``runwatch demo`` starts the same
command as a child next to the run it writes. The store path travels in ``DB_ENV``, never in
the URL, so a browser cannot point the server at another file.

What Streamlit runs is ``asgi_app.py``: Streamlit's own ASGI app (``st.App``) around the
router, with runwatch's preload hints (``streamlit_internals.py``), served by uvicorn.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import webbrowser
from pathlib import Path

from runwatch.dashboard import APP_ICON, DB_ENV, SERVE_PATH
from runwatch.store import is_store_url, store_label

log = logging.getLogger("runwatch.dashboard")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8501


def streamlit_args(host: str, port: int) -> list[str]:
    """``streamlit run`` arguments: headless (we open the browser ourselves, so Streamlit
    never asks for an e-mail on first run), no telemetry, no file watcher, a light theme.
    The script is the ASGI wrapper (``asgi_app.py``), which serves the router."""
    return [
        "run",
        str(SERVE_PATH),
        "--server.headless=true",
        f"--server.address={host}",
        f"--server.port={port}",
        "--browser.gatherUsageStats=false",
        "--server.fileWatcherType=none",
        "--client.toolbarMode=minimal",
        "--theme.base=light",
        "--theme.primaryColor=#2563eb",
    ]


def dashboard_command(db: str | Path, port: int) -> list[str]:
    """``runwatch dashboard`` on ``db`` at ``port`` without a browser, as a child's command
    line (the E2E tests and bench/dashboard.py): the child is the server itself, warmed up
    as a user's would be (``launch`` starts bare Streamlit)."""
    cmd = ["dashboard", "--db", str(db), "--port", str(port), "--no-browser"]
    return [sys.executable, "-m", "runwatch.cli", *cmd]


def url_of(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{shown}:{port}"


def check_port(host: str, port: int) -> None:
    """Fail fast, with the fix, when the port is taken (Streamlit's own error is buried)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ValueError(
                f"cannot listen on {host}:{port} ({exc.strerror}); pass another --port"
            ) from None


def free_port(host: str, preferred: int) -> int:
    """``preferred`` if it is free, else one the OS picks (the demo must not fail on 8501)."""
    try:
        check_port(host, preferred)
        return preferred
    except ValueError:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            return int(probe.getsockname()[1])


def wait_ready(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> bool:
    """Poll Streamlit's health endpoint until it answers ``ok`` (False on timeout/exit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=1) as resp:
                if resp.read().strip() == b"ok":
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def launch(db: str, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> subprocess.Popen:
    """Start the dashboard on ``db`` as a child process (for the demo and tests)."""
    check_port(host, port)
    env = {**os.environ, DB_ENV: _absolute(db)}
    cmd = [sys.executable, "-m", "streamlit", *streamlit_args(host, port)]
    log.info("starting dashboard: %s", " ".join(cmd))
    # stderr goes to a file, not a pipe: nobody reads a pipe while the demo runs, and a full
    # pipe would freeze the server. ``startup_log`` reads it back when start-up fails.
    errors = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=errors)
    proc.startup_errors = errors  # type: ignore[attr-defined]
    return proc


def startup_log(proc: subprocess.Popen) -> str:
    """The last of what a launched dashboard wrote to stderr (to explain a failed start)."""
    errors = getattr(proc, "startup_errors", None)
    if errors is None:
        return ""
    errors.seek(0)
    return errors.read().decode(errors="replace")[-2000:].strip()


def warm_up() -> float:
    """Pay the process's one-time costs before the first visitor does; returns seconds.

    Otherwise the first page drawn in a fresh server pays them on its critical path: plotly
    importing its validator modules and loading its template for the first figure, and
    Streamlit loading its emoji catalog for the page icon. Done here, before the server
    listens, the first visit is as quick as the later ones.

    Last, everything alive by then (modules, plotly's validators and template) is moved out
    of the garbage collector's sight (``gc.freeze``). Streamlit runs a full collection after
    every script run (each page view, each live tick), which would walk all those objects
    every time, holding the GIL right when the browser fetches the page's widget code. Now
    it walks only what the runs made. Frozen objects are never freed, so this is done once,
    on what lives as long as the process anyway. The measurements are in
    bench/README-dashboard.md.
    """
    started = time.perf_counter()
    import numpy as np
    import pandas as pd
    import plotly.io as pio

    from runwatch.dashboard.charts import placeholder_figure, run_figure
    from runwatch.dashboard.streamlit_internals import warm_up_streamlit

    warm_up_streamlit(APP_ICON)
    steps = np.arange(1, 65)
    frame = pd.DataFrame(
        {"step": steps, "time": steps * 1.0, "value": 1.0 / steps, "superseded": False}
    ).assign(x=steps, smooth=1.0 / steps)
    pio.to_json(placeholder_figure(300, ""), validate=False)
    pio.to_json(
        run_figure([("loss", frame), ("lr", frame)], smoothed=True, restarts=[(32, "")]),
        validate=False,
    )
    gc.collect()
    gc.freeze()
    elapsed = time.perf_counter() - started
    log.info("warmed up in %.2f s", elapsed)
    return elapsed


def serve(db: str, host: str, port: int, open_browser: bool) -> int:
    """Run the dashboard in this process until it is stopped (blocks)."""
    import click

    from runwatch.dashboard.streamlit_internals import run_cli

    check_port(host, port)
    os.environ[DB_ENV] = _absolute(db)
    url = url_of(host, port)
    print(f"runwatch dashboard on {store_label(db)}: {url}  (Ctrl-C to stop)", flush=True)
    if open_browser:
        threading.Thread(target=_open_when_ready, args=(url,), daemon=True).start()
    try:
        run_cli(streamlit_args(host, port))
    except click.exceptions.Abort:
        # Ctrl-C: uvicorn shuts the server down cleanly, then re-raises the interrupt
        # (which click turns into Abort); that is the normal way to stop, not an error.
        log.info("dashboard stopped")
    return 0


def open_browser_if_desktop(url: str) -> None:
    """Open ``url`` in a browser only where there is a desktop to show it.

    On a headless training node Python's webbrowser would fall back to a console browser
    (lynx, w3m) and take over the terminal; there the printed URL is what people use.
    """
    desktop = sys.platform in ("darwin", "win32") or bool(
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    )
    if desktop:
        webbrowser.open(url)


def _open_when_ready(url: str) -> None:
    if wait_ready(url):
        open_browser_if_desktop(url)


def _absolute(db: str) -> str:
    """The store for the pages: a file as an absolute path (they run in another directory),
    a database URL as given."""
    return db if is_store_url(db) else str(Path(db).resolve())
