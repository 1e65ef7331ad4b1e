"""The fleet detectors over a stored run: what ``runwatch analyze`` and the Fleet page use.

The detectors themselves (``runwatch.detect.fleet``) are pure; these read the store.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from runwatch.detect.fleet.failures import FailureReport, failure_report
from runwatch.detect.fleet.monitor import (
    FleetMonitor,
    fleet_metrics,
    replay_fleet,
    step_clock_metric,
)
from runwatch.model import LABEL_KEYS, Anomaly
from runwatch.store import Store


def run_fleet_anomalies(
    store: Store,
    run: str,
    events: pd.DataFrame | None = None,
    config: Mapping[str, str] | None = None,
) -> list[Anomaly]:
    """:func:`fleet_anomalies` over a stored run (every attempt), reading only the series
    the fleet detectors use (:func:`fleet_metrics`) - on most runs a small part of them.

    The result is that of ``fleet_anomalies(store.read_points(run, all_attempts=True),
    events, config)``: a run with points has its events replayed (XIDs, restarts) even
    when none of its series is a fleet one.
    """
    catalogue = store.series(run)
    if int(catalogue["points"].sum()) == 0:
        return []
    wanted = fleet_metrics(catalogue, config)
    points = store.read_points(run, wanted, all_attempts=True)
    return replay_fleet(FleetMonitor(config), points, events, None)


def fleet_report(
    store: Store, run: str, *, final_step: int | None = None, now: float | None = None
) -> FailureReport:
    """Failure, MTBF, goodput and ETA figures of a stored run (:func:`failure_report`)."""
    catalogue = store.series(run)
    metric = step_clock_metric(catalogue)
    if metric is None:
        raise ValueError(f"run {run!r} has no points to time its steps with")
    rows = catalogue[catalogue["metric"] == metric]
    frames = []
    for rec in rows.to_dict("records"):
        # Each series exactly ({} the unlabelled one), not the run's primary series.
        labels = {k: rec[k] for k in LABEL_KEYS if rec.get(k) is not None and rec[k] == rec[k]}
        frames.append(store.read_series(run, metric, labels, all_attempts=True))
    points = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return failure_report(
        store.events(run), store.attempts(run), points, final_step=final_step, now=now
    )
