"""Compare: runs overlaid on one axis (step or tokens), and the scaling view -- each run's
final or forecast loss against its compute with the fitted law, for reading a big run
against its smaller siblings."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from runwatch.dashboard import data, shaping, ui
from runwatch.dashboard.charts_compare import compare_figure, scaling_figure
from runwatch.pipeline import runconfig

db = ui.store_path()
st.title("Compare")
ui.open_or_stop(db)
with ui.guarded(db):
    runs = data.runs(db)
if runs.empty:
    st.info("No runs in this store yet.")
    st.stop()
names = runs["name"].tolist()[::-1]
configs = {r.name: runconfig.run_config(r.config) for r in runs.itertuples()}

chosen = st.multiselect("Runs", names, default=names[:4], key="cmp_runs")
with ui.guarded(db):
    common = sorted(set.intersection(*(set(data.metrics(db, r)) for r in chosen))) if chosen else []
with st.container(horizontal=True, vertical_alignment="bottom"):
    metric = st.selectbox(
        "Metric",
        common or ["loss"],
        index=common.index("loss") if "loss" in common else 0,
        key="cmp_metric",
    )
    axis = st.segmented_control("Align by", ("step", "tokens"), default="step", key="cmp_axis")
    smoothing = st.slider("Smoothing (EMA)", 0.0, 0.99, 0.6, 0.01, key="cmp_smooth", width=220)
    log_x = st.toggle("log x", key="cmp_logx")
    log_y = st.toggle("log y", key="cmp_logy")


def _tps(run: str) -> float | None:
    with ui.guarded(db):
        got = {
            m: data.series_view(db, run, m, None, None, 0.0, 500)
            for m in ("tokens_per_s", "step_time_s")
            if m in data.metrics(db, run)
        }
    return runconfig.tokens_per_step(configs[run], runconfig.aligned_sample(got) if got else None)


@st.fragment(run_every=ui.run_every())
def overlay() -> None:
    if not chosen:
        st.info("Pick runs to compare.")
        return
    frames, missing = {}, []
    for run in chosen:
        tps = _tps(run) if axis == "tokens" else None
        if axis == "tokens" and not tps:
            missing.append(run)
            continue
        with ui.guarded(db):
            frame = data.series_view(db, run, metric, None, None, smoothing)
        frames[run] = shaping.with_x(frame, axis or "step", tps)
    if missing:
        st.warning(
            f"No tokens per step known for {', '.join(missing)} (config "
            "`tokens_per_step`, or tokens_per_s and step_time_s metrics): left out."
        )
    st.plotly_chart(
        compare_figure(
            frames,
            metric=metric,
            smoothed=smoothing > 0,
            log_x=log_x,
            log_y=log_y,
            x_title=axis or "step",
        ),
        key="compare_chart",
        width="stretch",
    )
    ui.updated_caption()


def scaling_points() -> pd.DataFrame:
    rows = []
    for rec in runs.itertuples():
        roles = shaping.metrics_by_role(data.metrics(db, rec.name), configs[rec.name])
        loss = roles.get("loss")
        if loss is None:
            continue
        fc = data.loss_forecast(db, rec.name, loss)
        final_step = fc["final_step"] if fc else rec.last_step
        compute = shaping.compute_of(configs[rec.name], final_step, _tps(rec.name))
        if compute is None:
            continue
        if rec.status == "running" and fc is not None:
            rows.append((rec.name, compute, fc["predicted"], fc["lower"], fc["upper"], "forecast"))
        else:
            last = data.latest_values(db, rec.name, (loss,)).get(loss)
            if last is not None:
                rows.append((rec.name, compute, last[1], None, None, "final"))
    return pd.DataFrame(rows, columns=["run", "compute", "loss", "lower", "upper", "kind"])


overlay()
st.subheader("Scaling: final loss against compute")
st.caption(
    "Compute is the run config's `compute`/`flops` if given, else 6 × `params` × tokens "
    "(tokens: config `tokens`, else final step × tokens per step). Finished runs show their "
    "last loss; running ones their forecast final loss with the 90% band. The law "
    "L = a·C^(-b) is fitted in log-log on the finished runs (on all when fewer than two)."
)
with ui.guarded(db):
    points = scaling_points()
if points.empty:
    st.info(
        "No run has a known compute. Add `flops` (or `params` and `tokens_per_step`) to "
        "the run's config to place it here."
    )
else:
    finished = points[points["kind"] == "final"]
    basis = finished if len(finished) >= 2 else points
    law = shaping.fit_scaling_law(basis["compute"].to_numpy(), basis["loss"].to_numpy())
    left, right = st.columns([2, 1])
    left.plotly_chart(scaling_figure(points, law), key="scaling_chart", width="stretch")
    right.dataframe(
        points,
        hide_index=True,
        width="stretch",
        column_config={"compute": st.column_config.NumberColumn(format="%.3e")},
    )
    if law is None:
        right.caption("Two runs of different compute are needed to fit a law.")
    else:
        right.metric("Fitted exponent b", f"{law[1]:.3f}", f"a = {law[0]:.3g}", delta_color="off")
