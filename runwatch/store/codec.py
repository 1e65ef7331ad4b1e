"""Compact encoding of a block of points (steps, wall times, values) into one blob.

Why blocks and not a row per point: a SQLite row has a fixed cost of tens of bytes before any
index, far above our goal of <= 16 bytes per point, and inserting one row per point from
Python cannot keep up with the writer (bytes per point and writer throughput:
``bench/log_overhead.py``, bench/README-logging.md).
A block of up to a few thousand points of one series compresses well because neighbouring
points look alike:

- steps are stored as deltas (almost always 1, so they cost nearly nothing);
- wall times as integer microsecond deltas (a training step takes milliseconds to seconds);
- values as float32 when every value round-trips exactly (true of anything that came out of a
  float32 tensor, and of NaN/Inf), else float64, byte-shuffled so that the sign/exponent
  bytes sit together and zlib can squeeze them.

Wall times are kept to the microsecond; that is the one lossy part, and documented.

An open block (``encode_open_block``: the series' newest points, not yet a sealed block of
``SEAL_POINTS``) is written raw: it is rewritten into a sealed block later, and the writer
writes one per series every 0.08 s, where the analysis above costs more than it saves.

The live writer encodes a small block per series every 0.08 s while holding the GIL, so
``encode_block`` keeps to a few NumPy calls (no ``np.diff``, ``np.iinfo`` or second NaN pass
in the common case; bench/README-hook-cadence.md).

>>> import numpy as np
>>> steps = np.arange(10, 20); times = 1.7e9 + steps * 0.25
>>> values = np.array([3.0, 2.5, np.nan, np.inf, -np.inf, 1e300, 0.1, 2.0, 2.0, 1.5])
>>> s, t, v = decode_block(encode_block(steps, times, values))
>>> bool((s == steps).all()), bool(np.allclose(t, times)), np.array_equal(v, values, equal_nan=True)
(True, True, True)
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

_MAGIC = 1  # format version of a block blob
_OPEN = 2  # an open block's first byte: the arrays as they are (``encode_open_block``)
_OPEN_HEADER = struct.Struct("<BI")  # _OPEN, n
_HEADER = struct.Struct("<BIqqBBBII")
# version, n, first_step, first_time_us, step_dtype, time_dtype, value_dtype,
# len(step_bytes), len(time_bytes)

_INT_DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(t) for t in ("<i1", "<i2", "<i4", "<i8"))
_FLOAT_DTYPES: tuple[np.dtype, ...] = (np.dtype("<f4"), np.dtype("<f8"))
_TIME_RAW = 4  # some but not all times missing: float64 as given
_TIME_ABSENT = 5  # no wall times at all (an import without a time column)
_ZLIB_LEVEL = 1  # on point data, level 1 is much faster than 6 and nearly as small


_INT_BOUNDS = tuple((int(np.iinfo(t).min), int(np.iinfo(t).max)) for t in _INT_DTYPES)


def _smallest_int_code(deltas: np.ndarray) -> int:
    if deltas.size == 0:
        return 0
    lo, hi = int(deltas.min()), int(deltas.max())
    for code, (low, high) in enumerate(_INT_BOUNDS):
        if low <= lo and hi <= high:
            return code
    return len(_INT_DTYPES) - 1


def _shuffle(raw: np.ndarray) -> bytes:
    """Byte-shuffle: all first bytes, then all second bytes... (as Blosc/HDF5 do)."""
    width = raw.dtype.itemsize
    return raw.view(np.uint8).reshape(-1, width).T.tobytes()


def _unshuffle(blob: bytes, dtype: np.dtype, n: int) -> np.ndarray:
    width = dtype.itemsize
    planes = np.frombuffer(blob, dtype=np.uint8).reshape(width, n)
    return np.ascontiguousarray(planes.T).view(dtype).reshape(n)


def _fits_float32(values: np.ndarray) -> bool:
    with np.errstate(over="ignore", invalid="ignore"):
        back = values.astype(np.float32).astype(np.float64)
    same = back == values
    if same.all():
        return True
    return bool(np.isnan(values[~same]).all())  # NaN != NaN, and NaN round-trips


def _encode_times(times: np.ndarray) -> tuple[int, int, bytes]:
    """Return (first time in µs, time code, bytes); see the _TIME_* codes."""
    finite = np.count_nonzero(np.isfinite(times))
    if not finite:
        return 0, _TIME_ABSENT, b""
    if finite < times.size:
        return 0, _TIME_RAW, _shuffle(times)
    times_us = np.round(times * 1e6).astype(np.int64)
    deltas = times_us[1:] - times_us[:-1]
    code = _smallest_int_code(deltas)
    return int(times_us[0]), code, _shuffle(deltas.astype(_INT_DTYPES[code]))


def _decode_times(body: bytes, code: int, first_time: int, n: int) -> np.ndarray:
    if code == _TIME_ABSENT:
        return np.full(n, np.nan)
    if code == _TIME_RAW:
        return _unshuffle(body, np.dtype("<f8"), n)
    times_us = np.empty(n, dtype=np.int64)
    if n:
        times_us[0] = first_time
        np.cumsum(_unshuffle(body, _INT_DTYPES[code], n - 1), out=times_us[1:])
        times_us[1:] += first_time
    return times_us / 1e6


def encode_block(steps: np.ndarray, times: np.ndarray, values: np.ndarray) -> bytes:
    """Encode equal-length arrays of int steps, float Unix times and float values."""
    n = len(steps)
    steps = np.asarray(steps, dtype=np.int64)
    times = np.asarray(times, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    first_step = int(steps[0]) if n else 0
    step_deltas = steps[1:] - steps[:-1]
    step_code = _smallest_int_code(step_deltas)
    first_time, time_code, time_bytes = _encode_times(times)
    value_code = 0 if _fits_float32(values) else 1
    step_bytes = step_deltas.astype(_INT_DTYPES[step_code]).tobytes()
    value_bytes = _shuffle(values.astype(_FLOAT_DTYPES[value_code]))
    header = _HEADER.pack(
        _MAGIC,
        n,
        first_step,
        first_time,
        step_code,
        time_code,
        value_code,
        len(step_bytes),
        len(time_bytes),
    )
    return header + zlib.compress(step_bytes + time_bytes + value_bytes, _ZLIB_LEVEL)


def encode_open_block(steps: np.ndarray, times: np.ndarray, values: np.ndarray) -> bytes:
    """Encode an open block raw: int64 steps, float64 times and values, the times rounded
    to the microsecond when all are known, so that it decodes to what ``encode_block`` of
    the same points decodes to."""
    times = np.asarray(times, dtype=np.float64)
    if np.isfinite(times).all():
        times = np.round(times * 1e6) / 1e6
    return b"".join(
        (
            _OPEN_HEADER.pack(_OPEN, len(steps)),
            np.asarray(steps, dtype="<i8").tobytes(),
            times.astype("<f8", copy=False).tobytes(),
            np.asarray(values, dtype="<f8").tobytes(),
        )
    )


def decode_block(blob: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inverse of :func:`encode_block` and :func:`encode_open_block`: (steps int64, times
    float64, values float64)."""
    if blob[0] == _OPEN:
        _, n = _OPEN_HEADER.unpack_from(blob)
        raw = np.frombuffer(blob, dtype="<f8", count=3 * n, offset=_OPEN_HEADER.size)
        steps = raw[:n].view("<i8").astype(np.int64)
        return steps, raw[n : 2 * n].astype(np.float64), raw[2 * n :].astype(np.float64)
    (version, n, first_step, first_time, step_code, time_code, value_code, n_step, n_time) = (
        _HEADER.unpack_from(blob)
    )
    if version != _MAGIC:
        raise ValueError(f"unknown point block version {version}; this runwatch reads {_MAGIC}")
    body = zlib.decompress(blob[_HEADER.size :])
    steps = np.empty(n, dtype=np.int64)
    if n:
        steps[0] = first_step
        np.cumsum(np.frombuffer(body[:n_step], dtype=_INT_DTYPES[step_code]), out=steps[1:])
        steps[1:] += first_step
    times = _decode_times(body[n_step : n_step + n_time], time_code, first_time, n)
    values = _unshuffle(body[n_step + n_time :], _FLOAT_DTYPES[value_code], n)
    return steps, times, values.astype(np.float64)
