"""The family charts are pure: a family curve on the run chart, and the scaling view of a
run against its family (``scaling_view``'s dict in, figure out), checked on the figure."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from runwatch.dashboard.charts import run_figure
from runwatch.dashboard.charts_compare import family_scaling_figure, law_at, on_the_line


def _loss(n: int = 300) -> pd.DataFrame:
    step = np.arange(1, n + 1)
    value = 2.0 + 3.0 / np.sqrt(step)
    return pd.DataFrame(
        {
            "step": step,
            "time": step * 1.0,
            "value": value,
            "attempt": 1,
            "superseded": False,
            "smooth": value,
            "x": step,
        }
    )


def _curve(first: int, last: int) -> pd.DataFrame:
    step = np.unique(np.geomspace(first, last, 80).round())
    mean = 2.0 + 3.0 / np.sqrt(step)
    return pd.DataFrame(
        {"step": step, "expected": mean, "lower": mean * 0.97, "upper": mean * 1.03, "x": step}
    )


def _view(predicted: float, params: float = 3e6) -> dict:
    """A family law L = 5 * N^-0.07 (band +-2%), three runs on it, and the target."""
    grid = np.geomspace(5e4, 5e6, 40)
    law = [(float(p), 5 * p**-0.07, 5 * p**-0.07 * 0.98, 5 * p**-0.07 * 1.02) for p in grid]
    runs = [(name, p, 5 * p**-0.07) for name, p in (("s", 1e5), ("m", 3e5), ("l", 1e6))]
    forecast = {
        "params": params,
        "predicted": predicted,
        "lower": predicted * 0.99,
        "upper": predicted * 1.01,
        "upto": 800,
    }
    return {"runs": runs, "law": law, "forecast": forecast}


def test_a_family_curve_is_labelled_and_drawn_from_step_one_with_its_band() -> None:
    curve = _curve(1, 2000)
    fig = run_figure([("loss", _loss())], expected=curve, expected_name="expected (family)")
    by_name = {t.name: t for t in fig.data}
    line = by_name["expected (family)"]
    assert "expected" not in by_name
    assert line.x[0] == 1 and line.x[-1] == 2000
    assert "expected (family)" in line.hovertemplate
    band = by_name["expected band (90%)"]
    assert band.fill == "tonexty" and np.allclose(band.y, curve["lower"])
    # The band's upper edge is the trace the fill closes against, in the same legend group.
    upper = fig.data[list(fig.data).index(band) - 1]
    assert np.allclose(upper.y, curve["upper"]) and upper.legendgroup == band.legendgroup


def test_other_models_keep_their_plain_expected_label() -> None:
    fig = run_figure([("loss", _loss())], expected=_curve(150, 300))
    names = {t.name for t in fig.data}
    assert "expected" in names and "expected (family)" not in names


def test_law_at_interpolates_the_law_in_log_log() -> None:
    view = _view(1.0)
    for params in (1.23e5, 7.7e5, 3e6):  # between the law's samples: a power law is exact
        expected, lower, upper = law_at(view, params)
        assert expected == pytest.approx(5 * params**-0.07, rel=1e-9)
        assert lower == pytest.approx(expected * 0.98) and upper == pytest.approx(expected * 1.02)


@pytest.mark.parametrize(
    ("worse", "where"), [(1.0, "on"), (1.015, "on"), (1.05, "above"), (0.95, "below")]
)
def test_on_the_line_says_where_the_forecast_sits_against_the_band(worse, where) -> None:
    line_value = 5 * 3e6**-0.07
    got = on_the_line(_view(line_value * worse))
    assert got["where"] == where
    assert got["off"] == pytest.approx(worse - 1, abs=1e-9)
    assert got["expected"] == pytest.approx(line_value)


def test_scaling_figure_points_law_band_and_forecast_with_its_interval() -> None:
    view = _view(1.7)
    fig = family_scaling_figure(view, "xl", "loss")
    layout = fig.to_dict()["layout"]
    assert layout["xaxis"]["type"] == "log" and layout["yaxis"]["type"] == "log"
    assert layout["yaxis"]["title"]["text"] == "final loss"
    by_name = {t.name: t for t in fig.data}
    runs = by_name["family runs (final)"]
    assert list(runs.text) == ["s", "m", "l"] and "text" in runs.mode
    assert list(runs.x) == [1e5, 3e5, 1e6]
    assert np.allclose(runs.y, [5 * p**-0.07 for p in (1e5, 3e5, 1e6)])
    law = by_name["family law"]
    assert np.allclose(law.y, [r[1] for r in view["law"]]) and law.line.dash == "dash"
    band = by_name["family law band (90%)"]
    assert band.fill == "tonexty" and np.allclose(band.y, [r[2] for r in view["law"]])
    point = by_name["xl forecast"]
    assert list(point.x) == [3e6] and list(point.y) == [1.7] and list(point.text) == ["xl"]
    assert point.error_y.array[0] == pytest.approx(1.7 * 0.01)
    assert point.error_y.arrayminus[0] == pytest.approx(1.7 * 0.01)
