"""Wide CSV: one step column and one column per metric, as W&B, MLflow, Aim and pandas export.

``step`` (or ``_step``, ``global_step``, ``iteration``, any case) names the step; every other
column is a metric, and a blank cell means "not logged at this step" (``nan``/``inf`` are
values, as in the long format). W&B's bookkeeping columns are handled: ``_timestamp`` (or
``timestamp``/``time``; milliseconds are recognised) becomes the points' time, ``_runtime``
and W&B's ``__MIN``/``__MAX`` sampling bounds are dropped, ``epoch`` is kept as a metric.

The file is parsed by pyarrow's C reader in one go and written one series per metric through
the store's bulk ``write``, inside the long-format importer's run handling (``--append``,
config, attempt dating) and one transaction. Bad input (a non-numeric cell, a blank or
fractional step, a duplicate step) is a :class:`WideFormatError` with line and column, raised
before anything is written. A step that goes back without repeating one starts a new attempt.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pandas as pd

from runwatch.collectors.importer import ConfigMerge, ImportSummary, _Importer, _merge
from runwatch.collectors.longformat import LongFormatError, total_bytes
from runwatch.model import LABEL_KEYS
from runwatch.store import Store

log = logging.getLogger("runwatch.collectors.wide")

STEP_COLUMNS: tuple[str, ...] = ("step", "_step", "global_step", "iteration")
TIME_COLUMNS: tuple[str, ...] = ("_timestamp", "timestamp", "time")
DROPPED_COLUMNS: tuple[str, ...] = ("_runtime", "_wandb")
_LONG_COLUMNS = {"metric", "value"}
_NAN_TEXT = {"nan", "-nan", "+nan", "inf", "+inf", "-inf", "infinity", "-infinity", "+infinity"}


class WideFormatError(LongFormatError):
    """A wide CSV that cannot be imported: ``path:line: column 'c': why``."""


def read_header(path: str | Path) -> list[str]:
    """The column names of a CSV's first line (``[]`` for an empty file)."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return next(csv.reader(fh), [])


def step_column(header: list[str]) -> str | None:
    """The header's step column, by :data:`STEP_COLUMNS` priority, any case."""
    lowered = {name.strip().lower(): name for name in header}
    for candidate in STEP_COLUMNS:
        if candidate in lowered:
            return lowered[candidate]
    return None


def is_wide(path: str | Path) -> bool:
    """Whether a ``.csv`` is wide: no ``metric``/``value`` columns, but a step column."""
    if not str(path).lower().endswith(".csv"):
        return False
    header = read_header(path)
    names = {h.strip().lower() for h in header}
    return not (names >= _LONG_COLUMNS) and step_column(header) is not None


def _plan(header: list[str], path: Path) -> tuple[str, str | None, list[str]]:
    step = step_column(header)
    if step is None:
        raise WideFormatError(
            path, 1, f"no step column: the header needs one of {', '.join(STEP_COLUMNS)}"
        )
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise WideFormatError(path, 1, "the header repeats this column", name)
        seen.add(name)
    lowered = {h.strip().lower(): h for h in header}
    when = next((lowered[c] for c in TIME_COLUMNS if c in lowered and lowered[c] != step), None)
    metrics = [
        h
        for h in header
        if h not in (step, when)
        and h.strip().lower() not in DROPPED_COLUMNS
        and not h.endswith(("__MIN", "__MAX"))
        and h.strip()
    ]
    if not metrics:
        raise WideFormatError(path, 1, "no metric columns beside the step column")
    for name in metrics:
        if not any(c.isalnum() for c in name):
            raise WideFormatError(path, 1, "this column's name is only separators", name)
    return step, when, metrics


def _read(path: Path, header: list[str], numeric: list[str]) -> Any:
    """The file as a pyarrow Table, ``numeric`` columns as float64 (blank = null)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    convert = pcsv.ConvertOptions(
        column_types={name: pa.float64() for name in numeric},
        include_columns=numeric,
        null_values=[""],
        strings_can_be_null=True,
        quoted_strings_can_be_null=True,
    )
    try:
        return pcsv.read_csv(
            path, read_options=pcsv.ReadOptions(block_size=1 << 24), convert_options=convert
        )
    except pa.ArrowInvalid as exc:
        _explain(path, header, numeric, exc)


def _explain(path: Path, header: list[str], numeric: list[str], exc: Exception) -> NoReturn:
    """Find the cell pyarrow refused and raise a :class:`WideFormatError` naming it."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        next(reader, None)
        where = {name: header.index(name) for name in numeric}
        for row in reader:
            line = reader.line_num
            if len(row) != len(header):
                raise WideFormatError(
                    path, line, f"{len(row)} fields where the header has {len(header)}"
                )
            for name, i in where.items():
                text = row[i].strip()
                if not text:
                    continue
                try:
                    float(text)
                except ValueError:
                    raise WideFormatError(path, line, f"not a number: {row[i]!r}", name) from None
    raise WideFormatError(path, None, f"cannot be read as CSV: {exc}")


