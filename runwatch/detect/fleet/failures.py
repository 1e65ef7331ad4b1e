"""Failure tracking and goodput: how often the run fails, what each failure costs, and when it
will really finish.

A pure function over a run's events, attempts and its step clock, so the dashboard, ``analyze``
and a test compute the same figures. Every figure is defined so it can be checked by hand:

- **Failures.** One per attempt that logged a ``crash``, ``hang``, ``oom`` or ``nccl_timeout``
  event (a NCCL timeout seen by 4,096 ranks is one failure, its ``ranks`` listed; its kind is
  the attempt's first failure event), plus one of kind ``restart`` for an attempt that was
  followed by another without any failure event or ``finish`` (the process died silently).
- **The step clock** is one metric logged every step (``step_time``, ``loss``...) from every
  attempt, superseded points included (``read_series(all_attempts=True)``); a step's time is
  its latest time across ranks.
- **Time** partitions the wall time (run start to ``now``) exactly:
  ``startup`` (each attempt's start to its first step, that first step included) +
  ``productive`` (durations of steps the final curve keeps: time since the previous step of
  the same attempt) + ``redone`` (durations of steps a later attempt redid) + ``downtime``
  (an attempt's last step to the next attempt's start) + ``stalled`` (the last step to
  ``now``: a hung or dead run that nobody restarted).
- **Goodput** = productive / wall; the four others are the badput breakdown (in the spirit of
  Google's ml-goodput-measurement).
- **Uptime** = Σ over attempts (last step time - start time); **MTBF** = uptime / failures,
  and in steps: steps run (productive + redone) / failures. The **trend** compares the mean
  time between failures (each failed attempt's uptime, plus any unfailed attempts before it)
  of the later half of failures with the earlier half: > 1 means failures are getting rarer.
- **Rates**: failures per 1,000 steps run, and per day of wall time.
- **ETA** for ``final_step``: remaining steps x mean productive step time, plus the failures
  expected in them (failures per step run x remaining) x the mean cost of a failure
  ((redone + downtime + startup of the restarts) / failures).

Catches: the rate, cost and trend of failures the run reported or that a restart implies.
Misses: failures that left no event and no new attempt (a run that died and was never
restarted shows as ``stalled`` time, not as a failure); time lost inside steps (slow steps
are the straggler detector's business).

>>> import pandas as pd
>>> attempts = pd.DataFrame({"attempt": [1, 2], "start_step": [0, 3],
...                          "start_time": [0.0, 50.0]})
>>> points = pd.DataFrame({"attempt": [1] * 5 + [2] * 4, "step": [0, 1, 2, 3, 4, 3, 4, 5, 6],
...                        "time": [10.0, 20, 30, 40, 45, 60, 70, 80, 90]})
>>> events = pd.DataFrame({"kind": ["crash"], "step": [4], "time": [46.0], "attempt": [1]})
>>> r = failure_report(events, attempts, points, final_step=10)
>>> r.failures_n, r.goodput, r.badput
(1, 0.5555555555555556, {'startup': 20.0, 'redone': 15.0, 'downtime': 5.0, 'stalled': 0.0})
>>> r.mtbf_s, r.eta_s  # 4 steps x 10 s + 4 x (1 failure / 7 steps) x 30 s lost
(85.0, 57.14285714285714)
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

log = logging.getLogger("runwatch.detect.fleet")

FAILURE_KINDS: tuple[str, ...] = ("crash", "hang", "oom", "nccl_timeout")
DAY_S = 86_400.0


@dataclass
class FailureReport:
    """The figures of :func:`failure_report` (seconds unless named otherwise)."""

    wall_s: float
    uptime_s: float
    productive_s: float
    badput: dict[str, float]
    goodput: float | None
    failures_n: int
    failures: pd.DataFrame = field(repr=False)
    steps_run: int
    productive_steps: int
    redone_steps: int
    failures_per_1k_steps: float | None
    failures_per_day: float | None
    mtbf_s: float | None
    mtbf_steps: float | None
    tbf_s: list[float]
    mtbf_trend: float | None
    time_lost_s: float
    mean_step_s: float | None
    current_step: int | None
    final_step: int | None
    eta_s: float | None
    eta_no_failures_s: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready figures (the failure timeline as a list of records)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["failures"] = self.failures.to_dict("records")
        return d


def failure_report(
    events: pd.DataFrame | None,
    attempts: pd.DataFrame | None,
    points: pd.DataFrame,
    *,
    final_step: int | None = None,
    now: float | None = None,
) -> FailureReport:
    """Failure, MTBF, goodput and ETA figures of one run (see the module doc for each).

    ``events``: kind, step, time[, attempt, rank, message]; ``attempts``: attempt,
    start_step, start_time; ``points``: the step clock, attempt, step, time (every attempt's
    points, superseded ones included). ``now`` defaults to the last point or event time.
    """
    clock = _step_clock(points)
    atts = _attempts(attempts, clock)
    events = _events(events, atts)
    if clock.empty:
        raise ValueError("no step clock: the run has no points to time its steps with")
    last_event = float(events["time"].max()) if len(events) else -math.inf
    end = float(now) if now is not None else max(float(clock["time"].max()), last_event)
    start = float(atts["start_time"].min())

    cut = _cutoffs(atts)
    startup = productive = redone = downtime = 0.0
    restart_startup = 0.0
    productive_steps = redone_steps = 0
    uptime_by_attempt: dict[int, float] = {}
    last_time: float | None = None
    for a in atts.itertuples(index=False):
        rows = clock[clock["attempt"] == a.attempt]
        if last_time is not None:
            downtime += max(float(a.start_time) - last_time, 0.0)
        if rows.empty:
            uptime_by_attempt[a.attempt] = 0.0
            continue
        steps = rows["step"].to_numpy()
        times = rows["time"].to_numpy(dtype=float)
        first = max(float(times[0]) - float(a.start_time), 0.0)
        startup += first
        if a.attempt != atts["attempt"].iloc[0]:
            restart_startup += first
        d = np.diff(times)
        ds = np.diff(steps)
        superseded = steps[1:] >= cut[a.attempt]
        productive += float(d[~superseded].sum())
        redone += float(d[superseded].sum())
        productive_steps += int(ds[~superseded].sum())
        redone_steps += int(ds[superseded].sum())
        last_time = float(times[-1])
        uptime_by_attempt[a.attempt] = last_time - float(a.start_time)
    stalled = max(end - (last_time if last_time is not None else end), 0.0)
    wall = end - start
    uptime = sum(uptime_by_attempt.values())
    badput = {"startup": startup, "redone": redone, "downtime": downtime, "stalled": stalled}

    failures = _failures(events, atts, clock)
    n = len(failures)
    steps_run = productive_steps + redone_steps
    tbf = _time_between_failures(failures, uptime_by_attempt)
    half = math.ceil(len(tbf) / 2)
    trend = (
        float(np.mean(tbf[half:]) / np.mean(tbf[:half]))
        if len(tbf) >= 2 and np.mean(tbf[:half]) > 0
        else None
    )
    live = clock[~_superseded(clock, cut)]
    current = int(live["step"].max()) if len(live) else None
    mean_step = productive / productive_steps if productive_steps else None
    lost = redone + downtime + restart_startup
    eta = eta_clean = None
    if final_step is not None and current is not None and mean_step is not None:
        remaining = max(int(final_step) - current, 0)
        eta_clean = remaining * mean_step
        eta = eta_clean
        if n and steps_run:
            eta += remaining * (n / steps_run) * (lost / n)
    return FailureReport(
        wall_s=wall,
        uptime_s=uptime,
        productive_s=productive,
        badput=badput,
        goodput=productive / wall if wall > 0 else None,
        failures_n=n,
        failures=failures,
        steps_run=steps_run,
        productive_steps=productive_steps,
        redone_steps=redone_steps,
        failures_per_1k_steps=1000.0 * n / steps_run if steps_run else None,
        failures_per_day=n * DAY_S / wall if wall > 0 else None,
        mtbf_s=uptime / n if n else None,
        mtbf_steps=steps_run / n if n else None,
        tbf_s=tbf,
        mtbf_trend=trend,
        time_lost_s=lost,
        mean_step_s=mean_step,
        current_step=current,
        final_step=final_step,
        eta_s=eta,
        eta_no_failures_s=eta_clean,
    )


# -- inputs ------------------------------------------------------------------------------------
def _step_clock(points: pd.DataFrame) -> pd.DataFrame:
    if points is None or len(points) == 0:
        return pd.DataFrame({"attempt": [], "step": [], "time": []})
    frame = points[["step", "time"]].copy()
    frame["attempt"] = points.get("attempt", 1)
    frame = frame.dropna(subset=["time"])
    frame = frame.groupby(["attempt", "step"], as_index=False)["time"].max()
    frame["attempt"] = frame["attempt"].astype(int)
    frame["step"] = frame["step"].astype(int)
    return frame.sort_values(["attempt", "step"], kind="stable").reset_index(drop=True)


def _attempts(attempts: pd.DataFrame | None, clock: pd.DataFrame) -> pd.DataFrame:
    firsts = clock.groupby("attempt").agg(step=("step", "min"), time=("time", "min"))
    if attempts is None or len(attempts) == 0:
        frame = pd.DataFrame({"attempt": firsts.index.astype(int)})
    else:
        frame = attempts[["attempt", *[c for c in ("start_step", "start_time") if c in attempts]]]
        frame = frame.copy()
    for col, src in (("start_step", "step"), ("start_time", "time")):
        given = frame[col] if col in frame else pd.Series(np.nan, index=frame.index)
        fallback = frame["attempt"].map(firsts[src])
        frame[col] = given.where(given.notna(), fallback)
    frame = frame.dropna(subset=["start_time"]).astype({"attempt": int})
    return frame.sort_values("attempt").reset_index(drop=True)


def _events(events: pd.DataFrame | None, atts: pd.DataFrame) -> pd.DataFrame:
    cols = ["kind", "step", "time", "attempt", "rank", "message"]
    if events is None or len(events) == 0:
        return pd.DataFrame({c: [] for c in cols})
    frame = events.copy()
    for c in cols:
        if c not in frame:
            frame[c] = None
    if frame["attempt"].isna().any():
        # Imported events without an attempt: the last attempt started at or before them.
        starts = atts["start_time"].to_numpy()
        idx = np.searchsorted(starts, frame["time"].to_numpy(dtype=float), side="right") - 1
        guess = atts["attempt"].to_numpy()[np.clip(idx, 0, len(starts) - 1)]
        frame["attempt"] = frame["attempt"].where(frame["attempt"].notna(), guess)
    frame["attempt"] = frame["attempt"].astype(int)
    return frame.sort_values(["time"], kind="stable").reset_index(drop=True)


def _cutoffs(atts: pd.DataFrame) -> dict[int, float]:
    """Each attempt's first redone step: the lowest start step of any later attempt."""
    out: dict[int, float] = {}
    running = math.inf
    for a, s in zip(atts["attempt"][::-1], atts["start_step"][::-1], strict=True):
        out[int(a)] = running
        if s == s:
            running = min(running, float(s))
    return out


