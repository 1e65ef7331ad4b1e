"""The long format (docs/architecture.md, "Contracts"): streaming reader and writer, CSV or JSONL.

One row per point: ``run,step,metric,value`` required, ``time`` (Unix seconds), ``rank``,
``host``, ``gpu`` optional. It is what ``runwatch import`` reads and ``runwatch export``
writes, so two rules matter more than speed:

- ``nan``, ``inf`` and ``-inf`` (any case, also ``NaN``, ``Infinity``) are real values, because
  a NaN loss is the most important signal a run gives; an *empty* value is a malformed line.
- A malformed line is reported exactly: a :class:`LongFormatError` names the file, the physical
  line (1-based, counting the header), the column and what was wrong.

Chunks are yielded as they are read, so a caller that must write all or nothing (the import
command) wraps the whole read in one transaction.

A JSONL row may also be an event, ``{"run", "step", "event", "message", "time", "rank",
"host"}`` (``event`` one of :data:`runwatch.model.EVENT_KINDS`; ``step``, ``message``,
``time``, ``rank``, ``host`` optional), or a step context, ``{"run", "step", "context": {...}}``
(``time`` and ``rank`` optional; values str, int, float or bool, null removes a key), which
holds until it changes. They come out of :meth:`LongFormatReader.items` beside the points
(:class:`EventRow`, :class:`ContextRow`, each with its line and the number of points before it
in the file, so a caller can put them back in file order); plain iteration gives the points.

Every chunk is a DataFrame with the columns of :data:`COLUMNS`, in that order:

=========  ==========================================================
run        object (``str``)
step       int64, >= 0 (an integral float such as ``3.0`` is accepted)
metric     object (``str``)
value      float64, NaN and +-inf kept
time       float64, NaN when absent
rank       Int64 (nullable), >= 0
host       object: ``str``, or None when absent
gpu        Int64 (nullable), >= 0: the device *index*, as in NVML and
           the DCGM exporter's ``gpu`` label (not a UUID)
=========  ==========================================================

Speed: clean CSV goes through pandas' C parser a chunk at a time and is validated with
vectorised checks; only a chunk that fails them, or holds quoted fields, is re-read row by
row in Python to find and name the first bad line. JSONL is parsed one ``json.loads`` per
line.

>>> import io
>>> src = io.StringIO()
>>> frame = pd.DataFrame({"run": ["r"], "step": [7], "metric": ["loss"], "value": [float("nan")]})
>>> write_long_format([frame], src)
1
>>> print(src.getvalue(), end="")
run,step,metric,value,time,rank,host,gpu
r,7,loss,nan,,,,
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import math
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

import numpy as np
import pandas as pd

from runwatch.model import EVENT_KINDS
from runwatch.store.context import context_problem

log = logging.getLogger("runwatch.collectors.longformat")

REQUIRED_COLUMNS: tuple[str, ...] = ("run", "step", "metric", "value")
OPTIONAL_COLUMNS: tuple[str, ...] = ("time", "rank", "host", "gpu")
COLUMNS: tuple[str, ...] = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
FORMATS: tuple[str, ...] = ("csv", "jsonl")

_EXTENSIONS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
_INT64_MAX = 2**63 - 1
_GZIP_MAGIC = b"\x1f\x8b"
# The C parser reads "inf"/"Infinity" itself but "nan" only as an NA marker; variants not
# listed here still parse, on the slower row-by-row path.
_NAN_SPELLINGS = ["nan", "NaN", "NAN", "Nan", "-nan", "+nan", "-NaN", "+NaN"]


class LongFormatError(ValueError):
    """A long-format file that cannot be read, with where and why.

    ``line`` is the 1-based physical line (the header is line 1), or None when the problem is
    the file as a whole (an unknown format). ``column`` (alias ``field``) names the CSV column
    or JSON key at fault, when there is one.

    >>> str(LongFormatError("a.csv", 3, "step must be a non-negative integer, got '1.5'", "step"))
    "a.csv:3: column 'step': step must be a non-negative integer, got '1.5'"
    """

    def __init__(
        self, path: str | Path, line: int | None, message: str, column: str | None = None
    ) -> None:
        self.path = str(path)
        self.line = line
        self.message = message
        self.column = column
        where = self.path if line is None else f"{self.path}:{line}"
        what = f"column {column!r}: {message}" if column else message
        super().__init__(f"{where}: {what}")

    @property
    def field(self) -> str | None:
        """The JSON key at fault: the same as ``column``."""
        return self.column

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.line, self.message, self.column))


@dataclass(frozen=True)
class EventRow:
    """An event read from a JSONL line; ``before`` counts the point rows above it."""

    run: str
    step: int | None
    kind: str
    message: str
    time: float | None
    rank: int | None
    host: str | None
    attrs: dict[str, Any]
    line: int
    before: int


@dataclass(frozen=True)
class ContextRow:
    """A step context read from a JSONL line: ``context`` merges into the context in force
    from ``step`` on (a None value removes a key); ``before`` counts the point rows above it."""

    run: str
    step: int
    context: dict[str, Any]
    time: float | None
    rank: int | None
    line: int
    before: int


Record = EventRow | ContextRow


def detect_format(path: str | Path, fmt: str | None = None) -> str:
    """Return ``"csv"`` or ``"jsonl"`` from ``fmt`` if given, else from the file name.

    >>> detect_format("runs/a.jsonl.gz"), detect_format("x.data", fmt="CSV")
    ('jsonl', 'csv')
    """
    if fmt is not None:
        norm = fmt.lower().lstrip(".")
        norm = "jsonl" if norm == "ndjson" else norm
        if norm not in FORMATS:
            raise LongFormatError(
                path, None, f"unknown format {fmt!r}; valid formats: csv, jsonl (or ndjson)"
            )
        return norm
    name = Path(path).name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    found = _EXTENSIONS.get(Path(name).suffix)
    if found is None:
        raise LongFormatError(
            path,
            None,
            "unknown format: the file name does not end in .csv, .jsonl or .ndjson "
            "(optionally .gz); pass the format explicitly",
        )
    return found


def total_bytes(path: str | Path) -> int:
    """Size of ``path`` on disk: the total that :attr:`LongFormatReader.bytes_read` reaches."""
    return os.stat(path).st_size


class LongFormatReader(Iterator[pd.DataFrame]):
    """Iterate over validated chunks of a long-format file, and report progress in bytes.

    ``chunk_rows`` is a target: a chunk holds about that many rows. ``bytes_read`` counts
    bytes of the file on disk (compressed bytes for ``.gz``), so ``bytes_read / total_bytes``
    is a fair progress fraction for a progress bar. The file is opened at the first chunk and
    closed at the end, on error, or by :meth:`close` / ``with``.
    """

    def __init__(self, path: str | Path, fmt: str | None = None, chunk_rows: int = 100_000) -> None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.path = Path(path)
        self.fmt = detect_format(path, fmt)
        self.chunk_rows = chunk_rows
        self.total_bytes = total_bytes(path)  # also fails fast on a missing file
        self._raw: IO[bytes] | None = None
        self._rows = 0
        self._done = False
        self._gen = self._chunks()
        self.records: list[Record] = []
        """The events and step contexts read with the last chunk (JSONL only)."""

    @property
    def bytes_read(self) -> int:
        """Bytes of the file consumed so far (read-ahead included)."""
        if self._done:
            return self.total_bytes
        if self._raw is None or self._raw.closed:
            return 0
        return min(self._raw.tell(), self.total_bytes)

    @property
    def rows_read(self) -> int:
        """Rows yielded so far."""
        return self._rows

    def __iter__(self) -> LongFormatReader:
        return self

    def __next__(self) -> pd.DataFrame:
        chunk, self.records = next(self._gen)
        self._rows += len(chunk)
        return chunk

    def items(self) -> Iterator[tuple[pd.DataFrame, list[Record]]]:
        """Each chunk of points with the events and step contexts read with it, in file
        order: a record's ``before`` is the number of point rows above it in the file."""
        for chunk in self:
            yield chunk, self.records

    def close(self) -> None:
        """Close the file; further iteration stops."""
        self._gen.close()

    def __enter__(self) -> LongFormatReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _chunks(self) -> Iterator[tuple[pd.DataFrame, list[Record]]]:
        self._raw = open(self.path, "rb")  # noqa: SIM115 - closed in finally
        try:
            fh: IO[bytes] = self._raw
            if self._raw.read(2) == _GZIP_MAGIC:
                fh = gzip.GzipFile(fileobj=self._raw, mode="rb")
            self._raw.seek(0)
            if self.fmt == "csv":
                yield from ((chunk, []) for chunk in _read_csv(fh, self.path, self.chunk_rows))
            else:
                yield from _read_jsonl(fh, self.path, self.chunk_rows)
            self._done = True
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise LongFormatError(self.path, None, f"corrupt gzip file: {exc}") from None
        finally:
            self._raw.close()


