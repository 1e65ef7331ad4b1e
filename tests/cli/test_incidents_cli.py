"""`runwatch incidents` and `runwatch verdict` over a real store: formats, order, verdicts,
and bad input that writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import runwatch
from runwatch.cli import main
from runwatch.cli_incidents import MAX_MEMBERS
from runwatch.store import open_store
from runwatch.store.incidents import importance_order

INCIDENT_KEYS = {
    "run",
    "id",
    "title",
    "status",
    "severity",
    "first_step",
    "last_step",
    "count",
    "signature",
    "members",
    "members_total",
    "hypotheses",
    "verdict",
    "source",
    "is_active",
}
MEMBER_KEYS = {"kind", "id", "what", "metric", "labels", "step", "end_step", "severity", "message"}
SPIKES = 26  # every 100 steps from 350 to 2950, less the one the NaN incident takes (2450)


def _spiky_csv(path, run="spiky"):
    """A loss with a 1.5x spike every 100 steps after step 300 and a NaN at step 2500."""
    rng = np.random.default_rng(0)
    lines = ["run,step,metric,value"]
    for step in range(1, 3001):
        loss = 2.0 + 8.0 * (step + 20.0) ** -0.4 + rng.normal(0, 0.01)
        if step % 100 == 50 and step > 300:
            loss *= 1.5
        if step == 2500:
            loss = float("nan")
        lines.append(f"{run},{step},loss,{loss}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _imported(tmp_path, db_path, *runs, analyze=True):
    for run in runs:
        src = _spiky_csv(tmp_path / f"{run}.csv", run)
        assert main(["import", str(src), "--db", str(db_path)]) == 0
        if analyze:
            assert main(["analyze", "--db", str(db_path), "--run", run]) == 0
    return str(db_path)


@pytest.fixture
def spiky(tmp_path, db_path, capsys):
    db = _imported(tmp_path, db_path, "spiky")
    capsys.readouterr()
    return db


def _json(capsys, db, run="spiky", *extra):
    assert main(["incidents", "--db", db, "--run", run, "--format", "json", *extra]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _state(db):
    """Everything a verdict writes: the verdict rows and each incident's status."""
    with open_store(db, readonly=True) as store:
        verdicts = store.verdicts().drop(columns=["time"]).to_dict(orient="records")
        statuses = {
            int(row.id): row.status
            for source in ("live", "replay")
            for row in store.incidents(source=source).itertuples()
        }
    return verdicts, statuses


def test_json_lines_carry_the_contract_fields_with_bounded_members(spiky, capsys):
    rows = _json(capsys, spiky)
    assert rows and all(set(row) >= INCIDENT_KEYS for row in rows)
    nan, spikes = rows  # the critical NaN incident comes before the info spike pattern
    assert nan["severity"] == "critical" and spikes["severity"] == "info"
    assert any(m["what"] == "nonfinite" and m["step"] == 2500 for m in nan["members"])
    assert spikes["count"] == SPIKES == spikes["members_total"]
    assert len(spikes["members"]) == MAX_MEMBERS < spikes["members_total"]
    steps = [m["step"] for m in spikes["members"]]
    assert steps == sorted(steps) and steps[0] == spikes["first_step"] == 350
    for row in rows:
        assert row["run"] == "spiky" and row["status"] == "open" and row["verdict"] is None
        assert row["source"] == "replay" and row["is_active"] is False
        for member in row["members"]:
            assert set(member) == MEMBER_KEYS  # anomalies: no attempt/rank/host keys
            assert member["kind"] == "anomaly" and member["metric"] == "loss"


