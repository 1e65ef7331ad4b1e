"""The incident inbox's pure rules and its small chart, on plain frames (no Streamlit)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from runwatch.dashboard import inbox
from runwatch.dashboard.charts import anomaly_marks, run_figure
from runwatch.dashboard.charts_incident import incident_figure


def _incidents(rows: list[tuple]) -> pd.DataFrame:
    """(id, status, severity, first_step, last_step, run) rows as the store gives them."""
    frame = pd.DataFrame(
        rows, columns=["id", "status", "severity", "first_step", "last_step", "run"]
    )
    return frame.assign(
        title=[f"incident {i}" for i in frame["id"]],
        count=2,
        hypotheses=[[] for _ in range(len(frame))],
        details=[{} for _ in range(len(frame))],
        is_active=False,
    )


INBOX = _incidents(
    [
        (1, "benign", "critical", 10, 900, "a"),
        (2, "open", "info", 50, 950, "a"),
        (3, "open", "warning", 20, 100, "a"),
        (4, "open", "critical", 30, 200, "b"),
        (5, "open", "warning", 40, 400, "b"),
        (6, "real", "warning", 60, 990, "a"),
        (7, "open", "critical", 5, 200, "a"),
        (8, "watch", "info", 70, 999, "b"),
    ]
)


def test_inbox_puts_open_incidents_first_by_severity_then_latest_step_judged_below() -> None:
    order = inbox.importance_order(INBOX)["id"].tolist()
    # Open: critical (ties on last step 200: the newer id first), warning by recency, info.
    # Judged: critical, warning, info.
    assert order == [7, 4, 5, 3, 2, 1, 6, 8]


def test_an_incident_opened_from_the_run_page_goes_to_the_top_of_its_group() -> None:
    assert inbox.importance_order(INBOX, first=2)["id"].tolist()[:3] == [2, 7, 4]
    assert inbox.importance_order(INBOX, first=8)["id"].tolist()[5:] == [8, 1, 6]


def test_filters_keep_every_open_incident_and_only_the_chosen_judged_ones() -> None:
    shown = inbox.filter_incidents(INBOX, judged=("real",))
    assert sorted(shown["id"]) == [2, 3, 4, 5, 6, 7]
    assert sorted(inbox.filter_incidents(INBOX, judged=())["id"]) == [2, 3, 4, 5, 7]
    narrowed = inbox.filter_incidents(INBOX, runs=["b"], severities=["warning", "info"])
    assert sorted(narrowed["id"]) == [5, 8]
    assert inbox.open_count(INBOX) == 5


def test_hypotheses_read_best_first_with_score_evidence_and_summary() -> None:
    inc = {
        "hypotheses": [
            {"cause": "shard=s17", "score": 3.21, "evidence": "9 of 9 crashes in s17"},
            {"cause": "host=node-2", "score": 0.4, "evidence": "3 of 9 on node-2"},
        ],
        "details": {"summary": "likely shard=s17: 9 of 9 crashes in s17"},
    }
    lines = inbox.hypothesis_lines(inc)
    assert lines[0] == "**shard=s17** (score 3.2): 9 of 9 crashes in s17"
    assert lines[1].startswith("**host=node-2** (score 0.4)")
    assert lines[2] == "*likely shard=s17\\: 9 of 9 crashes in s17*"


def _members(n: int) -> pd.DataFrame:
    """``n`` loss spikes every 100 steps, then a crash event."""
    steps = [100 * (i + 1) for i in range(n)]
    return pd.DataFrame(
        {
            "kind": ["anomaly"] * n + ["event"],
            "member_id": list(range(1, n + 2)),
            "what": ["spike"] * n + ["crash"],
            "metric": ["loss"] * n + [None],
            "step": [*steps, steps[-1] + 50],
            "end_step": [*steps, steps[-1] + 50],
            "severity": ["warning"] * n + [None],
            "message": [f"spike {i}" for i in range(n)] + ["rank 3 exited"],
            "rank": [None] * n + [3],
            "host": [None] * n + ["node-1"],
        }
    )


def test_members_list_the_first_twenty_with_event_severity_from_its_kind() -> None:
    members = _members(30)
    rows = inbox.member_rows(members, 20)
    assert len(rows) == 20 and rows["step"].tolist()[:2] == ["100", "200"]
    assert rows["severity"].iloc[0] == ":orange-badge[warning]"
    crash = inbox.member_rows(_members(2), 20).iloc[-1]
    assert crash["severity"] == ":red-badge[critical]"
    assert crash["metric"] == "rank 3 node-1"


def test_small_chart_marks_every_member_on_the_curve_or_pinned_at_the_top() -> None:
    members = _members(3)
    metric = inbox.main_metric(members, "fallback")
    assert metric == "loss"
    assert inbox.chart_window(members["step"].min(), members["step"].max()) == (40, 410)
    steps = np.arange(40, 411)
    values = np.full(steps.size, 2.0)
    values[[60, 160, 260]] = 8.0  # the three spikes, at steps 100, 200, 300
    series = pd.DataFrame({"step": steps, "value": values, "superseded": False})
    fig = incident_figure(series, inbox.member_marks(members, metric), metric)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"loss", "warning member", "critical member (not on this curve)"}
    spikes = by_name["warning member"]
    assert list(spikes.x) == [100, 200, 300] and list(spikes.y) == [8.0, 8.0, 8.0]
    crash = by_name["critical member (not on this curve)"]  # an event: pinned at the top
    assert list(crash.x) == [350] and list(crash.y) == [8.0]
    assert "crash: rank 3 exited" in crash.hovertext[0]
    assert crash.marker.symbol == "x-open" and spikes.marker.symbol == "diamond"


def _anomalies() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": [11, 12, 13, 14, 15],
            "metric": ["loss"] * 5,
            "start_step": [100, 200, 300, 400, 500],
            "end_step": [100, 200, 300, 400, 500],
            "severity": ["info", "warning", "info", "info", "warning"],
            "observed": [3.0] * 5,
            "message": [f"spike {i}" for i in range(5)],
            "state": ["needs verdict"] * 5,
            "detector": ["spike"] * 5,
        }
    )


def _membership(anomalies: list[tuple[int, int]], events: tuple = ()) -> pd.DataFrame:
    """(incident, anomaly id) pairs and (incident, event id, step, kind) events, as
    ``data.incident_membership`` gives them."""
    rows = [(i, "anomaly", a, None, "spike", "") for i, a in anomalies]
    rows += [(i, "event", e, step, kind, "rank 3 exited") for i, e, step, kind in events]
    return pd.DataFrame(
        rows, columns=["incident_id", "kind", "member_id", "step", "what", "message"]
    )


def test_run_chart_draws_warning_incidents_by_member_and_hides_info_ones() -> None:
    incidents = _incidents(
        [(1, "benign", "warning", 100, 300, "a"), (2, "open", "info", 400, 400, "a")]
    )
    membership = _membership([(1, 11), (1, 12), (1, 13), (2, 14)])
    marks, hidden = inbox.incident_anomalies(_anomalies(), incidents, membership)
    # Incident 1's three members (info ones included) as the incident; 15 is in no incident
    # yet and a warning: drawn as itself. Incident 2 (info) is not drawn.
    assert marks["id"].tolist() == [11, 12, 13, 15] and hidden == 1
    assert marks["severity"].tolist() == ["warning"] * 4
    assert marks["state"].tolist()[:3] == ["benign"] * 3  # judged: the marks fade
    assert marks["incident"].tolist()[:3] == [1, 1, 1] and pd.isna(marks["incident"].iloc[3])
    everything, hidden = inbox.incident_anomalies(
        _anomalies(), incidents, membership, show_info=True
    )
    assert everything["id"].tolist() == [11, 12, 13, 14, 15] and hidden == 0
    fig = run_figure(
        [("loss", pd.DataFrame({"x": np.arange(600), "value": np.ones(600)}))],
        anomalies=anomaly_marks(marks, lambda s: s),
    )
    clickable = [t for t in fig.data if t.customdata is not None]
    assert [list(t.customdata[0]) for t in clickable] == [[11, 1], [12, 1], [13, 1], [15]]
    assert {t.name for t in clickable} == {"warning incident", "warning anomaly"}


def test_incident_rows_list_open_first_with_badges_and_steps() -> None:
    rows = inbox.incident_rows(INBOX, 3)
    assert rows["#"].tolist() == [7, 4, 5]
    assert rows["status"].iloc[0] == ":gray-badge[open]"
    assert rows["steps"].tolist() == ["5–200", "30–200", "40–400"]


@pytest.mark.parametrize("bad", [None, float("nan")])
def test_an_incident_without_steps_has_no_chart_window(bad) -> None:
    assert inbox.chart_window(bad, bad) is None
    assert inbox.steps_text(bad, bad) == ""


def test_small_chart_opens_past_the_initial_fall_with_every_member_in_view() -> None:
    """A spike pattern from step 100 on, over a loss that falls from ~10 to ~3 first: the
    y-range leaves the fall out, keeps the spikes, and pins the crash inside it."""
    steps = np.arange(1, 2001)
    values = 3.0 + 7.0 * np.exp(-steps / 20.0) + 0.01 * np.sin(steps)
    values[[499, 999, 1499]] *= 1.3  # spikes at steps 500, 1000, 1500
    series = pd.DataFrame({"step": steps, "value": values, "superseded": False})
    members = _members(3).assign(step=[500, 1000, 1500, 1700], end_step=[500, 1000, 1500, 1700])
    fig = incident_figure(series, inbox.member_marks(members, "loss"), "loss")
    low, high = fig.layout.yaxis.range
    assert fig.layout.yaxis.autorange is False
    assert high < values.max() and low < 3.0  # the fall is above the top edge
    by_name = {t.name: t for t in fig.data}
    spikes = by_name["warning member"]
    assert list(spikes.x) == [500, 1000, 1500]
    assert all(low < v < high for v in spikes.y) and min(spikes.y) > 3.8
    (pinned,) = by_name["critical member (not on this curve)"].y
    assert low < pinned < high


def test_a_member_sits_on_its_observed_value_on_a_downsampled_curve() -> None:
    """Downsampled, a spike at step 21 is its bucket's max, kept at step 22, while step 20
    is nearer: the mark sits on the spike (what the detector saw), not beside it."""
    steps = np.arange(0, 100, 2)
    values = np.full(steps.size, 2.0)
    values[11] = 9.0  # step 22
    series = pd.DataFrame({"step": steps, "value": values})
    members = _members(1).iloc[:1].assign(step=[21], end_step=[21], observed=[9.0])
    (spike,) = [
        t
        for t in incident_figure(series, inbox.member_marks(members, "loss"), "loss").data
        if t.name == "warning member"
    ]
    assert list(spike.y) == [9.0]
    blind = inbox.member_marks(members.drop(columns="observed"), "loss")
    (spike,) = [
        t for t in incident_figure(series, blind, "loss").data if t.name == "warning member"
    ]
    assert list(spike.y) == [2.0]  # no observed value: the nearest point
    off_scale = inbox.member_marks(members.assign(observed=[0.3]), "loss")  # a grad norm
    (spike,) = [
        t for t in incident_figure(series, off_scale, "loss").data if t.name == "warning member"
    ]
    assert list(spike.y) == [2.0]


def test_runs_table_counts_open_incidents_and_judges_health_by_them() -> None:
    from runwatch.dashboard.shaping import runs_summary

    runs = pd.DataFrame(
        {
            "name": ["a", "old"],
            "status": ["finished", "finished"],
            "last_step": [1000, 500],
            "last_time": [100.0, None],
            "attempts": [1, 1],
        }
    )
    anomalies = pd.DataFrame(
        {
            "run": ["a"] * 3 + ["old"],
            "severity": ["critical", "critical", "warning", "warning"],
            "verdict": [None, None, None, None],
        }
    )
    incidents = _incidents(
        [(1, "benign", "critical", 10, 20, "a"), (2, "open", "info", 30, 40, "a")]
    ).assign(verdict=["benign", None])
    table = runs_summary(runs, anomalies, {}, {}, 200.0, incidents).set_index("run")
    # Run a: the critical pattern was judged benign; one info incident waits.
    assert table.loc["a", "open"] == 1 and table.loc["a", "health"] == "healthy"
    # A run without incidents (stored before them) is judged by its anomalies.
    assert table.loc["old", "open"] == 1 and table.loc["old", "health"] == "warning"
    assert table.loc["old", "age"] == "-"  # no time logged: no "- ago"


def test_a_crash_only_incident_is_marked_on_the_top_panel_and_opens_on_click() -> None:
    incidents = _incidents(
        [(3, "open", "critical", 288, 288, "a"), (4, "open", "info", 300, 300, "a")]
    )
    membership = _membership([], events=[(3, 40, 288, "crash"), (4, 41, 300, "log")])
    no_anomalies = _anomalies().iloc[:0]
    marks, hidden = inbox.incident_anomalies(
        no_anomalies, incidents, membership, event_metric="loss"
    )
    assert hidden == 1  # the info one
    (crash,) = marks.to_dict("records")
    assert (crash["id"], crash["metric"], crash["start_step"], crash["incident"]) == (
        -40,
        "loss",
        288,
        3,
    )
    assert crash["message"] == "incident #3: incident 3 (crash: rank 3 exited)"
    fig = run_figure(
        [("loss", pd.DataFrame({"x": np.arange(400), "value": np.linspace(4, 3, 400)}))],
        anomalies=anomaly_marks(marks, lambda s: s),
    )
    (marker,) = [t for t in fig.data if t.customdata is not None]
    assert list(marker.customdata[0]) == [-40, 3] and marker.name == "critical incident"
    assert list(marker.x) == [288] and marker.hovertext[0].startswith("incident #3:")
    # Without a panel for events, only anomalies are marked.
    assert inbox.incident_anomalies(no_anomalies, incidents, membership)[0].empty
