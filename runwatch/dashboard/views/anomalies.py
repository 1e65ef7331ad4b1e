"""Anomalies: the triage inbox. Everything nobody has judged yet comes first; one anomaly
opens with every signal of its run aligned around it, the observed value against the
expected one, and the verdict buttons. A verdict is stored for everyone and the anomaly
recedes to the acknowledged list."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from runwatch.dashboard import data, shaping, ui
from runwatch.dashboard.charts import anomaly_marks, run_figure
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

db = ui.store_path()
st.title("Anomalies")
ui.open_or_stop(db)
with ui.guarded(db):
    everything = data.anomalies(db)
if everything.empty:
    st.success("No anomalies in this store. Nothing to triage.", icon="✅")
    st.stop()

with st.container(horizontal=True):
    runs = st.multiselect(
        "Run", sorted(everything["run"].unique()), key="f_run", placeholder="all runs"
    )
    severities = st.multiselect("Severity", SEVERITIES, key="f_sev", placeholder="all")
    detectors = st.multiselect(
        "Detector", sorted(everything["detector"].unique()), key="f_det", placeholder="all"
    )
    states = st.multiselect("State", STATES, key="f_state", placeholder="all")


def _filtered(frame: pd.DataFrame) -> pd.DataFrame:
    for column, chosen in (
        ("run", runs),
        ("severity", severities),
        ("detector", detectors),
        ("state", states),
    ):
        if chosen:
            frame = frame[frame[column].isin(chosen)]
    # Inbox order: unjudged first, worst first, newest first.
    key = (frame["state"] != "needs verdict").astype(int) * 10 - frame["severity"].map(
        severity_rank
    )
    return (
        frame.assign(_k=key, _s=-frame["start_step"])
        .sort_values(["_k", "_s"])
        .drop(columns=["_k", "_s"])
    )


@st.fragment(run_every=ui.run_every())
def inbox() -> None:
    with ui.guarded(db):
        shown = _filtered(data.anomalies(db))
    todo = shown[shown["state"] == "needs verdict"]
    done = shown[shown["state"] != "needs verdict"]
    st.subheader(f"Inbox · {len(todo)} to judge")
    if todo.empty:
        st.caption("Nothing waiting for a verdict with these filters.")
    else:
        st.dataframe(
            todo[COLUMNS], hide_index=True, width="stretch", height=min(320, 38 + 35 * len(todo))
        )
    with st.expander(f"Acknowledged · {len(done)}", expanded=False):
        st.dataframe(done[COLUMNS], hide_index=True, width="stretch")
    ui.updated_caption()


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


inbox()
st.divider()
shown = _filtered(everything)
if shown.empty:
    st.info("No anomaly matches these filters.")
    st.stop()
ids = shown["id"].tolist()
wanted = st.session_state.get("anomaly_id")
labels = {int(r["id"]): _label(r) for _, r in shown.iterrows()}
picked = st.selectbox(
    "Open anomaly", ids, index=ids.index(wanted) if wanted in ids else 0, format_func=labels.get
)
st.session_state["anomaly_id"] = picked
context(shown[shown["id"] == picked].iloc[0])
