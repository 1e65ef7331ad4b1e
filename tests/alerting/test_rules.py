"""Rules files: the packaged defaults load, and every malformed case gets its exact error."""

from __future__ import annotations

from pathlib import Path

import pytest

from runwatch.alerting.rules import default_rules_text, known_detectors, load_rules, parse_rules
from runwatch.alerting.yamlnodes import RulesError

ROOT = Path(__file__).resolve().parents[2]

BASE = """version: 1
channels:
  ops: {type: webhook, url: "http://127.0.0.1:9/x"}
routes:
  - channels: [ops]
"""

CASES = {
    "empty": "",
    "not_yaml": "version: 1\nroutes: [\n",
    "top_list": "- a\n- b\n",
    "unknown_top": BASE + "dashbord_url: x\n",
    "no_version": "routes: []\n",
    "bad_version": BASE.replace("version: 1", "version: 2"),
    "no_routes": "version: 1\n",
    "bad_type": BASE.replace("type: webhook", "type: pager"),
    "bad_url": BASE.replace('"http://127.0.0.1:9/x"', "ftp://secret-host/x"),
    "no_url": BASE.replace(', url: "http://127.0.0.1:9/x"', ""),
    "url_and_env": BASE.replace('url: "http://127.0.0.1:9/x"', 'url: "http://a/b", url_env: X'),
    "env_unset": BASE.replace('url: "http://127.0.0.1:9/x"', "url_env: NOT_SET_ANYWHERE"),
    "unknown_channel": BASE.replace("channels: [ops]", "channels: [opz]"),
    "bad_severity": BASE.replace(
        "  - channels: [ops]", "  - match: {severity: [critical, severe]}\n    channels: [ops]"
    ),
    "bad_min": BASE.replace(
        "  - channels: [ops]", "  - match: {min_severity: high}\n    channels: [ops]"
    ),
    "bad_detector": BASE.replace(
        "  - channels: [ops]", "  - match: {detector: spikes}\n    channels: [ops]"
    ),
    "bad_match_key": BASE.replace(
        "  - channels: [ops]", "  - match: {sev: critical}\n    channels: [ops]"
    ),
    "bad_duration": BASE + "defaults: {group_wait: 10 minutes}\n",
    "zero_interval": BASE + "defaults: {group_interval: 0s}\n",
    "bad_group_by": BASE + "defaults: {group_by: [run, node]}\n",
    "bad_rate": BASE.replace("}", ", rate_limit: {count: 0, per: 1m}}", 1),
    "unused_channel": BASE.replace(
        "routes:", '  spare: {type: slack, url: "https://hooks.example/x"}\nroutes:'
    ),
    "bad_inhibit_equal": BASE
    + "inhibit:\n  - source: {severity: critical}\n    target: {severity: warning}\n    equal: [runn]\n",  # noqa: E501
    "dup_key": BASE + "version: 1\n",
    "bad_bool": BASE.replace(
        "  - channels: [ops]", "  - channels: [ops]\n    continue: yes please"
    ),
    "bad_backoff": BASE + "delivery: {initial_backoff: 10s, max_backoff: 1s}\n",
    "route_key": BASE.replace("  - channels: [ops]", "  - channels: [ops]\n    receiver: ops"),
}

