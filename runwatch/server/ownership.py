"""Live detection with several replicas on one PostgreSQL database: one owner per run.

Every replica stores the batches it receives. Each run's Monitor runs on exactly one replica,
the one holding the run's ownership lock (``runwatch.store.run_locks``), which reads what any
replica stored for the run (``runwatch.store.tail``) every ``POLL_S``. When the owner dies its
session ends and the lock with it; the next replica to see a new block of the run takes the
lock, replays the run from the store into a fresh Monitor (live == replay makes that state
exact) and carries on from there (``LiveDetection.take_over``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from runwatch.guard import Guard
from runwatch.model import LABEL_KEYS, SeriesPoints
from runwatch.store.errors import StoreUnavailableError
from runwatch.worker import Worker

if TYPE_CHECKING:
    import pandas as pd

    from runwatch.pipeline.live import LiveDetection
    from runwatch.store import Store
    from runwatch.store.tail import TailBlock

log = logging.getLogger("runwatch.server")

POLL_S = 0.25
"""Seconds between two reads of what was stored: the live detection's added delay, and how
soon a run is taken over once its owner's lock is free."""


class _Owned:
    """A run this replica owns: its detection, how far it has read, and per series the last
    (attempt, step) fed."""

    def __init__(self, detection: LiveDetection, blocks_after: int, events_after: int) -> None:
        self.detection = detection
        self.blocks_after = blocks_after
        self.events_after = events_after
        self.fed: dict[tuple[Any, ...], tuple[int, int]] = {}


class RunOwnership:
    """Owns runs as their blocks appear, feeds their detection from the store, lets go at
    their finish or at the stop."""

    def __init__(self, store_url: str, make_detection: Callable[[int], LiveDetection]) -> None:
        from runwatch.store import Store

        self._store: Store = Store(store_url)
        self._locks = self._store.run_locks()  # type: ignore[attr-defined]
        self._make = make_detection
        self._owned: dict[int, _Owned] = {}
        self._seen, _ = self._store.tail_position()  # runs active from now on
        self._guard = Guard("following the runs this replica owns", log)
        self._worker = Worker(
            "runwatch-own", tick=self._tick, interval=POLL_S, on_stop=self._stop, logger=log
        )
        self._worker.start()

    def close(self, timeout: float = 30.0) -> None:
        """Stop following; finish every owned run's detection; free the runs."""
        self._worker.close(timeout)

    # -- the ownership thread ------------------------------------------------------------------
    def _tick(self) -> None:
        with self._guard:
            try:
                runs, self._seen = self._store.runs_written_after(self._seen)
                for run_id in sorted(runs - self._owned.keys()):
                    if self._locks.try_own(run_id):
                        self._take(run_id)
                for run_id in list(self._owned):
                    self._follow(run_id)
            except StoreUnavailableError as exc:
                self._lost(exc)

    def _lost(self, exc: Exception) -> None:
        """The database went away: whatever this replica owned, another may own now."""
        log.warning("runwatch serve: %s; letting go of %d runs", exc, len(self._owned))
        for owned in self._owned.values():
            owned.detection.close()
        self._owned.clear()
        with contextlib.suppress(Exception):
            self._locks.close()
        self._locks = self._store.run_locks()  # type: ignore[attr-defined]

    def _take(self, run_id: int) -> None:
        """Own ``run_id`` from what the store holds now (the owner before, if any, is gone)."""
        blocks_before, _ = self._store.tail_position()
        points = self._store.read_points(run_id)
        events = self._store.events(run_id)
        last_event = int(events["id"].max()) if len(events) else 0
        owned = _Owned(self._make(run_id), blocks_before, last_event)
        owned.fed = _last_fed(points)
        owned.detection.take_over(points, events)
        self._owned[run_id] = owned
        log.info("runwatch serve: this replica owns run %d's live detection", run_id)
        if self._store.run_status(run_id) not in (None, "running"):
            self._let_go(run_id)  # it finished before the replay read its events

    def _follow(self, run_id: int) -> None:
        """Feed the run's detection what was stored since the last read; let the run go at
        its finish (rank 0's, or a single process's)."""
        owned = self._owned[run_id]
        blocks = self._store.blocks_after(run_id, owned.blocks_after)
        new_events = self._store.events_after(run_id, owned.events_after)
        batch = [p for b in blocks if (p := _unfed(owned, b)) is not None]
        if blocks:
            owned.blocks_after = blocks[-1].block_id
        if new_events:
            owned.events_after = new_events[-1][0]
        events = [e for _, e in new_events]
        if batch or events:
            owned.detection(batch, events)
        if any(e.kind == "finish" and e.rank in (None, 0) for e in events):
            self._let_go(run_id)

    def _let_go(self, run_id: int) -> None:
        owned = self._owned.pop(run_id)
        owned.detection.close()
        self._locks.release(run_id)

    def _stop(self) -> None:
        for run_id in list(self._owned):
            with self._guard:
                self._let_go(run_id)
        self._locks.close()
        self._store.close()


def _last_fed(points: pd.DataFrame) -> dict[tuple[Any, ...], tuple[int, int]]:
    """Per series (metric, rank, host, gpu), the (attempt, step) of its last point in a
    store's frame of the run (in step order)."""
    keys = [k for k in LABEL_KEYS if k in points.columns]
    out = {}
    by = [points["metric"], *(points[k] for k in keys)]
    for values, g in points.groupby(by, dropna=False, sort=False):
        got = dict(zip(keys, values[1:], strict=True))
        series = (values[0], *(_plain(got.get(k)) for k in LABEL_KEYS))
        out[series] = (int(g["attempt"].iloc[-1]), int(g["step"].iloc[-1]))
    return out


def _plain(value: Any) -> Any:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    return (
        int(value) if isinstance(value, float | np.integer) and float(value).is_integer() else value
    )


def _unfed(owned: _Owned, block: TailBlock) -> SeriesPoints | None:
    """The block's points after the last one fed of its series (a merged block repeats the
    ones fed from the small blocks it replaced), as a batch entry; None if none."""
    key = (block.metric, *(_plain(block.labels.get(k)) for k in LABEL_KEYS))
    attempt, step = owned.fed.get(key, (-1, -1))
    if block.attempt < attempt:
        return None
    keep = np.ones(len(block.steps), dtype=bool) if block.attempt > attempt else block.steps > step
    if not keep.any():
        return None
    owned.fed[key] = (block.attempt, int(block.steps[keep][-1]))
    return SeriesPoints(
        block.metric, block.labels, block.steps[keep], block.times[keep], block.values[keep]
    )
