"""TensorBoard logdirs: import their scalars, or tail them for ``runwatch watch``.

Records are read with TensorBoard's own TFRecord reader (the one its event loader uses when
TensorFlow is absent, CRC checks included) and decoded with its ``Event`` proto; no hand
parser. Scalars are both kinds TensorBoard shows: the old ``simple_value`` and TF2 tensor
scalars (a one-element tensor of a tag whose plugin is ``scalars``). The tag is the metric
name, the event's step its step and its wall time its time. NaN and Inf are kept.

Runs: every directory holding event files is a run, named by its path relative to the
logdir ("/"-joined), or the logdir's own name for files at its top. A run's files are read in
the order of the creation time in their names, so a restarted writer's new file comes after
the old one (and its steps going back start a new attempt, as in the long-format import).

The import goes through the long-format importer's writer (``_Importer.chunk``): one
transaction for the whole logdir. A corrupt record (a CRC or proto that fails) is an error
naming the file and record, and nothing is written. A truncated tail -- the file ends inside
a record, as a file being written or cut short does -- is not: the complete records before
it are imported, and a warning names the file and the record (``summary.truncated``).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np
import pandas as pd
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub import errors as tf_errors
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow
from tensorboard.util import tensor_util

from runwatch.collectors.importer import ConfigMerge, ImportSummary, _Importer, _merge
from runwatch.store import Store

log = logging.getLogger("runwatch.collectors.tensorboard")

EVENT_FILE_MARK = "tfevents"
"""Event files are named ``events.out.tfevents.<time>.<host>...``; TensorBoard's own test."""
_CHUNK_RECORDS = 200_000
_CREATED = re.compile(r"tfevents\.(\d+)")


