"""``runwatch analyze`` and ``runwatch forecast``: printing what the analysis found.

The JSON shapes are a public contract (docs/architecture.md): one object per anomaly per line for
analyze, one object for forecast; tables are for people and may change.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from runwatch.model import Anomaly, json_plain, severity_rank

EXIT_OK, EXIT_ANOMALIES = 0, 1


class RolesError(ValueError):
    """``--roles`` was not a JSON object of metric -> role."""


def parse_roles(text: str | None) -> dict[str, str] | None:
    if text is None:
        return None
    try:
        roles = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RolesError(f"--roles is not valid JSON: {exc}") from None
    if not isinstance(roles, dict):
        raise RolesError('--roles must be a JSON object like {"val_ppl": "loss"}')
    return roles


def check_reference(args: argparse.Namespace) -> None:
    """``--align`` only means something with ``--reference``; ``--family`` is another
    expected curve, so not both."""
    if args.reference is None and args.align != "step":
        raise ValueError("--align needs --reference RUN (the run to line up with)")
    if args.reference is not None and args.family:
        raise ValueError("give --reference or --family, not both")


def cmd_analyze(args: argparse.Namespace, store: Any) -> int:
    from runwatch.pipeline.analysis import analyze_run

    check_reference(args)
    roles = parse_roles(args.roles)
    store.run_id(args.run)  # a clear error before any work
    with progress_bar(f"analyze {args.run}") as progress:
        episodes = analyze_run(
            store,
            args.run,
            roles,
            reference=args.reference,
            align=args.align,
            family=args.family,
            progress=progress,
        ).anomalies
    if args.format == "json":
        for anomaly in episodes:
            print(json.dumps({k: json_plain(v) for k, v in anomaly.to_json_dict(args.run).items()}))
    elif not episodes:
        print(f"run {args.run!r}: no anomalies")
    else:
        print(anomaly_table(episodes))
    if args.fail_on is not None:
        floor = severity_rank(args.fail_on)
        if any(severity_rank(a.severity) >= floor for a in episodes):
            return EXIT_ANOMALIES
    return EXIT_OK


@contextmanager
def progress_bar(what: str) -> Iterator[Callable[[str, int, int], None]]:
    """A tqdm bar on stderr fed as ``progress(phase, done, total)``; off when stderr is not
    a terminal (scripts and CI see no bar)."""
    from tqdm import tqdm

    with tqdm(desc=what, unit="pt", unit_scale=True, disable=None, file=sys.stderr) as bar:
        bar.set_postfix_str("reading")

        def progress(phase: str, done: int, total: int) -> None:
            if bar.total != total:
                bar.reset(total=total)
            bar.set_postfix_str(phase, refresh=False)
            bar.update(done - bar.n)

        yield progress


def anomaly_table(episodes: Sequence[Anomaly]) -> str:
    lines = [f"{'steps':>15}  {'severity':8}  {'detector':20} {'metric':18} message"]
    for a in episodes:
        where = f"{a.start_step}" if a.start_step == a.end_step else f"{a.start_step}-{a.end_step}"
        labels = "".join(f" {k}={v}" for k, v in a.labels.items())
        lines.append(
            f"{where:>15}  {a.severity:8}  {a.detector:20} {a.metric + labels:18} {a.message}"
        )
    return "\n".join(lines)


def cmd_forecast(args: argparse.Namespace, store: Any) -> int:
    from runwatch.pipeline.analysis import forecast_json, forecast_run
    from runwatch.pipeline.eta import eta_report

    store.run_id(args.run)
    metric = args.metric or _family_metric(args, store)
    check_reference(args)
    result = forecast_run(
        store,
        args.run,
        metric,
        upto=args.upto,
        final_step=args.final_step,
        target=args.target,
        reference=args.reference,
        align=args.align,
        family=args.family,
    )
    eta = eta_report(store, args.run, upto=args.upto, final_step=result.final_step)
    payload = forecast_json(
        args.run,
        metric,
        result,
        target=args.target,
        reference=args.reference,
        align=args.align,
        family=args.family,
        eta=eta,
    )
    if args.format == "json":
        print(json.dumps({k: json_plain(v) for k, v in payload.items()}))
        return EXIT_OK
    eta_text = eta_line(result.eta_seconds, eta)
    model = model_text(result)
    if args.reference is not None:
        model = f"the curve of run {args.reference!r}, aligned by {args.align}"
    if args.family:
        seen = (
            "before the run starts"
            if result.upto == 0
            else f"updated by its own points to step {result.upto}"
        )
        model = f"the family {', '.join(args.family)}, {seen}"
        if result.size_law_weights:
            shares = [
                f"{law} {w:.0%}" if w > 0 else f"{law} in the band only (it has no floor)"
                for law, w in zip(result.size_laws, result.size_law_weights, strict=True)
            ]
            model += f"; size laws {', '.join(shares)}, none ruled out by the family's errors"
        elif result.size_laws:
            model += f"; size law {result.size_laws[0]}"
    lines = [
        f"{metric} of run {args.run!r}, fitted on steps <= {result.upto} ({model}):",
        f"  at step {result.final_step}: {result.predicted:.4g} "
        f"(90% band {result.lower:.4g} .. {result.upper:.4g})",
        f"  ETA to step {result.final_step}: {eta_text}",
    ]
    if args.target is not None:
        where = result.target_step
        lines.append(
            f"  reaches {args.target:g} at step {where}"
            if where is not None
            else f"  does not reach {args.target:g} on the expected curve (within 10x the steps)"
        )
    print("\n".join(lines))
    return EXIT_OK


def _family_metric(args: argparse.Namespace, store: Any) -> str:
    """The metric to forecast when none is named: the run's own loss, or before it has
    logged one, the first family run's."""
    from runwatch.pipeline.analysis import default_loss_metric

    try:
        return default_loss_metric(store, args.run)
    except ValueError:
        if not args.family:
            raise
        return default_loss_metric(store, args.family[0])


def eta_line(pace_eta: float | None, eta: Any) -> str:
    """The ETA in words: with failures still to come, its band and the goodput so far."""
    if eta is None:
        return "unknown (no wall times)" if pace_eta is None else duration(pace_eta)
    text = (
        f"{duration(eta.eta_seconds)} (90% band {duration(eta.eta_lower)} .. "
        f"{duration(eta.eta_upper)}, with restarts at this run's failure rate)"
    )
    if eta.goodput is not None:
        text += f"; goodput so far {eta.goodput:.0%}"
    return text


def model_text(result: Any) -> str:
    """The forecast's model, and what it made of the logged LR."""
    note = result.lr_note()
    return result.model if note is None else f"{result.model}; {note}"


def duration(seconds: float) -> str:
    """A human duration.

    >>> duration(93784)
    '1d 2h 3m 4s'
    >>> duration(59)
    '0m 59s'
    """
    minutes, sec = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [f"{days}d"] * bool(days) + [f"{hours}h"] * bool(hours or days)
    return " ".join([*parts, f"{minutes}m", f"{sec}s"])
