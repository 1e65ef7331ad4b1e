"""The ``runwatch`` command: a public contract (docs/architecture.md, "Contracts").

Exit codes: 0 fine, 1 anomalies at or above ``--fail-on``, 2 bad usage or input. Errors are
one line on stderr naming what was wrong (the file and line, the run, the store); never a
traceback for a mistake the user can fix.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from runwatch.extras import MissingExtra, require
from runwatch.model import SEVERITIES, json_plain
from runwatch.store import (
    DEFAULT_STORE,
    STORE_HELP,
    StoreError,
    default_store,
    is_store_url,
    store_label,
)

EXIT_OK, EXIT_ANOMALIES, EXIT_USAGE = 0, 1, 2

log = logging.getLogger("runwatch.cli")


class CommandError(Exception):
    """A mistake in the user's input: printed as one line, exit code 2."""


def _db_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        default=default_store(),
        metavar="DB",
        help=STORE_HELP,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runwatch",
        description="Watch ML training runs: loss spikes, NaNs, divergence, plateaus, "
        "restarts and slow ranks, stored in one SQLite file.",
        epilog="Run `runwatch COMMAND --help` for a command's options. Exit codes: 0 fine, "
        "1 anomalies at or above --fail-on, 2 bad usage or input.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what runwatch does")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        "demo",
        help="a live run with realistic faults, monitored, with the dashboard open",
        description="Stream a realistic training run (warm-up, noisy power-law loss, grad "
        "norms, LR schedule, throughput) with real faults -- a loss spike, a NaN, a crash and "
        "restart from a checkpoint, a throughput drop -- through the logging hook into the "
        "store, with live detection, and serve the dashboard on it (its URL is printed; "
        "Ctrl-C stops it). With --no-dashboard the run goes as fast as it can, and the "
        "command prints what it wrote and the anomalies found, then exits.",
    )
    _db_arg(demo)
    demo.add_argument("--steps", type=int, default=3000, help="training steps (>= 200)")
    demo.add_argument(
        "--no-dashboard",
        action="store_true",
        help="run to the end and exit without serving the dashboard",
    )
    demo.add_argument(
        "--pace",
        type=float,
        default=0.0,
        metavar="STEPS_PER_S",
        help="steps per second (default: 20 with the dashboard, as fast as possible without)",
    )
    demo.add_argument("--seed", type=int, default=0, help="random seed of the simulated run")

    imp = sub.add_parser(
        "import",
        help="load a long-format, wide CSV, job log or TensorBoard logdir into a store",
        description="Load a long-format file (columns run,step,metric,value "
        "and optionally time,rank,host,gpu; CSV with a header, or JSONL; "
        ".gz accepted). JSONL lines may also be events "
        '({"run","step","event","message","time","rank","host"}) or step context '
        '({"run","step","context":{...}}, held until it changes); a step that goes back '
        "starts a new attempt. A wide CSV (a step column: step, _step, global_step or "
        "iteration, and one column per metric, blank = not logged; W&B, MLflow, Aim and "
        "pandas exports) is recognised from its header, or forced with --format wide. "
        "--preset reads SRC as a training job's log (stdout) in that tool's format, and "
        "turns NCCL timeouts, XIDs, OOMs, CUDA errors and tracebacks into events. A "
        "directory is read as a TensorBoard logdir. The whole input is one transaction: "
        "a malformed line is reported with its line number and nothing is written.",
    )
    imp.add_argument(
        "src",
        metavar="SRC",
        nargs="?",
        help="the .csv, .jsonl or .ndjson file (.gz too), a job log with --preset, or a "
        "TensorBoard logdir",
    )
    _db_arg(imp)
    imp.add_argument("--run", metavar="NAME", help="put every row into this run")
    imp.add_argument(
        "--format",
        choices=("csv", "jsonl", "wide"),
        help="override the file extension (csv: long format); wide: a wide CSV",
    )
    imp.add_argument(
        "--preset",
        choices=("megatron", "nanogpt", "llmc", "torchtitan", "hf", "regex"),
        help="SRC is a job log in this tool's format (the run is --run, else the file's "
        "name); a line the preset matches halfway is an error with its line number",
    )
    imp.add_argument(
        "--log",
        metavar="FILE",
        help="the job log to read, instead of SRC (as in `runwatch watch --log`); needs --preset",
    )
    imp.add_argument(
        "--pattern",
        metavar="REGEX",
        help="with --preset regex: a Python regex with named groups step and loss (and "
        r"any other metric), e.g. 'it (?P<step>\d+) loss (?P<loss>\S+)'",
    )
    imp.add_argument(
        "--append", action="store_true", help="add to a run that exists, as a new attempt"
    )
    imp.add_argument(
        "--config",
        metavar="JSON",
        help="a JSON object to store as the config of every run the file creates (merged "
        "into a run's stored config with --append, its keys winning). Checked keys: params "
        "(parameter count), total_steps, tokens_per_step, schedule (the planned LR "
        "schedule), family (run names), reference (a run name); other keys are kept as "
        'given. E.g. \'{"params": 1.2e8, "total_steps": 20000}\'',
    )
    imp.add_argument(
        "--config-file",
        metavar="F",
        help="the same, read from a JSON file; with --config too, the file is read first "
        "and --config's keys win",
    )

    exp = sub.add_parser(
        "export",
        help="write a run's points in long format to stdout",
        description="Write the run's live points (latest attempt wins) as "
        "long format: run,step,metric,value,time,rank,host,gpu.",
    )
    _db_arg(exp)
    exp.add_argument("--run", required=True, metavar="NAME", help="the run to export")
    exp.add_argument("--format", choices=("csv", "jsonl"), default="csv")

    ana = sub.add_parser(
        "analyze",
        help="replay the detectors over a stored run",
        description="Replay the Monitor (the same code as live watching) over a stored run, "
        "store what it finds (replacing earlier replay results) and print one line per "
        "anomaly episode. With --fail-on, exit 1 when an anomaly at or above that severity "
        "is found (for CI of training jobs).",
    )
    _db_arg(ana)
    ana.add_argument("--run", required=True, metavar="NAME")
    ana.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="json: one object per anomaly per line",
    )
    ana.add_argument(
        "--fail-on",
        choices=SEVERITIES,
        metavar="SEVERITY",
        help=f"exit 1 if an anomaly is at least this severe ({', '.join(SEVERITIES)})",
    )
    ana.add_argument(
        "--roles",
        metavar="JSON",
        help='metric roles, e.g. \'{"val_ppl": "loss"}\' (roles: loss, grad_norm, '
        "lr, throughput, step_time, other)",
    )
    ana.add_argument(
        "--reference",
        metavar="RUN",
        help="reference mode: judge each loss against this earlier (known-good) run's curve "
        "of the same metric instead of a fitted one",
    )
    ana.add_argument(
        "--align",
        choices=("step", "tokens"),
        default="step",
        help="how --reference lines up with this run: by step, or by tokens",
    )
    ana.add_argument(
        "--family",
        nargs="+",
        metavar="RUN",
        help="family mode: judge each loss against what earlier runs of the recipe (other "
        "sizes and schedules, each with params in its config) predict for this run",
    )

    fc = sub.add_parser(
        "forecast",
        help="fit the expected curve and forecast a metric",
        description="Fit the expected curve of METRIC on steps <= --upto (a robust power "
        "law; or, when the run logged lr, the LR-schedule-aware law with the LR's decay "
        "carried on to --final-step as a cosine or a line, once enough of the decay is seen "
        "to know its effect; or with --reference an earlier run's curve), predict its value "
        "at --final-step with a 90% band, the wall-clock ETA from the recent step rate, "
        "and with --target the step at which the curve reaches that value.",
    )
    _db_arg(fc)
    fc.add_argument("--run", required=True, metavar="NAME")
    fc.add_argument(
        "--metric",
        metavar="M",
        help="metric to forecast (default: loss, else train_loss, else the first metric "
        "named like a loss)",
    )
    fc.add_argument("--upto", type=int, metavar="STEP", help="fit on steps <= STEP (default: all)")
    fc.add_argument(
        "--final-step",
        type=int,
        metavar="N",
        help="step to forecast (default: the run's planned steps from its config "
        "-- total_steps, max_steps, ... -- else its last step)",
    )
    fc.add_argument(
        "--target",
        type=float,
        metavar="VALUE",
        help="also say at which step the expected curve reaches VALUE (json: target_step)",
    )
    fc.add_argument(
        "--reference",
        metavar="RUN",
        help="reference mode: the expected curve is this earlier (known-good) run's curve "
        "of the same metric, shifted to this run's level",
    )
    fc.add_argument(
        "--align",
        choices=("step", "tokens"),
        default="step",
        help="how --reference lines up with this run: by step, or by tokens (for another "
        "batch size; from tokens_per_step in the config, else tokens_per_s x step_time_s)",
    )
    fc.add_argument(
        "--family",
        nargs="+",
        metavar="RUN",
        help="family mode: forecast from earlier runs of the recipe at other sizes and "
        "schedules (each with params in its config), from step 0 with --upto 0, updated "
        "by this run's own points; this run needs params and total_steps in its config",
    )
    fc.add_argument("--format", choices=("table", "json"), default="table")
    # `incidents` and `verdict` (cli_incidents.py), listed after the analysis that forms them.
    _COMMANDS.update(importlib.import_module("runwatch.cli_incidents").register(sub))

    runs = sub.add_parser(
        "runs",
        help="list the runs in a store",
        description="List runs: status, last step, attempts, points.",
    )
    _db_arg(runs)
    runs.add_argument("--format", choices=("table", "json"), default="table")

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
    for module_name in _COMMAND_MODULES:
        _COMMANDS.update(importlib.import_module(module_name).register(sub))
    return parser


