"""Incidents: a run's anomaly episodes and failure events grouped by the cause they share.

Two steps, each a function of the whole set of members (never of the order they came in,
so what is formed live equals what a replay forms):

1. **Chains of co-occurring symptoms** (connected components of these links):
   a grad-norm spike, the loss spike it preceded and their precursor record; a divergence or
   non-finite loss and the loss spike just before it; non-finite values in several series
   within a few steps; step-time, throughput and straggler episodes whose steps overlap (one
   slowdown, seen by step time and tokens/s, on one rank or all); a GPU's hardware faults
   and that rank's straggling or slow steps; NCCL timeouts and crashes that follow a GPU's
   Xid in the same attempt.
2. **Recurring patterns**: chains with the same shape (each member's detector, metric,
   labels and severity; an error event's kind and message signature, ``fingerprint.py``)
   are one incident, with its count, first and last step, sizes and period. A slowdown shared
   by several ranks has a shape without ranks: one run-level incident, not one per rank.

Every member stays attached; nothing is dropped. Hypotheses (``hypotheses.py``) need the
run's exposure and are attached by the pipeline.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runwatch.detect.fingerprint import signature
from runwatch.detect.incident_titles import main_member, title
from runwatch.detect.roles import role_of
from runwatch.model import Incident, severity_rank

CHAIN_SLACK = 20
"""Episodes this many steps apart or less still co-occur (a slowdown seen a little late)."""
DIVERGENCE_LOOKBACK = 50
"""A divergence or NaN this many steps after a loss spike is that spike's consequence."""
AFTERMATH_S = 1800.0
"""Failure events this long after an attempt's first one, in that attempt, are its
consequences: the peers of a dead rank time out in NCCL's watchdog (10 min by default)."""
MAX_OCCURRENCES = 1000
CONTEXT_ONLY = ("host_busy",)
"""Episodes that join the incident of a symptom they overlap but make none alone: a busy
host explains a slowdown; with no slowdown there is nothing to judge."""
PEER_RANKS = 4
"""From this many ranks reporting a metric (the straggler detector's minimum), a rank's
slowdown against its own baseline is judged against its peers: alone, and not named a
straggler, it is info."""
"""Occurrences listed in an incident's details; the count is always complete."""

_THROUGHPUT_ROLES = ("step_time", "throughput")
_WARNING = severity_rank("warning")
_RANKLESS = ("straggler", "throughput")  # shape families that drop ranks when shared


@dataclass(frozen=True, slots=True)
class Member:
    """One anomaly episode or failure event, as the grouping sees it."""

    kind: str  # "anomaly" | "event"
    id: int  # its row id in the store
    what: str  # the detector, or the event kind
    step: int | None
    end_step: int | None
    severity: str
    metric: str | None = None
    labels: tuple[tuple[str, Any], ...] = ()
    size: float | None = None  # how far off: observed / expected where both are known
    is_open: bool = False
    message: str = ""
    time: float | None = None
    attempt: int | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label_dict(self) -> dict[str, Any]:
        return dict(self.labels)

    def order(self) -> tuple[Any, ...]:
        """A total order that does not depend on row ids (live and replay number apart)."""
        step = math.inf if self.step is None else self.step
        return (step, self.kind, self.what, self.metric or "", repr(self.labels), self.message)


