"""`runwatch dashboard` and `runwatch demo` wiring: parser, errors, the URL printed."""

from __future__ import annotations

import argparse
import gc
import signal
import socket
import subprocess
import sys

import pytest

from runwatch.dashboard import cli
from runwatch.dashboard.server import (
    check_port,
    dashboard_command,
    free_port,
    streamlit_args,
    url_of,
    wait_ready,
)


def test_register_adds_the_dashboard_command_bound_to_localhost() -> None:
    parser = argparse.ArgumentParser()
    handlers = cli.register(parser.add_subparsers(dest="command"))
    assert set(handlers) == {"dashboard"}
    args = parser.parse_args(["dashboard", "--db", "x.db", "--no-browser"])
    assert (args.db, args.host, args.port, args.no_browser) == ("x.db", "127.0.0.1", 8501, True)
    flags = streamlit_args(args.host, args.port)
    assert "--server.address=127.0.0.1" in flags and "--server.headless=true" in flags


def test_a_busy_port_is_a_one_line_error_with_exit_code_2() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ValueError, match="pass another --port"):
            check_port("127.0.0.1", port)
        assert free_port("127.0.0.1", port) != port
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "runwatch.cli",
                "dashboard",
                "--port",
                str(port),
                "--no-browser",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2
    assert "pass another --port" in out.stderr and "Traceback" not in out.stderr


def test_warm_up_builds_the_run_chart_once_before_serving() -> None:
    """``runwatch dashboard`` calls it before listening; a failure here would stop the server."""
    from runwatch.dashboard.server import warm_up

    try:
        assert warm_up() >= 0.0
        # What lives from then on is frozen: Streamlit's collection after each run skips it.
        assert gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()  # this test process is not a server


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_stop_the_dashboard_quietly(tmp_path, sig) -> None:
    """The server is Streamlit's ASGI app under uvicorn, which re-raises the signal once it
    has shut down: Ctrl-C must still end with exit code 0 and no traceback."""
    port = free_port("127.0.0.1", 8598)
    proc = subprocess.Popen(
        dashboard_command(tmp_path / "x.db", port),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert wait_ready(url_of("127.0.0.1", port), timeout=60, proc=proc)
        proc.send_signal(sig)
        out = proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in ((0,) if sig == signal.SIGINT else (0, -signal.SIGTERM)), out
    assert "Traceback" not in out
