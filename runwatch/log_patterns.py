"""Recognise well-known fault lines in log messages: NCCL timeouts, out-of-memory, GPU XIDs.

At scale these lines are the first trace of a hardware or network fault, and they are easy to
lose among thousands of warnings. Turning them into events of their own kind (``nccl_timeout``,
``oom``, ``xid``) puts them on the timeline beside the loss curve, where a person can see that a
crash, a slow step and an XID share one cause.

This is a pure function over one message, so the logging handler and a log-file collector
classify the same line the same way.
"""

from __future__ import annotations

import re
from typing import Any

# Known XID codes worth a name on the timeline (NVIDIA's XID catalogue; not exhaustive).
XID_NAMES: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    32: "invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}

# "NVRM: Xid (PCI:0000:3b:00): 79, pid=..." ; older drivers omit "PCI:"; DCGM says "XID error 48".
_XID = re.compile(
    r"\bXid\b\s*(?:\((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\))?\s*:?\s*(?:error\s*)?(?P<code>\d+)\b",
    re.IGNORECASE,
)
_NCCL_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout"
    r"|NCCL\s+watchdog[^\n]*?(?:timeout|timed out|terminated)"
    r"|ProcessGroupNCCL'?s watchdog got stuck"
    r"|NCCL\s+(?:operation\s+|collective\s+)?time(?:d)?\s*-?\s*out",
    re.IGNORECASE,
)
_NCCL_OP = re.compile(r"OpType=(\w+)")
_NCCL_TIMEOUT_MS = re.compile(r"Timeout\(ms\)=(\d+)")
_RANK = re.compile(r"\[(?:PG [^\]]*?\s)?Rank\s?(\d+)\]", re.IGNORECASE)
_CUDA_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"
    r"|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation",
    re.IGNORECASE,
)
_HOST_OOM = re.compile(r"Out of memory: Killed process (\d+)|oom-kill", re.IGNORECASE)
_OOM_GPU = re.compile(r"\bGPU (\d+)\b")
_OOM_TRIED = re.compile(r"Tried to allocate ([\d.]+ [KMGT]iB)")


def classify_log_message(msg: str) -> tuple[str, dict[str, Any]]:
    """Return ``(event_kind, attrs)`` for a log message; ``("log", {})`` when nothing is known.

    The order matters: an NCCL timeout often follows an XID or an OOM on another rank, but a
    line that names one of them names its own cause, so each line is matched on its own.

    >>> classify_log_message(
    ...     "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.")
    ('xid', {'xid': 79, 'pci': '0000:3b:00', 'xid_name': 'GPU has fallen off the bus'})
    >>> classify_log_message(
    ...     "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1024, "
    ...     "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600019 "
    ...     "milliseconds before timing out.")
    ('nccl_timeout', {'rank': 3, 'op': 'ALLREDUCE', 'timeout_ms': 600000})
    >>> classify_log_message("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
    ...     "2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.02 GiB is free.")
    ('oom', {'device': 'gpu', 'gpu': 0, 'tried': '2.00 GiB'})
    >>> classify_log_message("Traceback (most recent call last):")
    ('log', {})
    """
    if not msg:
        return "log", {}
    if _NCCL_TIMEOUT.search(msg):
        return "nccl_timeout", _nccl_attrs(msg)
    if _CUDA_OOM.search(msg):
        return "oom", _oom_attrs(msg)
    host = _HOST_OOM.search(msg)
    if host:
        attrs: dict[str, Any] = {"device": "host"}
        if host.group(1):
            attrs["pid"] = int(host.group(1))
        return "oom", attrs
    xid = _XID.search(msg)
    if xid:
        code = int(xid.group("code"))
        attrs = {"xid": code}
        if xid.group("pci"):
            attrs["pci"] = xid.group("pci")
        if code in XID_NAMES:
            attrs["xid_name"] = XID_NAMES[code]
        return "xid", attrs
    return "log", {}


def _nccl_attrs(msg: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if m := _RANK.search(msg):
        attrs["rank"] = int(m.group(1))
    if m := _NCCL_OP.search(msg):
        attrs["op"] = m.group(1)
    if m := _NCCL_TIMEOUT_MS.search(msg):
        attrs["timeout_ms"] = int(m.group(1))
    return attrs


def _oom_attrs(msg: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {"device": "gpu"}
    if m := _OOM_GPU.search(msg):
        attrs["gpu"] = int(m.group(1))
    if m := _OOM_TRIED.search(msg):
        attrs["tried"] = m.group(1)
    return attrs
