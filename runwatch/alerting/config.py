"""The rules' data: channels, routes, inhibition, delivery settings, and label matching.

Plain frozen dataclasses, made only by :func:`runwatch.alerting.rules.load_rules` (which
checks every value), so the engine, sender and payloads can trust them without re-checking.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from runwatch.model import severity_rank

CHANNEL_TYPES = ("webhook", "slack", "alertmanager_webhook", "alertmanager")
"""webhook: runwatch's JSON schema; slack: Block Kit; alertmanager_webhook: Alertmanager's
webhook payload v4 (for existing receivers); alertmanager: POST to a real Alertmanager's
/api/v2/alerts."""

LABELS = (
    "alertname", "run", "project", "detector", "metric", "severity", "rank", "host", "gpu",
    "incident",
)  # fmt: skip
"""The labels of an alert: what routes match, silences match and groups are formed by.
``incident`` is the id of the incident the episode belongs to (absent while in none)."""

MATCH_KEYS = ("min_severity", *LABELS[1:])
DEFAULT_WEBHOOK_CHANNEL = "default"


@dataclass(frozen=True)
class RateLimit:
    """At most ``count`` messages per ``per`` seconds through one channel; the rest wait."""

    count: int
    per: float


@dataclass(frozen=True)
class Channel:
    """Where messages go. ``url`` and ``secret`` are kept out of ``repr`` on purpose."""

    name: str
    type: str
    url: str = field(repr=False)
    secret: str | None = field(default=None, repr=False)
    timeout: float = 10.0
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    rate_limit: RateLimit | None = None
    max_alerts: int = 50
    concurrency: int = 4


@dataclass(frozen=True)
class Route:
    """Alerts matching ``match`` (and at least ``min_severity``) go to ``channels``."""

    match: dict[str, tuple[str, ...]]
    min_severity: str | None
    channels: tuple[str, ...]
    group_by: tuple[str, ...]
    group_wait: float
    group_interval: float
    repeat_interval: float
    send_resolved: bool
    continue_: bool = False
    index: int = 0

    def matches(self, labels: dict[str, str]) -> bool:
        if self.min_severity is not None and severity_rank(labels["severity"]) < severity_rank(
            self.min_severity
        ):
            return False
        return matches(self.match, labels)


@dataclass(frozen=True)
class Inhibit:
    """A firing alert matching ``source`` mutes alerts matching ``target`` with equal labels."""

    source: dict[str, tuple[str, ...]]
    target: dict[str, tuple[str, ...]]
    equal: tuple[str, ...]


@dataclass(frozen=True)
class Delivery:
    initial_backoff: float = 1.0
    max_backoff: float = 60.0
    max_age: float = 86400.0


@dataclass(frozen=True)
class Rules:
    """A loaded, validated rules file."""

    source: str
    channels: dict[str, Channel]
    routes: tuple[Route, ...]
    inhibit: tuple[Inhibit, ...]
    delivery: Delivery
    dashboard_url: str | None

    def routes_for(self, labels: dict[str, str]) -> list[Route]:
        """The routes an alert takes: the first match, and more while ``continue`` is set."""
        out = []
        for route in self.routes:
            if route.matches(labels):
                out.append(route)
                if not route.continue_:
                    break
        return out


def matches(matchers: dict[str, tuple[str, ...]], labels: dict[str, str]) -> bool:
    """Every matcher matches its label: one of its values, which may be globs (``gpt-*``)."""
    for key, patterns in matchers.items():
        value = labels.get(key, "")
        if not any(fnmatch.fnmatchcase(value, p) for p in patterns):
            return False
    return True
