"""A run's series read for a forecast, with one error that names what the run has instead."""

from __future__ import annotations

import pandas as pd

from runwatch.store import Store


class MissingMetricError(ValueError):
    """A run has no point of the metric asked for."""


def read_metric(store: Store, run: str, metric: str, who: str = "run") -> pd.DataFrame:
    """``store.read_series(run, metric)``, or :class:`MissingMetricError` naming the run
    (as ``who``: "run", "family run", "reference run") and the metrics it does have."""
    series = store.read_series(run, metric)
    if series.empty:
        known = sorted(store.series(run)["metric"].unique())
        raise MissingMetricError(
            f"{who} {run!r} has no metric {metric!r} (it has: {', '.join(known) or 'no metrics'})"
        )
    return series
