"""Chart builders are pure: frames in, figure out; checked on the figure's data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from runwatch.dashboard.charts import (
    anomaly_marks,
    focus_range,
    run_figure,
)
from runwatch.dashboard.charts_compare import compare_figure, scaling_figure
from runwatch.store.downsample import minmax_downsample


def _frame(n: int = 200, superseded_from: int | None = None) -> pd.DataFrame:
    step = np.arange(1, n + 1)
    value = 3.0 + 1.0 / step
    value[50] = np.nan
    frame = pd.DataFrame(
        {"step": step, "time": step * 1.0, "value": value, "attempt": 1, "superseded": False}
    )
    frame["smooth"] = frame["value"]
    frame["x"] = frame["step"]
    if superseded_from is not None:
        old = frame[frame["step"] >= superseded_from].assign(superseded=True)
        frame = pd.concat([frame, old], ignore_index=True)
    return frame


def _anomalies() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": [7, 9],
            "metric": ["loss", "grad_norm"],
            "start_step": [51, 100],
            "end_step": [51, 120],
            "severity": ["critical", "warning"],
            "observed": [np.nan, 5.0],
            "message": ["nan", "burst"],
            "state": ["needs verdict", "benign"],
        }
    )


def test_run_figure_stacks_panels_on_one_shared_x_axis() -> None:
    fig = run_figure([("loss", _frame()), ("grad_norm", _frame()), ("lr", _frame())])
    layout = fig.to_dict()["layout"]
    assert {a["text"] for a in layout["annotations"]} >= {"loss", "grad_norm", "lr"}
    assert layout["xaxis"]["matches"] == "x3" and layout["xaxis2"]["matches"] == "x3"
    assert layout["yaxis"]["domain"][1] - layout["yaxis"]["domain"][0] > 0.35  # loss is tall


def test_nan_values_are_marked_not_dropped() -> None:
    fig = run_figure([("loss", _frame())])
    marks = [t for t in fig.data if t.name == "non-finite"]
    assert len(marks) == 1 and list(marks[0].x) == [51] and list(marks[0].text) == ["NaN"]


def test_smoothing_fades_raw_points_but_keeps_them() -> None:
    fig = run_figure([("loss", _frame())], smoothed=True)
    raw = [t for t in fig.data if t.name == "loss"]
    smooth = [t for t in fig.data if t.name and "EMA" in t.name]
    assert len(raw) == 1 and len(raw[0].y) == 200 and raw[0].opacity == pytest.approx(0.3)
    assert len(smooth) == 1


def test_redone_steps_are_drawn_faded_and_restarts_as_lines() -> None:
    fig = run_figure([("loss", _frame(superseded_from=150))], restarts=[(150, "restart #2")])
    redone = [t for t in fig.data if t.name == "redone steps (lost work)"]
    assert len(redone) == 1 and len(redone[0].x) == 51
    shapes = fig.to_dict()["layout"]["shapes"]
    assert any(s["type"] == "line" and s["x0"] == 150 for s in shapes)
    assert any(a["text"] == "restart #2" for a in fig.to_dict()["layout"]["annotations"])


def test_anomalies_are_clickable_markers_on_their_own_panel_and_episodes_shaded() -> None:
    marks = anomaly_marks(_anomalies(), lambda steps: steps)
    fig = run_figure([("loss", _frame()), ("grad_norm", _frame())], anomalies=marks)
    markers = [t for t in fig.data if t.customdata is not None]
    assert [int(t.customdata[0][0]) for t in markers] == [7, 9]
    assert markers[0].yaxis == "y" and markers[1].yaxis == "y2"
    assert markers[1].marker.opacity < markers[0].marker.opacity  # judged ones recede
    rects = [s for s in fig.to_dict()["layout"]["shapes"] if s["type"] == "rect"]
    assert [(r["x0"], r["x1"]) for r in rects] == [(100, 120)]


def test_expected_band_and_forecast_are_drawn_on_the_loss_panel() -> None:
    exp = pd.DataFrame(
        {"x": [100, 200], "expected": [3.0, 2.9], "lower": [2.8, 2.7], "upper": [3.2, 3.1]}
    )
    fc = {"x": 400, "predicted": 2.8, "lower": 2.6, "upper": 3.0}
    fig = run_figure([("loss", _frame())], expected=exp, forecast=fc, log_y=["loss"])
    names = {t.name for t in fig.data}
    assert {"expected", "expected band (90%)", "forecast final"} <= names
    band = next(t for t in fig.data if t.name == "expected band (90%)")
    assert band.fill == "tonexty"
    assert fig.layout.yaxis.type == "log"


def test_a_one_step_spike_in_a_million_survives_to_the_figure() -> None:
    n = 1_000_000
    frame = pd.DataFrame({"step": np.arange(n), "value": np.ones(n)})
    frame.loc[654_321, "value"] = 40.0
    small = minmax_downsample(frame, 4000).assign(x=lambda f: f["step"], superseded=False)
    fig = run_figure([("loss", small)])
    line = next(t for t in fig.data if t.name == "loss")
    assert len(line.y) <= 4000 and max(line.y) == 40.0


def test_compare_overlays_one_line_per_run() -> None:
    fig = compare_figure({"a": _frame(), "b": _frame()}, metric="loss", log_x=True)
    assert [t.name for t in fig.data] == ["a", "b"] and fig.layout.xaxis.type == "log"


def test_scaling_figure_draws_runs_and_the_fitted_law() -> None:
    points = pd.DataFrame(
        {
            "run": ["s", "m", "big"],
            "compute": [1e18, 1e19, 1e20],
            "loss": [3.0, 2.7, 2.5],
            "lower": [None, None, 2.4],
            "upper": [None, None, 2.6],
            "kind": ["final", "final", "forecast"],
        }
    )
    fig = scaling_figure(points, (10.0, 0.05))
    kinds = {t.name: t for t in fig.data}
    assert set(kinds) == {"final loss", "forecast loss", "fit: L = 10·C^(-0.050)"}
    assert list(kinds["forecast loss"].error_y.array) == pytest.approx([0.1])
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"


def test_redone_steps_of_two_earlier_attempts_are_separate_lines() -> None:
    """Attempts 1 and 2 both redid steps 150..; joining them would draw a false zigzag."""
    live = _frame()
    first = live[live["step"] >= 150].assign(superseded=True, attempt=1)
    second = live[live["step"].between(170, 180)].assign(superseded=True, attempt=2)
    frame = pd.concat([live.assign(attempt=3), first, second], ignore_index=True)
    frame = frame.sort_values(["step", "attempt"], kind="stable")  # as the store returns them
    fig = run_figure([("loss", frame)])
    (redone,) = [t for t in fig.data if t.name == "redone steps (lost work)"]
    assert redone.mode == "lines" and redone.connectgaps is False
    x, y = np.asarray(redone.x), np.asarray(redone.y, dtype=float)
    gaps = np.flatnonzero(np.isnan(y))  # the frame's own NaN (step 51) is not a redone step
    assert len(gaps) == 1  # one break, between the two attempts
    assert list(x[: gaps[0]]) == first["step"].tolist()
    assert list(x[gaps[0] + 1 :]) == second["step"].tolist()


def test_restarts_and_the_highlight_span_every_panel() -> None:
    fig = run_figure(
        [("loss", _frame()), ("grad_norm", _frame()), ("lr", _frame())],
        restarts=[(150, "restart #2")],
        highlight=(10, 20),
    )
    shapes = fig.to_dict()["layout"]["shapes"]
    lines = [s for s in shapes if s["type"] == "line"]
    spans = [s for s in shapes if s["type"] == "rect"]
    assert sorted(s["yref"] for s in lines) == ["y domain", "y2 domain", "y3 domain"]
    assert all(s["x0"] == s["x1"] == 150 for s in lines)
    assert sorted(s["xref"] for s in spans) == ["x", "x2", "x3"]
    assert all((s["x0"], s["x1"]) == (10, 20) for s in spans)


def test_panels_share_one_x_axis_and_only_the_bottom_one_has_tick_labels() -> None:
    fig = run_figure([("loss", _frame()), ("grad_norm", _frame())], x_title="tokens")
    layout = fig.to_dict()["layout"]
    assert layout["xaxis"]["showticklabels"] is False
    assert layout["xaxis2"].get("showticklabels", True) is True
    assert layout["xaxis2"]["title"]["text"] == "tokens"
    top, bottom = layout["yaxis"]["domain"], layout["yaxis2"]["domain"]
    assert bottom[1] < top[0]  # stacked, not overlapping
    assert [t.yaxis for t in fig.data if t.name in ("loss", "grad_norm")] == ["y", "y2"]


def test_axis_types_are_given_so_plotly_never_guesses_them_from_the_data() -> None:
    panels = [("loss", _frame()), ("grad_norm", _frame())]
    layout = run_figure(panels, log_y=["loss"]).to_dict()["layout"]
    assert [layout[a]["type"] for a in ("xaxis", "xaxis2")] == ["linear", "linear"]
    assert [layout[a]["type"] for a in ("yaxis", "yaxis2")] == ["log", "linear"]
    assert {layout[a]["ticklabeloverflow"] for a in ("xaxis", "yaxis2")} == {"allow"}
    in_time = [(m, f.assign(x=pd.to_datetime(f["time"], unit="s", utc=True))) for m, f in panels]
    assert run_figure(in_time).layout.xaxis2.type == "date"
    assert run_figure(panels, log_x=True).layout.xaxis.type == "log"


def test_the_run_chart_and_its_placeholder_share_the_look_of_every_figure() -> None:
    from plotly import graph_objects as go

    from runwatch.dashboard.charts import base_layout, placeholder_figure

    shared = base_layout(go.Figure(), 500).layout
    fig = run_figure([("loss", _frame()), ("lr", _frame())])
    empty = placeholder_figure(510, "reading the run…")
    for layout in (fig.layout, empty.layout):
        assert layout.template == shared.template
        assert layout.font == shared.font and layout.legend.orientation == "h"
    assert fig.layout.height == 510 and fig.layout.legend.yref == "container"
    assert empty.layout.height == 510 and not empty.data
    assert empty.layout.annotations[0].text == "reading the run…"
    assert empty.layout.xaxis.visible is False and empty.layout.yaxis.visible is False


def _falling(n: int = 2000, seed: int = 0) -> pd.DataFrame:
    """A loss that falls 10 -> ~3 in the first few % of steps, then creeps down with noise."""
    rng = np.random.default_rng(seed)
    step = np.arange(1, n + 1)
    value = 3.0 + 7.0 * np.exp(-step / 25.0) - 0.2 * step / n
    value *= 1 + 0.01 * rng.standard_normal(n)
    return pd.DataFrame({"step": step, "x": step, "value": value, "superseded": False})


def test_the_loss_panel_opens_past_the_initial_fall_with_every_point_still_drawn() -> None:
    frame = _falling()
    later = frame[frame["step"] > 200]["value"]
    fig = run_figure([("loss", frame), ("lr", _frame())], focus=["loss"])
    layout = fig.to_dict()["layout"]
    low, high = layout["yaxis"]["range"]
    assert layout["yaxis"]["autorange"] is False
    # Everything after the fall is in view, with a small margin; the fall (10 -> 4) is not.
    assert low < later.min() and high > later.max()
    assert high - low < 0.25 * (frame["value"].max() - frame["value"].min())
    assert high < 4.0
    # ... and nothing is cut from the data: a double click (autorange) shows it all.
    loss = next(t for t in fig.data if t.name == "loss")
    assert len(loss.y) == len(frame) and max(loss.y) == pytest.approx(frame["value"].max())
    # Only the panels asked for are focused.
    assert "range" not in layout["yaxis2"]
    assert "range" not in run_figure([("loss", frame)]).to_dict()["layout"]["yaxis"]


def test_focus_on_a_log_axis_is_in_decades() -> None:
    frame = _falling()
    low, high = focus_range(frame, log=True)
    later = frame[frame["step"] > 200]["value"]
    assert 10**low < later.min() and 10**high > later.max() and 10**high < 4.0
    fig = run_figure([("loss", frame)], focus=["loss"], log_y=["loss"])
    assert fig.layout.yaxis.type == "log" and list(fig.layout.yaxis.range) == [low, high]


def test_a_spike_after_the_fall_stays_on_screen_at_full_height() -> None:
    frame = _falling()
    frame.loc[1500, "value"] = 6.0  # one step, as min/max downsampling keeps it
    low, high = focus_range(frame)
    assert high > 6.0 and low < 3.0 and high < 7.0  # the fall (10 -> 6) stays out
    frame.loc[1500, "value"] = 25.0  # higher than the fall: autorange shows both
    assert focus_range(frame) is None


def test_a_curve_without_an_initial_fall_keeps_autorange() -> None:
    rng = np.random.default_rng(1)
    flat = pd.DataFrame({"x": np.arange(500), "value": 3.0 + 0.05 * rng.standard_normal(500)})
    assert focus_range(flat) is None
    assert focus_range(_falling(n=10)) is None  # too few points to tell
    assert "range" not in run_figure([("loss", flat)], focus=["loss"]).to_dict()["layout"]["yaxis"]


def test_focus_keeps_markers_forecast_and_redone_steps_past_the_fall_in_view() -> None:
    frame = _falling()
    old = frame[frame["step"] > 1200].assign(superseded=True, value=lambda f: f["value"] + 1.5)
    with_redone = pd.concat([frame, old], ignore_index=True)
    assert focus_range(with_redone)[1] > old["value"].max()
    marks = pd.DataFrame({"x": [5, 1900], "value": [9.0, 2.0]})  # one in the fall, one after
    low, high = focus_range(frame, keep=marks)
    assert low < 2.0 and high < 4.0  # the mark in the fall does not widen it
    fc = {"x": 2500, "predicted": 2.5, "lower": 2.3, "upper": 2.7}
    fig = run_figure([("loss", frame)], forecast=fc, expected=_expected(), focus=["loss"])
    assert fig.layout.yaxis.range[0] < 2.3


def _expected() -> pd.DataFrame:
    x = np.arange(300, 2001, 100)
    return pd.DataFrame({"x": x, "expected": 2.9, "lower": 2.8, "upper": 3.0})


def test_a_nan_in_a_focused_panel_is_pinned_inside_the_range() -> None:
    frame = _falling()
    frame.loc[1000, "value"] = np.nan
    anomalies = pd.DataFrame(
        {
            "id": [1],
            "metric": ["loss"],
            "start_step": [1001],
            "end_step": [1001],
            "severity": ["critical"],
            "observed": [np.nan],
            "message": ["nan"],
            "state": ["needs verdict"],
        }
    )
    marks = anomaly_marks(anomalies, lambda steps: steps)
    fig = run_figure([("loss", frame)], anomalies=marks, focus=["loss"])
    low, high = fig.layout.yaxis.range
    (nan,) = [t for t in fig.data if t.name == "non-finite"]
    (marker,) = [t for t in fig.data if t.customdata is not None]
    assert low < nan.y[0] < high and low < marker.y[0] < high


def test_focus_works_on_the_wall_time_axis() -> None:
    frame = _falling()
    frame["x"] = pd.to_datetime(1.7e9 + frame["step"] * 2.0, unit="s", utc=True)
    to_time = lambda steps: pd.to_datetime(1.7e9 + np.asarray(steps) * 2.0, unit="s", utc=True)  # noqa: E731
    anomalies = _anomalies().assign(metric="loss", observed=[np.nan, 3.0])
    fig = run_figure([("loss", frame)], anomalies=anomaly_marks(anomalies, to_time), focus=["loss"])
    assert fig.layout.yaxis.range[1] < 4.0 and fig.layout.xaxis.type == "date"
