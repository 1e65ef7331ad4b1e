"""``runwatch migrate``: an embedded SQLite store into a shared PostgreSQL one (resumable,
verified by counts and checksums; runwatch/store/postgres_migrate.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from runwatch.store import DEFAULT_STORE, is_store_url


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    mig = sub.add_parser(
        "migrate",
        help="move an SQLite store into PostgreSQL (resumable, verified)",
        description="Copy every run, point, event, anomaly, incident, verdict and alert of "
        "an SQLite store into a PostgreSQL database, keeping their ids, then verify the copy "
        "by row counts and checksums. Stopped half-way, the same command resumes it. Stop "
        "writers to the SQLite file first; the database must be empty or hold this "
        "migration's earlier part.",
    )
    mig.add_argument(
        "--from",
        dest="source",
        default=DEFAULT_STORE,
        metavar="DB",
        help=f"the SQLite store (default: {DEFAULT_STORE} here)",
    )
    mig.add_argument(
        "--to", dest="target", required=True, metavar="URL", help="postgresql://user@host/db"
    )
    mig.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return {"migrate": _cmd_migrate}


def _cmd_migrate(args: argparse.Namespace) -> int:
    if not is_store_url(args.target):
        raise ValueError(f"--to must be a postgresql:// URL, not {args.target!r}")
    if is_store_url(args.source):
        raise ValueError("--from must be an SQLite store file")
    from runwatch.store.postgres_migrate import migrate_store

    def progress(table: str, done: int, total: int) -> None:
        print(f"\r  {table}: {done:,} / {total:,} rows", end="", file=sys.stderr, flush=True)
        if done >= total:
            print(file=sys.stderr)

    report = migrate_store(args.source, args.target, progress=None if args.quiet else progress)
    rows = sum(report.rows.values())
    again = " (resumed)" if report.resumed else ""
    print(
        f"migrated {args.source} -> {report.target}{again}: {report.rows['runs']:,} runs, "
        f"{report.points:,} points, {rows:,} rows in {len(report.rows)} tables, "
        f"{report.seconds:.1f} s ({report.points_per_s:,.0f} points/s); verified: counts "
        "and checksums equal"
    )
    return 0
