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
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace

from runwatch.alerting.alert import Alert
from runwatch.alerting.rules import Route, Rules


@dataclass(frozen=True)
class Notification:
    """One message for one group: what every channel of ``route`` is sent."""

    route: Route
    group_key: str
    group_labels: dict[str, str]
    alerts: tuple[Alert, ...]

    @property
    def status(self) -> str:
        return "firing" if any(a.status == "firing" for a in self.alerts) else "resolved"


class _Group:
    __slots__ = ("alerts", "key", "labels", "last_sent", "next_flush", "notified", "route")

    def __init__(self, key: str, route: Route, labels: dict[str, str], now: float) -> None:
        self.key = key
        self.route = route
        self.labels = labels
        self.alerts: dict[int, Alert] = {}
        self.notified: dict[int, str] = {}  # alert id -> status it was last sent with
        self.next_flush = now + route.group_wait
        self.last_sent: float | None = None


class Grouper:
    """Holds groups and decides when each is notified. Not thread-safe: the engine locks."""

    def __init__(self, rules: Rules) -> None:
        self._rules = rules
        self._groups: dict[str, _Group] = {}
        self._member: dict[int, set[str]] = {}  # alert id -> keys of the groups holding it

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, alert: Alert, now: float) -> None:
        """Put (or update) ``alert`` in the groups of the routes it takes."""
        keys = set()
        for route in self._rules.routes_for(alert.labels):
            if "..." in route.group_by:
                labels = dict(alert.labels)
            else:
                labels = {k: alert.labels.get(k, "") for k in route.group_by}
            key = f"{route.index}:{json.dumps(labels, sort_keys=True)}"
            keys.add(key)
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _Group(key, route, labels, now)
            group.alerts[alert.id] = alert
        for stale in self._member.get(alert.id, set()) - keys:
            # Its labels changed (a warning became critical): it now belongs elsewhere.
            group = self._groups.get(stale)
            if group is not None:
                group.alerts.pop(alert.id, None)
                group.notified.pop(alert.id, None)
        self._member[alert.id] = keys

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
            if not everything and group.next_flush > now:
                continue
            note = self._flush(group, now, visible)
            if note is not None:
                out.append(note)
            if not group.alerts:
                del self._groups[key]
            else:
                group.next_flush = now + group.route.group_interval
        return out

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
        alerts = tuple(
            replace(a) for a in sorted(show.values(), key=lambda a: (a.status != "firing", a.id))
        )
        return Notification(route, group.key, dict(group.labels), alerts)

    def _forget(self, alert_id: int, key: str) -> None:
        member = self._member.get(alert_id)
        if member is not None:
            member.discard(key)
            if not member:
                del self._member[alert_id]
