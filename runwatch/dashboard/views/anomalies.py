"""Anomalies: the incident inbox. Open incidents come first, the worst and latest on top;
each shows its title, its candidate causes with their evidence, a small chart of its members
on the metric they hit, its members, and benign / real / watch buttons. A verdict is stored
for everyone: a benign incident folds its later members in quietly, a real one keeps
alerting. Every anomaly stays listed, one by one, under the inbox."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from runwatch.dashboard import data, inbox, shaping, ui
from runwatch.dashboard.charts import anomaly_marks, run_figure
from runwatch.dashboard.charts_incident import incident_figure
from runwatch.model import SEVERITIES, severity_rank

STATES = ("needs verdict", "watch", "real", "benign")
COLUMNS = [
    "id",
    "run",
    "severity",
    "detector",
    "metric",
    "start_step",
    "end_step",
    "state",
    "message",
]
# Steps of context on each side of an episode, at least: enough to see what came before.
CONTEXT_MIN = 60
# Incident cards drawn at first, per list (open, judged); "show more" adds as many again.
CARDS = 8
# Members listed per incident (the count says how many there are in all).
MEMBERS_SHOWN = 20
# Points of the small chart's curve: a thumbnail, not the Run page.
SMALL_POINTS = 800

db = ui.store_path()
st.title("Anomalies")
ui.open_or_stop(db)
with ui.guarded(db):
    everything = data.anomalies(db)
    incidents = data.incidents(db)
    statuses = data.runs(db).set_index("name")["status"]
if everything.empty and incidents.empty:
    st.success("No anomalies in this store. Nothing to triage.", icon="✅")
    st.stop()

with st.container(horizontal=True):
    names = (
        set(everything["run"]) | set(incidents["run"]) if len(incidents) else set(everything["run"])
    )
    runs = st.multiselect("Run", sorted(names), key="f_run", placeholder="all runs")
    severities = st.multiselect("Severity", SEVERITIES, key="f_sev", placeholder="all")
    judged = st.pills(
        "Judged incidents shown",
        inbox.JUDGED,
        selection_mode="multi",
        default=list(inbox.JUDGED),
        key="f_judged",
    )
# Only a store with a run being written has anything new to show on a tick.
live_every = ui.run_every() if (statuses == "running").any() else None


def verdict_form(inc: pd.Series) -> None:
    """The note and the three verdict buttons of one incident."""
    iid = int(inc["id"])
    note = st.text_input(
        "Note",
        key=f"inote-{iid}",
        placeholder="why: e.g. known bad shard; for real, the root cause",
    )
    cols = st.columns(3)
    for col, verdict in zip(cols, inbox.JUDGED, strict=True):
        current = inc["status"] == verdict
        if col.button(
            verdict.capitalize(),
            key=f"{verdict}-i{iid}",
            type="primary" if current else "secondary",
            width="stretch",
            help=f"Mark incident #{iid} {verdict}",
        ):
            data.save_incident_verdict(db, iid, verdict, note, ui.author())
            st.toast(f"incident #{iid} marked {verdict}", icon="✅")
            st.rerun()


def card(inc: pd.Series, *, chart: bool) -> None:
    """One incident: what it is, why it may be, its members, and the verdict form."""
    iid = int(inc["id"])
    with ui.guarded(db):
        members = data.incident_members(db, iid)
    with st.container(border=True, key=f"incident-{iid}"):
        st.markdown(inbox.headline(inc))
        st.caption(inbox.facts(inc))
        left, right = st.columns([1.15, 1]) if chart else (st.container(), None)
        with left:
            for line in inbox.hypothesis_lines(inc):
                (st.caption if line == inbox.NO_HYPOTHESES else st.markdown)(line)
            details = inc["details"] or {}
            if inc["status"] == "open" and details.get("reopened"):
                st.warning(f"Open again: {details['reopened']}.", icon="↩️")
            if inc["status"] != "open":
                who = inc["verdict_author"] or "someone"
                st.caption(f"{inc['status']} by {who}: {inc['verdict_note'] or '(no note)'}")
            verdict_form(inc)
        if right is not None:
            with right:
                small_chart(inc, members)
        shown = min(MEMBERS_SHOWN, len(members))
        with st.expander(f"Members · the first {shown} of {int(inc['count']):,}"):
            if members.empty:
                st.caption("No members stored (yet).")
            else:
                st.markdown(
                    shaping.markdown_table(
                        inbox.member_rows(members, MEMBERS_SHOWN), raw=("severity",)
                    )
                )


def small_chart(inc: pd.Series, members: pd.DataFrame) -> None:
    run = inc["run"]
    with ui.guarded(db):
        logged = data.metrics(db, run)
        loss = shaping.metrics_by_role(logged).get("loss")
        metric = inbox.main_metric(members, loss, logged)
        window = inbox.chart_window(inc["first_step"], inc["last_step"])
        if metric is None or window is None:
            st.caption("Nothing to draw: no metric or no step.")
            return
        series = data.series_view(db, run, metric, window[0], window[1], 0.0, SMALL_POINTS)
    fig = incident_figure(series, inbox.member_marks(members, metric), metric)
    st.plotly_chart(
        fig,
        key=f"incident-chart-{int(inc['id'])}",
        width="stretch",
        config={"displayModeBar": False},
    )


def listing(frame: pd.DataFrame, *, kind: str, chart: bool) -> None:
    """Cards for the first ``CARDS`` (more on request) of an ordered list of incidents."""
    key = f"cards-{kind}"
    limit = st.session_state.get(key, CARDS)
    for _, inc in frame.head(limit).iterrows():
        card(inc, chart=chart)
    if len(frame) > limit:
        more = min(CARDS, len(frame) - limit)
        if st.button(f"Show {more} more of {len(frame) - limit:,}", key=f"more-{kind}"):
            st.session_state[key] = limit + CARDS
            st.rerun()


@st.fragment(run_every=live_every)
def incident_inbox() -> None:
    with ui.guarded(db):
        current = data.incidents(db)
    shown = inbox.importance_order(
        inbox.filter_incidents(current, runs, severities, judged or ()),
        first=st.session_state.get("incident_id"),
    )
    todo = shown[shown["status"] == "open"] if len(shown) else shown
    done = shown[shown["status"] != "open"] if len(shown) else shown
    st.subheader(f"Inbox · {len(todo)} open incident{'s' if len(todo) != 1 else ''}")
    if current.empty:
        st.caption(
            "No incidents formed yet: live detection forms them as it runs, and "
            "`runwatch analyze` on a stored run. The anomalies are listed below."
        )
    elif todo.empty:
        st.caption("Nothing waiting for a verdict with these filters.")
    listing(todo, kind="open", chart=True)
    if len(done):
        st.subheader(f"Judged · {len(done)}")
        listing(done, kind="judged", chart=False)
    ui.updated_caption()


def _filtered(frame: pd.DataFrame, detectors: list[str], states: list[str]) -> pd.DataFrame:
    for column, chosen in (
        ("run", runs),
        ("severity", severities),
        ("detector", detectors),
        ("state", states),
    ):
        if chosen:
            frame = frame[frame[column].isin(chosen)]
    if frame.empty:
        return frame
    # Unjudged first, worst first, newest first.
    key = (frame["state"] != "needs verdict").astype(int) * 10 - frame["severity"].map(
        severity_rank
    )
    return (
        frame.assign(_k=key, _s=-frame["start_step"])
        .sort_values(["_k", "_s"])
        .drop(columns=["_k", "_s"])
    )


def _label(row: pd.Series) -> str:
    mark = "●" if row["state"] == "needs verdict" else "○"
    return (
        f"{mark} #{row['id']} · {row['severity']} · {row['detector']} on {row['metric']} "
        f"· {row['run']} @ {row['start_step']} · {row['state']}"
    )


def _number(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.4g}" if isinstance(value, (int, float)) else str(value)


def _ordered(metrics: list[str], first: str) -> list[str]:
    """The anomaly's own metric on top, then the usual roles, then the rest."""
    roles = shaping.metrics_by_role(metrics)
    usual = [roles[r] for r in ("loss", "grad_norm", "lr", "throughput", "step_time") if r in roles]
    rest = [m for m in metrics if m not in usual]
    return [first] + [m for m in usual + rest if m != first]


