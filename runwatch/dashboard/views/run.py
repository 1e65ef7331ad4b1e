"""Run: is this run healthy? The loss against what was expected, its incidents marked on the
curves they hit (each a handful of symptoms with one cause, not a dot per blip), restarts
and their lost work, and the signals that explain a fault (grad norm, LR, throughput, step
time) stacked on the same x-axis."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from runwatch.dashboard import data, inbox, shaping, ui
from runwatch.dashboard.charts import (
    anomaly_marks,
    placeholder_figure,
    run_figure,
    run_figure_height,
)
from runwatch.pipeline import runconfig

PANEL_ROLES = ("loss", "grad_norm", "lr", "throughput", "step_time")
# Rows of the incident, anomaly and event lists under the chart (the Anomalies page has them
# all). A
# comment, not a docstring: Streamlit's "magic" writes a bare string in a page to the page.
LIST_ROWS = 50

db = ui.store_path()
title = st.empty()
ui.open_or_stop(db)
with ui.guarded(db):
    run = ui.pick_run(db)
    runs = data.runs(db).set_index("name")
    info = runs.loc[run]
    config = runconfig.run_config(info["config"])
    metrics = data.metrics(db, run)
    roles = shaping.metrics_by_role(metrics, config)
title.title(run)

loss = roles.get("loss")
# A run that is not being written has nothing new to show: no ticks, no re-reads (on a
# million-step run a re-read costs seconds of server time per tick).
live_every = ui.run_every() if info["status"] == "running" else None
panel_metrics = [roles[r] for r in PANEL_ROLES if r in roles] or metrics[:5]

with st.container(horizontal=True, vertical_alignment="bottom"):
    axis = st.segmented_control("x axis", shaping.X_AXES, default="step", key="x_axis") or "step"
    smoothing = st.slider("Smoothing (EMA)", 0.0, 0.99, 0.6, 0.01, key="smoothing", width=220)
    log_y = st.toggle("log y (loss)", key="log_y")
    log_x = st.toggle("log x", key="log_x")
    show_info = st.toggle(
        "info incidents",
        key="show_info",
        help="Draw info-level incidents too (small blips; the lists below have them all). "
        "Warning and critical incidents are always drawn.",
    )
first_step = 0
last_step = int(info["last_step"]) if pd.notna(info["last_step"]) else 0
window: tuple[int, int] | None = None
if last_step > first_step + 1:
    window = st.slider(
        "Steps shown (narrow it to zoom: finer data is fetched for the window)",
        first_step,
        last_step,
        (first_step, last_step),
        key=f"window-{run}",
    )


def _window() -> tuple[int | None, int | None]:
    """The step window to read; a window reaching the last step follows the live run."""
    if window is None:
        return None, None
    start, end = window
    return (start or None), (None if end >= last_step else end)


@st.fragment(run_every=live_every)
def headline() -> None:
    with ui.guarded(db):
        now_info = data.runs(db).set_index("name").loc[run]
        anomalies = data.anomalies(db, run)
        incidents = data.incidents(db, run)
        fc = data.loss_forecast(db, run, loss) if loss else None
        latest = data.latest_values(db, run, (loss,)).get(loss) if loss else None
        feta = data.failure_eta(db, run, int(fc["final_step"])) if fc is not None else None
    # Judged by incident once incidents exist (a benign incident's members no longer count);
    # a store from before incidents is judged by its anomalies.
    health = shaping.health_of(incidents if len(incidents) else anomalies)
    age = data.now() - now_info["last_time"] if pd.notna(now_info["last_time"]) else None
    c = st.columns(6)
    with c[0]:
        st.caption("Health")
        st.markdown(f"### :{shaping.HEALTH_COLOR[health]}-badge[{health}]")
        st.caption(f"status: **{now_info['status']}**")
    # The age of the last point is not a change: no arrow, and nothing when the run
    # logged no times.
    c[1].metric(
        "Last step",
        f"{int(now_info['last_step']):,}" if pd.notna(now_info["last_step"]) else "-",
        None if age is None else f"{shaping.format_age(age)} ago",
        delta_color="off",
        delta_arrow="off",
    )
    if latest is not None:
        delta = None
        if fc is not None and fc["expected_now"]:
            delta = (
                f"{latest[1] / fc['expected_now'] - 1:+.1%} vs expected {fc['expected_now']:.4f}"
            )
        c[2].metric(f"{loss} now", f"{latest[1]:.4f}", delta, delta_color="inverse")
    if fc is not None:
        c[3].metric(
            f"Forecast at step {fc['final_step']:,}",
            f"{fc['predicted']:.4f}",
            f"90%: {fc['lower']:.3f} – {fc['upper']:.3f}",
            delta_color="off",
            delta_arrow="off",
            help=shaping.model_text(fc["model"], fc.get("lr_note")),
        )
        if now_info["status"] != "running":
            c[4].metric("ETA", "done", _goodput_text(feta), delta_color="off", delta_arrow="off")
        elif feta is None:
            c[4].metric("ETA", shaping.format_age(fc["eta_seconds"]))
        else:
            band = (
                f"90%: {shaping.format_age(feta['eta_lower'])} – "
                f"{shaping.format_age(feta['eta_upper'])}"
            )
            c[4].metric(
                "ETA (with failures)",
                shaping.format_age(feta["eta_seconds"]),
                f"{band} · {_goodput_text(feta)}",
                delta_color="off",
                delta_arrow="off",
                help=_eta_help(feta, fc["eta_seconds"]),
            )
    c[5].metric(
        "Open incidents",
        inbox.open_count(incidents),
        f"attempts: {int(now_info['attempts'])}",
        delta_color="off",
        delta_arrow="off",
    )


def _goodput_text(feta: dict | None) -> str | None:
    if feta is None or feta["goodput"] is None:
        return None
    return f"goodput {feta['goodput']:.0%}"


def _eta_help(feta: dict, pace_only: float | None) -> str:
    # How the failure-aware ETA was made, in words, for the metric's tooltip (a comment,
    # not a docstring: see LIST_ROWS).
    cost = shaping.format_age(feta["cost_per_failure_s"])
    seen = (
        f"{feta['failures']} failure(s) so far, {feta['failure_rate_per_h']:.2f} per hour of "
        f"running (recent ones weigh more), each costing {cost} (downtime + redone steps); "
        f"{feta['expected_failures']:.1f} expected before the end."
        if feta["failures"]
        else "No failure so far: the band still allows for some (the rule of three)."
    )
    return (
        f"Remaining steps at the recent pace ({shaping.format_age(pace_only)}), plus the "
        f"failures still to come. {seen} Goodput: time on steps the final curve keeps / "
        "wall time since the start."
    )


@st.fragment(run_every=live_every)
def chart() -> None:
    start, end = _window()
    slot = st.empty()
    if "run_chart" not in st.session_state:
        # First draw in this tab: an empty chart goes out before the reads and the fit, so
        # the browser runs plotly.js meanwhile (the download started with the page,
        # streamlit_internals.py). Reruns keep the drawn chart instead. Its
        # config is the real chart's: a config change makes plotly redraw from scratch.
        slot.plotly_chart(
            placeholder_figure(run_figure_height(len(panel_metrics)), "reading the run…"),
            width="stretch",
        )
    with ui.guarded(db):
        frames = {m: data.series_view(db, run, m, start, end, smoothing) for m in panel_metrics}
        ref = frames[panel_metrics[0]]
        tps = runconfig.tokens_per_step(config, runconfig.aligned_sample(frames))
        to_x = lambda steps: shaping.steps_to_x(steps, axis, tps, ref)  # noqa: E731
        anomalies = data.anomalies(db, run)
        incidents = data.incidents(db, run)
        membership = data.incident_membership(db, run)
        attempts = data.attempts(db, run)
        fc = data.loss_forecast(db, run, loss) if loss else None
        family = data.family_curve(db, run, loss) if loss else None
    if axis == "tokens" and not tps:
        st.warning(
            "No tokens per step known for this run (config `tokens_per_step`, or "
            "`tokens_per_s` and `step_time_s` metrics); showing steps."
        )
    lo = ref["step"].min() if len(ref) else 0
    hi = ref["step"].max() if len(ref) else 0
    if len(anomalies):
        inside = (anomalies["end_step"] >= lo) & (anomalies["start_step"] <= hi)
        anomalies = anomalies[inside]
    expected = forecast = None
    if family is not None:
        # A family's curve is known before the run starts: drawn over the whole run from
        # step 1 (or the zoomed window's start), not only from where a fit would begin.
        curve = family["curve"]
        first = 1 if start is None else lo
        curve = curve[(curve["step"] >= first) & ((curve["step"] <= hi) | (end is None))]
        expected = curve.assign(x=to_x(curve["step"].to_numpy()))
    elif fc is not None:
        curve = fc["curve"]
        # Only where the fit speaks: the early, steep part is not what it was fitted on.
        lo_fit = max(lo, fc["fit_from"])
        curve = curve[(curve["step"] >= lo_fit) & ((curve["step"] <= hi) | (end is None))]
        expected = curve.assign(x=to_x(curve["step"].to_numpy()))
    if fc is not None and end is None:
        forecast = {**fc, "x": to_x([fc["final_step"]])[0]}
    restarts = [
        (to_x([r.start_step])[0], f"restart #{int(r.attempt)} ({r.reason})")
        for r in attempts.itertuples()
        if r.attempt > 1 and pd.notna(r.start_step) and lo <= r.start_step <= hi
    ]
    marked, hidden = inbox.incident_anomalies(
        anomalies, incidents, membership, show_info, event_metric=panel_metrics[0]
    )
    marked = marked[(marked["end_step"] >= lo) & (marked["start_step"] <= hi)]
    fig = run_figure(
        [(m, shaping.with_x(f, axis, tps)) for m, f in frames.items()],
        expected=expected,
        expected_name="expected (family)" if family is not None else "expected",
        forecast=forecast,
        anomalies=anomaly_marks(marked, to_x),
        restarts=restarts,
        smoothed=smoothing > 0,
        log_y=[loss] if log_y and loss else [],
        log_x=log_x,
        x_title={"step": "step", "wall time": "wall time (UTC)", "tokens": "tokens"}[axis],
        focus=[loss] if loss else [],
    )
    points = max((len(f) for f in frames.values()), default=0)
    event = slot.plotly_chart(
        fig, key="run_chart", on_select="rerun", selection_mode="points", width="stretch"
    )
    notes = [
        f"{len(frames)} panels, at most {points:,} points per trace (min/max per bucket: "
        "every spike and NaN kept). Click a marker to see its incident; drag to zoom, "
        "double-click to zoom out."
    ]
    if fig.layout.yaxis.autorange is False:
        notes.append(f"The {loss} panel opens on the run after its initial fall.")
    if hidden:
        notes.append(
            f"{hidden:,} info-level incident{'' if hidden == 1 else 's'} not drawn "
            "(toggle *info incidents*)."
        )
    if family is not None and family["family"]:
        names = ", ".join(shaping.markdown_text(n) for n in family["family"])
        st.caption(f"Expected curve from the family: {names}")
    st.caption(" ".join(notes))
    ui.updated_caption()
    picked = [p for p in (event.selection.points if event else []) if p.get("customdata")]
    if picked:
        ids = picked[0]["customdata"]
        _show_picked(int(ids[0]), int(ids[1]) if len(ids) > 1 else None, anomalies, incidents)


def _show_picked(
    member_id: int, incident_id: int | None, anomalies: pd.DataFrame, incidents: pd.DataFrame
) -> None:
    """The clicked marker's incident (or, not yet in one, its anomaly) and a way to judge it.
    A negative ``member_id`` is an event member (a crash) of the incident."""
    row = anomalies[anomalies["id"] == member_id]
    inc = incidents[incidents["id"] == incident_id] if incident_id is not None else incidents[:0]
    if row.empty and inc.empty:
        return
    with st.container(border=True):
        if len(inc):
            st.markdown(inbox.headline(inc.iloc[0]))
            st.caption(inbox.facts(inc.iloc[0]))
        if len(row):
            a = row.iloc[0]
            st.markdown(
                f"**#{member_id} · {a['severity']} · {a['detector']} on `{a['metric']}`** "
                f"(steps {a['start_step']}–{a['end_step']})  \n"
                f"{shaping.markdown_text(a['message'])}"
            )
        if st.button("Judge it in the Anomalies inbox", key=f"judge-{member_id}"):
            st.session_state["anomaly_id"] = member_id if len(row) else None
            st.session_state["incident_id"] = incident_id  # None: opens the anomaly list
            st.switch_page("views/anomalies.py")


# The chart is computed first and the headline (whose forecast the chart has then already
# cached) is filled in above it: the figure, the slow part to draw, leaves the server sooner.
top = st.container()
with st.container():
    chart()
with top:
    headline()

with ui.guarded(db):
    anomalies = data.anomalies(db, run)
    incidents = data.incidents(db, run)
    events = data.events(db, run)
# Full width, one under the other: a Markdown table sizes its columns to their text, and the
# messages need the room.
st.subheader(f"Incidents ({len(incidents)})")
if incidents.empty:
    st.caption("None formed so far.")
else:
    st.markdown(
        shaping.markdown_table(
            inbox.incident_rows(incidents, LIST_ROWS), raw=("severity", "status")
        )
    )
    if len(incidents) > LIST_ROWS:
        st.caption(f"The first {LIST_ROWS} of {len(incidents):,}: the Anomalies page has them all.")
with st.expander(f"Anomalies, one by one ({len(anomalies)})"):
    if anomalies.empty:
        st.caption("None found so far.")
    else:
        st.markdown(
            shaping.markdown_table(
                shaping.anomaly_rows(anomalies, LIST_ROWS), raw=("severity", "state")
            )
        )
        if len(anomalies) > LIST_ROWS:
            st.caption(
                f"The {LIST_ROWS} most recent of {len(anomalies):,}: the Anomalies page lists "
                "them all, with filters."
            )
with ui.guarded(db):
    watched = data.watched(db, run)
with st.expander(f"What is watched ({len(watched)} series)"):
    st.caption(
        "The role each metric got from its name (or an override in the run's config "
        "`roles`) and the detectors that watch it; `runwatch metrics` prints the same."
    )
    shown = watched[["metric", "labels", "points", "role", "detectors"]]
    st.markdown(shaping.markdown_table(shown))
st.subheader("Events")
shown = events[events["kind"] != "log"][["kind", "step", "attempt", "message"]]
if shown.empty:
    st.caption("No restarts, crashes or status changes recorded.")
else:
    recent = shown.iloc[::-1].head(LIST_ROWS)
    st.markdown(shaping.markdown_table(recent.assign(step=recent["step"].astype("Int64"))))
    if len(shown) > LIST_ROWS:
        st.caption(f"The {LIST_ROWS} most recent of {len(shown):,}.")
