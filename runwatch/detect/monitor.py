"""The Monitor: points and events in, anomaly episodes out.

One Monitor serves live watching (the hook's writer thread, ``runwatch serve``) and replay
(``runwatch analyze``): it holds no clock and no randomness, so the same points in the same
order give the same anomalies. Memory is bounded: per series a fixed set of detectors with
fixed windows, and a ring of the last ``max_anomalies`` episodes.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from runwatch.detect.base import Detector, LRAware, Signal
from runwatch.detect.deviation import CurveDeviation
from runwatch.detect.roles import DEFAULT_DETECTORS, ROLES, role_of
from runwatch.detect.spike import Spike
from runwatch.expect.lrclock import LRClock
from runwatch.expect.reference import ReferenceCurve
from runwatch.model import LABEL_KEYS, SEVERITIES, Anomaly, Event, label_value

log = logging.getLogger("runwatch.detect")

_RANK = {s: i for i, s in enumerate(SEVERITIES)}
_NO_LABELS = (None, None, None)
PRECURSOR_WINDOW = 20
"""A grad-norm spike at most this many steps before a loss spike is linked to it."""


class _Series:
    """One metric + labels: its detectors and their open episodes."""

    __slots__ = (
        "detectors",
        "key",
        "labels",
        "last_step",
        "metric",
        "open",
        "quiet",
        "rewind_ok",
        "role",
    )

    def __init__(self, metric: str, labels: dict[str, Any], role: str, dets: list[Detector]):
        self.metric = metric
        self.labels = labels
        self.role = role
        self.detectors = dets
        self.open: list[Anomaly | None] = [None] * len(dets)
        self.quiet: list[int] = [0] * len(dets)
        self.last_step: int | None = None
        self.rewind_ok = False
        self.key = metric + (
            "{" + ",".join(f"{k}={v}" for k, v in labels.items()) + "}" if labels else ""
        )


class Monitor:
    """Turns a stream of points and events into anomaly episodes.

    ``config`` maps metric names (or fnmatch patterns) to roles, overriding the roles read
    from names (``loss``, ``*_loss``, ``grad_norm*``, ``lr``, ``tokens_per_s``,
    ``step_time*``, ...); a nested ``{"roles": {...}}`` is accepted too. Each role gets its
    default detectors (``runwatch.detect.roles.DEFAULT_DETECTORS``). The first series of
    role ``lr`` is the run's learning rate: it feeds an :class:`~runwatch.expect.LRClock`
    that the expected-curve and stall detectors of every loss series judge by
    (``CurveDeviation``, ``Stall``: an LR schedule is expected, not flagged).
    ``references`` maps loss metrics to an earlier run's curve (reference mode): their
    expected curve is that curve, not a fit.

    ``update`` returns the anomalies that opened, were updated or closed at that point;
    an episode stays one ``Anomaly`` object, updated in place while it is open, and closes
    when its detector has been quiet for ``detector.quiet`` points.

    >>> m = Monitor()
    >>> out = [m.update("loss", {}, s, v) for s, v in enumerate([2.0, 1.9, float("nan")])]
    >>> a = out[2][0]
    >>> (a.detector, a.severity, a.start_step, a.is_open)
    ('nonfinite', 'critical', 2, True)
    >>> closed = m.finish()
    >>> closed[0] is a, a.is_open
    (True, False)
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        max_anomalies: int = 10_000,
        references: Mapping[str, ReferenceCurve] | None = None,
    ):
        config = dict(config or {})
        roles = dict(config.pop("roles", {}) or {})
        roles.update(config)
        for metric, role in roles.items():
            if role not in ROLES:
                raise ValueError(
                    f"role {role!r} for metric {metric!r} is invalid; "
                    f"valid values: {', '.join(ROLES)}"
                )
        self.config = roles
        self.max_anomalies = max_anomalies
        self.references = dict(references or {})
        self._series: dict[tuple[Any, ...], _Series] = {}
        self._anomalies: deque[Anomaly] = deque(maxlen=max_anomalies)
        self._n_points = 0
        self._n_out_of_order = 0
        self._n_errors = 0
        self._n_bad = 0
        self.lr_clock = LRClock()
        self._lr_series: _Series | None = None
        # Batch replay (runwatch.detect.batch) defers precursor links and orders anomalies
        # by the row that opened them; live use leaves these unused.
        self._deferred: list[tuple[int, _Series, int, Anomaly]] | None = None
        self._row = 0
        self._order: dict[int, tuple[int, int, int]] = {}
        self._gn_spike: dict[tuple[Any, ...], tuple[int, Anomaly]] = {}
        self._loss_spike: dict[tuple[Any, ...], tuple[int, Anomaly]] = {}

    # ------------------------------------------------------------------ results
    @property
    def anomalies(self) -> list[Anomaly]:
        """All episodes seen so far, open and closed (the last ``max_anomalies``)."""
        return list(self._anomalies)

    @property
    def health(self) -> dict[str, Any]:
        """Run-level figures: OLMo 2 spike score per loss / grad-norm series, counts."""
        spike_score: dict[str, float] = {}
        grad_spike_score: dict[str, float] = {}
        for s in self._series.values():
            if s.role in ("loss", "grad_norm"):
                for d in s.detectors:
                    if isinstance(d, Spike):
                        target = spike_score if s.role == "loss" else grad_spike_score
                        target[s.key] = d.spike_score
        by_sev = dict.fromkeys(SEVERITIES, 0)
        for a in self._anomalies:
            by_sev[a.severity] += 1
        return {
            "points": self._n_points,
            "series": len(self._series),
            "out_of_order_points": self._n_out_of_order,
            "detector_errors": self._n_errors,
            "bad_points": self._n_bad,
            "spike_score": spike_score,
            "grad_norm_spike_score": grad_spike_score,
            "open_anomalies": sum(a.is_open for a in self._anomalies),
            "anomalies_by_severity": by_sev,
        }

    # ------------------------------------------------------------------ input
    def update(
        self,
        metric: str,
        labels: Mapping[str, Any] | None,
        step: int,
        value: float,
        time: float | None = None,
    ) -> list[Anomaly]:
        """Feed one point; return the anomalies opened, updated or closed by it.

        ``time`` is accepted for the contract but not used: detectors judge by step and
        by point order, which is what keeps replay identical to live watching.
        """
        lk = tuple(label_value(labels.get(k)) for k in LABEL_KEYS) if labels else _NO_LABELS
        series = self._series.get((metric, lk))
        if series is None:
            series = self._new_series(metric, lk)
        self._n_points += 1
        try:
            step = int(step)
            value = float(value)
        except (TypeError, ValueError, OverflowError):
            # Not a number: the hook refuses these; a direct caller gets a count, not a crash.
            self._n_bad += 1
            return []
        dets = series.detectors
        last = series.last_step
        if last is None or step >= last:
            series.last_step = step
            series.rewind_ok = False
        elif series.rewind_ok:
            # The run restarted from a checkpoint: the steps after it are redone.
            series.rewind_ok = False
            series.last_step = step
            for d in dets:
                d.rewind(step)
            if series is self._lr_series:
                self.lr_clock.rewind(step)
        else:
            # Out of order without a restart: only the non-finite check sees it, so a
            # late point cannot corrupt the baselines.
            self._n_out_of_order += 1
            dets = dets[:1]
        if series is self._lr_series and dets is series.detectors and math.isfinite(value):
            self.lr_clock.add(step, value)
        out: list[Anomaly] = []
        opened = series.open
        for i, det in enumerate(dets):
            try:
                sig = det.update(step, value)
            except Exception:
                self._failed(series, det, step)
                sig = None
            if sig is not None or opened[i] is not None:
                self._handle(series, i, det, step, sig, out)
        return out

    def _feed(self, series: _Series, i: int, step: int, value: float, out: list[Anomaly]):
        """One detector, one point: open, grow or close its episode (shared with batch)."""
        det = series.detectors[i]
        try:
            sig = det.update(step, value)
        except Exception:
            self._failed(series, det, step)
            sig = None
        self._handle(series, i, det, step, sig, out)

    def _failed(self, series: _Series, det: Detector, step: int) -> None:
        # A runwatch bug must never kill a training run: log it, count it, go on.
        self._n_errors += 1
        if self._n_errors <= 10:
            log.exception("detector %s failed on %s step %s", det.name, series.key, step)

    def _handle(
        self, series: _Series, i: int, det: Detector, step: int, sig: Signal | None, out: list
    ) -> None:
        """Open, grow or close detector ``i``'s episode after its verdict ``sig``."""
        ep = series.open[i]
        if sig is not None:
            series.quiet[i] = 0
            if ep is None:
                ep = self._open(series, det, step, sig)
                series.open[i] = ep
                out.append(ep)
                if det.name == "spike":
                    if self._deferred is None:
                        self._link_precursor(series, step, ep, out)
                    else:
                        self._deferred.append((self._row, series, step, ep))
            else:
                self._grow(ep, step, sig)
                out.append(ep)
        elif ep is not None:
            series.quiet[i] += 1
            if series.quiet[i] >= det.quiet:
                ep.is_open = False
                ep.details["recovered"] = True
                series.open[i] = None
                out.append(ep)

    def event(self, event: Event) -> list[Anomaly]:
        """Take a run event; after ``restart``/``resume`` steps may go back."""
        if event.kind in ("restart", "resume"):
            for s in self._series.values():
                s.rewind_ok = True
        return []

    def finish(self) -> list[Anomaly]:
        """Close every episode still open (not recovered if its last point was flagged)."""
        out = []
        for s in self._series.values():
            for i, ep in enumerate(s.open):
                if ep is not None:
                    ep.is_open = False
                    ep.details["recovered"] = s.quiet[i] > 0
                    s.open[i] = None
                    out.append(ep)
        return out

    # ------------------------------------------------------------------ internals
    def _new_series(self, metric: str, lk: tuple[Any, ...]) -> _Series:
        role = role_of(metric, self.config)
        labels = {k: v for k, v in zip(LABEL_KEYS, lk, strict=True) if v is not None}
        s = _Series(metric, labels, role, DEFAULT_DETECTORS[role]())
        self._series[(metric, lk)] = s
        if role == "lr" and self._lr_series is None:
            self._lr_series = s
        elif role == "loss":
            ref = self.references.get(metric)
            for d in s.detectors:
                if isinstance(d, LRAware):
                    d.use_lr(self.lr_clock)
                if isinstance(d, CurveDeviation) and ref is not None:
                    d.use_reference(ref)
        log.debug("new series %s with role %s", s.key, role)
        return s

    def _open(self, s: _Series, det: Detector, step: int, sig: Signal) -> Anomaly:
        details = dict(sig.details)
        details["role"] = s.role
        details["points"] = 1
        details["first_observed"] = sig.observed
        a = Anomaly(
            detector=det.name,
            metric=s.metric,
            start_step=step,
            end_step=step,
            severity=sig.severity,
            score=_finite(sig.score),
            observed=sig.observed,
            message=sig.message,
            labels=dict(s.labels),
            expected=sig.expected,
            lower=sig.lower,
            upper=sig.upper,
            details=details,
        )
        self._anomalies.append(a)
        if self._deferred is not None:
            self._order[id(a)] = (self._row, s.detectors.index(det), 0)
        return a

    @staticmethod
    def _grow(a: Anomaly, step: int, sig: Signal) -> None:
        if step > a.end_step:
            a.end_step = step
        a.details["points"] += 1
        if _RANK[sig.severity] > _RANK[a.severity]:
            a.severity = sig.severity
        score = _finite(sig.score)
        if score > a.score:
            # Keep the worst point's view of the episode.
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

    def _link_precursor(self, s: _Series, step: int, ep: Anomaly, out: list[Anomaly]) -> None:
        lk = tuple(s.labels.get(k) for k in LABEL_KEYS)
        if s.role == "grad_norm":
            self._gn_spike[lk] = (step, ep)
            seen = self._loss_spike.get(lk)
            if seen is not None and seen[0] == step:
                out.append(self._precursor(ep, seen[1], lead=0))
        elif s.role == "loss":
            self._loss_spike[lk] = (step, ep)
            seen = self._gn_spike.get(lk)
            if seen is not None and 0 <= step - seen[0] <= PRECURSOR_WINDOW:
                out.append(self._precursor(seen[1], ep, lead=step - seen[0]))

    def _precursor(self, gn: Anomaly, loss: Anomaly, lead: int) -> Anomaly:
        link = {
            "grad_norm_metric": gn.metric,
            "grad_norm_start": gn.start_step,
            "loss_metric": loss.metric,
            "loss_start": loss.start_step,
            "lead_steps": lead,
        }
        loss.details["precursor"] = link
        a = Anomaly(
            detector="grad_norm_precursor",
            metric=loss.metric,
            start_step=gn.start_step,
            end_step=loss.start_step,
            severity="info",
            score=float(lead),
            observed=gn.details["first_observed"],  # not gn.observed: it changes later
            message=(
                f"{gn.metric} spiked at step {gn.start_step}, {lead} steps before the "
                f"{loss.metric} spike at step {loss.start_step}"
            ),
            labels=dict(loss.labels),
            is_open=False,
            details=link,
        )
        self._anomalies.append(a)
        return a


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 1000.0
