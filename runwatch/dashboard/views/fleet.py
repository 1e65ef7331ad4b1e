"""Fleet: which rank, host or GPU is dragging the job down, how often the run fails, and what
that costs -- a rank x time heatmap (step time, temperature, utilisation), the stragglers,
hangs and hardware faults, and the failure timeline with MTBF and goodput."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from runwatch.dashboard import charts_fleet, data, ui
from runwatch.detect.roles import role_of

HEATMAP_METRICS = ("gpu_temp_c", "gpu_util_pct", "gpu_power_w", "gpu_clock_sm_mhz")


db = ui.store_path()
st.title("Fleet")
ui.open_or_stop(db)
with ui.guarded(db):
    run = ui.pick_run(db)
    metrics = data.per_rank_metrics(db, run)


@st.fragment(run_every=ui.run_every())
def heatmap_panel() -> None:
    if not metrics:
        st.info(
            "No metric of this run was logged by more than one rank. Log `step_time` on every "
            "rank (and start `runwatch.init(system_metrics=True)` for GPU telemetry) to see "
            "the fleet here."
        )
        return
    step_metrics = [m for m in metrics if role_of(m) == "step_time"]
    default = (step_metrics or [m for m in metrics if m in HEATMAP_METRICS] or metrics)[0]
    metric = st.selectbox("Heatmap of", metrics, index=metrics.index(default), key="fleet_metric")
    with ui.guarded(db):
        pts = data.rank_points(db, run, metric)
    st.plotly_chart(charts_fleet.rank_heatmap(pts, metric), key="fleet_heatmap")
    ui.updated_caption()


@st.fragment(run_every=ui.run_every())
def episodes_panel() -> None:
    st.subheader("Stragglers, hangs and hardware faults")
    with ui.guarded(db):
        table = data.fleet_episodes(db, run, tuple(metrics))
    if table.empty:
        st.success("No straggler, hang or hardware fault in this run.", icon="✅")
        return
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        key="fleet_table",
        column_config={
            "slowdown": st.column_config.NumberColumn(format="%.3f x"),
            "lost throughput": st.column_config.NumberColumn(
                format="percent", help="share of the job's throughput lost while it is slowest"
            ),
            "lost s": st.column_config.NumberColumn(
                format="%.0f", help="seconds the other ranks waited for this one"
            ),
        },
    )


@st.fragment(run_every=ui.run_every())
def failures_panel() -> None:
    st.subheader("Failures, MTBF and goodput")
    with ui.guarded(db):
        figures = data.failures(db, run)
    if figures is None:
        st.info("No steps logged yet: nothing to time failures against.")
        return
    c = st.columns(5)
    c[0].metric("Failures", figures["failures_n"])
    goodput = figures["goodput"]
    c[1].metric("Goodput", "-" if goodput is None else f"{goodput:.1%}")
    mtbf = figures["mtbf_s"]
    c[2].metric("MTBF", "-" if mtbf is None else f"{mtbf / 3600:.2f} h")
    per_k = figures["failures_per_1k_steps"]
    c[3].metric("Failures / 1k steps", "-" if per_k is None else f"{per_k:.2f}")
    trend = figures["mtbf_trend"]
    c[4].metric(
        "MTBF trend",
        "-" if trend is None else f"{trend:.2f}x",
        help="mean time between the later half of failures / the earlier half (>1: improving)",
    )
    st.plotly_chart(
        charts_fleet.goodput_bar(figures["productive_s"], figures["badput"]), key="fleet_goodput"
    )
    timeline = pd.DataFrame.from_records(
        figures["failures"], columns=["attempt", "kind", "time", "step", "ranks", "message"]
    )
    st.plotly_chart(
        charts_fleet.failure_timeline(timeline, figures["tbf_s"], figures["start_time"]),
        key="fleet_failures",
    )


heatmap_panel()
episodes_panel()
failures_panel()
