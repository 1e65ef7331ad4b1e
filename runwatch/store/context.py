"""Step context: what a run was doing at each step (data shard, source, code version, ...).

A run logs its context with ``run.log(..., context={"shard": "s17"})`` or
``run.context(shard="s17")``; ``runwatch import`` reads it from JSONL rows. The store keeps
one row per change (schema v6, ``step_context``), per rank where the run has ranks (NULL
otherwise): a row holds the whole context in force from its step until the next row of the
same rank. Incidents use it to weigh causes (``detect/hypotheses.py``): how many steps each
value was in force (:meth:`ContextTables.context_exposure`) against the context at the steps
where something went wrong (:meth:`ContextTables.context_at`).

Reads see the run as a reader of its points does (the latest attempt wins): a row of an
attempt that a later attempt redid (a restart from an earlier step) is left out, so the
context after a restart is the restarted process's.
"""

from __future__ import annotations

import bisect
import json
import math
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from runwatch.store.points import superseded_mask

if TYPE_CHECKING:
    import pandas as pd  # imported where frames are built: the hook's writes need none

ContextValue = str | int | float | bool

MAX_CONTEXT_KEY = 200
MAX_CONTEXT_TEXT = 1000
"""The longest key and str value a step context may hold (a shard name, a path, a commit)."""
MAX_CONTEXT_KEYS = 100
"""The most keys a step context may hold (a server refuses a batch with more)."""
# One encoder: json.dumps with any option builds a new one per call, 5x the cost of encoding.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class StepContext(NamedTuple):
    """One change of a run's step context: from ``step`` on, on ``rank`` (None: no rank),
    ``context`` is in force (the whole context, not the keys that changed)."""

    step: int
    rank: int | None
    time: float | None
    context: Mapping[str, ContextValue]


def context_problem(key: object, value: object) -> str | None:
    """Why ``key: value`` cannot be in a step context, or None when it can (a None value
    removes the key). The hook refuses and counts such a key; ``runwatch import`` stops.

    >>> context_problem("shard", "s17") is None, context_problem("epoch", None) is None
    (True, True)
    >>> context_problem("shard", [1, 2])
    'value is a list, not a str, int, float or bool'
    """
    if not isinstance(key, str):
        return f"key is a {type(key).__name__}, not a str"
    if not key.strip():
        return "key is empty"
    if len(key) > MAX_CONTEXT_KEY or _CONTROL.search(key):
        return f"key is longer than {MAX_CONTEXT_KEY} characters or has a control character"
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "value is not a finite number"
    if isinstance(value, str):
        if len(value) > MAX_CONTEXT_TEXT:
            return f"value is {len(value)} characters long (at most {MAX_CONTEXT_TEXT})"
        return None
    return f"value is a {type(value).__name__}, not a str, int, float or bool"


def context_json(context: Mapping[str, Any]) -> str:
    """The stored form of a context: compact JSON with sorted keys.

    >>> context_json({"shard": "s17", "epoch": 2})
    '{"epoch":2,"shard":"s17"}'
    """
    return _ENCODER.encode(dict(context))