def read_long_format(
    path: str | Path, fmt: str | None = None, chunk_rows: int = 100_000
) -> LongFormatReader:
    """Stream validated chunks of a long-format file (see the module docstring).

    Returns a :class:`LongFormatReader`: iterate it for DataFrames, read its ``bytes_read`` and
    ``total_bytes`` for progress. Raises :class:`LongFormatError` at the first malformed line.
    """
    return LongFormatReader(path, fmt=fmt, chunk_rows=chunk_rows)


# --------------------------------------------------------------------------- field parsing
# The row-by-row parsers: used for JSONL, and for CSV chunks that the fast path refused.
# They accept what pandas' C parser accepts, so a chunk's result does not depend on the path.


class _FieldError(Exception):
    def __init__(self, column: str, message: str) -> None:
        self.column = column
        self.message = message


def _float_text(text: str, column: str, optional: bool) -> float:
    s = text.strip()
    if not s:
        if optional:
            return math.nan
        raise _FieldError(column, f"empty {column} (write nan for a missing number)")
    if "_" not in s:
        try:
            return float(s)
        except ValueError:
            pass
    raise _FieldError(column, f"{column} is not a number: {text!r}")


def _int_text(text: str, column: str, optional: bool) -> int | None:
    s = text.strip()
    if not s:
        if optional:
            return None
        raise _FieldError(column, f"empty {column}")
    number: float | int | None = None
    if "_" not in s:
        try:
            number = int(s)
        except ValueError:
            try:
                number = float(s)
            except ValueError:
                number = None
    return _check_int(number, text, column)


