"""The alert engine: anomaly changes in, grouped, filtered messages into the outbox.

``observe`` is called by live detection (from its thread) each time episodes open, grow or
close, after it has stored them and formed the run's incidents; it only queues the alerts
and wakes the engine's thread (an empty ``changes``: failure events formed incidents). That
thread labels each alert with its incident, turns new failure events into alerts, folds
what joins a benign incident (``incidents.py``), flushes groups whose time has come
(``grouping.py``), drops what is silenced or inhibited, renders one body per channel, with
the incidents it is about, and writes them to the outbox in one transaction; the
:class:`Sender` thread delivers from there. ``close`` flushes every group at once (a run
that finishes does not wait out ``group_wait``) and waits, bounded, for the outbox.

Verdicts feed back: a new member of an incident judged ``benign`` is not alerted (it is
still stored and counted in the incident; ``folded`` counts it here and the log says so
once per incident). ``real`` and ``watch`` incidents alert as open ones do, and a benign
incident that got a worse member is ``open`` again (``store/incidents.py``), so it alerts.
A failure event is over once told: it is resolved at the group's next update.

What survives a crash: everything in the outbox. Alerts still inside ``group_wait`` when the
process is killed are not yet there; their anomalies are in the store, and ``runwatch
analyze`` shows them.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import httpx

from runwatch.alerting.alert import Alert, alert_from_anomaly
from runwatch.alerting.grouping import Grouper, Notification
from runwatch.alerting.incidents import EVENT_READ_EVERY, INCIDENT_REFRESH, IncidentView
from runwatch.alerting.payloads import group_summary, render
from runwatch.alerting.rules import Rules, matches
from runwatch.alerting.sender import Sender
from runwatch.guard import Guard
from runwatch.model import Anomaly
from runwatch.store import Store
from runwatch.worker import Worker

log = logging.getLogger("runwatch.alerting")

SILENCE_REFRESH = 1.0
"""Seconds between re-reads of the silences table: `runwatch silence add` acts this fast."""


class AlertEngine:
    """Rules + grouping + silences + inhibition + the outbox sender, for one store."""

    def __init__(
        self,
        rules: Rules,
        store_path: str,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        client: httpx.Client | None = None,
        start: bool = True,
    ) -> None:
        self.rules = rules
        self.store_path = store_path
        self._clock = clock
        self._grouper = Grouper(rules)
        self._started: dict[int, float] = {}
        self._pending: list[tuple[Alert, float]] = []  # observed, not yet grouped
        self._event_runs: dict[str, str | None] = {}  # runs whose failure events to read
        self.incidents = IncidentView(lambda: self.store, clock())
        self._lock = threading.Lock()  # observe (detection thread) vs tick
        self._tick_lock = threading.Lock()  # the engine's thread vs flush() from another
        self._store: Store | None = None
        self._silences: list[dict[str, tuple[str, ...]]] = []
        self._silences_read = float("-inf")
        self.sender = Sender(store_path, rules, clock=clock, rng=rng, client=client)
        self.enqueued = 0
        self._close_guard = Guard("flushing alerts at close", log)
        # A flush at once, then when observe() wakes it or the next group is due.
        self._worker = Worker(
            "runwatch-alerts", tick=self._flush_due, interval=1.0, first_tick=0.0, logger=log
        )
        if start:
            self._worker.start()
            self.sender.start()

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.store_path)
        return self._store

    @property
    def folded(self) -> int:
        """Members of benign incidents not alerted (they are in the store, counted)."""
        return self.incidents.folded

    @property
    def folded_by_incident(self) -> Counter[int]:
        return self.incidents.folded_by_incident

    # -- input -------------------------------------------------------------------------------
    def observe(
        self,
        run: str,
        project: str | None,
        changes: Iterable[tuple[int, Anomaly]],
        failures: bool = False,
    ) -> None:
        """Episodes of ``run`` that opened, grew or closed: (row id in the store, anomaly);
        ``failures``: failure events came and formed incidents (read at the next tick).

        Cheap, on the caller's thread: the incident lookup and grouping happen in ``tick``.
        """
        now = self._clock()
        changes = list(changes)
        with self._lock:
            if failures:
                self._event_runs[run] = project
            for row_id, anomaly in changes:
                alert = alert_from_anomaly(row_id, anomaly, run, project, now)
                # An episode that grows keeps the time it was first seen.
                alert.starts_at = self._started.setdefault(row_id, now)
                if not anomaly.is_open:
                    self._started.pop(row_id, None)
                self._pending.append((alert, now))
        self._worker.wake()

    def bind(self, run: str, project: str | None) -> Callable[[list[tuple[int, Anomaly]]], None]:
        """``observe`` for one run: what ``LiveDetection(on_change=...)`` takes."""

        def on_change(changes: list[tuple[int, Anomaly]], failures: bool = False) -> None:
            self.observe(run, project, changes, failures)

        return on_change

    # -- one flush ---------------------------------------------------------------------------
    def tick(self, *, everything: bool = False) -> int:
        """Flush due groups (all if ``everything``) into the outbox; return messages written."""
        with self._tick_lock:
            return self._tick(everything)

    def _tick(self, everything: bool) -> int:
        now = self._clock()
        self._refresh_silences(now)
        with self._lock:
            pending, self._pending = self._pending, []
            event_runs, self._event_runs = self._event_runs, {}
        grouper, incidents = self._grouper, self.incidents
        for alert, seen in pending:
            if incidents.label(alert, grouper.holds(alert.id)):
                grouper.add(alert, seen)
        for run, project in list(event_runs.items()):
            if not incidents.may_read_events(run, now):
                del event_runs[run]
                with self._lock:  # read at a later tick (the worker comes back soon)
                    self._event_runs.setdefault(run, project)
                continue
            for alert in incidents.event_alerts(run, project, now):
                grouper.add(alert, now)
        due = grouper.next_due()
        runs = grouper.runs()
        if runs:
            fresh = everything or (due is not None and due <= now)
            if fresh or now - incidents.read_at >= INCIDENT_REFRESH:
                incidents.read(runs - set(event_runs), now)  # those were just read
                grouper.note_incidents(incidents.infos, runs, now)
        notes = grouper.due(now, self._visibility(), everything=everything)
        if not notes:
            return 0
        notes = [replace(note, incidents=incidents.of_note(note)) for note in notes]
        for note in notes:  # a failure event is over once told: resolved at the next update
            for alert in note.alerts:
                if alert.event and alert.status == "firing":
                    grouper.add(replace(alert, status="resolved", ends_at=now), now)
        messages = [m for note in notes for m in self._messages(note)]
        written = self.store.enqueue_alerts(messages, now)
        self.enqueued += written
        log.info("runwatch: %d alert messages queued (%d groups)", written, len(notes))
        self.sender.wake()
        return written

    def _messages(self, note: Notification) -> list[tuple[str, str, str, str]]:
        out = []
        summary = group_summary(note)
        for name in note.route.channels:
            channel = self.rules.channels[name]
            key = f"rw-{uuid.uuid4().hex}"
            body = render(channel, note, key, self.rules.dashboard_url)
            out.append((key, name, json.dumps(body, separators=(",", ":")), summary))
        return out

    def _visibility(self) -> Callable[[Alert], bool]:
        """Not silenced and not inhibited, decided on the alerts firing right now."""
        silences = self._silences
        firing = self._grouper.firing()
        sources: list[tuple[Any, Counter[tuple[str, ...]]]] = []
        for rule in self.rules.inhibit:
            counts = Counter(
                tuple(a.labels.get(k, "") for k in rule.equal)
                for a in firing
                if matches(rule.source, a.labels)
            )
            sources.append((rule, counts))

        def visible(alert: Alert) -> bool:
            labels = alert.labels
            if any(matches(s, labels) for s in silences):
                return False
            for rule, counts in sources:
                if not counts or not matches(rule.target, labels):
                    continue
                need = 2 if alert.status == "firing" and matches(rule.source, labels) else 1
                if counts[tuple(labels.get(k, "") for k in rule.equal)] >= need:
                    return False
            return True

        return visible

    def _refresh_silences(self, now: float) -> None:
        if now - self._silences_read < SILENCE_REFRESH:
            return
        self._silences_read = now
        try:
            active = self.store.silences(active_at=now)
        except Exception as exc:
            log.warning("runwatch: cannot read silences: %s", exc)
            return
        self._silences = [{k: (str(v),) for k, v in s["matchers"].items()} for s in active]

    # -- the thread --------------------------------------------------------------------------
    def _flush_due(self) -> float:
        """The worker's tick: flush what is due; seconds until the next group is due."""
        self.tick()
        with self._tick_lock:
            due = self._grouper.next_due()
        pause = 1.0 if due is None else due - self._clock()
        if self._event_runs:  # failure events waiting for their read
            pause = min(pause, EVENT_READ_EVERY)
        return min(max(pause, 0.001), SILENCE_REFRESH)

    def flush(self, timeout: float = 10.0) -> bool:
        """Send everything now: flush every group, wait up to ``timeout`` s for the outbox."""
        deadline = time.monotonic() + timeout
        self.tick(everything=True)
        self.sender.wake()
        inline = not self.sender.running
        while True:
            if inline:
                self.sender.run_once()
            pending = self.sender.pending()
            if pending == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def close(self, timeout: float = 10.0) -> bool:
        """Flush, wait (bounded) for pending alerts, stop the threads; True if all went out."""
        started = time.monotonic()
        self._worker.close(min(timeout, 2.0))
        done = False
        with self._close_guard:
            done = self.flush(timeout)
        if not done:
            pending = self.sender.pending()
            log.warning(
                "runwatch: %d alert messages still pending after %.1f s; they stay in the "
                "outbox of %s and go out with the next runwatch process that sends for it",
                pending,
                time.monotonic() - started,
                self.store_path,
            )
        self.sender.close(max(0.5, timeout - (time.monotonic() - started)))
        if self._store is not None:
            self._store.close()
            self._store = None
        return done
