"""Pure chart builders of the Fleet page: DataFrames in, figures or tables out.

- :func:`rank_heatmap`: rank x step, each cell the rank's value over the fleet median at that
  step (step time, temperature, utilisation). A straggler is a warm row; a job-wide slowdown is
  a vertical band. Steps are binned (mean per bin) and, past ``max_ranks``, only the ranks that
  deviate most are drawn, so a 16,384-rank fleet stays readable and light.
- :func:`straggler_table`: the fleet episodes as a table, worst first.
- :func:`failure_timeline`: failures over wall time by kind, with the running MTBF.
- :func:`goodput_bar`: productive time and the badput breakdown as one stacked bar.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from runwatch.dashboard.charts import PALETTE, SEVERITY_COLOR, base_layout

KIND_COLOR = {
    "crash": "#dc2626",
    "hang": "#7c3aed",
    "oom": "#ea580c",
    "nccl_timeout": "#db2777",
    "restart": "#4b5563",
}
BADPUT_COLOR = {
    "productive": "#16a34a",
    "redone": "#f97316",
    "downtime": "#dc2626",
    "startup": "#eab308",
    "stalled": "#6b7280",
}


def relative_matrix(
    points: pd.DataFrame, *, max_steps: int = 400, max_ranks: int = 256
) -> pd.DataFrame:
    """Points (step, rank, value) -> rank x step-bin matrix of value / per-step median.

    >>> pts = pd.DataFrame({"step": [0, 0, 1, 1], "rank": [0, 1, 0, 1],
    ...                     "value": [1.0, 2.0, 1.0, 3.0]})
    >>> relative_matrix(pts).round(2).values.tolist()
    [[0.67, 0.5], [1.33, 1.5]]
    """
    if points.empty:
        return pd.DataFrame()
    wide = points.pivot_table(index="step", columns="rank", values="value", aggfunc="last")
    rel = wide.div(wide.median(axis=1), axis=0)
    if len(rel) > max_steps:
        bins = np.arange(len(rel)) * max_steps // len(rel)
        first = rel.index.to_numpy()[np.r_[0, np.flatnonzero(np.diff(bins)) + 1]]
        rel = rel.groupby(bins).mean()
        rel.index = first
    if rel.shape[1] > max_ranks:
        worst = (rel - 1.0).abs().mean().sort_values(ascending=False).index[:max_ranks]
        rel = rel[sorted(worst)]
    return rel.T


def rank_heatmap(points: pd.DataFrame, metric: str, **kw: Any) -> go.Figure:
    """The rank x time heatmap of ``metric`` relative to the fleet median."""
    m = relative_matrix(points, **kw)
    fig = go.Figure()
    if not m.empty:
        fig.add_trace(
            go.Heatmap(
                z=m.to_numpy(),
                x=m.columns,
                y=[str(r) for r in m.index],
                colorscale="RdBu_r",
                zmid=1.0,
                colorbar={"title": "x median"},
                hovertemplate="rank %{y}<br>step %{x}<br>%{z:.3f} x median<extra></extra>",
            )
        )
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="rank", type="category")
    base_layout(fig, max(300, min(900, 14 * len(m) + 120)))
    fig.update_layout(title_text=f"{metric} / fleet median, per rank")
    return fig


def straggler_table(anomalies: list[Any]) -> pd.DataFrame:
    """Fleet episodes (Anomaly objects) as rows: who, since when, how bad, what it costs."""
    rows = []
    for a in anomalies:
        d = a.details or {}
        rows.append(
            {
                "detector": a.detector,
                "severity": a.severity,
                "rank": a.labels.get("rank"),
                "host": a.labels.get("host"),
                "gpu": a.labels.get("gpu"),
                "metric": a.metric,
                "from step": a.start_step,
                "to step": a.end_step,
                "slowdown": d.get("slowdown"),
                "lost throughput": d.get("lost_throughput"),
                "lost s": d.get("lost_seconds"),
                "open": a.is_open,
                "message": a.message,
            }
        )
    cols = [
        "detector", "severity", "rank", "host", "gpu", "metric", "from step", "to step",
        "slowdown", "lost throughput", "lost s", "open", "message",
    ]  # fmt: skip
    frame = pd.DataFrame.from_records(rows, columns=cols)
    order = {"critical": 0, "warning": 1, "info": 2}
    return frame.sort_values(
        ["severity", "from step"], key=lambda s: s.map(order) if s.name == "severity" else s
    ).reset_index(drop=True)


def failure_timeline(failures: pd.DataFrame, tbf_s: list[float], start_time: float) -> go.Figure:
    """Each failure at its wall time (hours since the run started), coloured by kind; the
    running MTBF (hours) on a second axis shows whether failures are getting rarer."""
    fig = go.Figure()
    if not failures.empty:
        hours = (failures["time"] - start_time) / 3600.0
        for i, kind in enumerate(sorted(failures["kind"].unique())):
            sel = failures["kind"] == kind
            fig.add_trace(
                go.Scatter(
                    x=hours[sel],
                    y=[kind] * int(sel.sum()),
                    mode="markers",
                    name=kind,
                    marker={
                        "size": 12,
                        "symbol": "x",
                        "color": KIND_COLOR.get(kind, PALETTE[i % len(PALETTE)]),
                    },
                    text=failures.loc[sel, "message"],
                    hovertemplate="%{x:.2f} h: %{text}<extra>" + kind + "</extra>",
                )
            )
        if tbf_s:
            running = np.cumsum(tbf_s) / np.arange(1, len(tbf_s) + 1) / 3600.0
            fig.add_trace(
                go.Scatter(
                    x=hours.to_numpy()[: len(running)],
                    y=running,
                    mode="lines+markers",
                    name="MTBF so far (h)",
                    yaxis="y2",
                    line={"color": SEVERITY_COLOR["info"]},
                )
            )
    fig.update_layout(
        xaxis={"title": {"text": "hours since start"}},
        yaxis={"title": {"text": "failure"}, "type": "category"},
        yaxis2={"title": {"text": "MTBF (h)"}, "overlaying": "y", "side": "right"},
    )
    base_layout(fig, 320)
    return fig


def goodput_bar(productive_s: float, badput: dict[str, float]) -> go.Figure:
    """One stacked bar: where the wall time went (hours)."""
    fig = go.Figure()
    for name, seconds in [("productive", productive_s), *badput.items()]:
        fig.add_trace(
            go.Bar(
                x=[seconds / 3600.0],
                y=["wall time"],
                orientation="h",
                name=name,
                marker={"color": BADPUT_COLOR.get(name, "#94a3b8")},
                hovertemplate=f"{name}: %{{x:.2f}} h<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack", xaxis={"title": {"text": "hours"}})
    base_layout(fig, 200)
    return fig
