"""The generated multi-restart run (bench/scenarios/multi_restart.py): crashes whose causes are
known, imported with ``runwatch import`` and analyzed with ``runwatch analyze``.

Each cause must be one incident with the cause ranked first: shard=s17 for the data bug,
host=n2 for the failing GPU, the pair of hosts n1+n3 for the flaky link between them; and
there must be as many crash incidents as crash signatures (one per cause).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from runwatch.cli import main
from runwatch.store import open_store

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "bench" / "scenarios" / "multi_restart.py"
CRASH_KINDS = ("crash", "oom", "nccl_timeout", "hang", "xid")


def _generate(tmp: Path, *extra: str) -> tuple[Path, dict[str, Any]]:
    src, truth = tmp / "scenario.jsonl", tmp / "truth.json"
    cmd = [sys.executable, str(GENERATOR), str(src), "--small", "--truth", str(truth), *extra]
    subprocess.run(cmd, check=True, capture_output=True)
    return src, json.loads(truth.read_text())


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> dict[str, Any]:
    """The small scenario, imported and analyzed; its incidents with their members."""
    tmp = tmp_path_factory.mktemp("scenario")
    src, truth = _generate(tmp)
    db = tmp / "runwatch.db"
    assert main(["import", str(src), "--db", str(db)]) == 0
    assert main(["analyze", "--db", str(db), "--run", truth["run"]]) in (0, 1)
    with open_store(db, readonly=True) as store:
        incidents = store.incidents(truth["run"], source="replay")
        members = {int(i): store.incident_members(int(i)) for i in incidents["id"]}
        attempts = store.attempts(truth["run"])
        events = store.events(truth["run"], kinds=list(CRASH_KINDS))
        exposure = store.context_exposure(truth["run"])
    return {
        "truth": truth,
        "incidents": incidents,
        "members": members,
        "attempts": attempts,
        "events": events,
        "exposure": exposure,
    }


def _crash_incidents(sc: dict[str, Any]) -> list[int]:
    return [
        i
        for i, m in sc["members"].items()
        if ((m["kind"] == "event") & m["what"].isin(CRASH_KINDS)).any()
    ]


def _holding(sc: dict[str, Any], cause: str) -> list[int]:
    """The incidents holding any crash event of ``cause`` (matched by its crash steps)."""
    steps = {c["step"] for c in sc["truth"]["causes"][cause]["crashes"]}
    out = []
    for i in _crash_incidents(sc):
        m = sc["members"][i]
        events = m[(m["kind"] == "event") & m["what"].isin(CRASH_KINDS)]
        if events["step"].isin(steps).any():
            out.append(i)
    return out


def _top(sc: dict[str, Any], incident: int, n: int) -> list[str]:
    frame: pd.DataFrame = sc["incidents"]
    hyps = frame.loc[frame["id"] == incident, "hypotheses"].iloc[0]
    return [h["cause"] for h in hyps[:n]] if isinstance(hyps, list) else []


def _assert_one_incident_led_by(sc: dict[str, Any], cause: str) -> None:
    want = sc["truth"]["causes"][cause]["expected_top"]
    holding = _holding(sc, cause)
    tops = {i: _top(sc, i, len(want)) for i in holding}
    assert len(holding) == 1, f"{cause}: its crashes are in {len(holding)} incidents: {tops}"
    assert sorted(tops[holding[0]]) == sorted(want), f"{cause}: top {tops}, want {want}"


def test_the_import_keeps_every_restart_crash_and_shard(scenario):
    truth = scenario["truth"]
    assert len(scenario["attempts"]) == truth["attempts"]
    crashes = sum(len(c["crashes"]) for c in truth["causes"].values())
    events = scenario["events"]
    # One crash or Xid per crash, plus the watchdog timeouts of the 15 peers of each Xid.
    assert (events["kind"].isin(["crash", "xid"])).sum() == crashes
    xids = len(truth["causes"]["failing_host"]["crashes"])
    assert (events["kind"] == "nccl_timeout").sum() == 15 * xids
    shards = scenario["exposure"]["shard"]
    assert len(shards) == 40
    assert shards["s17"] / sum(shards.values()) == pytest.approx(1 / 40)


def test_data_bug_crashes_are_one_incident_led_by_the_bad_shard(scenario):
    _assert_one_incident_led_by(scenario, "data_bug")
    (incident,) = _holding(scenario, "data_bug")
    frame = scenario["incidents"]
    row = frame.loc[frame["id"] == incident].iloc[0]
    assert row["details"]["summary"].startswith("likely shard=s17: ")
    # The bad records land on whichever rank reads them: the hosts are no cause.
    assert re.search(
        r"spread over (\d of )?4 hosts, so not a host", row["hypotheses"][0]["evidence"]
    )


def test_failing_host_crashes_are_one_incident_led_by_the_host(scenario):
    _assert_one_incident_led_by(scenario, "failing_host")


def test_flaky_link_crashes_are_one_incident_led_by_its_two_hosts(scenario):
    _assert_one_incident_led_by(scenario, "flaky_link")


def test_crash_incidents_equal_crash_signatures(scenario):
    titles = scenario["incidents"].set_index("id").loc[_crash_incidents(scenario), "title"]
    assert len(titles) == len(scenario["truth"]["causes"]), list(titles)


def test_run_wide_context_rows_follow_the_restarts(tmp_path):
    src, truth = _generate(tmp_path, "--context-rank", "none")
    db = tmp_path / "runwatch.db"
    assert main(["import", str(src), "--db", str(db)]) == 0
    with open_store(db, readonly=True) as store:
        shards = store.context_exposure(truth["run"])["shard"]
    assert len(shards) == 40, shards
