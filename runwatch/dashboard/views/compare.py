"""Compare: runs overlaid on one axis (step or tokens), and the scaling views -- each run's
final or forecast loss against its compute with the fitted law, and one run against its
family (the recipe's runs at other sizes): is this run on the line?"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from runwatch.dashboard import data, shaping, ui
from runwatch.dashboard.charts_compare import (
    compare_figure,
    family_scaling_figure,
    on_the_line,
    scaling_figure,
)
from runwatch.pipeline import runconfig
from runwatch.pipeline.family import params_of

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


def family_of(config: dict) -> list[str]:
    """The run names a config's ``family`` lists (``runwatch import --config``, ``init``)."""
    listed = config.get("family")
    return [str(n) for n in listed] if isinstance(listed, list) else []


def family_view(target: str, family: list[str]) -> None:
    if not family:
        st.info(f"Pick the runs of {target}'s family (the same recipe at other sizes).")
        return
    roles = shaping.metrics_by_role(data.metrics(db, target), configs[target])
    metric = roles.get("loss") or "loss"
    try:
        with ui.guarded(db):
            view = data.family_scaling(db, target, metric, tuple(family))
    except ValueError as exc:
        st.info(f"The family cannot be fitted: {exc}")
        return
    fc, line = view["forecast"], on_the_line(view)
    left, right = st.columns([2, 1])
    left.plotly_chart(
        family_scaling_figure(view, target, metric), key="family_scaling_chart", width="stretch"
    )
    right.metric(
        f"{target}: forecast final {metric}",
        f"{fc['predicted']:.4f}",
        f"{line['off']:+.1%} vs the line ({line['expected']:.4f})",
        delta_color="inverse",
        help="The forecast from the family law and the run's own points so far; the line is "
        "the law alone at the run's parameter count.",
    )
    verdict = {
        "on": ":green-badge[on the line]",
        "above": ":orange-badge[above the line: worse than its size predicts]",
        "below": ":blue-badge[below the line: better than its size predicts]",
    }[line["where"]]
    right.markdown(verdict)
    seen = (
        f"with its points to step {int(fc['upto']):,}"
        if fc.get("upto")
        else "from the family alone (no points yet)"
    )
    right.caption(
        f"Forecast {seen}, 90%: {fc['lower']:.4f} – {fc['upper']:.4f}. The line's band at "
        f"{fc['params']:.3g} params: {line['lower']:.4f} – {line['upper']:.4f}."
    )
    right.dataframe(
        pd.DataFrame(view["runs"], columns=["run", "params", "final"]),
        hide_index=True,
        width="stretch",
        column_config={"params": st.column_config.NumberColumn(format="%.3e")},
    )


st.subheader("Scaling: is this run on its family's line?")
st.caption(
    "A run against its family, the same recipe at other sizes: each family run's final "
    "loss by its parameter count (config `params`), the family law for this run's LR "
    "schedule with its 90% band, and the run's forecast final loss with its interval. A "
    "run listing its family in its config (`family`) opens with it picked."
)
sized = [n for n in names if params_of(configs[n]) is not None]
with_family = [n for n in names if family_of(configs[n])]
targets = list(dict.fromkeys(with_family + sized))
if not targets:
    st.info(
        "No run has `params` (its parameter count) in its config: add it with `runwatch "
        "import FILE --run NAME --append --config '{\"params\": N}'`."
    )
else:
    target = st.selectbox(
        "Run",
        targets,
        index=0 if with_family else None,
        placeholder="pick a run to place on its family's line",
        key="fam_run",
    )
    if target is not None:
        listed = family_of(configs[target])
        known = [n for n in listed if n in configs and n != target]
        missing = [n for n in listed if n not in configs]
        if missing:
            st.warning(
                f"{target}'s config names family runs not in this store, left out: "
                f"{', '.join(missing)}."
            )
        family_view(
            target,
            st.multiselect(
                "Family runs",
                list(dict.fromkeys(known + [n for n in sized if n != target])),
                default=known,
                key=f"fam_of-{target}",
            ),
        )
