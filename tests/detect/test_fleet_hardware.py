"""Hardware rules by replay: each symptom with its GPU, step and severity."""

from __future__ import annotations

import pandas as pd

from runwatch.detect.fleet.hardware import HardwareMonitor
from runwatch.detect.fleet.monitor import FleetMonitor, fleet_anomalies
from runwatch.model import Event

GPU = {"rank": 12, "host": "node-1", "gpu": 4}


def feed(hw, metric, values, labels=GPU, first=0):
    out = []
    for i, v in enumerate(values):
        out += hw.update(metric, labels, first + i, v)
    return unique(out)


def unique(anomalies):
    return list({id(a): a for a in anomalies}.values())


def test_thermal_throttling_opens_after_sustain_and_closes_after_quiet():
    hw = HardwareMonitor(sustain=3, quiet=2)
    eps = feed(hw, "gpu_throttle_thermal", [0, 1, 1, 1, 1, 0, 0, 0])
    (a,) = eps
    assert (a.details["rule"], a.start_step, a.end_step, a.labels) == ("thermal", 3, 4, GPU)
    assert not a.is_open and a.details["recovered"]


def test_temperature_warns_then_goes_critical():
    hw = HardwareMonitor(sustain=1)
    (a,) = feed(hw, "gpu_temp_c", [70, 86, 93])
    assert (a.start_step, a.severity) == (1, "critical") and "93 C" in a.message


def test_runaway_temperature_rise_is_caught_below_the_limit():
    hw = HardwareMonitor(sustain=1, runaway_samples=4, runaway_rise=15)
    (a,) = feed(hw, "gpu_temp_c", [55, 55, 60, 66, 71, 71])
    assert a.start_step == 4 and "runaway" in a.message


def test_power_capping_is_info():
    hw = HardwareMonitor(sustain=2)
    hw.update("gpu_power_limit_w", GPU, 0, 700)
    (a,) = feed(hw, "gpu_power_w", [600, 690, 699, 700])
    assert (a.details["rule"], a.severity, a.start_step) == ("power_cap", "info", 2)


def test_every_xid_is_reported_and_the_critical_ones_are_critical():
    hw = HardwareMonitor()
    (a,) = hw.xid(GPU, 500, 79)
    (b,) = hw.xid(GPU, 510, 13)
    hw.xid(GPU, 511, 79)
    assert (a.severity, b.severity) == ("critical", "warning")
    assert a.details["count"] == 2 and a.end_step == 511 and a.labels == GPU


def test_rising_ecc_and_remap_failure_are_critical_corrected_ecc_warns():
    hw = HardwareMonitor()
    (unc,) = feed(hw, "gpu_ecc_uncorrected", [0, 0, 2, 2])
    (corr,) = feed(hw, "gpu_ecc_corrected", [5, 5, 5, 9])
    (fail,) = feed(hw, "gpu_remap_failure", [0, 1, 1])
    assert (unc.severity, unc.start_step, unc.details["increase"]) == ("critical", 2, 2.0)
    assert (corr.severity, corr.start_step, corr.metric) == ("warning", 3, "gpu_ecc_corrected")
    assert (fail.severity, fail.start_step) == ("critical", 1)


def test_memory_near_the_limit_warns():
    hw = HardwareMonitor(mem_fraction=0.97)
    hw.update("gpu_mem_total_gib", GPU, 0, 80.0)
    (a,) = feed(hw, "gpu_mem_used_gib", [70.0, 78.0, 78.5], first=1)
    assert (a.start_step, a.observed, a.end_step) == (2, 78.0 / 80, 3)


def test_one_gpu_idle_while_the_others_work_is_named():
    hw = HardwareMonitor(sustain=2)
    out = []
    for step in range(6):
        for g in range(8):
            util = 3.0 if (g == 6 and step >= 2) else 97.0
            hw.update("gpu_util_pct", {"host": "node-0", "gpu": g}, step, util)
        out += hw.end_step(step)
    (a,) = unique(out)
    assert (a.labels, a.start_step, a.details["rule"]) == (
        {"host": "node-0", "gpu": 6},
        3,
        "util_collapse",
    )


def test_everyone_idle_is_not_a_collapse():
    hw = HardwareMonitor(sustain=1)
    for g in range(4):
        hw.update("gpu_util_pct", {"gpu": g}, 0, 0.0)
    assert hw.end_step(0) == []


def test_fleet_monitor_takes_xid_events_with_rank_host_and_gpu():
    fm = FleetMonitor()
    ev = Event(
        "xid", 77, 1.0, "critical XID 79 on GPU 2", rank=10, host="n2", attrs={"xid": 79, "gpu": 2}
    )
    (a,) = fm.event(ev)
    assert a.labels == {"rank": 10, "host": "n2", "gpu": 2} and a.severity == "critical"


def test_replay_of_gpu_series_names_the_gpu():
    rows = [
        ("gpu_temp_c", 3, "node-0", g, s, 95.0 if (g == 1 and s >= 4) else 60.0)
        for s in range(10)
        for g in range(2)
    ]
    pts = pd.DataFrame(rows, columns=["metric", "rank", "host", "gpu", "step", "value"])
    events = pd.DataFrame(
        {
            "kind": ["xid"],
            "step": [7],
            "time": [7.0],
            "rank": [3],
            "host": ["node-0"],
            "message": [""],
            "attrs": ['{"xid": 48, "gpu": 1}'],
        }
    )
    got = [
        (a.details["rule"], a.labels, a.start_step, a.severity)
        for a in fleet_anomalies(pts, events)
    ]
    assert got == [
        ("xid", {"rank": 3, "host": "node-0", "gpu": 1}, 7, "critical"),
        ("thermal", {"rank": 3, "host": "node-0", "gpu": 1}, 6, "critical"),
    ]
