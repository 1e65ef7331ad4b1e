"""The incident tables: matched by key or members, verdicts kept, benign reopened by worse."""

from __future__ import annotations

import pytest

from runwatch.model import Anomaly, Incident
from runwatch.store.sqlite import Store


def _anomalies(store: Store, run_id: int, n: int) -> list[int]:
    ids: dict[int, int] = {}
    eps = [
        Anomaly("spike", "loss", 10 * i, 10 * i, "info", 1.0, 2.0, f"spike {i}", is_open=False)
        for i in range(n)
    ]
    store.save_anomalies(run_id, "replay", eps, ids)
    return [ids[id(a)] for a in eps]


def _incident(key: str, members: list[int], severity: str = "info") -> Incident:
    return Incident(
        key=key,
        title=f"{len(members)} loss spikes",
        severity=severity,
        first_step=0,
        last_step=10 * len(members),
        count=len(members),
        members=[("anomaly", m) for m in members],
    )


@pytest.fixture
def store(store_url):
    with Store(store_url) as s:
        yield s


def test_an_incident_keeps_its_id_and_verdict_as_it_grows(store):
    run_id, _ = store.start_run("r")
    ids = _anomalies(store, run_id, 5)
    first = store.save_incidents(run_id, "replay", [_incident("k", ids[:3])])
    assert len(first) == 1
    store.add_verdict("benign", incident_id=first[0], note="known data artifact", author="ana")
    again = store.save_incidents(run_id, "replay", [_incident("k", ids)])
    assert again == first  # grown: changed, same row
    row = store.incidents("r").iloc[0]
    assert (row["status"], row["count"], row["verdict_note"]) == (
        "benign",
        5,
        "known data artifact",
    )
    assert list(store.incident_members(first[0])["member_id"]) == ids
    assert store.save_incidents(run_id, "replay", [_incident("k", ids)]) == []  # nothing new


def test_a_worse_member_reopens_a_benign_incident(store):
    run_id, _ = store.start_run("r")
    ids = _anomalies(store, run_id, 3)
    (iid,) = store.save_incidents(run_id, "replay", [_incident("k", ids[:2])])
    store.add_verdict("benign", incident_id=iid)
    store.save_incidents(run_id, "replay", [_incident("k", ids, severity="critical")])
    row = store.incidents("r").iloc[0]
    assert row["status"] == "open"
    assert "benign" in row["details"]["reopened"]


def test_a_rekeyed_incident_is_found_by_its_members(store):
    run_id, _ = store.start_run("r")
    ids = _anomalies(store, run_id, 4)
    (iid,) = store.save_incidents(run_id, "replay", [_incident("late", ids[2:])])
    store.add_verdict("real", incident_id=iid, note="bad shard")
    # An earlier member joined: the key (from the first member) changed, the row did not.
    assert store.save_incidents(run_id, "replay", [_incident("early", ids)]) == [iid]
    frame = store.incidents("r")
    assert list(frame["id"]) == [iid] and frame.iloc[0]["status"] == "real"


def test_a_merged_incident_hands_its_verdict_on(store):
    run_id, _ = store.start_run("r")
    ids = _anomalies(store, run_id, 4)
    a, b = store.save_incidents(
        run_id, "replay", [_incident("a", ids[:2]), _incident("b", ids[2:])]
    )
    store.add_verdict("watch", incident_id=b, note="keep an eye")
    store.save_incidents(run_id, "replay", [_incident("a", ids)])
    assert list(store.incidents("r")["id"]) == [a]
    verdicts = store.verdicts()
    assert list(verdicts["incident_id"]) == [a]


def test_live_incidents_are_preferred_and_statuses_checked(store):
    run_id, _ = store.start_run("r")
    ids = _anomalies(store, run_id, 2)
    store.save_incidents(run_id, "replay", [_incident("k", ids)])
    assert list(store.incidents("r")["source"]) == ["replay"]
    store.save_incidents(run_id, "live", [_incident("k", ids)])
    assert list(store.incidents("r")["source"]) == ["live"]
    with pytest.raises(ValueError, match="unknown incident status 'closed'"):
        store.incidents("r", status="closed")
    with pytest.raises(KeyError, match="no incident with id 999"):
        store.add_verdict("benign", incident_id=999)


def test_a_verdict_survives_a_re_analysis(store):
    run_id, _ = store.start_run("r")
    (iid,) = store.save_incidents(run_id, "replay", [_incident("k", _anomalies(store, run_id, 3))])
    store.add_verdict("benign", incident_id=iid, note="warm-up noise")
    # analyze again: the replay anomalies are replaced (new row ids), the incident re-formed
    ids: dict[int, int] = {}
    again = [
        Anomaly("spike", "loss", 10 * i, 10 * i, "info", 1.0, 2.0, "s", is_open=False)
        for i in range(3)
    ]
    store.save_anomalies(run_id, "replay", again, ids, replace=True)
    store.save_incidents(run_id, "replay", [_incident("k", [ids[id(a)] for a in again])])
    row = store.incidents("r").iloc[0]
    assert (row["id"], row["status"], row["verdict_note"]) == (iid, "benign", "warm-up noise")
    assert sorted(store.incident_members(iid)["member_id"]) == sorted(ids.values())
