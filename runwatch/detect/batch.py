"""Batch replay: each series' detectors run over the whole series at once.

Replay (``analyze_frame``) feeds points sorted by step, so within a series steps never go
back and a restart can never rewind a detector: series are then independent except for
the precursor links between grad-norm and loss spikes and the order of the anomaly list.
This module gives each detector of a series all its points through
``Detector.update_many`` (exactly ``update`` point by point: every default detector runs
the points it does not flag in a compiled kernel, ``runwatch/detect/_*_kernel.pyx``, and
calls ``update`` or builds the signal in Python only at the points it flags), builds the
episodes from the signals with the Monitor's own
``_handle``, checks non-finite values with numpy (most points are finite, and a series
of role "other" needs nothing else),
replays the precursor links in row order afterwards, and orders the anomalies by the row
that opened them - so the result is the one streaming gives (``tests/detect/
test_replay.py`` checks that equality on real runs, ``test_batch.py`` per detector).
The run's LR series goes first: it feeds the Monitor's LR clock, and each loss series'
expected-curve detector gets, per point, the areas the clock gave when that point's row
came (``runwatch.expect.lrclock.areas_at``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import pandas as pd

from runwatch.detect.base import LRAware
from runwatch.detect.monitor import Monitor
from runwatch.expect.lrclock import LRClock, areas_at
from runwatch.model import LABEL_KEYS, Anomaly, label_value


def feed_batch(
    mon: Monitor,
    metric: np.ndarray,
    label_cols: dict[str, np.ndarray],
    steps: np.ndarray,
    values: np.ndarray,
    progress: Callable[[int], None] | None = None,
    series_codes: np.ndarray | None = None,
) -> list[Anomaly] | None:
    """Feed rows in replay order (by step; within a step, any fixed series order) into
    ``mon``, fresh or not: what ``Monitor.update`` row by row would do. Returns the
    episodes it opened, grew or closed (what the ``update`` calls would have returned,
    each once), or None if it cannot - a series whose steps go back from where it was
    (a restart or a late point), or raw labels that normalise alike - and then nothing
    was fed and the caller streams instead. Live detection feeds each written batch so.
    ``progress`` is told the rows fed so far after each series. ``series_codes``: a code
    per row, one per series (``fold_codes``), when the caller has them already; made here
    otherwise.
    """
    n = steps.size
    if n == 0:
        return []
    codes = series_codes
    if codes is None:
        cols = [metric, *label_cols.values()]
        codes = fold_codes([pd.factorize(c, use_na_sentinel=False)[0] for c in cols])
    order = np.argsort(codes, kind="stable")
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    groups = np.split(order, bounds)
    groups.sort(key=lambda g: g[0])  # series are created in order of first appearance
    keys = []
    for rows in groups:
        r = rows[0]
        lk = tuple(label_value(label_cols[k][r]) if k in label_cols else None for k in LABEL_KEYS)
        keys.append((str(metric[r]), lk))
    if len(set(keys)) != len(keys):
        return None  # raw labels that normalise alike: let the streaming path decide
    for key, rows in zip(keys, groups, strict=True):
        known = mon._series.get(key)
        if known is not None and known.last_step is not None and steps[rows[0]] < known.last_step:
            return None  # a rewind or a late point: the streaming path knows what to do
    # Episodes open before this batch: reported if a point grows or closes them.
    was_open = [
        (ep, ep.details["points"])
        for key in keys
        if (s := mon._series.get(key)) is not None
        for ep in s.open
        if ep is not None
    ]
    mon._deferred = []
    new: deque[Anomaly] = deque()
    kept = mon._anomalies
    mon._anomalies = new  # unbounded while rows are out of order; trimmed below
    try:
        runs = [
            (mon._series.get(key) or mon._new_series(*key), rows)
            for key, rows in zip(keys, groups, strict=True)
        ]
        # The LR series first: the loss series' areas come from what it fed the clock.
        runs.sort(key=lambda r: r[0] is not mon._lr_series)
        lr_fed = _clock_states(mon.lr_clock)
        done = 0
        for series, rows in runs:
            if series is mon._lr_series:
                lr_fed = _feed_clock(mon.lr_clock, rows, steps[rows], values[rows])
            _run_series(mon, series, rows, steps[rows], values[rows], lr_fed)
            done += rows.size
            if progress is not None:
                progress(done)
        _link_precursors(mon)
        ordered = sorted(new, key=lambda a: mon._order[id(a)])
    finally:
        mon._deferred = None
        mon._anomalies = kept
    kept.extend(ordered)  # the deque keeps the last max_anomalies, as streaming does
    mon._order = {}
    mon._n_points += n
    grown = [ep for ep, points in was_open if ep.details["points"] != points or not ep.is_open]
    return grown + ordered


def fold_codes(codes: list[np.ndarray]) -> np.ndarray:
    """A code per row, one per series, from a code per row of each column (the metric's,
    then each label's: ``pd.factorize`` codes, missing values alike): rows equal in every
    column share one, as ``groupby(dropna=False)`` groups them. Folded column by column
    (factorising each column's codes, not its object values, which a groupby would first
    turn into strings)."""
    out = codes[0]
    for c in codes[1:]:
        out = pd.factorize(out * (int(c.max()) + 1) + c)[0]  # < n: cannot overflow
    return out


def _clock_states(clock: LRClock) -> tuple[np.ndarray, np.ndarray]:
    """The clock's state before a batch, as made by a row before all of it (row -1)."""
    last = clock.last
    if last is None:
        return np.empty((0, 5)), np.empty(0, dtype=np.int64)
    return np.array([last], dtype=float), np.array([-1], dtype=np.int64)


def _feed_clock(
    clock: LRClock, rows: np.ndarray, st: np.ndarray, v: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Feed the LR series to the clock as ``Monitor.update`` does; return each state it
    made (rows of step, lr, S1, S2, momentum) and the row that made it, after the state it
    had before (row -1)."""
    before, before_rows = _clock_states(clock)
    made, states = clock.add_many(st, v)
    return np.concatenate((before, states)), np.concatenate((before_rows, rows[made]))


def _run_series(
    mon: Monitor,
    series,
    rows: np.ndarray,
    st: np.ndarray,
    v: np.ndarray,
    lr_fed: tuple[np.ndarray, np.ndarray],
) -> None:
    if st.size and np.any(np.diff(st) < 0):  # pragma: no cover - replay order forbids it
        raise ValueError("batch replay needs steps in order within each series")
    series.last_step = int(st[-1]) if st.size else None
    series.rewind_ok = False
    rows_l = rows.tolist()
    steps_l = st.tolist()
    values_l = v.tolist()
    _nonfinite(mon, series, rows_l, steps_l, values_l, np.flatnonzero(~np.isfinite(v)))
    # The points' LR areas, once for every detector of the series that judges by the LR.
    by_lr = [isinstance(d, LRAware) and bool(d.lr_clock) for d in series.detectors]
    areas = areas_at(*lr_fed, rows, st) if len(lr_fed[0]) and any(by_lr) else None
    for i in range(1, len(series.detectors)):
        det = series.detectors[i]
        on_error = lambda k, det=det: mon._failed(series, det, steps_l[k])  # noqa: E731
        try:
            if areas is not None and by_lr[i]:
                sigs = det.update_many(steps_l, values_l, on_error, areas=areas)
            else:
                sigs = det.update_many(steps_l, values_l, on_error)
        except Exception:  # pragma: no cover - a bug in a vectorised path itself
            mon._failed(series, det, steps_l[0])
            continue
        _episodes(mon, series, i, det, rows_l, steps_l, sigs)


def _episodes(mon: Monitor, series, i: int, det, rows_l, steps_l, sigs) -> None:
    """Open, grow and close detector ``i``'s episodes from its signals, as ``_handle``
    would point by point: unflagged points only matter while an episode is open, and only
    the first ``det.quiet`` of them (the episode is closed by then)."""
    handle = mon._handle
    out: list[Anomaly] = []

    def unflagged(n: int) -> None:
        """``n`` unflagged points in a row (their step does not matter to ``_handle``)."""
        for _ in range(min(n, det.quiet)):
            if series.open[i] is None:
                return
            handle(series, i, det, 0, None, out)

    prev = -1
    for k, sig in sigs:
        unflagged(k - prev - 1)
        mon._row = rows_l[k]
        handle(series, i, det, steps_l[k], sig, out)
        prev = k
        if len(out) > 256:
            out.clear()
    unflagged(len(steps_l) - prev - 1)


def _nonfinite(mon: Monitor, series, rows_l, steps_l, values_l, bad: np.ndarray) -> None:
    """Detector 0 (NonFinite) only speaks on non-finite points: visit just those, and
    count the finite points between them as the quiet that closes an episode."""
    quiet = series.detectors[0].quiet
    out: list[Anomaly] = []
    # An episode open from an earlier batch has had series.quiet[0] quiet points already.
    last = -1 - (series.quiet[0] if series.open[0] is not None else 0)
    for k in bad.tolist():
        ep = series.open[0]
        if ep is not None and k - last - 1 >= quiet:
            ep.is_open = False
            ep.details["recovered"] = True
            series.open[0] = None
        mon._row = rows_l[k]
        mon._feed(series, 0, steps_l[k], values_l[k], out)
        last = k
    ep = series.open[0]
    if ep is not None:
        tail = len(values_l) - 1 - last
        if tail >= quiet:
            ep.is_open = False
            ep.details["recovered"] = True
            series.open[0] = None
        else:
            series.quiet[0] = tail


def _link_precursors(mon: Monitor) -> None:
    for row, series, step, ep in sorted(mon._deferred, key=lambda d: d[0]):
        mon._row = row
        out: list[Anomaly] = []
        mon._link_precursor(series, step, ep, out)
        idx = next(i for i, d in enumerate(series.detectors) if d.name == "spike")
        for a in out:
            mon._order[id(a)] = (row, idx, 1)
