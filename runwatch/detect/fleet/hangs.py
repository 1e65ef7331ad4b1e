"""Hangs: the job stopped making progress, and which ranks the others are waiting for.

The question users ask of a stuck NCCL job is "which node is hanging?". When one rank stops
(a wedged GPU, a dead NIC, a deadlock in its data loader) every other rank runs on to the next
collective and waits there, so they all stop reporting -- but at *different* steps: the ranks
that are behind are the suspects, and the last step each reached says where it stuck.

Every report of a rank's step is a heartbeat. The detector learns the job's step time from how
fast the slowest rank's step (the job's real progress) advances -- the median of the last
``history`` advances, so one slow checkpoint step does not move it -- and calls a hang when that
has not advanced for ``k`` x the step time (at least ``min_timeout_s``). It then names every
rank whose last step is below the furthest rank's (up to ``max_named``), with that step.

Catches: a whole-job stall (all ranks silent) and the ranks it is waiting for; a single rank
falling silent while the others are blocked on it. Misses: a hang before the first steps (no
step time learned yet: ``min_timeout_s`` still applies once two steps were seen); a rank that
still reports but makes no real progress (it must report its step); a job that is slow but not
stopped (that is the step-time Regression detector). It learns only from progress, so a hang
cannot teach it a longer step time.

Time comes from ``clock`` (default ``time.monotonic``) or is passed in (``now=``), so tests and
replay need no sleeping: replay passes each point's wall time.

>>> det = HangDetector(k=5.0, min_timeout_s=1.0)
>>> for step in range(10):
...     for rank in range(4):
...         if not (rank == 2 and step > 6):
...             det.beat(rank, step, now=float(step))
>>> det.check(now=10.5)  # 4.5 s without progress: within 5 x the 1 s step time
[]
>>> [(a.labels["rank"], a.start_step, a.details["furthest_step"]) for a in det.check(now=11.5)]
[(2, 6, 9)]
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from runwatch.detect.base import check_number
from runwatch.model import Anomaly

log = logging.getLogger("runwatch.detect.fleet")


class HangDetector:
    """No-progress detection over per-rank heartbeats (see the module doc).

    ``beat(rank, step, now)`` records that ``rank`` reached ``step``; ``check(now)`` returns the
    hang episodes opened or closed at ``now``. Ranks are column indices (0..n-1) unless named
    with :meth:`set_labels`.
    """

    name = "hang"

    def __init__(
        self,
        k: float = 5.0,
        min_timeout_s: float = 60.0,
        history: int = 50,
        max_named: int = 32,
        metric: str = "progress",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_number("k", k, low=1.0)
        check_number("min_timeout_s", min_timeout_s, low=0.0)
        check_number("history", history, low=1, integer=True)
        check_number("max_named", max_named, low=1, integer=True)
        self.k = k
        self.min_timeout_s = min_timeout_s
        self.history = history
        self.max_named = max_named
        self.metric = metric
        self.clock = clock
        self._labels: dict[int, dict[str, Any]] = {}
        self._step_times: deque[float] = deque(maxlen=history)
        self._reset()

    def _reset(self) -> None:
        self._last_step = np.full(0, -1, dtype=np.int64)
        self._last_time = np.full(0, np.nan)
        self._frontier: int | None = None  # the slowest rank's step
        self._frontier_time = math.nan
        self._at_frontier = 0
        self._open: list[Anomaly] = []
        self._episodes: list[Anomaly] = getattr(self, "_episodes", [])

    def restart(self) -> None:
        """A new attempt: forget where each rank was, keep the learned step time."""
        self._reset()

    # -- results ---------------------------------------------------------------------------
    @property
    def step_time(self) -> float | None:
        """The learned time per step of the job's progress (median of recent advances)."""
        return float(np.median(self._step_times)) if self._step_times else None

    @property
    def timeout_s(self) -> float:
        st = self.step_time
        return max(self.min_timeout_s, self.k * st) if st is not None else math.inf

    @property
    def episodes(self) -> list[Anomaly]:
        return list(self._episodes)

    @property
    def hung(self) -> bool:
        return bool(self._open)

    def set_labels(self, column: int, labels: Mapping[str, Any]) -> None:
        self._labels[int(column)] = dict(labels)

    # -- input -----------------------------------------------------------------------------
    def beat(self, rank: int, step: int, now: float | None = None) -> None:
        """``rank`` (a column index) reached ``step`` at ``now``."""
        now = self.clock() if now is None else float(now)
        if rank >= self._last_step.size:
            self._grow(rank + 1)
        old = int(self._last_step[rank])
        if step > old:
            self._last_step[rank] = step
            self._last_time[rank] = now
            # Only a rank leaving the frontier can move it: O(1) per beat, O(n) per step.
            if old < 0:  # a rank seen for the first time
                self._advance(now)
            elif self._frontier is None or old <= self._frontier:
                self._at_frontier -= 1
                if self._at_frontier <= 0:
                    self._advance(now)

    def beat_many(self, ranks: Any, step: int, now: float | None = None) -> None:
        """Several ranks reached ``step`` at ``now`` (vectorised, for replay)."""
        now = self.clock() if now is None else float(now)
        cols = np.asarray(ranks, dtype=np.int64)
        if cols.size == 0:
            return
        if int(cols.max()) >= self._last_step.size:
            self._grow(int(cols.max()) + 1)
        ahead = cols[self._last_step[cols] < step]
        self._last_step[ahead] = step
        self._last_time[ahead] = now
        self._advance(now)

    def _advance(self, now: float) -> None:
        seen = self._last_step >= 0
        frontier = int(self._last_step[seen].min())
        self._at_frontier = int((self._last_step[seen] == frontier).sum())
        if self._frontier is not None and frontier < self._frontier:
            self._frontier = frontier  # a rank joined late, behind the others
        elif self._frontier is None or frontier > self._frontier:
            if self._frontier is not None and math.isfinite(self._frontier_time):
                dt = (now - self._frontier_time) / (frontier - self._frontier)
                if dt > 0:
                    self._step_times.append(dt)
            self._frontier = frontier
            self._frontier_time = now
            if self._open:
                for ep in self._open:
                    ep.is_open = False
                    ep.details["recovered"] = True
                    ep.details["resumed_at_time"] = now
                self._open = []

    def check(self, now: float | None = None) -> list[Anomaly]:
        """Open a hang episode if progress stopped for too long; close it if it resumed."""
        now = self.clock() if now is None else float(now)
        out: list[Anomaly] = []
        if self._open or now != now:
            return out
        if self._frontier is None or not math.isfinite(self._frontier_time):
            return out
        stalled = now - self._frontier_time
        if stalled <= self.timeout_s:
            return out
        seen = self._last_step >= 0
        top = int(self._last_step[seen].max())
        behind = np.flatnonzero(seen & (self._last_step < top))
        behind = behind[np.argsort(self._last_step[behind], kind="stable")][: self.max_named]
        named = {int(c): int(self._last_step[c]) for c in behind.tolist()}
        details = {
            "stalled_s": stalled,
            "timeout_s": self.timeout_s,
            "step_time_s": self.step_time,
            "furthest_step": top,
            "behind": {self._rank_name(c): s for c, s in named.items()},
            "ranks_behind": int((seen & (self._last_step < top)).sum()),
            "ranks": int(seen.sum()),
            "detected_at_time": now,
        }
        if named:
            for col, last in named.items():
                labels = self._labels.get(col) or {"rank": col}
                msg = (
                    f"no progress for {stalled:.0f} s (> {self.timeout_s:.0f} s = "
                    f"{self.k:g} x step time): {_where(labels)} stopped at step {last} while "
                    f"other ranks reached step {top}; {details['ranks_behind']} rank(s) behind"
                )
                out.append(self._episode(labels, last, top, stalled, msg, details))
        else:
            msg = (
                f"no progress for {stalled:.0f} s (> {self.timeout_s:.0f} s): all "
                f"{details['ranks']} ranks stopped at step {top}; no rank is behind "
                "(a job-wide stall: storage, the scheduler, or a collective all entered)"
            )
            out.append(self._episode({}, top, top, stalled, msg, details))
        log.warning("hang: %s", out[0].message)
        return out

    def finish(self) -> list[Anomaly]:
        out = list(self._open)
        for ep in out:
            ep.is_open = False
            ep.details["recovered"] = False
        self._open = []
        return out

    # -- internals -------------------------------------------------------------------------
    def _rank_name(self, col: int) -> Any:
        return (self._labels.get(col) or {}).get("rank", col)

    def _grow(self, n: int) -> None:
        extra = n - self._last_step.size
        self._last_step = np.concatenate([self._last_step, np.full(extra, -1, np.int64)])
        self._last_time = np.concatenate([self._last_time, np.full(extra, np.nan)])

    def _episode(
        self,
        labels: dict[str, Any],
        last: int,
        top: int,
        stalled: float,
        message: str,
        details: dict[str, Any],
    ) -> Anomaly:
        ep = Anomaly(
            detector=self.name,
            metric=self.metric,
            start_step=last,
            end_step=last,
            severity="critical",
            score=stalled / self.timeout_s,
            observed=stalled,
            message=message,
            labels=dict(labels),
            expected=self.step_time,
            upper=self.timeout_s,
            details={**details, "last_step": last},
        )
        self._open.append(ep)
        self._episodes.append(ep)
        return ep


def _where(labels: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in labels.items()) or "the job"
