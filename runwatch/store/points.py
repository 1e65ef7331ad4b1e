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
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from runwatch.store.codec import decode_block, encode_block, encode_open_block
from runwatch.store.downsample import first_flagged, segment_argext

if TYPE_CHECKING:
    import pandas as pd  # imported where frames are built: the hook's writes need none

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
        self._rows: list[tuple[Any, ...]] = []  # blocks to insert, at ``flush``

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

    def seal(self, series_id: int, attempt: int) -> None:
        """Rewrite a series' open blocks as one sealed block, however few its points (a
        finished run keeps its points compressed and summarized); call inside a
        transaction, for a series that has some."""
        steps, times, values = self._take_unsealed(series_id, attempt)
        if len(steps):
            self._insert(series_id, attempt, steps, times, values, sealed=True)
        self._unsealed[(series_id, attempt)] = 0

    def prepare(self, attempt: int, points: Mapping[int, PointArrays]) -> None:
        """Called inside the transaction before a write appends ``points`` (series id ->
        arrays); a backend with costly round trips reads what the appends need in one go."""

    def flush(self) -> None:
        """Insert the blocks appended since the last flush, in one statement: a write ends
        with it (each statement hands the GIL over twice)."""
        if self._rows:
            rows, self._rows = self._rows, []
            self._conn.executemany(
                "INSERT INTO point_blocks (series_id, attempt, min_step, max_step, n, sealed, "
                "data, summary) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    def forget(self) -> None:
        """Drop cached counts and blocks not yet inserted (after a rollback they may be
        wrong)."""
        self._unsealed.clear()
        self._rows.clear()

    def _count_unsealed(self, series_id: int, attempt: int) -> int:
        self.flush()
        row = self._conn.execute(
            "SELECT COALESCE(SUM(n), 0) FROM point_blocks "
            "WHERE series_id = ? AND attempt = ? AND sealed = 0",
            (series_id, attempt),
        ).fetchone()
        return int(row[0])

    def _take_unsealed(self, series_id: int, attempt: int) -> PointArrays:
        self.flush()
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
        self._rows.append(block_row(series_id, attempt, steps, times, values, sealed))


SUMMARY_GROUP = 32
"""Points per group of a block summary: each group keeps its min, max and first NaN/Inf."""


def block_row(
    series_id: int,
    attempt: int,
    steps: np.ndarray,
    times: np.ndarray,
    values: np.ndarray,
    sealed: bool,
) -> tuple[Any, ...]:
    """A ``point_blocks`` row, in its column order: the block encoded, and summarized when
    sealed (an open block is written raw, and rewritten into a sealed one later)."""
    return (
        series_id,
        attempt,
        int(steps.min()),
        int(steps.max()),
        len(steps),
        int(sealed),
        encode_block(steps, times, values) if sealed else encode_open_block(steps, times, values),
        summarize_block(steps, times, values) if sealed else None,
    )


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


def read_arrays(
    conn: sqlite3.Connection,
    series_ids: Iterable[int],
    start: int | None = None,
    end: int | None = None,
    *,
    summaries: bool = False,
    attempt: int | None = None,
) -> dict[str, np.ndarray]:
    """:func:`read_blocks` as NumPy arrays (series_id, step, time, value, attempt).

    Each column is decoded straight into one array, so a 3M-point read holds the points
    once, not once per block and again in a frame.
    """
    ids = list(series_ids)
    if not ids:
        return _empty_arrays()
    marks = ",".join("?" * len(ids))
    # With summaries, a sealed block is read as its extremes (see summarize_block).
    blob = "CASE WHEN sealed = 1 THEN summary ELSE data END" if summaries else "data"
    sql = f"SELECT series_id, attempt, n, {blob} FROM point_blocks WHERE series_id IN ({marks})"
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
    rows = conn.execute(sql + " ORDER BY id", params).fetchall()
    if summaries:  # a summary holds fewer points than the block's n
        decoded = [(sid, att, decode_block(b)) for sid, att, _, b in rows]
        rows = [(sid, att, len(d[0]), d) for sid, att, d in decoded]
    total = sum(r[2] for r in rows)
    out = {
        "series_id": np.empty(total, dtype=np.int64),
        "step": np.empty(total, dtype=np.int64),
        "time": np.empty(total, dtype=np.float64),
        "value": np.empty(total, dtype=np.float64),
        "attempt": np.empty(total, dtype=np.int64),
    }
    at = 0
    for series_id, block_attempt, _, blob in rows:
        steps, times, values = blob if summaries else decode_block(blob)
        hi = at + len(steps)
        out["step"][at:hi] = steps
        out["time"][at:hi] = times
        out["value"][at:hi] = values
        out["series_id"][at:hi] = series_id
        out["attempt"][at:hi] = block_attempt
        at = hi
    if at != total:  # pragma: no cover - a block whose n disagrees with its data
        out = {k: v[:at] for k, v in out.items()}
    if start is not None or end is not None:
        lo = -np.inf if start is None else start
        hi_ = np.inf if end is None else end
        inside = (out["step"] >= lo) & (out["step"] <= hi_)
        if not inside.all():
            out = {k: v[inside] for k, v in out.items()}
    return out


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
    import pandas as pd

    arrays = read_arrays(conn, series_ids, start, end, summaries=summaries, attempt=attempt)
    return pd.DataFrame(arrays, copy=False)


def _empty_arrays() -> dict[str, np.ndarray]:
    return {
        "series_id": np.array([], dtype=np.int64),
        "step": np.array([], dtype=np.int64),
        "time": np.array([], dtype=np.float64),
        "value": np.array([], dtype=np.float64),
        "attempt": np.array([], dtype=np.int64),
    }


def empty_points() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(_empty_arrays())


def mark_superseded(points: pd.DataFrame, attempt_starts: dict[int, int | None]) -> pd.Series:
    """True for points that a later attempt redid (lost work), per the data model.

    ``attempt_starts`` maps attempt -> the first step it logged (None: logged nothing yet).

    >>> import pandas as pd
    >>> pts = pd.DataFrame({"step": [1, 2, 3, 2, 3], "attempt": [1, 1, 1, 2, 2]})
    >>> mark_superseded(pts, {1: 1, 2: 2}).tolist()
    [False, True, True, False, False]
    """
    import pandas as pd

    mask = superseded_mask(points["step"].to_numpy(), points["attempt"].to_numpy(), attempt_starts)
    return pd.Series(mask, index=points.index)


def superseded_mask(
    steps: np.ndarray, attempts: np.ndarray, attempt_starts: dict[int, int | None]
) -> np.ndarray:
    """:func:`mark_superseded` on arrays: True where a later attempt redid the step."""
    cutoff = attempt_cutoffs(attempt_starts)
    if len(cutoff) == 0 or all(c == np.inf for c in cutoff.values()):
        return np.zeros(len(steps), dtype=bool)
    known = np.array(sorted(cutoff), dtype=np.int64)
    limits = np.append(np.array([cutoff[a] for a in known.tolist()]), np.inf)
    at = np.searchsorted(known, attempts)
    at[(at < len(known)) & (known[np.minimum(at, len(known) - 1)] != attempts)] = len(known)
    return steps >= limits[at]


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
    attempts = points["attempt"].to_numpy()
    if _as_read(steps, attempts, attempt_starts):
        return points.reset_index(drop=True)
    live = points[~mark_superseded(points, attempt_starts)]
    keys = ["series_id", "step"] if "series_id" in live.columns else ["step"]
    live = live.drop_duplicates(subset=keys, keep="last")
    return live.sort_values(keys, kind="stable").reset_index(drop=True)


def _as_read(
    steps: np.ndarray, attempts: np.ndarray, attempt_starts: dict[int, int | None]
) -> bool:
    """Whether the points are already what a reader should see: one attempt, steps strictly
    increasing, and no later attempt that started (a restart supersedes the steps after
    its start in every series, also in one the new attempt has not logged yet)."""
    if not (bool(np.all(attempts == attempts[0])) and bool(np.all(steps[1:] > steps[:-1]))):
        return False
    first = int(attempts[0])
    return not any(a > first and start is not None for a, start in attempt_starts.items())


def live_order(points: dict[str, np.ndarray], attempt_starts: dict[int, int | None]) -> np.ndarray:
    """Positions of the points a reader should see (as :func:`latest_points`), in the order
    of a live run: by step, then series id.

    One stable sort by (step, series_id) puts a repeated step's points of a series side by
    side in the order they were written, so the last of each run of equal keys is the one
    that stays - no second sort or hash table over the points.

    >>> pts = {"series_id": np.array([1, 1, 2, 1, 1]), "step": np.array([0, 1, 0, 1, 2]),
    ...        "attempt": np.array([1, 1, 1, 2, 2])}
    >>> live_order(pts, {1: 0, 2: 1}).tolist()
    [0, 2, 3, 4]
    """
    steps, sids, attempts = points["step"], points["series_id"], points["attempt"]
    if len(steps) == 0 or _as_read(steps, attempts, attempt_starts):
        return np.arange(len(steps))
    keep = ~superseded_mask(steps, attempts, attempt_starts)
    if keep.all():
        order = np.lexsort((sids, steps))
    else:
        live = np.flatnonzero(keep)
        order = live[np.lexsort((sids[live], steps[live]))]
    s, i = steps[order], sids[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (s[1:] != s[:-1]) | (i[1:] != i[:-1])
    return order if last.all() else order[last]
