"""Pure chart builders for one run: frames in, a plotly figure out (no Streamlit here).

One figure holds every panel on one shared x-axis (loss on top, tall; grad norm, LR,
throughput, step time below), so zooming one zooms all and a loss spike sits right above
the grad-norm burst that caused it: symptoms side by side, in time.

Frames are already downsampled and carry an ``x`` column (step, wall time or tokens); the
builders only draw. Raw points are always drawn; with smoothing they fade (as in
TensorBoard) but stay, so a spike is never hidden by the EMA.

Traces are SVG (``go.Scatter``), not WebGL: with at most ~4,000 points per trace SVG is
quick everywhere, while WebGL on a machine without a GPU (a headless browser, a remote
desktop) falls back to software rendering and drew the 1M-step Run page 2-3x slower
(bench/dashboard.py); it also spends one WebGL context per panel, which browsers cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

PALETTE = ("#2563eb", "#7c3aed", "#0d9488", "#ea580c", "#db2777", "#4b5563", "#65a30d")
SEVERITY_COLOR = {"info": "#eab308", "warning": "#f97316", "critical": "#dc2626"}
SEVERITY_SYMBOL = {"info": "circle", "warning": "diamond", "critical": "x"}
EXPECTED_COLOR = "#475569"
BAND_FILL = "rgba(100, 116, 139, 0.16)"
FORECAST_COLOR = "#16a34a"
REDONE_COLOR = "#9ca3af"
NAN_COLOR = "#b91c1c"
FONT = "Inter, system-ui, -apple-system, Segoe UI, sans-serif"


def base_layout(fig: go.Figure, height: int) -> go.Figure:
    """The look shared by every runwatch figure: white, quiet grid, legend on top."""
    fig.update_layout(
        template="plotly_white",
        height=height,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        font={"family": FONT, "size": 12, "color": "#1f2937"},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.01, "x": 0, "font_size": 11},
        hoverlabel={"font_size": 12},
        hovermode="closest",
    )
    fig.update_xaxes(
        showgrid=True,
        gridcolor="#eef0f3",
        zeroline=False,
        showspikes=True,
        spikemode="across",
        spikethickness=1,
        spikecolor="#9ca3af",
    )
    fig.update_yaxes(showgrid=True, gridcolor="#eef0f3", zeroline=False)
    return fig


def _value_at(frame: pd.DataFrame, x: Any) -> float:
    """The series' value nearest ``x``: where an anomaly's marker sits on its own curve.

    A detector's ``observed`` is not always the panel's value (a grad-norm precursor flags
    the loss with the grad norm), so the marker follows the curve and the hover says more.
    """
    live = frame[~frame["superseded"]] if "superseded" in frame else frame
    if live.empty:
        return float("nan")
    xs = live["x"].to_numpy()
    i = int(np.clip(np.searchsorted(xs, np.asarray(x, dtype=xs.dtype)), 0, len(xs) - 1))
    if i > 0 and abs(xs[i - 1] - x) <= abs(xs[i] - x):
        i -= 1
    return float(live["value"].iloc[i])


def _finite_top(frame: pd.DataFrame) -> float:
    """Where to pin a NaN marker: the top of the panel's finite data."""
    values = frame["value"].to_numpy(dtype=float) if len(frame) else np.array([])
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else 1.0