EXPECTED = {
    "empty": "r.yaml: the rules file is empty",
    "not_yaml": "r.yaml:3: not valid YAML: expected the node content, but found '<stream end>'",
    "top_list": "r.yaml:1: rules file must be a mapping",
    "unknown_top": "r.yaml:6: rules file: unknown key 'dashbord_url'; valid keys: version, defaults, channels, routes, inhibit, delivery, dashboard_url",  # noqa: E501
    "no_version": "r.yaml:1: rules file: missing required key 'version'",
    "bad_version": "r.yaml:1: version: 2 is not valid; valid values: 1",
    "no_routes": "r.yaml:1: rules file: missing required key 'routes'",
    "bad_type": "r.yaml:3: channel 'ops': type: 'pager' is not valid; valid values: webhook, slack, alertmanager_webhook, alertmanager",  # noqa: E501
    "bad_url": "r.yaml:3: channel 'ops': the url must start with http:// or https://",
    "no_url": "r.yaml:3: channel 'ops': missing required key 'url' (or url_env)",
    "url_and_env": "r.yaml:3: channel 'ops': give url or url_env, not both",
    "env_unset": "r.yaml:3: channel 'ops': environment variable NOT_SET_ANYWHERE is not set",
    "unknown_channel": "r.yaml:5: routes[0]: unknown channel 'opz'; valid values: ops",
    "bad_severity": "r.yaml:5: routes[0]: match: severity 'severe' is not valid; valid values: info, warning, critical",  # noqa: E501
    "bad_min": "r.yaml:5: routes[0]: match: min_severity: 'high' is not valid; valid values: info, warning, critical",  # noqa: E501
    "bad_detector": "r.yaml:5: routes[0]: match: unknown detector 'spikes'; valid values: "
    + ", ".join(known_detectors())
    + " (or a glob like 'spike*')",
    "bad_match_key": "r.yaml:5: routes[0]: match: unknown key 'sev'; valid keys: min_severity, run, project, detector, metric, severity, rank, host, gpu, incident",  # noqa: E501
    "bad_duration": "r.yaml:6: defaults: group_wait: '10 minutes' is not a duration; use e.g. 0, 500ms, 30s, 5m, 4h, 1d",  # noqa: E501
    "zero_interval": "r.yaml:6: defaults: group_interval must be above 0",
    "bad_group_by": "r.yaml:6: defaults: group_by: unknown label 'node'; valid values: alertname, run, project, detector, metric, severity, rank, host, gpu, incident, ...",  # noqa: E501
    "bad_rate": "r.yaml:3: channel 'ops': rate_limit: count must be a positive integer, got 0",
    "unused_channel": "r.yaml:4: channel 'spare' is not used by any route",
    "bad_inhibit_equal": "r.yaml:9: inhibit: equal: unknown label 'runn'; valid values: alertname, run, project, detector, metric, severity, rank, host, gpu, incident",  # noqa: E501
    "dup_key": "r.yaml:6: rules file: key 'version' appears twice",
    "bad_bool": "r.yaml:6: routes[0]: continue must be true or false, got 'yes please'",
    "bad_backoff": "r.yaml:6: delivery: max_backoff must be at least initial_backoff",
    "route_key": "r.yaml:6: routes[0]: unknown key 'receiver'; valid keys: match, channels, continue, group_by, group_wait, group_interval, repeat_interval, send_resolved",  # noqa: E501
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_rules_fail_with_file_line_and_valid_values(name: str) -> None:
    with pytest.raises(RulesError) as info:
        parse_rules(CASES[name], "r.yaml", env={})
    assert str(info.value) == EXPECTED[name]


def test_every_case_has_an_expected_error() -> None:
    assert set(CASES) == set(EXPECTED)


def test_errors_never_quote_a_url() -> None:
    with pytest.raises(RulesError) as info:
        parse_rules(CASES["bad_url"], "r.yaml", env={})
    assert "secret-host" not in str(info.value)


def test_error_from_a_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "team.yaml"
    path.write_text(CASES["bad_type"])
    with pytest.raises(RulesError, match=rf"^{path}:3: channel 'ops': type: 'pager'"):
        load_rules(path, env={})
    with pytest.raises(RulesError, match="cannot read the rules file"):
        load_rules(tmp_path / "missing.yaml", env={})


def test_packaged_defaults_equal_the_copy_for_people() -> None:
    assert (ROOT / "alerts" / "runwatch-rules.yaml").read_text() == default_rules_text()


def test_defaults_need_a_webhook_and_take_it_from_the_environment() -> None:
    with pytest.raises(RulesError, match="RUNWATCH_WEBHOOK_URL is not set"):
        load_rules(env={})
    rules = load_rules(env={"RUNWATCH_WEBHOOK_URL": "http://127.0.0.1:1/h"})
    assert rules.channels["default"].url == "http://127.0.0.1:1/h"
    assert rules.channels["default"].secret is None
    critical, route = rules.routes
    assert (critical.min_severity, critical.group_wait, critical.group_interval) == (
        "critical",
        0,
        30,
    )
    assert (route.min_severity, route.group_by) == ("warning", ("run", "incident"))
    assert (route.group_wait, route.group_interval, route.repeat_interval) == (10, 60, 4 * 3600)
    assert rules.inhibit[0].equal == ("run",)


def test_webhook_argument_wins_and_is_never_in_repr() -> None:
    url = "https://hooks.example.com/services/T000/B000/very-secret-token"
    rules = load_rules(webhook=url, env={"RUNWATCH_WEBHOOK_SECRET": "s3cr3t"})
    channel = rules.channels["default"]
    assert channel.url == url and channel.secret == "s3cr3t"
    assert "very-secret-token" not in repr(rules) and "s3cr3t" not in repr(rules)


def test_webhook_with_a_file_without_default_channel_adds_a_catch_all_route() -> None:
    rules = parse_rules(BASE, "r.yaml", webhook="http://127.0.0.1:2/w", env={})
    assert set(rules.channels) == {"ops", "default"}
    labels = {"severity": "critical", "run": "r", "detector": "spike", "metric": "loss"}
    assert [r.channels for r in rules.routes_for(labels)] == [("default",), ("ops",)]


def test_routes_match_globs_lists_and_min_severity() -> None:
    text = BASE.replace(
        "  - channels: [ops]",
        "  - match: {run: 'gpt-*', severity: [critical]}\n    channels: [ops]\n"
        "    group_wait: 0\n    continue: true\n"
        "  - match: {min_severity: warning, metric: [loss, val_loss]}\n    channels: [ops]",
    )
    rules = parse_rules(text, "r.yaml", env={})
    base = {"run": "gpt-7", "detector": "spike", "metric": "loss"}
    assert [r.index for r in rules.routes_for(base | {"severity": "critical"})] == [0, 1]
    assert [r.index for r in rules.routes_for(base | {"severity": "warning"})] == [1]
    assert rules.routes_for(base | {"severity": "info"}) == []
    assert rules.routes_for(base | {"severity": "warning", "metric": "lr"}) == []
    assert rules.routes[0].group_wait == 0.0


def test_routes_may_name_the_fleet_and_stall_detectors() -> None:
    for detector in ("straggler", "hang", "hardware", "stall", "crash", "oom", "nccl_timeout"):
        text = BASE.replace(
            "  - channels: [ops]", f"  - match: {{detector: {detector}}}\n    channels: [ops]"
        )
        parse_rules(text, "r.yaml", env={})
