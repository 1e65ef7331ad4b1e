"""``runwatch dashboard``: the command, registered into the main parser by ``register``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from runwatch.dashboard.server import DEFAULT_HOST, DEFAULT_PORT, serve
from runwatch.extras import require
from runwatch.store import STORE_HELP, default_store, is_store_url, store_label


def register(sub: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add the ``dashboard`` subparser to ``sub``; return {"dashboard": handler}."""
    p = sub.add_parser(
        "dashboard",
        help="the web dashboard on a store",
        description="Serve the web dashboard (runs, one run, the anomaly inbox, comparisons) "
        "on a store. It binds to 127.0.0.1 unless told otherwise: the dashboard has no "
        "login, and verdicts written through it are signed with whatever name is typed.",
    )
    p.add_argument("--db", default=default_store(), metavar="DB", help=STORE_HELP)
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on (default {DEFAULT_HOST}; 0.0.0.0 exposes it to the network)",
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"(default {DEFAULT_PORT})")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    return {"dashboard": _cmd_dashboard}


def _cmd_dashboard(args: argparse.Namespace) -> int:
    require("dashboard", "dashboard")
    if not is_store_url(args.db) and not Path(args.db).exists():
        # Serve anyway: a dashboard started before the training job shows a hint and then
        # the run, as soon as the first point lands.
        print(
            f"runwatch dashboard: warning: {store_label(args.db)} does not exist yet; the pages "
            "will say "
            "so until a run writes to it",
            file=sys.stderr,
        )
    return serve(args.db, args.host, args.port, open_browser=not args.no_browser)