class TensorBoardError(ValueError):
    """An event file that cannot be read, with the file and the 1-based record at fault
    (None when the problem is the logdir as a whole)."""

    def __init__(self, path: str | Path, record: int | None, message: str) -> None:
        self.path = str(path)
        self.record = record
        self.message = message
        where = self.path if record is None else f"{self.path}: record {record}"
        super().__init__(f"{where}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.record, self.message))


@dataclass
class LogdirSummary(ImportSummary):
    """:class:`ImportSummary`, plus a line per event file whose truncated tail was left."""

    truncated: list[str] = field(default_factory=list)


class Scalar(NamedTuple):
    """One scalar read from an event file: its run, step, tag, value and wall time."""

    run: str
    step: int
    tag: str
    value: float
    time: float


# -- finding files ---------------------------------------------------------------------------
def is_event_file(name: str) -> bool:
    return EVENT_FILE_MARK in name and not name.endswith((".tmp", ".lock"))


def event_files(logdir: Path) -> list[tuple[str, Path]]:
    """Every event file under ``logdir`` as (run, path), runs in name order and each run's
    files in the order they were created."""
    found: list[tuple[str, int, str, Path]] = []
    top = logdir.resolve().name or str(logdir)
    for folder, dirs, files in os.walk(logdir):
        dirs.sort()
        rel = Path(folder).relative_to(logdir)
        run = top if rel == Path(".") else "/".join(rel.parts)
        for name in files:
            if is_event_file(name):
                made = _CREATED.search(name)
                found.append((run, int(made.group(1)) if made else 0, name, Path(folder) / name))
    found.sort(key=lambda f: f[:3])
    return [(run, path) for run, _, _, path in found]


# -- reading records -------------------------------------------------------------------------
class EventFile:
    """Complete records of one event file from a byte offset on, as it grows.

    TensorBoard's stub reader reads through its own ``GFile``, which cannot seek; it is
    given a plain file opened at ``offset`` instead (the reader only calls ``read``), so a
    watcher resumes where it stopped without reading the file again. ``offset`` is always
    the end of the last complete record, ``records`` the count of records before it.
    """

    def __init__(self, path: Path, offset: int = 0, records: int = 0) -> None:
        self.path = path
        self.records = records
        self.partial = False  # the file ends inside a record (for now)
        self._fh: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._fh.seek(offset)
        self._reader = pywrap_tensorflow.PyRecordReader_New(os.fsencode(path), 0, b"", None)
        self._reader.file_handle = self._fh
        self._plugins: dict[str, str] = {}  # tag -> plugin, from the first metadata seen

    @property
    def offset(self) -> int:
        """The end of the last complete record: the reader keeps the bytes of a record it
        could not finish in its buffer, and drops them once the record is whole."""
        return self._fh.tell() - len(self._reader._buffer)

    def close(self) -> None:
        self._fh.close()

    def events(self) -> Iterator[event_pb2.Event]:
        """Each complete record from the offset on, decoded; stops at the end of the file
        or inside a record that is not complete yet (``partial``)."""
        reader = self._reader
        self.partial = False
        while True:
            try:
                reader.GetNext()
            except tf_errors.OutOfRangeError:
                return
            except tf_errors.DataLossError as exc:
                if "truncated" in str(exc):
                    self.partial = True
                    return
                raise TensorBoardError(
                    self.path, self.records + 1, "corrupt record (its CRC check failed)"
                ) from None
            data = reader.record()
            try:
                event = event_pb2.Event.FromString(data)
            except Exception as exc:  # protobuf's DecodeError and its kin
                raise TensorBoardError(
                    self.path, self.records + 1, f"corrupt record (not an Event: {exc})"
                ) from None
            self.records += 1
            yield event

    def scalars(self, event: event_pb2.Event) -> Iterator[tuple[str, float]]:
        """The (tag, value) scalars of ``event``: ``simple_value``s, and one-element
        tensors of tags whose plugin is ``scalars`` (TF2 writes the plugin once)."""
        return self.scalars_of(event.summary.value)

    def scalars_of(self, summary_values: Iterable[Any]) -> Iterator[tuple[str, float]]:
        for value in summary_values:
            if value.HasField("metadata") and value.metadata.plugin_data.plugin_name:
                self._plugins[value.tag] = value.metadata.plugin_data.plugin_name
            kind = value.WhichOneof("value")
            if kind == "simple_value":
                yield value.tag, value.simple_value
            elif kind == "tensor" and self._plugins.get(value.tag) == "scalars":
                array = tensor_util.make_ndarray(value.tensor)
                if array.size == 1:
                    yield value.tag, float(array.reshape(-1)[0])


def _frame(run: str, steps: list[int], tags: list[str], values: list[float], times: list[float]):
    """A chunk in the long-format reader's columns, as the importer takes it."""
    n = len(steps)
    absent = pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))
    return pd.DataFrame(
        {
            "run": np.full(n, run, dtype=object),
            "step": np.array(steps, dtype=np.int64),
            "metric": np.array(tags, dtype=object),
            "value": np.array(values, dtype=np.float64),
            "time": np.array(times, dtype=np.float64),
            "rank": absent,
            "host": np.full(n, None, dtype=object),
            "gpu": absent.copy(),
        }
    )


def _file_chunks(run: str, file: EventFile) -> Iterator[pd.DataFrame]:
    """The file's scalars in chunks; the loop is the import's hot path (one pass per
    record, the common ``simple_value`` first), so it does not go through ``scalars``."""
    steps: list[int] = []
    tags: list[str] = []
    values: list[float] = []
    times: list[float] = []
    skipped = 0
    for event in file.events():
        summary_values = event.summary.value
        if not summary_values:
            continue
        step = event.step
        if step < 0:
            skipped += len(summary_values)
            continue
        for value in summary_values:
            if value.WhichOneof("value") == "simple_value":
                tag, number = value.tag, value.simple_value
            else:
                found = list(file.scalars_of([value]))
                if not found:
                    continue
                ((tag, number),) = found
            steps.append(step)
            tags.append(tag)
            values.append(number)
            times.append(event.wall_time)
        if len(steps) >= _CHUNK_RECORDS:
            yield _frame(run, steps, tags, values, times)
            steps, tags, values, times = [], [], [], []
    if steps:
        yield _frame(run, steps, tags, values, times)
    if skipped:
        log.warning("%s: %d scalars at negative steps were skipped", file.path, skipped)


