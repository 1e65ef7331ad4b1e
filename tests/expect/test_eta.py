"""The failure-aware ETA on constructed histories and on a simulated Poisson failure process."""

from __future__ import annotations

import numpy as np
import pytest

from runwatch.expect.eta import AttemptSpans, FailureAwareEta, failure_aware_eta

HOUR = 3600.0


def regular_history(
    failures: int, every_s: float = HOUR, downtime: float = 300.0, redo: int = 50, pace=1.0
):
    """Attempts of ``every_s`` running each, a failure at each end, ``downtime`` between,
    each restart going ``redo`` steps back (its first step redone included)."""
    t0, t1, s0, s1 = [], [], [], []
    t, s = 0.0, 0.0
    for i in range(failures + 1):
        t0.append(t)
        s0.append(s)
        t, s = t + every_s, s + every_s / pace
        t1.append(t)
        s1.append(s)
        if i < failures:
            t, s = t + downtime, s - redo + 1
    return AttemptSpans(t0, t1, s0, s1)


def test_without_failures_the_eta_is_the_pace_but_the_band_allows_for_failures():
    spans = AttemptSpans([0.0], [10 * HOUR], [0], [36_000])
    eta = failure_aware_eta(spans, pace=1.0, remaining_steps=36_000)
    assert eta.failures == 0
    assert eta.eta_seconds == eta.eta_lower == pytest.approx(36_000.0)
    # Rule of three: no failure in 10 h of running still allows a few in the next 10 h.
    assert eta.eta_upper > eta.eta_lower + 600.0
    assert eta.goodput == pytest.approx(1.0)


def test_regular_failures_add_their_expected_cost():
    spans = regular_history(failures=8, every_s=HOUR, downtime=300.0, redo=50)
    eta = failure_aware_eta(spans, pace=1.0, remaining_steps=4 * 3600, half_life_s=float("inf"))
    assert eta.failures == 8
    assert eta.failure_rate_per_h == pytest.approx(8 / 9)
    assert eta.cost_per_failure_s == pytest.approx(300.0 + 50.0)
    clean = 4 * 3600.0
    # About 8/9 per hour over ~4 h of running, 350 s each.
    assert eta.eta_seconds == pytest.approx(clean + 8 / 9 * 4 * 350.0, rel=0.02)
    assert eta.eta_lower < eta.eta_seconds < eta.eta_upper
    # Goodput: 9 h of running, 8 x 50 redone seconds lost, 8 x 300 s down.
    wall = 9 * HOUR + 8 * 300.0
    assert eta.goodput == pytest.approx((9 * HOUR - 8 * 50.0) / wall)


def test_old_failures_fade_so_a_run_that_stopped_failing_looks_safer():
    early = regular_history(failures=4, every_s=HOUR)  # four failures, then a long quiet
    quiet = AttemptSpans(
        [*early.start_time[:-1], early.start_time[-1]],
        [*early.end_time[:-1], early.end_time[-1] + 10 * HOUR],
        early.start_step,
        [*early.end_step[:-1], early.end_step[-1] + 10 * 3600],
    )
    recent = regular_history(failures=4, every_s=HOUR)
    late = AttemptSpans(  # the same four failures, after a long quiet first attempt
        [recent.start_time[0], *(t + 10 * HOUR for t in recent.start_time[1:])],
        [t + 10 * HOUR for t in recent.end_time],
        recent.start_step,
        recent.end_step,
    )
    args = {"pace": 1.0, "remaining_steps": 10 * 3600}
    faded_early, faded_late = failure_aware_eta(quiet, **args), failure_aware_eta(late, **args)
    assert faded_early.failures == faded_late.failures == 4
    assert faded_early.failure_rate_per_h < 0.5 * faded_late.failure_rate_per_h
    assert faded_early.eta_seconds < faded_late.eta_seconds
    # Without fading both see 4 failures in 15 h of running.
    flat = {**args, "half_life_s": float("inf")}
    assert failure_aware_eta(quiet, **flat).failure_rate_per_h == pytest.approx(
        failure_aware_eta(late, **flat).failure_rate_per_h
    )


def simulate(rng, rate_h: float, pace: float, final: int, ckpt: int, upto: int):
    """A run with Poisson failures (per hour of running), uniform 200-400 s downtime and
    restarts from the last checkpoint. The spans until it first reaches ``upto``, and the
    wall time from then to its end."""
    t, step = 0.0, 0
    t0, t1, s0, s1 = [0.0], [], [0], []
    cut = None
    while step < final:
        run_steps = int(rng.exponential(HOUR / rate_h) / pace)
        if cut is None and step + run_steps >= upto:
            cut = t + (upto - step) * pace
            t1.append(cut)
            s1.append(upto)
            spans = AttemptSpans(t0, t1, s0, s1)
        if step + run_steps >= final:
            t += (final - step) * pace
            break
        step, t = step + run_steps, t + run_steps * pace
        if cut is None:
            t1.append(t)
            s1.append(step)
        t += rng.uniform(200.0, 400.0)
        step = step // ckpt * ckpt
        if cut is None:
            t0.append(t)
            s0.append(step)
    return spans, t - cut


def test_the_band_holds_a_simulated_poisson_run_in_most_trials():
    rng = np.random.default_rng(18)
    inside, errors = 0, []
    trials = 200
    for _ in range(trials):
        spans, truth = simulate(rng, rate_h=2.0, pace=0.5, final=40_000, ckpt=500, upto=10_000)
        eta = failure_aware_eta(spans, pace=0.5, remaining_steps=30_000, checkpoint_every=500)
        inside += eta.eta_lower <= truth <= eta.eta_upper
        errors.append((eta.eta_seconds - truth) / truth)
    assert inside / trials >= 0.8
    assert abs(np.median(errors)) < 0.1


def test_as_json_has_the_four_forecast_keys():
    eta = failure_aware_eta(regular_history(2), pace=1.0, remaining_steps=100)
    assert isinstance(eta, FailureAwareEta)
    assert set(eta.as_json()) == {"eta_seconds", "eta_lower", "eta_upper", "goodput"}
    with pytest.raises(ValueError, match="pace"):
        failure_aware_eta(regular_history(2), pace=0.0, remaining_steps=100)


def test_nothing_left_to_run_is_zero():
    eta = failure_aware_eta(regular_history(3), pace=1.0, remaining_steps=0)
    assert (eta.eta_seconds, eta.eta_lower, eta.eta_upper) == (0.0, 0.0, 0.0)
    assert eta.failures == 3
