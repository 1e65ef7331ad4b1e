"""The schedule transfer of one size: base curve by S1 times the anneal ratio by S2."""

from __future__ import annotations

import numpy as np
import pytest

from runwatch.expect.lrlaw import fit_area_law, lr_areas
from runwatch.expect.planned import planned_lr
from runwatch.expect.schedule_transfer import transfer_curve

COSINE = {"name": "cosine", "warmup": 50, "final_lr_fraction": 0.1}
CONSTANT = {"name": "constant", "warmup": 50}


def areas(schedule, total):
    steps, share = planned_lr(schedule, total)
    s1, s2 = lr_areas(steps, share, total)
    at = np.arange(200, total + 1, 50)
    return np.maximum(s1[at], 1e-9), s2[at]


def base(s1):
    return 2.0 + 3.0 * s1**-0.5


def curve_of(runs):
    s1 = np.concatenate([r[0] for r in runs])
    s2 = np.concatenate([r[1] for r in runs])
    y = np.concatenate([base(a) * (1 - 0.1 * (1 - np.exp(-b / 100))) for a, b in runs])
    return transfer_curve(s1, s2, y, fit_area_law(s1, s2, y))


def test_constant_runs_alone_expect_no_annealing():
    transfer = curve_of([areas(CONSTANT, 2000)])
    assert transfer.anneal_reach == 0.0
    s1 = np.array([500.0, 1500.0])
    flat = transfer.predict(s1, np.zeros(2))
    np.testing.assert_allclose(flat, base(s1), rtol=2e-3)
    np.testing.assert_array_equal(transfer.predict(s1, np.array([300.0, 600.0])), flat)


def test_annealing_beyond_the_runs_reach_is_worth_no_more_unless_the_law_credits_it():
    transfer = curve_of([areas(CONSTANT, 4000), areas(COSINE, 2000)])
    reach = transfer.anneal_reach
    s1 = np.full(2, 2000.0)
    s2 = np.array([reach, reach + 200.0])
    held = transfer.predict(s1, s2)
    assert held[0] == pytest.approx(base(2000.0) * (1 - 0.1 * (1 - np.exp(-reach / 100))), 2e-3)
    assert held[1] == held[0]
    credited = transfer.predict(s1, s2, law_credit=True)
    assert credited[0] == held[0]
    assert credited[1] == pytest.approx(held[1] - transfer.law.C * 200.0)
    assert transfer.law.C > 0


def test_beyond_the_base_points_the_law_carries_them_on_without_a_jump():
    transfer = curve_of([areas(CONSTANT, 1000)])
    top = float(np.exp(transfer.base[0][-1]))
    near = transfer.predict(np.array([top * 0.999, top * 1.001]), np.zeros(2))
    assert abs(near[1] - near[0]) < 1e-3
    far = transfer.predict(np.array([4 * top]), np.zeros(1))[0]
    assert far == pytest.approx(base(4 * top), rel=2e-3) and far < near[1]
