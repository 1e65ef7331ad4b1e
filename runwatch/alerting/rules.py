"""Alert rules: channels, routes, grouping, inhibition and delivery, loaded from YAML.

The format (``alerts/runwatch-rules.yaml`` is a commented example, kept equal to the packaged
``default_rules.yaml``)::

    version: 1
    defaults: {group_by: [run, incident], group_wait: 10s, group_interval: 1m,
               repeat_interval: 4h, send_resolved: true}
    channels:
      oncall: {type: webhook, url_env: ONCALL_URL, secret_env: ONCALL_SECRET,
               timeout: 10s, rate_limit: {count: 20, per: 1m}}
    routes:
      - match: {min_severity: critical, project: [lm, vision], run: "gpt-*"}
        channels: [oncall]
    inhibit:
      - source: {severity: critical}
        target: {severity: warning}
        equal: [run]
    delivery: {initial_backoff: 1s, max_backoff: 1m, max_age: 24h}
    dashboard_url: http://localhost:8501

``group_by`` is honoured as written, as Alertmanager does. Labels: alertname, run, project,
detector, metric, severity, rank, host, gpu and ``incident`` (the id of the incident an
episode belongs to). The default, ``[run, incident]``, makes one incident one group: its
first message, then updates, then resolved; an alert not in any incident yet groups by
its detector and metric in its place. A file that says ``group_by: [run, detector, metric]``
keeps exactly that grouping (each message still names the incidents of its alerts); add
``incident`` to get a message per incident.

Everything is checked at load, and a mistake raises :class:`RulesError` naming the file, the
line and the valid values: a typo found at 3 a.m. by a missing page is far worse than one
found when the run starts. URLs and secrets are never part of an error or a ``repr``.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from runwatch.alerting.config import (
    CHANNEL_TYPES,
    DEFAULT_WEBHOOK_CHANNEL,
    LABELS,
    MATCH_KEYS,
    Channel,
    Delivery,
    Inhibit,
    RateLimit,
    Route,
    Rules,
    matches,
)
from runwatch.alerting.yamlnodes import Doc, RulesError
from runwatch.model import SEVERITIES

__all__ = [
    "CHANNEL_TYPES",
    "LABELS",
    "Channel",
    "Delivery",
    "Inhibit",
    "RateLimit",
    "Route",
    "Rules",
    "RulesError",
    "known_detectors",
    "load_rules",
    "matches",
    "parse_rules",
]


def known_detectors() -> tuple[str, ...]:
    """Detector names a route may name: the registry's, the Monitor's linked findings, the
    fleet detectors' (stragglers, hangs, hardware), and failure events' kinds (crash ...)."""
    from runwatch.detect import DETECTORS
    from runwatch.detect.fleet.hangs import HangDetector
    from runwatch.detect.fleet.hardware import HardwareMonitor
    from runwatch.detect.fleet.stragglers import StragglerDetector
    from runwatch.model import FAILURE_EVENTS

    fleet = (StragglerDetector.name, HangDetector.name, HardwareMonitor.name)
    events = tuple(k for k in FAILURE_EVENTS if k not in fleet)
    return (*sorted(d.name for d in DETECTORS), "grad_norm_precursor", *fleet, *events)


def default_rules_text() -> str:
    """The packaged default rules (``runwatch/alerting/default_rules.yaml``)."""
    return resources.files("runwatch.alerting").joinpath("default_rules.yaml").read_text("utf-8")


def load_rules(
    path: str | os.PathLike[str] | None = None,
    *,
    webhook: str | None = None,
    env: dict[str, str] | None = None,
) -> Rules:
    """Load and check a rules file (the packaged defaults when ``path`` is None).

    ``webhook`` is the URL of the channel named ``default`` (added, with a route for warnings
    and worse, when the file has none): ``runwatch.init(webhook=URL)`` is this.
    """
    env = dict(os.environ) if env is None else env
    if path is None:
        name, text = "<packaged default_rules.yaml>", default_rules_text()
    else:
        name = os.fspath(path)
        try:
            text = Path(name).read_text("utf-8")
        except OSError as exc:
            raise RulesError(name, None, f"cannot read the rules file: {exc.strerror}") from None
    return parse_rules(text, name, webhook=webhook, env=env)


def parse_rules(
    text: str, name: str = "<rules>", *, webhook: str | None = None, env: dict[str, str]
) -> Rules:
    doc = Doc(name, text)
    if doc.root is None:
        raise RulesError(name, None, "the rules file is empty")
    top = doc.mapping(
        doc.root,
        "rules file",
        ("version", "defaults", "channels", "routes", "inhibit", "delivery", "dashboard_url"),
        required=("version", "routes"),
    )
    version_node = top["version"][1]
    if doc.scalar(version_node) != 1:
        raise doc.error(
            version_node, f"version: {doc.scalar(version_node)!r} is not valid; valid values: 1"
        )
    defaults = _defaults(doc, top.get("defaults"))
    channels: dict[str, Channel] = {}
    channel_nodes: dict[str, yaml.Node] = {}
    if "channels" in top:
        for key, (key_node, node) in doc.mapping(top["channels"][1], "channels").items():
            channels[key] = _channel(doc, key, node, env, webhook if key == "default" else None)
            channel_nodes[key] = key_node
    routes = [
        _route(doc, node, i, defaults, channels)
        for i, node in enumerate(doc.sequence(top["routes"][1], "routes"))
    ]
    if webhook is not None and DEFAULT_WEBHOOK_CHANNEL not in channels:
        _check_url(doc, None, DEFAULT_WEBHOOK_CHANNEL, webhook)
        channels[DEFAULT_WEBHOOK_CHANNEL] = Channel(DEFAULT_WEBHOOK_CHANNEL, "webhook", webhook)
        routes.insert(0, _catch_all(defaults))
    inhibit = ()
    if "inhibit" in top:
        inhibit = tuple(_inhibit(doc, node) for node in doc.sequence(top["inhibit"][1], "inhibit"))
    delivery = _delivery(doc, top.get("delivery"))
    dashboard = (
        doc.string(top["dashboard_url"][1], "dashboard_url") if "dashboard_url" in top else None
    )
    used = {c for r in routes for c in r.channels}
    for key, key_node in channel_nodes.items():
        if key not in used:
            raise doc.error(key_node, f"channel {key!r} is not used by any route")
    return Rules(name, channels, tuple(routes), inhibit, delivery, dashboard)


def _catch_all(defaults: dict[str, Any]) -> Route:
    return Route({}, "warning", (DEFAULT_WEBHOOK_CHANNEL,), continue_=True, **defaults)


def _defaults(doc: Doc, entry: tuple[yaml.Node, yaml.Node] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "group_by": ("run", "incident"),
        "group_wait": 10.0,
        "group_interval": 60.0,
        "repeat_interval": 4 * 3600.0,
        "send_resolved": True,
    }
    if entry is not None:
        items = doc.mapping(entry[1], "defaults", tuple(out))
        out.update(_grouping(doc, items, "defaults"))
    return out


def _grouping(doc: Doc, items: dict[str, tuple[yaml.Node, yaml.Node]], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("group_wait", "group_interval", "repeat_interval"):
        if key in items:
            out[key] = doc.duration(items[key][1], f"{what}: {key}")
    if "group_by" in items:
        node = items["group_by"][1]
        labels = doc.strings(node, f"{what}: group_by")
        for label in labels:
            if label not in (*LABELS, "..."):
                raise doc.error(
                    node,
                    f"{what}: group_by: unknown label {label!r}; valid values: "
                    f"{', '.join(LABELS)}, ...",
                )
        out["group_by"] = labels
    if "send_resolved" in items:
        out["send_resolved"] = doc.boolean(items["send_resolved"][1], f"{what}: send_resolved")
    if out.get("group_interval") == 0.0:
        raise doc.error(items["group_interval"][1], f"{what}: group_interval must be above 0")
    return out


def _check_url(doc: Doc, node: yaml.Node | None, channel: str, url: str) -> None:
    # The URL itself is never quoted back: a Slack URL is a credential.
    if not url.startswith(("http://", "https://")):
        raise doc.error(node, f"channel {channel!r}: the url must start with http:// or https://")


def _channel(
    doc: Doc, name: str, node: yaml.Node, env: dict[str, str], webhook: str | None
) -> Channel:
    what = f"channel {name!r}"
    valid = ("type", "url", "url_env", "secret", "secret_env", "timeout", "headers",
             "rate_limit", "max_alerts", "concurrency")  # fmt: skip
    items = doc.mapping(node, what, valid, required=("type",))
    kind = doc.choice(items["type"][1], f"{what}: type", CHANNEL_TYPES)
    url = _secret_value(doc, node, items, what, "url", env, required=webhook is None)
    url = webhook if webhook is not None else url
    assert url is not None
    _check_url(doc, items.get("url", items.get("url_env", (node, node)))[1], name, url)
    secret = _secret_value(doc, node, items, what, "secret", env, required=False)
    kwargs: dict[str, Any] = {}
    if "timeout" in items:
        kwargs["timeout"] = doc.duration(items["timeout"][1], f"{what}: timeout")
        if kwargs["timeout"] <= 0:
            raise doc.error(items["timeout"][1], f"{what}: timeout must be above 0")
    if "headers" in items:
        headers = doc.mapping(items["headers"][1], f"{what}: headers")
        kwargs["headers"] = {
            k: doc.string(v, f"{what}: headers: {k}") for k, (_, v) in headers.items()
        }
    if "rate_limit" in items:
        rl = doc.mapping(
            items["rate_limit"][1], f"{what}: rate_limit", ("count", "per"), ("count", "per")
        )
        per = doc.duration(rl["per"][1], f"{what}: rate_limit: per")
        if per <= 0:
            raise doc.error(rl["per"][1], f"{what}: rate_limit: per must be above 0")
        kwargs["rate_limit"] = RateLimit(
            doc.positive_int(rl["count"][1], f"{what}: rate_limit: count"), per
        )
    for key in ("max_alerts", "concurrency"):
        if key in items:
            kwargs[key] = doc.positive_int(items[key][1], f"{what}: {key}")
    return Channel(name, kind, url, secret, **kwargs)


def _secret_value(
    doc: Doc,
    node: yaml.Node,
    items: dict[str, tuple[yaml.Node, yaml.Node]],
    what: str,
    key: str,
    env: dict[str, str],
    *,
    required: bool,
) -> str | None:
    direct, via_env = items.get(key), items.get(f"{key}_env")
    if direct is not None and via_env is not None:
        raise doc.error(via_env[0], f"{what}: give {key} or {key}_env, not both")
    if direct is not None:
        return doc.string(direct[1], f"{what}: {key}")
    if via_env is not None:
        var = doc.string(via_env[1], f"{what}: {key}_env")
        value = env.get(var)
        if not value and required:
            raise doc.error(via_env[1], f"{what}: environment variable {var} is not set")
        return value or None
    if required:
        raise doc.error(node, f"{what}: missing required key {key!r} (or {key}_env)")
    return None


def _matchers(
    doc: Doc, node: yaml.Node, what: str, allow_min: bool
) -> tuple[dict[str, tuple[str, ...]], str | None]:
    valid = MATCH_KEYS if allow_min else LABELS
    items = doc.mapping(node, what, valid)
    out: dict[str, tuple[str, ...]] = {}
    min_severity = None
    for key, (_, value) in items.items():
        if key == "min_severity":
            min_severity = doc.choice(value, f"{what}: min_severity", SEVERITIES)
            continue
        values = doc.strings(value, f"{what}: {key}")
        if key == "severity":
            for v in values:
                if v not in SEVERITIES:
                    raise doc.error(
                        value,
                        f"{what}: severity {v!r} is not valid; "
                        f"valid values: {', '.join(SEVERITIES)}",
                    )
        if key in ("detector", "alertname"):
            detectors = known_detectors()
            for v in values:
                if v not in detectors and not any(c in v for c in "*?["):
                    raise doc.error(
                        value,
                        f"{what}: unknown detector {v!r}; valid values: "
                        f"{', '.join(detectors)} (or a glob like 'spike*')",
                    )
        out[key] = values
    return out, min_severity


def _route(
    doc: Doc, node: yaml.Node, index: int, defaults: dict[str, Any], channels: dict[str, Channel]
) -> Route:
    what = f"routes[{index}]"
    valid = ("match", "channels", "continue", "group_by", "group_wait", "group_interval",
             "repeat_interval", "send_resolved")  # fmt: skip
    items = doc.mapping(node, what, valid, required=("channels",))
    match, min_severity = ({}, None)
    if "match" in items:
        match, min_severity = _matchers(doc, items["match"][1], f"{what}: match", allow_min=True)
    names = doc.strings(items["channels"][1], f"{what}: channels")
    for channel in names:
        if channel not in channels:
            known = ", ".join(channels) or "(none defined)"
            raise doc.error(
                items["channels"][1], f"{what}: unknown channel {channel!r}; valid values: {known}"
            )
    settings = dict(defaults)
    settings.update(_grouping(doc, items, what))
    continue_ = (
        doc.boolean(items["continue"][1], f"{what}: continue") if "continue" in items else False
    )
    return Route(match, min_severity, names, continue_=continue_, index=index, **settings)


def _inhibit(doc: Doc, node: yaml.Node) -> Inhibit:
    items = doc.mapping(
        node, "inhibit", ("source", "target", "equal"), required=("source", "target")
    )
    source, _ = _matchers(doc, items["source"][1], "inhibit: source", allow_min=False)
    target, _ = _matchers(doc, items["target"][1], "inhibit: target", allow_min=False)
    equal: tuple[str, ...] = ()
    if "equal" in items:
        equal = doc.strings(items["equal"][1], "inhibit: equal")
        for label in equal:
            if label not in LABELS:
                raise doc.error(
                    items["equal"][1],
                    f"inhibit: equal: unknown label {label!r}; valid values: {', '.join(LABELS)}",
                )
    return Inhibit(source, target, equal)


def _delivery(doc: Doc, entry: tuple[yaml.Node, yaml.Node] | None) -> Delivery:
    if entry is None:
        return Delivery()
    items = doc.mapping(entry[1], "delivery", ("initial_backoff", "max_backoff", "max_age"))
    values = {k: doc.duration(v, f"delivery: {k}") for k, (_, v) in items.items()}
    delivery = Delivery(**values)
    if delivery.initial_backoff <= 0:
        raise doc.error(items["initial_backoff"][1], "delivery: initial_backoff must be above 0")
    if delivery.max_backoff < delivery.initial_backoff:
        node = items.get("max_backoff", items.get("initial_backoff"))
        assert node is not None
        raise doc.error(node[1], "delivery: max_backoff must be at least initial_backoff")
    return delivery
