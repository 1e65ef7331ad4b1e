"""Load a long-format file (CSV/JSONL) into the store, all or nothing.

The whole file is imported in one store transaction: a malformed line anywhere (reported by
:class:`~runwatch.collectors.longformat.LongFormatError` with its line number) rolls back
everything, so a store never holds half a file. Points keep the file's order; reads sort by
step and keep the last value of a repeated step, which is what a re-logged step means.

Attempts, as in the hook: a series (metric and labels) whose step goes back starts the next
attempt of its run, or joins it when another series already started it (so every series of a
restart lands in one attempt, and a file written metric by metric is read as one attempt).
A series first seen later joins the latest attempt. A step context row goes back when its
step is below the highest step its rank has reached in its attempt; a run-wide one (no
rank) in a file whose points have ranks, when it is below the step of every rank in the
latest attempt (so a row written just before the restarted ranks' points starts their
attempt, and ranks a step apart do not). Events and contexts belong to the attempt their
rank is in at their place in the file. ``--append`` makes the
file's first attempt a new attempt of the stored run.

Times, when the file has them: an attempt starts at its earliest point, event or context row
(the store's start, resume and restart events move with it), a new run at its first
attempt's start, and the run ends at the file's latest time. Without times, the import's
clock stands in, as before. Either way it is the import's one transaction.

Step context rows merge into the context in force for their run and rank (a null value
removes a key) and are stored when the merged context changes, as the hook does.

A ``config`` given to the import becomes the config of every run the file creates, and is
merged into the stored config of a run it appends to, in the same transaction: a failed
import changes no config either.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from runwatch.collectors.longformat import (
    ContextRow,
    EventRow,
    LongFormatError,
    LongFormatReader,
    Record,
)
from runwatch.model import LABEL_KEYS, Event, label_value
from runwatch.store import Store, StoreError
from runwatch.store.context import MAX_CONTEXT_KEYS, StepContext

log = logging.getLogger("runwatch.collectors.importer")

_KEYS = ["run", "metric", *LABEL_KEYS]


class RunAlreadyStoredError(StoreError):
    """The file names a run the store already has, and appending was not asked for."""


@dataclass
class ImportSummary:
    """What an import wrote, per run: points, series, events, context rows, restarts."""

    points: dict[str, int] = field(default_factory=dict)
    series: dict[str, set[tuple[object, ...]]] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    contexts: dict[str, int] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)


class _Series:
    """Where a series is: the index of its attempt in ``_Run.attempts``, its last step."""

    __slots__ = ("attempt", "last", "rank", "run", "sid")

    def __init__(self, run: _Run, sid: int, rank: Any) -> None:
        self.run = run
        self.sid = sid
        self.rank = rank
        self.attempt = len(run.attempts) - 1
        self.last: int | None = None


class _Run:
    """One run of the file: its attempts (made by this import), series and ranks."""

    def __init__(self, name: str, run_id: int, attempt: int) -> None:
        self.name = name
        self.run_id = run_id
        self.attempts = [attempt]
        self.ranks: dict[Any, list[int]] = {}  # rank -> [attempt index, highest step]
        self.ranked = False  # whether some series of the run has a rank
        self.context: dict[Any, dict[str, Any]] = {}  # rank -> context in force
        self.kept: dict[Any, tuple[int, dict[str, Any]]] = {}  # rank -> last row stored
        self.first: dict[int, float] = {}  # attempt index -> earliest time of its rows
        self.latest: float | None = None  # latest time of any row of the run

    def saw(self, attempt: int, earliest: float, latest: float) -> None:
        """Rows of attempt index ``attempt`` timed from ``earliest`` to ``latest``."""
        if earliest < self.first.get(attempt, math.inf):
            self.first[attempt] = earliest
        if self.latest is None or latest > self.latest:
            self.latest = latest

    def date(self, store: Store) -> None:
        """Give the run's attempts (and so the run) the start times the file's rows tell,
        seal its newest points, and mark it finished at its latest time (the import's clock
        when untimed)."""
        for index, start in sorted(self.first.items()):
            store.set_attempt_start(self.run_id, self.attempts[index], start)
        store.seal_open_blocks(self.run_id)
        store.set_run_status(self.run_id, "finished", now=self.latest)

    def reached(self, rank: Any, attempt: int, step: int) -> None:
        """A point or context of ``rank`` at ``step`` in attempt index ``attempt``."""
        high = self.ranks.get(rank)
        if high is None or attempt > high[0]:
            self.ranks[rank] = [attempt, step]
        elif attempt == high[0] and step > high[1]:
            high[1] = step


ConfigMerge = Callable[[dict[str, Any], Mapping[str, Any]], dict[str, Any]]
"""(stored config, given config) -> the config to store; may raise ValueError to refuse."""


def _merge(stored: dict[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    return {**stored, **given}


class _Importer:
    def __init__(
        self,
        store: Store,
        path: Path,
        append: bool,
        summary: ImportSummary,
        config: Mapping[str, Any] | None = None,
        merge_config: ConfigMerge = _merge,
    ) -> None:
        self.store = store
        self.path = path
        self.append = append
        self.summary = summary
        self.config = dict(config or {})
        self.merge_config = merge_config
        self.runs: dict[str, _Run] = {}
        self.series: dict[tuple[Any, ...], _Series] = {}
        self.now = time.time()

    # -- runs and attempts -----------------------------------------------------------------
    def run(self, name: str) -> _Run:
        found = self.runs.get(name)
        if found is None:
            stored = self.store.runs().set_index("name")["config"]
            exists = name in stored.index
            if exists and not self.append:
                raise RunAlreadyStoredError(
                    f"{self.store.path} already has a run named {name!r}; pass --append to add "
                    "this file as a new attempt of it, or --run NAME to import under another "
                    "name"
                )
            config = self.config
            if exists and config:
                try:
                    config = self.merge_config(_stored_config(stored[name]), config)
                except ValueError as exc:
                    raise ValueError(f"run {name!r}: {exc}") from exc
            run_id, attempt = self.store.start_run(
                name, config=config, resume=True if exists else None
            )
            found = self.runs[name] = _Run(name, run_id, attempt)
            self.summary.points.setdefault(name, 0)
            self.summary.series.setdefault(name, set())
        return found

    def after(self, run: _Run, attempt: int, step: int, what: str) -> int:
        """The attempt index after ``attempt``: a restart at ``step``, made on first need."""
        if attempt + 1 < len(run.attempts):
            return attempt + 1
        message = f"{what} went back to step {step} in {self.path.name}: new attempt (restart)"
        run.attempts.append(self.store.begin_attempt(run.run_id, step, "restart", message=message))
        self.summary.restarts[run.name] = self.summary.restarts.get(run.name, 0) + 1
        return len(run.attempts) - 1

    # -- points ----------------------------------------------------------------------------
    def chunk(self, chunk: pd.DataFrame, records: list[Record], offset: int) -> None:
        """Write one chunk of points and the records read with it (``offset``: the points
        before the chunk in the file)."""
        n = len(chunk)
        codes = np.zeros(n, dtype=np.int64)
        states: list[_Series] = []
        if n:
            grouped = chunk.groupby(_KEYS, sort=False, dropna=False)
            codes = grouped.ngroup().to_numpy()
            _, firsts = np.unique(codes, return_index=True)
            for first in firsts.tolist():
                row = chunk.iloc[first]
                states.append(self._series(row))
        steps = chunk["step"].to_numpy(dtype=np.int64)
        by_series = _split_by_code(codes, steps, len(states))
        if not records and not self._goes_back(by_series, states):
            attempts = np.array([s.attempt for s in states], dtype=np.int64)[codes]
            for state, mine in zip(states, by_series, strict=True):
                state.last = int(mine[-1])
                state.run.reached(state.rank, state.attempt, int(mine.max()))
        else:
            attempts = self._in_file_order(codes, steps, states, records, offset)
        self._write(chunk, codes, attempts, states)

    def _series(self, row: pd.Series) -> _Series:
        labels = {k: label_value(row[k]) for k in LABEL_KEYS}
        key = (str(row["run"]), str(row["metric"]), *labels.values())
        state = self.series.get(key)
        if state is None:
            run = self.run(key[0])
            sid = self.store.series_id(run.run_id, key[1], labels)
            state = self.series[key] = _Series(run, sid, labels["rank"])
            run.ranked = run.ranked or labels["rank"] is not None
            self.summary.series[run.name].add(key[1:])
        return state

    @staticmethod
    def _goes_back(by_series: list[np.ndarray], states: list[_Series]) -> bool:
        """Whether any series' step goes back in this chunk (then rows go one by one)."""
        for state, mine in zip(states, by_series, strict=True):
            if state.last is not None and mine[0] < state.last:
                return True
            if len(mine) > 1 and (mine[1:] < mine[:-1]).any():
                return True
        return False

    def _in_file_order(
        self,
        codes: np.ndarray,
        steps: np.ndarray,
        states: list[_Series],
        records: list[Record],
        offset: int,
    ) -> np.ndarray:
        """Each row's attempt index, taking rows and records one by one in file order."""
        attempts = np.empty(len(codes), dtype=np.int64)
        pending = iter(records)
        record = next(pending, None)
        for i, (code, step) in enumerate(zip(codes.tolist(), steps.tolist(), strict=True)):
            while record is not None and record.before <= offset + i:
                self.record(record)
                record = next(pending, None)
            state = states[code]
            if state.last is None:  # first seen here: the latest attempt at this line
                state.attempt = len(state.run.attempts) - 1
            elif step < state.last:
                state.attempt = self.after(state.run, state.attempt, step, "the step")
            state.last = step
            attempts[i] = state.attempt
            state.run.reached(state.rank, state.attempt, step)
        while record is not None:
            self.record(record)
            record = next(pending, None)
        return attempts

    def _write(
        self, chunk: pd.DataFrame, codes: np.ndarray, attempts: np.ndarray, states: list[_Series]
    ) -> None:
        if not len(chunk):
            return
        times = chunk["time"].to_numpy(dtype=np.float64)
        values = chunk["value"].to_numpy(dtype=np.float64)
        steps = chunk["step"].to_numpy(dtype=np.int64)
        # One write per (series, attempt), rows in file order within it.
        order = np.lexsort((np.arange(len(codes)), attempts, codes))
        keys = codes[order] * (attempts.max() + 1) + attempts[order]
        cuts = np.flatnonzero(np.diff(keys)) + 1
        for part in np.split(order, cuts):
            state = states[codes[part[0]]]
            run = state.run
            arrays = (steps[part], times[part], values[part])
            self.store.write(run.run_id, run.attempts[attempts[part[0]]], {state.sid: arrays})
            timed = arrays[1][np.isfinite(arrays[1])]
            if timed.size:
                run.saw(int(attempts[part[0]]), float(timed.min()), float(timed.max()))
            self.summary.points[run.name] += len(part)

    # -- events and step context ------------------------------------------------------------
    def record(self, record: Record) -> None:
        run = self.run(record.run)
        if isinstance(record, EventRow):
            high = run.ranks.get(record.rank)
            if record.rank is None and run.ranked:  # run-wide: where the ranks have got to
                ranked = [a for rank, (a, _) in run.ranks.items() if rank is not None]
                attempt = max(ranked, default=len(run.attempts) - 1)
            else:
                attempt = len(run.attempts) - 1 if high is None else high[0]
            event = Event(
                record.kind,
                record.step,
                self.now if record.time is None else record.time,
                record.message,
                record.rank,
                record.host,
                record.attrs,
            )
            self.store.add_events(run.run_id, run.attempts[attempt], [event])
            if record.time is not None:
                run.saw(attempt, record.time, record.time)
            self.summary.events[run.name] = self.summary.events.get(run.name, 0) + 1
            return
        self._context(run, record)

    def _run_wide(self, run: _Run, row: ContextRow) -> int:
        """The attempt of a run-wide context row in a file whose points have ranks."""
        ranked = [high for rank, high in run.ranks.items() if rank is not None]
        if not ranked:
            return len(run.attempts) - 1
        latest = max(attempt for attempt, _ in ranked)
        lowest = min(step for attempt, step in ranked if attempt == latest)
        if row.step < lowest:
            return self.after(run, latest, row.step, "a run-wide step context")
        return latest

    def _context(self, run: _Run, row: ContextRow) -> None:
        high = run.ranks.get(row.rank)
        if row.rank is None and run.ranked:
            attempt = self._run_wide(run, row)
        elif high is None:
            attempt = len(run.attempts) - 1
        elif row.step < high[1]:
            attempt = self.after(run, high[0], row.step, "a step context")
        else:
            attempt = high[0]
        run.reached(row.rank, attempt, row.step)
        if row.time is not None:
            run.saw(attempt, row.time, row.time)
        context = run.context.setdefault(row.rank, {})
        for key, value in row.context.items():
            if value is None:
                context.pop(key, None)
            else:
                context[key] = value
        if len(context) > MAX_CONTEXT_KEYS:
            raise LongFormatError(
                self.path,
                row.line,
                f"the step context of run {run.name!r} would hold {len(context)} keys, more "
                f"than the {MAX_CONTEXT_KEYS} it may",
                "context",
            )
        kept = run.kept.get(row.rank)
        if kept is not None and kept == (attempt, context):
            return
        stored = dict(context)
        run.kept[row.rank] = (attempt, stored)
        self.store.add_context(
            run.run_id, run.attempts[attempt], [StepContext(row.step, row.rank, row.time, stored)]
        )
        self.summary.contexts[run.name] = self.summary.contexts.get(run.name, 0) + 1


