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
    REDONE_COLOR,
    SEVERITY_COLOR,
    SEVERITY_SYMBOL,
    base_layout,
)

HEIGHT = 230


def _nearest(steps: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The value at the step nearest each of ``at`` (NaN when there is no curve)."""
    if steps.size == 0:
        return np.full(at.shape, np.nan)
    i = np.clip(np.searchsorted(steps, at), 0, steps.size - 1)
    left = np.clip(i - 1, 0, steps.size - 1)
    i = np.where(np.abs(steps[left] - at) <= np.abs(steps[i] - at), left, i)
    return values[i]


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
    incident's ``marks`` (step, severity, label, on_curve; ``inbox.member_marks``).

    One trace per severity and placement holds its markers (a 37-spike incident is 37
    points in one trace, not 37 traces). Non-finite values and off-curve members sit at the
    top of the finite data; the earlier attempts' redone steps are a faded line.
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
    finite = values[np.isfinite(values)]
    top = float(finite.max()) if finite.size else 1.0
    if len(marks):
        at = marks["step"].to_numpy(dtype=float)
        y = _nearest(steps, values, at)
        on_curve = marks["on_curve"].to_numpy(dtype=bool)
        y = np.where(on_curve & np.isfinite(y), y, top)
        for severity in ("info", "warning", "critical"):
            for curve in (True, False):
                mine = ((marks["severity"] == severity).to_numpy()) & (on_curve == curve)
                if mine.any():
                    _add_members(fig, at[mine], y[mine], marks.loc[mine, "label"], severity, curve)
    base_layout(fig, height)

    layout: dict[str, Any] = {
        "margin": {"l": 48, "r": 8, "t": 8, "b": 32},
        "showlegend": False,
        "hovermode": "closest",
        "xaxis": {"title": None},
        "yaxis": {"title": {"text": metric or "", "font": {"size": 11}}},
    }
    fig.update_layout(**layout)
    return fig
