"""Generic detection for metrics of no known role: rises and drops, by the name's direction."""

from __future__ import annotations

import math
import random

import numpy as np
import pandas as pd
import pytest

from runwatch.detect import Monitor, analyze_frame
from runwatch.detect.change import Change
from runwatch.detect.names import worse_direction
from runwatch.detect.roles import detectors_for, role_of


def _noisy(n: int, level: float, sigma: float, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [level + sigma * rng.gauss(0, 1) for _ in range(n)]


def _flagged(det: Change, values: list[float]) -> list[tuple[int, str]]:
    return [(s, sig.severity) for s, v in enumerate(values) if (sig := det.update(s, v))]


@pytest.mark.parametrize(
    ("metric", "want"),
    [
        ("eval_accuracy", "down"),
        ("train/MeanReward", "down"),
        ("rougeL", "down"),
        ("val_error", "up"),
        ("eval/WER", "up"),
        ("kl", None),
        ("temperature", None),
    ],
)
def test_the_worse_direction_comes_from_the_name(metric, want):
    assert role_of(metric) == "other"
    assert worse_direction(metric) == want


def test_each_direction_gets_its_detectors():
    assert [d.name for d in detectors_for("other", "eval_accuracy")] == ["nonfinite", "drop"]
    assert [d.name for d in detectors_for("other", "val_ppl")] == ["nonfinite", "rise"]
    assert [d.name for d in detectors_for("other", "kl")] == ["nonfinite", "rise", "drop"]
    assert [d.name for d in detectors_for(role_of("epoch"), "epoch")] == ["nonfinite"]
    # A known role keeps its own detectors.
    assert "spike" in [d.name for d in detectors_for("loss", "loss")]


def test_a_large_drop_in_accuracy_is_a_warning_and_a_small_one_info():
    acc = _noisy(200, 0.80, 0.005)
    acc[120] = 0.70  # a 12% dip: far out of the noise, but not large
    acc[170:180] = [0.30] * 10  # the model broke
    hits = _flagged(Change("down"), acc)
    assert (120, "info") in hits
    assert (170, "warning") in hits
    assert all(s == 120 or 170 <= s < 180 for s, _ in hits)


def test_the_worse_direction_only():
    ppl = _noisy(200, 20.0, 0.1)
    ppl[150] = 10.0  # a better perplexity is no alarm
    assert _flagged(Change("up"), ppl) == []
    ppl[150] = 40.0
    assert [s for s, _ in _flagged(Change("up"), ppl)] == [150]


def test_counters_clocks_and_schedules_are_not_changes():
    counter = [float(16 * i) for i in range(500)]  # consumed samples: only ever rises
    elapsed = list(np.cumsum(np.abs(_noisy(500, 1.0, 0.05))))
    temp = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / 500)) for i in range(500)]
    temp = [t + 1e-4 * random.Random(i).gauss(0, 1) for i, t in enumerate(temp)]
    for series in (counter, elapsed, temp):
        up, down = Change("up"), Change("down")
        assert _flagged(up, series) == [] and _flagged(down, series) == []
    # A counter that was reset once is judged from then on: a jump in it is a rise.
    reset = counter[:250] + [float(16 * i) for i in range(200)] + [1e5]
    assert [s for s, _ in _flagged(Change("up"), reset)] == [450]


def test_a_flat_series_with_tiny_blips_is_quiet():
    mem = [17_703_634_944.0] * 400
    for i in range(40, 400, 37):
        mem[i] += 491_520.0  # a few hundred KiB on 17.7 GB
    assert _flagged(Change("up"), mem) == [] and _flagged(Change("down"), mem) == []
    mem[300] *= 1.5
    assert [s for s, _ in _flagged(Change("up"), mem)] == [300]


def test_a_series_at_zero_that_moves_is_flagged():
    skipped = [0.0, 1.0] + [0.0] * 100 + [3.0] + [0.0] * 20
    assert [s for s, _ in _flagged(Change("up"), skipped)] == [102]


@pytest.mark.parametrize("direction", ["up", "down"])
@pytest.mark.parametrize("cut", [0, 1, 7, 60, 150])
def test_update_many_is_update_point_by_point(direction, cut):
    values = [float(i) for i in range(20)] + _noisy(200, 5.0, 0.3, seed=3)
    values[100] = 9.0 if direction == "up" else 1.0
    values[140:160] = [8.0 if direction == "up" else 2.0] * 20
    values[130] = math.nan
    one = Change(direction)
    want = [(s, sig) for s, v in enumerate(values) if (sig := one.update(s, v))]
    many = Change(direction)
    steps = list(range(len(values)))
    got = many.update_many(steps[:cut], values[:cut])
    got += [(i + cut, sig) for i, sig in many.update_many(steps[cut:], values[cut:])]
    assert got == want and len(want) > 5
    assert many.update(999, 50.0 if direction == "up" else -50.0) == one.update(
        999, 50.0 if direction == "up" else -50.0
    )


def test_the_monitor_watches_unknown_metrics_live_as_on_replay():
    n = 300
    rows = []
    acc = _noisy(n, 0.7, 0.004, seed=1)
    acc[200:215] = [0.2] * 15
    kl = _noisy(n, 0.02, 0.001, seed=2)
    kl[250] = 0.2
    for step in range(n):
        rows += [("eval_accuracy", step, acc[step]), ("kl", step, kl[step])]
        rows += [("epoch", step, step / 100)]
    pts = pd.DataFrame(rows, columns=["metric", "step", "value"])
    live = [
        (a.detector, a.metric, a.start_step, a.severity) for a in analyze_frame(pts, fast=False)
    ]
    replay = [(a.detector, a.metric, a.start_step, a.severity) for a in analyze_frame(pts)]
    assert live == replay
    assert ("drop", "eval_accuracy", 200, "warning") in live
    assert ("rise", "kl", 250, "warning") in live
    assert not [a for a in live if a[1] == "epoch"]


def test_a_role_override_to_other_still_gets_generic_detection():
    m = Monitor({"tflops": "other"})
    for step, v in enumerate([*_noisy(100, 150.0, 1.0), 20.0]):
        out = m.update("tflops", {}, step, v)
    assert [a.detector for a in out] == ["drop"]
