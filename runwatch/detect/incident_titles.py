"""How an incident is named: what its members are, how many, how big, where and how often.

A title reads like what a person would write in a postmortem: "69 train_loss spikes of
×1.03–1.1, steps 660–18,627, about every 190 steps; largest at step 16,643", or, for a
failure, its count, attempts and hosts and its signature (one occurrence: its message as
logged).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from runwatch.detect.fingerprint import signature
from runwatch.model import severity_rank

if TYPE_CHECKING:
    from runwatch.detect.incidents import Member

NOUNS = {
    "spike": ("spike", "spikes"),
    "nonfinite": ("non-finite episode", "non-finite episodes"),
    "divergence": ("divergence", "divergences"),
    "curve_deviation": ("departure from the expected curve", "departures from the expected curve"),
    "stall": ("stall", "stalls"),
    "regression": ("slowdown", "slowdowns"),
    "host_busy": ("stretch of a busy host", "stretches of a busy host"),
    "straggler": ("straggler episode", "straggler episodes"),
    "hardware": ("hardware fault", "hardware faults"),
    "hang": ("hang", "hangs"),
    "lr_sanity": ("learning-rate anomaly", "learning-rate anomalies"),
    "grad_norm_precursor": ("grad-norm precursor", "grad-norm precursors"),
    "crash": ("crash", "crashes"),
    "oom": ("out-of-memory crash", "out-of-memory crashes"),
    "nccl_timeout": ("NCCL timeout", "NCCL timeouts"),
    "xid": ("Xid error", "Xid errors"),
    "log": ("error log line", "error log lines"),
}
"""What a detector's episode or an event kind is called, one and many."""


def noun(what: str, n: int) -> str:
    one, many = NOUNS.get(what, (f"{what} episode", f"{what} episodes"))
    return one if n == 1 else many


def title(
    members: list[Member],
    details: Mapping[str, Any],
    lead_event: Member | None,
) -> str:
    n = details["occurrences"]
    lead = members[0]
    if lead_event is not None:
        lead = lead_event
        sig = signature(lead.message)
        # Where the occurrences' causes were, not their consequences' (the peers' timeouts).
        attempts = {o["attempt"] for o in details["at"] if o.get("attempt") is not None}
        hosts = {o.get("host") for o in details["at"]} - {None}
        where = f" in {len(attempts)} attempts" if len(attempts) > 1 else ""
        where += f" on {len(hosts)} hosts" if len(hosts) > 1 else ""
        # One occurrence reads best as it was logged; several by what they share.
        text = lead.message.strip().splitlines()[0] if n == 1 else sig
        short = text if len(text) <= 90 else text[:87] + "..."
        count = "" if n == 1 else f"{n} "
        return f"{count}{noun(lead.what, n)}{where}: {short}"
    if n == 1 and len(members) == 1:
        return lead.message or f"{noun(lead.what, 1)} on {lead.metric} at step {lead.step}"
    kinds = sorted({(m.what, m.metric) for m in members if m.kind == "anomaly"})
    main = main_member(members)
    ranks = {m.label_dict.get("rank") for m in members} - {None}
    count = "" if n == 1 else f"{n} "
    text = f"{count}{main.metric or ''} {noun(main.what, n)}".replace("  ", " ")
    if "size_low" in details and main.what in ("spike", "regression", "divergence"):
        low, high = _fmt(details["size_low"]), _fmt(details["size_high"])
        text += f" of ×{low}" if low == high else f" of ×{low}–{high}"
    others = sorted(
        {
            f"{w_metric} {noun(w, 1)}"
            for w, w_metric in kinds
            if (w, w_metric) != (main.what, main.metric) and w != "grad_norm_precursor"
        }
    )
    if others:
        text += f" with {', '.join(others)}"
    if len(ranks) > 1:
        text += f" on {len(ranks)} ranks"
    first, last = members[0].step, max(m.end_step or m.step or 0 for m in members)
    text += f" at step {first:,}" if first == last else f", steps {first:,}–{last:,}"
    if "period" in details:
        text += f", about every {details['period']:,} steps"
    if "largest_at" in details and n > 1:
        text += f"; largest at step {details['largest_at']:,}"
    return text


TITLE_ORDER = ("nonfinite", "divergence", "straggler", "hardware", "spike", "regression")
"""Which member a title is about when severities tie: the consequence a person acts on."""


def main_member(members: list[Member]) -> Member:
    """The member a title is about: the most severe, then by :data:`TITLE_ORDER`, then a
    loss before other metrics, then the first."""

    def rank(i: int) -> tuple[Any, ...]:
        m = members[i]
        order = TITLE_ORDER.index(m.what) if m.what in TITLE_ORDER else len(TITLE_ORDER)
        return (-severity_rank(m.severity), order, "loss" not in (m.metric or ""), i)

    return members[min(range(len(members)), key=rank)]


def _fmt(x: float) -> str:
    return f"{x:.3g}"
