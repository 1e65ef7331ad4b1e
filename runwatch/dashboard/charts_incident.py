"""The incident inbox's small chart: one metric around an incident's steps, its members
marked (a pure builder: frames in, a plotly figure out; no Streamlit here).

The curve is what ``data.series_view`` gives (step, value, superseded); each member is a
marker in its severity's colour and symbol, on the curve where it is an anomaly of the drawn
metric, hollow and pinned to the top of the panel otherwise (a crash, an anomaly on another
metric), so every member of the incident shows on one small chart.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from runwatch.dashboard.charts import (
    PALETTE,
    PIN_AT,
    REDONE_COLOR,
    SEVERITY_COLOR,
    SEVERITY_SYMBOL,
    base_layout,
    focus_range,
)

HEIGHT = 230


NEAR = 2
"""Points on each side of a member's step searched for its observed value: a downsampled
curve keeps a spike as its bucket's max, one or two points from the nearest step."""


def _on_curve(
    steps: np.ndarray, values: np.ndarray, at: np.ndarray, observed: np.ndarray
) -> np.ndarray:
    """Where each member sits on the curve: of the points around its step, the value
    closest to what the detector observed when that lies among them, else the nearest
    point's; NaN when there is no curve."""
    if steps.size == 0:
        return np.full(at.shape, np.nan)
    i = np.clip(np.searchsorted(steps, at), 0, steps.size - 1)
    left = np.clip(i - 1, 0, steps.size - 1)
    i = np.where(np.abs(steps[left] - at) <= np.abs(steps[i] - at), left, i)
    out = values[i].copy()
    for k, (j, seen) in enumerate(zip(i, observed, strict=True)):
        near = values[max(0, j - NEAR) : j + NEAR + 1]
        near = near[np.isfinite(near)]
        # A value off this curve's scale (a grad-norm precursor flags the loss with the
        # grad norm) says nothing about where on it the member is.
        if np.isfinite(seen) and near.size and near.min() <= seen <= near.max():
            out[k] = near[np.argmin(np.abs(near - seen))]
    return out


def _add_members(
    fig: go.Figure, x: np.ndarray, y: np.ndarray, labels: pd.Series, severity: str, curve: bool
) -> None:
    """One trace of members: filled on the curve, hollow when pinned to the top (an event,
    an anomaly on another metric)."""
    color = SEVERITY_COLOR[severity]
    symbol = SEVERITY_SYMBOL[severity] + ("" if curve else "-open")
    fig.add_scatter(
        x=x,
        y=y,
        mode="markers",
        name=f"{severity} member" + ("" if curve else " (not on this curve)"),
        marker={
            "color": color,
            "size": 11,
            "symbol": symbol,
            "line": {"width": 1.5, "color": "white" if curve and severity != "critical" else color},
        },
        hovertext=labels.tolist(),
        hovertemplate="step %{x}: %{hovertext}<extra>" + severity + "</extra>",
    )


def incident_figure(
    series: pd.DataFrame, marks: pd.DataFrame, metric: str | None, *, height: int = HEIGHT
) -> go.Figure:
    """``metric``'s curve (``series``: step, value, optionally superseded) with the
    incident's ``marks`` (step, severity, label, on_curve, observed;
    ``inbox.member_marks``).

    One trace per severity and placement holds its markers (a 37-spike incident is 37
    points in one trace, not 37 traces). Non-finite values and off-curve members sit near
    the top of the panel; the y-range leaves out the run's initial fall
    (``charts.focus_range``); the earlier attempts' redone steps are a faded line.
    """
    fig = go.Figure()
    live = series[~series["superseded"]] if "superseded" in series else series
    old = series[series["superseded"]] if "superseded" in series else series.iloc[:0]
    if len(old):
        fig.add_scatter(
            x=old["step"].to_numpy(),
            y=old["value"].to_numpy(dtype=float),
            mode="lines",
            name="redone steps",
            line={"color": REDONE_COLOR, "width": 1},
            opacity=0.7,
            hovertemplate="redone step %{x}: %{y:.4g}<extra></extra>",
        )
    steps = live["step"].to_numpy(dtype=float)
    values = live["value"].to_numpy(dtype=float)
    fig.add_scatter(
        x=steps,
        y=values,
        mode="lines",
        name=metric or "",
        line={"color": PALETTE[0], "width": 1.4},
        hovertemplate="step %{x}: %{y:.4g}<extra></extra>",
    )
    at = marks["step"].to_numpy(dtype=float) if len(marks) else np.array([])
    on_curve = marks["on_curve"].to_numpy(dtype=bool) if len(marks) else np.array([], bool)
    observed = (
        pd.to_numeric(marks["observed"], errors="coerce").to_numpy(dtype=float)
        if "observed" in marks
        else np.full(at.shape, np.nan)
    )
    y = _on_curve(steps, values, at, observed)
    on = on_curve & np.isfinite(y)
    # The run's initial fall would squash the window into a flat line (a spike pattern
    # from step 100 on): the y-range leaves it out and keeps every member on the curve.
    y_range = focus_range(
        live.assign(x=live["step"]), keep=pd.DataFrame({"x": at[on], "value": y[on]})
    )
    finite = values[np.isfinite(values)]
    if y_range is not None:
        top = y_range[0] + PIN_AT * (y_range[1] - y_range[0])
    else:
        top = float(finite.max()) if finite.size else 1.0
    y = np.where(on, y, top)
    for severity in ("info", "warning", "critical"):
        for curve in (True, False):
            mine = ((marks["severity"] == severity).to_numpy()) & (on_curve == curve)
            if mine.any():
                _add_members(fig, at[mine], y[mine], marks.loc[mine, "label"], severity, curve)
    base_layout(fig, height)
    y_axis: dict[str, Any] = {"title": {"text": metric or "", "font": {"size": 11}}}
    if y_range is not None:
        y_axis.update(range=y_range, autorange=False)
    layout: dict[str, Any] = {
        "margin": {"l": 48, "r": 8, "t": 8, "b": 32},
        "showlegend": False,
        "hovermode": "closest",
        "xaxis": {"title": None},
        "yaxis": y_axis,
    }
    fig.update_layout(**layout)
    return fig
