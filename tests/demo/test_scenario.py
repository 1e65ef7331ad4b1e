"""The demo run: deterministic, realistic, and with every fault where it says it is."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runwatch.demo.scenario import (
    METRICS,
    MIN_STEPS,
    DemoStep,
    demo_scenario,
    describe_faults,
    expected_loss,
    fault_plan,
)
from runwatch.model import EVENT_KINDS


def _run(steps: int = 3000, seed: int = 0) -> list[DemoStep]:
    return list(demo_scenario(steps=steps, seed=seed))


def _first_attempt(run: list[DemoStep]) -> dict[int, DemoStep]:
    """Step -> DemoStep for the first time each step was logged."""
    out: dict[int, DemoStep] = {}
    for s in run:
        out.setdefault(s.step, s)
    return out


def test_same_seed_same_run_and_other_seed_other_noise():
    a, b, c = _run(seed=3), _run(seed=3), _run(seed=4)
    assert a == b or all(  # NaN != NaN, so compare with that in mind
        x.step == y.step
        and x.event == y.event
        and x.restart_from == y.restart_from
        and np.array_equal(list(x.metrics.values()), list(y.metrics.values()), equal_nan=True)
        for x, y in zip(a, b, strict=True)
    )
    assert [s.step for s in a] == [s.step for s in c]
    assert a[500].metrics["loss"] != c[500].metrics["loss"]


@pytest.mark.parametrize("steps", [MIN_STEPS, 1000, 3000, 7777])
def test_every_step_logs_every_metric_and_ends_at_the_last_step(steps):
    run = _run(steps)
    assert all(sorted(s.metrics) == sorted(METRICS) for s in run)
    assert run[-1].step == steps
    assert {s.step for s in run} == set(range(1, steps + 1))


def test_too_few_steps_is_refused_with_the_minimum():
    with pytest.raises(ValueError, match=f"steps >= {MIN_STEPS}"):
        next(demo_scenario(steps=MIN_STEPS - 1))


@pytest.mark.parametrize("steps", [MIN_STEPS, 3000, 7777])
def test_faults_are_at_the_documented_steps(steps):
    plan = fault_plan(steps)
    faults = {f.kind: f.step for f in describe_faults(steps)}
    assert faults["loss_spike"] == plan.spike_step
    assert faults["nan"] == plan.nan_step
    assert faults["crash"] == plan.crash_step
    assert faults["restart"] == plan.restart_from
    assert faults["throughput_drop"] == plan.slowdown_step
    assert faults["checkpoint"] == plan.checkpoint_every
    # in step order, and far enough apart to be told apart
    ordered = [faults[k] for k in ("loss_spike", "nan", "crash", "throughput_drop")]
    assert ordered == sorted(ordered)
    assert plan.spike_step > plan.warmup_steps


def test_fault_positions_scale_with_steps():
    for steps in (1000, 3000):
        plan = fault_plan(steps)
        assert plan.spike_step == round(0.35 * steps)
        assert plan.crash_step == round(0.72 * steps)
        assert plan.checkpoint_every == steps // 10


@pytest.mark.parametrize("steps", [MIN_STEPS, 3000])
def test_nan_loss_with_inf_grad_norm_at_exactly_one_step(steps):
    run = _run(steps)
    nan_steps = [s.step for s in run if math.isnan(s.metrics["loss"])]
    assert nan_steps == [fault_plan(steps).nan_step]
    bad = _first_attempt(run)[nan_steps[0]]
    assert bad.metrics["grad_norm"] == math.inf
    assert all(math.isfinite(v) for s in run for k, v in s.metrics.items() if s is not bad)


@pytest.mark.parametrize("steps", [MIN_STEPS, 3000])
def test_steps_go_back_to_the_checkpoint_at_the_restart(steps):
    plan = fault_plan(steps)
    run = _run(steps)
    back = [i for i in range(1, len(run)) if run[i].step <= run[i - 1].step]
    assert len(back) == 1
    i = back[0]
    assert run[i - 1].step == plan.crash_step
    assert run[i - 1].event is not None and run[i - 1].event[0] == "crash"
    assert run[i].restart_from == plan.restart_from
    assert run[i].step == plan.restart_from + 1
    assert run[i].event is not None and run[i].event[0] == "restart"
    # the restart point is a checkpoint the run actually saved before the crash
    saved = [s.step for s in run[:i] if s.event and s.event[0] == "checkpoint"]
    assert saved[-1] == plan.restart_from
    assert [s.restart_from for s in run].count(None) == len(run) - 1
    assert len(run) == steps + (plan.crash_step - plan.restart_from)


def test_checkpoints_every_tenth_of_the_run_and_events_use_known_kinds():
    steps = 3000
    run = _run(steps)
    kinds = [s.event[0] for s in run if s.event]
    assert set(kinds) <= set(EVENT_KINDS)
    ckpts = [s.step for s in run if s.event and s.event[0] == "checkpoint"]
    assert ckpts == list(range(300, 3001, 300))
    assert kinds.count("crash") == 1 and kinds.count("restart") == 1


def test_loss_decreases_overall_and_follows_the_expected_curve():
    steps = 3000
    first = _first_attempt(_run(steps))
    loss = np.array([first[t].metrics["loss"] for t in range(1, steps + 1)])
    assert loss[:10].mean() > 10
    assert np.nanmean(loss[-100:]) < 0.4 * np.nanmean(loss[:100])
    window = [np.nanmean(loss[i : i + 300]) for i in range(0, steps, 300)]
    assert window == sorted(window, reverse=True)
    # relative noise about 1.2% around the noise-free curve, away from the faults
    rel = loss / expected_loss(steps) - 1
    plan = fault_plan(steps)
    calm = np.ones(steps, bool)
    calm[plan.spike_step - 1 : plan.spike_step + 5] = False
    calm[plan.nan_step - 1] = False
    assert 0.008 < np.std(rel[calm]) < 0.016


def test_loss_spike_is_several_times_the_noise_then_recovers():
    steps = 3000
    plan = fault_plan(steps)
    first = _first_attempt(_run(steps))
    rel = {t: first[t].metrics["loss"] / expected_loss(steps)[t - 1] - 1 for t in first}
    noise = np.std([rel[t] for t in range(plan.spike_step - 200, plan.spike_step - 10)])
    assert rel[plan.spike_step] > 5 * noise
    after = [rel[t] for t in range(plan.spike_step + plan.spike_steps + 2, plan.spike_step + 60)]
    assert abs(np.mean(after)) < 2 * noise


def test_grad_norm_bursts_just_before_the_loss_spike():
    plan = fault_plan(3000)
    first = _first_attempt(_run(3000))
    gn = {t: first[t].metrics["grad_norm"] for t in first}
    usual = np.median([gn[t] for t in range(plan.spike_step - 100, plan.spike_step - 5)])
    assert gn[plan.spike_step - 1] > 4 * usual
    assert gn[plan.spike_step - 2] > 2.5 * usual
    assert gn[plan.spike_step + 3] < 2 * usual


def test_lr_warms_up_then_decays():
    plan = fault_plan(3000)
    first = _first_attempt(_run(3000))
    lr = [first[t].metrics["lr"] for t in range(1, 3001)]
    peak = int(np.argmax(lr)) + 1
    assert peak == plan.warmup_steps
    assert lr[: plan.warmup_steps] == sorted(lr[: plan.warmup_steps])
    assert lr[plan.warmup_steps - 1 :] == sorted(lr[plan.warmup_steps - 1 :], reverse=True)
    assert lr[-1] == pytest.approx(0.1 * max(lr))


def test_throughput_drops_about_thirty_percent_at_the_end():
    steps = 3000
    plan = fault_plan(steps)
    first = _first_attempt(_run(steps))
    tput = np.array([first[t].metrics["tokens_per_s"] for t in range(1, steps + 1)])
    step_time = np.array([first[t].metrics["step_time_s"] for t in range(1, steps + 1)])
    before = np.median(tput[plan.slowdown_step - 300 : plan.slowdown_step - 1])
    after = np.median(tput[plan.slowdown_step - 1 :])
    assert after / before == pytest.approx(0.7, abs=0.03)
    assert np.median(step_time[plan.slowdown_step - 1 :]) > 1.3 * np.median(step_time[:1000])
    assert steps - plan.slowdown_step + 1 == pytest.approx(0.15 * steps, abs=2)
