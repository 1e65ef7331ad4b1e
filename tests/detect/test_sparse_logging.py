"""A run logged every 10 or 50 steps (HF ``logging_steps``, Lightning ``log_every_n_steps``)
is judged by windows of the same length in steps as one logged densely."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runwatch.detect.deviation import CALIBRATED_GAP, CurveDeviation
from runwatch.detect.spike import Spike


def logged_every(every: int, n_steps: int = 20000, plateau_from: int | None = None):
    """A falling loss with 1% noise per step, as a trainer logs it every ``every`` steps:
    the mean of each window, at its last step; flat from ``plateau_from`` on."""
    rng = np.random.default_rng(every)
    steps = np.arange(1, n_steps + 1)
    loss = (2.0 + 9.0 * (steps + 50.0) ** -0.35) * np.exp(0.01 * rng.standard_normal(n_steps))
    if plateau_from is not None:
        loss[plateau_from:] = loss[plateau_from - 200 : plateau_from].mean() * np.exp(
            0.01 * rng.standard_normal(n_steps - plateau_from)
        )
    windows = loss.reshape(-1, every).mean(axis=1)
    return steps[every - 1 :: every].tolist(), windows.tolist()


def signals(detector, steps, values) -> list[tuple[int, str]]:
    return [(s, sig.severity) for s, v in zip(steps, values, strict=True)
            if (sig := detector.update(s, v))]  # fmt: skip


def test_a_plateau_logged_every_50_steps_is_found_once_judged_in_steps():
    steps, values = logged_every(50, plateau_from=12000)  # 400 points: under min_points
    found = signals(CurveDeviation(), steps, values)
    warnings = [s for s, sev in found if sev == "warning"]
    assert warnings and min(warnings) > 12000  # the plateau, nothing before it
    # Judged by points, as before, the series is too short to be judged at all.
    assert signals(CurveDeviation(max_thinning=1.0), steps, values) == []


@pytest.mark.parametrize("every", [1, CALIBRATED_GAP])
def test_a_series_logged_as_densely_as_the_calibration_keeps_its_windows(every):
    steps, values = logged_every(every, plateau_from=12000)
    assert signals(CurveDeviation(), steps, values) == signals(
        CurveDeviation(max_thinning=1.0), steps, values
    )


def test_the_cadence_is_learned_alike_in_batches_and_point_by_point():
    steps, values = logged_every(50, plateau_from=12000)
    one = CurveDeviation()
    want = [(i, repr(sig)) for i, (s, v) in enumerate(zip(steps, values, strict=True))
            if (sig := one.update(s, v))]  # fmt: skip
    many = CurveDeviation()
    got = []
    for a, b in ((0, 3), (3, 9), (9, len(steps))):  # the cadence completes inside a batch
        got += [(a + i, repr(sig)) for i, sig in many.update_many(steps[a:b], values[a:b])]
    assert want and got == want


def test_max_thinning_below_one_is_refused():
    with pytest.raises(ValueError, match="max_thinning"):
        CurveDeviation(max_thinning=0.5)


@pytest.mark.parametrize("every", [1, 10, 50])
def test_a_lasting_rise_is_a_level_shift_after_the_same_steps_at_any_cadence(every):
    steps, values = logged_every(every, n_steps=40000)
    start = len(steps) // 2
    values = [v * (1.08 if i >= start else 1.0) for i, v in enumerate(values)]
    detector = Spike()
    found = [(i, sig) for i, (s, v) in enumerate(zip(steps, values, strict=True))
             if (sig := detector.update(s, v)) and i >= start]  # fmt: skip
    assert found and found[0][0] == start and found[0][1].severity == "info"
    warned = next(i for i, sig in found if sig.severity == "warning")
    points = max(detector.shift_points, math.ceil(detector.shift_after / every))
    assert warned == start + points - 1
    assert found[warned - start][1].message.startswith("level shift:")
