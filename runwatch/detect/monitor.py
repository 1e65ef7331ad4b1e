"""The Monitor: points and events in, anomaly episodes out.

One Monitor serves live watching (the detection thread, ``runwatch serve``) and replay
(``runwatch analyze``): it holds no clock and no randomness, so the same points in the same
order give the same anomalies. Points come one at a time (``update``) or as a batch of rows
in replay order (``update_batch``: each series through its detectors' ``update_many`` at
once, the same episodes). Memory is bounded: per series a fixed set of detectors with fixed
windows, and a ring of the last ``max_anomalies`` episodes.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from runwatch.detect.base import Detector, LRAware, Signal
from runwatch.detect.busy import BusyClock
from runwatch.detect.deviation import CurveDeviation
from runwatch.detect.roles import ROLES, TIMING_ROLES, detectors_for, role_of
from runwatch.detect.rows import OpenOrder, clock_states, feed_clock, fold_codes
from runwatch.detect.series import Series
from runwatch.detect.spike import Spike
from runwatch.expect.lrclock import LRClock, areas_at
from runwatch.expect.reference import ReferenceCurve
from runwatch.model import LABEL_KEYS, SEVERITIES, Anomaly, Event, label_value

log = logging.getLogger("runwatch.detect")

_NO_LABELS = (None, None, None)
PRECURSOR_WINDOW = 20
"""A grad-norm spike at most this many steps before a loss spike is linked to it."""


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
        self._series: dict[tuple[Any, ...], Series] = {}
        self._anomalies: deque[Anomaly] = deque(maxlen=max_anomalies)
        self._n_points = 0
        self._n_out_of_order = 0
        self._n_errors = 0
        self._n_bad = 0
        self.lr_clock = LRClock()
        self._lr_series: Series | None = None
        self._gn_spike: dict[tuple[Any, ...], tuple[int, Anomaly]] = {}
        self._loss_spike: dict[tuple[Any, ...], tuple[int, Anomaly]] = {}
        self._busy: dict[tuple[Any, ...], BusyClock] = {}  # per process (labels)

    # ------------------------------------------------------------------ results
    @property
    def anomalies(self) -> list[Anomaly]:
        """All episodes seen so far, open and closed (the last ``max_anomalies``)."""
        return list(self._anomalies)

    @property
    def points(self) -> int:
        """Points fed so far (``update`` and ``update_batch``)."""
        return self._n_points

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
        elif series.role == "cpu_wait" and dets is series.detectors and math.isfinite(value):
            clock = self._busy.setdefault(lk, BusyClock())
            clock.add(step, value)
            clock.trim()
        elif series.role in TIMING_ROLES and lk in self._busy and self._busy[lk].held(step):
            dets = dets[:1]  # slowed by a busy host: only the non-finite check sees it
        out: list[Anomaly] = []
        opened = series.open
        for i, det in enumerate(dets):
            try:
                sig = det.update(step, value)
            except Exception:
                self._failed(series, det, step)
                sig = None
            if sig is not None or opened[i] is not None:
                self._judge(series, i, step, sig, out)
        return out

    def update_batch(
        self,
        metric: np.ndarray,
        label_cols: Mapping[str, np.ndarray],
        steps: np.ndarray,
        values: np.ndarray,
        progress: Callable[[int], None] | None = None,
        series_codes: np.ndarray | None = None,
    ) -> list[Anomaly] | None:
        """Feed rows in replay order (by step; within a step, any fixed series order): what
        ``update`` row by row would do, each series through its detectors at once.

        Returns the episodes opened, grown or closed (what the ``update`` calls would have
        returned, each once), or None if it cannot - a series whose steps go back from
        where it was (a restart or a late point), or raw labels that normalise alike - and
        then nothing was fed and the caller goes row by row. Live detection feeds each
        written batch so; replay the whole run.

        Parameters
        ----------
        metric, steps, values
            One entry per row: the metric name, the step, the value.
        label_cols
            Label name -> one value per row (missing: None or NaN).
        progress
            Told the number of rows fed so far after each series.
        series_codes
            A code per row, one per series (``rows.fold_codes``), when the caller has them.
        """
        n = steps.size
        if n == 0:
            return []
        codes = series_codes
        if codes is None:
            cols = [metric, *label_cols.values()]
            codes = fold_codes([pd.factorize(c, use_na_sentinel=False)[0] for c in cols])
        order = np.argsort(codes, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(codes[order])) + 1)
        groups.sort(key=lambda g: g[0])  # series are created in order of first appearance
        keys = []
        for rows in groups:
            r = rows[0]
            lk = tuple(
                label_value(label_cols[k][r]) if k in label_cols else None for k in LABEL_KEYS
            )
            keys.append((str(metric[r]), lk))
        if len(set(keys)) != len(keys):
            return None  # raw labels that normalise alike: let the row path decide
        for key, rows in zip(keys, groups, strict=True):
            known = self._series.get(key)
            behind = known is not None and known.last_step is not None
            if behind and steps[rows[0]] < known.last_step:
                return None  # a rewind or a late point: the row path knows what to do
        # Episodes open before this batch: reported if a point grows or closes them.
        was_open = [
            (ep, ep.details["points"])
            for key in keys
            if (s := self._series.get(key)) is not None
            for ep in s.open
            if ep is not None
        ]
        batch = OpenOrder()
        kept = self._anomalies
        self._anomalies = deque()  # unbounded while rows are out of order; trimmed below
        try:
            runs = [
                (self._series.get(key) or self._new_series(*key), rows)
                for key, rows in zip(keys, groups, strict=True)
            ]
            # The LR series first: the loss series' areas come from what it fed the clock;
            # then CPU wait: a step's time is held if its host was busy.
            runs.sort(key=lambda r: (r[0] is not self._lr_series, r[0].role != "cpu_wait"))
            lr_fed = clock_states(self.lr_clock)
            done = 0
            for series, rows in runs:
                if series is self._lr_series:
                    lr_fed = feed_clock(self.lr_clock, rows, steps[rows], values[rows])
                elif series.role == "cpu_wait":
                    self._feed_busy(series, steps[rows], values[rows])
                self._run_series(series, rows, steps[rows], values[rows], lr_fed, batch)
                done += rows.size
                if progress is not None:
                    progress(done)
            self._link_deferred(batch)
            for clock in self._busy.values():
                clock.trim()
            ordered = sorted(self._anomalies, key=lambda a: batch.order[id(a)])
        finally:
            self._anomalies = kept
        kept.extend(ordered)  # the deque keeps the last max_anomalies, as streaming does
        self._n_points += n
        grown = [ep for ep, pts in was_open if ep.details["points"] != pts or not ep.is_open]
        return grown + ordered

    def _run_series(
        self,
        series: Series,
        rows: np.ndarray,
        st: np.ndarray,
        v: np.ndarray,
        lr_fed: tuple[np.ndarray, np.ndarray],
        batch: OpenOrder,
    ) -> None:
        """One series' rows of a batch through each of its detectors."""
        series.last_step = int(st[-1]) if st.size else None
        series.rewind_ok = False
        rows_l = rows.tolist()
        steps_l = st.tolist()
        values_l = v.tolist()
        bad = np.flatnonzero(~np.isfinite(v)).tolist()
        self._nonfinite(series, rows_l, steps_l, values_l, bad, batch)
        clock = self._busy.get(series.lk) if series.role in TIMING_ROLES else None
        if clock is not None:  # only the non-finite check sees a point a busy host slowed
            judged = np.flatnonzero(~clock.held_many(st))
            rows, st = rows[judged], st[judged]
            rows_l, steps_l = rows.tolist(), st.tolist()
            values_l = v[judged].tolist()
            if not steps_l:
                return
        # The points' LR areas, once for every detector of the series that judges by the LR.
        by_lr = [isinstance(d, LRAware) and bool(d.lr_clock) for d in series.detectors]
        areas = areas_at(*lr_fed, rows, st) if len(lr_fed[0]) and any(by_lr) else None
        for i in range(1, len(series.detectors)):
            det = series.detectors[i]
            on_error = lambda k, det=det: self._failed(series, det, steps_l[k])  # noqa: E731
            try:
                if areas is not None and by_lr[i]:
                    sigs = det.update_many(steps_l, values_l, on_error, areas=areas)
                else:
                    sigs = det.update_many(steps_l, values_l, on_error)
            except Exception:  # a bug in a detector's batch path: counted, as in update
                self._failed(series, det, steps_l[0])
                continue
            self._episodes(series, i, rows_l, steps_l, sigs, batch)

    def _episodes(
        self,
        series: Series,
        i: int,
        rows_l: list[int],
        steps_l: list[int],
        sigs: list[tuple[int, Signal]],
        batch: OpenOrder,
    ) -> None:
        """Open, grow and close detector ``i``'s episodes from its signals, as ``update``
        would point by point: unflagged points only matter while an episode is open, and
        only the first ``quiet`` of them (the episode is closed by then)."""
        quiet = series.detectors[i].quiet
        out: list[Anomaly] = []

        def unflagged(n: int) -> None:
            """``n`` unflagged points in a row (their step does not matter then)."""
            for _ in range(min(n, quiet)):
                if series.open[i] is None:
                    return
                self._judge(series, i, 0, None, out, batch)

        prev = -1
        for k, sig in sigs:
            unflagged(k - prev - 1)
            batch.row = rows_l[k]
            self._judge(series, i, steps_l[k], sig, out, batch)
            prev = k
            if len(out) > 256:
                out.clear()
        unflagged(len(steps_l) - prev - 1)

    def _nonfinite(
        self,
        series: Series,
        rows_l: list[int],
        steps_l: list[int],
        values_l: list[float],
        bad: list[int],
        batch: OpenOrder,
    ) -> None:
        """Detector 0 (NonFinite) only speaks on non-finite points: visit just those, and
        count the finite points between them as the quiet that closes an episode."""
        det = series.detectors[0]
        out: list[Anomaly] = []
        # An episode open from an earlier batch has had series.quiet[0] quiet points already.
        last = -1 - (series.quiet[0] if series.open[0] is not None else 0)
        for k in bad:
            if series.open[0] is not None and k - last - 1 >= det.quiet:
                series.close(0, recovered=True)
            batch.row = rows_l[k]
            try:
                sig = det.update(steps_l[k], values_l[k])
            except Exception:
                self._failed(series, det, steps_l[k])
                sig = None
            self._judge(series, 0, steps_l[k], sig, out, batch)
            last = k
        if series.open[0] is not None:
            tail = len(values_l) - 1 - last
            if tail >= det.quiet:
                series.close(0, recovered=True)
            else:
                series.quiet[0] = tail

    def _link_deferred(self, batch: OpenOrder) -> None:
        """A batch's spike episodes linked to their precursors in row order, as ``update``
        would have linked them; the links are listed after the spike that made them."""
        for row, series, step, ep in sorted(batch.deferred, key=lambda d: d[0]):
            out: list[Anomaly] = []
            self._link_precursor(series, step, ep, out)
            idx = next(i for i, d in enumerate(series.detectors) if d.name == "spike")
            for a in out:
                batch.order[id(a)] = (row, idx, 1)

    def _feed_busy(self, series: Series, steps: np.ndarray, values: np.ndarray) -> None:
        """A batch's CPU-wait samples of one process into its clock (before its timing)."""
        ok = np.isfinite(values)
        self._busy.setdefault(series.lk, BusyClock()).add_many(steps[ok], values[ok])

    def _failed(self, series: Series, det: Detector, step: int) -> None:
        # A runwatch bug must never kill a training run: log it, count it, go on.
        self._n_errors += 1
        if self._n_errors <= 10:
            log.exception("detector %s failed on %s step %s", det.name, series.key, step)

    def _judge(
        self,
        series: Series,
        i: int,
        step: int,
        sig: Signal | None,
        out: list[Anomaly],
        batch: OpenOrder | None = None,
    ) -> None:
        """Detector ``i``'s verdict on one point into its episode; record an episode that
        opens and link a spike to its precursor (in a batch: once all series are fed)."""
        ep = series.judge(i, step, sig, out)
        if ep is None:
            return
        self._anomalies.append(ep)
        if batch is not None:
            batch.order[id(ep)] = (batch.row, i, 0)
        if ep.detector == "spike":
            if batch is None:
                self._link_precursor(series, step, ep, out)
            else:
                batch.deferred.append((batch.row, series, step, ep))

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
                    s.close(i, recovered=s.quiet[i] > 0)
                    out.append(ep)
        return out

    # ------------------------------------------------------------------ internals
    def _new_series(self, metric: str, lk: tuple[Any, ...]) -> Series:
        role = role_of(metric, self.config)
        labels = {k: v for k, v in zip(LABEL_KEYS, lk, strict=True) if v is not None}
        s = Series(metric, labels, role, detectors_for(role, metric))
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

    def _link_precursor(self, s: Series, step: int, ep: Anomaly, out: list[Anomaly]) -> None:
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
