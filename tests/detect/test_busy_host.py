"""A busy host holds step-time and throughput alarms; a slowdown it does not explain is caught."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from runwatch.detect import Monitor, analyze_frame
from runwatch.detect.busy import BUSY_WAIT, BusyClock

SAMPLE_EVERY = 20  # steps per CPU-wait sample (one per writer flush)


def _run(slow: tuple[int, int], factor: float, wait_during_slow: float) -> pd.DataFrame:
    """1,000 steps of noisy step time and tokens/s, slowed by ``factor`` over ``slow``;
    CPU-wait samples every SAMPLE_EVERY steps, ``wait_during_slow`` while slowed."""
    rng = np.random.default_rng(3)
    steps = np.arange(1000)
    t = 0.01 * np.exp(rng.normal(0, 0.03, steps.size))
    inside = (steps >= slow[0]) & (steps <= slow[1])
    t[inside] *= factor
    sampled = steps[::SAMPLE_EVERY]
    wait = np.where((sampled >= slow[0]) & (sampled <= slow[1]), wait_during_slow, 0.01)
    frames = [
        pd.DataFrame({"metric": "host_cpu_wait", "step": sampled, "value": wait}),
        pd.DataFrame({"metric": "step_time_s", "step": steps, "value": t}),
        pd.DataFrame({"metric": "tokens_per_s", "step": steps, "value": 128 / t}),
    ]
    return pd.concat(frames, ignore_index=True)


def _by(anomalies, detector):
    return [a for a in anomalies if a.detector == detector]


def test_a_slowdown_while_the_thread_waited_for_a_cpu_is_held_and_named():
    found = analyze_frame(_run((400, 519), 3.0, wait_during_slow=0.55))
    assert _by(found, "regression") == []
    (busy,) = _by(found, "host_busy")
    assert (busy.severity, busy.start_step, busy.end_step) == ("info", 400, 500)
    assert "waited 0.55 s per second for a CPU" in busy.message


def test_the_same_slowdown_with_no_cpu_wait_is_a_warning():
    found = analyze_frame(_run((400, 519), 3.0, wait_during_slow=0.01))
    alarms = [a for a in _by(found, "regression") if a.severity != "info"]
    assert sorted(a.metric for a in alarms) == ["step_time_s", "tokens_per_s"]
    assert all(400 <= a.start_step <= 410 for a in alarms)
    assert _by(found, "host_busy") == []


def test_a_wait_below_the_busy_wait_holds_nothing():
    found = analyze_frame(_run((400, 519), 3.0, wait_during_slow=BUSY_WAIT / 2))
    assert any(a.severity != "info" for a in _by(found, "regression"))


@pytest.mark.parametrize("wait", [0.55, 0.01])
def test_row_by_row_gives_what_the_batch_gives(wait):
    df = _run((400, 519), 3.0, wait_during_slow=wait)
    df = df.sort_values("step", kind="stable")  # replay order: CPU wait first in a step
    row = Monitor()
    for r in df.itertuples():
        row.update(r.metric, {}, r.step, r.value)
    row.finish()
    batch = analyze_frame(df)

    def shape(anomalies):
        return sorted(
            (a.detector, a.metric, a.start_step, a.end_step, a.severity) for a in anomalies
        )

    assert shape(row.anomalies) == shape(batch)


def test_a_sample_covers_the_steps_up_to_the_next_and_a_restart_forgets_later_ones():
    clock = BusyClock()
    for step, share in [(0, 0.0), (20, 0.3), (40, 0.0), (60, 0.5)]:
        clock.add(step, share)
    assert clock.held_many(np.array([19, 20, 39, 40, 75])).tolist() == [
        False,
        True,
        True,
        False,
        True,
    ]
    clock.add(30, 0.0)  # the run resumed from step 30: the samples after it are gone
    assert [clock.held(s) for s in (25, 30, 70)] == [True, False, False]


def test_only_the_last_samples_are_kept():
    clock = BusyClock()
    for step in range(0, 10_000, 10):
        clock.add(step, 0.5 if step >= 9_000 else 0.0)
        clock.trim()
    assert len(clock._steps) <= 2 * BusyClock.KEEP
    assert clock.held(9_995) and not clock.held(8_985)


def test_on_real_runs_of_a_busy_machine_the_hold_leaves_a_fraction_of_the_warnings():
    """The committed tiny-LM runs made while other processes loaded this 2-core machine
    (bench/data/tiny_lm_clean): the same points without their CPU-wait readings get
    several times the step-time and throughput warnings."""
    data = Path(__file__).resolve().parents[2] / "bench/data/tiny_lm_clean"
    runs = [pd.read_csv(path) for path in sorted(data.glob("*.csv.gz"))]
    assert len(runs) == 10 and all((df["metric"] == "host_cpu_wait").any() for df in runs)

    def warnings(frame: pd.DataFrame) -> int:
        return sum(a.severity != "info" for a in _by(analyze_frame(frame), "regression"))

    held = sum(warnings(df) for df in runs)
    unheld = sum(warnings(df[df["metric"] != "host_cpu_wait"]) for df in runs)
    assert unheld >= 10
    assert held * 2 < unheld
