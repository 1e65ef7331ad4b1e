"""Grouping alerts into notifications, with Alertmanager's timing.

A *group* is one route and the values of its ``group_by`` labels. A new group waits
``group_wait`` before its first notification, so a storm (a thousand anomalies from 512
ranks within seconds) lands in one message; after that the group is looked at every
``group_interval`` and notified only if the set of alerts it would show changed (new ones,
resolved ones); an unchanged group with firing alerts is re-sent after ``repeat_interval``.

Which alerts are *visible* (not silenced, not inhibited) is decided at flush time by a
predicate the engine passes in, as Alertmanager does: an inhibited warning that is still
firing when its critical resolves shows up at the group's next tick. Every episode is told
at least once: one that opened and closed inside ``group_wait`` (a single NaN) is sent as
resolved, with its numbers, rather than never.

Incidents (issue 17): an alert carries its incident's id as the ``incident`` label, and the
default ``group_by`` is ``[run, incident]``, so one incident is one group: its first message,
then updates. An alert not (yet) in any incident groups by its detector and metric in the
incident's place. A group of an incident outlives its alerts (until ``repeat_interval``
after its last message), so a recurrence is an update of the same group -- sent as soon as
``group_interval`` since the last message allows, at once if that was long ago -- and the
incident's own changes (count, severity, title: ``note_incidents``) are news too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from runwatch.alerting.alert import Alert
from runwatch.alerting.rules import Route, Rules

INCIDENT = "incident"
"""The label holding an alert's incident id (absent while it is in none)."""


@dataclass(frozen=True)
class Notification:
    """One message for one group: what every channel of ``route`` is sent."""

    route: Route
    group_key: str
    group_labels: dict[str, str]
    alerts: tuple[Alert, ...]
    incidents: tuple[dict[str, Any], ...] = ()
    """The incidents the alerts belong to (``incident_info``), filled in by the engine."""
    sequence: int = 1
    """1 for a group's first message, 2, 3 ... for its updates."""

    @property
    def status(self) -> str:
        return "firing" if any(a.status == "firing" for a in self.alerts) else "resolved"


