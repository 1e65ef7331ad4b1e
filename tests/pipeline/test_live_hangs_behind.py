"""Live detection that fell behind judges no hangs: the newest points it holds are old, and
every rank would look stalled (found by bench/ingest.py's replicas phase on an overloaded
machine: hundreds of false hangs)."""

from __future__ import annotations

import time

import numpy as np

import runwatch
from runwatch.model import SeriesPoints
from runwatch.pipeline.live import HANG_CHECK_EVERY_S, LiveDetection
from runwatch.store import Store


def _rank_batch(rank: int, first: int, n: int, stamp: float) -> SeriesPoints:
    steps = np.arange(first, first + n, dtype=np.int64)
    times = stamp + 0.1 * (steps - first)
    return SeriesPoints("step_time", {"rank": rank}, steps, times, np.full(n, 0.1))


def _hangs(tmp_path, skip_first: bool) -> int:
    db = tmp_path / "h.db"
    with runwatch.init(name="r", store=db, monitor=False, cpu_wait=False) as run:
        run.log({"loss": 1.0}, step=0)
    with Store(db) as store:
        run_id = store.run_id("r")
    detection = LiveDetection(str(db), run_id, max_backlog_points=1000)
    if skip_first:
        detection([_rank_batch(0, 0, 2000, time.time())], [])  # over the backlog: skipped
    old = time.time() - 600  # what it judges now was logged 10 minutes ago
    for first in range(0, 200, 20):
        detection([_rank_batch(r, first, 20, old + 0.1 * first) for r in range(4)], [])
    time.sleep(HANG_CHECK_EVERY_S + 1.5)  # caught up and idle: the hang check has run
    assert detection.close()
    with Store(db, readonly=True) as store:
        found = store.anomalies("r", source="live")
    return int((found["detector"] == "hang").sum())


def test_stale_points_after_a_skipped_batch_raise_no_hang(tmp_path):
    assert _hangs(tmp_path, skip_first=True) == 0


def test_the_same_points_with_nothing_skipped_are_judged(tmp_path):
    # The control: without the skip, ten-minute-old heartbeats read as a stalled job.
    assert _hangs(tmp_path, skip_first=False) > 0