def test_table_lists_open_incidents_most_important_first(spiky, capsys):
    ids = [row["id"] for row in _json(capsys, spiky)]
    assert main(["incidents", "--db", spiky, "--run", "spiky"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["id", "severity", "status", "count", "steps", "title"]
    assert [int(line.split()[0]) for line in lines[1:]] == ids
    assert lines[1].split()[1:5] == ["critical", "open", "2", "2,450-2,500"]
    assert "26 loss spikes" in lines[2] and "350-2,950" in lines[2]


def test_order_is_open_then_severity_then_recency():
    frame = pd.DataFrame(
        {
            "id": [1, 2, 3, 4, 5],
            "status": ["open", "benign", "open", "open", "real"],
            "severity": ["info", "critical", "warning", "warning", "critical"],
            "last_step": [900, 50, 100, 700, None],
        }
    )
    assert importance_order(frame)["id"].tolist() == [4, 3, 1, 2, 5]


def test_verdict_moves_an_incident_out_of_open_and_all_shows_it(spiky, capsys, monkeypatch):
    monkeypatch.setenv("USER", "alice")
    nan, spikes = _json(capsys, spiky)
    note = "the warm-up restarts every 100 steps"
    verdict = ["verdict", "--db", spiky, "--run", "spiky", "--incident", str(spikes["id"])]
    assert main([*verdict, "benign", "--note", note]) == 0
    assert f"incident {spikes['id']} of run 'spiky' is now benign" in capsys.readouterr().out
    assert [row["id"] for row in _json(capsys, spiky)] == [nan["id"]]
    every = _json(capsys, spiky, "spiky", "--status", "all")
    assert [row["id"] for row in every] == [nan["id"], spikes["id"]]  # judged after open
    assert every[1]["status"] == "benign"
    assert every[1]["verdict"] == {"verdict": "benign", "note": note, "author": "alice"}
    assert [row["id"] for row in _json(capsys, spiky, "spiky", "--status", "benign")] == [
        spikes["id"]
    ]
    with open_store(spiky, readonly=True) as store:
        rows = store.verdicts()
    assert rows[["incident_id", "verdict", "author"]].values.tolist() == [
        [spikes["id"], "benign", "alice"]
    ]


def test_markdown_report_of_a_recurring_pattern_bounds_its_members(spiky, capsys):
    assert main(["incidents", "--db", spiky, "--run", "spiky", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Incidents of run `spiky`")
    assert out.count("\n## Incident ") == 2
    assert out.index("non-finite") < out.index("26 loss spikes")
    assert f"### Members ({MAX_MEMBERS} of {SPIKES})" in out
    assert f"… and {SPIKES - MAX_MEMBERS} more members." in out
    assert "At steps 350, 450, 550" in out
    assert "No clear cause" in out and "None yet." in out


def _crashing_fleet(tmp_path, db_path):
    """Eight ranks on four hosts; four crashes, each ending an attempt, all on host n3."""
    rng = np.random.default_rng(0)
    lines = ["run,step,metric,value,rank,host"]
    for step in range(1, 601):
        for rank in range(8):
            value = 0.1 * (1 + rng.normal(0, 0.01))
            lines.append(f"fleet,{step},step_time,{value},{rank},n{rank // 2}")
    src = tmp_path / "fleet.csv"
    src.write_text("\n".join(lines) + "\n")
    db = str(db_path)
    assert main(["import", str(src), "--db", db]) == 0
    for i, step in enumerate((100, 250, 400, 550)):
        with runwatch.init(name="fleet", store=db, monitor=False, resume=True) as run:
            rank = 6 + i % 2
            run.event(
                "crash",
                step=step,
                message=f"RuntimeError: CUDA error: unspecified launch failure on rank {rank}",
                rank=rank,
                host="n3",
            )
    assert main(["analyze", "--db", db, "--run", "fleet"]) == 0
    return db


def test_markdown_report_has_timeline_evidence_and_verdict_history(tmp_path, db_path, capsys):
    db = _crashing_fleet(tmp_path, db_path)
    capsys.readouterr()
    (crash,) = [row for row in _json(capsys, db, "fleet") if row["signature"]]
    assert crash["hypotheses"][0]["cause"] == "host=n3"
    assert {(m["attempt"], m["rank"], m["host"]) for m in crash["members"]} == {
        (2, 6, "n3"),
        (3, 7, "n3"),
        (4, 6, "n3"),
        (5, 7, "n3"),
    }
    verdict = ["verdict", "--db", db, "--run", "fleet", "--incident", str(crash["id"])]
    assert main([*verdict, "watch", "--author", "bob"]) == 0
    assert main([*verdict, "real", "--note", "GPU 3 on n3 | replaced", "--author", "alice"]) == 0
    capsys.readouterr()
    assert main(["incidents", "--db", db, "--run", "fleet", "--format", "markdown"]) == 0
    assert f"## Incident {crash['id']}:" not in capsys.readouterr().out  # judged: not open
    args = ["incidents", "--db", db, "--run", "fleet", "--format", "markdown", "--status", "real"]
    assert main(args) == 0
    out = capsys.readouterr().out
    section = out[out.index(f"## Incident {crash['id']}:") :]
    assert "**critical** · real · 4 occurrences" in section
    assert "| step | attempt | rank | host |" in section
    assert "| 250 | 3 | 7 | n3 |" in section
    assert "- **host=n3** (score " in section and "4 of 4 crashes on host n3" in section
    history = section[section.index("### Verdicts") :].splitlines()
    assert history[4].endswith("| watch | bob |  |")
    assert history[5].endswith("| real | alice | GPU 3 on n3 \\| replaced |")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--run", "nope", "--incident", "{own}", "real"], "no run named 'nope'"),
        (["--run", "spiky", "--incident", "999", "real"], "run 'spiky' has no incident 999"),
        (["--run", "spiky", "--incident", "{other}", "real"], "belongs to run 'other'"),
        (["--run", "spiky", "--incident", "{own}", "fine"], "invalid choice: 'fine'"),
        (["--run", "spiky", "--incident", "x", "real"], "invalid int value: 'x'"),
    ],
)
def test_bad_verdict_input_exits_2_and_writes_nothing(tmp_path, db_path, capsys, args, says):
    db = _imported(tmp_path, db_path, "spiky", "other")
    capsys.readouterr()
    own = _json(capsys, db, "spiky")[0]["id"]
    other = _json(capsys, db, "other")[0]["id"]
    verdict = ["verdict", "--db", db, "--run", "spiky", "--incident", str(own)]
    assert main([*verdict, "watch"]) == 0  # a verdict already there, which must stay as it is
    capsys.readouterr()
    before = _state(db)
    filled = [a.format(own=own, other=other) for a in args]
    assert _exit_code(["verdict", "--db", db, *filled]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert _state(db) == before


def _exit_code(argv):
    """main()'s exit code, argparse's own exits (a bad choice, a bad int) included."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_verdict_on_a_missing_store_exits_2_and_creates_nothing(tmp_path, capsys):
    db = tmp_path / "none.db"
    assert main(["verdict", "--db", str(db), "--run", "r", "--incident", "1", "real"]) == 2
    assert "no such store" in capsys.readouterr().err
    assert not db.exists()


def test_a_run_never_analysed_gets_a_hint_on_stderr(tmp_path, db_path, capsys):
    db = _imported(tmp_path, db_path, "spiky", analyze=False)
    capsys.readouterr()
    assert main(["incidents", "--db", db, "--run", "spiky"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "run 'spiky': no open incidents"
    assert captured.err.count("\n") == 1 and "runwatch analyze" in captured.err


def test_incidents_of_an_unknown_run_exit_2_naming_the_runs(spiky, capsys):
    assert main(["incidents", "--db", spiky, "--run", "nope"]) == 2
    assert "no run named 'nope' (runs in it: spiky)" in capsys.readouterr().err


def test_the_command_line_prints_json_lines_in_a_real_process(spiky):
    argv = ["incidents", "--db", spiky, "--run", "spiky", "--format", "json", "--status", "all"]
    out = subprocess.run(
        [sys.executable, "-m", "runwatch.cli", *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["severity"] for r in rows] == ["critical", "info"] and out.stderr == ""
    help_text = subprocess.run(
        [sys.executable, "-m", "runwatch.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "incidents" in help_text and "verdict" in help_text


def test_live_incidents_are_listed_by_default_and_source_picks_one(db_path, capsys):
    rng = np.random.default_rng(3)
    with runwatch.init(name="live", store=str(db_path)) as run:  # live detection on
        for step in range(1, 1501):
            loss = 2.0 + 6.0 * (step + 10.0) ** -0.35 + rng.normal(0, 0.004)
            run.log({"loss": float("nan") if step == 1200 else loss}, step=step)
    db = str(db_path)
    live = _json(capsys, db, "live")
    assert live and {row["source"] for row in live} == {"live"}
    assert any(m["what"] == "nonfinite" for row in live for m in row["members"])
    assert _json(capsys, db, "live", "--source", "live") == live
    argv = ["incidents", "--db", db, "--run", "live", "--source", "replay", "--format", "json"]
    assert main(argv) == 0
    # None replayed yet, but anomalies are stored: no hint to analyse.
    assert capsys.readouterr() == ("", "")
