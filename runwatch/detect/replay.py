"""Replay: run the Monitor over a stored run's points (``runwatch analyze``).

Replay is the streaming Monitor fed in step order, so it gives exactly what live watching
gives (tested). Rows are ordered by step with a stable sort: within one step, and so
within each series, the input order is kept. Pass the points of the latest attempt only (DESIGN.md:
"the latest attempt wins"): sorted by step, a redone step of an earlier attempt would sit
beside its redo instead of being replaced by it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from runwatch.detect.monitor import Monitor
from runwatch.model import LABEL_KEYS, Anomaly, Event


def _label_value(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _batch(mon, metric, points, order, label_cols, step_arr, value, progress) -> bool:
    from runwatch.detect.batch import replay_batch

    cols = {k: points[k].to_numpy(dtype=object)[order] for k in label_cols}
    return replay_batch(mon, metric, cols, step_arr, value, progress)


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
    (``runwatch.detect.batch``: same code, series by series, identical anomalies); with
    ``fast=False`` every row goes through ``Monitor.update`` as it would live.
    ``progress`` is told how many points were replayed so far, now and then (a long
    replay's progress bar).

    >>> import pandas as pd
    >>> pts = pd.DataFrame({"metric": ["loss"] * 3, "step": [0, 1, 2],
    ...                     "value": [2.0, float("inf"), 1.9]})
    >>> [(a.detector, a.start_step, a.severity) for a in analyze_frame(pts)]
    [('nonfinite', 1, 'critical')]
    """
    mon = monitor if monitor is not None else Monitor(config)
    n = len(points)
    if n == 0:
        return []
    steps = points["step"].to_numpy()
    order = np.argsort(steps, kind="stable")
    metric = points["metric"].to_numpy(dtype=object)[order]
    step_arr = steps[order].astype(np.int64)
    value = points["value"].to_numpy(dtype=float)[order]
    time_arr = (
        points["time"].to_numpy(dtype=float)[order]
        if "time" in points.columns
        else np.full(n, np.nan)
    )
    label_cols = [k for k in LABEL_KEYS if k in points.columns]
    if fast and _batch(mon, metric, points, order, label_cols, step_arr, value, progress):
        # Events cannot change a replay in step order (steps never go back), so the batch
        # path ignores them; see runwatch.detect.batch.
        mon.finish()
        return mon.anomalies
    if label_cols:
        cols = [points[k].to_numpy(dtype=object)[order] for k in label_cols]
        labels = [
            {k: v for k, v in zip(label_cols, vals, strict=True) if _label_value(v) is not None}
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