_COMMAND_MODULES = (
    # Each subsystem owns its commands: ``register(sub)`` adds its subparsers and returns
    # {command: handler(args) -> exit code}; handlers raise ValueError/StoreError for exit 2.
    "runwatch.dashboard.cli",
    "runwatch.server.cli",
    "runwatch.alerting.cli",
    "runwatch.cli_watch",
    "runwatch.cli_metrics",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    handler = _COMMANDS[args.command]
    try:
        return handler(args)
    except BrokenPipeError:  # `runwatch export ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except MissingExtra as exc:  # its message names the command and how to install the extra
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except (CommandError, StoreError, ValueError, OSError) as exc:
        print(f"runwatch {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _open(path: str, *, must_exist: bool = True, write: bool = False) -> Any:
    """Open the store; a missing one is an error unless the command creates it."""
    from runwatch.store import open_store

    if must_exist and write and (is_store_url(path) or not Path(path).exists()):
        open_store(path, readonly=True).close()  # raises "no such store" with its hint
    return open_store(path, readonly=must_exist and not write)


# -- commands ------------------------------------------------------------------------------
def _cmd_import(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from runwatch.pipeline.runconfig import merge_run_config

    src = _import_source(args)
    config = _import_config(args)  # checked before the store is even opened
    store = _open(args.db, must_exist=False)
    total = _tree_bytes(src)
    with (
        store,
        tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            desc=f"import {src}",
            disable=None,
            file=sys.stderr,
        ) as bar,
    ):

        def progress(done: int, _total: int) -> None:
            bar.update(done - bar.n)

        common: dict[str, Any] = {"config": config, "merge_config": merge_run_config}
        if Path(src).is_dir():
            from runwatch.collectors.tensorboard import import_logdir

            summary: Any = import_logdir(
                store, src, run_name=args.run, progress=progress, append=args.append, **common
            )
        elif args.preset is not None:
            from runwatch.collectors.joblog import import_log

            summary = import_log(
                store,
                src,
                preset=args.preset,
                pattern=args.pattern,
                run_name=args.run or Path(src).stem,
                append=args.append,
                **common,
            )
        elif args.format == "wide" or (args.format is None and _is_wide(src)):
            from runwatch.collectors.wide import import_wide

            summary = import_wide(
                store,
                src,
                run_name=args.run or Path(src).stem,
                append=args.append,
                progress=progress,
                **common,
            )
        else:
            from runwatch.collectors.importer import import_long_format

            summary = import_long_format(
                store,
                src,
                fmt=args.format,
                run_name=args.run,
                append=args.append,
                progress=progress,
                **common,
            )
        bar.update(total - bar.n)
    for name, n in summary.points.items():
        events = summary.events.get(name, 0)
        more = f", and {events:,} event{'s' * (events != 1)}" if events else ""
        print(
            f"imported {n:,} points in {len(summary.series[name])} series into run "
            f"{name!r} ({store_label(args.db)}){more}"
        )
    return EXIT_OK


def _import_source(args: argparse.Namespace) -> str:
    """SRC or --log, checked against --preset/--pattern/--format (a CommandError if not)."""
    if args.log is not None and args.src is not None:
        raise CommandError("give the job log as SRC or as --log FILE, not both")
    src = args.log if args.log is not None else args.src
    if src is None:
        raise CommandError("nothing to import: give SRC (a file or a logdir) or --log FILE")
    if args.log is not None and args.preset is None:
        raise CommandError("--log needs --preset (megatron, nanogpt, llmc, torchtitan, hf, regex)")
    if args.pattern is not None and args.preset != "regex":
        raise CommandError("--pattern goes with --preset regex")
    if args.preset is not None and args.format is not None:
        raise CommandError("--preset reads a job log; --format is for CSV/JSONL files")
    if not Path(src).exists():
        raise CommandError(f"{src}: no such file or directory")
    return src


def _is_wide(src: str) -> bool:
    from runwatch.collectors.wide import is_wide

    return is_wide(src)


def _tree_bytes(src: str) -> int:
    """Bytes to read: the file's size, or the sum over a directory's files."""
    path = Path(src)
    if not path.is_dir():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _import_config(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--config-file`` then ``--config`` merged (inline keys win) and checked; None
    when neither is given. A CommandError names the option and the key at fault."""
    from runwatch.pipeline.runconfig import BadRunConfig, check_run_config

    if args.config is None and args.config_file is None:
        return None
    merged: dict[str, Any] = {}
    sources = []
    if args.config_file is not None:
        try:
            text = Path(args.config_file).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CommandError(f"--config-file {args.config_file}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"--config-file {args.config_file}: cannot read it: {exc}") from None
        sources.append((f"--config-file {args.config_file}", text))
    if args.config is not None:
        sources.append(("--config", args.config))
    for where, text in sources:
        try:
            merged |= check_run_config(json.loads(text))
        except json.JSONDecodeError as exc:
            raise CommandError(f"{where}: not valid JSON ({exc})") from None
        except BadRunConfig as exc:
            raise CommandError(f"{where}: {exc}") from None
    try:  # each part may be fine alone and not together (a schedule past total_steps)
        return check_run_config(merged)
    except BadRunConfig as exc:
        raise CommandError(f"--config-file and --config together: {exc}") from None


def _cmd_export(args: argparse.Namespace) -> int:
    from runwatch.collectors.longformat import write_long_format

    with _open(args.db) as store:
        points = store.read_points(args.run)
    points = points.assign(run=args.run).drop(columns="attempt")
    write_long_format([points], sys.stdout, fmt=args.format)
    sys.stdout.flush()
    return EXIT_OK


def _cmd_runs(args: argparse.Namespace) -> int:
    from runwatch.pipeline.runconfig import listed_config, run_config

    with _open(args.db) as store:
        runs = store.runs()
    planned = [listed_config(run_config(raw)) for raw in runs["config"]]
    if args.format == "json":
        records = runs.drop(columns=["config"]).to_dict(orient="records")
        for rec, more in zip(records, planned, strict=True):
            print(json.dumps({k: json_plain(v) for k, v in rec.items()} | more))
        return EXIT_OK
    if runs.empty:
        print(f"no runs in {store_label(args.db)}")
        return EXIT_OK
    shown = runs[["name", "project", "status", "last_step", "attempts", "series", "points"]]
    shown = shown.astype(object).fillna("")  # object first: "" is no float
    shown = shown.assign(
        params=[_count(p["params"]) for p in planned],
        total_steps=[_count(p["total_steps"]) for p in planned],
        tokens_per_step=[_count(p["tokens_per_step"]) for p in planned],
        schedule=[(p["schedule"] or {}).get("name", "") for p in planned],
    )
    print(shown.to_string(index=False))
    return EXIT_OK


def _count(value: float | None) -> str:
    """A count for the runs table: 124M, 7B, 20000; empty when absent."""
    if value is None:
        return ""
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if value >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.6g}"


def _cmd_demo(args: argparse.Namespace) -> int:
    from runwatch.demo.runner import run_demo

    if args.steps < 200:
        raise CommandError(f"--steps must be at least 200 (got {args.steps})")
    if not args.no_dashboard:
        require("dashboard", "demo")
        from runwatch.demo.runner import serve_demo

        return serve_demo(
            args.db,
            steps=args.steps,
            seed=args.seed,
            pace=args.pace or None,
            host="127.0.0.1",
            port=8501,
            open_browser=True,
        )
    report = run_demo(args.db, steps=args.steps, pace=args.pace, seed=args.seed)
    print(report)
    return EXIT_OK


def _cmd_analyze(args: argparse.Namespace) -> int:
    from runwatch.cli_analysis import cmd_analyze

    with _open(args.db, write=True) as store:
        return cmd_analyze(args, store)


def _cmd_forecast(args: argparse.Namespace) -> int:
    from runwatch.cli_analysis import cmd_forecast

    with _open(args.db, write=True) as store:
        return cmd_forecast(args, store)


def _cmd_migrate(args: argparse.Namespace) -> int:
    if not is_store_url(args.target):
        raise CommandError(f"--to must be a postgresql:// URL, not {args.target!r}")
    if is_store_url(args.source):
        raise CommandError("--from must be an SQLite store file")
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
    return EXIT_OK


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": _cmd_demo,
    "import": _cmd_import,
    "export": _cmd_export,
    "runs": _cmd_runs,
    "analyze": _cmd_analyze,
    "forecast": _cmd_forecast,
    "migrate": _cmd_migrate,
}

if __name__ == "__main__":
    sys.exit(main())
