"""The expected curve: power law, LR-aware law, reference run, forecast, ETA."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from runwatch.expect import (
    Forecast,
    LogBins,
    ReferenceCurve,
    TooLittleData,
    bin_arrays,
    fit_lr_law,
    fit_power_law,
    forecast,
    lr_areas,
)
from runwatch.expect.forecast import UNSEEN_FALL_PER_EFOLD

REAL_RUNS = Path(__file__).resolve().parents[2].parent / "shared/data/real_runs"


def power_curve(n=5000, noise=0.0, seed=0, E=2.0, A=8.0, alpha=0.4, s0=30.0):
    s = np.arange(1, n + 1, dtype=float)
    rng = np.random.default_rng(seed)
    return s, (E + A * (s + s0) ** -alpha) * np.exp(noise * rng.standard_normal(n))


def test_power_law_recovers_its_parameters_from_a_noiseless_curve():
    s, y = power_curve()
    bs, bv, _ = bin_arrays(s, y)
    law = fit_power_law(bs, bv)
    assert abs(law.E - 2.0) < 0.05
    assert law.alpha == pytest.approx(0.4, abs=0.05)
    np.testing.assert_allclose(law.predict(s[::500]), y[::500], rtol=1e-3)


def test_power_law_shrugs_off_outliers():
    s, y = power_curve(noise=0.01, seed=1)
    y[::97] *= 3.0  # spikes
    law = fit_power_law(s, y)
    assert law.predict(np.array([5000.0]))[0] == pytest.approx(y[-50:].mean(), rel=0.02)


def test_forecast_band_covers_the_truth_on_seeded_noisy_curves():
    hits, errs = 0, []
    for seed in range(20):
        s, y = power_curve(n=20_000, noise=0.02, seed=seed, alpha=0.3 + 0.02 * seed)
        f = forecast(s, y, upto=5000, final_step=20_000)
        truth = float(np.median(y[-200:]))
        hits += f.lower <= truth <= f.upper
        errs.append(abs(f.predicted - truth) / truth)
    assert hits >= 18
    assert np.median(errs) < 0.03  # E and alpha trade off over a short fit window


def test_forecast_fields_curve_eta_and_target_step():
    s, y = power_curve(n=4000)
    times = 1000.0 + 0.5 * s  # 0.5 s per step
    f = forecast(s, y, times=times, upto=2000, final_step=4000, target=float(y[2999]))
    assert isinstance(f, Forecast) and f.model == "power_law"
    assert (f.upto, f.final_step) == (2000, 4000)
    assert f.lower < f.predicted < f.upper
    assert f.eta_seconds == pytest.approx(1000.0, rel=0.01)
    assert f.target_step == pytest.approx(3000, rel=0.03)
    mean, lo, hi = f.curve(np.array([100.0, 2000.0, 4000.0]))
    assert np.all(lo <= mean) and np.all(mean <= hi)
    assert (hi - lo)[2] > (hi - lo)[1]  # the band widens as it extrapolates
    assert mean[2] == pytest.approx(f.predicted)


@pytest.mark.parametrize(
    "values",
    [[], [2.0], [math.nan] * 100, [2.0, 1.9, 1.8]],
    ids=["empty", "one_point", "all_nan", "three_points"],
)
def test_too_little_data_is_a_clear_value_error(values):
    with pytest.raises(ValueError, match="too little data"):
        forecast(np.arange(len(values)), np.array(values, dtype=float))


def test_too_little_data_carries_the_counts():
    with pytest.raises(TooLittleData) as exc:
        forecast(np.arange(3), np.ones(3))
    assert (exc.value.n, exc.value.need) == (3, 6)


def test_constant_curve_forecasts_itself():
    f = forecast(np.arange(500), np.full(500, 3.25), final_step=5000)
    assert f.predicted == pytest.approx(3.25)
    assert f.lower <= 3.25 <= f.upper


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError, match="differ in length"):
        forecast(np.arange(10), np.ones(9))


def test_lr_areas_of_a_constant_then_decaying_schedule():
    s1, s2 = lr_areas(np.array([0, 100, 200]), np.array([1.0, 1.0, 0.0]), 200)
    assert s1[100] == pytest.approx(101.0)
    assert s2[100] == pytest.approx(0.0)
    assert s2[200] > 0  # annealing builds up the second area


def test_lr_law_expects_the_drop_of_an_lr_anneal():
    """A WSD schedule: a plain power law is surprised by the decay; the LR law is not."""
    n = 6000
    steps = np.arange(n, dtype=float)
    lr = np.where(steps < 4500, 1.0, 1.0 - (steps - 4500) / 1500)
    s1, s2 = lr_areas(steps, lr, n - 1)
    y = 2.0 + 3.0 * np.power(s1 / s1[-1], -0.3) * 0.2 - 0.4 * s2 / s2.max()
    bs, bv, _ = bin_arrays(steps[50:], y[50:])
    law = fit_lr_law(bs, bv, steps, lr, horizon=n - 1)
    assert law.predict(np.array([n - 1.0]))[0] == pytest.approx(y[-1], rel=0.005)
    f_lr = forecast(steps, y, lr_steps=steps, lr_values=lr, upto=n - 1, final_step=n - 1)
    assert f_lr.model == "lr_law"


def test_reference_mode_uses_an_earlier_runs_curve_with_offset():
    s, ref = power_curve(n=3000)
    now = ref[:1000] + 0.05
    rc = ReferenceCurve.from_frame(
        pd.DataFrame({"metric": "loss", "step": s, "value": ref}), "loss"
    )
    f = forecast(s[:1000], now, final_step=3000, reference=rc)
    assert f.model == "reference"
    assert f.predicted == pytest.approx(ref[-1] + 0.05, abs=0.01)


def test_streaming_bins_are_bounded_for_ten_million_steps():
    b = LogBins()
    for step in range(0, 10_000_000, 997):
        b.add(step, 1.0)
    assert len(b) < 200


def test_forecast_on_a_real_run_at_half_way():
    path = REAL_RUNS / "mlm_gpt3_15b_a100.csv"
    if not path.is_file():
        pytest.skip(f"real training curves not found at {path}")
    df = pd.read_csv(path)
    g = df[df["metric"] == "train_loss"].sort_values("step")
    s, v = g["step"].to_numpy(), g["value"].to_numpy()
    final = float(np.median(v[-100:]))
    f = forecast(s, v, upto=25_000, final_step=int(s[-1]))
    assert abs(f.predicted - final) / final < 0.02
    assert f.lower <= final <= f.upper


def test_eta_follows_the_recent_pace_not_the_average():
    from runwatch.expect.forecast import eta_seconds

    steps = np.arange(1000, dtype=float)
    times = np.where(steps < 800, steps * 1.0, 800 + (steps - 800) * 2.0)  # half speed at 800
    eta = eta_seconds(times, steps, upto=999, final=1999)
    assert eta == pytest.approx(1000 * 2.0)  # 1000 steps to go at the latest 0.5 step/s
    assert eta_seconds(times, steps, upto=999, final=999) == 0.0
    assert eta_seconds(None, steps, upto=999, final=1999) is None
    assert eta_seconds(np.full(1000, np.nan), steps, upto=999, final=1999) is None


def test_an_anneal_still_to_come_is_inside_the_band_when_the_lr_is_not_logged():
    # A warmup-stable-decay run whose LR is not logged: at 75% nothing tells of the decay,
    # which lowers the final loss 4% below the stable phase's power law.
    s = np.arange(1, 8001, dtype=float)
    stable = 2.0 + 6.0 * (s + 50.0) ** -0.45
    drop = 0.04 * stable * np.clip((s - 6400) / 1600, 0, 1)
    y = stable - drop
    f = forecast(s, y, upto=6000, final_step=8000)
    assert f.model == "power_law"
    assert f.lower <= y[-1] <= f.upper
    # With the decay logged and seen, the law knows it: no allowance for an unknown anneal.
    lr = np.where(s < 6400, 1.0, 1.0 - 0.9 * (s - 6400) / 1600)
    known = forecast(s, y, upto=8000, final_step=8000, lr_steps=s, lr_values=lr)
    assert known.upper - known.lower < f.upper - f.lower


def test_the_band_never_ends_below_where_a_too_steep_fit_says_but_the_run_is():
    # The early points of a curve that is about to flatten: the fit's fall is far too
    # steep, and the upper end of the band stays at the level the run is at.
    s = np.arange(1, 20001, dtype=float)
    y = 3.0 + 2.0 * np.exp(-s / 400.0)
    f = forecast(s, y, upto=300, final_step=20000)
    level = float(np.median(y[270:300]))
    assert f.predicted < 2.0  # the fit alone would promise far too much
    assert f.upper >= 0.99 * level
    assert f.lower <= y[-1] <= f.upper  # the fit's own band ends near 1.5


def test_the_upper_end_holds_a_noisy_runs_level_when_its_last_bins_sit_low():
    # A batch-8 loss (a point is 17% noise) flattening while its cosine LR still decays;
    # the last fitted points happen to read 4% low. The LR law credits the decay still to
    # come, and the band must still reach the level the run ends at.
    rng = np.random.default_rng(2)
    s = np.arange(0, 1500, dtype=float)
    level = 1.75 + 1.2 * np.exp(-s / 250.0)  # the median of the noisy points
    y = level * np.exp(0.17 * rng.standard_normal(s.size))
    y[1040:1125] *= 0.96
    lr = 3e-3 * (0.1 + 0.45 * (1 + np.cos(np.pi * s / 1500)))
    f = forecast(s, y, upto=1125, final_step=1499, lr_steps=s, lr_values=lr)
    assert f.model == "lr_law"
    assert f.predicted < 0.93 * level[-1]  # the fit alone expects a fall that never comes
    assert f.lower <= level[-1] <= f.upper


@pytest.mark.parametrize("run", ["tiny-lm-s1500-b8-lr3e-3", "tiny-lm-s1500-b8-lr1e-3"])
def test_the_examples_noisy_runs_end_inside_their_band_at_three_quarters(run):
    # Real runs of examples/train_tiny_lm.py at batch 8 (bench/data/make_tiny_lm_runs.py):
    # their loss flattens while the cosine LR decays. At 75% the LR law expected them to
    # end 12% lower than they did, with its band's upper end at two low final bins.
    data = Path(__file__).resolve().parents[2] / "bench/data/tiny_lm_forecast"
    frame = pd.read_csv(data / f"{run}.csv.gz")
    loss = frame[frame["metric"] == "loss"].sort_values("step")
    lr = frame[frame["metric"] == "lr"].sort_values("step")
    s, y = loss["step"].to_numpy(float), loss["value"].to_numpy(float)
    f = forecast(
        s,
        y,
        upto=int(0.75 * s[-1]),
        final_step=int(s[-1]),
        lr_steps=lr["step"].to_numpy(),
        lr_values=lr["value"].to_numpy(),
    )
    assert f.model == "lr_law"
    truth = float(np.median(y[-y.size // 50 :]))
    assert f.lower <= truth <= f.upper


def test_an_early_forecast_leaves_room_for_a_fall_its_first_tenth_does_not_show():
    # A held-out loss on a plateau, then learning late (as the CPU runs' did): at a tenth
    # of the steps the fit sees the plateau, and the run ends far below it.
    s = np.arange(0, 4001, 50, dtype=float)
    y = 3.3 - 0.9 / (1.0 + np.exp(-(s - 1500.0) / 400.0)) + 0.3 * np.exp(-s / 150.0)
    f = forecast(s, y, upto=400, final_step=4000)
    assert f.model == "power_law"
    assert f.predicted > 1.1 * y[-1]  # the fit alone misses by over 10%
    assert f.lower <= y[-1] <= f.upper
    room = UNSEEN_FALL_PER_EFOLD * np.log(4000 / 400)
    assert f.lower == pytest.approx(f.predicted * (1 - room), rel=1e-6)
    # Only the lower end moves: the upper end is what flags a run as worse than expected.
    assert f.upper < 1.2 * f.predicted
