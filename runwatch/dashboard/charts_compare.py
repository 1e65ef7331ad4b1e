"""Pure chart builders across runs: overlays aligned by step or tokens, and the scaling view.

The scaling view is for reading a big run against its smaller siblings: each run's final
loss (or, while it trains, its forecast with the 90% band) against its training compute on
log-log axes, with the fitted law L = a·C^(-b) drawn through the finished ones.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from runwatch.dashboard.charts import FORECAST_COLOR, PALETTE, base_layout


def compare_figure(
    frames: Mapping[str, pd.DataFrame],
    *,
    metric: str,
    smoothed: bool = False,
    log_x: bool = False,
    log_y: bool = False,
    x_title: str = "step",
) -> go.Figure:
    """One line per run (frame columns x, value, smooth); raw faded when smoothed."""
    fig = go.Figure()
    for i, (run, frame) in enumerate(frames.items()):
        color = PALETTE[i % len(PALETTE)]
        live = frame[~frame["superseded"]] if "superseded" in frame else frame
        fig.add_trace(
            go.Scatter(
                x=live["x"],
                y=live["value"],
                mode="lines",
                name=run,
                legendgroup=run,
                showlegend=not smoothed,
                opacity=0.3 if smoothed else 1.0,
                line={"color": color, "width": 1.3},
                hovertemplate="%{y:.4g}<extra>" + run + "</extra>",
            )
        )
        if smoothed and "smooth" in live:
            fig.add_trace(
                go.Scatter(
                    x=live["x"],
                    y=live["smooth"],
                    mode="lines",
                    name=run,
                    legendgroup=run,
                    line={"color": color, "width": 2.2},
                    hovertemplate="%{y:.4g}<extra>" + run + " EMA</extra>",
                )
            )
    fig.update_xaxes(title_text=x_title, type="log" if log_x else "linear")
    fig.update_yaxes(title_text=metric, type="log" if log_y else "linear")
    base_layout(fig, 460)
    fig.update_layout(hovermode="x unified", uirevision="compare")
    return fig


def scaling_figure(points: pd.DataFrame, law: tuple[float, float] | None) -> go.Figure:
    """Loss vs compute per run (columns run, compute, loss, lower, upper, kind), and the law.

    ``kind`` is "final" (a finished run's last loss) or "forecast" (a running run's
    predicted final loss, drawn hollow with its band).
    """
    fig = go.Figure()
    for kind, symbol in (("final", "circle"), ("forecast", "circle-open")):
        part = points[points["kind"] == kind]
        if part.empty:
            continue
        err = None
        if part["upper"].notna().any():
            err = {
                "type": "data",
                "symmetric": False,
                "array": (part["upper"] - part["loss"]).fillna(0).to_numpy(),
                "arrayminus": (part["loss"] - part["lower"]).fillna(0).to_numpy(),
                "color": FORECAST_COLOR,
            }
        fig.add_trace(
            go.Scatter(
                x=part["compute"],
                y=part["loss"],
                mode="markers+text",
                text=part["run"],
                textposition="top center",
                name=f"{kind} loss",
                error_y=err,
                marker={"size": 12, "symbol": symbol, "color": PALETTE[0], "line": {"width": 2}},
                hovertemplate="%{text}<br>compute %{x:.3g} FLOPs<br>loss %{y:.4g}<extra></extra>",
            )
        )
    if law is not None and len(points):
        a, b = law
        lo, hi = float(points["compute"].min()), float(points["compute"].max())
        xs = np.geomspace(lo / 3, hi * 3, 100)
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=a * xs ** (-b),
                mode="lines",
                name=f"fit: L = {a:.3g}·C^(-{b:.3f})",
                line={"color": "#475569", "dash": "dash", "width": 1.5},
                hoverinfo="skip",
            )
        )
    fig.update_xaxes(title_text="training compute (FLOPs)", type="log")
    fig.update_yaxes(title_text="final loss", type="log")
    base_layout(fig, 420)
    return fig