def _steps(table: Any, name: str, path: Path) -> np.ndarray:
    col = table.column(name)
    values = col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    nulls = np.asarray(col.is_null(), dtype=bool) if col.null_count else None
    bad = ~np.isfinite(values) | (values < 0) | (values != np.floor(values))
    if nulls is not None:
        bad |= nulls
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        shown = "blank" if nulls is not None and nulls[i] else repr(values[i])
        raise WideFormatError(
            path, i + 2, f"the step must be a non-negative integer, got {shown}", name
        )
    steps = values.astype(np.int64)
    dup = pd.Series(steps).duplicated(keep="first").to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        first = int(np.flatnonzero(steps == steps[i])[0])
        raise WideFormatError(
            path,
            i + 2,
            f"step {steps[i]} appears again (first at line {first + 2}); a wide file has one "
            "row per step",
            name,
        )
    return steps


def _times(table: Any, name: str | None, n: int) -> np.ndarray:
    if name is None:
        return np.full(n, np.nan)
    col = table.column(name)
    times = col.to_numpy(zero_copy_only=False).astype(np.float64, copy=True)
    if col.null_count:
        times[np.asarray(col.is_null(), dtype=bool)] = np.nan
    finite = times[np.isfinite(times)]
    if finite.size and np.median(finite) > 1e11:  # milliseconds since the epoch
        times /= 1000.0
    return times


def import_wide(
    store: Store,
    path: str | Path,
    *,
    run_name: str,
    append: bool = False,
    progress: Callable[[int, int], None] | None = None,
    config: Mapping[str, Any] | None = None,
    merge_config: ConfigMerge = _merge,
) -> ImportSummary:
    """Import a wide CSV into run ``run_name`` (see the module docstring); all or nothing."""
    path = Path(path)
    header = read_header(path)
    if not header:
        raise WideFormatError(path, None, "empty file: no header")
    step, when, metrics = _plan(header, path)
    numeric = [step, *([when] if when else []), *metrics]
    table = _read(path, header, numeric)
    size = total_bytes(path)
    if progress is not None:
        progress(size // 2, size)
    steps = _steps(table, step, path)
    times = _times(table, when, len(steps))
    cuts = (np.flatnonzero(np.diff(steps) < 0) + 1).tolist()
    bounds = list(zip([0, *cuts], [*cuts, len(steps)], strict=True))
    summary = ImportSummary()
    importer = _Importer(store, path, append, summary, config, merge_config)
    labels = dict.fromkeys(LABEL_KEYS)
    with store.transaction():
        run = importer.run(run_name)
        sids = {m: store.series_id(run.run_id, m, labels) for m in metrics}
        attempt = 0
        for index, (lo, hi) in enumerate(bounds):
            if index:
                attempt = importer.after(run, attempt, int(steps[lo]), "the step")
            part_steps, part_times = steps[lo:hi], times[lo:hi]
            points = {}
            for name in metrics:
                col = table.column(name).slice(lo, hi - lo)
                values = col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
                if col.null_count:
                    keep = ~np.asarray(col.is_null(), dtype=bool)
                    arrays = (part_steps[keep], part_times[keep], values[keep])
                else:
                    arrays = (part_steps, part_times, values)
                if len(arrays[0]):
                    points[sids[name]] = arrays
                    summary.points[run_name] += len(arrays[0])
                    summary.series[run_name].add((name, *labels.values()))
            if points:
                store.write(run.run_id, run.attempts[attempt], points)
            timed = part_times[np.isfinite(part_times)]
            if timed.size:
                run.saw(attempt, float(timed.min()), float(timed.max()))
        run.date(store)
    if progress is not None:
        progress(size, size)
    log.info("imported %s: %d points", path, summary.points[run_name])
    return summary
