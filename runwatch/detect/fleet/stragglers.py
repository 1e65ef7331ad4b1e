"""Stragglers: ranks persistently slower than the rest of the fleet, step after step.

In synchronous data-parallel training every step waits for the slowest rank, so one slow GPU
(a throttling card, a bad NVLink, a noisy neighbour on its host) slows all of them. Feed each
rank's *own* time for the step -- compute before it waits on the collective (forward+backward
time, or the iteration time minus the all-reduce wait) -- because the wall time of a step is
the same on every rank once the collective has synchronised them.

The rule, vectorised over ranks (NumPy, one row per step):

1. At each step, each rank's ratio ``r = t_rank / median_rank(t)``: the fleet median cancels
   whatever slows everyone (a longer sequence, a checkpoint, a slow filesystem).
2. A rank is *slow at this step* if ``r > 1 + max(min_excess, k_sigma * spread)``, where
   ``spread`` is the robust cross-rank spread of ratios (1.4826 x MAD) at this step.
3. A rank is a *straggler* once it was slow in at least ``min_fraction`` of the last
   ``window`` steps, or -- a short, large slowdown -- slow by ``short_ratio`` or more in
   ``short_count`` of the last ``short_window`` steps (by default 7 in a row at 1.75x: on
   ten ranks sharing two loaded cores a healthy rank was at most 6 steps in a row that
   slow, ``bench/data/ddp10_straggler.csv``); the episode closes when the first falls to
   ``close_fraction`` or less and the second has no such step left.

Why persistence rather than size: NVIDIA resiliency-ext flags a rank whose performance is below
0.75 of the best rank, i.e. at least 33% slower; that catches a dying GPU but not the common
case of a card running 5-10% slow for hours, which costs 5-10% of the whole job. Counting slow
steps in a window catches a 10% slowdown under 2% step noise with no false accusations
(``bench/fleet.py``), because a healthy rank is slow in a fraction ``P(z > 2)`` of steps and
almost never in most of 50.

Catches: persistent or intermittent (>= ``min_fraction * window`` steps in a window) slowdowns
of one or many ranks (up to just under half the fleet: the median must stay healthy), and
short large ones (a rank at 2x its peers for 7 steps).
Misses: ranks slower by less than the per-step threshold; slowdowns shorter than
``min_fraction * window`` steps unless ``short_ratio`` large; half the fleet or more slowing
down together (the median
moves with them -- that is a job-wide regression, for the step-time Regression detector).
``smooth`` > 1 feeds each rank's *minimum* over its last ``smooth`` readings to the rule instead
of the reading. Noise on a measured time is one-sided -- a preemption or a page fault delays a
step, nothing speeds one up -- so the floor of a few steps is the rank's real speed: on a
loaded CPU a rank's own time gains a few ms in about a step in four, which outvotes a real
1.5x straggler step by step (``bench/README-stragglers.md``). It delays detection by up to
``smooth`` steps and a recovery by as many.
The baseline is the fleet at the same step, so nothing is learned from a straggler: there is
no baseline to protect. Memory is O(window x ranks), whatever the length of the run.

The cost is reported per episode: ``slowdown`` (mean ratio over the window),
``lost_throughput`` = 1 - 1/slowdown (the share of the job's throughput lost while this rank
is the slowest) and ``lost_seconds`` (the time the others waited for it, summed over the
episode).

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> det = StragglerDetector(window=20)
>>> for step in range(100):
...     t = 1.0 + 0.01 * rng.standard_normal(8)
...     if step >= 40:
...         t[3] *= 1.15  # rank 3 turns 15% slower at step 40
...     _ = det.update(step, t)
>>> a = det.open_episodes[3]
>>> a.labels, a.start_step, a.details["detected_at"], round(a.details["slowdown"], 2)
({'rank': 3}, 40, 51, 1.15)
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from runwatch.detect.base import check_number
from runwatch.model import Anomaly

log = logging.getLogger("runwatch.detect.fleet")

MAD_TO_SIGMA = 1.4826


class StragglerDetector:
    """Cross-rank straggler detection over per-step, per-rank times (see the module doc).

    ``update(step, times)`` takes one step's times, one per rank column (NaN where a rank did
    not report), and returns the episodes that opened or closed at that step; open episodes
    are updated in place and listed by :attr:`open_episodes`. Column ``i`` is rank ``i``
    unless :meth:`set_labels` says otherwise.
    """

    name = "straggler"

    def __init__(
        self,
        window: int = 50,
        min_fraction: float = 0.6,
        close_fraction: float = 0.3,
        min_excess: float = 0.03,
        k_sigma: float = 2.0,
        critical_slowdown: float = 1.25,
        min_ranks: int = 3,
        metric: str = "step_time",
        short_ratio: float = 1.75,
        short_count: int = 7,
        short_window: int = 7,
        smooth: int = 1,
    ) -> None:
        check_number("window", window, low=2, integer=True)
        check_number("min_fraction", min_fraction, low=0.05, high=1.0)
        check_number("close_fraction", close_fraction, low=0.0, high=min_fraction)
        check_number("min_excess", min_excess, low=0.0)
        check_number("k_sigma", k_sigma, low=0.0)
        check_number("critical_slowdown", critical_slowdown, low=1.0)
        check_number("min_ranks", min_ranks, low=3, integer=True)
        check_number("short_ratio", short_ratio, low=1.0)
        check_number("short_window", short_window, low=1, high=window, integer=True)
        check_number("short_count", short_count, low=1, high=short_window, integer=True)
        check_number("smooth", smooth, low=1, high=window, integer=True)
        self.window = window
        self.min_fraction = min_fraction
        self.close_fraction = close_fraction
        self.min_excess = min_excess
        self.k_sigma = k_sigma
        self.critical_slowdown = critical_slowdown
        self.min_ranks = min_ranks
        self.metric = metric
        self.short_ratio = short_ratio
        self.short_count = short_count
        self.short_window = short_window
        self.smooth = smooth
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._t = 0  # steps taken into the window so far
        self._open_at = math.ceil(self.min_fraction * self.window)
        self._close_at = math.floor(self.close_fraction * self.window)
        self._steps = np.zeros(self.window, dtype=np.int64)
        self._slow = np.zeros((self.window, 0), dtype=bool)
        self._ratio = np.zeros((self.window, 0), dtype=np.float32)
        self._valid = np.zeros((self.window, 0), dtype=bool)
        self._slow_n = np.zeros(0, dtype=np.int32)
        self._valid_n = np.zeros(0, dtype=np.int32)
        self._ratio_sum = np.zeros(0, dtype=np.float64)
        self._lost = np.zeros(0, dtype=np.float64)
        self._is_open = np.zeros(0, dtype=bool)
        self._open: dict[int, Anomaly] = {}
        self._labels: dict[int, dict[str, Any]] = {}
        self._episodes: list[Anomaly] = []
        self._raw = np.full((self.smooth, 0), np.nan)
        self._raw_t = 0

    def reset(self) -> None:
        """Forget everything (a new attempt of the job: ranks may have moved)."""
        labels = self._labels
        self._reset()
        self._labels = labels

    # -- results ---------------------------------------------------------------------------
    @property
    def open_episodes(self) -> dict[int, Anomaly]:
        """Open straggler episodes by rank column."""
        return dict(self._open)

    @property
    def episodes(self) -> list[Anomaly]:
        """Every episode so far, open and closed, in the order they opened."""
        return list(self._episodes)

    @property
    def ranks(self) -> int:
        return self._n

    def set_labels(self, column: int, labels: Mapping[str, Any]) -> None:
        """Name column ``column``: ``{"rank": 17, "host": "node-3", "gpu": 1}``."""
        self._labels[int(column)] = dict(labels)

    # -- input -----------------------------------------------------------------------------
    def update(self, step: int, times: Any) -> list[Anomaly]:
        """Take one step's per-rank times; return the episodes opened or closed by it."""
        x = np.asarray(times, dtype=np.float64)
        if x.ndim != 1:
            raise ValueError(f"times must be one value per rank (1-D), got shape {x.shape}")
        if x.size > self._n:
            self._grow(x.size)
        elif x.size < self._n:
            x = np.concatenate([x, np.full(self._n - x.size, np.nan)])
        if self.smooth > 1:
            x = self._smoothed(x)
        ok = np.isfinite(x) & (x > 0)
        n_ok = int(ok.sum())
        if n_ok < self.min_ranks:
            return []
        vals = x[ok]
        med = float(np.median(vals))
        ratio = np.where(ok, x / med, np.nan)
        spread = MAD_TO_SIGMA * float(np.median(np.abs(vals / med - 1.0)))
        threshold = 1.0 + max(self.min_excess, self.k_sigma * spread)
        with np.errstate(invalid="ignore"):
            slow = ok & (ratio > threshold)
        ratio32 = np.where(ok, ratio, 0.0).astype(np.float32)

        i = self._t % self.window
        self._slow_n += slow.astype(np.int32) - self._slow[i]
        self._valid_n += ok.astype(np.int32) - self._valid[i]
        self._ratio_sum += ratio32.astype(np.float64) - self._ratio[i]
        self._slow[i] = slow
        self._valid[i] = ok
        self._ratio[i] = ratio32
        self._steps[i] = int(step)
        self._t += 1

        open_cols = np.flatnonzero(self._is_open)
        if open_cols.size:
            gap = np.where(ok[open_cols], x[open_cols] - med, 0.0)
            self._lost[open_cols] += np.maximum(gap, 0.0)
        big_n = self._big_counts()
        changed: list[Anomaly] = []
        opening = (self._slow_n >= self._open_at) | (big_n >= self.short_count)
        for col in np.flatnonzero(opening & ~self._is_open).tolist():
            short = bool(self._slow_n[col] < self._open_at)
            changed.append(self._open_episode(col, int(step), med, threshold, short))
        for col in open_cols.tolist():
            ep = self._open[col]
            if self._slow_n[col] <= self._close_at and big_n[col] == 0:
                ep.is_open = False
                ep.details["recovered"] = True
                self._is_open[col] = False
                del self._open[col]
                changed.append(ep)
            else:
                self._refresh(col, ep, int(step), med, threshold)
        return changed

    def finish(self) -> list[Anomaly]:
        """Close every open episode (the run ended); they stay unrecovered."""
        out = []
        for col, ep in sorted(self._open.items()):
            ep.is_open = False
            ep.details["recovered"] = False
            self._is_open[col] = False
            out.append(ep)
        self._open.clear()
        return out

    # -- internals -------------------------------------------------------------------------
    def _smoothed(self, x: np.ndarray) -> np.ndarray:
        """Each rank's floor over its last ``smooth`` readings (see the module doc)."""
        self._raw[self._raw_t % self.smooth] = x
        self._raw_t += 1
        filled = self._raw[: min(self._raw_t, self.smooth)]
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a rank with no reading yet
            out = np.nanmin(filled, axis=0)
        return np.where(np.isfinite(x), out, np.nan)

    def _big_counts(self) -> np.ndarray:
        """Per rank, its steps among the last ``short_window`` that were slow by
        ``short_ratio`` or more (the short, large slowdown rule), once ``window`` steps
        are known: a job's first steps (start-up, the first collectives) are erratic."""
        if self._t < self.window:
            return np.zeros(self._n, dtype=np.int64)
        filled = min(self._t, self.short_window)
        idx = [(self._t - 1 - j) % self.window for j in range(filled)]
        big = self._slow[idx] & (self._ratio[idx] >= self.short_ratio)
        return big.sum(axis=0)

    def _grow(self, n: int) -> None:
        extra = n - self._n
        w = self.window
        self._slow = np.hstack([self._slow, np.zeros((w, extra), dtype=bool)])
        self._valid = np.hstack([self._valid, np.zeros((w, extra), dtype=bool)])
        self._ratio = np.hstack([self._ratio, np.zeros((w, extra), dtype=np.float32)])
        self._raw = np.hstack([self._raw, np.full((self.smooth, extra), np.nan)])
        for name, dtype in (
            ("_slow_n", np.int32),
            ("_valid_n", np.int32),
            ("_ratio_sum", np.float64),
            ("_lost", np.float64),
            ("_is_open", bool),
        ):
            setattr(self, name, np.concatenate([getattr(self, name), np.zeros(extra, dtype)]))
        self._n = n

    def _onset(self, col: int, last: int) -> int:
        """The first slow step of this rank among the ``last`` steps of the window."""
        filled = min(self._t, last)
        order = [(self._t - filled + k) % self.window for k in range(filled)]
        for i in order:
            if self._slow[i, col]:
                return int(self._steps[i])
        return int(self._steps[(self._t - 1) % self.window])

    def _slowdown(self, col: int) -> float:
        n = int(self._valid_n[col])
        return float(self._ratio_sum[col] / n) if n else math.nan

    def _open_episode(
        self, col: int, step: int, med: float, threshold: float, short: bool = False
    ) -> Anomaly:
        labels = self._labels.get(col) or {"rank": col}
        self._is_open[col] = True
        self._lost[col] = 0.0
        onset = self._onset(col, self.short_window if short else self.window)
        ep = Anomaly(
            detector=self.name,
            metric=self.metric,
            start_step=onset,
            end_step=step,
            severity="warning",
            score=0.0,
            observed=None,
            message="",
            labels=dict(labels),
            expected=None,
            details={"detected_at": step, "column": col},
        )
        self._refresh(col, ep, step, med, threshold)
        self._open[col] = ep
        self._episodes.append(ep)
        where = ", ".join(f"{k} {v}" for k, v in labels.items())
        log.info("straggler: %s slow since step %d (%s)", where, onset, ep.message)
        return ep

    def _refresh(self, col: int, ep: Anomaly, step: int, med: float, threshold: float) -> None:
        slowdown = self._slowdown(col)
        fraction = int(self._slow_n[col]) / self.window
        ep.end_step = step
        score = (slowdown - 1.0) * 100.0
        if score >= ep.score or not ep.message:
            ep.score = score
            ep.observed = slowdown * med
            ep.expected = med
            ep.upper = threshold * med
            if slowdown >= self.critical_slowdown:
                ep.severity = "critical"
            lost = 1.0 - 1.0 / slowdown if slowdown > 0 else 0.0
            where = ", ".join(f"{k} {v}" for k, v in ep.labels.items())
            ep.message = (
                f"{where}: {self.metric} {slowdown:.2f}x the fleet median, slow in "
                f"{fraction:.0%} of the last {self.window} steps; costs the job about "
                f"{lost:.1%} of its throughput while it is the slowest rank"
            )
            if ep.details.get("note"):  # what the fleet view adds (which signal named it)
                ep.message += f"; {ep.details['note']}"
            ep.details["peak_slowdown"] = slowdown
        ep.details.update(
            slowdown=slowdown,
            slow_fraction=fraction,
            lost_throughput=1.0 - 1.0 / slowdown if slowdown > 0 else 0.0,
            lost_seconds=float(self._lost[col]),
        )
