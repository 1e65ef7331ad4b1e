"""Crash and error messages normalised into a signature, so one cause is one group.

The same failure prints a different line on every rank, host, attempt and step: the rank,
PID, PCI bus id, paths, addresses, timestamps, sizes and durations change while the words
that name the cause (the error class, the CUDA error kind, the NCCL op, the Xid code) stay.
:func:`signature` rewrites the first kind into placeholders (``<num>``, ``<hex>``,
``<path>``...) and keeps the second, as Sentry's message grouping parameterises a message
before it groups events; :func:`fingerprint` is a short hash of it to store and join on.

The rules are one ordered table, :data:`RULES`, applied top to bottom: each rule sees what
the rules above it left, so prefixes are stripped before timestamps, and specific forms
(PCI ids, times, sizes) are taken before the catch-all number rule. Numbers that tell
causes apart are kept: an Xid code (79, fell off the bus, is not 48, a double-bit ECC
error), an exit code, a signal number, an errno or error code. Placeholders hold no digits
or slashes, so a signature normalises to itself.

Catches: one cause printed with different where/when/how-much details. Misses: one cause
printed with different words (an older PyTorch wording, a different call path in a full
traceback), and two causes that differ only in a number that is replaced.

>>> a = "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, "
>>> a += "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600060 milliseconds before timing out."
>>> signature(a)
'[Rank <rank>] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=<num>, \
OpType=ALLREDUCE, Timeout(ms)=<num>) ran for <duration> before timing out'
>>> signature("NVRM: Xid (PCI:0000:3b:00): 79, pid=2113, name=python, GPU has fallen off the bus.")
'NVRM: Xid (PCI:<pci>): 79, GPU has fallen off the bus'
>>> fingerprint(a) == fingerprint(a.replace("Rank 3", "Rank 12").replace("1580", "77"))
True
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

__all__ = ["RULES", "fingerprint", "signature"]

_I = re.IGNORECASE
_M = re.MULTILINE

# A number right after one of these names a cause (Xid 79, exitcode -11, [Errno 28],
# Signal 11, an InfiniBand "error 12", a segfault's "error 4"): the catch-all number rule
# leaves it as it is.
_KEEP_BEFORE = re.compile(
    r"(?:\bxid\s?(?:\((?:pci:)?<pci>\):?\s?)?"
    r"|(?:\bexit\s?|\b)code|\b(?:errno|error|err|status|signal))\s?[:=]?\s?$",
    _I,
)


def _number(m: re.Match[str]) -> str:
    if _KEEP_BEFORE.search(m.string, max(0, m.start() - 24), m.start()):
        return m.group(0)
    return "<num>"


_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_TLD = r"(?:com|net|org|edu|gov|io|ai|dev|cloud|internal|local|lan|localdomain|cluster|de|uk)"

Rule = tuple[re.Pattern[str], "str | Callable[[re.Match[str]], str]", str]

RULES: tuple[Rule, ...] = (
    (re.compile(r"[ \t]+"), " ", "runs of spaces are layout (padded tables, aligned logs)"),
    (
        re.compile(r"^ ?[^\n]{0,80}?\bkernel: (?:\[ ?\d+\.\d+\] ?)?", _M),
        "",
        "a syslog header before 'kernel:' says when and on which host",
    ),
    (
        re.compile(r"^ ?\[(?: ?\d+\.\d+|[A-Z][a-z]{2} [A-Z][a-z]{2} +\d+ [\d:]+ \d{4})\] ?", _M),
        "",
        "a dmesg stamp ([ 1843.308145], or -T's [Fri Aug 30 11:43:14 2024]) says when",
    ),
    (
        re.compile(r"^ ?(?:\[rank\d+\]: ?)?\[[IWEF]\d{0,4}(?: [\d:.]+)? [\w.]+:\d+\] ?", _M),
        "",
        "a PyTorch/glog header ([rank0]:[E321 02:07:08.408 File.cpp:607]) says where and when",
    ),
    (
        re.compile(r"^ ?[\w.-]+:\d+:\d+ \[\d+\] ?", _M),
        "",
        "NCCL's log prefix (host:pid:tid [device]) says where",
    ),
    (
        re.compile(r"(\bNCCL WARN NET/[^\n]*) \((?:Send|Recv)\)$", _M),
        r"\1",
        "which end of a network link saw a failed completion says where, not what",
    ),
    (
        re.compile(
            r"\bXid \((?:PCI:)?(?:<pci>|[0-9A-Fa-f]{4,8}:[0-9A-Fa-f:.]+)\):? (\d+),"
            r"(?: pid=[^,]*,)?(?: name=[^,]*,)?"
        ),
        r"Xid (PCI:<pci>): \1,",
        "an Xid's bus id, pid and process name say where; its code says what",
    ),
    (
        re.compile(r"\b[a-z][a-z0-9+.-]{0,15}://[^\s'\"<>)]+", _I),
        "<url>",
        "a URL is an address (and would read as a path)",
    ),
    (
        re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", _I),
        "<uuid>",
        "a UUID names one GPU, job or request",
    ),
    (
        re.compile(r"(?:\b[A-Za-z]:\\|\\\\)[^\s'\"<>,;|]+"),
        "<path>",
        "a Windows path says where the code or data lives on one machine",
    ),
    (
        re.compile(
            r"(?<![\w<>.])(?:~|\.{1,2})?(?:/[\w.+@~-]+)+/?"
            r"|(?<![\w./-])[\w.-]++(?:/[\w.+@-]+)+\.[A-Za-z]\w*"
        ),
        "<path>",
        "a Unix path (absolute, or relative with a file extension) says where, on one machine",
    ),
    (
        re.compile(
            r"\b\d{4}-\d\d-\d\d(?:[T _]\d\d:\d\d(?::\d\d)?(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)?\b"
        ),
        "<time>",
        "an ISO date or time (2024-05-01 12:00:03,123; torchrun's 2024-03-05_07:01:51) says when",
    ),
    (
        re.compile(r"\b[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}(?:\.[0-7])?\b", _I),
        "<pci>",
        "a PCI bus id (0000:3b:00.0) says which GPU or NIC",
    ),
    (
        re.compile(rf"\b(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun),? )?{_MONTH} +\d{{1,2}}\b"),
        "<time>",
        "a syslog or ctime date (Jul 17) says when",
    ),
    (
        re.compile(r"\b\d{1,2}:\d\d:\d\d(?:[.,]\d+)?\b"),
        "<time>",
        "a clock time says when",
    ),
    (
        re.compile(r"\b1[5-9]\d{8}(?:\d{3}|\.\d+)?\b"),
        "<time>",
        "a Unix epoch in seconds or milliseconds (2017-2033) says when",
    ),
    (
        re.compile(
            r"(?:\b\d{1,3}(?:\.\d{1,3}){3}(?!\d|\.\d)|\[[0-9a-f]*:[0-9a-f:]+\])"
            r"(?::\d{1,5}(?!\d)|<\d+>)?",
            _I,
        ),
        "<ip>",
        "an IPv4/IPv6 address and port (:29500, NCCL's <55555>) say which host",
    ),
    (
        re.compile(rf"(?<![\w.-])(?:[a-z0-9-]+\.)+{_TLD}\b", _I),
        "<host>",
        "a domain name says which host",
    ),
    (
        re.compile(r"\b(host(?:name)?\s?[:=]\s?)[\w.-]+", _I),
        r"\1<host>",
        "torchrun's 'host : node7' says which host",
    ),
    (
        re.compile(r"\b((?:local_|global_|node_|group_)?rank\s?[:=]?\s?)\d+", _I),
        r"\1<rank>",
        "a rank (rank 3, [Rank 12], [rank0]:, local_rank: 1) says which process",
    ),
    (
        re.compile(r"\b(pid\b\s?[:=]?\s?)(?:'?<unknown>'?|\d+)", _I),
        r"\1<pid>",
        "a PID (pid=1234, PID 6421, pid: 17966) is one process",
    ),
    (
        re.compile(r"\b0x[0-9a-f]+\b", _I),
        "<hex>",
        "a 0x address or code pointer moves with ASLR and allocation",
    ),
    (
        re.compile(
            r"(?<![\w.])(?:(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{5,}|0[0-9a-f]{7,})(?![\w])", _I
        ),
        "<hex>",
        "a bare hex run (segfault ip/sp, Xid channel 0000000c, a container id) is an address or id",
    ),
    (
        re.compile(r"\b\d+(?:\.\d+)?\s?(?:[KMGTPE]i?B|[kKMGT]B|bytes?)\b"),
        "<size>",
        "an amount of memory (Tried to allocate 2.00 GiB; 0 bytes free) says how much",
    ),
    (
        re.compile(
            r"\b\d+(?:\.\d+)?\s?(?:milliseconds?|microseconds?|nanoseconds?|seconds?|secs?"
            r"|minutes?|mins?|hours?|hrs?|ms|us|µs|ns|s|h)\b"
        ),
        "<duration>",
        "a duration (ran for 600013 milliseconds, 30s) says how long",
    ),
    (
        re.compile(r"torch\.Size\(\[[-\d, ]*\]\)|[\[(]-?\d+(?:, ?-?\d+)+[\])]"),
        "<shape>",
        "a tensor shape or size tuple ([4, 512], torch.Size([8, 1024])) says how big",
    ),
    (
        re.compile(r"(?<![A-Za-z0-9])-?\d+(?:\.\d+)*(?:[eE][-+]?\d+)?"),
        _number,
        "any other number (step, sequence, line, count, GPU index, version) is a detail",
    ),
    (re.compile(r"^ +| *\.? *$", _M), "", "edges of lines, and a final full stop, are layout"),
)
"""The ordered rules: (pattern, replacement, why). Applied top to bottom."""


def signature(message: str) -> str:
    """Normalise an error message into the text that one cause shares everywhere.

    Parameters
    ----------
    message : str
        A crash, error or kernel log message: one line or several (a traceback keeps its
        frames' function names; its paths and line numbers go).

    Returns
    -------
    str
        The message with :data:`RULES` applied; ``signature(signature(m)) == signature(m)``.
    """
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, not {type(message).__name__}")
    text = message.replace("\r\n", "\n").strip()
    for pattern, replacement, _why in RULES:
        text = pattern.sub(replacement, text)
    return text.strip()


def fingerprint(message: str) -> str:
    """A short stable id of a message's :func:`signature`: 16 hex digits (BLAKE2b, 64 bit).

    Parameters
    ----------
    message : str
        The raw message (it is normalised first).
    """
    return hashlib.blake2b(signature(message).encode("utf-8"), digest_size=8).hexdigest()
