"""Points on disk: appending compressed blocks, sealing them, reading them back.

A flush appends one small *unsealed* block per series. Once a series has ``SEAL_POINTS``
unsealed points they are merged into one *sealed* block and the small ones deleted, so a slow
run (one step a second, one block per flush) ends up in large, well-compressed blocks too,
while every flush stays one cheap insert per series. Each point is written at most twice.

Reading applies the attempt rule of the data model: a later attempt that started at step S
supersedes an earlier attempt's points at steps >= S (they stay on disk, as lost work), and
within one attempt a repeated step keeps its last value.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

import numpy as np
import pandas as pd

from runwatch.store.codec import decode_block, encode_block
from runwatch.store.downsample import first_flagged, segment_argext

SEAL_POINTS = 4096
"""Points per sealed block: large enough to compress well, small enough to read selectively."""

PointArrays = tuple[np.ndarray, np.ndarray, np.ndarray]
"""(steps int64, times float64, values float64), equal lengths."""


class BlockAppender:
    """Appends points to series blocks; remembers how many unsealed points each series has.

    One appender belongs to one connection (one writer). It learns the unsealed count of a
    series from the table the first time it sees it, so blocks left unsealed by a process that
    was killed are merged by the next writer of that series and attempt.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._unsealed: dict[tuple[int, int], int] = {}

    def append(self, series_id: int, attempt: int, points: PointArrays) -> None:
        """Append ``points`` (in log order) to a series; call inside a transaction."""
        steps, times, values = points
        n = len(steps)
        if n == 0:
            return
        key = (series_id, attempt)
        pending = self._unsealed.get(key)
        if pending is None:
            pending = self._count_unsealed(series_id, attempt)
        start = 0
        if pending and pending + n >= SEAL_POINTS:
            take = SEAL_POINTS - pending
            old_steps, old_times, old_values = self._take_unsealed(series_id, attempt)
            self._insert(
                series_id,
                attempt,
                np.concatenate([old_steps, steps[:take]]),
                np.concatenate([old_times, times[:take]]),
                np.concatenate([old_values, values[:take]]),
                sealed=True,
            )
            start, pending = take, 0
        while n - start >= SEAL_POINTS:
            end = start + SEAL_POINTS
            self._insert(
                series_id, attempt, steps[start:end], times[start:end], values[start:end], True
            )
            start = end
        if start < n:
            self._insert(series_id, attempt, steps[start:], times[start:], values[start:], False)
            pending += n - start
        self._unsealed[key] = pending

    def forget(self) -> None:
        """Drop cached counts (after a rollback they may be wrong)."""
        self._unsealed.clear()

    def _count_unsealed(self, series_id: int, attempt: int) -> int:
        row = self._conn.execute(
            "SELECT COALESCE(SUM(n), 0) FROM point_blocks "
            "WHERE series_id = ? AND attempt = ? AND sealed = 0",
            (series_id, attempt),
        ).fetchone()
        return int(row[0])

    def _take_unsealed(self, series_id: int, attempt: int) -> PointArrays:
        rows = self._conn.execute(
            "SELECT id, data FROM point_blocks "
            "WHERE series_id = ? AND attempt = ? AND sealed = 0 ORDER BY id",
            (series_id, attempt),
        ).fetchall()
        self._conn.executemany("DELETE FROM point_blocks WHERE id = ?", [(r[0],) for r in rows])
        decoded = [decode_block(r[1]) for r in rows]
        return tuple(np.concatenate([d[i] for d in decoded]) for i in range(3))  # type: ignore[return-value]

    def _insert(
        self,
        series_id: int,
        attempt: int,
        steps: np.ndarray,
        times: np.ndarray,
        values: np.ndarray,
        sealed: bool,
    ) -> None:
        self._conn.execute(
            "INSERT INTO point_blocks (series_id, attempt, min_step, max_step, n, sealed, data, "
            "summary) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                series_id,
                attempt,
                int(steps.min()),
                int(steps.max()),
                len(steps),
                int(sealed),
                encode_block(steps, times, values),
                summarize_block(steps, times, values) if sealed else None,
            ),
        )


SUMMARY_GROUP = 32
"""Points per group of a block summary: each group keeps its min, max and first NaN/Inf."""


def summarize_block(steps: np.ndarray, times: np.ndarray, values: np.ndarray) -> bytes | None:
    """The extremes of every ``SUMMARY_GROUP`` consecutive points, encoded as a block.

    Only for blocks whose steps strictly increase (the usual case); a block with repeated or
    out-of-order steps gets no summary and is always read in full.

    >>> steps = np.arange(64); values = np.zeros(64); values[40] = 9.0
    >>> s, _, v = decode_block(summarize_block(steps, steps * 1.0, values))
    >>> 40 in s.tolist(), len(s) <= 6
    (True, True)
    """
    n = len(steps)
    if n < 2 * SUMMARY_GROUP or not bool(np.all(np.diff(steps) > 0)):
        return None
    starts = np.arange(0, n, SUMMARY_GROUP)
    ends = np.r_[starts[1:], n]
    finite = np.isfinite(values)
    keep = np.zeros(n, dtype=bool)
    keep[segment_argext(np.where(finite, values, np.inf), starts, ends, np.minimum)] = True
    keep[segment_argext(np.where(finite, values, -np.inf), starts, ends, np.maximum)] = True
    first_bad = first_flagged(~finite, starts, ends)
    keep[first_bad[first_bad >= 0]] = True
    return encode_block(steps[keep], times[keep], values[keep])


