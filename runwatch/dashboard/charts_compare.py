"""Pure chart builders across runs: overlays aligned by step or tokens, and the scaling view.

The scaling view is for reading a big run against its smaller siblings: each run's final
loss (or, while it trains, its forecast with the 90% band) against its training compute on
log-log axes, with the fitted law L = a·C^(-b) drawn through the finished ones.

The family view asks the same of one run against the runs of its recipe at other sizes:
their final loss by parameter count, the family's law for this run's schedule with its
band, and the run's own forecast with its interval -- is this run on the line?
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from runwatch.dashboard.charts import (
    BAND_FILL,
    EXPECTED_COLOR,
    FORECAST_COLOR,
    PALETTE,
    base_layout,
)


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


def law_at(view: Mapping[str, Any], params: float) -> tuple[float, float, float]:
    """The family law's (expected, lower, upper) at ``params``, interpolated in log-log
    between the law's samples (``scaling_view``'s ``law``: params, expected, lower, upper)."""
    law = np.asarray(view["law"], dtype=float)
    x = np.log(law[:, 0])
    return tuple(  # type: ignore[return-value]
        float(np.exp(np.interp(np.log(params), x, np.log(law[:, i])))) for i in (1, 2, 3)
    )


def on_the_line(view: Mapping[str, Any]) -> dict[str, Any]:
    """Is the run's forecast on its family's line? The law's value and band at the run's
    params, the forecast's distance from the line (``off``, relative), and ``where``:
    "above" (worse than its size predicts), "below" or "on" (inside the band)."""
    fc = view["forecast"]
    expected, lower, upper = law_at(view, float(fc["params"]))
    predicted = float(fc["predicted"])
    where = "above" if predicted > upper else "below" if predicted < lower else "on"
    return {
        "expected": expected,
        "lower": lower,
        "upper": upper,
        "off": predicted / expected - 1.0,
        "where": where,
    }


def family_scaling_figure(view: Mapping[str, Any], run: str, metric: str = "loss") -> go.Figure:
    """Final ``metric`` against params, log-log: the family's runs as labelled points, the
    family law (for ``run``'s schedule) as a line in its 90% band, and ``run``'s forecast
    as a point with its interval (``runwatch.pipeline.family.scaling_view``'s dict)."""
    law = np.asarray(view["law"], dtype=float).reshape(-1, 4)
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=law[:, 0],
            y=law[:, 3],
            mode="lines",
            line={"width": 0},
            showlegend=False,
            hoverinfo="skip",
            legendgroup="law",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=law[:, 0],
            y=law[:, 2],
            mode="lines",
            line={"width": 0},
            fill="tonexty",
            fillcolor=BAND_FILL,
            name="family law band (90%)",
            hoverinfo="skip",
            legendgroup="law",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=law[:, 0],
            y=law[:, 1],
            mode="lines",
            name="family law",
            line={"color": EXPECTED_COLOR, "dash": "dash", "width": 1.5},
            legendgroup="law",
            hovertemplate="law at %{x:.3g} params: %{y:.4g}<extra></extra>",
        )
    )
    names = [r[0] for r in view["runs"]]
    fig.add_trace(
        go.Scatter(
            x=[float(r[1]) for r in view["runs"]],
            y=[float(r[2]) for r in view["runs"]],
            mode="markers+text",
            text=names,
            textposition="top center",
            name="family runs (final)",
            marker={"size": 11, "color": PALETTE[0]},
            hovertemplate="%{text}<br>%{x:.3g} params<br>final %{y:.4g}<extra></extra>",
        )
    )
    fc = view["forecast"]
    mid, lo, hi = float(fc["predicted"]), float(fc["lower"]), float(fc["upper"])
    fig.add_trace(
        go.Scatter(
            x=[float(fc["params"])],
            y=[mid],
            mode="markers+text",
            text=[run],
            textposition="middle right",
            name=f"{run} forecast",
            marker={"size": 13, "symbol": "diamond", "color": FORECAST_COLOR},
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [hi - mid],
                "arrayminus": [mid - lo],
                "color": FORECAST_COLOR,
                "thickness": 2,
            },
            hovertemplate=(
                f"{run}<br>%{{x:.3g}} params<br>forecast {mid:.4g} ({lo:.4g} – {hi:.4g})"
                "<extra></extra>"
            ),
        )
    )
    fig.update_xaxes(title_text="parameters", type="log")
    fig.update_yaxes(title_text=f"final {metric}", type="log")
    base_layout(fig, 420)
    return fig
