"""A recorded NVML device: a stand-in for the ``pynvml`` module that replays readings.

There is no GPU on the build machines, so the NVML collector is tested and benchmarked through
this module, and the collector cannot tell the difference: it answers the same function names
with the same types (pynvml's own ctypes structures, device handles that are real
``c_nvmlDevice_t`` pointers, pynvml's own ``NVMLError`` subclasses chosen by error code). So the
code path under test is the production one.

Each device replays a list of *frames* (one per poll: the temperature read, which the collector
makes first, moves the device to its next frame; the last frame repeats). A frame holds what
``nvidia-smi -q`` shows. :meth:`RecordedNvml.h100` builds frames shaped like an H100 SXM5 80GB
under a training load (values typical of that board, not captured on one); :func:`record`
captures real frames on a GPU node, for a fixture of a real device.

>>> nv = RecordedNvml.h100(gpus=1, frames=[{"temp": 88, "reasons": 0x40}])
>>> nv.nvmlInit(); h = nv.nvmlDeviceGetHandleByIndex(0)
>>> nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU), nv.nvmlDeviceGetPowerUsage(h)
(88, 640000)
>>> RecordedNvml.missing().nvmlInit()
Traceback (most recent call last):
pynvml.NVMLError_LibraryNotFound: NVML Shared Library Not Found
"""

from __future__ import annotations

import ctypes
import json
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pynvml

H100_FRAME: dict[str, Any] = {
    "name": "NVIDIA H100 80GB HBM3",
    "temp": 62,
    "power_mw": 640_000,
    "limit_mw": 700_000,
    "util_gpu": 98,
    "util_mem": 61,
    "mem_total": 81_559 * (1 << 20),
    "mem_used": 71_204 * (1 << 20),
    "sm_mhz": 1_980,
    "reasons": 0,
    "ecc_corr": 0,
    "ecc_unc": 0,
    "retired_sbe": 0,
    "retired_dbe": 0,
    "remap": [0, 0, 0, 0],
    "xids": [],
}
"""One poll of a busy H100 SXM5: what a frame holds, and the default for missing keys."""


class RecordedNvml:
    """The subset of ``pynvml`` the collector uses, replaying per-device frames.

    ``devices`` is one list of frames per GPU (dicts with the keys of :data:`H100_FRAME`;
    missing keys take the defaults). ``unsupported`` names NVML functions that answer
    ``NVML_ERROR_NOT_SUPPORTED`` (an older board without remapped rows, say).
    ``calls`` counts every NVML call, so a test can check a reading is not asked again.
    """

    def __init__(
        self,
        devices: Sequence[Sequence[Mapping[str, Any]]],
        *,
        unsupported: Sequence[str] = (),
        library_missing: bool = False,
    ) -> None:
        self._frames = [[{**H100_FRAME, **f} for f in (frames or [{}])] for frames in devices]
        self._cursor = [-1] * len(self._frames)
        self._handles = [
            ctypes.cast(ctypes.c_void_p(0x1000 + 0x100 * i), pynvml.c_nvmlDevice_t)
            for i in range(len(self._frames))
        ]
        self._unsupported = frozenset(unsupported)
        self._library_missing = library_missing
        self._initialised = False
        self._pending_xids: deque[tuple[int, int]] = deque()
        self._event_sets: dict[int, set[int]] = {}
        self.calls: dict[str, int] = {}

    # -- builders ----------------------------------------------------------------------------
    @classmethod
    def h100(
        cls, gpus: int = 8, frames: Sequence[Mapping[str, Any]] | None = None, **kw: Any
    ) -> RecordedNvml:
        """``gpus`` H100s, each replaying ``frames`` (default: one steady busy frame)."""
        return cls([list(frames or [{}]) for _ in range(gpus)], **kw)

    @classmethod
    def missing(cls) -> RecordedNvml:
        """A machine without the NVIDIA driver: ``nvmlInit`` raises LibraryNotFound."""
        return cls([], library_missing=True)

    @classmethod
    def load(cls, path: str | Path, **kw: Any) -> RecordedNvml:
        """Frames recorded by :func:`record` (JSON: a list of frame lists, one per GPU)."""
        return cls(json.loads(Path(path).read_text()), **kw)

    # -- plumbing ----------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        # Constants and error classes are pynvml's own, so `except nv.NVMLError` is the same.
        if name.startswith(("NVML_", "NVMLError", "nvmlEventType", "nvmlClocks", "c_nvml")):
            return getattr(pynvml, name)
        raise AttributeError(f"recorded NVML has no {name!r}")

    def _call(self, fn: str) -> None:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        if not self._initialised and fn not in ("nvmlInit", "nvmlInitWithFlags"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if fn in self._unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _index(self, handle: Any) -> int:
        addr = ctypes.cast(handle, ctypes.c_void_p).value or 0
        return (addr - 0x1000) // 0x100

    def _frame(self, handle: Any) -> dict[str, Any]:
        i = self._index(handle)
        frames = self._frames[i]
        return frames[min(max(self._cursor[i], 0), len(frames) - 1)]

    # -- the NVML API ------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] = self.calls.get("nvmlInit", 0) + 1
        if self._library_missing:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self._initialised = True

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self._initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self._frames)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._call("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._handles):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[index]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._call("nvmlDeviceGetUUID")
        return f"GPU-0000{self._index(handle):04d}-rec0-4c1e-9a70-000000000000"

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._call("nvmlDeviceGetName")
        return str(self._frame(handle)["name"])

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        self._call("nvmlDeviceGetTemperature")
        i = self._index(handle)
        self._cursor[i] += 1  # a poll starts with the temperature: next frame
        frame = self._frame(handle)
        if self._cursor[i] < len(self._frames[i]):
            for xid in frame["xids"]:
                if i in self._registered():
                    self._pending_xids.append((i, int(xid)))
        return int(frame["temp"])

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._call("nvmlDeviceGetPowerUsage")
        return int(self._frame(handle)["power_mw"])

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        self._call("nvmlDeviceGetEnforcedPowerLimit")
        return int(self._frame(handle)["limit_mw"])

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        self._call("nvmlDeviceGetUtilizationRates")
        f = self._frame(handle)
        u = pynvml.c_nvmlUtilization_t()
        u.gpu, u.memory = int(f["util_gpu"]), int(f["util_mem"])
        return u

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        self._call("nvmlDeviceGetMemoryInfo")
        f = self._frame(handle)
        m = pynvml.c_nvmlMemory_t()
        m.total, m.used = int(f["mem_total"]), int(f["mem_used"])
        m.free = m.total - m.used
        return m

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        self._call("nvmlDeviceGetClockInfo")
        return int(self._frame(handle)["sm_mhz"])

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        self._call("nvmlDeviceGetCurrentClocksEventReasons")
        return int(self._frame(handle)["reasons"])

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        self._call("nvmlDeviceGetTotalEccErrors")
        f = self._frame(handle)
        corrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        return int(f["ecc_corr"] if corrected else f["ecc_unc"])

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]:
        self._call("nvmlDeviceGetRetiredPages")
        f = self._frame(handle)
        sbe = cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        n = int(f["retired_sbe"] if sbe else f["retired_dbe"])
        return [0x7F000 + k for k in range(n)]

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        self._call("nvmlDeviceGetRemappedRows")
        corr, unc, pending, failure = self._frame(handle)["remap"]
        return int(corr), int(unc), int(pending), int(failure)

    # -- events ------------------------------------------------------------------------------
    def _registered(self) -> set[int]:
        return set().union(*self._event_sets.values()) if self._event_sets else set()

    def nvmlEventSetCreate(self) -> Any:
        self._call("nvmlEventSetCreate")
        key = len(self._event_sets) + 1
        self._event_sets[key] = set()
        return ctypes.c_void_p(key)

    def nvmlDeviceRegisterEvents(self, handle: Any, types: int, event_set: Any) -> None:
        self._call("nvmlDeviceRegisterEvents")
        self._event_sets[int(event_set.value)].add(self._index(handle))

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self._call("nvmlEventSetWait_v2")
        if not self._pending_xids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        gpu, xid = self._pending_xids.popleft()
        data = pynvml.c_nvmlEventData_t()
        data.device = self._handles[gpu]
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = xid
        return data

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._call("nvmlEventSetFree")
        self._event_sets.pop(int(event_set.value), None)

    def inject_xid(self, gpu: int, xid: int) -> None:
        """Queue an XID as the driver would (for tests of the event path)."""
        self._pending_xids.append((gpu, xid))


