"""``runwatch metrics``: each series of a run, the role it was given and what watches it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from runwatch.cli_analysis import parse_roles
from runwatch.model import json_plain
from runwatch.store import STORE_HELP, default_store, open_store


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    cmd = sub.add_parser(
        "metrics",
        help="show each series of a run: its role and the detectors watching it",
        description="List the series of a run with their points, first and last step, the "
        "role runwatch read from the metric's name (loss, grad_norm, lr, throughput, "
        "step_time, loss_scale, counter, index, other) or an override gave it, and the "
        "default detectors that watch it live and in `runwatch analyze`. Overrides come from "
        "the run's config `roles` and --roles. json: one object per series per line.",
    )
    cmd.add_argument("--db", default=default_store(), metavar="DB", help=STORE_HELP)
    cmd.add_argument("--run", required=True, metavar="NAME")
    cmd.add_argument(
        "--roles",
        metavar="JSON",
        help='override roles, as analyze takes them: {"reward": "other", "val_*": "loss"}',
    )
    cmd.add_argument("--format", choices=("table", "json"), default="table")
    return {"metrics": cmd_metrics}


def cmd_metrics(args: argparse.Namespace) -> int:
    from runwatch.pipeline.watched import as_frame, watched_series

    roles = parse_roles(args.roles)
    with open_store(args.db, readonly=True) as store:
        records = watched_series(store, args.run, roles)
    if args.format == "json":
        for rec in records:
            print(json.dumps({k: json_plain(v) for k, v in rec.items()}))
        return 0
    if not records:
        print(f"run {args.run!r} has no series")
        return 0
    shown = as_frame(records)[["metric", "labels", "points", "steps", "role", "detectors"]]
    print(shown.to_string(index=False))
    return 0
