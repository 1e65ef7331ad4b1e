"""Stragglers by replay: exact rank and steps, clean fleets, bounded memory."""

from __future__ import annotations

import numpy as np
import pytest

from runwatch.detect.fleet.monitor import FleetMonitor
from runwatch.detect.fleet.stragglers import StragglerDetector


def feed(det, matrix, first_step=0):
    changes = []
    for i, row in enumerate(matrix):
        changes += det.update(first_step + i, row)
    return changes


def fleet(steps, ranks, seed, noise=0.01):
    rng = np.random.default_rng(seed)
    return 1.0 + noise * rng.standard_normal((steps, ranks))


def test_a_persistent_ten_percent_straggler_is_named_with_host_gpu_and_exact_steps():
    t = fleet(600, 16, seed=1)
    t[300:, 11] *= 1.10
    det = StragglerDetector()
    for col in range(16):
        det.set_labels(col, {"rank": col, "host": f"node-{col // 8}", "gpu": col % 8})
    changes = feed(det, t)
    assert len(changes) == 1
    a = changes[0]
    assert a.labels == {"rank": 11, "host": "node-1", "gpu": 3}
    assert (a.start_step, a.details["detected_at"]) == (300, 329)
    assert a.details["slowdown"] == pytest.approx(1.10, abs=0.01)
    assert a.details["lost_throughput"] == pytest.approx(0.091, abs=0.01)
    assert a.is_open and a.severity == "warning" and "rank 11" in a.message
    (closed,) = det.finish()
    assert closed is a and not a.is_open and a.details["recovered"] is False


def test_lost_seconds_and_recovery_are_exact_on_a_noise_free_fleet():
    t = np.ones((300, 8))
    t[100:200, 2] = 1.2
    det = StragglerDetector(window=20)
    changes = feed(det, t)
    opened, closed = changes  # closed at step 213: 6 slow steps of 20 left
    assert opened is closed and closed.details["recovered"] is True
    assert (closed.start_step, closed.details["detected_at"], closed.end_step) == (100, 111, 212)
    # the others waited 0.2 s on each of steps 112..199 while the episode was open
    assert closed.details["lost_seconds"] == pytest.approx(88 * 0.2)
    assert closed.details["peak_slowdown"] == pytest.approx(1.2, abs=1e-6)


def test_a_clean_fleet_accuses_nobody():
    det = StragglerDetector()
    assert feed(det, fleet(3000, 256, seed=2, noise=0.02)) == []


def test_a_short_burst_below_the_persistence_is_not_a_straggler():
    t = fleet(400, 32, seed=3)
    t[200:225, 5] *= 1.5  # 25 slow steps < 0.6 x 50
    assert feed(StragglerDetector(), t) == []


def test_a_severe_straggler_is_critical():
    t = fleet(200, 16, seed=4)
    t[50:, 9] *= 1.4
    (a,) = feed(StragglerDetector(), t)
    assert a.labels == {"rank": 9} and a.severity == "critical"


def test_missing_ranks_are_not_accused_and_new_ranks_are_taken_in():
    t = fleet(300, 8, seed=5)
    t[::3, 4] = np.nan
    det = StragglerDetector(window=20)
    feed(det, t)
    assert det.episodes == []
    wider = fleet(100, 12, seed=6)
    wider[:, 10] *= 1.3
    (a,) = feed(det, wider, first_step=300)
    assert a.labels == {"rank": 10} and det.ranks == 12


def test_memory_is_bounded_by_the_window():
    det = StragglerDetector(window=30)
    feed(det, fleet(500, 64, seed=7))
    assert det._slow.shape == (30, 64) and det._ratio.shape == (30, 64)


def test_half_the_fleet_slow_is_a_job_wide_shift_not_stragglers():
    t = fleet(300, 8, seed=8)
    t[100:, :4] *= 1.3
    t[100:, 4:] *= 1.3
    assert feed(StragglerDetector(), t) == []


@pytest.mark.parametrize(
    "kw", [{"window": 1}, {"min_fraction": 2.0}, {"min_excess": -1.0}, {"min_ranks": 1}]
)
def test_bad_parameters_are_rejected_naming_valid_values(kw):
    with pytest.raises(ValueError, match="valid values"):
        StragglerDetector(**kw)


def test_the_floor_of_a_few_steps_sees_a_straggler_through_one_sided_spikes():
    """Three ranks whose own time gains 20-100% in a step in four (preemption): step by step
    the spikes outvote a 20% straggler; the floor of 9 steps does not, and accuses nobody."""
    rng = np.random.default_rng(11)
    t = 1.0 + 0.01 * rng.standard_normal((400, 3))
    t += (rng.random((400, 3)) < 0.25) * rng.uniform(0.2, 1.0, (400, 3))
    t[200:, 1] += 0.2
    plain = feed(StragglerDetector(), t)
    assert not [a for a in plain if 200 <= a.details["detected_at"] <= 250]
    (a,) = feed(StragglerDetector(smooth=9, short_ratio=1e9), t)
    assert a.labels == {"rank": 1} and 200 <= a.details["detected_at"] <= 250
    assert a.details["slowdown"] == pytest.approx(1.2, abs=0.03)


def test_the_fleet_monitor_reads_gpu_metrics_and_ranks_points_and_nothing_else():
    reads = FleetMonitor.reads
    assert reads("gpu_temp", {"gpu": 0}) and reads("step_time_s", {"rank": 3})
    assert reads("loss", {"rank": 0})  # a rank's metric: its wait or step time may matter
    assert not reads("loss", {}) and not reads("step_time_s", None)
    assert not reads("step_time_s", {"rank": float("nan")})  # a CSV gap is no rank
    # What it does not read leaves no trace: the same points with and without them.
    with_others, without = FleetMonitor(), FleetMonitor()
    for step in range(300):
        slow = 0.3 if step >= 150 else 0.1
        for rank in range(4):
            t = slow if rank == 2 else 0.1
            for monitor in (with_others, without):
                monitor.update("step_time_s", {"rank": rank}, step, t, time=1000.0 + step)
        with_others.update("loss", {}, step, 2.0, time=1000.0 + step)
        with_others.update("step_time_s", {}, step, 0.1, time=1000.0 + step)
    with_others.finish()
    without.finish()
    found = [(a.detector, a.start_step) for a in with_others.anomalies]
    assert found == [(a.detector, a.start_step) for a in without.anomalies]
    assert found  # rank 2 is a straggler from step 150
