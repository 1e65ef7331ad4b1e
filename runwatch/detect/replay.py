"""Replay: run the Monitor over a stored run's points (``runwatch analyze``).

Replay is the streaming Monitor fed in step order, so it gives exactly what live watching
gives (tested). Rows are ordered by step with a stable sort: within one step, and so
within each series, the input order is kept. Pass the points of the latest attempt only
(docs/architecture.md: "the latest attempt wins"): sorted by step, a redone step of an
earlier attempt would sit beside its redo instead of being replaced by it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from runwatch.detect.monitor import Monitor
from runwatch.detect.rows import fold_codes
from runwatch.model import LABEL_KEYS, Anomaly, Event, label_value


def _batch(mon: Monitor, points: ReplayInput, progress: Callable[[int], None] | None) -> bool:
    """Feed ``points`` into a fresh ``mon`` by the batch path; False if it cannot (then
    nothing was fed and the caller streams instead)."""
    if mon.points:
        return False
    found = mon.update_batch(
        points.metric, points.labels, points.steps, points.values, progress, points.series
    )
    return found is not None


def _objects(column: pd.Series, order: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``column.to_numpy(dtype=object)[order]``, with one Python object per distinct value,
    and a code per row (equal values, missing ones alike, share one).

    Converting a string or number column row by row makes one Python object per row:
    hundreds of MB of metric names for a run of millions of points
    (bench/results/analyze_memory.md). Taking the few distinct values by code makes only
    pointers to them.
    """
    codes, uniques = pd.factorize(column, use_na_sentinel=False)
    codes = _take(codes, order)
    if column.dtype == object:
        return _take(column.to_numpy(), order), codes
    return np.asarray(uniques, dtype=object)[codes], codes


def _take(values: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    return values if order is None else values[order]


@dataclass
class ReplayInput:
    """A frame's points as replay takes them: arrays in replay order (stable by step).

    Only the label columns with a value anywhere are kept: an all-empty column labels
    nothing (every label normalises to None). Holding these instead of the frame lets a
    caller free the frame before the replay (``runwatch analyze`` on a big run).
    """

    metric: np.ndarray
    labels: dict[str, np.ndarray]
    steps: np.ndarray
    values: np.ndarray
    times: np.ndarray
    series: np.ndarray | None = None
    """A code per row, one per series (metric and labels): batch replay groups by it."""

    def __len__(self) -> int:
        return len(self.steps)


def replay_input(points: pd.DataFrame) -> ReplayInput:
    """The arrays :func:`replay` takes, from a frame as :func:`analyze_frame` takes it."""
    n = len(points)
    if n == 0:
        empty = np.array([], dtype=object)
        return ReplayInput(empty, {}, np.array([], dtype=np.int64), np.array([]), np.array([]))
    steps = points["step"].to_numpy()
    # A store's frame is in step order already: then the columns are used as they are.
    in_order = n < 2 or bool(np.all(steps[1:] >= steps[:-1]))
    order = None if in_order else np.argsort(steps, kind="stable")
    label_cols = [k for k in LABEL_KEYS if k in points.columns and not points[k].isna().all()]
    metric, metric_codes = _objects(points["metric"], order)
    labels, label_codes = {}, []
    for k in label_cols:
        labels[k], codes = _objects(points[k], order)
        label_codes.append(codes)
    return ReplayInput(
        metric=metric,
        labels=labels,
        steps=_take(steps, order).astype(np.int64, copy=False),
        values=_take(points["value"].to_numpy(dtype=float), order),
        times=(
            _take(points["time"].to_numpy(dtype=float), order)
            if "time" in points.columns
            else np.full(n, np.nan)
        ),
        series=fold_codes([metric_codes, *label_codes]),
    )


PROGRESS_EVERY = 65_536
"""Rows between two progress calls on the streaming path."""


def _events(events: pd.DataFrame | None) -> list[tuple[float, Event]]:
    if events is None or len(events) == 0:
        return []
    out = []
    for row in events.itertuples(index=False):
        d = row._asdict()
        step = d.get("step")
        step = None if step is None or (isinstance(step, float) and math.isnan(step)) else step
        t = d.get("time")
        ev = Event(
            kind=str(d.get("kind")),
            step=None if step is None else int(step),
            time=float(t) if t is not None else math.nan,
            message=str(d.get("message") or ""),
        )
        out.append((math.inf if step is None else float(step), ev))
    return out


def analyze_frame(
    points: pd.DataFrame,
    events: pd.DataFrame | None = None,
    config: dict | None = None,
    *,
    monitor: Monitor | None = None,
    fast: bool = True,
    progress: Callable[[int], None] | None = None,
) -> list[Anomaly]:
    """Replay ``points`` (columns metric, step, value[, time, rank, host, gpu]) through a
    Monitor and return every anomaly episode, all closed, in the order they opened.

    ``events`` (columns kind, step[, time, message]) are fed before the first point of
    their step, so a ``restart``/``resume`` lets the steps after it go back.
    Pass ``monitor`` to read its ``health`` afterwards. ``fast`` runs the batch path
    (``Monitor.update_batch``: same code, series by series, identical anomalies); with
    ``fast=False`` every row goes through ``Monitor.update`` as it would live.
    ``progress`` is told how many points were replayed so far, now and then (a long
    replay's progress bar).

    >>> import pandas as pd
    >>> pts = pd.DataFrame({"metric": ["loss"] * 3, "step": [0, 1, 2],
    ...                     "value": [2.0, float("inf"), 1.9]})
    >>> [(a.detector, a.start_step, a.severity) for a in analyze_frame(pts)]
    [('nonfinite', 1, 'critical')]
    """
    return replay(
        replay_input(points), events, config, monitor=monitor, fast=fast, progress=progress
    )


def replay(
    points: ReplayInput,
    events: pd.DataFrame | None = None,
    config: dict | None = None,
    *,
    monitor: Monitor | None = None,
    fast: bool = True,
    progress: Callable[[int], None] | None = None,
) -> list[Anomaly]:
    """:func:`analyze_frame` on arrays made by :func:`replay_input`."""
    mon = monitor if monitor is not None else Monitor(config)
    n = len(points)
    if n == 0:
        return []
    metric, step_arr, value = points.metric, points.steps, points.values
    if fast and _batch(mon, points, progress):
        # Events cannot change a replay in step order (steps never go back), so the batch
        # path ignores them; see ``Monitor.update_batch``.
        mon.finish()
        return mon.anomalies
    label_cols = list(points.labels)
    time_arr = points.times
    if label_cols:
        cols = [points.labels[k] for k in label_cols]
        labels = [
            {k: v for k, v in zip(label_cols, vals, strict=True) if label_value(v) is not None}
            for vals in zip(*cols, strict=True)
        ]
    else:
        labels = None
    evs = sorted(_events(events), key=lambda e: e[0])
    ei = 0
    update = mon.update
    empty: dict = {}
    steps_l = step_arr.tolist()
    values_l = value.tolist()
    times_l = time_arr.tolist()
    metrics_l = metric.tolist()
    for i in range(n):
        st = steps_l[i]
        while ei < len(evs) and evs[ei][0] <= st:
            mon.event(evs[ei][1])
            ei += 1
        t = times_l[i]
        update(metrics_l[i], labels[i] if labels else empty, st, values_l[i], None if t != t else t)
        if progress is not None and (i + 1) % PROGRESS_EVERY == 0:
            progress(i + 1)
    while ei < len(evs):
        mon.event(evs[ei][1])
        ei += 1
    if progress is not None:
        progress(n)
    mon.finish()
    return mon.anomalies
