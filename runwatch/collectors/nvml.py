"""GPU telemetry through NVML (``nvidia-ml-py``): one reading per GPU per poll, XIDs as events.

Why NVML in-process: it is the library ``nvidia-smi`` and the DCGM exporter sit on, it costs
microseconds per call, and it sees exactly the GPUs this process was given. Fleets too big for
every process to poll are read from Prometheus instead (:mod:`runwatch.collectors.dcgm`).

The ``nvml`` module is a parameter (default: ``pynvml``) so tests and the benchmark drive the
very same code with a recorded device (:mod:`runwatch.collectors.recorded_nvml`). Decisions
are made once, in :meth:`NvmlCollector.open`: which devices exist, which readings each one
supports (a call answering ``NVML_ERROR_NOT_SUPPORTED`` is never made again), and whether XID
events can be watched. An absent library or driver is one info message, not an error: a
laptop or a CPU-only node still gets its host metrics.

>>> from runwatch.collectors.recorded_nvml import RecordedNvml
>>> c = NvmlCollector(RecordedNvml.h100(gpus=2))
>>> c.open()
True
>>> [(labels["gpu"], sorted(r)[:3]) for labels, r in c.poll()]  # doctest: +NORMALIZE_WHITESPACE
[(0, ['gpu_clock_sm_mhz', 'gpu_ecc_corrected', 'gpu_ecc_uncorrected']),
 (1, ['gpu_clock_sm_mhz', 'gpu_ecc_corrected', 'gpu_ecc_uncorrected'])]
>>> c.close()
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

log = logging.getLogger("runwatch.collectors")

CRITICAL_XIDS: frozenset[int] = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})
"""XIDs that mean a GPU, its memory or its link is failing (NVIDIA's XID catalogue: 48 double-bit
ECC, 63/64 row remapping, 74 NVLink, 79 fell off the bus, 92 high single-bit rate, 94/95
contained/uncontained ECC, 119/120 GSP). Any other XID is still reported, as a warning."""

# Clock-event (throttle) reason bits; named in pynvml, numbered here for older versions.
THROTTLE_POWER = 0x04 | 0x80  # SW power cap, HW power brake
THROTTLE_THERMAL = 0x20 | 0x40  # SW thermal slowdown, HW thermal slowdown
THROTTLE_HW_SLOWDOWN = 0x08

GIB = float(1 << 30)


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID reported by the driver for the GPU at ``gpu`` (its NVML index)."""

    gpu: int
    xid: int
    critical: bool

    @property
    def message(self) -> str:
        level = "critical " if self.critical else ""
        return f"{level}XID {self.xid} on GPU {self.gpu}"


@dataclass(slots=True)
class _Device:
    index: int
    handle: Any
    uuid: str
    name: str
    readers: list[tuple[str, Callable[[Any], dict[str, float]]]] = field(default_factory=list)