def _superseded(clock: pd.DataFrame, cut: dict[int, float]) -> np.ndarray:
    limit = clock["attempt"].map(cut).fillna(math.inf).to_numpy(dtype=float)
    return clock["step"].to_numpy() >= limit


def _failures(events: pd.DataFrame, atts: pd.DataFrame, clock: pd.DataFrame) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    fails = events[events["kind"].isin(FAILURE_KINDS)]
    finished = set(events.loc[events["kind"] == "finish", "attempt"].tolist())
    order = atts["attempt"].tolist()
    for i, a in enumerate(order):
        own = fails[fails["attempt"] == a]
        if len(own):
            first = own.iloc[0]
            ranks = sorted({int(r) for r in own["rank"].dropna().tolist()})
            rows.append(
                {
                    "attempt": a,
                    "kind": str(first["kind"]),
                    "time": float(first["time"]),
                    "step": None if pd.isna(first["step"]) else int(first["step"]),
                    "ranks": ranks,
                    "events": len(own),
                    "message": str(first["message"] or ""),
                }
            )
        elif i + 1 < len(order) and a not in finished:
            mine = clock[clock["attempt"] == a]
            t = float(mine["time"].max()) if len(mine) else float(atts["start_time"].iloc[i])
            step = int(mine["step"].max()) if len(mine) else None
            rows.append(
                {
                    "attempt": a,
                    "kind": "restart",
                    "time": t,
                    "step": step,
                    "ranks": [],
                    "events": 0,
                    "message": "restarted without a failure event (the process died silently)",
                }
            )
    cols = ["attempt", "kind", "time", "step", "ranks", "events", "message"]
    return pd.DataFrame.from_records(rows, columns=cols)


def _time_between_failures(failures: pd.DataFrame, uptime: dict[int, float]) -> list[float]:
    """Uptime accumulated since the previous failure, at each failure."""
    failed = set(failures["attempt"].tolist())
    out: list[float] = []
    acc = 0.0
    for a in sorted(uptime):
        acc += uptime[a]
        if a in failed:
            out.append(acc)
            acc = 0.0
    return out