def record(polls: int = 30, interval_s: float = 1.0, path: str | Path | None = None) -> list:
    """Capture ``polls`` frames of every real GPU here (run on a GPU node; needs NVML).

    The result (and the JSON at ``path``) loads with :meth:`RecordedNvml.load`.
    """
    nv = pynvml
    nv.nvmlInit()
    try:
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        out: list[list[dict[str, Any]]] = [[] for _ in handles]
        for _ in range(polls):
            for i, h in enumerate(handles):
                out[i].append(_read_frame(nv, h))
            time.sleep(interval_s)
    finally:
        nv.nvmlShutdown()
    if path is not None:
        Path(path).write_text(json.dumps(out))
    return out


def _read_frame(nv: Any, h: Any) -> dict[str, Any]:
    def get(fn: Any, *args: Any, default: Any = 0) -> Any:
        try:
            return fn(h, *args)
        except nv.NVMLError:
            return default

    util = get(nv.nvmlDeviceGetUtilizationRates, default=None)
    mem = get(nv.nvmlDeviceGetMemoryInfo, default=None)
    name = get(nv.nvmlDeviceGetName, default="")
    return {
        "name": name.decode() if isinstance(name, bytes) else name,
        "temp": get(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
        "power_mw": get(nv.nvmlDeviceGetPowerUsage),
        "limit_mw": get(nv.nvmlDeviceGetEnforcedPowerLimit),
        "util_gpu": util.gpu if util else 0,
        "util_mem": util.memory if util else 0,
        "mem_total": mem.total if mem else 0,
        "mem_used": mem.used if mem else 0,
        "sm_mhz": get(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
        "reasons": get(nv.nvmlDeviceGetCurrentClocksEventReasons),
        "ecc_corr": get(
            nv.nvmlDeviceGetTotalEccErrors,
            nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            nv.NVML_VOLATILE_ECC,
        ),
        "ecc_unc": get(
            nv.nvmlDeviceGetTotalEccErrors,
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_VOLATILE_ECC,
        ),
        "remap": list(get(nv.nvmlDeviceGetRemappedRows, default=(0, 0, 0, 0))),
        "xids": [],
    }
