"""The Monitor: roles, episodes, severity, precursor links, events, bounds, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runwatch.detect import Monitor, role_of
from runwatch.detect.deviation import CurveDeviation
from runwatch.detect.divergence import Divergence
from runwatch.detect.spike import Spike
from runwatch.detect.stall import Stall
from runwatch.model import Anomaly, Event

from .conftest import canon, loss_curve


def scenario(n: int = 3000):
    """Seeded curves of four metrics with known faults (the golden scenario)."""
    loss = loss_curve(n, seed=11)
    loss[1000] *= 2.0  # one-step spike
    loss[1500:1530] *= 1.8  # a spike lasting 30 steps
    loss[2000] = np.nan
    loss[2500:] *= np.exp(0.004 * np.arange(n - 2500))  # divergence
    rng = np.random.default_rng(5)
    gn = 0.3 * np.exp(0.05 * rng.standard_normal(n))
    gn[1497:1500] *= 30  # grad-norm burst 3 steps before the loss spike
    st = 1.0 * np.exp(0.005 * rng.standard_normal(n))
    st[1800:] *= 1.15  # 15% slower from step 1800
    lr = np.minimum(np.arange(n) / 100, 1.0) * 3e-4
    lr[2200:2230] *= 4  # LR jump for 30 steps
    return loss, gn, st, lr


def run_scenario(m: Monitor) -> list[list[Anomaly]]:
    loss, gn, st, lr = scenario()
    out = []
    for i in range(loss.size):
        out.append(m.update("grad_norm", {}, i, gn[i]))
        out.append(m.update("loss", {}, i, loss[i]))
        out.append(m.update("step_time", {}, i, st[i]))
        out.append(m.update("lr", {}, i, lr[i]))
    out.append(m.finish())
    return out


GOLDEN = [
    ("spike", "loss", 1000, 1000, "info"),
    ("spike", "grad_norm", 1497, 1499, "warning"),
    ("spike", "loss", 1500, 1529, "warning"),
    ("grad_norm_precursor", "loss", 1497, 1500, "info"),
    ("divergence", "loss", 1507, 1552, "critical"),
    ("curve_deviation", "loss", 1522, 1623, "warning"),
    ("stall", "loss", 1574, 1629, "warning"),  # the 30-step spike: no progress meanwhile
    ("regression", "step_time", 1804, 2303, "warning"),
    ("nonfinite", "loss", 2000, 2000, "critical"),
    ("lr_sanity", "lr", 2200, 2229, "warning"),
    ("spike", "loss", 2522, 2721, "warning"),
    ("divergence", "loss", 2529, 2999, "critical"),
    ("curve_deviation", "loss", 2534, 2999, "warning"),  # the LR-aware law
    ("spike", "loss", 2764, 2963, "warning"),
    ("stall", "loss", 2779, 2999, "warning"),  # the octave test: a diverging loss stopped improving
]


def test_golden_scenario_gives_exactly_these_episodes():
    m = Monitor()
    run_scenario(m)
    got = [(a.detector, a.metric, a.start_step, a.end_step, a.severity) for a in m.anomalies]
    assert got == GOLDEN
    assert all(not a.is_open for a in m.anomalies)


def test_same_points_same_order_give_identical_anomalies():
    a, b = Monitor(), Monitor()
    run_scenario(a)
    run_scenario(b)
    assert canon(a.anomalies) == canon(b.anomalies)


def test_a_30_step_spike_is_one_episode_updated_in_place_then_closed():
    m = Monitor()
    loss = loss_curve(800, seed=2)
    loss[400:430] *= 1.8
    seen: list[Anomaly] = []
    for i, v in enumerate(loss):
        for a in m.update("loss", {}, i, v):
            if a.detector == "spike":
                seen.append(a)
    spikes = {id(a) for a in seen}
    assert len(spikes) == 1
    ep = seen[0]
    assert (ep.start_step, ep.end_step, ep.is_open) == (400, 429, False)
    assert ep.details["recovered"] is True and ep.details["duration"] == 30
    assert ep.details["peak_ratio"] == pytest.approx(1.8, rel=0.1)
    # Returned at opening, at every update while open, and once at closing.
    assert len(seen) == 31


def test_nan_is_critical_at_its_step_and_closes_at_finish_when_never_recovered():
    m = Monitor()
    out = [m.update("val_loss", {"rank": 0}, s, v) for s, v in enumerate([2.0, 1.9, math.nan])]
    (a,) = out[2]
    assert (a.detector, a.severity, a.start_step, a.labels, a.is_open) == (
        "nonfinite",
        "critical",
        2,
        {"rank": 0},
        True,
    )
    assert m.finish() == [a]
    assert not a.is_open and a.details["recovered"] is False


@pytest.mark.parametrize(
    ("metric", "role"),
    [
        ("loss", "loss"),
        ("train_loss", "loss"),
        ("mtp1_loss", "loss"),
        ("val_loss", "loss"),
        ("grad_norm", "grad_norm"),
        ("grad_norm_layer3", "grad_norm"),
        ("lr", "lr"),
        ("learning_rate", "lr"),
        ("tokens_per_s", "throughput"),
        ("samples_per_s", "throughput"),
        ("train_throughput", "throughput"),
        ("tflops_per_gpu", "throughput"),
        ("step_time_ms", "step_time"),
        ("iteration_time", "step_time"),
        ("gpu_mem_alloc_bytes", "other"),
        ("grad_num_zeros", "other"),
    ],
)
def test_roles_come_from_names(metric, role):
    assert role_of(metric) == role


def test_config_overrides_roles_and_rejects_unknown_roles():
    m = Monitor({"reward_mean": "throughput"})
    for i in range(300):
        m.update("reward_mean", {}, i, 1.0 if i < 200 else 0.5)
    assert any(a.detector == "regression" for a in m.anomalies)
    assert Monitor({"roles": {"x": "loss"}}).config == {"x": "loss"}
    with pytest.raises(ValueError, match="valid values: loss, grad_norm"):
        Monitor({"x": "lossy"})


def test_other_metrics_get_only_the_nonfinite_detector():
    m = Monitor()
    vals = [1.0] * 100 + [1e6] * 10 + [math.inf]
    for i, v in enumerate(vals):
        m.update("gpu_mem_alloc_bytes", {"gpu": 3}, i, v)
    assert [(a.detector, a.start_step) for a in m.anomalies] == [("nonfinite", 110)]


def test_out_of_order_points_only_reach_the_nonfinite_check():
    m = Monitor()
    loss = loss_curve(500, seed=4)
    for i, v in enumerate(loss):
        m.update("loss", {}, i, v)
    m.update("loss", {}, 100, 50.0)  # a late, huge point: not a spike of the present
    m.update("loss", {}, 101, math.nan)  # but a late NaN is still a NaN
    assert m.health["out_of_order_points"] == 2
    assert [a.detector for a in m.anomalies if a.start_step >= 100] == ["nonfinite"]


def test_restart_event_lets_steps_go_back_without_alarms():
    m = Monitor()
    loss = loss_curve(1200, seed=9)
    for i in range(800):
        m.update("loss", {}, i, loss[i])
    m.event(Event("restart", step=600, time=0.0))
    for i in range(600, 1200):  # the redone steps after resuming from a checkpoint
        m.update("loss", {}, i, loss[i])
    m.finish()
    assert m.health["out_of_order_points"] == 0
    assert not [a for a in m.anomalies if a.severity != "info"]


def test_anomaly_list_is_bounded():
    m = Monitor(max_anomalies=5)
    for i in range(200):
        m.update("grad_num_zeros", {}, i, math.nan if i % 10 == 0 else 1.0)
    assert len(m.anomalies) == 5
    assert m.anomalies[-1].start_step == 190


def test_state_stays_bounded_over_a_very_long_run():
    m = Monitor()
    rng = np.random.default_rng(0)
    n = 40_000
    steps = np.arange(n) * 250  # 10M steps
    loss = (2.0 + 8.0 * (steps + 500.0) ** -0.3) * np.exp(0.01 * rng.standard_normal(n))
    loss[::997] *= 3.0
    for s, v in zip(steps.tolist(), loss.tolist(), strict=True):
        m.update("loss", {}, s, v)
    dets = m._series[("loss", (None, None, None))].detectors
    spike = next(d for d in dets if isinstance(d, Spike))
    div = next(d for d in dets if isinstance(d, Divergence))
    dev = next(d for d in dets if isinstance(d, CurveDeviation))
    assert len(spike._core.baseline) <= spike.window
    assert len(spike._core.score_window) <= spike.score_window
    assert len(div.block_means) <= div.ref_blocks
    assert dev.n_bins < 200
    stall = next(d for d in dets if isinstance(d, Stall))
    assert all(n < 200 for n in stall.n_bins)  # learned bins, every point's bins
    assert 0 < m.health["spike_score"]["loss"] < 0.01


def test_health_reports_spike_scores_and_counts():
    m = Monitor()
    run_scenario(m)
    h = m.health
    assert h["points"] == 12_000 and h["series"] == 4
    assert h["spike_score"]["loss"] == pytest.approx(40 / 3000, abs=0.005)
    assert h["anomalies_by_severity"] == {"info": 2, "warning": 10, "critical": 3}
    assert h["detector_errors"] == 0


def test_precursor_links_a_grad_norm_burst_to_the_loss_spike_after_it():
    m = Monitor()
    run_scenario(m)
    (link,) = [a for a in m.anomalies if a.detector == "grad_norm_precursor"]
    assert link.details["lead_steps"] == 3
    loss_spike = next(a for a in m.anomalies if a.detector == "spike" and a.start_step == 1500)
    assert loss_spike.details["precursor"]["grad_norm_start"] == 1497


def test_a_detector_bug_never_raises_into_the_caller(monkeypatch):
    def boom(self, step, value):
        raise RuntimeError("bug")

    monkeypatch.setattr(Spike, "update", boom)
    m = Monitor()
    for i in range(10):
        m.update("loss", {}, i, 1.0)
    assert m.health["detector_errors"] == 10


def test_a_value_that_is_not_a_number_is_counted_not_raised():
    m = Monitor()
    assert m.update("loss", {}, 1, None) == []
    assert m.update("loss", {}, None, 1.0) == []
    assert m.update("loss", {}, 2, "abc") == []
    assert m.health["bad_points"] == 3