def import_logdir(
    store: Store,
    logdir: str | Path,
    *,
    run_name: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    append: bool = False,
    config: Mapping[str, Any] | None = None,
    merge_config: ConfigMerge = _merge,
) -> LogdirSummary:
    """Import every event file under ``logdir`` into ``store`` in one transaction.

    Each directory of event files is a run (``run_name``: all into that one). A run the
    store has is refused unless ``append=True``. ``progress(bytes_read, total_bytes)`` is
    called after each chunk. Raises :class:`TensorBoardError` for a logdir without event
    files or a corrupt record (nothing written); a truncated tail is left and said (see the
    module docstring).
    """
    root = Path(logdir)
    if not root.is_dir():
        raise TensorBoardError(root, None, "not a directory")
    files = event_files(root)
    if not files:
        raise TensorBoardError(
            root, None, "no TensorBoard event files (events.out.tfevents.*) in it or below"
        )
    total = sum(path.stat().st_size for _, path in files)
    summary = LogdirSummary()
    importer = _Importer(store, root, append, summary, config, merge_config)
    done = 0
    offset = 0
    with store.transaction():
        for run, path in files:
            file = EventFile(path)
            try:
                for chunk in _file_chunks(run_name or run, file):
                    importer.chunk(chunk, [], offset)
                    offset += len(chunk)
                    if progress is not None:
                        progress(done + file.offset, total)
            finally:
                file.close()
            if file.partial:
                note = (
                    f"{path}: record {file.records + 1} is truncated (the file ends inside "
                    f"it); the {file.records} complete records before it were imported"
                )
                summary.truncated.append(note)
                log.warning("%s", note)
            importer.run(run_name or run)  # a file without scalars still makes its run
            done += path.stat().st_size
            if progress is not None:
                progress(done, total)
        for stored in importer.runs.values():
            stored.date(store)
    return summary


# -- watching --------------------------------------------------------------------------------
class TensorBoardSource:
    """The scalars appended to a logdir since the last :meth:`read_new`, for watching.

    New event files and new run directories are picked up at each call. The position (per
    file: the end of its last complete record) is :meth:`state`, plain JSON, and
    :meth:`restore` continues from it, so a watcher restarted from its saved state neither
    loses nor repeats a scalar. A file found shorter than its saved position was replaced:
    it is read again from the start, with a warning.
    """

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        self.logdir = Path(logdir)
        self._files: dict[str, EventFile] = {}
        self._saved: dict[str, dict[str, int]] = {}  # restored positions not opened yet
        self._broken: set[str] = set()

    def state(self) -> dict[str, Any]:
        files = dict(self._saved)
        for key, file in self._files.items():
            files[key] = {"offset": file.offset, "records": file.records}
        return {"logdir": str(self.logdir), "files": files}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.close()
        self._broken.clear()
        self._saved = {k: dict(v) for k, v in dict(state.get("files", {})).items()}

    def close(self) -> None:
        """Close the files; their positions stay in :meth:`state`."""
        for key, file in self._files.items():
            self._saved[key] = {"offset": file.offset, "records": file.records}
            file.close()
        self._files.clear()

    def read_new(self) -> list[Scalar]:
        """Every scalar appended since the last call, file by file in creation order."""
        if not self.logdir.is_dir():
            return []
        out: list[Scalar] = []
        for run, path in event_files(self.logdir):
            key = path.relative_to(self.logdir).as_posix()
            if key in self._broken:
                continue
            file = self._files.get(key) or self._open(key, path)
            if file is None:
                continue
            try:
                for event in file.events():
                    if event.HasField("summary") and event.step >= 0:
                        for tag, value in file.scalars(event):
                            out.append(Scalar(run, event.step, tag, value, event.wall_time))
            except TensorBoardError as exc:
                log.error("%s; the rest of this file is not read", exc)
                self._broken.add(key)
        return out

    def _open(self, key: str, path: Path) -> EventFile | None:
        saved = self._saved.pop(key, None)
        offset, records = (saved["offset"], saved["records"]) if saved else (0, 0)
        try:
            size = path.stat().st_size
            if offset > size:
                log.warning(
                    "%s is shorter than where the watcher stopped (%d bytes < %d): "
                    "it was replaced; reading it from the start",
                    path,
                    size,
                    offset,
                )
                offset, records = 0, 0
            file = self._files[key] = EventFile(path, offset, records)
        except OSError as exc:  # removed between the listing and the open
            log.warning("cannot open %s: %s", path, exc)
            return None
        return file
