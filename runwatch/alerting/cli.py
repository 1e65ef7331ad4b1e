"""``runwatch silence add|list|expire`` and ``runwatch alerts test``.

Silences live in the store, so a silence added from a laptop mutes the alerts of the
training process writing that store (the engine re-reads them every second). ``alerts test``
sends one test message straight through each configured channel (not via the outbox: the
point is to see the receiver's answer now) and prints it; it exits 1 if any channel failed.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

from runwatch.model import SEVERITIES
from runwatch.store import STORE_HELP, default_store

SILENCE_LABELS = (
    "run", "project", "detector", "metric", "severity", "rank", "host", "gpu", "incident",
)  # fmt: skip


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``silence`` and ``alerts`` to the ``runwatch`` subcommands."""
    silence = sub.add_parser(
        "silence",
        help="mute alerts matching labels for a while",
        description="Silences mute alerts whose labels match every given matcher (values may "
        "be globs like 'gpt-*') until they expire. They are stored in the store and apply to "
        "every process sending alerts for it within a second.",
    )
    ssub = silence.add_subparsers(dest="silence_command", metavar="ACTION", required=True)
    add = ssub.add_parser("add", help="add a silence", description="Add a silence.")
    _db(add)
    for label in SILENCE_LABELS:
        add.add_argument(f"--{label}", metavar="VALUE", help=f"match the {label} label")
    add.add_argument("--duration", default="2h", help="how long, e.g. 30m, 2h, 1d (default: 2h)")
    add.add_argument("--comment", default="", help="why (shown by `silence list`)")
    add.add_argument("--author", default=os.environ.get("USER"), help="who (default: $USER)")
    lst = ssub.add_parser("list", help="list silences", description="List active silences.")
    _db(lst)
    lst.add_argument("--all", action="store_true", help="include expired silences")
    lst.add_argument("--format", choices=("table", "json"), default="table")
    exp = ssub.add_parser("expire", help="end a silence now", description="End a silence now.")
    _db(exp)
    exp.add_argument("id", type=int, metavar="ID", help="the silence id (see `silence list`)")

    alerts = sub.add_parser(
        "alerts",
        help="check alert channels",
        description="Alerting utilities. `alerts test` sends a test message through each "
        "channel of the rules (--alerts, $RUNWATCH_ALERTS, or the defaults with --webhook / "
        "$RUNWATCH_WEBHOOK_URL) and prints each receiver's answer; exit 1 if any failed.",
    )
    asub = alerts.add_subparsers(dest="alerts_command", metavar="ACTION", required=True)
    test = asub.add_parser("test", help="send a test message through each channel")
    test.add_argument("--alerts", metavar="PATH", help="the rules file")
    test.add_argument("--webhook", metavar="URL", help="a webhook URL (the default channel)")
    test.add_argument("--channel", action="append", help="only this channel (repeatable)")
    return {"silence": _cmd_silence, "alerts": _cmd_alerts}


def _db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=default_store(), metavar="DB", help=STORE_HELP)


def _cmd_silence(args: argparse.Namespace) -> int:
    from runwatch.store import open_store

    if args.silence_command == "add":
        from runwatch.alerting.yamlnodes import parse_duration

        matchers = {k: getattr(args, k) for k in SILENCE_LABELS if getattr(args, k) is not None}
        if not matchers:
            raise ValueError(
                "give at least one matcher: " + ", ".join(f"--{k}" for k in SILENCE_LABELS)
            )
        severity = matchers.get("severity")
        if severity is not None and severity not in SEVERITIES:
            raise ValueError(
                f"--severity {severity!r} is not valid; valid values: {', '.join(SEVERITIES)}"
            )
        seconds = parse_duration(args.duration)
        if seconds <= 0:
            raise ValueError("--duration must be above 0")
        with open_store(args.db) as store:
            now = time.time()
            sid = store.add_silence(
                matchers, now + seconds, comment=args.comment, author=args.author, starts_at=now
            )
        until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now + seconds))
        print(f"silence {sid} added until {until}: {_matchers(matchers)}")
        return 0
    if args.silence_command == "expire":
        with open_store(args.db) as store:
            try:
                store.expire_silence(args.id)
            except KeyError as exc:
                raise ValueError(exc.args[0]) from None
        print(f"silence {args.id} expired")
        return 0
    with open_store(args.db, readonly=True) as store:
        now = time.time()
        found = store.silences(active_at=None if args.all else now)
    if args.format == "json":
        for rec in found:
            print(json.dumps(rec | {"active": rec["starts_at"] <= now < rec["ends_at"]}))
        return 0
    if not found:
        print("no active silences" if not args.all else "no silences")
        return 0
    for rec in found:
        state = "active" if rec["starts_at"] <= now < rec["ends_at"] else "expired"
        until = time.strftime("%Y-%m-%d %H:%M", time.localtime(rec["ends_at"]))
        note = f"  # {rec['comment']}" if rec["comment"] else ""
        print(f"{rec['id']:>4}  {state:<7}  until {until}  {_matchers(rec['matchers'])}{note}")
    return 0


def _matchers(matchers: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(matchers.items()))


def _cmd_alerts(args: argparse.Namespace) -> int:
    import httpx

    from runwatch.alerting.alert import Alert
    from runwatch.alerting.channels import deliver, register_secrets
    from runwatch.alerting.grouping import Notification
    from runwatch.alerting.payloads import render
    from runwatch.alerting.setup import resolve_rules

    rules = resolve_rules(args.alerts, args.webhook)
    if rules is None:
        raise ValueError("no channels: give --alerts PATH or --webhook URL (or set "
                         "RUNWATCH_ALERTS / RUNWATCH_WEBHOOK_URL)")  # fmt: skip
    names = args.channel or list(rules.channels)
    for name in names:
        if name not in rules.channels:
            raise ValueError(f"unknown channel {name!r}; valid values: {', '.join(rules.channels)}")
    now = time.time()
    alert = Alert(
        id=0,
        labels={
            "alertname": "runwatch_test",
            "run": "runwatch-test",
            "project": "",
            "detector": "test",
            "metric": "test",
            "severity": "info",
        },
        status="firing",
        starts_at=now,
        ends_at=None,
        start_step=0,
        end_step=0,
        score=0.0,
        observed=1.0,
        expected=1.0,
        lower=0.0,
        upper=2.0,
        message="runwatch test message: if you read this, alerts reach you",
    )
    failures = 0
    with httpx.Client() as client:
        for name in names:
            channel = rules.channels[name]
            register_secrets(channel)
            route = next(r for r in rules.routes if name in r.channels)
            note = Notification(route, f"test:{name}", {"run": "runwatch-test"}, (alert,))
            key = f"rw-test-{int(now * 1000)}-{name}"
            body = json.dumps(render(channel, note, key, rules.dashboard_url)).encode()
            outcome = deliver(client, channel, key, body, now)
            failures += not outcome.ok
            state = "ok" if outcome.ok else "FAILED"
            print(f"{name} ({channel.type}): {state}: {outcome.detail}")
    return 1 if failures else 0