def form_incidents(
    members: Sequence[Member],
    roles: Mapping[str, str] | None = None,
    attempt_starts: Mapping[int, int | None] | None = None,
    ranks: Mapping[str, int] | None = None,
) -> list[Incident]:
    """Group ``members`` into incidents, in order of their first step.

    ``roles`` overrides metric roles as ``Monitor(config)`` does; ``attempt_starts`` maps an
    attempt to the step it resumed from, to count the steps a crash cost; ``ranks`` maps a
    metric to how many ranks report it (for :data:`PEER_RANKS`).
    """
    ms = sorted(members, key=Member.order)
    roles = dict(roles or {})
    parent = list(range(len(ms)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def link(i: int, j: int) -> None:
        a, b = find(i), find(j)
        if a != b:
            parent[max(a, b)] = min(a, b)

    for i, j in _links(ms, roles):
        link(i, j)
    chains: dict[int, list[int]] = defaultdict(list)
    for i in range(len(ms)):
        chains[find(i)].append(i)
    patterns: dict[str, list[list[int]]] = defaultdict(list)
    for chain in chains.values():
        if all(ms[i].what in CONTEXT_ONLY for i in chain):
            continue
        patterns[_shape(chain, ms, roles)].append(chain)
    incidents = [
        _incident(shape, group, ms, attempt_starts or {}, ranks or {})
        for shape, group in patterns.items()
    ]
    incidents.sort(key=lambda inc: (inc.first_step is None, inc.first_step or 0, inc.key))
    return incidents


# ------------------------------------------------------------------ links between members
def _links(ms: Sequence[Member], roles: Mapping[str, str]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    spikes: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for i, m in enumerate(ms):
        if m.kind == "anomaly" and m.what == "spike":
            spikes[(m.metric, m.labels, m.step)].append(i)
    loss_spikes: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for i, m in enumerate(ms):
        if m.kind == "anomaly" and m.what == "spike" and role_of(m.metric or "", roles) == "loss":
            loss_spikes[(m.metric, m.labels)].append(i)
    for i, m in enumerate(ms):
        if m.kind != "anomaly":
            continue
        if m.what == "grad_norm_precursor":
            d = m.details
            for key in (
                (d.get("grad_norm_metric"), m.labels, d.get("grad_norm_start")),
                (d.get("loss_metric", m.metric), m.labels, d.get("loss_start")),
            ):
                out += [(i, j) for j in spikes.get(key, ())]
        elif m.what in ("divergence", "nonfinite") and m.step is not None:
            for j in loss_spikes.get((m.metric, m.labels), ()):
                if 0 <= m.step - (ms[j].step or 0) <= DIVERGENCE_LOOKBACK:
                    out.append((i, j))
    out += _overlaps(ms, roles)
    out += _aftermath(ms)
    return out


def _family(m: Member, roles: Mapping[str, str]) -> str | None:
    """Which co-occurrence family an anomaly belongs to, if any."""
    if m.kind != "anomaly":
        return None
    if m.what == "nonfinite":
        return "nonfinite"
    if m.what == "straggler":
        return "straggler"
    if m.what == "hardware":
        return "hardware"
    if m.what == "host_busy":
        return "busy"
    if role_of(m.metric or "", roles) in _THROUGHPUT_ROLES:
        return "throughput"
    return None


def _overlaps(ms: Sequence[Member], roles: Mapping[str, str]) -> list[tuple[int, int]]:
    """Links between anomalies whose steps overlap (within ``CHAIN_SLACK``), by family:
    throughput with throughput (one process's, or warnings on any rank: a shared
    slowdown), stragglers with their rank's
    throughput, hardware and busy host, NaNs with NaNs, busy processes on one host."""
    tagged = [
        (m.step, m.end_step if m.end_step is not None else m.step, i, fam)
        for i, m in enumerate(ms)
        if m.step is not None and (fam := _family(m, roles)) is not None
    ]
    tagged.sort()
    out = []
    active: list[tuple[int, int, str]] = []  # (end, index, family) of earlier intervals
    for start, end, i, fam in tagged:
        active = [a for a in active if a[0] + CHAIN_SLACK >= start]
        for _, j, other in active:
            if _co_occur(ms[i], fam, ms[j], other):
                out.append((j, i))
        active.append((end, i, fam))
    return out


def _co_occur(a: Member, fa: str, b: Member, fb: str) -> bool:
    pair = {fa, fb}
    if pair == {"nonfinite"}:
        return True
    if pair == {"throughput"}:
        # One process's series always; across ranks only warnings (a shared slowdown),
        # or the info noise of many ranks chains a whole run into one incident.
        warned = min(severity_rank(a.severity), severity_rank(b.severity)) >= _WARNING
        return _same_device(a, b) or warned
    if pair <= {"straggler", "throughput", "hardware", "busy"} and fa != fb:
        return _same_device(a, b)
    if pair == {"busy"}:  # the processes of one host are busy at once: the host is
        return a.label_dict.get("host") == b.label_dict.get("host")
    return False


def _same_device(a: Member, b: Member) -> bool:
    """One process or GPU: the same labels (none, for a single-process run), the same
    rank, or the same host and GPU."""
    if a.labels == b.labels:
        return True
    la, lb = a.label_dict, b.label_dict
    if la.get("rank") is not None and la.get("rank") == lb.get("rank"):
        return True
    return (
        la.get("host") is not None
        and la.get("host") == lb.get("host")
        and la.get("gpu") is not None
        and la.get("gpu") == lb.get("gpu")
    )


def _aftermath(ms: Sequence[Member]) -> list[tuple[int, int]]:
    """An attempt's first failure (a crash, OOM, NCCL timeout, hang or Xid; not an error log
    line) linked to the failures after it in that attempt: one failure seen by many ranks."""
    by_attempt: dict[Any, list[int]] = defaultdict(list)
    for i, m in enumerate(ms):
        if m.kind == "event" and m.what != "log" and m.time is not None:
            by_attempt[m.attempt].append(i)
    out = []
    for found in by_attempt.values():
        found.sort(key=lambda i: (ms[i].time, ms[i].order()))
        first = found[0]
        for j in found[1:]:
            if ms[j].time - ms[first].time > AFTERMATH_S:  # type: ignore[operator]
                first = j  # a later, separate failure in a long attempt
            else:
                out.append((first, j))
    return out


def _cause(chain: Sequence[Member]) -> Member:
    """The member that leads an occurrence: its first failure event in time (the Xid, not
    the timeouts it caused), else its first member."""
    events = [m for m in chain if m.kind == "event" and m.time is not None]
    if events:
        return min(events, key=lambda m: (m.time, m.order()))
    return min(chain, key=Member.order)


# ------------------------------------------------------------------ shapes and incidents
def _member_shape(m: Member, drop_rank: bool) -> tuple:
    labels = tuple((k, v) for k, v in m.labels if not (drop_rank and k in ("rank", "host", "gpu")))
    return ("anomaly", m.what, m.metric, labels, m.severity)


def _shape(chain: list[int], ms: Sequence[Member], roles: Mapping[str, str]) -> str:
    """The chain's pattern: what recurs. Ranks are left out where the chain spans ranks
    (a shared slowdown) or holds events (a signature recurs on any rank)."""
    cause = _cause([ms[i] for i in chain])
    if cause.kind == "event":  # a failure recurs as its cause's signature, on any rank
        return json.dumps([("event", cause.what, signature(cause.message))])
    ranks = {ms[i].label_dict.get("rank") for i in chain if ms[i].kind == "anomaly"}
    spans = len(ranks) > 1
    parts = sorted(
        {_member_shape(ms[i], spans and _family(ms[i], roles) in _RANKLESS) for i in chain},
        key=repr,
    )
    return json.dumps(parts, default=str)


def _size(m: Member) -> float | None:
    return m.size if m.size is not None and math.isfinite(m.size) else None


def _incident(
    shape: str,
    group: list[list[int]],
    ms: Sequence[Member],
    attempt_starts: Mapping[int, int | None],
    ranks: Mapping[str, int],
) -> Incident:
    group.sort(key=lambda chain: ms[chain[0]].order())
    everyone = sorted((i for chain in group for i in chain), key=lambda i: ms[i].order())
    members = [ms[i] for i in everyone]
    steps = [m.step for m in members if m.step is not None]
    ends = [m.end_step if m.end_step is not None else m.step for m in members]
    ends = [e for e in ends if e is not None]
    severity = max((m.severity for m in members), key=severity_rank)
    peers = _peers_of_lone_rank(members, ranks) if severity != "info" else 0
    if peers:
        severity = "info"
    lead = _cause([ms[i] for i in group[0]])
    lead_event = lead if lead.kind == "event" else None
    occurrences = [_occurrence([ms[i] for i in chain], attempt_starts) for chain in group]
    details: dict[str, Any] = {
        "occurrences": len(group),
        "at": occurrences[:MAX_OCCURRENCES],
        "kinds": sorted({f"{m.kind}:{m.what}" for m in members}),
    }
    if peers:
        details["peers"] = (
            f"slower than its own baseline, not named a straggler against its {peers} peers: info"
        )
    main = main_member(members)
    sizes = [
        (s, m.step)
        for m in members
        if (m.what, m.metric) == (main.what, main.metric) and (s := _size(m)) is not None
    ]
    if sizes:
        ordered = sorted(s for s, _ in sizes)
        largest = max(sizes, key=lambda p: abs(math.log(p[0])) if p[0] > 0 else abs(p[0]))
        details.update(
            size_low=ordered[0],
            size_typical=ordered[len(ordered) // 2],
            size_high=ordered[-1],
            largest_at=largest[1],
        )
    starts = sorted({ms[chain[0]].step for chain in group if ms[chain[0]].step is not None})
    if len(starts) > 2:
        gaps = sorted(b - a for a, b in itertools.pairwise(starts))
        details["period"] = gaps[len(gaps) // 2]
    return Incident(
        key=hashlib.sha1(shape.encode()).hexdigest()[:20],
        title=title(members, details, lead_event),
        severity=severity,
        first_step=min(steps) if steps else None,
        last_step=max(ends) if ends else None,
        count=len(members),
        members=[(m.kind, m.id) for m in members],
        signature=signature(lead_event.message) if lead_event is not None else None,
        is_active=any(m.is_open for m in members),
        details=details,
    )


def _peers_of_lone_rank(members: Sequence[Member], ranks: Mapping[str, int]) -> int:
    """How many peers judge these members, when they are one rank's slowdowns alone (only
    regression episodes, one rank, a metric at least PEER_RANKS ranks report); else 0."""
    if any(m.kind != "anomaly" or m.what != "regression" for m in members):
        return 0
    if len({m.label_dict.get("rank") for m in members}) != 1:
        return 0
    if members[0].label_dict.get("rank") is None:
        return 0
    n = min(ranks.get(m.metric or "", 0) for m in members)
    return n - 1 if n >= PEER_RANKS else 0


def _occurrence(chain: list[Member], attempt_starts: Mapping[int, int | None]) -> dict[str, Any]:
    """Where one occurrence happened: its step, attempt, rank, host, GPU, and for a failure
    the steps its restart redid (the crash step minus where the next attempt resumed)."""
    lead = _cause(chain)
    labels = lead.label_dict
    out: dict[str, Any] = {"step": lead.step, "attempt": lead.attempt}
    for k in ("rank", "host", "gpu"):
        v = labels.get(k)
        if v is not None:
            out[k] = v
    if lead.kind == "event" and lead.attempt is not None and lead.step is not None:
        resumed = attempt_starts.get(lead.attempt + 1)
        if resumed is not None:
            out["steps_lost"] = max(0, lead.step - resumed)
    return out
