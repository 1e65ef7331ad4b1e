"""Pure chart builders for one run: frames in, a plotly figure out (no Streamlit here).

One figure holds every panel on one shared x-axis (loss on top, tall; grad norm, LR,
throughput, step time below), so zooming one zooms all and a loss spike sits right above
the grad-norm burst that caused it: symptoms side by side, in time.

Frames are already downsampled and carry an ``x`` column (step, wall time or tokens); the
builders only draw. Raw points are always drawn; with smoothing they fade (as in
TensorBoard) but stay, so a spike is never hidden by the EMA.

Traces are SVG (``go.Scatter``), not WebGL: with at most ``data.MAX_POINTS`` points per
trace SVG is quick everywhere, while WebGL on a machine without a GPU (a headless browser,
a remote desktop) falls back to software rendering and draws the Run page slower; it also
spends one WebGL context per panel, which browsers cap.

What plotly.js spends its drawing time on decides two more choices: redone steps are one
faded *line* per earlier attempt, not markers (a marker is an SVG node styled one by one),
and the run chart has fixed margins with axis automargin off (automargin measures every
tick label and then draws the whole figure a second time). Every axis's type is given and
tick labels are not checked for overflow, which spares plotly.js a scan of the data and a
measurement of every tick label. The measurements are in bench/README-dashboard.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

PALETTE = ("#2563eb", "#7c3aed", "#0d9488", "#ea580c", "#db2777", "#4b5563", "#65a30d")
SEVERITY_COLOR = {"info": "#eab308", "warning": "#f97316", "critical": "#dc2626"}
SEVERITY_SYMBOL = {"info": "circle", "warning": "diamond", "critical": "x"}
EXPECTED_COLOR = "#475569"
BAND_FILL = "rgba(100, 116, 139, 0.16)"
FORECAST_COLOR = "#16a34a"
REDONE_COLOR = "#9ca3af"
NAN_COLOR = "#b91c1c"
FONT = "Inter, system-ui, -apple-system, Segoe UI, sans-serif"
_GRID = {"showgrid": True, "gridcolor": "#eef0f3", "zeroline": False}
"""Every axis: a quiet grid, no zero line."""
_SPIKES = {"showspikes": True, "spikemode": "across", "spikethickness": 1, "spikecolor": "#9ca3af"}
"""Every x-axis: a thin line across the panel under the cursor."""


TEMPLATE = "plotly_white"


def _base_props(height: int) -> dict[str, Any]:
    """The layout every runwatch figure shares but its template: quiet, legend on top."""
    return {
        "height": height,
        "margin": {"l": 10, "r": 10, "t": 40, "b": 10},
        "font": {"family": FONT, "size": 12, "color": "#1f2937"},
        "legend": {
            "orientation": "h",
            "yanchor": "bottom",
            "y": 1.01,
            "x": 0,
            "font": {"size": 11},
        },
        "hoverlabel": {"font": {"size": 12}},
        "hovermode": "closest",
    }


def _new_figure(traces: list[dict[str, Any]], layout: dict[str, Any], height: int) -> go.Figure:
    """A figure built in one go from plain dicts, in the shared look (``base_layout``'s).

    One ``go.Figure(dict)`` validates the figure once; ``update_layout`` and friends validate
    and merge on every call, and merging the named template into an existing figure is the
    costliest of those merges. Here the template is a dict made once, which the constructor
    validates with the rest instead of merging it.
    """
    full = {"template": _template(), **_base_props(height), **layout}
    return go.Figure({"data": traces, "layout": full})


@functools.cache
def _template() -> dict[str, Any]:
    """The template as plain properties, looked up once (see ``_new_figure``)."""
    return pio.templates[TEMPLATE].to_plotly_json()


def base_layout(fig: go.Figure, height: int) -> go.Figure:
    """The look shared by every runwatch figure: white, quiet grid, legend on top."""
    fig.update_layout(template=TEMPLATE, **_base_props(height))
    fig.update_xaxes(**_GRID, **_SPIKES)
    fig.update_yaxes(**_GRID)
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


FOCUS_SKIP = 0.02
"""The share of a trace's first points always counted as its start (warm-up, a first
step that compiles): the focused y-range never has to hold them."""
FOCUS_BAND = 3.0
"""A curve has settled once its rolling median is within this many late-run spreads
(the 5-95% range of its second half) of the late-run median."""
FOCUS_GAIN = 1.5
"""Focus only when it helps: the full data must span this many times the focused range."""
FOCUS_MARGIN = 0.06
"""Room above and below the focused data, as a share of its span."""
PIN_AT = 0.88
"""How high in a focused panel a NaN's marker sits, as a share of the range."""


