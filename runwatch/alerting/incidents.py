"""The alert engine's view of the store's incidents: labels, benign folds, failure events.

Live detection forms a run's incidents before it hands episodes to alerting, so each alert
can be labelled with its incident (``store.incident_of``) and each message can name it
(``store.incidents``: title, count, status, the top hypothesis). A verdict feeds back here:
a new member of an incident judged ``benign`` is counted (``folded``) and not alerted.

Failure events (crash, OOM, NCCL timeout, hang, error log) are no episodes: live detection
forms their incidents and then tells alerting with no episodes; :meth:`IncidentView.event_alerts`
reads the run's incidents and makes an alert of each failure event new in one, if it was
logged since this view was made (older ones are an earlier attempt's, told by its process).

Reads of ``store.incidents`` cost a pandas frame (milliseconds), so they happen when a
message is about to go out, when failure events came (at most every ``EVENT_READ_EVERY``),
and otherwise every ``INCIDENT_REFRESH`` for changes no alert brings.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from runwatch.alerting.alert import Alert, alert_from_event
from runwatch.alerting.grouping import INCIDENT, Notification
from runwatch.model import FAILURE_EVENTS
from runwatch.store import Store

log = logging.getLogger("runwatch.alerting")

INCIDENT_REFRESH = 10.0
"""Seconds between re-reads of the incidents of runs with alerts held, for changes no alert
brings (a crash event joining, an info member): news that waits for ``group_interval``
anyway, while a read costs the engine's thread some milliseconds (a pandas frame). When a
group is due they are read at once, so a message names the incident as it stands."""
EVENT_ALERTS = tuple(kind for kind in FAILURE_EVENTS if kind != "xid")
"""Failure events alerted as such; an Xid is alerted through the hardware monitor's episode."""
EVENT_READ_EVERY = 0.5
"""Seconds between reads of one run's incidents for new failure events: the first crash
after a quiet spell is read at once, a storm of error-log events twice a second."""
EVENT_GRACE = 5.0
"""Failure events logged this many seconds before the view was made still alert (clocks of
hosts differ a little); older ones are an earlier attempt's, told by its own process."""


