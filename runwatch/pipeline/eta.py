"""The failure-aware ETA of a stored run (:func:`runwatch.expect.eta.failure_aware_eta`),
from what the store has: its step clock over every attempt, its failure and checkpoint
events. With ``upto``, only what was known when the run's kept curve reached that step (a
forecast made from the past, for checking against how the run really ended)."""

from __future__ import annotations

import logging
import math
from functools import reduce

import numpy as np
import pandas as pd

from runwatch.detect.fleet.monitor import step_clock_metric
from runwatch.expect.eta import AttemptSpans, FailureAwareEta, failure_aware_eta
from runwatch.store import Store

log = logging.getLogger("runwatch.pipeline.eta")

FAILURE_KINDS: tuple[str, ...] = ("crash", "hang", "oom", "nccl_timeout")
"""Events that end an attempt (an XID or a warning may not)."""
PACE_SHARE = 0.1
"""The pace is that of the latest tenth of the step intervals (as ``eta_seconds``)."""
MIN_PACE_STEPS = 10
"""An attempt's pace joins the pace spread only with at least this many steps."""


def eta_report(
    store: Store, run: str, *, upto: int | None = None, final_step: int
) -> FailureAwareEta | None:
    """The failure-aware ETA from ``upto`` (default: the last step) to ``final_step``, its
    90% band and the goodput so far; None when the run has no timed points (or none up to
    ``upto``)."""
    clock = _step_clock(store, run)
    if clock.empty:
        return None
    clock, cut = _known_by(clock, upto)
    if clock.empty:
        return None
    events = store.events(run)
    events = events[events["time"].notna() & (events["time"] <= cut)]
    spans = clock.groupby("attempt", sort=True).agg(
        t0=("time", "first"), t1=("time", "last"), s0=("step", "first"), s1=("step", "last")
    )
    pace, spread = _pace(clock)
    if pace is None:
        return None
    current = int(clock.loc[clock["attempt"] == spans.index[-1], "step"].iloc[-1])
    failures = _failure_times(events, spans)
    return failure_aware_eta(
        AttemptSpans(spans["t0"], spans["t1"], spans["s0"], spans["s1"]),
        failures,
        pace=pace,
        remaining_steps=max(int(final_step) - current, 0),
        now=float(spans["t1"].iloc[-1]),
        start_time=_start_time(store, run, float(spans["t0"].iloc[0])),
        checkpoint_every=checkpoint_interval(events, spans["s0"].to_numpy()[1:]),
        pace_spread=spread,
    )


def _step_clock(store: Store, run: str) -> pd.DataFrame:
    """attempt, step, time of every attempt's steps, in the order they ran: the run's own
    series of its step clock (one series, not every rank's: the ranks step together)."""
    metric = step_clock_metric(store.series(run))
    if metric is None:
        return pd.DataFrame({"attempt": [], "step": [], "time": []})
    pts = store.read_series(run, metric, all_attempts=True)
    pts = pts[np.isfinite(pts["time"].to_numpy(dtype=float))]
    clock = pts.groupby(["attempt", "step"], as_index=False)["time"].max()
    return clock.sort_values(["attempt", "step"], kind="stable").reset_index(drop=True)


def _known_by(clock: pd.DataFrame, upto: int | None) -> tuple[pd.DataFrame, float]:
    """The clock as it was when the kept curve reached ``upto``, and that time."""
    if upto is None:
        return clock, float(clock["time"].max())
    # A step is kept by the latest attempt that ran it: each attempt keeps the steps below
    # the lowest first step of any later attempt (the last attempt keeps all its own).
    later = clock.groupby("attempt")["step"].min().iloc[::-1].cummin().iloc[::-1]
    cutoff = later.shift(-1).fillna(math.inf)
    kept = clock["step"] < clock["attempt"].map(cutoff)
    mine = clock[kept & (clock["step"] <= upto)]
    if mine.empty:
        return mine, math.nan
    cut = float(mine.loc[mine["step"].idxmax(), "time"])
    return clock[clock["time"] <= cut].reset_index(drop=True), cut