def _check_int(number: float | int | None, shown: object, column: str) -> int:
    if isinstance(number, float):
        number = int(number) if math.isfinite(number) and number.is_integer() else None
    if number is None or number < 0:
        raise _FieldError(column, f"{column} must be a non-negative integer, got {shown!r}")
    if number > _INT64_MAX:
        raise _FieldError(column, f"{column} is too large for a 64-bit integer: {shown!r}")
    return number


def _name_text(text: str, column: str) -> str:
    if not text:
        raise _FieldError(column, f"empty {column}")
    if column == "metric" and not _readable(text):
        raise _FieldError(column, f"metric {text!r} is only separators: a name needs a word")
    return text


def _readable(name: str) -> bool:
    """Whether a metric name holds a letter or digit (not only separators and spaces)."""
    return any(c.isalnum() for c in name)


class _Columns:
    """Column lists filled row by row, then turned into one chunk."""

    def __init__(self) -> None:
        self.run: list[str] = []
        self.step: list[int] = []
        self.metric: list[str] = []
        self.value: list[float] = []
        self.time: list[float] = []
        self.rank: list[int | None] = []
        self.host: list[str | None] = []
        self.gpu: list[int | None] = []

    def __len__(self) -> int:
        return len(self.run)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "run": pd.Series(self.run, dtype=object),
                "step": np.array(self.step, dtype=np.int64),
                "metric": pd.Series(self.metric, dtype=object),
                "value": np.array(self.value, dtype=np.float64),
                "time": np.array(self.time, dtype=np.float64),
                "rank": pd.array(self.rank, dtype="Int64"),
                "host": pd.Series(self.host, dtype=object),
                "gpu": pd.array(self.gpu, dtype="Int64"),
            }
        )


