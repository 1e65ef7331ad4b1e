"""Load a long-format file (CSV/JSONL) into the store, all or nothing.

The whole file is imported in one store transaction: a malformed line anywhere (reported by
:class:`~runwatch.collectors.longformat.LongFormatError` with its line number) rolls back
everything, so a store never holds half a file. Points keep the file's order; reads sort by
step and keep the last value of a repeated step, which is what a re-logged step means.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from runwatch.collectors.longformat import LongFormatReader
from runwatch.model import LABEL_KEYS, label_value
from runwatch.store import Store, StoreError

log = logging.getLogger("runwatch.collectors.importer")


class RunAlreadyStoredError(StoreError):
    """The file names a run the store already has, and appending was not asked for."""


@dataclass
class ImportSummary:
    """What an import wrote: points and series per run."""

    points: dict[str, int] = field(default_factory=dict)
    series: dict[str, set[tuple[object, ...]]] = field(default_factory=dict)


def import_long_format(
    store: Store,
    path: str | Path,
    *,
    fmt: str | None = None,
    run_name: str | None = None,
    append: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> ImportSummary:
    """Import ``path`` into ``store``; ``run_name`` puts every row in that run.

    ``progress(bytes_read, total_bytes)`` is called after each chunk. A run that exists is
    refused unless ``append=True``, which adds the file as a new attempt of that run.
    """
    reader = LongFormatReader(path, fmt=fmt)
    summary = ImportSummary()
    runs: dict[str, tuple[int, int]] = {}
    with store.transaction():
        for chunk in reader:
            if run_name is not None:
                chunk = chunk.assign(run=run_name)
            _write_chunk(store, chunk, runs, summary, append)
            if progress is not None:
                progress(reader.bytes_read, reader.total_bytes)
        for run_id, _ in runs.values():
            store.set_run_status(run_id, "finished")
    return summary


def _write_chunk(
    store: Store,
    chunk: pd.DataFrame,
    runs: dict[str, tuple[int, int]],
    summary: ImportSummary,
    append: bool,
) -> None:
    keys = ["run", "metric", *LABEL_KEYS]
    for key, group in chunk.groupby(keys, sort=False, dropna=False):
        name, metric = str(key[0]), str(key[1])
        labels = {k: label_value(v) for k, v in zip(LABEL_KEYS, key[2:], strict=True)}
        if name not in runs:
            runs[name] = _open_run(store, name, append)
        run_id, attempt = runs[name]
        series_id = store.series_id(run_id, metric, labels)
        arrays = (
            group["step"].to_numpy(dtype=np.int64),
            group["time"].to_numpy(dtype=np.float64),
            group["value"].to_numpy(dtype=np.float64),
        )
        store.write(run_id, attempt, {series_id: arrays})
        summary.points[name] = summary.points.get(name, 0) + len(group)
        summary.series.setdefault(name, set()).add((metric, *labels.values()))


def _open_run(store: Store, name: str, append: bool) -> tuple[int, int]:
    exists = name in set(store.runs()["name"])
    if exists and not append:
        raise RunAlreadyStoredError(
            f"{store.path} already has a run named {name!r}; pass --append to add this file "
            "as a new attempt of it, or --run NAME to import under another name"
        )
    return store.start_run(name, resume=True if exists else None)