def _pace(clock: pd.DataFrame) -> tuple[float | None, float]:
    """Seconds per step over the latest tenth of the step intervals inside attempts (an
    attempt's first step is its startup, not pace), and the relative spread of the
    attempts' own paces (0 with one attempt)."""
    same = clock["attempt"].to_numpy()[1:] == clock["attempt"].to_numpy()[:-1]
    dt = np.diff(clock["time"].to_numpy(dtype=float))[same]
    ds = np.diff(clock["step"].to_numpy(dtype=float))[same]
    att = clock["attempt"].to_numpy()[1:][same]
    if ds.size == 0:
        return None, 0.0
    order = np.argsort(clock["time"].to_numpy(dtype=float)[1:][same], kind="stable")
    recent = order[-max(1, int(ds.size * PACE_SHARE)) :]
    if ds[recent].sum() <= 0 or dt[recent].sum() <= 0:
        return None, 0.0
    pace = float(dt[recent].sum() / ds[recent].sum())
    paces = [
        dt[att == a].sum() / ds[att == a].sum()
        for a in np.unique(att)
        if ds[att == a].sum() >= MIN_PACE_STEPS
    ]
    spread = float(np.std(paces) / np.mean(paces)) if len(paces) > 1 else 0.0
    return pace, spread


def _failure_times(events: pd.DataFrame, spans: pd.DataFrame) -> list[float]:
    """One failure per attempt that a restart followed (its first failure event's time,
    else its last point's; none for an attempt that logged ``finish`` and no failure), and
    one for a failure event after the current attempt's last point (the run is down)."""
    kinds = events["kind"].to_numpy()
    fails = events[np.isin(kinds, FAILURE_KINDS)]
    attempts = _event_attempts(events, spans)
    fail_att = attempts[np.isin(kinds, FAILURE_KINDS)]
    finished = set(attempts[kinds == "finish"].tolist())
    out: list[float] = []
    for i, a in enumerate(spans.index):
        own = fails["time"].to_numpy(dtype=float)[fail_att == a]
        if i + 1 < len(spans):
            if own.size or a not in finished:
                out.append(float(own.min()) if own.size else float(spans["t1"].iloc[i]))
        elif (own > spans["t1"].iloc[i]).any():
            out.append(float(own[own > spans["t1"].iloc[i]].min()))
    return out


def _event_attempts(events: pd.DataFrame, spans: pd.DataFrame) -> np.ndarray:
    """Each event's attempt: as stored, else the last attempt whose first point is at or
    before it."""
    t0 = spans["t0"].to_numpy(dtype=float)
    idx = np.searchsorted(t0, events["time"].to_numpy(dtype=float), side="right") - 1
    guess = spans.index.to_numpy()[np.clip(idx, 0, len(t0) - 1)]
    stored = events["attempt"].to_numpy(dtype=float)
    return np.where(np.isnan(stored), guess, stored).astype(int)


def checkpoint_interval(events: pd.DataFrame, restart_steps: np.ndarray) -> float | None:
    """Steps between checkpoints: the median gap of the ``checkpoint`` events' steps, else
    the largest common divisor of the gaps between the steps the restarts began at (they
    resume from checkpoints); None when neither says."""
    ckpt = events.loc[events["kind"] == "checkpoint", "step"].dropna().to_numpy(dtype=float)
    gaps = np.diff(np.unique(ckpt))
    if gaps.size:
        return float(np.median(gaps))
    starts = np.unique(np.asarray(restart_steps, dtype=int))
    if starts.size < 2:
        return None
    gcd = reduce(math.gcd, np.diff(starts).tolist())
    return float(gcd) if gcd > 1 else None


def _start_time(store: Store, run: str, first_point: float) -> float:
    """The run's first attempt's start when it is before its first point, else the first
    point (a store imported before 653964c dated its attempts at the import)."""
    attempts = store.attempts(run)
    if len(attempts) and pd.notna(attempts["start_time"].iloc[0]):
        start = float(attempts["start_time"].iloc[0])
        if start <= first_point:
            return start
    return first_point
