"""``runwatch serve``: the ingest server for multi-process and multi-node runs.

The token comes from ``--token-file`` (or ``$RUNWATCH_TOKEN``), never from the command line,
where ``ps`` would show it to every user of the machine. ``--insecure`` (no token) is refused
unless the server listens on a loopback address only. ``--dcgm URL`` polls that Prometheus for
the DCGM readings of the running runs' GPUs (:mod:`runwatch.server.dcgm`).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runwatch.extras import require
from runwatch.store import STORE_HELP, default_store, store_label


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    serve = sub.add_parser(
        "serve",
        help="run the ingest server (HTTP API + live detection) over a store",
        description="Serve the HTTP ingest API (/api/v1, OpenAPI at /openapi.json) that "
        "multi-process and multi-node runs push to with runwatch.init(url=..., token=...); "
        "writes the store and runs the same Monitor as in-process runs.",
    )
    serve.add_argument("--db", default=default_store(), metavar="DB", help=STORE_HELP)
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: loopback)"
    )
    serve.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    serve.add_argument("--token-file", metavar="F", help="file holding the bearer token")
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="accept requests without a token (loopback addresses only)",
    )
    serve.add_argument("--no-detect", action="store_true", help="store only; no live detection")
    serve.add_argument(
        "--alerts",
        metavar="RULES",
        help="alert rules file (default: $RUNWATCH_ALERTS, or $RUNWATCH_WEBHOOK_URL with the "
        "packaged rules; neither: no alerts)",
    )
    serve.add_argument(
        "--max-body-mb",
        type=float,
        default=32.0,
        help="largest request body on the wire, MiB (default 32)",
    )
    serve.add_argument(
        "--rate-limit",
        type=float,
        default=5000.0,
        metavar="REQ_PER_S",
        help="requests per second per client address (0: no limit)",
    )
    serve.add_argument(
        "--dcgm",
        metavar="URL",
        default=os.environ.get("RUNWATCH_DCGM_URL") or None,
        help="Prometheus URL to read the DCGM exporter's GPU metrics from, for the hosts of "
        "the running runs (default: $RUNWATCH_DCGM_URL; none: no polling)",
    )
    serve.add_argument(
        "--dcgm-interval",
        type=float,
        default=15.0,
        metavar="S",
        help="seconds between DCGM polls (default 15, the exporter's usual scrape interval)",
    )
    return {"serve": cmd_serve}


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach.

    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("0.0.0.0")
    (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(path: str | None, env: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    if path is None:
        return env.get("RUNWATCH_TOKEN") or None
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the token file {path}: {exc.strerror}") from None
    if not token:
        raise ValueError(f"the token file {path} is empty")
    return token


def cmd_serve(args: argparse.Namespace) -> int:
    require("server", "serve")
    import uvicorn

    from runwatch.alerting.exporter import metrics_asgi_app
    from runwatch.server.app import ServerSettings, create_app

    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be 1..65535 (got {args.port})")
    if args.dcgm:  # a malformed URL or interval is exit 2 before anything starts
        from runwatch.collectors.dcgm import check_url
        from runwatch.collectors.dcgm_poller import check_interval

        check_url(args.dcgm)
        check_interval(args.dcgm_interval, "--dcgm-interval")
    if args.insecure:
        if not is_loopback(args.host):
            raise ValueError(f"--insecure is allowed only on a loopback address, not {args.host}")
        token = None
    else:
        token = read_token(args.token_file)
        if token is None:
            raise ValueError(
                "a token is required: --token-file F (or RUNWATCH_TOKEN), "
                "or --insecure on a loopback address"
            )
    max_body = int(args.max_body_mb * 2**20)
    engine, on_change = _alerting(args)
    settings = ServerSettings(
        db=args.db,
        token=token,
        detect=not args.no_detect,
        max_body_bytes=max_body,
        max_inflated_bytes=8 * max_body,
        rate_per_s=args.rate_limit,
        rate_burst=2 * args.rate_limit,
        on_change=on_change,
        metrics_app=metrics_asgi_app(args.db),
    )
    app = create_app(settings)
    dcgm = _dcgm(args, app) if args.dcgm else None
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=60,
    )
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"runwatch serve: http://{shown}:{args.port}/api/v1 (store {store_label(args.db)}; "
        f"API document at /openapi.json)",
        flush=True,
    )
    try:
        uvicorn.Server(config).run()
    finally:
        if dcgm is not None:
            dcgm.stop(timeout=5.0)
        if engine is not None:
            engine.close(timeout=10.0)
    return 0


def _dcgm(args: argparse.Namespace, app: Any) -> Any:
    """Start polling ``--dcgm`` into the running runs, through the app's ingest writer."""
    from runwatch.server.dcgm import ServerDcgm
    from runwatch.server.errors import ApiError

    service = app.state.service

    def submit(run_id: int, batches: list[Any]) -> Any:
        writer = service.writer  # None once the server has shut down: never reopen it
        if writer is None:
            raise ApiError(503, "server shutting down", None, "the writer has stopped")
        return writer.submit(run_id, batches)

    return ServerDcgm(args.db, args.dcgm, submit, interval_s=args.dcgm_interval).start()


def _alerting(args: argparse.Namespace) -> tuple[Any, Any]:
    """The alert engine for ``--alerts`` and, per run, the callback its detection calls."""
    from runwatch.alerting.setup import resolve_rules, start_engine

    rules = resolve_rules(args.alerts, None)
    if rules is None:
        return None, None
    engine = start_engine(rules, args.db)

    def for_run(run_id: int) -> Callable[[list[Any]], None]:
        from runwatch.store import open_store

        with open_store(args.db, readonly=True) as store:
            row = store.runs().set_index("run_id").loc[run_id]
        project = None if row["project"] is None else str(row["project"])
        return engine.bind(str(row["name"]), project)

    return engine, for_run