def focus_range(
    frame: pd.DataFrame, *, log: bool = False, keep: pd.DataFrame | None = None
) -> list[float] | None:
    """The y-range of a panel that leaves out the curve's initial fall, or None (autorange).

    A loss that falls from 10 to 3 in the first steps would otherwise squash the rest of
    the run, the part that matters, into a flat line. The fall ends where the curve's
    rolling median first comes within ``FOCUS_BAND`` late-run spreads of the late-run
    median (robust quantiles of the second half), and never before the first
    ``FOCUS_SKIP`` of the points. The range then spans *every* value after that point, not
    a quantile of them: a one-step spike later in the run stays on screen at full height.
    Earlier attempts' redone points and the ``keep`` marks (x, value: anomaly markers, the
    expected band, the forecast) are held in view when they lie past the fall. Nothing is
    cut from the data: the figure keeps every point, and a double click autoranges.

    Parameters
    ----------
    frame
        The panel's frame (``x``, ``value``, optionally ``superseded``), in x order.
    log
        The axis is logarithmic: the range is in decades (plotly's log-axis units), and
        values <= 0 are left out.
    keep
        Marks (columns ``x`` and ``value``) to keep in view if they lie past the fall.

    Returns
    -------
    list of float or None
        ``[low, high]`` in axis units, or None when the full data spans less than
        ``FOCUS_GAIN`` times that range (autorange shows it well enough).
    """
    live = frame[~frame["superseded"]] if "superseded" in frame else frame
    y = _axis_units(live["value"], log)
    ok = np.isfinite(y)
    y, xs = y[ok], live["x"].to_numpy()[ok]
    n = y.size
    if n < 20:
        return None
    late = y[n // 2 :]
    mid = float(np.median(late))
    q05, q95 = np.quantile(late, [0.05, 0.95])
    spread = float(q95 - q05) or max(abs(mid) * 1e-3, 1e-12)
    rolling = pd.Series(y).rolling(max(5, n // 100), center=True, min_periods=1).median()
    skip = max(1, math.ceil(FOCUS_SKIP * n))
    settled = np.flatnonzero(
        np.abs(rolling.to_numpy()[skip : n // 2 + 1] - mid) <= FOCUS_BAND * spread
    )
    knee = skip + int(settled[0]) if settled.size else skip
    after = [y[knee:]]
    start = xs[knee]
    marks = [frame[frame["superseded"]]] if "superseded" in frame else []
    if keep is not None and len(keep):
        marks.append(keep)
    for mark in marks:
        past = mark[(mark["x"] >= start).to_numpy()]
        values = _axis_units(past["value"], log)
        after.append(values[np.isfinite(values)])
    shown = np.concatenate(after)
    low, high = float(shown.min()), float(shown.max())
    margin = FOCUS_MARGIN * (high - low) if high > low else max(abs(high) * 0.05, 1e-9)
    low, high = low - margin, high + margin
    whole = np.concatenate([y, shown])
    if whole.max() - whole.min() <= FOCUS_GAIN * (high - low):
        return None
    return [low, high]


def _axis_units(values: Any, log: bool) -> np.ndarray:
    """Values as plotly places them on the axis: log10 on a log axis (NaN for <= 0)."""
    v = np.asarray(values, dtype=float)
    if not log:
        return v
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(v > 0, np.log10(np.where(v > 0, v, 1.0)), np.nan)


def _pin_height(y_range: list[float] | None, log: bool) -> float | None:
    """Where a mark without a finite value (a NaN) sits in a focused panel: near its top,
    low enough for its label to show (the top of the data would be the initial fall, off
    screen)."""
    if y_range is None:
        return None
    low, high = y_range
    top = low + (high - low) * PIN_AT
    return float(10**top) if log else float(top)


def _per_attempt(old: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """x and y of the redone steps as one line per earlier attempt, a gap between them.

    Two earlier attempts can cover the same steps (a crash, then another before the first
    crash point), so the points are grouped by attempt before they are joined into a line.
    """
    if "attempt" not in old or old["attempt"].nunique() <= 1:
        return old["x"].to_numpy(), old["value"].to_numpy(dtype=float)
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    for _, part in old.groupby("attempt", sort=True):
        if xs:  # a gap: plotly breaks a line at a null y (connectgaps=False)
            xs.append(part["x"].to_numpy()[:1])
            ys.append(np.array([np.nan]))
        xs.append(part["x"].to_numpy())
        ys.append(part["value"].to_numpy(dtype=float))
    return np.concatenate(xs), np.concatenate(ys)


class _Spec:
    """A figure being built as plain dicts: traces, shapes and annotations.

    plotly's incremental API (``add_trace(row=)``, ``add_vline(row="all")``,
    ``update_xaxes``) validates and merges on every call; one ``go.Figure(dict)`` at the end
    validates the same figure once (bench/README-dashboard.md).
    """

    def __init__(self) -> None:
        self.traces: list[dict[str, Any]] = []
        self.shapes: list[dict[str, Any]] = []
        self.annotations: list[dict[str, Any]] = []

    def trace(self, row: int, **props: Any) -> None:
        self.traces.append(
            {"type": "scatter", "xaxis": _axis("x", row), "yaxis": _axis("y", row), **props}
        )

    def span(self, row: int, x0: Any, x1: Any, **props: Any) -> None:
        """A shaded x-range over one panel's full height (an anomaly episode)."""
        self._shape("rect", row, x0, x1, line={"width": 0}, **props)

    def vline(self, row: int, x: Any, **props: Any) -> None:
        """A vertical line over one panel's full height (a restart)."""
        self._shape("line", row, x, x, **props)

    def _shape(self, kind: str, row: int, x0: Any, x1: Any, **props: Any) -> None:
        self.shapes.append(
            {
                "type": kind,
                "x0": x0,
                "x1": x1,
                "y0": 0,
                "y1": 1,
                "xref": _axis("x", row),
                "yref": _axis("y", row) + " domain",
                **props,
            }
        )


def _axis(letter: str, row: int) -> str:
    """plotly's axis id for a row: ``x``, ``x2``, ... (the first has no number)."""
    return letter if row == 1 else f"{letter}{row}"


def _axis_key(letter: str, row: int) -> str:
    """The layout key of a row's axis: ``xaxis``, ``xaxis2``, ..."""
    return f"{letter}axis{'' if row == 1 else row}"


def _small(values: Any) -> np.ndarray:
    """float32 for drawn values: 7 digits are more than a screen shows (hover prints 4), and
    the figure sent to the browser is a third smaller."""
    return np.asarray(values, dtype=np.float32)


def _add_series(
    spec: _Spec,
    row: int,
    name: str,
    frame: pd.DataFrame,
    color: str,
    smoothed: bool,
    pin: float | None = None,
) -> None:
    live = frame[~frame["superseded"]] if "superseded" in frame else frame
    old = frame[frame["superseded"]] if "superseded" in frame else frame.iloc[:0]
    if len(old):
        x, y = _per_attempt(old)
        spec.trace(
            row,
            x=x,
            y=_small(y),
            mode="lines",
            name="redone steps (lost work)",
            line={"color": REDONE_COLOR, "width": 1.2},
            opacity=0.7,
            connectgaps=False,
            legendgroup="redone",
            showlegend=row == 1,
            hovertemplate="redone step %{x}: %{y:.4g}<extra>earlier attempt</extra>",
        )
    spec.trace(
        row,
        x=live["x"].to_numpy(),
        y=_small(live["value"]),
        mode="lines",
        name=name,
        line={"color": color, "width": 1.2 if smoothed else 1.6},
        opacity=0.3 if smoothed else 1.0,
        legendgroup=name,
        # Panels are titled; the legend only explains the top (loss) panel's marks.
        showlegend=row == 1 and not smoothed,
        hovertemplate="%{y:.4g}<extra>" + name + "</extra>",
    )
    if smoothed and "smooth" in live:
        spec.trace(
            row,
            x=live["x"].to_numpy(),
            y=_small(live["smooth"]),
            mode="lines",
            name=f"{name} (EMA; raw faded)",
            line={"color": color, "width": 2},
            legendgroup=name,
            showlegend=row == 1,
            hovertemplate="%{y:.4g}<extra>" + name + " EMA</extra>",
        )
    bad = live[~np.isfinite(live["value"].to_numpy(dtype=float))]
    if len(bad):
        spec.trace(
            row,
            x=bad["x"].to_numpy(),
            y=[_finite_top(live) if pin is None else pin] * len(bad),
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
        )


def _add_expected(
    spec: _Spec,
    expected: pd.DataFrame,
    forecast: dict[str, Any] | None,
    name: str = "expected",
) -> None:
    x = expected["x"].to_numpy()
    spec.trace(
        1,
        x=x,
        y=expected["upper"].to_numpy(dtype=float),
        mode="lines",
        line={"width": 0},
        showlegend=False,
        hoverinfo="skip",
        legendgroup="expected",
    )
    spec.trace(
        1,
        x=x,
        y=expected["lower"].to_numpy(dtype=float),
        mode="lines",
        line={"width": 0},
        fill="tonexty",
        fillcolor=BAND_FILL,
        name="expected band (90%)",
        hoverinfo="skip",
        legendgroup="expected",
    )
    spec.trace(
        1,
        x=x,
        y=expected["expected"].to_numpy(dtype=float),
        mode="lines",
        name=name,
        line={"color": EXPECTED_COLOR, "width": 1.5, "dash": "dash"},
        legendgroup="expected",
        hovertemplate=name + " %{y:.4g}<extra></extra>",
    )
    if forecast is not None:
        lo, hi, mid = forecast["lower"], forecast["upper"], forecast["predicted"]
        spec.trace(
            1,
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
        )


def _add_anomalies(
    spec: _Spec,
    rows: dict[str, int],
    frames: dict[str, pd.DataFrame],
    anomalies: pd.DataFrame,
    pins: dict[int, float | None],
) -> None:
    shown: set[tuple[str, str]] = set()
    for rec in anomalies.itertuples(index=False):
        row = rows.get(rec.metric)
        if row is None:
            continue
        judged = getattr(rec, "state", "needs verdict") != "needs verdict"
        color = SEVERITY_COLOR.get(rec.severity, "#6b7280")
        if rec.x1 != rec.x0:
            spec.span(row, rec.x0, rec.x1, fillcolor=color, opacity=0.06 if judged else 0.14)
        y = _value_at(frames[rec.metric], rec.x0)
        if not np.isfinite(y):
            pin = pins.get(row)
            y = _finite_top(frames[rec.metric]) if pin is None else pin
        # A member of an incident is drawn as the incident (its severity and status);
        # customdata carries the anomaly id and, when there is one, the incident id.
        incident = getattr(rec, "incident", None)
        noun = "anomaly" if incident is None or pd.isna(incident) else "incident"
        spec.trace(
            row,
            x=[rec.x0],
            y=[y],
            mode="markers",
            customdata=[[int(rec.id)] if noun == "anomaly" else [int(rec.id), int(incident)]],
            name=f"{rec.severity} {noun}",
            legendgroup=f"{noun}-{rec.severity}",
            showlegend=(rec.severity, noun) not in shown,
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
            hovertext=[rec.message if noun == "incident" else f"#{int(rec.id)} {rec.message}"],
            hovertemplate="%{hovertext}<extra>" + rec.severity + "</extra>",
        )
        shown.add((rec.severity, noun))


def _grid(titles: Sequence[str], spacing: float = 0.035) -> dict[str, Any]:
    """Stacked panels on one shared x-axis, as ``make_subplots(shared_xaxes=True)`` lays
    them out: the first row 42% of the height, the others sharing the rest, every x-axis
    matching the bottom one (zoom one, zoom all), panel titles above each row."""
    n = max(1, len(titles))
    shares = [1.0] if n == 1 else [0.42] + [0.58 / (n - 1)] * (n - 1)
    usable = 1.0 - spacing * (n - 1)
    layout: dict[str, Any] = {"annotations": []}
    top = 1.0
    # Tick labels are not measured one by one to hide those past the figure's edge (the
    # fixed margins leave them room); the y-axes' type is given, not guessed from the data.
    grid = {**_GRID, "automargin": False, "ticklabeloverflow": "allow"}
    for i, share in enumerate(shares, start=1):
        bottom = max(0.0, top - usable * share)
        x: dict[str, Any] = {
            **grid,
            "anchor": _axis("y", i),
            "domain": [0.0, 1.0],
            **_SPIKES,
        }
        if i < n:
            x.update(matches=_axis("x", n), showticklabels=False)
        layout[_axis_key("x", i)] = x
        layout[_axis_key("y", i)] = {
            **grid,
            "anchor": _axis("x", i),
            "domain": [bottom, top],
            "type": "linear",
        }
        if i <= len(titles):
            layout["annotations"].append(
                {
                    "text": titles[i - 1],
                    "x": 0.5,
                    "xanchor": "center",
                    "xref": "paper",
                    "y": top,
                    "yanchor": "bottom",
                    "yref": "paper",
                    "showarrow": False,
                    "font": {"size": 16},
                }
            )
        top = bottom - spacing
    return layout


def run_figure(
    panels: Sequence[tuple[str, pd.DataFrame]],
    *,
    expected: pd.DataFrame | None = None,
    expected_name: str = "expected",
    forecast: dict[str, Any] | None = None,
    anomalies: pd.DataFrame | None = None,
    restarts: Sequence[tuple[Any, str]] = (),
    smoothed: bool = False,
    log_y: Sequence[str] = (),
    log_x: bool = False,
    x_title: str = "step",
    highlight: tuple[Any, Any] | None = None,
    height: int | None = None,
    focus: Sequence[str] = (),
) -> go.Figure:
    """The run chart: one row per (metric, frame), the first row tall and holding the
    expected curve (named ``expected_name``: "expected (family)" for a family's), its band
    and the forecast.

    ``anomalies`` has id, metric, x0, x1, y (observed), severity, message, state; each is a
    clickable marker (``customdata`` = anomaly id[, incident id]) and an episode is a shaded span.
    ``restarts`` are (x, label) drawn as vertical lines across every row. The panels
    of the ``focus`` metrics open on the part of the run after its initial fall
    (``focus_range``); their data is still drawn in full.
    """
    n = max(1, len(panels))
    base = _base_props(height or run_figure_height(n))  # the legend is merged below
    layout = _grid([m for m, _ in panels])
    spec = _Spec()
    rows = {metric: i + 1 for i, (metric, _) in enumerate(panels)}
    frames = dict(panels)
    pins: dict[int, float | None] = {}
    for i, (metric, frame) in enumerate(panels):
        row, log = i + 1, metric in log_y
        axis = layout[_axis_key("y", row)]
        if log:
            axis["type"] = "log"
        if metric in focus:
            keep = _marks_to_keep(row, metric, frame, expected, forecast, anomalies)
            y_range = focus_range(frame, log=log, keep=keep)
            if y_range is not None:
                axis.update(range=y_range, autorange=False)
            pins[row] = _pin_height(y_range, log)
        _add_series(spec, row, metric, frame, PALETTE[i % len(PALETTE)], smoothed, pins.get(row))
    if expected is not None and len(expected):
        _add_expected(spec, expected, forecast, expected_name)
    if anomalies is not None and len(anomalies):
        _add_anomalies(spec, rows, frames, anomalies, pins)
    for x, label in restarts:
        for row in range(1, n + 1):
            spec.vline(row, x, line={"color": "#111827", "width": 1.2, "dash": "dot"})
        spec.annotations.append(
            {
                "x": x,
                "y": 1.0,
                "xref": "x",
                "yref": "y domain",
                "text": label,
                "showarrow": False,
                "xanchor": "left",
                "yanchor": "top",
                "font": {"size": 11, "color": "#111827"},
                "bgcolor": "rgba(255,255,255,0.8)",
            }
        )
    if highlight is not None:
        for row in range(1, n + 1):
            spec.span(
                row, highlight[0], highlight[1], fillcolor="#fde68a", opacity=0.35, layer="below"
            )
    layout[_axis_key("x", n)]["title"] = {"text": x_title}
    x_type = "log" if log_x else _x_type(panels)
    for row in range(1, n + 1):
        layout[_axis_key("x", row)]["type"] = x_type
    layout["annotations"] += spec.annotations
    layout["shapes"] = spec.shapes
    layout.update(
        hovermode="x unified",
        uirevision="run",
        dragmode="zoom",
        # Room for tick labels ("3.8M", "-0.25"), the two-row legend and the date ticks of
        # the wall-time axis, fixed: automargin would draw the whole chart twice.
        margin={"l": 64, "r": 16, "t": 100, "b": 64, "autoexpand": False},
        # From the figure's top edge down (up to three rows), clear of the loss panel's
        # title: with fixed margins nothing pushes the panels down to make room.
        legend={**base["legend"], "yref": "container", "y": 1.0, "yanchor": "top"},
    )
    return _new_figure(spec.traces, layout, height=base["height"])


def _marks_to_keep(
    row: int,
    metric: str,
    frame: pd.DataFrame,
    expected: pd.DataFrame | None,
    forecast: dict[str, Any] | None,
    anomalies: pd.DataFrame | None,
) -> pd.DataFrame:
    """What a focused panel must keep in view (``focus_range``'s ``keep``): its anomaly
    markers, where they sit on the curve, and on the top panel the expected band and the
    forecast with its interval."""
    parts = []
    if anomalies is not None and len(anomalies):
        mine = anomalies[anomalies["metric"] == metric]
        if len(mine):
            ys = [_value_at(frame, x) for x in mine["x0"]]
            parts.append(pd.DataFrame({"x": mine["x0"].tolist(), "value": ys}))
    if row == 1 and expected is not None and len(expected):
        for column in ("lower", "upper"):
            parts.append(pd.DataFrame({"x": expected["x"], "value": expected[column]}))
    if row == 1 and forecast is not None:
        parts.append(
            pd.DataFrame(
                {"x": [forecast["x"]] * 2, "value": [forecast["lower"], forecast["upper"]]}
            )
        )
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["x", "value"])


def _x_type(panels: Sequence[tuple[str, pd.DataFrame]]) -> str:
    """The x-axes' type, given rather than guessed: plotly.js otherwise scans every axis's
    data to tell numbers from dates (wall time) when it draws."""
    for _, frame in panels:
        if len(frame) and pd.api.types.is_datetime64_any_dtype(frame["x"]):
            return "date"
    return "linear"


def placeholder_figure(height: int, text: str) -> go.Figure:
    """An empty chart of the final height, sent before the data is read.

    The browser starts running plotly.js (a large script Streamlit loads only when the first
    chart arrives; chart pages have it fetched with the page, ``streamlit_internals.py``)
    and reserves the chart's space while the server reads and fits; the real figure then
    replaces it in place, without the page jumping.
    """
    note = {
        "text": text,
        "showarrow": False,
        "xref": "paper",
        "yref": "paper",
        "x": 0.5,
        "y": 0.6,
        "font": {"size": 14, "color": "#6b7280"},
    }
    hidden = {**_GRID, **_SPIKES, "visible": False}
    layout = {"annotations": [note], "xaxis": hidden, "yaxis": {**_GRID, "visible": False}}
    return _new_figure([], layout, height)


def run_figure_height(panels: int) -> int:
    """The run chart's height in pixels: the loss panel tall, the others 150 px each."""
    return 460 if panels <= 1 else 360 + 150 * (panels - 1)


def anomaly_marks(anomalies: pd.DataFrame, to_x: Any) -> pd.DataFrame:
    """Anomalies as chart marks: id, metric, x0, x1, y, severity, message, state, and the
    incident id when the frame has one (``inbox.incident_anomalies``).

    ``to_x`` maps an array of steps to the chart's x values (step, time or tokens).
    """
    if anomalies.empty:
        return pd.DataFrame(
            columns=["id", "metric", "x0", "x1", "y", "severity", "message", "state"]
        )
    incident = {"incident": anomalies["incident"].to_numpy()} if "incident" in anomalies else {}
    return pd.DataFrame(
        {
            **incident,
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