# --------------------------------------------------------------------------- CSV


def _read_csv(fh: IO[bytes], path: Path, chunk_rows: int) -> Iterator[pd.DataFrame]:
    header, line_no, pending = _read_header(fh, path)
    est_line_bytes = max(16, sum(len(h) + 4 for h in header))
    eof = False
    while True:
        want = chunk_rows * est_line_bytes
        data = fh.read(max(want - len(pending), 0)) if not eof else b""
        eof = eof or not data
        buf = pending + data
        if not buf:
            return
        cut = len(buf) if eof else _last_record_end(buf)
        if cut == 0:  # one record longer than the block: read more
            pending, est_line_bytes = buf, est_line_bytes * 2
            continue
        chunk, pending = buf[:cut], buf[cut:]
        frame = _parse_csv_chunk(chunk, header, path, line_no + 1)
        lines = chunk.count(b"\n") + (0 if chunk.endswith(b"\n") else 1)
        line_no += lines
        est_line_bytes = max(8, len(chunk) // lines)
        if len(frame):
            yield frame
        if eof and not pending:
            return


def _read_header(fh: IO[bytes], path: Path) -> tuple[list[str], int, bytes]:
    """Return the header's column names, its line number, and bytes read past it."""
    line_no = 0
    while True:
        raw = fh.readline()
        if not raw:
            raise LongFormatError(
                path, max(line_no, 1), "empty file: expected a header line run,step,metric,value"
            )
        line_no += 1
        if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if raw.strip():
            break
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LongFormatError(path, line_no, f"header is not valid UTF-8: {exc.reason}") from None
    header = [name.strip() for name in next(csv.reader([text]))]
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise LongFormatError(path, line_no, f"duplicate column {name!r} in header", name)
        seen.add(name)
    missing = [name for name in REQUIRED_COLUMNS if name not in seen]
    if missing:
        raise LongFormatError(
            path,
            line_no,
            f"header lacks required column {missing[0]!r} (required: run,step,metric,value; "
            f"found: {','.join(header)})",
            missing[0],
        )
    unknown = [name for name in header if name not in COLUMNS]
    if unknown:
        log.warning("%s: ignoring unknown columns %s", path, ", ".join(map(repr, unknown)))
    return header, line_no, b""


def _last_record_end(buf: bytes) -> int:
    """Offset just past the last complete record in ``buf`` (0 if none).

    A newline inside a quoted field does not end a record: with quotes present, only a
    newline preceded by an even number of quote characters does.
    """
    if b'"' not in buf:
        return buf.rfind(b"\n") + 1
    arr = np.frombuffer(buf, dtype=np.uint8)
    newlines = np.flatnonzero(arr == 0x0A)
    quotes = np.flatnonzero(arr == 0x22)
    even = np.searchsorted(quotes, newlines) % 2 == 0
    ends = newlines[even]
    return int(ends[-1]) + 1 if len(ends) else 0


def _parse_csv_chunk(chunk: bytes, header: list[str], path: Path, first_line: int) -> pd.DataFrame:
    if b'"' not in chunk:
        frame = _fast_csv_chunk(chunk, header)
        if frame is not None:
            return frame
    return _slow_csv_chunk(chunk, header, path, first_line)


def _fast_csv_chunk(chunk: bytes, header: list[str]) -> pd.DataFrame | None:
    """Parse with pandas' C reader; None when anything is off (the slow path then says what)."""
    dtype: dict[str, Any] = {"run": object, "metric": object, "step": np.int64}
    dtype |= {"value": np.float64, "time": np.float64, "rank": "Int64", "gpu": "Int64"}
    dtype["host"] = object
    na_values = {"value": _NAN_SPELLINGS, "time": ["", *_NAN_SPELLINGS]}
    na_values |= {"rank": [""], "gpu": [""], "host": [""]}
    used = [name for name in header if name in COLUMNS]
    try:
        df = pd.read_csv(
            io.BytesIO(chunk),
            header=None,
            names=header,
            usecols=used,
            dtype={k: v for k, v in dtype.items() if k in used},
            keep_default_na=False,
            na_values={k: v for k, v in na_values.items() if k in used},
            encoding="utf-8",
            engine="c",
        )
    except (ValueError, TypeError, OverflowError, pd.errors.ParserError):
        return None
    n = len(df)
    if not _every_line_has_fields(chunk, len(header), n):
        return None
    if n and (
        (df["step"].to_numpy() < 0).any()
        or (
            _may_hold_empty_fields(chunk) and not (_names_ok(df["run"]) and _names_ok(df["metric"]))
        )
        or not _metric_names_readable(df["metric"])
        or ("rank" in used and (df["rank"] < 0).any())
        or ("gpu" in used and (df["gpu"] < 0).any())
    ):
        return None
    out = pd.DataFrame(index=pd.RangeIndex(n))
    out["run"] = df["run"]
    out["step"] = df["step"]
    out["metric"] = df["metric"]
    out["value"] = df["value"]
    out["time"] = df["time"] if "time" in used else np.full(n, np.nan)
    for name in ("rank", "gpu"):
        out[name] = df[name] if name in used else _absent_ints(n)
    host = df["host"] if "host" in used else pd.Series([None] * n, dtype=object)
    out["host"] = host.astype(object).where(host.notna(), None)
    return out[list(COLUMNS)]


def _every_line_has_fields(chunk: bytes, width: int, rows: int) -> bool:
    """True if each line of ``chunk`` has ``width - 1`` commas and none was skipped as blank.

    pandas pads short rows and, with usecols, drops extra fields without a word, so the field
    count is checked here, vectorised (the chunk holds no quotes, so every comma separates).
    """
    arr = np.frombuffer(chunk, dtype=np.uint8)
    ends = np.flatnonzero(arr == 0x0A)
    if not chunk.endswith(b"\n"):
        ends = np.append(ends, len(arr))
    if len(ends) != rows:
        return False
    commas = np.flatnonzero(arr == 0x2C)
    per_line = np.diff(np.searchsorted(commas, ends), prepend=0)
    return bool((per_line == width - 1).all())


def _absent_ints(n: int) -> pd.arrays.IntegerArray:
    """An all-NA Int64 column, built directly (``pd.array([None] * n)`` inspects every
    element first)."""
    return pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))


