"""Live detection: the Monitor running in the hook's writer thread, storing episodes.

After each batch is written, its points are fed to one long-lived :class:`Monitor` in the
order a replay reads them from the store (by step, then by series), so ``runwatch analyze``
on the finished run finds the same anomalies as were found live. Episodes are saved as they
open, grow and close (source ``live``), so the dashboard and alerts see them within one flush.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from runwatch.detect.monitor import Monitor
from runwatch.model import Anomaly, Event
from runwatch.store import Store

log = logging.getLogger("runwatch.detect.live")


class LiveDetection:
    """A writer-thread sink: ``(points by metric, events) -> Monitor -> store``."""

    def __init__(self, store: Store, run_id: int, config: Mapping[str, Any] | None = None):
        self._store = store
        self._run_id = run_id
        self.monitor = Monitor(config)
        self._ids: dict[int, int] = {}

    def __call__(self, by_name: Mapping[str, Any], events: list[Event]) -> None:
        for event in events:
            self.monitor.event(event)
        if not by_name:
            return
        update = self.monitor.update
        changed: dict[int, Anomaly] = {}
        metrics, labels_of, steps, values, times, order_keys = [], [], [], [], [], []
        for name, (labels, s, t, v) in by_name.items():
            sid = self._store.series_id(self._run_id, name, labels)
            metrics.append(np.full(len(s), len(labels_of)))
            labels_of.append((name, labels))
            steps.append(s)
            times.append(t)
            values.append(v)
            order_keys.append(np.full(len(s), sid))
        step_all = np.concatenate(steps)
        which = np.concatenate(metrics)
        order = np.lexsort((np.concatenate(order_keys), step_all))
        value_all = np.concatenate(values)[order].tolist()
        time_all = np.concatenate(times)[order].tolist()
        for i, step, value, stamp in zip(
            which[order].tolist(), step_all[order].tolist(), value_all, time_all, strict=True
        ):
            name, labels = labels_of[i]
            for anomaly in update(name, labels, step, value, None if stamp != stamp else stamp):
                changed[id(anomaly)] = anomaly
        if changed:
            self._store.save_anomalies(self._run_id, "live", changed.values(), self._ids)

    def close(self) -> None:
        """The run ended: close open episodes and store them."""
        closed = self.monitor.finish()
        if closed:
            self._store.save_anomalies(self._run_id, "live", closed, self._ids)