def _stored_config(raw: str | None) -> dict[str, Any]:
    """A stored run's config JSON as a dict ({} when empty or not an object)."""
    try:
        parsed = json.loads(raw or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _split_by_code(codes: np.ndarray, steps: np.ndarray, n: int) -> list[np.ndarray]:
    """Each series' steps (``codes`` numbers the series), in file order."""
    if n <= 1:
        return [steps] if n else []
    order = np.argsort(codes, kind="stable")
    return np.split(steps[order], np.cumsum(np.bincount(codes, minlength=n))[:-1])


def import_long_format(
    store: Store,
    path: str | Path,
    *,
    fmt: str | None = None,
    run_name: str | None = None,
    append: bool = False,
    progress: Callable[[int, int], None] | None = None,
    config: Mapping[str, Any] | None = None,
    merge_config: ConfigMerge = _merge,
) -> ImportSummary:
    """Import ``path`` into ``store``; ``run_name`` puts every row in that run.

    ``progress(bytes_read, total_bytes)`` is called after each chunk. A run that exists is
    refused unless ``append=True``, which adds the file as a new attempt of that run.
    JSONL events and step contexts are stored with the points (see the module docstring).
    ``config`` (checked by the caller) is every new run's config; for a run appended to,
    ``merge_config(stored, config)`` is its new one (default: ``config``'s keys win).
    """
    reader = LongFormatReader(path, fmt=fmt)
    summary = ImportSummary()
    importer = _Importer(store, Path(path), append, summary, config, merge_config)
    offset = 0
    with store.transaction():
        for chunk, records in reader.items():
            if run_name is not None:
                chunk = chunk.assign(run=run_name)
                records = [dataclasses.replace(r, run=run_name) for r in records]
            importer.chunk(chunk, records, offset)
            offset += len(chunk)
            if progress is not None:
                progress(reader.bytes_read, reader.total_bytes)
        for run in importer.runs.values():
            run.date(store)
    return summary