class IncidentView:
    """What the engine knows of incidents. Not thread-safe: the engine's tick holds it."""

    def __init__(self, store: Callable[[], Store], born: float) -> None:
        self._store = store
        self._born = born
        self.infos: dict[str, dict[str, Any]] = {}  # incident id -> incident_info
        self.read_at = float("-inf")
        self._incident_of: dict[int, str] = {}  # alert id -> incident id, while it is open
        self._event_counts: dict[int, int] = {}  # incident id -> count when last read
        self._events_seen: set[int] = set()
        self._events_read: dict[str, float] = {}  # run -> when its failure events were read
        self.folded = 0
        """Members of benign incidents (episodes, failure events) not alerted; they are in
        the store, counted in their incident."""
        self.folded_by_incident: Counter[int] = Counter()

    def label(self, alert: Alert, held: bool) -> bool:
        """Label ``alert`` with its incident; False if it is to fold quietly (a new episode
        of a benign incident). ``held``: the grouper holds it already (told or about to
        be), so it goes on to its resolution whatever the verdict."""
        try:
            found = self._store().incident_of(alert.id)
        except Exception as exc:  # no incidents to be had: alert as before, by detector
            log.debug("runwatch: no incident for anomaly %d: %s", alert.id, exc)
            found = None
        if found is None:
            known = self._incident_of.get(alert.id) if held else None
            if known is not None:
                alert.labels[INCIDENT] = known  # not re-formed yet: it stays where it was
            return True
        incident, status = found
        if status == "benign" and not held:
            self._fold(alert.run, incident, f"anomaly {alert.id}")
            return False
        alert.labels[INCIDENT] = str(incident)
        if alert.status == "firing":
            self._incident_of[alert.id] = str(incident)
        else:
            self._incident_of.pop(alert.id, None)
        return True

    def may_read_events(self, run: str, now: float) -> bool:
        """Whether the run's failure events may be read now (else at a later tick)."""
        if now - self._events_read.get(run, float("-inf")) < EVENT_READ_EVERY:
            return False
        self._events_read[run] = now
        return True

    def event_alerts(self, run: str, project: str | None, now: float) -> list[Alert]:
        """Alerts for the failure events new in the run's incidents since the last read."""
        store = self._store()
        try:
            frame = store.incidents(run, source="live")
        except Exception as exc:  # an unknown run, a store being migrated: not fatal
            log.debug("runwatch: cannot read the incidents of run %r: %s", run, exc)
            return []
        out = []
        for row in frame.to_dict("records"):
            info = incident_info(row)
            iid = info["id"]
            self.infos[str(iid)] = info
            kinds = (row.get("details") or {}).get("kinds") or []
            if not any(k.startswith("event:") and k[6:] in FAILURE_EVENTS for k in kinds):
                continue
            if self._event_counts.get(iid) == info["count"]:
                continue  # no new member since the last read
            self._event_counts[iid] = info["count"]
            try:
                members = store.incident_members(iid)
            except Exception as exc:  # merged away since: the next read has it
                log.debug("runwatch: cannot read incident %d: %s", iid, exc)
                continue
            for event in members[members["kind"] == "event"].to_dict("records"):
                eid = int(event["member_id"])
                if eid in self._events_seen or event["what"] not in EVENT_ALERTS:
                    continue
                self._events_seen.add(eid)
                if not float(event["time"]) >= self._born - EVENT_GRACE:
                    continue  # an earlier attempt's: its own process told it
                if info["status"] == "benign":
                    self._fold(run, iid, f"event {eid} ({event['what']})")
                    continue
                severity = FAILURE_EVENTS[str(event["what"])]
                out.append(alert_from_event(event, severity, iid, run, project, now))
        return out

    def read(self, runs: set[str], now: float) -> None:
        """The live incidents of ``runs`` as the store has them now."""
        self.read_at = now
        for run in sorted(runs):
            try:
                frame = self._store().incidents(run, source="live")
            except Exception as exc:  # an unknown run, a store being migrated: not fatal
                log.debug("runwatch: cannot read the incidents of run %r: %s", run, exc)
                continue
            for row in frame.to_dict("records"):
                self.infos[str(int(row["id"]))] = incident_info(row)

    def of_note(self, note: Notification) -> tuple[dict[str, Any], ...]:
        """The incidents a message's alerts (and its group) belong to, by id."""
        ids = {a.labels.get(INCIDENT) for a in note.alerts} | {note.group_labels.get(INCIDENT)}
        found = [self.infos[i] for i in ids if i and i in self.infos]
        return tuple(sorted(found, key=lambda info: info["id"]))

    def _fold(self, run: str, incident: int, what: str) -> None:
        """Count (and log, once per incident) a member of a benign incident not alerted."""
        self.folded += 1
        self.folded_by_incident[incident] += 1
        if self.folded_by_incident[incident] == 1:
            log.info(
                "runwatch: run %s: incident %d is benign; its new members fold in without "
                "an alert (they are stored and counted)",
                run,
                incident,
            )
        log.debug("runwatch: %s folded into benign incident %d", what, incident)


def incident_info(row: dict[str, Any]) -> dict[str, Any]:
    """What a message says of an incident, from a row of ``store.incidents``: plain JSON."""
    hypotheses = row.get("hypotheses") or []
    details = row.get("details") or {}
    return {
        "id": int(row["id"]),
        "run": row.get("run"),
        "title": row.get("title"),
        "status": row.get("status"),
        "severity": row.get("severity"),
        "count": int(row["count"]),
        "first_step": _int(row.get("first_step")),
        "last_step": _int(row.get("last_step")),
        "is_active": bool(row.get("is_active")),
        "summary": details.get("summary") or None,
        "top_hypothesis": dict(hypotheses[0]) if hypotheses else None,
        "verdict_note": row.get("verdict_note") or None,
        "reopened": details.get("reopened") or None,
    }


def _int(value: Any) -> int | None:
    if value is None or value != value:  # NaN from a nullable integer column
        return None
    return int(value)
