"""The expected curve knows the LR schedule: cosine and WSD decays are expected, faults
under them are still found, and replay equals streaming with the LR clock in play."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest

from runwatch.detect import Monitor, analyze_frame
from runwatch.detect.deviation import CurveDeviation
from runwatch.expect import AreaLaw
from runwatch.model import Event

from .conftest import bench_module, canon

N = 20_000


def tissue_run(schedule: str, seed: int = 0, noise: float = 0.01, n: int = N) -> pd.DataFrame:
    """Loss following L = 2 + 8·(S1 + 50)^-0.3 - 0.4·S2/1000 (Tissue et al.'s form) under
    a 500-step warmup and a constant, cosine (to 10%) or warmup-stable-decay schedule:
    ``bench/lr_schedules.py``'s runs, so the tests and the benchmark judge the same data."""
    return bench_module("lr_schedules").run(schedule, n, seed, noise)


def flagged(anomalies, detectors=("curve_deviation", "stall")) -> list[tuple]:
    return [(a.detector, a.start_step, a.severity) for a in anomalies if a.detector in detectors]


@pytest.mark.parametrize("schedule", ["cosine", "cosine0", "wsd", "step", "constant"])
@pytest.mark.parametrize("seed", [0, 1])
def test_an_lr_schedule_is_expected_not_flagged(schedule, seed):
    assert flagged(analyze_frame(tissue_run(schedule, seed))) == []


def test_without_the_lr_a_cosine_decay_looks_like_a_deviation():
    """Why the LR clock exists: the same cosine run, its LR not logged."""
    df = tissue_run("cosine", noise=0.003)
    found = flagged(analyze_frame(df[df.metric == "loss"]), ("curve_deviation",))
    assert found, "the plain power law should misread the cosine decay"


def test_without_the_lr_a_step_decay_looks_like_a_stall():
    """The loss all but stops after the LR drops to 1%: expected, if the LR is known."""
    df = tissue_run("step", noise=0.003)
    assert flagged(analyze_frame(df[df.metric == "loss"]), ("stall",))
    assert flagged(analyze_frame(df), ("stall",)) == []


def test_the_expected_curve_uses_the_lr_aware_law_once_the_lr_is_logged():
    m = Monitor()
    analyze_frame(tissue_run("cosine"), monitor=m, fast=False)
    dev = next(d for s in m._series.values() if s.metric == "loss" for d in s.detectors
               if isinstance(d, CurveDeviation))  # fmt: skip
    assert isinstance(dev.law, AreaLaw)
    assert dev.lr_clock is m.lr_clock
    # The fitted law predicts the true noiseless loss at the end of the decay.
    s = np.arange(N)
    df = tissue_run("cosine", noise=0.0)
    truth = df[df.metric == "loss"].value.to_numpy()[-1]
    assert dev.expected(int(s[-1])) == pytest.approx(truth, rel=0.01)


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
@pytest.mark.parametrize("fault", ["plateau", "level_shift"])
def test_faults_under_a_schedule_are_still_found(schedule, fault):
    df = tissue_run(schedule, seed=3)
    at = 6000
    hit = (df.metric == "loss") & (df.step >= at)
    if fault == "plateau":
        rng = np.random.default_rng(3)
        level = df.loc[hit & (df.step == at), "value"].iloc[0]
        df.loc[hit, "value"] = level * (1 + 0.01 * rng.standard_normal(int(hit.sum())))
    else:
        df.loc[hit, "value"] *= 1.03
    found = [
        a for a in analyze_frame(df)
        if a.metric == "loss" and a.severity != "info"
        and a.detector in ("curve_deviation", "stall")
    ]  # fmt: skip
    assert found and all(a.start_step >= at for a in found)
    # Within 10% of the steps remaining, the benchmark's target for plateaus and shifts.
    assert found[0].start_step - at <= 0.1 * (N - at)


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_batch_replay_equals_streaming_with_the_lr_clock(schedule):
    df = tissue_run(schedule, seed=2)
    loss = df.metric == "loss"
    df.loc[loss & df.step.between(9000, 9400), "value"] *= 1.05  # a level shift, recovered
    df.loc[loss & (df.step >= 15000), "value"] = 2.9  # a late plateau
    df.loc[(df.metric == "lr") & (df.step == 4000), "value"] = np.nan  # a lost LR point
    df = df[~((df.metric == "lr") & (df.step % 3 == 1))]  # LR logged at two steps in three
    fast, slow = Monitor(), Monitor()
    a = analyze_frame(df, monitor=fast)
    b = analyze_frame(df, monitor=slow, fast=False)
    assert [x.detector for x in a if x.severity == "warning"], "the faults were found"
    assert canon(a) == canon(b)

    def state(m: Monitor) -> bytes:
        return pickle.dumps(
            [{k: v for k, v in vars(d).items() if k != "_clock"}
             for s in m._series.values() for d in s.detectors]
        )  # fmt: skip

    assert state(fast) == state(slow)
    assert fast.lr_clock.last == slow.lr_clock.last


def test_lr_logged_after_the_loss_in_each_step_gives_the_same_episodes_in_replay():
    """Row order within a step decides what the clock knows; replay keeps that order."""
    df = tissue_run("cosine", seed=1)
    swapped = pd.concat([df[df.metric == "lr"], df[df.metric == "loss"]])
    swapped = swapped.iloc[np.argsort(swapped.step.to_numpy(), kind="stable")]
    assert canon(analyze_frame(swapped)) == canon(analyze_frame(swapped, fast=False))
    assert flagged(analyze_frame(swapped)) == []


def test_a_restart_rewinds_the_lr_clock_with_the_run():
    df = tissue_run("cosine", n=6000)
    m = Monitor()
    rows = list(df.itertuples(index=False))
    for r in rows[: 2 * 5000]:
        m.update(r.metric, {}, r.step, r.value)
    m.event(Event(kind="restart", step=4000, time=0.0))
    for r in rows[2 * 4000 :]:  # steps 4000.. redone, then the rest
        m.update(r.metric, {}, r.step, r.value)
    straight = Monitor()
    for r in rows:
        straight.update(r.metric, {}, r.step, r.value)
    assert m.lr_clock.last == straight.lr_clock.last
    assert m.health["out_of_order_points"] == 0


def test_an_lr_of_zero_from_the_start_is_a_warning_and_a_warmup_from_zero_is_not():
    n = 3000
    s = np.arange(n)
    loss = 4.0 + 0.01 * np.random.default_rng(0).standard_normal(n)
    for lr, want in ((np.zeros(n), True), (np.minimum(s / 500, 1.0) * 3e-4, False)):
        values = np.c_[loss, lr].ravel()
        metric = ["loss", "lr"] * n
        frame = pd.DataFrame({"metric": metric, "step": np.repeat(s, 2), "value": values})
        found = [a for a in analyze_frame(frame) if a.detector == "lr_sanity"]
        assert bool(found) == want
        if want:
            assert found[0].start_step == 499 and found[0].severity == "warning"
            assert "not learning" in found[0].message and found[0].end_step == n - 1