def _add_series(
    fig: go.Figure, row: int, name: str, frame: pd.DataFrame, color: str, smoothed: bool
) -> None:
    live = frame[~frame["superseded"]] if "superseded" in frame else frame
    old = frame[frame["superseded"]] if "superseded" in frame else frame.iloc[:0]
    if len(old):
        fig.add_trace(
            go.Scatter(
                x=old["x"],
                y=old["value"],
                mode="markers",
                name="redone steps (lost work)",
                marker={"color": REDONE_COLOR, "size": 4, "opacity": 0.55},
                legendgroup="redone",
                showlegend=row == 1,
                hovertemplate="redone step %{x}: %{y:.4g}<extra>earlier attempt</extra>",
            ),
            row=row,
            col=1,
        )
    fig.add_trace(
        go.Scatter(
            x=live["x"],
            y=live["value"],
            mode="lines",
            name=name,
            line={"color": color, "width": 1.2 if smoothed else 1.6},
            opacity=0.3 if smoothed else 1.0,
            legendgroup=name,
            # Panels are titled; the legend only explains the top (loss) panel's marks.
            showlegend=row == 1 and not smoothed,
            hovertemplate="%{y:.4g}<extra>" + name + "</extra>",
        ),
        row=row,
        col=1,
    )
    if smoothed and "smooth" in live:
        fig.add_trace(
            go.Scatter(
                x=live["x"],
                y=live["smooth"],
                mode="lines",
                name=f"{name} (EMA; raw faded)",
                line={"color": color, "width": 2},
                legendgroup=name,
                showlegend=row == 1,
                hovertemplate="%{y:.4g}<extra>" + name + " EMA</extra>",
            ),
            row=row,
            col=1,
        )
    bad = live[~np.isfinite(live["value"].to_numpy(dtype=float))]
    if len(bad):
        fig.add_trace(
            go.Scatter(
                x=bad["x"],
                y=[_finite_top(live)] * len(bad),
                mode="markers+text",
                text=["NaN" if np.isnan(v) else "inf" for v in bad["value"]],
                textposition="top center",
                textfont={"color": NAN_COLOR, "size": 11},
                marker={
                    "color": NAN_COLOR,
                    "symbol": "x-thin-open",
                    "size": 12,
                    "line": {"width": 2.5, "color": NAN_COLOR},
                },
                name="non-finite",
                legendgroup="nonfinite",
                showlegend=False,
                hovertemplate="non-finite value at %{x}<extra>" + name + "</extra>",
            ),
            row=row,
            col=1,
        )


