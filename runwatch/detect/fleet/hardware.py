"""Hardware health: GPUs that overheat, hit their power cap, report XIDs, lose memory rows, run
out of memory, or go idle while the rest of the fleet works.

It reads the ``gpu_*`` series the NVML collector (or the DCGM source) logs per GPU, plus
``xid`` events. One rule per symptom, each an episode per GPU (labels rank/host/gpu):

=================  ======================================================  ==================
rule               fires when                                              severity
=================  ======================================================  ==================
thermal            ``gpu_throttle_thermal`` set for ``sustain`` samples,    warning
                   or temperature >= ``temp_warn`` (>= ``temp_critical``)   (critical)
                   or rising ``runaway_rise`` degC within ``runaway_samples``
power_cap          ``gpu_throttle_power`` set, or power >= 98% of the       info
                   limit, for ``sustain`` samples
xid                any XID event; the critical ones (48, 63, 64, 74, 79,    warning (critical)
                   92, 94, 95, 119, 120)
ecc                uncorrected ECC or uncorrectable remapped rows rising,   critical
                   a remap failure; corrected ECC, retired pages or a       warning
                   pending remap rising
memory             used / total >= ``mem_fraction``                         warning
util_collapse      utilisation < ``idle_util`` for ``sustain`` samples      warning
                   while at least half the GPUs work (median >= ``busy_util``)
=================  ======================================================  ==================

Catches: the slow faults that precede a crash (heat, ECC, remapping) and the ones that cost
throughput without crashing (throttling, power capping, one idle GPU stalling the collective).
Misses: faults NVML does not see (a flapping InfiniBand link: look at stragglers and NCCL
timeouts); a GPU that is busy but slow (the straggler detector); near-full memory is normal for
some jobs (the caching allocator keeps what it took), so tune ``mem_fraction``. Thresholds are
absolute, learned from nothing, so there is no baseline a fault could teach; an episode closes
after ``quiet`` clean samples.

>>> hw = HardwareMonitor(sustain=2)
>>> out = []
>>> for step, temp in enumerate([70, 80, 86, 87, 88]):
...     out += hw.update("gpu_temp_c", {"rank": 5, "host": "n1", "gpu": 1}, step, temp)
>>> a = out[0]
>>> a.details["rule"], a.labels, a.start_step, a.severity
('thermal', {'rank': 5, 'host': 'n1', 'gpu': 1}, 3, 'warning')
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from runwatch.detect.base import check_number
from runwatch.model import LABEL_KEYS, Anomaly

log = logging.getLogger("runwatch.detect.fleet")

CRITICAL_XIDS: frozenset[int] = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})

_COUNTERS: dict[str, tuple[str, str]] = {
    # metric -> (severity when it rises, what it means)
    "gpu_ecc_uncorrected": ("critical", "uncorrected ECC errors"),
    "gpu_remapped_rows_unc": ("critical", "rows remapped for uncorrectable errors"),
    "gpu_remap_failure": ("critical", "a row remapping failure"),
    "gpu_ecc_corrected": ("warning", "corrected ECC errors"),
    "gpu_retired_pages": ("warning", "retired memory pages"),
    "gpu_remap_pending": ("warning", "a row remap pending (needs a GPU reset)"),
}

_SEV = {"info": 0, "warning": 1, "critical": 2}


class _Gpu:
    __slots__ = ("counters", "labels", "last", "open", "streak", "temps")

    def __init__(self, labels: dict[str, Any], runaway: int) -> None:
        self.labels = labels
        self.last: dict[str, float] = {}
        self.counters: dict[str, float] = {}
        self.temps: deque[float] = deque(maxlen=runaway)
        self.streak: dict[str, int] = {}
        self.open: dict[str, tuple[Anomaly, int]] = {}  # rule -> (episode, clean samples)


class HardwareMonitor:
    """Per-GPU hardware rules over ``gpu_*`` points and ``xid`` events (see the module doc).

    ``update(metric, labels, step, value)`` takes one point; ``xid(labels, step, code)`` one
    XID; ``end_step(step)`` runs the cross-GPU utilisation rule once all GPUs reported for a
    step. Each returns the episodes opened, grown or closed.
    """

    name = "hardware"

    def __init__(
        self,
        temp_warn: float = 85.0,
        temp_critical: float = 92.0,
        runaway_rise: float = 15.0,
        runaway_samples: int = 6,
        sustain: int = 3,
        mem_fraction: float = 0.98,
        idle_util: float = 20.0,
        busy_util: float = 70.0,
        quiet: int = 3,
    ) -> None:
        check_number("temp_warn", temp_warn, low=0.0)
        check_number("temp_critical", temp_critical, low=temp_warn)
        check_number("runaway_rise", runaway_rise, low=0.0)
        check_number("runaway_samples", runaway_samples, low=2, integer=True)
        check_number("sustain", sustain, low=1, integer=True)
        check_number("mem_fraction", mem_fraction, low=0.0, high=1.0)
        check_number("idle_util", idle_util, low=0.0, high=100.0)
        check_number("busy_util", busy_util, low=idle_util, high=100.0)
        check_number("quiet", quiet, low=1, integer=True)
        self.temp_warn = temp_warn
        self.temp_critical = temp_critical
        self.runaway_rise = runaway_rise
        self.runaway_samples = runaway_samples
        self.sustain = sustain
        self.mem_fraction = mem_fraction
        self.idle_util = idle_util
        self.busy_util = busy_util
        self.quiet = quiet
        self._gpus: dict[tuple[Any, ...], _Gpu] = {}
        self._episodes: list[Anomaly] = []

    @property
    def episodes(self) -> list[Anomaly]:
        return list(self._episodes)

    # -- input -----------------------------------------------------------------------------
    def update(
        self, metric: str, labels: Mapping[str, Any] | None, step: int, value: float
    ) -> list[Anomaly]:
        """One ``gpu_*`` reading of one GPU."""
        gpu = self._gpu(labels)
        value = float(value)
        if value != value:  # NaN: a missing reading says nothing
            return []
        gpu.last[metric] = value
        if metric == "gpu_temp_c":
            gpu.temps.append(value)
            return self._thermal(gpu, step)
        if metric == "gpu_throttle_thermal":
            return self._thermal(gpu, step)
        if metric in ("gpu_throttle_power", "gpu_power_w"):
            return self._power(gpu, step)
        if metric in _COUNTERS:
            return self._counter(gpu, metric, step, value)
        if metric in ("gpu_mem_used_gib", "gpu_mem_total_gib"):
            return self._memory(gpu, step)
        return []

    def xid(self, labels: Mapping[str, Any] | None, step: int, code: int) -> list[Anomaly]:
        """An XID event on a GPU: every XID is reported; the critical ones as critical."""
        gpu = self._gpu(labels)
        code = int(code)
        severity = "critical" if code in CRITICAL_XIDS else "warning"
        kind = "critical " if severity == "critical" else ""
        msg = f"{_where(gpu.labels)}: {kind}XID {code}"
        out = self._hit(gpu, f"xid:{code}", "xid", step, severity, float(code), msg)
        ep = gpu.open[f"xid:{code}"][0]
        ep.details["xid"] = code
        ep.details["count"] = ep.details.get("count", 0) + 1
        return out

    def end_step(self, step: int) -> list[Anomaly]:
        """After every GPU reported at ``step``: one GPU idle while the others work."""
        gpus = [g for g in self._gpus.values() if "gpu_util_pct" in g.last]
        if len(gpus) < 2:
            return []
        util = np.array([g.last["gpu_util_pct"] for g in gpus])
        working = util >= self.idle_util
        if working.sum() * 2 < util.size:
            return self._clear_all(gpus, "util_collapse", step)
        ref = float(np.median(util[working]))
        out: list[Anomaly] = []
        for g, u in zip(gpus, util.tolist(), strict=True):
            if ref >= self.busy_util and u < self.idle_util:
                msg = (
                    f"{_where(g.labels)}: utilisation {u:.0f}% while the fleet median is "
                    f"{ref:.0f}% (input pipeline stall, a hung kernel, or a dying device)"
                )
                out += self._sustained(g, "util_collapse", step, "warning", u, msg, ref)
            else:
                out += self._clean(g, "util_collapse", step)
        return out

    def finish(self) -> list[Anomaly]:
        out = []
        for g in self._gpus.values():
            for ep, _ in g.open.values():
                ep.is_open = False
                ep.details["recovered"] = False
                out.append(ep)
            g.open.clear()
        return out

    # -- rules -----------------------------------------------------------------------------
    def _thermal(self, g: _Gpu, step: int) -> list[Anomaly]:
        temp = g.last.get("gpu_temp_c")
        throttled = g.last.get("gpu_throttle_thermal", 0.0) > 0
        severity, why = None, ""
        if temp is not None and temp >= self.temp_critical:
            severity, why = "critical", f"temperature {temp:.0f} C >= {self.temp_critical:g} C"
        elif temp is not None and temp >= self.temp_warn:
            severity, why = "warning", f"temperature {temp:.0f} C >= {self.temp_warn:g} C"
        elif throttled:
            severity, why = "warning", "thermal throttling (clocks slowed for heat)"
        elif len(g.temps) == g.temps.maxlen and g.temps[-1] - min(g.temps) >= self.runaway_rise:
            rise = g.temps[-1] - min(g.temps)
            severity = "warning"
            why = f"temperature rising {rise:.0f} C in {len(g.temps)} samples (runaway)"
        if severity is None:
            return self._clean(g, "thermal", step)
        msg = f"{_where(g.labels)}: {why}"
        return self._sustained(g, "thermal", step, severity, temp, msg, self.temp_warn)

    def _power(self, g: _Gpu, step: int) -> list[Anomaly]:
        power, limit = g.last.get("gpu_power_w"), g.last.get("gpu_power_limit_w")
        capped = g.last.get("gpu_throttle_power", 0.0) > 0
        near = power is not None and limit is not None and limit > 0 and power >= 0.98 * limit
        if not (capped or near):
            return self._clean(g, "power_cap", step)
        what = f"{power:.0f} W of a {limit:.0f} W limit" if power and limit else "power capped"
        msg = f"{_where(g.labels)}: power capping ({what}); clocks held down"
        return self._sustained(g, "power_cap", step, "info", power, msg, limit)

    def _counter(self, g: _Gpu, metric: str, step: int, value: float) -> list[Anomaly]:
        before = g.counters.get(metric)
        g.counters[metric] = value
        rule = f"ecc:{metric}"
        if before is None or value <= before:
            if metric in ("gpu_remap_failure", "gpu_remap_pending") and value > 0:
                return []  # still set: the open episode stays open
            return self._clean(g, rule, step)
        severity, what = _COUNTERS[metric]
        msg = f"{_where(g.labels)}: {what} rising ({before:g} -> {value:g})"
        out = self._hit(g, rule, "ecc", step, severity, value, msg)
        ep = g.open[rule][0]
        ep.metric = metric
        ep.details["increase"] = value - ep.details.get("first_value", before)
        ep.details.setdefault("first_value", before)
        return out

    def _memory(self, g: _Gpu, step: int) -> list[Anomaly]:
        used, total = g.last.get("gpu_mem_used_gib"), g.last.get("gpu_mem_total_gib")
        if used is None or not total:
            return []
        frac = used / total
        if frac < self.mem_fraction:
            return self._clean(g, "memory", step)
        msg = f"{_where(g.labels)}: memory {used:.1f} of {total:.1f} GiB ({frac:.1%}) in use"
        return self._hit(g, "memory", "memory", step, "warning", frac, msg, self.mem_fraction)

    # -- episodes --------------------------------------------------------------------------
    def _gpu(self, labels: Mapping[str, Any] | None) -> _Gpu:
        labels = labels or {}
        key = tuple(labels.get(k) for k in LABEL_KEYS)
        g = self._gpus.get(key)
        if g is None:
            clean = {k: v for k, v in zip(LABEL_KEYS, key, strict=True) if v is not None}
            g = self._gpus[key] = _Gpu(clean, self.runaway_samples)
        return g

    def _sustained(
        self,
        g: _Gpu,
        rule: str,
        step: int,
        severity: str,
        observed: float | None,
        msg: str,
        expected: float | None = None,
    ) -> list[Anomaly]:
        g.streak[rule] = g.streak.get(rule, 0) + 1
        if g.streak[rule] < self.sustain and rule not in g.open:
            return []
        return self._hit(g, rule, rule, step, severity, observed, msg, expected)

    def _hit(
        self,
        g: _Gpu,
        key: str,
        rule: str,
        step: int,
        severity: str,
        observed: float | None,
        msg: str,
        expected: float | None = None,
    ) -> list[Anomaly]:
        held = g.open.get(key)
        if held is None:
            ep = Anomaly(
                detector=self.name,
                metric=_METRIC_OF.get(rule, "gpu"),
                start_step=int(step),
                end_step=int(step),
                severity=severity,
                score=float(_SEV[severity]),
                observed=observed,
                message=msg,
                labels=dict(g.labels),
                expected=expected,
                details={"rule": rule},
            )
            self._episodes.append(ep)
            g.open[key] = (ep, 0)
            log.info("hardware: %s", msg)
            return [ep]
        ep = held[0]
        ep.end_step = max(ep.end_step, int(step))
        if _SEV[severity] > _SEV[ep.severity]:
            ep.severity, ep.score, ep.message, ep.observed = (
                severity,
                float(_SEV[severity]),
                msg,
                observed,
            )
        g.open[key] = (ep, 0)
        return [ep]

    def _clean(self, g: _Gpu, key: str, step: int) -> list[Anomaly]:
        g.streak[key] = 0
        held = g.open.get(key)
        if held is None:
            return []
        ep, quiet = held[0], held[1] + 1
        if quiet < self.quiet:
            g.open[key] = (ep, quiet)
            return []
        ep.is_open = False
        ep.details["recovered"] = True
        del g.open[key]
        return [ep]

    def _clear_all(self, gpus: list[_Gpu], rule: str, step: int) -> list[Anomaly]:
        out: list[Anomaly] = []
        for g in gpus:
            out += self._clean(g, rule, step)
        return out


_METRIC_OF = {
    "thermal": "gpu_temp_c",
    "power_cap": "gpu_power_w",
    "xid": "xid",
    "ecc": "gpu_ecc",
    "memory": "gpu_mem_used_gib",
    "util_collapse": "gpu_util_pct",
}


def _where(labels: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in labels.items()) or "GPU"