def context(a: pd.Series) -> None:
    """The anomaly with its numbers, the verdict form, and every signal around it."""
    pad = max(CONTEXT_MIN, 3 * (int(a["end_step"]) - int(a["start_step"])))
    start, end = max(0, int(a["start_step"]) - pad), int(a["end_step"]) + pad
    with ui.guarded(db):
        metrics = _ordered(data.metrics(db, a["run"]), a["metric"])
        frames = {m: data.series_view(db, a["run"], m, start, end, 0.0) for m in metrics}
        nearby = data.anomalies(db, a["run"])
        history = data.verdicts(db, int(a["id"]))
    nearby = nearby[(nearby["end_step"] >= start) & (nearby["start_step"] <= end)]
    left, right = st.columns([1, 2.4])
    with left, st.container(border=True):
        st.markdown(f"#### {a['severity'].upper()} · {a['detector']}")
        st.markdown(f"`{a['metric']}` in **{a['run']}**, steps {a['start_step']}–{a['end_step']}")
        st.write(a["message"])
        c = st.columns(2)
        observed = _number(a["observed"])
        if observed == "–" and a["detector"] == "nonfinite":
            observed = "NaN/inf"
        c[0].metric("Observed", observed)
        c[1].metric("Expected", _number(a["expected"]))
        c = st.columns(2)
        band = (
            f"{_number(a['lower'])} – {_number(a['upper'])}" if pd.notna(a["lower"]) else "no band"
        )
        c[0].metric("Band", band)
        c[1].metric("Score", _number(a["score"]))
        st.caption(f"source: {a['source']} · {'open' if a['is_open'] else 'closed'} episode")
        note = st.text_input(
            "Note", key=f"note-{a['id']}", placeholder="why: e.g. bad batch, known data shard"
        )
        b = st.columns(3)
        for col, verdict, kind in zip(
            b, ("benign", "real", "watch"), ("secondary", "primary", "secondary"), strict=True
        ):
            if col.button(
                verdict.capitalize(), key=f"{verdict}-{a['id']}", type=kind, width="stretch"
            ):
                data.save_verdict(db, int(a["id"]), verdict, note, ui.author())
                st.toast(f"#{a['id']} marked {verdict}", icon="✅")
                st.rerun()
        if len(history):
            st.markdown("**Verdicts**")
            for v in history.itertuples():
                who = v.author or "someone"
                st.caption(f"{v.verdict} by {who}: {v.note or '(no note)'}")
    with right:
        marks = anomaly_marks(nearby, lambda s: s)
        fig = run_figure(
            [(m, shaping.with_x(f, "step", None)) for m, f in frames.items() if len(f)],
            anomalies=marks,
            highlight=(int(a["start_step"]) - 0.5, int(a["end_step"]) + 0.5),
            height=170 * max(1, len(frames)) + 80,
        )
        st.plotly_chart(fig, key=f"context-{a['id']}", width="stretch")
        st.caption(f"Every signal of {a['run']}, steps {start}–{end}; the episode is shaded.")