def _add_expected(fig: go.Figure, expected: pd.DataFrame, forecast: dict[str, Any] | None) -> None:
    fig.add_trace(
        go.Scatter(
            x=expected["x"],
            y=expected["upper"],
            mode="lines",
            line={"width": 0},
            showlegend=False,
            hoverinfo="skip",
            legendgroup="expected",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=expected["x"],
            y=expected["lower"],
            mode="lines",
            line={"width": 0},
            fill="tonexty",
            fillcolor=BAND_FILL,
            name="expected band (90%)",
            hoverinfo="skip",
            legendgroup="expected",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=expected["x"],
            y=expected["expected"],
            mode="lines",
            name="expected",
            line={"color": EXPECTED_COLOR, "width": 1.5, "dash": "dash"},
            legendgroup="expected",
            hovertemplate="expected %{y:.4g}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    if forecast is not None:
        lo, hi, mid = forecast["lower"], forecast["upper"], forecast["predicted"]
        fig.add_trace(
            go.Scatter(
                x=[forecast["x"]],
                y=[mid],
                mode="markers",
                name="forecast final",
                marker={"color": FORECAST_COLOR, "size": 11, "symbol": "diamond"},
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [hi - mid],
                    "arrayminus": [mid - lo],
                    "color": FORECAST_COLOR,
                    "thickness": 2,
                },
                hovertemplate=f"forecast {mid:.4g} ({lo:.4g} – {hi:.4g})<extra></extra>",
            ),
            row=1,
            col=1,
        )


def _add_anomalies(
    fig: go.Figure, rows: dict[str, int], frames: dict[str, pd.DataFrame], anomalies: pd.DataFrame
) -> None:
    shown: set[str] = set()
    for rec in anomalies.itertuples(index=False):
        row = rows.get(rec.metric)
        if row is None:
            continue
        judged = getattr(rec, "state", "needs verdict") != "needs verdict"
        color = SEVERITY_COLOR.get(rec.severity, "#6b7280")
        if rec.x1 != rec.x0:
            fig.add_vrect(
                x0=rec.x0,
                x1=rec.x1,
                fillcolor=color,
                opacity=0.06 if judged else 0.14,
                line_width=0,
                row=row,
                col=1,
            )
        y = _value_at(frames[rec.metric], rec.x0)
        if not np.isfinite(y):
            y = _finite_top(frames[rec.metric])
        fig.add_trace(
            go.Scatter(
                x=[rec.x0],
                y=[y],
                mode="markers",
                customdata=[[int(rec.id)]],
                name=f"{rec.severity} anomaly",
                legendgroup=f"anomaly-{rec.severity}",
                showlegend=rec.severity not in shown,
                marker={
                    "color": color,
                    "size": 13,
                    "symbol": SEVERITY_SYMBOL.get(rec.severity),
                    "opacity": 0.35 if judged else 1.0,
                    "line": {
                        "width": 1.5,
                        "color": "white" if rec.severity != "critical" else color,
                    },
                },
                hovertext=[f"#{int(rec.id)} {rec.message}"],
                hovertemplate="%{hovertext}<extra>" + rec.severity + "</extra>",
            ),
            row=row,
            col=1,
        )
        shown.add(rec.severity)


def run_figure(
    panels: Sequence[tuple[str, pd.DataFrame]],
    *,
    expected: pd.DataFrame | None = None,
    forecast: dict[str, Any] | None = None,
    anomalies: pd.DataFrame | None = None,
    restarts: Sequence[tuple[Any, str]] = (),
    smoothed: bool = False,
    log_y: Sequence[str] = (),
    log_x: bool = False,
    x_title: str = "step",
    highlight: tuple[Any, Any] | None = None,
    height: int | None = None,
) -> go.Figure:
    """The run chart: one row per (metric, frame), the first row tall and holding the
    expected curve, its band and the forecast.

    ``anomalies`` has id, metric, x0, x1, y (observed), severity, message, state; each is a
    clickable marker (``customdata`` = anomaly id) and an episode is a shaded span.
    ``restarts`` are (x, label) drawn as vertical lines across every row.
    """
    n = max(1, len(panels))
    heights = [1.0] if n == 1 else [0.42] + [0.58 / (n - 1)] * (n - 1)
    fig = make_subplots(
        rows=n,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.035,
        row_heights=heights,
        subplot_titles=[m for m, _ in panels] or None,
    )
    rows = {metric: i + 1 for i, (metric, _) in enumerate(panels)}
    frames = dict(panels)
    for i, (metric, frame) in enumerate(panels):
        _add_series(fig, i + 1, metric, frame, PALETTE[i % len(PALETTE)], smoothed)
        if metric in log_y:
            fig.update_yaxes(type="log", row=i + 1, col=1)
    if expected is not None and len(expected):
        _add_expected(fig, expected, forecast)
    if anomalies is not None and len(anomalies):
        _add_anomalies(fig, rows, frames, anomalies)
    for x, label in restarts:
        fig.add_vline(x=x, row="all", col=1, line={"color": "#111827", "width": 1.2, "dash": "dot"})
        fig.add_annotation(
            x=x,
            y=1.0,
            xref="x",
            yref="y domain",
            text=label,
            showarrow=False,
            xanchor="left",
            yanchor="top",
            font={"size": 11, "color": "#111827"},
            bgcolor="rgba(255,255,255,0.8)",
        )
    if highlight is not None:
        fig.add_vrect(
            x0=highlight[0],
            x1=highlight[1],
            row="all",
            col=1,
            fillcolor="#fde68a",
            opacity=0.35,
            line_width=0,
            layer="below",
        )
    fig.update_xaxes(title_text=x_title, row=n, col=1)
    if log_x:
        fig.update_xaxes(type="log")
    base_layout(fig, height or (460 if n == 1 else 360 + 150 * (n - 1)))
    fig.update_layout(hovermode="x unified", uirevision="run", dragmode="zoom")
    return fig


def anomaly_marks(anomalies: pd.DataFrame, to_x: Any) -> pd.DataFrame:
    """Anomalies as chart marks: id, metric, x0, x1, y, severity, message, state.

    ``to_x`` maps an array of steps to the chart's x values (step, time or tokens).
    """
    if anomalies.empty:
        return pd.DataFrame(
            columns=["id", "metric", "x0", "x1", "y", "severity", "message", "state"]
        )
    return pd.DataFrame(
        {
            "id": anomalies["id"].to_numpy(),
            "metric": anomalies["metric"].to_numpy(),
            "x0": list(to_x(anomalies["start_step"].to_numpy())),
            "x1": list(to_x(anomalies["end_step"].to_numpy())),
            "y": pd.to_numeric(anomalies["observed"], errors="coerce").to_numpy(),
            "severity": anomalies["severity"].to_numpy(),
            "message": anomalies["message"].to_numpy(),
            "state": anomalies.get(
                "state", pd.Series(["needs verdict"] * len(anomalies))
            ).to_numpy(),
        }
    )
