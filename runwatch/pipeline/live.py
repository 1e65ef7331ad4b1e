"""Live detection: the Monitor running beside the hook's writer, storing episodes.

Each batch the writer has made durable is handed over (a cheap enqueue) to a thread of its
own, which feeds the points to one long-lived :class:`Monitor` in the order a replay reads
them from the store (by step, then by series), so ``runwatch analyze`` on the finished run
finds the same anomalies as were found live. Episodes are saved as they open, grow and close
(source ``live``), through the detection thread's own store connection.

Each series of a batch goes through its detectors at once (``Monitor.update_batch``:
exactly what ``Monitor.update`` row by row gives, and much cheaper); a batch in which a
series goes back (a restart) goes row by row.

Why a thread of its own: detection costs about as much per point as writing
(``bench/log_overhead.py``), and far more on a batch full of flagged points. Run in the
writer, it would at least halve the writer's throughput and delay durability; here it can
only fall behind. If it falls more than ``max_backlog_points`` behind (a run logging
hundreds of thousands of points a second), whole batches are skipped, counted and warned
about: live detection is then incomplete, and ``runwatch analyze`` gives the full answer.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from runwatch.guard import Guard
from runwatch.model import FAILURE_EVENTS, LABEL_KEYS, Anomaly, Event, SeriesBatch
from runwatch.worker import Worker

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from runwatch.detect.fleet.monitor import FleetMonitor
    from runwatch.detect.monitor import Monitor
    from runwatch.expect.reference import ReferenceCurve
    from runwatch.store import Store

log = logging.getLogger("runwatch.pipeline.live")


class OnChange(Protocol):
    """Alerting's hook: the episodes that changed, (row id in the store, anomaly), and
    whether failure events came (their incidents are in the store, for alerting to read)."""

    def __call__(self, changes: list[tuple[int, Anomaly]], failures: bool = False) -> None: ...


HANG_CHECK_EVERY_S = 5.0
"""How often the detection thread asks the hang detector, when no batch arrives."""
SKIP_GRACE_S = 120.0
"""After live detection skipped a batch, this long without hang checks: ranks whose points
were skipped are not hung, and cannot be told from those that are (analyze can)."""
INCIDENTS_EVERY_S = 2.0
"""How often incidents are formed again while info episodes come and go or episodes only
grow; a new or closed warning or critical episode, or a failure event, forms them at once
(an alert per incident needs its incident)."""
INCIDENT_BUDGET = 0.1
"""At most this share of the detection thread's time goes to forming incidents when they
are not urgent: the interval grows with what forming costs on a run with many episodes."""


class LiveDetection:
    """A writer sink: ``(batch, events)`` -> Monitor -> store, off the write path."""

    def __init__(
        self,
        store_path: str,
        run_id: int,
        config: Mapping[str, Any] | None = None,
        *,
        max_backlog_points: int = 2_000_000,
        on_change: OnChange | None = None,
        references: Mapping[str, ReferenceCurve] | None = None,
    ) -> None:
        self._store_path = store_path
        self._run_id = run_id
        self._config = config
        self._references = references
        self.monitor: Monitor | None = None  # built on the detection thread (``_start``)
        self.fleet: FleetMonitor | None = None
        self._ids: dict[int, int] = {}
        self._on_change = on_change
        self._alert_guard = Guard("handing episodes to alerting", log)
        self._incident_guard = Guard("forming incidents", log)
        self._incidents_formed = -math.inf
        self._incident_cost = 0.0
        self._incidents_stale = False
        self._severity: dict[int, str] = {}
        self._backlog = 0
        self._max_backlog = max_backlog_points
        self.skipped_points = 0
        self._skipped_at = -math.inf  # monotonic time of the last batch skipped
        self._store: Store | None = None
        self._series_order: dict[tuple[str, str], int] = {}
        # Batch by batch; after HANG_CHECK_EVERY_S without one, the hang check (no data for
        # a while is exactly when a hang shows).
        self._worker = Worker(
            "runwatch-detect",
            self._take,
            tick=self._check_hangs,
            interval=HANG_CHECK_EVERY_S,
            tick_when_idle=True,
            on_start=self._start,
            on_stop=self._finish,
            backlog=lambda: self._backlog,
            unit="points",
            logger=log,
        )
        self._worker.start()

    # -- called from the writer thread --------------------------------------------------------
    def __call__(self, batch: SeriesBatch, events: list[Event]) -> None:
        n = sum(len(series.steps) for series in batch)
        if self._backlog + n > self._max_backlog:
            self._skipped_at = time.monotonic()
            self.skipped_points += n
            if self.skipped_points == n:
                log.warning(
                    "runwatch: live detection is %d points behind; skipping batches "
                    "(run `runwatch analyze` for the complete answer)",
                    self._backlog,
                )
            batch = []
        self._backlog += n
        if not self._worker.submit((batch, events, n)):  # not running: counted there
            self._backlog -= n

    # -- called from the thread that finishes the run -----------------------------------------
    def close(self, timeout: float = 10.0) -> bool:
        """Finish detection (waiting up to ``timeout`` s), close open episodes, store them."""
        if not self._worker.close(timeout):
            log.warning(
                "runwatch: live detection still %d points behind after %.1f s; "
                "stopping it (run `runwatch analyze` for the complete answer)",
                self._backlog,
                timeout,
            )
            return False
        return True

    # -- the detection thread ---------------------------------------------------------------
    def _start(self) -> None:
        """Open the store and build the detectors. Here, on the detection thread, so that
        ``runwatch.init()`` does not wait for detection's imports."""
        from runwatch.detect.fleet.monitor import FleetMonitor
        from runwatch.detect.monitor import Monitor
        from runwatch.store import Store

        self.monitor = Monitor(self._config, references=self._references)
        # Cross-rank detectors, with the Monitor's metric roles; wall-clock time, as the
        # points carry Unix times.
        self.fleet = FleetMonitor(self.monitor.config, clock=time.time)
        self._store = Store(self._store_path)

    # -- called from the thread that takes a run over (``runwatch.server.ownership``) ------------
    def take_over(self, points: pd.DataFrame, events: pd.DataFrame) -> None:
        """Start from what the store holds: another replica owned this run and is gone.

        ``points`` and ``events`` are the run's (``Store.read_points``, ``Store.events``).
        They are replayed into the Monitor, on the detection thread, before any later batch,
        so its state is what a replay of the run has. Episodes the store holds already keep
        their rows; only those that are new or changed are stored and handed to alerting,
        so no episode is lost or doubled across the handover.
        """
        n = len(points)
        self._backlog += n
        if not self._worker.submit((points, events, n)):
            self._backlog -= n

    def _take(self, item: tuple[Any, Any, int]) -> None:
        batch, events, n = item
        try:
            if isinstance(batch, list):
                self._detect(batch, events)
            else:
                self._replay_stored(batch, events)
        finally:
            self._backlog -= n

    def _check_hangs(self) -> None:
        if self._hangs_judgeable():
            self._save(self.fleet.tick())
        if self._incidents_stale:
            self._form_incidents(now=False)

    def _finish(self) -> None:
        """After the last batch: close open episodes and store them."""
        try:
            self._save(self.monitor.finish() + self.fleet.finish(), form=True)
        finally:
            self._store.close()

    def _replay_stored(self, points: pd.DataFrame, events: pd.DataFrame) -> None:
        import json

        from runwatch.detect.replay import replay, replay_input

        assert self.monitor is not None and self.fleet is not None and self._store is not None
        replay(replay_input(points), events, monitor=self.monitor)
        self._replay_fleet(points)
        stored = self._store.anomalies(self._run_id, source="live")
        rows = {
            (r.detector, r.metric, json.dumps(r.labels, sort_keys=True), int(r.start_step)): r
            for r in stored.itertuples()
        }
        changed = []
        for a in self.monitor.anomalies + self.fleet.anomalies:
            row = rows.get(
                (a.detector, a.metric, json.dumps(a.labels, sort_keys=True), a.start_step)
            )
            if row is None:
                changed.append(a)  # the gone owner had not stored it yet
                continue
            self._ids[id(a)] = int(row.id)
            self._severity[id(a)] = a.severity
            if (a.severity, a.is_open, a.end_step) != (
                row.severity,
                bool(row.is_open),
                row.end_step,
            ):
                changed.append(a)
        log.info(
            "runwatch: took run %d over: %d points replayed, %d episodes, %d new or changed",
            self._run_id, len(points), len(self.monitor.anomalies), len(changed),
        )  # fmt: skip
        self._save(changed, form=True)

    def _replay_fleet(self, points: pd.DataFrame) -> None:
        """The cross-rank detectors' state from the stored points of ranks (and GPUs)."""
        assert self.fleet is not None
        keys = [k for k in LABEL_KEYS if k in points.columns]
        ranked = points["metric"].str.startswith("gpu_")
        if "rank" in keys:
            ranked = ranked | points["rank"].notna()
        rows = points[ranked.to_numpy(dtype=bool)]
        update = self.fleet.update
        for metric, step, value, stamp, *labels in zip(
            rows["metric"], rows["step"], rows["value"], rows["time"],
            *(rows[k] for k in keys), strict=True,
        ):  # fmt: skip
            found = {k: v for k, v in zip(keys, labels, strict=True) if v == v and v is not None}
            update(metric, found, int(step), float(value), None if stamp != stamp else stamp)

    def _detect(self, batch: SeriesBatch, events: list[Event]) -> None:
        import numpy as np

        changed: dict[int, Anomaly] = {}
        for event in events:
            for anomaly in self.monitor.event(event) + self.fleet.event(event):
                changed[id(anomaly)] = anomaly
        failures = any(e.kind in FAILURE_EVENTS for e in events)
        if not batch:
            self._save(changed.values(), form=failures)
            return
        names, order_keys, steps, values, times, which = [], [], [], [], [], []
        for series in batch:
            which.append(np.full(len(series.steps), len(names)))
            rank = self._series_rank(series.metric, series.labels)
            order_keys.append(np.full(len(series.steps), rank))
            names.append((series.metric, series.labels))
            steps.append(series.steps)
            times.append(series.times)
            values.append(series.values)
        step_all = np.concatenate(steps)
        order = np.lexsort((np.concatenate(order_keys), step_all))
        rows = np.concatenate(which)[order]
        step_arr = step_all[order].astype(np.int64)
        value_arr = np.concatenate(values).astype(float)[order]
        time_l = np.concatenate(times)[order].tolist()
        found = self._feed_monitor(names, rows, step_arr, value_arr, time_l)
        for anomaly in found:
            changed[id(anomaly)] = anomaly
        fleet_update = self.fleet.update
        read = np.array([self.fleet.reads(name, labels) for name, labels in names])[rows]
        if read.any():
            picked = np.flatnonzero(read)
            for i, step, value, stamp in zip(
                rows[picked].tolist(),
                step_arr[picked].tolist(),
                value_arr[picked].tolist(),
                [time_l[j] for j in picked.tolist()],
                strict=True,
            ):
                name, labels = names[i]
                stamp = None if stamp != stamp else stamp
                for anomaly in fleet_update(name, labels, step, value, stamp):
                    changed[id(anomaly)] = anomaly
        if self._hangs_judgeable():
            for anomaly in self.fleet.tick():
                changed[id(anomaly)] = anomaly
        self._save(changed.values(), form=failures)

    def _hangs_judgeable(self) -> bool:
        """Whether silence now means a hang: detection has caught up with what arrived
        (no batch waits behind this one) and skipped none lately. Behind, the newest
        points it has are old and every rank would look stalled."""
        return self._worker.empty() and time.monotonic() - self._skipped_at > SKIP_GRACE_S

    def _feed_monitor(
        self,
        names: list[tuple[str, Mapping[str, Any]]],
        rows: np.ndarray,
        steps: np.ndarray,
        values: np.ndarray,
        times: list[float],
    ) -> list[Anomaly]:
        """The batch's points, in replay order, through the Monitor: each series at once
        (``Monitor.update_batch``, what ``update`` row by row gives, and much
        cheaper), or row by row when the batch rewinds a series (a restart)."""
        import numpy as np

        metric = np.array([m for m, _ in names], dtype=object)[rows]
        keys = sorted({k for _, labels in names for k in labels if k in LABEL_KEYS})
        label_cols = {
            k: np.array([labels.get(k) for _, labels in names], dtype=object)[rows] for k in keys
        }
        found = self.monitor.update_batch(metric, label_cols, steps, values)
        if found is not None:
            return found
        out: list[Anomaly] = []
        update = self.monitor.update
        for i, step, value, stamp in zip(
            rows.tolist(), steps.tolist(), values.tolist(), times, strict=True
        ):
            name, labels = names[i]
            out += update(name, labels, step, value, None if stamp != stamp else stamp)
        return out

    def _series_rank(self, name: str, labels: Mapping[str, Any]) -> int:
        """The series id in the store: replays order a step's points by it, so we do too."""
        key = (name, repr(sorted(labels.items())))
        rank = self._series_order.get(key)
        if rank is None:
            assert self._store is not None
            rank = self._store.series_id(self._run_id, name, labels)
            self._series_order[key] = rank
        return rank

    def _save(self, anomalies: Any, form: bool = False) -> None:
        """Store changed episodes, form the run's incidents again if that changed them
        (``form``: a failure event came), then hand the episodes to alerting, saying
        whether failure events came (their incidents are for alerting to read)."""
        anomalies = list(anomalies)
        if self._store is None:
            return
        if not anomalies:
            if form:
                self._form_incidents()
                self._alert([], failures=True)
            return
        # Urgent: what an alert waits for - a warning or critical episode that opened,
        # closed or got worse. The rest (info episodes, growth) is formed on a budget.
        urgent = form
        for a in anomalies:
            if a.severity != "info" and (self._severity.get(id(a)) != a.severity or not a.is_open):
                urgent = True
            self._severity[id(a)] = a.severity
        for attempt in range(5):
            try:
                self._store.save_anomalies(self._run_id, "live", anomalies, self._ids)
                break
            except Exception as exc:  # locked for a moment by the writer: try again
                if attempt == 4:
                    log.warning("runwatch: could not store %d anomalies: %s", len(anomalies), exc)
                time.sleep(0.05 * (attempt + 1))
        else:
            return
        self._form_incidents(now=urgent)
        # (row id in the store, anomaly) for each that changed
        self._alert([(self._ids[id(a)], a) for a in anomalies], failures=form)

    def _alert(self, changes: list[tuple[int, Anomaly]], failures: bool) -> None:
        if self._on_change is not None:
            with self._alert_guard:
                self._on_change(changes, failures=failures)

    def _form_incidents(self, now: bool = True) -> None:
        """The run's live incidents from what the store holds (every attempt's episodes and
        failure events); at most every ``INCIDENTS_EVERY_S`` unless ``now``."""
        from runwatch.pipeline.incidents import refresh_incidents

        clock = time.monotonic()
        every = max(INCIDENTS_EVERY_S, self._incident_cost / INCIDENT_BUDGET)
        if not now and clock - self._incidents_formed < every:
            self._incidents_stale = True  # the next tick forms them
            return
        self._incidents_stale = False
        assert self._store is not None and self.monitor is not None
        with self._incident_guard:
            refresh_incidents(self._store, self._run_id, "live", self.monitor.config)
        self._incidents_formed = time.monotonic()
        self._incident_cost = self._incidents_formed - clock
