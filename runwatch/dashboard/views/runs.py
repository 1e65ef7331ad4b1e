"""Runs: every run at a glance -- health, how fresh its data is, loss against expectation,
where it will end and when, and what still needs a person's look."""

from __future__ import annotations

import streamlit as st

from runwatch.dashboard import data, shaping, ui

db = ui.store_path()
st.title("Runs")
ui.open_or_stop(db)


_STYLE = {
    "healthy": "color: #15803d; font-weight: 600",
    "warning": "color: #c2410c; font-weight: 600",
    "critical": "color: #b91c1c; font-weight: 600",
}


def _health_style(value: str) -> str:
    return _STYLE.get(value, "")


def _loss_figures(names: list[str]) -> tuple[dict, dict]:
    latest, forecasts = {}, {}
    for name in names:
        loss = shaping.metrics_by_role(data.metrics(db, name)).get("loss")
        if loss is None:
            continue
        latest[name] = data.latest_values(db, name, (loss,)).get(loss, (None, None))[1]
        forecasts[name] = data.loss_forecast(db, name, loss)
    return latest, forecasts


@st.fragment(run_every=ui.run_every())
def runs_panel() -> None:
    with ui.guarded(db):
        runs = data.runs(db)
        if runs.empty:
            st.info(
                "No runs in this store yet. Start one with `runwatch demo` or `runwatch.init()`."
            )
            return
        anomalies = data.anomalies(db)
        incidents = data.incidents(db)
        latest, forecasts = _loss_figures(runs["name"].tolist())
    table = shaping.runs_summary(runs, anomalies, latest, forecasts, data.now(), incidents)
    c = st.columns(4)
    c[0].metric("Runs", len(table))
    c[1].metric("Running", int((table["status"] == "running").sum()))
    c[2].metric("Critical", int((table["health"] == "critical").sum()))
    c[3].metric("Open incidents", int(table["open"].sum()))
    event = st.dataframe(
        table.style.map(_health_style, subset=["health"]),
        hide_index=True,
        width="stretch",
        on_select="rerun",
        selection_mode="single-row",
        key="runs_table",
        column_config={
            "health": st.column_config.TextColumn("health", width="small"),
            "last step": st.column_config.NumberColumn(format="%d"),
            "age": st.column_config.TextColumn(
                "last report", help="time since the run last wrote a point"
            ),
            "loss now": st.column_config.NumberColumn(format="%.4f"),
            "vs expected": st.column_config.NumberColumn(
                format="percent",
                help="loss now against the expected curve (fitted on the run so far) at this step",
            ),
            "forecast final": st.column_config.NumberColumn(
                format="%.4f", help="predicted loss at the planned final step"
            ),
            "band": st.column_config.TextColumn("90% band"),
            "open": st.column_config.NumberColumn(
                "open incidents",
                help="incidents waiting for a verdict (a run stored before incidents: "
                "its anomalies without one, or judged real)",
            ),
        },
    )
    ui.updated_caption()
    rows = event.selection.rows if event is not None else []
    if rows:
        st.session_state["run"] = table.iloc[rows[0]]["run"]
        st.switch_page("views/run.py")


st.caption(
    "Select a row to open the run. Health comes from incidents nobody has judged yet, or "
    "judged real."
)
runs_panel()
