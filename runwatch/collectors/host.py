"""Host telemetry through psutil: CPU, load, memory, disk and network I/O.

Why: a GPU that idles is often a host problem -- a data loader starved of CPU, a full disk
stalling checkpoints, a NIC saturated by another job. These readings sit beside the GPU ones
(same steps, same host label) so the two can be read side by side.

Rates (bytes/s) come from counter differences between polls over the injected ``clock``;
the first poll has no rate yet. ``psutil`` is a parameter so tests can pass a stand-in.

>>> c = HostCollector()
>>> first = c.poll()
>>> sorted(k for k in first if k.startswith("host_mem"))
['host_mem_pct', 'host_mem_used_gib']
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("runwatch.collectors")

GIB = float(1 << 30)


class HostCollector:
    """Polls the host: ``host_cpu_pct``, ``host_load1``, memory, disk use and I/O rates."""

    def __init__(
        self,
        psutil: Any = None,
        *,
        disk_path: str = "/",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if psutil is None:
            import psutil
        self.psutil = psutil
        self.disk_path = disk_path
        self.clock = clock
        self._last: tuple[float, dict[str, float]] | None = None
        # The first cpu_percent() call only starts psutil's measurement interval.
        psutil.cpu_percent(interval=None)

    def poll(self) -> dict[str, float]:
        """One reading of the host; a reading psutil cannot give here is left out."""
        ps = self.psutil
        out: dict[str, float] = {}
        now = self.clock()
        for reader in (self._cpu, self._memory, self._disk):
            try:
                out.update(reader(ps))
            except Exception as exc:  # a missing sensor must not cost the other readings
                log.debug("host reading %s failed: %s", reader.__name__, exc)
        counters = self._counters(ps)
        if self._last is not None:
            t0, before = self._last
            dt = now - t0
            if dt > 0:
                for name, value in counters.items():
                    if name in before:
                        out[name] = max(value - before[name], 0.0) / dt
        self._last = (now, counters)
        return out

    @staticmethod
    def _cpu(ps: Any) -> dict[str, float]:
        out = {"host_cpu_pct": float(ps.cpu_percent(interval=None))}
        if hasattr(ps, "getloadavg"):
            out["host_load1"] = float(ps.getloadavg()[0])
        return out

    @staticmethod
    def _memory(ps: Any) -> dict[str, float]:
        vm = ps.virtual_memory()
        return {"host_mem_used_gib": vm.used / GIB, "host_mem_pct": float(vm.percent)}

    def _disk(self, ps: Any) -> dict[str, float]:
        return {"host_disk_pct": float(ps.disk_usage(self.disk_path).percent)}

    @staticmethod
    def _counters(ps: Any) -> dict[str, float]:
        out: dict[str, float] = {}
        try:
            d = ps.disk_io_counters()
            if d is not None:
                out["host_disk_read_bps"] = float(d.read_bytes)
                out["host_disk_write_bps"] = float(d.write_bytes)
        except Exception as exc:
            log.debug("disk counters failed: %s", exc)
        try:
            n = ps.net_io_counters()
            if n is not None:
                out["host_net_recv_bps"] = float(n.bytes_recv)
                out["host_net_sent_bps"] = float(n.bytes_sent)
        except Exception as exc:
            log.debug("network counters failed: %s", exc)
        return out