def _may_hold_empty_fields(chunk: bytes) -> bool:
    """False when no field in ``chunk`` can be empty: saves two string scans per chunk."""
    return (
        chunk.startswith(b",")
        or b",," in chunk
        or b"\n," in chunk
        or b",\n" in chunk
        or b",\r" in chunk
        or chunk.endswith(b",")
    )


def _metric_names_readable(col: pd.Series) -> bool:
    """Every distinct metric name of a chunk is readable (checked once per name)."""
    return all(not isinstance(n, str) or _readable(n) for n in pd.unique(col.to_numpy()))


def _names_ok(col: pd.Series) -> bool:
    values = col.to_numpy()
    return not (pd.isna(values).any() or (values == "").any())


def _slow_csv_chunk(chunk: bytes, header: list[str], path: Path, first_line: int) -> pd.DataFrame:
    try:
        text = chunk.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + chunk.count(b"\n", 0, exc.start)
        raise LongFormatError(path, line, f"not valid UTF-8: {exc.reason}") from None
    where = {name: i for i, name in enumerate(header)}
    width = len(header)
    cols = _Columns()
    lines = io.StringIO(text, newline="\n")
    reader = csv.reader(lines, strict=True)
    consumed = 0
    while True:
        start = first_line + consumed
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise LongFormatError(path, start, f"bad CSV: {exc}") from None
        consumed = reader.line_num
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # blank line
        if len(row) != width:
            raise LongFormatError(
                path, start, f"wrong number of fields: expected {width}, got {len(row)}"
            )
        try:
            _append_csv_row(cols, row, where)
        except _FieldError as exc:
            raise LongFormatError(path, start, exc.message, exc.column) from None
    return cols.frame()


