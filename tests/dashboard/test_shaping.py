"""The rules a person reads off the pages: smoothing, health, axes, compute, the law."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from runwatch.dashboard import shaping, ui
from runwatch.pipeline import runconfig


def test_ema_matches_tensorboard_debiased_smoothing() -> None:
    values = np.array([1.0, 2.0, 3.0, 4.0])
    w = 0.6
    last, expected = 0.0, []
    for k, v in enumerate(values, start=1):  # TensorBoard's loop, written out
        last = last * w + (1 - w) * v
        expected.append(last / (1 - w**k))
    assert shaping.ema(values, w) == pytest.approx(expected)


def test_ema_lets_nan_through_without_poisoning_later_points() -> None:
    out = shaping.ema(np.array([1.0, np.nan, 1.0, np.inf, 1.0]), 0.9)
    assert np.isnan(out[1]) and np.isinf(out[3])
    assert out[[0, 2, 4]] == pytest.approx([1.0, 1.0, 1.0])


def test_ema_zero_weight_is_raw_and_bad_weight_is_refused() -> None:
    assert shaping.ema(np.array([3.0, 1.0]), 0.0).tolist() == [3.0, 1.0]
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        shaping.ema(np.array([1.0]), 1.0)


def _anoms(*rows: tuple[str, str | None]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["severity", "verdict"])


def test_health_is_worst_unjudged_severity_and_benign_verdicts_clear_it() -> None:
    assert shaping.health_of(_anoms()) == "healthy"
    assert shaping.health_of(_anoms(("info", None))) == "healthy"
    assert shaping.health_of(_anoms(("warning", None), ("info", None))) == "warning"
    assert shaping.health_of(_anoms(("critical", None), ("warning", None))) == "critical"
    assert shaping.health_of(_anoms(("critical", "benign"), ("warning", None))) == "warning"
    assert shaping.health_of(_anoms(("critical", "real"))) == "critical"
    assert shaping.health_of(_anoms(("critical", "watch"))) == "healthy"


def test_pick_source_prefers_live_anomalies_and_falls_back_to_replay() -> None:
    frame = pd.DataFrame(
        {"run": ["a", "a", "b"], "source": ["live", "replay", "replay"], "id": [1, 2, 3]}
    )
    assert shaping.pick_source(frame)["id"].tolist() == [1, 3]


def test_tokens_per_step_from_config_or_from_throughput_times_step_time() -> None:
    assert runconfig.tokens_per_step({"tokens_per_step": 2048}) == 2048.0
    sample = pd.DataFrame({"tokens_per_s": [1000.0, 2000.0, np.nan], "step_time_s": [2.0, 1.0, 1]})
    assert runconfig.tokens_per_step({}, sample) == 2000.0
    assert runconfig.tokens_per_step({}, None) is None


def test_with_x_and_steps_to_x_agree_on_every_axis() -> None:
    frame = pd.DataFrame({"step": [10, 20], "time": [100.0, 200.0], "value": [1.0, 2.0]})
    assert shaping.with_x(frame, "tokens", 4.0)["x"].tolist() == [40.0, 80.0]
    assert shaping.steps_to_x([15], "tokens", 4.0, frame).tolist() == [60.0]
    times = shaping.with_x(frame, "wall time", None)["x"]
    assert times.iloc[0] == pd.Timestamp(100, unit="s", tz="UTC")
    assert shaping.steps_to_x([15], "wall time", None, frame)[0] == pd.Timestamp(
        150, unit="s", tz="UTC"
    )
    with pytest.raises(ValueError, match="unknown x axis"):
        shaping.with_x(frame, "epochs", None)


def test_compute_prefers_config_flops_then_six_n_d() -> None:
    assert shaping.compute_of({"flops": 3e20, "params": 1e9}, 100, 10) == 3e20
    assert shaping.compute_of({"params": 1e9, "tokens": 2e10}, None, None) == 6 * 1e9 * 2e10
    assert shaping.compute_of({"params": 1e9}, 1000, 1000.0) == 6 * 1e9 * 1e6
    assert shaping.compute_of({"model": "x"}, 1000, 1000.0) is None


def test_scaling_law_recovers_exponent_and_needs_two_sizes() -> None:
    c = np.array([1e18, 1e19, 1e20, 1e21])
    a, b = shaping.fit_scaling_law(c, 30.0 * c**-0.05)
    assert b == pytest.approx(0.05) and a == pytest.approx(30.0)
    assert shaping.fit_scaling_law(np.array([1e18]), np.array([3.0])) is None
    assert shaping.fit_scaling_law(np.array([1e18, 1e18]), np.array([3.0, 2.0])) is None


def test_runs_summary_shows_health_staleness_and_expectation() -> None:
    runs = pd.DataFrame(
        {
            "name": ["a"],
            "project": ["p"],
            "status": ["running"],
            "last_step": [100],
            "last_time": [1000.0],
            "attempts": [2],
        }
    )
    anomalies = pd.DataFrame({"run": ["a"], "severity": ["critical"], "verdict": [None]})
    fc = {"expected_now": 2.0, "predicted": 1.5, "lower": 1.4, "upper": 1.6, "eta_seconds": 600}
    row = shaping.runs_summary(runs, anomalies, {"a": 2.2}, {"a": fc}, now=1300.0).iloc[0]
    assert row["health"] == "critical"
    assert row["age"] == "5 min"
    assert row["vs expected"] == pytest.approx(0.1)
    assert row["ETA"] == "10 min" and row["open"] == 1 and row["attempts"] == 2


def test_metrics_by_role_puts_training_loss_first() -> None:
    roles = shaping.metrics_by_role(["val_loss", "loss", "tokens_per_s", "step_time_s", "x"])
    assert roles == {"loss": "loss", "throughput": "tokens_per_s", "step_time": "step_time_s"}


def test_aligned_sample_ignores_redone_steps_and_duplicates() -> None:
    a = pd.DataFrame({"step": [1, 2, 2], "value": [1.0, 2.0, 9.0], "superseded": [0, 0, 1]})
    a["superseded"] = a["superseded"].astype(bool)
    b = pd.DataFrame({"step": [1, 2], "value": [10.0, 20.0]})
    sample = runconfig.aligned_sample({"tokens_per_s": a, "step_time_s": b})
    assert sample.to_dict("list") == {"tokens_per_s": [1.0, 2.0], "step_time_s": [10.0, 20.0]}


def test_markdown_table_escapes_cells_but_keeps_the_badge_column() -> None:
    frame = pd.DataFrame(
        {"severity": [":red-badge[critical]"], "message": ["loss $3 | x*2 [link](http://a)"]}
    )
    text = shaping.markdown_table(frame, raw=("severity",))
    head, rule, row = text.split("\n")
    assert head == "| severity | message |" and rule == "| --- | --- |"
    assert row.startswith("| :red-badge[critical] | ")
    # Escaped: no unescaped pipe splits the row, no $ starts LaTeX, no link or emphasis.
    cells = [c for c in re.split(r"(?<!\\)\|", row) if c.strip()]
    assert len(cells) == 2
    assert "\\$3" in row and "\\*2" in row and "\\[link\\]" in row
    # A clock in a message is not an emoji shortcode (which would load a chunk of its own).
    assert not ui.EMOJI_SHORTCODE.search(shaping.markdown_text("stalled at 12:34:56"))


def test_anomaly_rows_are_the_most_recent_first_with_one_steps_column() -> None:
    anomalies = pd.DataFrame(
        {
            "id": [1, 2, 3],
            "severity": ["info", "critical", "warning"],
            "detector": ["spike", "nonfinite", "divergence"],
            "metric": ["loss"] * 3,
            "start_step": [10, 5000, 1200],
            "end_step": [10, 5000, 1400],
            "state": ["needs verdict"] * 3,
            "message": ["a", "b", "c"],
        }
    )
    rows = shaping.anomaly_rows(anomalies, limit=2)
    assert rows["#"].tolist() == [2, 3]  # by step, newest first; #1 is past the limit
    assert rows["steps"].tolist() == ["5,000", "1,200\u2060–\u20601,400"]  # never wrapped
    assert rows["state"].tolist() == [":gray-badge[needs verdict]"] * 2
    assert rows["severity"].tolist() == [":red-badge[critical]", ":orange-badge[warning]"]