def snapshot(info: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What of an incident is news when it changes: its count, severity and title."""
    if info is None:
        return None
    return (info.get("count"), info.get("severity"), info.get("title"))


class _Group:
    __slots__ = ("alerts", "incident", "key", "labels", "last_sent", "next_flush", "notified",
                 "route", "sent", "told")  # fmt: skip

    def __init__(self, key: str, route: Route, labels: dict[str, str], now: float) -> None:
        self.key = key
        self.route = route
        self.labels = labels
        self.incident = labels.get(INCIDENT) or None  # the group is this incident's
        self.alerts: dict[int, Alert] = {}
        self.notified: dict[int, str] = {}  # alert id -> status it was last sent with
        self.next_flush = now + route.group_wait
        self.last_sent: float | None = None
        self.sent = 0  # messages so far
        self.told: tuple[Any, ...] | None = None  # the incident's snapshot last sent

    def news_at(self, now: float) -> None:
        """Something new: due at the next moment ``group_interval`` allows (within
        ``group_wait`` for a group never sent)."""
        if self.last_sent is not None:
            due = max(now, self.last_sent + self.route.group_interval)
            self.next_flush = min(self.next_flush, due)


class Grouper:
    """Holds groups and decides when each is notified. Not thread-safe: the engine locks."""

    def __init__(self, rules: Rules) -> None:
        self._rules = rules
        self._groups: dict[str, _Group] = {}
        self._member: dict[int, set[str]] = {}  # alert id -> keys of the groups holding it
        self._incidents: dict[str, dict[str, Any]] = {}  # incident id -> its latest info

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, alert: Alert, now: float) -> None:
        """Put (or update) ``alert`` in the groups of the routes it takes."""
        keys = set()
        for route in self._rules.routes_for(alert.labels):
            labels = _group_labels(route.group_by, alert.labels)
            key = f"{route.index}:{json.dumps(labels, sort_keys=True)}"
            keys.add(key)
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _Group(key, route, labels, now)
            elif alert.id not in group.alerts or group.alerts[alert.id].status != alert.status:
                group.news_at(now)
            group.alerts[alert.id] = alert
        for stale in self._member.get(alert.id, set()) - keys:
            # Its labels changed (a warning became critical): it now belongs elsewhere.
            group = self._groups.get(stale)
            if group is not None:
                group.alerts.pop(alert.id, None)
                group.notified.pop(alert.id, None)
        self._member[alert.id] = keys

    def holds(self, alert_id: int) -> bool:
        """Whether the alert is in a group already (told, or about to be)."""
        return alert_id in self._member

    def runs(self) -> set[str]:
        """Runs with alerts held or a group of an incident: whose incidents to watch."""
        out = {a.run for g in self._groups.values() for a in g.alerts.values()}
        out |= {g.labels.get("run", "") for g in self._groups.values() if g.incident}
        return out - {""}

    def note_incidents(self, infos: dict[str, dict[str, Any]], runs: set[str], now: float) -> None:
        """The latest info of the incidents of ``runs`` (id -> ``incident_info``).

        A group whose incident's count, severity or title changed has news (unless the
        incident is benign: it folds quietly); an empty group whose incident is gone (merged
        into another) is dropped."""
        for key in list(self._groups):
            group = self._groups[key]
            if not group.incident or group.labels.get("run", "") not in runs:
                continue
            info = infos.get(group.incident)
            if info is None:
                if not group.alerts:
                    del self._groups[key]
                continue
            if (
                group.told is not None
                and info.get("status") != "benign"
                and snapshot(info) != group.told
            ):
                group.news_at(now)
        self._incidents.update(infos)

    def next_due(self) -> float | None:
        return min((g.next_flush for g in self._groups.values()), default=None)

    def firing(self) -> list[Alert]:
        """Every firing alert held (for inhibition), once each."""
        seen: dict[int, Alert] = {}
        for group in self._groups.values():
            for alert in group.alerts.values():
                if alert.status == "firing":
                    seen[alert.id] = alert
        return list(seen.values())

    def due(
        self, now: float, visible: Callable[[Alert], bool], *, everything: bool = False
    ) -> list[Notification]:
        """Notifications of the groups whose time has come (all of them if ``everything``)."""
        out = []
        for key in list(self._groups):
            group = self._groups[key]
            if not group.alerts and not self._keep(group, now):
                del self._groups[key]  # an incident's empty group, kept long enough
                continue
            if not everything and group.next_flush > now:
                continue
            note = self._flush(group, now, visible)
            if note is not None:
                out.append(note)
            if group.alerts:
                group.next_flush = now + group.route.group_interval
            elif self._keep(group, now):
                group.next_flush = float("inf")  # until news: an alert or the incident's
            else:
                del self._groups[key]
        return out

    def _keep(self, group: _Group, now: float) -> bool:
        """An incident's group stays, empty, for ``repeat_interval`` after its last message:
        a recurrence is then an update, not a new first message."""
        return (
            group.incident is not None
            and group.last_sent is not None
            and now - group.last_sent < group.route.repeat_interval
        )

    def _flush(
        self, group: _Group, now: float, visible: Callable[[Alert], bool]
    ) -> Notification | None:
        route = group.route
        show: dict[int, Alert] = {}
        for alert in group.alerts.values():
            if not visible(alert):
                continue
            was = group.notified.get(alert.id)
            resolved_news = was is None or (was == "firing" and route.send_resolved)
            if alert.status == "firing" or resolved_news:
                show[alert.id] = alert
        firing = {i for i, a in show.items() if a.status == "firing"}
        resolved = [i for i, a in show.items() if a.status == "resolved"]
        told = {i for i, s in group.notified.items() if s == "firing"}
        # Alertmanager's rule: notify when an alert fires that was not told, or one
        # resolves that must be told; otherwise only once repeat_interval has passed.
        changed = bool(firing - told) or bool(resolved)
        info = self._incidents.get(group.incident) if group.incident else None
        if (
            info is not None
            and group.told is not None
            and info.get("status") != "benign"
            and snapshot(info) != group.told
        ):
            changed = True  # the incident grew or changed: an update of what it shows
        repeat = (
            group.last_sent is not None
            and now - group.last_sent >= route.repeat_interval
            and bool(firing)
        )
        for alert_id in [i for i, a in group.alerts.items() if a.status == "resolved"]:
            del group.alerts[alert_id]
            group.notified.pop(alert_id, None)
            self._forget(alert_id, group.key)
        if not show or not (changed or repeat):
            # Nothing new to say. Alerts muted now are forgotten as told, so they are
            # announced again if they become visible.
            group.notified = {i: "firing" for i in told & firing}
            return None
        group.notified = dict.fromkeys(firing, "firing")
        group.last_sent = now
        group.sent += 1
        group.told = snapshot(info)
        alerts = tuple(
            replace(a) for a in sorted(show.values(), key=lambda a: (a.status != "firing", a.id))
        )
        return Notification(route, group.key, dict(group.labels), alerts, sequence=group.sent)

    def _forget(self, alert_id: int, key: str) -> None:
        member = self._member.get(alert_id)
        if member is not None:
            member.discard(key)
            if not member:
                del self._member[alert_id]


def _group_labels(group_by: tuple[str, ...], labels: dict[str, str]) -> dict[str, str]:
    """The group's labels: ``group_by``'s values; an alert in no incident yet groups by
    its detector and metric where ``group_by`` says ``incident``."""
    if "..." in group_by:
        return dict(labels)
    out = {}
    for k in group_by:
        if k == INCIDENT and not labels.get(INCIDENT):
            out["detector"] = labels.get("detector", "")
            out["metric"] = labels.get("metric", "")
        else:
            out[k] = labels.get(k, "")
    return out