def _append_csv_row(cols: _Columns, row: list[str], where: dict[str, int]) -> None:
    def get(name: str) -> str:
        i = where.get(name)
        return "" if i is None else row[i]

    run = _name_text(get("run"), "run")
    step = _int_text(get("step"), "step", optional=False)
    metric = _name_text(get("metric"), "metric")
    value = _float_text(get("value"), "value", optional=False)
    time = _float_text(get("time"), "time", optional=True)
    rank = _int_text(get("rank"), "rank", optional=True)
    gpu = _int_text(get("gpu"), "gpu", optional=True)
    host = get("host") or None
    cols.run.append(run)
    cols.step.append(step)  # type: ignore[arg-type]  # not optional, so never None
    cols.metric.append(metric)
    cols.value.append(value)
    cols.time.append(time)
    cols.rank.append(rank)
    cols.host.append(host)
    cols.gpu.append(gpu)


# --------------------------------------------------------------------------- JSONL


def _read_jsonl(
    fh: IO[bytes], path: Path, chunk_rows: int
) -> Iterator[tuple[pd.DataFrame, list[Record]]]:
    cols = _Columns()
    records: list[Record] = []
    points = 0
    for line_no, raw in enumerate(fh, start=1):
        if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except UnicodeDecodeError as exc:
            raise LongFormatError(path, line_no, f"not valid UTF-8: {exc.reason}") from None
        except json.JSONDecodeError as exc:
            raise LongFormatError(
                path, line_no, f"bad JSON: {exc.msg} (character {exc.colno})"
            ) from None
        if not isinstance(obj, dict):
            raise LongFormatError(
                path, line_no, f"JSON line is not an object (got {type(obj).__name__})"
            )
        try:
            if "event" in obj or "context" in obj:
                records.append(_json_record(obj, line_no, points + len(cols)))
            else:
                _append_json_row(cols, obj)
        except _FieldError as exc:
            raise LongFormatError(path, line_no, exc.message, exc.column) from None
        if len(cols) + len(records) >= chunk_rows:
            points += len(cols)
            yield cols.frame(), records
            cols, records = _Columns(), []
    if len(cols) or records:
        yield cols.frame(), records


