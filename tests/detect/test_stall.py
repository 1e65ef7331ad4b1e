"""The stall detector: a plateau on a seeded power-law curve, no alarm on clean curves."""

from __future__ import annotations

import numpy as np
import pandas as pd

from runwatch.detect import Monitor, Stall
from runwatch.detect.replay import analyze_frame

from .conftest import loss_curve


def _first(det: Stall, values, steps=None) -> int | None:
    steps = range(1, len(values) + 1) if steps is None else steps
    for s, v in zip(steps, values, strict=True):
        if det.update(int(s), float(v)) is not None:
            return int(s)
    return None


def test_clean_power_law_curves_never_stall():
    for seed in range(5):
        assert _first(Stall(), loss_curve(20_000, seed=seed)) is None


def test_plateau_is_found_within_ten_percent_of_the_remaining_steps():
    v = loss_curve(20_000, seed=1, noise=0.005)
    rng = np.random.default_rng(1)
    v[10_000:] = v[9_999] * np.exp(0.005 * rng.standard_normal(10_000))
    hit = _first(Stall(), v)
    assert hit is not None and 10_000 < hit <= 11_000


def test_rising_loss_is_not_improving_either():
    v = loss_curve(6000, seed=2, noise=0.005)
    v[4000:] *= np.linspace(1.0, 1.2, 2000)
    hit = _first(Stall(), v)
    assert hit is not None and hit > 4000


def test_negative_losses_switch_to_linear_space():
    d = Stall()
    rng = np.random.default_rng(3)
    for s, v in enumerate(0.1 * rng.standard_normal(3000)):
        d.update(s, float(v))
    assert d.stalls == 0


def test_the_monitor_reports_a_stall_on_the_loss():
    v = loss_curve(20_000, seed=4, noise=0.005)
    v[12_000:] = v[11_999] * np.exp(0.005 * np.random.default_rng(4).standard_normal(8000))
    m = Monitor()
    found = [a for s, x in enumerate(v, 1) for a in m.update("loss", {}, s, float(x))]
    assert any(a.detector == "stall" and a.severity == "warning" for a in found)
    pts = pd.DataFrame({"metric": "loss", "step": np.arange(1, v.size + 1), "value": v})
    stalls = [a for a in analyze_frame(pts) if a.detector == "stall"]
    assert stalls and stalls[0].start_step > 12_000


def test_the_octave_test_finds_a_plateau_too_slow_for_the_short_windows():
    # A noisy, slowly falling curve (per-point noise 5%, ten times the fall over the
    # first 10% of the remaining steps): the short windows cannot see the plateau, half an
    # octave of points can.
    rng = np.random.default_rng(7)
    s = np.arange(1, 16_001)
    trend = 3.0 + 8.0 * (s + 200.0) ** -0.5
    v = trend * np.exp(0.05 * rng.standard_normal(s.size))
    v[4000:] = trend[3999] * np.exp(0.05 * rng.standard_normal(s.size - 4000))
    assert _first(Stall(long_test=False), v) is None
    hit = _first(Stall(), v)
    assert hit is not None and 4000 < hit <= 8000


def test_the_octave_test_is_quiet_on_the_same_curve_without_a_plateau():
    for seed in range(3):
        rng = np.random.default_rng(seed)
        s = np.arange(1, 16_001)
        v = (3.0 + 8.0 * (s + 200.0) ** -0.5) * np.exp(0.05 * rng.standard_normal(s.size))
        assert _first(Stall(), v) is None