def anomaly_list() -> None:
    """Every anomaly one by one, as before incidents: nothing an incident holds is hidden."""
    with st.container(horizontal=True):
        detectors = st.multiselect(
            "Detector", sorted(everything["detector"].unique()), key="f_det", placeholder="all"
        )
        states = st.multiselect("State", STATES, key="f_state", placeholder="all")
    shown = _filtered(everything, detectors, states)
    todo = int((shown["state"] == "needs verdict").sum())
    st.caption(
        f"{len(shown):,} anomalies with these filters, {todo:,} with no verdict of their own."
    )
    if shown.empty:
        return
    st.dataframe(
        shown[COLUMNS], hide_index=True, width="stretch", height=min(320, 38 + 35 * len(shown))
    )
    ids = shown["id"].tolist()
    wanted = st.session_state.get("anomaly_id")
    labels = {int(r["id"]): _label(r) for _, r in shown.iterrows()}
    # Nothing opened until asked for (or sent here from the Run page): the context chart
    # draws every signal of the run, a cost the inbox above should not pay.
    picked = st.selectbox(
        "Open anomaly",
        ids,
        index=ids.index(wanted) if wanted in ids else None,
        format_func=labels.get,
        placeholder="pick one to see it with every signal around it",
    )
    if picked is None:
        return
    st.session_state["anomaly_id"] = picked
    context(shown[shown["id"] == picked].iloc[0])


incident_inbox()
st.divider()
if everything.empty:
    st.caption("No anomalies stored.")
    st.stop()
with st.expander(
    f"Every anomaly, one by one · {len(everything):,}",
    expanded=st.session_state.get("anomaly_id") is not None
    and st.session_state.get("incident_id") is None,
):
    anomaly_list()
