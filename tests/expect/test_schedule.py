"""The LR schedule projected to the final step, and the forecast that uses it."""

from __future__ import annotations

import numpy as np
import pytest

from runwatch.expect import forecast, lr_areas
from runwatch.expect.schedule import project_lr

N = 20_000
PEAK = 3e-4


def schedule(kind: str, n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """A 500-step warmup, then ``kind`` to step n - 1."""
    s = np.arange(n, dtype=float)
    t = np.clip((s - 499) / (n - 1 - 499), 0.0, 1.0)
    after = {
        "cosine10": 0.1 + 0.45 * (1 + np.cos(np.pi * t)),
        "linear0": 1.0 - t,
        "constant": np.ones_like(t),
        "step": np.where(s >= n // 4, 0.1, 1.0),
    }[kind]
    return s, PEAK * np.where(s < 499, (s + 1) / 500, after)


@pytest.mark.parametrize(
    ("kind", "shape", "floor"), [("cosine10", "cosine", 0.1), ("linear0", "linear", 0.0)]
)
def test_a_decay_is_carried_on_in_its_shape_to_its_floor(kind, shape, floor):
    s, lr = schedule(kind)
    seen = s <= 0.3 * N
    p = project_lr(s[seen], lr[seen], final_step=N - 1)
    assert p.shape == shape
    assert p.floor == pytest.approx(floor * PEAK, abs=0.01 * PEAK)
    assert p.steps[-1] == N - 1 and np.all(np.diff(p.steps) > 0)
    assert np.max(np.abs(np.interp(s, p.steps, p.values) - lr)) < 0.01 * PEAK


@pytest.mark.parametrize("kind", ["constant", "step"])
def test_no_decay_yet_or_another_shape_is_held_flat(kind):
    s, lr = schedule(kind)
    seen = s <= 0.3 * N
    p = project_lr(s[seen], lr[seen], final_step=N - 1)
    assert p.shape == "flat"
    assert p.steps.tolist() == s[seen].tolist()  # nothing invented


def test_a_warmup_still_rising_is_held_flat_and_nonfinite_points_are_skipped():
    s, lr = schedule("cosine10")
    lr = lr.copy()
    lr[100] = np.nan
    p = project_lr(s[:300], lr[:300], final_step=N - 1)
    assert (p.shape, p.peak_step) == ("flat", 299)
    assert np.isfinite(p.values).all() and p.steps.size == 299


@pytest.mark.parametrize("upto", [400, 1000])
def test_a_fit_across_the_warmup_uses_the_power_law_and_says_why(upto):
    """Still rising at 400; at 1000 the fit (from 40% of the steps on) starts before the
    warmup ended at 499. Once it starts after, the LR law is back (next test)."""
    s, loss, lr = tissue_run("cosine10")
    f = forecast(s, loss, upto=upto, final_step=N - 1, lr_steps=s[:upto], lr_values=lr[:upto])
    assert (f.model, f.lr_schedule) == ("power_law", "warmup")
    assert "warmup is in the fitted steps" in f.lr_note()


def test_a_fit_after_the_warmup_of_a_barely_decayed_lr_keeps_the_lr_law():
    s, loss, lr = tissue_run("cosine10")
    f = forecast(s, loss, upto=1500, final_step=N - 1, lr_steps=s[:1500], lr_values=lr[:1500])
    assert (f.model, f.lr_schedule) == ("lr_law", "flat")


def test_a_schedule_logged_to_the_end_or_not_at_all_is_left_as_it_is():
    s, lr = schedule("cosine10")
    assert project_lr(s, lr, final_step=N - 1).shape == "logged"
    empty = project_lr(np.array([]), np.array([]), final_step=100)
    assert empty.shape == "logged" and empty.steps.size == 0


def tissue_run(kind: str, noise: float = 0.01, seed: int = 0):
    """Loss following the LR-aware law itself: L = 2 + 8 (S1 + 50)^-0.3 - 0.4 S2 / 1000."""
    s, lr = schedule(kind)
    s1, s2 = lr_areas(s, lr, N - 1)
    loss = (2.0 + 8.0 * (s1 + 50) ** -0.3 - 0.4 * s2 / 1000) * (
        1 + noise * np.random.default_rng(seed).standard_normal(N)
    )
    return s, loss, lr


def test_half_way_through_a_cosine_the_forecast_expects_the_coming_decay():
    s, loss, lr = tissue_run("cosine10")
    final = float(np.median(loss[-200:]))
    up = N // 2
    f = forecast(s, loss, upto=up, final_step=N - 1, lr_steps=s[:up], lr_values=lr[:up])
    assert (f.model, f.lr_schedule) == ("lr_law", "cosine")
    assert abs(f.predicted - final) / final < 0.01
    assert f.lower <= final <= f.upper


def test_early_in_a_cosine_the_unknown_anneal_falls_back_to_the_power_law():
    """A quarter of the way in, the anneal seen is too little to learn its coefficient:
    extrapolated to the whole decay, the LR law's guess would be far off."""
    s, loss, lr = tissue_run("cosine10")
    final = float(np.median(loss[-200:]))
    up = N // 4
    f = forecast(s, loss, upto=up, final_step=N - 1, lr_steps=s[:up], lr_values=lr[:up])
    assert (f.model, f.lr_schedule) == ("power_law", "cosine")
    assert f.lower <= final <= f.upper


def test_a_constant_lr_keeps_the_lr_law():
    s, loss, lr = tissue_run("constant")
    up = N // 4
    f = forecast(s, loss, upto=up, final_step=N - 1, lr_steps=s[:up], lr_values=lr[:up])
    assert (f.model, f.lr_schedule) == ("lr_law", "flat")


def test_an_lr_with_no_finite_point_forecasts_with_the_power_law():
    s, loss, _ = tissue_run("constant")
    nan = np.full(100, np.nan)
    f = forecast(s, loss, upto=N // 2, lr_steps=np.arange(100), lr_values=nan)
    assert (f.model, f.lr_schedule) == ("power_law", None)