def _handle_key(handle: Any) -> int:
    """An NVML device handle is a C pointer: compare handles by address."""
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlCollector:
    """Polls every visible GPU: temperature, power and its limit, utilisation, memory, SM clock,
    throttle reasons, ECC counts, retired pages and remapped rows; drains XID events.

    Metric names start with ``gpu_`` (so every rank keeps them, see ``hook.ranks``) and are
    logged under the label ``gpu`` = the NVML index. Counters (ECC, retired pages, remapped
    rows) are logged as read: a detector looks at their increase.
    """

    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        self.nvml = nvml
        self.available = False
        self.devices: list[_Device] = []
        self._events: Any = None
        self._by_handle: dict[int, int] = {}
        self._nvml: Any = None

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> bool:
        """Initialise NVML and decide, once, what each device can report. False if no NVML."""
        nv = self.nvml
        if nv is None:
            try:
                import pynvml as nv
            except ImportError:
                log.info("runwatch: no GPU metrics: nvidia-ml-py is not installed")
                return False
        self._nvml = nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            log.info("runwatch: no GPU metrics: NVML is not available here (%s)", exc)
            return False
        try:
            count = nv.nvmlDeviceGetCount()
            for i in range(count):
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                dev = _Device(
                    i,
                    handle,
                    _text(self._try(nv.nvmlDeviceGetUUID, handle, "")),
                    _text(self._try(nv.nvmlDeviceGetName, handle, "")),
                )
                dev.readers = self._readers()
                self.devices.append(dev)
                self._by_handle[_handle_key(handle)] = i
        except nv.NVMLError as exc:
            log.info("runwatch: no GPU metrics: NVML could not list devices (%s)", exc)
            self._shutdown()
            return False
        self._events = self._open_events()
        self.available = True
        log.info(
            "runwatch: GPU metrics from NVML for %d device(s): %s",
            len(self.devices),
            ", ".join(f"{d.index}:{d.name}" for d in self.devices) or "none",
        )
        return True

    def close(self) -> None:
        if not self.available:
            return
        self.available = False
        if self._events is not None:
            self._try(self._nvml.nvmlEventSetFree, self._events, None)
            self._events = None
        self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:  # closing must never raise into the caller
            log.debug("nvmlShutdown failed: %s", exc)

    # -- polling -----------------------------------------------------------------------------
    def poll(self) -> list[tuple[dict[str, int], dict[str, float]]]:
        """One reading per GPU: ``[({"gpu": i}, {"gpu_temp_c": ..., ...}), ...]``.

        A reading the device does not support (``NVML_ERROR_NOT_SUPPORTED``: no ECC on a
        consumer card, no remapping before Ampere) is dropped for good the first time; one that
        fails otherwise (the GPU is resetting) is left out of this poll only.
        """
        out: list[tuple[dict[str, int], dict[str, float]]] = []
        nv = self._nvml
        if nv is None:
            return out
        not_supported = nv.NVML_ERROR_NOT_SUPPORTED
        for dev in self.devices:
            values: dict[str, float] = {}
            dropped = None
            for name, reader in dev.readers:
                try:
                    values.update(reader(dev.handle))
                except nv.NVMLError as exc:
                    if getattr(exc, "value", None) == not_supported:
                        log.debug("GPU %d does not support %s; not asked again", dev.index, name)
                        dropped = [*(dropped or ()), name]
                    else:
                        log.debug("GPU %d: %s failed: %s", dev.index, name, exc)
            if dropped:
                dev.readers = [(n, r) for n, r in dev.readers if n not in dropped]
            out.append(({"gpu": dev.index}, values))
        return out

    def poll_xids(self, limit: int = 1000) -> list[XidEvent]:
        """Drain the XID events the driver queued since the last call (never waits)."""
        if self._events is None:
            return []
        nv = self._nvml
        xid_type = nv.nvmlEventTypeXidCriticalError
        out: list[XidEvent] = []
        for _ in range(limit):
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:
                break  # NVML_ERROR_TIMEOUT: nothing more queued
            if not data.eventType & xid_type:
                continue
            gpu = self._by_handle.get(_handle_key(data.device), -1)
            xid = int(data.eventData)
            out.append(XidEvent(gpu, xid, xid in CRITICAL_XIDS))
        return out

    # -- decided once ------------------------------------------------------------------------
    def _open_events(self) -> Any:
        nv = self._nvml
        try:
            events = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.info("runwatch: XID events not available (%s)", exc)
            return None
        watched = 0
        for dev in self.devices:
            try:
                nv.nvmlDeviceRegisterEvents(dev.handle, nv.nvmlEventTypeXidCriticalError, events)
                watched += 1
            except nv.NVMLError as exc:
                log.info("runwatch: XID events not available on GPU %d (%s)", dev.index, exc)
        if not watched:
            self._try(nv.nvmlEventSetFree, events, None)
            return None
        return events

    def _try(self, fn: Callable[..., Any], arg: Any, default: Any) -> Any:
        try:
            return fn(arg)
        except self._nvml.NVMLError:
            return default

    def _readers(self) -> list[tuple[str, Callable[[Any], dict[str, float]]]]:
        nv = self._nvml
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        temp_gpu = nv.NVML_TEMPERATURE_GPU
        clock_sm = nv.NVML_CLOCK_SM
        corrected = nv.NVML_MEMORY_ERROR_TYPE_CORRECTED
        uncorrected = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        volatile = nv.NVML_VOLATILE_ECC
        sbe = nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        dbe = nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR

        def temperature(h: Any) -> dict[str, float]:
            return {"gpu_temp_c": float(nv.nvmlDeviceGetTemperature(h, temp_gpu))}

        def power(h: Any) -> dict[str, float]:
            return {"gpu_power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0}

        def power_limit(h: Any) -> dict[str, float]:
            return {"gpu_power_limit_w": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0}

        def utilisation(h: Any) -> dict[str, float]:
            u = nv.nvmlDeviceGetUtilizationRates(h)
            return {"gpu_util_pct": float(u.gpu), "gpu_mem_util_pct": float(u.memory)}

        def memory(h: Any) -> dict[str, float]:
            m = nv.nvmlDeviceGetMemoryInfo(h)
            return {"gpu_mem_used_gib": m.used / GIB, "gpu_mem_total_gib": m.total / GIB}

        def sm_clock(h: Any) -> dict[str, float]:
            return {"gpu_clock_sm_mhz": float(nv.nvmlDeviceGetClockInfo(h, clock_sm))}

        def throttle(h: Any) -> dict[str, float]:
            bits = int(reasons(h))
            return {
                "gpu_throttle_reasons": float(bits),
                "gpu_throttle_thermal": float(bool(bits & THROTTLE_THERMAL)),
                "gpu_throttle_power": float(bool(bits & THROTTLE_POWER)),
            }

        def ecc(h: Any) -> dict[str, float]:
            return {
                "gpu_ecc_corrected": float(nv.nvmlDeviceGetTotalEccErrors(h, corrected, volatile)),
                "gpu_ecc_uncorrected": float(
                    nv.nvmlDeviceGetTotalEccErrors(h, uncorrected, volatile)
                ),
            }

        def retired(h: Any) -> dict[str, float]:
            n = len(nv.nvmlDeviceGetRetiredPages(h, sbe)) + len(
                nv.nvmlDeviceGetRetiredPages(h, dbe)
            )
            return {"gpu_retired_pages": float(n)}

        def remapped(h: Any) -> dict[str, float]:
            corr, unc, pending, failure = nv.nvmlDeviceGetRemappedRows(h)
            return {
                "gpu_remapped_rows_corr": float(corr),
                "gpu_remapped_rows_unc": float(unc),
                "gpu_remap_pending": float(bool(pending)),
                "gpu_remap_failure": float(bool(failure)),
            }

        return [
            ("temperature", temperature),
            ("power", power),
            ("power_limit", power_limit),
            ("utilisation", utilisation),
            ("memory", memory),
            ("sm_clock", sm_clock),
            ("throttle", throttle),
            ("ecc", ecc),
            ("retired_pages", retired),
            ("remapped_rows", remapped),
        ]