def _json_record(obj: dict[str, Any], line: int, before: int) -> Record:
    """An event or step-context line (the caller saw an ``event`` or ``context`` key)."""
    kinds = [k for k in ("metric", "event", "context") if k in obj]
    if len(kinds) > 1:
        raise _FieldError(
            kinds[1],
            f"a line is a point (metric, value), an event (event) or a step context "
            f"(context), not several: it has {' and '.join(map(repr, kinds))}",
        )
    if "run" not in obj:
        raise _FieldError("run", "missing required key 'run'")
    run = _json_name(obj["run"], "run")
    time = _json_float(obj.get("time"), "time", optional=True)
    rank = _json_int(obj.get("rank"), "rank", optional=True)
    when = None if math.isnan(time) else time
    if "event" in obj:
        kind = obj["event"]
        if kind not in EVENT_KINDS:
            raise _FieldError(
                "event", f"unknown event kind {kind!r}; valid: {', '.join(EVENT_KINDS)}"
            )
        message = obj.get("message", "")
        if not isinstance(message, str):
            raise _FieldError("message", f"message must be a string, got {message!r}")
        host = obj.get("host")
        if host is not None and not isinstance(host, str):
            raise _FieldError("host", f"host must be a string, got {host!r}")
        attrs = obj.get("attrs", {})
        if not isinstance(attrs, dict):
            raise _FieldError("attrs", f"attrs must be an object, got {attrs!r}")
        step = _json_int(obj.get("step"), "step", optional=True)
        return EventRow(run, step, kind, message, when, rank, host or None, attrs, line, before)
    if "step" not in obj:
        raise _FieldError("step", "missing required key 'step' (a context holds from a step)")
    step = _json_int(obj["step"], "step", optional=False)
    context = obj["context"]
    if not isinstance(context, dict):
        raise _FieldError(
            "context",
            f"context must be an object of str, int, float or bool values, got {context!r}",
        )
    for key, value in context.items():
        problem = context_problem(key, value)
        if problem is not None:
            raise _FieldError("context", f"context key {key!r}: {problem} (got {value!r})")
    return ContextRow(run, step, dict(context), when, rank, line, before)  # type: ignore[arg-type]


def _append_json_row(cols: _Columns, obj: dict[str, Any]) -> None:
    for name in REQUIRED_COLUMNS:
        if name not in obj:
            raise _FieldError(name, f"missing required key {name!r}")
    run = _json_name(obj["run"], "run")
    step = _json_int(obj["step"], "step", optional=False)
    metric = _json_name(obj["metric"], "metric")
    value = _json_float(obj["value"], "value", optional=False)
    time = _json_float(obj.get("time"), "time", optional=True)
    rank = _json_int(obj.get("rank"), "rank", optional=True)
    gpu = _json_int(obj.get("gpu"), "gpu", optional=True)
    host = obj.get("host")
    if host is not None and not isinstance(host, str):
        raise _FieldError("host", f"host must be a string, got {host!r}")
    cols.run.append(run)
    cols.step.append(step)  # type: ignore[arg-type]  # not optional, so never None
    cols.metric.append(metric)
    cols.value.append(value)
    cols.time.append(time)
    cols.rank.append(rank)
    cols.host.append(host or None)
    cols.gpu.append(gpu)


def _json_name(x: Any, column: str) -> str:
    if not isinstance(x, str):
        raise _FieldError(column, f"{column} must be a string, got {x!r}")
    return _name_text(x, column)


def _json_int(x: Any, column: str, optional: bool) -> int | None:
    if x is None and optional:
        return None
    if isinstance(x, str):
        return _int_text(x, column, optional)
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise _FieldError(column, f"{column} must be a non-negative integer, got {x!r}")
    return _check_int(x, x, column)


def _json_float(x: Any, column: str, optional: bool) -> float:
    if x is None:
        if optional:
            return math.nan
        raise _FieldError(column, f'{column} is null (write "nan" for a missing number)')
    if isinstance(x, str):
        return _float_text(x, column, optional)
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise _FieldError(column, f"{column} is not a number: {x!r}")
    return float(x)


# --------------------------------------------------------------------------- writing


def write_long_format(frames: Iterable[pd.DataFrame], out: TextIO, fmt: str = "csv") -> int:
    """Write ``frames`` to ``out`` in long format; return the number of rows written.

    Each frame needs ``run, step, metric, value``; missing optional columns are written as
    absent. CSV always has the full header of :data:`COLUMNS` (absent fields blank); JSONL
    omits absent keys. Floats are written with ``repr`` precision, so reading the output back
    gives the same numbers; NaN and infinities are written ``nan``, ``inf``, ``-inf`` (as JSON
    strings in JSONL, so every line stays standard JSON).
    """
    fmt = detect_format("<output>", fmt)
    rows = 0
    if fmt == "csv":
        out.write(",".join(COLUMNS) + "\n")
    for frame in frames:
        norm = _normalise(frame)
        if fmt == "csv":
            _write_csv_frame(norm, out)
        else:
            _write_jsonl_frame(norm, out)
        rows += len(norm)
    return rows