class ContextTables:
    """Mixin for :class:`runwatch.store.sqlite.Store`: the ``step_context`` table."""

    _conn: sqlite3.Connection

    def add_context(self, run_id: int, attempt: int | None, rows: Iterable[StepContext]) -> None:
        """Store context changes of one attempt (in one transaction, or the caller's)."""
        records = [
            (run_id, attempt, r.rank, int(r.step), r.time, context_json(r.context)) for r in rows
        ]
        if not records:
            return
        with self.transaction() as conn:  # type: ignore[attr-defined]
            conn.executemany(
                "INSERT INTO step_context (run_id, attempt, rank, step, time, context) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                records,
            )

    def contexts(self, run: str | int) -> pd.DataFrame:
        """Every stored context row of a run, by step: step, attempt, rank, time, context
        (a dict). All attempts, superseded rows included (see the module docstring)."""
        import pandas as pd

        rows = self._context_rows(self._resolve(run))  # type: ignore[attr-defined]
        return pd.DataFrame(
            {
                "step": np.array([r[0] for r in rows], dtype=np.int64),
                "attempt": pd.array([r[1] for r in rows], dtype="Int64"),
                "rank": pd.array([r[2] for r in rows], dtype="Int64"),
                "time": np.array([np.nan if r[3] is None else r[3] for r in rows], dtype=float),
                "context": pd.Series([json.loads(r[4]) for r in rows], dtype=object),
            }
        )

    def context_exposure(self, run: str | int) -> dict[str, dict[Any, int]]:
        """For each context key, the steps spent under each of its values.

        A row holds from its step until the next row of the same rank, or to the run's last
        step (inclusive). Steps are counted per rank and summed, so on a run of 8 ranks a
        value read by all of them for 100 steps counts 800: shares of this are shares of
        the rank-steps where an occurrence could have happened. A key missing from a row
        counts for none of its values there.
        """
        run_id = self._resolve(run)  # type: ignore[attr-defined]
        by_rank = self._live_contexts(run_id)
        with self._lock:  # type: ignore[attr-defined]
            (last,) = self._conn.execute(
                "SELECT last_step FROM runs WHERE id = ?", (run_id,)
            ).fetchone()
        exposure: dict[str, dict[Any, int]] = {}
        for steps, contexts in by_rank.values():
            end = max(int(last) if last is not None else steps[-1], steps[-1])
            for i, context in enumerate(contexts):
                until = steps[i + 1] if i + 1 < len(steps) else end + 1
                span = until - steps[i]
                if span <= 0:
                    continue
                for key, value in context.items():
                    counts = exposure.setdefault(key, {})
                    counts[value] = counts.get(value, 0) + span
        return exposure

    def context_at(
        self, run: str | int, steps: Sequence[int | None], ranks: Sequence[int | None]
    ) -> list[dict[str, Any]]:
        """The context in force at each ``(step, rank)`` ({} before the first row, or for a
        step of None). A rank without rows of its own, or None, reads the run-wide (rank
        NULL) rows, else the lowest rank's (rank 0 logs the run-level context, as it logs
        the run-level metrics)."""
        if len(steps) != len(ranks):
            raise ValueError(f"steps and ranks differ in length ({len(steps)}, {len(ranks)})")
        by_rank = self._live_contexts(self._resolve(run))  # type: ignore[attr-defined]
        fallback = None if None in by_rank else min(by_rank, default=None)  # type: ignore[type-var]
        out: list[dict[str, Any]] = []
        for step, rank in zip(steps, ranks, strict=True):
            key = rank if rank in by_rank else (None if None in by_rank else fallback)
            if step is None or key not in by_rank:
                out.append({})
                continue
            row_steps, contexts = by_rank[key]
            i = bisect.bisect_right(row_steps, int(step)) - 1
            out.append(dict(contexts[i]) if i >= 0 else {})
        return out

    # -- helpers ---------------------------------------------------------------------------
    def _context_rows(self, run_id: int) -> list[tuple[Any, ...]]:
        with self._lock:  # type: ignore[attr-defined]
            return self._conn.execute(
                "SELECT step, attempt, rank, time, context FROM step_context WHERE run_id = ? "
                "ORDER BY step, rowid",
                (run_id,),
            ).fetchall()

    def _live_contexts(
        self, run_id: int
    ) -> dict[int | None, tuple[list[int], list[dict[str, Any]]]]:
        """Per rank, the rows a reader should see (latest attempt wins) as (steps, contexts)
        sorted by step; of rows at one step, the last written."""
        rows = self._context_rows(run_id)
        if not rows:
            return {}
        with self._lock:  # type: ignore[attr-defined]
            starts = self._attempt_starts(run_id)  # type: ignore[attr-defined]
        steps = np.array([r[0] for r in rows], dtype=np.int64)
        attempts = np.array([0 if r[1] is None else r[1] for r in rows], dtype=np.int64)
        gone = superseded_mask(steps, attempts, starts)
        # Rows come by step then insertion; an older attempt's row at the same step as a
        # newer one's is written first, so "last written" is the newer attempt's.
        order = sorted(
            (i for i in range(len(rows)) if not gone[i]),
            key=lambda i: (rows[i][0], rows[i][1] or 0),
        )
        out: dict[int | None, tuple[list[int], list[dict[str, Any]]]] = {}
        for i in order:
            step, _, rank, _, text = rows[i]
            row_steps, contexts = out.setdefault(rank, ([], []))
            if row_steps and row_steps[-1] == step:
                contexts[-1] = json.loads(text)
            else:
                row_steps.append(int(step))
                contexts.append(json.loads(text))
        return out
