"""One series inside the Monitor: its detectors and the anomaly episode each has open.

A detector's verdict on a point (a ``Signal`` or None) opens, grows or closes that
detector's episode here; the Monitor records what opened and links it across series.
"""

from __future__ import annotations

import math
from typing import Any

from runwatch.detect.base import Detector, Signal
from runwatch.model import LABEL_KEYS, SEVERITIES, Anomaly

_RANK = {s: i for i, s in enumerate(SEVERITIES)}


class Series:
    """One metric + labels: its detectors, their open episodes and quiet counts."""

    __slots__ = (
        "detectors",
        "key",
        "labels",
        "last_step",
        "lk",
        "metric",
        "open",
        "quiet",
        "rewind_ok",
        "role",
    )

    def __init__(self, metric: str, labels: dict[str, Any], role: str, dets: list[Detector]):
        self.metric = metric
        self.labels = labels
        self.lk = tuple(labels.get(k) for k in LABEL_KEYS)  # the Monitor's key of the labels
        self.role = role
        self.detectors = dets
        self.open: list[Anomaly | None] = [None] * len(dets)
        self.quiet: list[int] = [0] * len(dets)
        self.last_step: int | None = None
        self.rewind_ok = False
        self.key = metric + (
            "{" + ",".join(f"{k}={v}" for k, v in labels.items()) + "}" if labels else ""
        )

    def judge(self, i: int, step: int, sig: Signal | None, out: list[Anomaly]) -> Anomaly | None:
        """Open, grow or close detector ``i``'s episode after its verdict ``sig`` on the
        point at ``step``; what changed goes to ``out``. Returns the episode if it opened."""
        ep = self.open[i]
        if sig is not None:
            self.quiet[i] = 0
            if ep is None:
                ep = _episode(self, self.detectors[i].name, step, sig)
                self.open[i] = ep
                out.append(ep)
                return ep
            grow(ep, step, sig)
            out.append(ep)
        elif ep is not None:
            self.quiet[i] += 1
            if self.quiet[i] >= self.detectors[i].quiet:
                self.close(i, recovered=True)
                out.append(ep)
        return None

    def close(self, i: int, recovered: bool) -> None:
        """Close detector ``i``'s open episode."""
        ep = self.open[i]
        assert ep is not None
        ep.is_open = False
        ep.details["recovered"] = recovered
        self.open[i] = None


def _episode(s: Series, detector: str, step: int, sig: Signal) -> Anomaly:
    details = dict(sig.details)
    details["role"] = s.role
    details["points"] = 1
    details["first_observed"] = sig.observed
    return Anomaly(
        detector=detector,
        metric=s.metric,
        start_step=step,
        end_step=step,
        severity=sig.severity,
        score=finite_score(sig.score),
        observed=sig.observed,
        message=sig.message,
        labels=dict(s.labels),
        expected=sig.expected,
        lower=sig.lower,
        upper=sig.upper,
        details=details,
    )


def grow(a: Anomaly, step: int, sig: Signal) -> None:
    """Add one more flagged point to episode ``a``: it keeps the worst point's view."""
    if step > a.end_step:
        a.end_step = step
    a.details["points"] += 1
    if _RANK[sig.severity] > _RANK[a.severity]:
        a.severity = sig.severity
    score = finite_score(sig.score)
    if score > a.score:
        a.score = score
        a.observed, a.expected = sig.observed, sig.expected
        a.lower, a.upper = sig.lower, sig.upper
        a.message = sig.message
        peak = a.details.get("peak_ratio")
        a.details.update(sig.details)
        if peak is not None and not (sig.details.get("peak_ratio", 0) >= peak):
            a.details["peak_ratio"] = peak
    else:
        for k in ("duration", "peak_ratio", "peak", "adapted"):
            if k in sig.details:
                a.details[k] = sig.details[k]


def finite_score(x: float) -> float:
    """An episode's score: an infinite or NaN one counts as 1000 (far past any threshold)."""
    return x if math.isfinite(x) else 1000.0