def _normalise(frame: pd.DataFrame) -> pd.DataFrame:
    missing = [name for name in REQUIRED_COLUMNS if name not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks required column {missing[0]!r}")
    n = len(frame)
    out = pd.DataFrame(index=pd.RangeIndex(n))
    out["run"] = frame["run"].to_numpy(dtype=object)
    out["step"] = frame["step"].to_numpy(dtype=np.int64)
    out["metric"] = frame["metric"].to_numpy(dtype=object)
    out["value"] = frame["value"].to_numpy(dtype=np.float64)
    time = frame["time"] if "time" in frame.columns else None
    out["time"] = np.full(n, np.nan) if time is None else time.to_numpy(dtype=np.float64)
    for name in ("rank", "gpu"):
        col = frame[name] if name in frame.columns else None
        out[name] = _absent_ints(n) if col is None else col.astype("Int64").array
    host = frame["host"] if "host" in frame.columns else pd.Series([None] * n, dtype=object)
    host = host.astype(object).reset_index(drop=True)
    out["host"] = host.where(host.notna() & (host != ""), None)
    return out[list(COLUMNS)]


_CSV_SPECIAL = (",", '"', "\r", "\n")


def _write_csv_frame(frame: pd.DataFrame, out: TextIO) -> None:
    if not len(frame):
        return
    cols = [
        _texts(frame["run"]),
        list(map(str, frame["step"].tolist())),
        _texts(frame["metric"]),
        list(map(repr, frame["value"].tolist())),
        ["" if math.isnan(t) else repr(t) for t in frame["time"].tolist()],
        _int_texts(frame["rank"]),
        _texts(frame["host"]),
        _int_texts(frame["gpu"]),
    ]
    out.write("\n".join(map(",".join, zip(*cols, strict=True))) + "\n")


def _texts(col: pd.Series) -> list[str]:
    """CSV fields for a text column: None as blank, quoted only where needed.

    Quoting is done here rather than by pandas or the csv module because both leave a lone
    "\r" unquoted, and pandas' reader takes it for a line end.
    """
    values = col.tolist()
    special = any(
        isinstance(x, str) and any(c in x for c in _CSV_SPECIAL) for x in pd.unique(col.to_numpy())
    )
    if not special:
        return ["" if x is None else x for x in values]
    return ["" if x is None else _quote(x) for x in values]


def _quote(text: str) -> str:
    if any(c in text for c in _CSV_SPECIAL):
        return '"' + text.replace('"', '""') + '"'
    return text


def _int_texts(col: pd.Series) -> list[str]:
    return ["" if x is pd.NA else str(x) for x in col.tolist()]


def _write_jsonl_frame(frame: pd.DataFrame, out: TextIO) -> None:
    def number(x: float) -> float | str:
        return x if math.isfinite(x) else repr(x)

    lines = []
    for run, step, metric, value, time, rank, host, gpu in zip(
        *(frame[name].tolist() for name in COLUMNS), strict=True
    ):
        obj: dict[str, Any] = {"run": run, "step": step, "metric": metric, "value": number(value)}
        if not math.isnan(time):
            obj["time"] = number(time)
        if rank is not None and rank is not pd.NA:
            obj["rank"] = rank
        if host is not None:
            obj["host"] = host
        if gpu is not None and gpu is not pd.NA:
            obj["gpu"] = gpu
        lines.append(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))
    if lines:
        out.write("\n".join(lines) + "\n")
