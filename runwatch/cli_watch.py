"""``runwatch watch``: tail a TensorBoard logdir or a job's log file into live runs.

Each run found is fed through the public hook, ``runwatch.init(name=..., store=DB)`` and
``run.log(...)``, so live detection, incidents and alerts are exactly those of an
instrumented run. The source's position is saved as JSON next to the store
(``<DB>.watch-<hash>.json``) after each batch is durable, so a watcher killed and restarted
goes on where it stopped: nothing is lost, and a batch read again after a kill between the
write and the save lands on the same steps, which reads count once (the last value of a
step wins).

A restarted watcher resumes a stored run as ``runwatch.init`` does: a new attempt with no
start step, which supersedes nothing (the run's points read as one curve) and records a
``resume`` event saying when the watcher came back. Steps going back later (the job
restarted from a checkpoint) start a restart attempt, as in the hook.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from runwatch.store import STORE_HELP, default_store, is_store_url, store_label

log = logging.getLogger("runwatch.cli.watch")

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    watch = sub.add_parser(
        "watch",
        help="tail a TensorBoard logdir or a job's log file into live, monitored runs",
        description="Follow a TensorBoard logdir (event files as they grow, new files and "
        "new run directories; each directory of event files is a run) or, with --log, a "
        "job's log file, and feed what is appended through runwatch.init: live detection, "
        "incidents and alerts as for an instrumented run. Stops on Ctrl-C or SIGTERM, "
        "finishing the runs. Its position is saved next to the store, so a restart goes "
        "on where it stopped.",
    )
    watch.add_argument("logdir", nargs="?", metavar="LOGDIR", help="the TensorBoard logdir")
    watch.add_argument("--db", default=default_store(), metavar="DB", help=STORE_HELP)
    watch.add_argument("--run", metavar="NAME", help="put everything into this run")
    watch.add_argument("--log", metavar="FILE", help="follow this log file instead of a logdir")
    watch.add_argument(
        "--preset",
        metavar="P",
        help="the log file's format: megatron, nanogpt, llmc, torchtitan, hf or regex",
    )
    watch.add_argument("--pattern", metavar="REGEX", help="with --preset regex: the line regex")
    watch.add_argument("--webhook", metavar="URL", help="send warnings and worse to this webhook")
    watch.add_argument("--alerts", metavar="RULES", help="alert rules file")
    watch.add_argument(
        "--poll", type=float, default=0.2, metavar="S", help="seconds between reads (0.2)"
    )
    return {"watch": cmd_watch}


def state_path(db: str, source: str) -> Path:
    """Where the watcher of ``source`` keeps its position: beside the store (for a database
    server, in the working directory, named by a digest of its password-free URL)."""
    digest = hashlib.sha1(os.path.abspath(source).encode()).hexdigest()[:12]
    if is_store_url(db):
        server = hashlib.sha1(store_label(db).encode()).hexdigest()[:12]
        return Path(f"runwatch-{server}.watch-{digest}.json")
    return Path(f"{db}.watch-{digest}.json")


def _open_source(args: argparse.Namespace) -> tuple[Any, str, str | None]:
    """(source, what it follows, the run its records go to when they name none)."""
    if args.log is not None:
        if args.logdir is not None:
            raise ValueError("give a LOGDIR or --log FILE, not both")
        if args.preset is None:
            raise ValueError(
                "--log needs --preset (megatron, nanogpt, llmc, torchtitan, hf, regex)"
            )
        try:
            from runwatch.collectors.joblog import LogSource
        except ImportError:
            raise ValueError(
                "--log is not available in this version of runwatch (no log file reader, "
                "runwatch.collectors.joblog); watch a TensorBoard LOGDIR instead"
            ) from None
        source = LogSource(args.log, preset=args.preset, pattern=args.pattern)
        return source, args.log, args.run or Path(args.log).stem
    if args.logdir is None:
        raise ValueError("give the TensorBoard LOGDIR to watch, or --log FILE --preset P")
    if not Path(args.logdir).is_dir():
        raise ValueError(f"{args.logdir}: no such directory")
    from runwatch.collectors.tensorboard import TensorBoardSource

    return TensorBoardSource(args.logdir), args.logdir, args.run


class Watcher:
    """Feeds a source's records to one hook run per run name, saving the position."""

    def __init__(
        self,
        source: Any,
        db: str,
        state_file: Path,
        default_run: str | None,
        init_options: dict[str, Any],
    ) -> None:
        self.source = source
        self.db = db
        self.state_file = state_file
        self.default_run = default_run
        self.options = init_options
        self.runs: dict[str, Any] = {}
        if state_file.exists():
            try:
                saved = json.loads(state_file.read_text(encoding="utf-8"))
                source.restore(saved["source"])
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ValueError(
                    f"{state_file}: the watcher's saved position cannot be read ({exc!r}); "
                    "delete it to read the source again from the start"
                ) from None
            log.info("resuming from %s", state_file)

    def run(self, name: str) -> Any:
        found = self.runs.get(name)
        if found is None:
            import runwatch

            # cpu_wait off: the watcher's own CPU wait says nothing of the job's step times.
            found = self.runs[name] = runwatch.init(
                name=name, store=self.db, resume=True, cpu_wait=False, **self.options
            )
            log.info("watching run %r into %s", name, self.db)
        return found

    def poll(self) -> int:
        """Read what is new, log it, make it durable, then save the position."""
        records = self.source.read_new()
        if not records:
            return 0
        touched = self._feed(records)
        for run in touched:
            run.flush(30.0)
        self.save()
        return len(records)

    def _feed(self, records: Iterable[Any]) -> list[Any]:
        touched: dict[str, Any] = {}
        pending: dict[str, tuple[int, dict[str, float]]] = {}  # run -> (step, metrics)

        def flush_pending(name: str) -> None:
            step, metrics = pending.pop(name)
            touched[name].log(metrics, step=step)

        for record in records:
            if isinstance(record, tuple) and record and record[0] == "event":
                _, step, kind, message, _time = record
                name = self.default_run
                assert name is not None
                touched[name] = self.run(name)
                if name in pending:
                    flush_pending(name)
                touched[name].event(kind, step=step, message=message)
                continue
            if isinstance(record, tuple) and record and record[0] == "point":
                _, step, metrics, _time = record
                name = self.default_run
                items = dict(metrics)
            else:  # a TensorBoard Scalar
                name = self.default_run or record.run
                step, items = record.step, {record.tag: record.value}
            assert name is not None
            if name not in touched:
                touched[name] = self.run(name)
            held = pending.get(name)
            if held is not None and (held[0] != step or items.keys() & held[1].keys()):
                flush_pending(name)
                held = None
            if held is None:
                pending[name] = (step, items)
            else:
                held[1].update(items)
        for name in list(pending):
            flush_pending(name)
        return list(touched.values())

    def save(self) -> None:
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        tmp.write_text(json.dumps({"source": self.source.state()}), encoding="utf-8")
        os.replace(tmp, self.state_file)

    def finish(self) -> None:
        for run in self.runs.values():
            run.finish()
        self.runs.clear()


def cmd_watch(args: argparse.Namespace) -> int:
    if not args.poll > 0:
        raise ValueError(f"--poll must be > 0 (got {args.poll})")
    source, followed, default_run = _open_source(args)
    options: dict[str, Any] = {}
    if args.webhook:
        options["webhook"] = args.webhook
    if args.alerts:
        options["alerts"] = args.alerts
    watcher = Watcher(source, args.db, state_path(args.db, followed), default_run, options)
    # Ctrl-C and SIGTERM only set a flag: an interrupt inside a poll could leave records
    # read and not yet logged, and the saved position past them.
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in _STOP_SIGNALS}
    print(
        f"runwatch watch: following {followed} into {store_label(args.db)} (Ctrl-C to stop)",
        file=sys.stderr,
    )
    try:
        while not stop.is_set():
            watcher.poll()
            stop.wait(args.poll)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            watcher.poll()  # what was flushed before the stop
        finally:
            watcher.finish()
            close = getattr(source, "close", None)
            if close is not None:
                close()
    return 0