def read_summarized(
    conn: sqlite3.Connection, series_id: int, start: int | None, end: int | None, max_points: int
) -> pd.DataFrame | None:
    """Points for a downsampled read from block summaries, or None when they cannot serve.

    Summaries serve when the range holds far more points than asked for (a bucket then spans
    many 32-point groups, so its min and max are among the groups' extremes, exact up to the
    one group a bucket edge may split) and every block in range is either summarized or
    unsealed, with no overlapping steps within an attempt (no repeated steps to resolve).
    """
    sql = (
        "SELECT id, attempt, min_step, max_step, n, sealed, summary IS NOT NULL "
        "FROM point_blocks WHERE series_id = ?"
    )
    params: list[int] = [series_id]
    if start is not None:
        sql += " AND max_step >= ?"
        params.append(int(start))
    if end is not None:
        sql += " AND min_step <= ?"
        params.append(int(end))
    blocks = conn.execute(sql + " ORDER BY id", params).fetchall()
    total = sum(b[4] for b in blocks)
    if total < 64 * max_points:
        return None
    last_max: dict[int, int] = {}
    for _, attempt, lo, hi, _, sealed, has_summary in blocks:
        if (sealed and not has_summary) or lo <= last_max.get(attempt, -1):
            return None
        last_max[attempt] = hi
    return read_blocks(conn, [series_id], start, end, summaries=True)


def read_blocks(
    conn: sqlite3.Connection,
    series_ids: Iterable[int],
    start: int | None = None,
    end: int | None = None,
    *,
    summaries: bool = False,
    attempt: int | None = None,
) -> pd.DataFrame:
    """Every stored point of the series (all attempts), in write order, clipped to the range.

    ``summaries=True`` reads sealed blocks as their summaries (callers check they exist).
    ``attempt`` reads only that attempt's blocks (the others are not decoded).
    """
    ids = list(series_ids)
    if not ids:
        return empty_points()
    marks = ",".join("?" * len(ids))
    # With summaries, a sealed block is read as its extremes (see summarize_block).
    blob = "CASE WHEN sealed = 1 THEN summary ELSE data END" if summaries else "data"
    sql = f"SELECT series_id, attempt, {blob} FROM point_blocks WHERE series_id IN ({marks})"
    params: list[int] = list(ids)
    if start is not None:
        sql += " AND max_step >= ?"
        params.append(int(start))
    if end is not None:
        sql += " AND min_step <= ?"
        params.append(int(end))
    if attempt is not None:
        sql += " AND attempt = ?"
        params.append(int(attempt))
    sql += " ORDER BY id"
    parts_sid, parts_att, parts_step, parts_time, parts_value = [], [], [], [], []
    for series_id, block_attempt, blob in conn.execute(sql, params):
        steps, times, values = decode_block(blob)
        parts_step.append(steps)
        parts_time.append(times)
        parts_value.append(values)
        parts_sid.append(np.full(len(steps), series_id, dtype=np.int64))
        parts_att.append(np.full(len(steps), block_attempt, dtype=np.int64))
    if not parts_step:
        return empty_points()
    frame = pd.DataFrame(
        {
            "series_id": np.concatenate(parts_sid),
            "step": np.concatenate(parts_step),
            "time": np.concatenate(parts_time),
            "value": np.concatenate(parts_value),
            "attempt": np.concatenate(parts_att),
        }
    )
    if start is not None or end is not None:
        lo = -np.inf if start is None else start
        hi = np.inf if end is None else end
        frame = frame[(frame["step"] >= lo) & (frame["step"] <= hi)]
    return frame.reset_index(drop=True)


def empty_points() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "series_id": np.array([], dtype=np.int64),
            "step": np.array([], dtype=np.int64),
            "time": np.array([], dtype=np.float64),
            "value": np.array([], dtype=np.float64),
            "attempt": np.array([], dtype=np.int64),
        }
    )


def mark_superseded(points: pd.DataFrame, attempt_starts: dict[int, int | None]) -> pd.Series:
    """True for points that a later attempt redid (lost work), per the data model.

    ``attempt_starts`` maps attempt -> the first step it logged (None: logged nothing yet).

    >>> pts = pd.DataFrame({"step": [1, 2, 3, 2, 3], "attempt": [1, 1, 1, 2, 2]})
    >>> mark_superseded(pts, {1: 1, 2: 2}).tolist()
    [False, True, True, False, False]
    """
    cutoff = attempt_cutoffs(attempt_starts)
    limits = points["attempt"].map(cutoff).fillna(np.inf).to_numpy(dtype=np.float64)
    return pd.Series(points["step"].to_numpy() >= limits, index=points.index)


def attempt_cutoffs(attempt_starts: dict[int, int | None]) -> dict[int, float]:
    """For each attempt, the lowest start step of any later attempt (inf when none)."""
    cutoffs: dict[int, float] = {}
    running = np.inf
    for attempt in sorted(attempt_starts, reverse=True):
        cutoffs[attempt] = running
        start = attempt_starts[attempt]
        if start is not None:
            running = min(running, float(start))
    return cutoffs


def latest_points(points: pd.DataFrame, attempt_starts: dict[int, int | None]) -> pd.DataFrame:
    """The points a reader should see: latest attempt wins, last value of a repeated step."""
    if points.empty:
        return points
    steps = points["step"].to_numpy()
    if points["attempt"].nunique() == 1 and bool(np.all(steps[1:] > steps[:-1])):
        return points.reset_index(drop=True)  # one attempt, strictly increasing: as read
    live = points[~mark_superseded(points, attempt_starts)]
    keys = ["series_id", "step"] if "series_id" in live.columns else ["step"]
    live = live.drop_duplicates(subset=keys, keep="last")
    return live.sort_values(keys, kind="stable").reset_index(drop=True)
