"""`runwatch silence` and `runwatch alerts test` through runwatch.cli.main."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runwatch.cli import main
from runwatch.store import open_store


def test_silence_add_list_expire(store_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = ["--db", store_path]
    add = ["silence", "add", *db, "--run", "gpt-*", "--detector", "spike", "--duration", "1h"]
    assert main([*add, "--comment", "known flaky rank"]) == 0
    assert capsys.readouterr().out.startswith("silence 1 added until ")
    assert main(["silence", "list", *db]) == 0
    out = capsys.readouterr().out
    assert "active" in out and "detector=spike, run=gpt-*" in out and "# known flaky" in out
    with open_store(store_path) as store:
        (silence,) = store.silences(active_at=store.silences()[0]["starts_at"] + 1)
    assert silence["matchers"] == {"run": "gpt-*", "detector": "spike"}
    assert 3590 < silence["ends_at"] - silence["starts_at"] <= 3600
    assert main(["silence", "expire", *db, "1"]) == 0
    assert capsys.readouterr().out == "silence 1 expired\n"
    assert main(["silence", "list", *db]) == 0
    assert capsys.readouterr().out == "no active silences\n"
    assert main(["silence", "list", *db, "--all", "--format", "json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["active"] is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["add"], "give at least one matcher: --run, --project, --detector"),
        (["add", "--severity", "high"], "--severity 'high' is not valid; valid values: info"),
        (["add", "--run", "x", "--duration", "soon"], "'soon' is not a duration"),
        (["expire", "99"], "no silence with id 99"),
    ],
)
def test_silence_bad_input_exits_2_with_the_reason(
    store_path: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["silence", argv[0], "--db", store_path, *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("runwatch silence: error: ") and message in err


def test_alerts_test_reports_each_receivers_answer(
    receiver: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    receiver.secret = None
    assert main(["alerts", "test", "--webhook", receiver.url]) == 0
    assert capsys.readouterr().out == 'default (webhook): ok: HTTP 200: {"ok": true}\n'
    (got,) = receiver.received
    assert got["body"]["alerts"][0]["message"].startswith("runwatch test message")

    rules = tmp_path / "rules.yaml"
    rules.write_text(
        f"""version: 1
channels:
  team: {{type: slack, url: "{receiver.url}"}}
  am: {{type: alertmanager_webhook, url: "{receiver.url}"}}
routes:
  - channels: [team, am]
"""
    )
    receiver.script = ["ok", "500"]
    assert main(["alerts", "test", "--alerts", str(rules)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        'team (slack): ok: HTTP 200: {"ok": true}',
        "am (alertmanager_webhook): FAILED: HTTP 500: receiver error",
    ]
    assert "blocks" in receiver.received[-1]["body"]


def test_alerts_test_bad_rules_exit_2_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = tmp_path / "bad.yaml"
    rules.write_text("version: 1\nroutes:\n  - channels: [nope]\n")
    assert main(["alerts", "test", "--alerts", str(rules)]) == 2
    err = capsys.readouterr().err
    assert f"{rules}:3: routes[0]: unknown channel 'nope'; valid values: (none defined)" in err
