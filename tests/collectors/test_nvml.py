"""The NVML collector through the real code path, driven by a recorded device."""

from __future__ import annotations

import logging

import pynvml
import pytest

from runwatch.collectors import nvml as nvml_mod
from runwatch.collectors.nvml import CRITICAL_XIDS, NvmlCollector
from runwatch.collectors.recorded_nvml import RecordedNvml
from runwatch.detect.fleet.hardware import CRITICAL_XIDS as DETECTOR_CRITICAL_XIDS


def test_absent_nvml_is_one_info_message_and_no_gpus(caplog):
    caplog.set_level(logging.INFO, logger="runwatch.collectors")
    c = NvmlCollector(RecordedNvml.missing())
    assert c.open() is False
    assert c.poll() == [] and c.poll_xids() == []
    msgs = [r for r in caplog.records if "NVML" in r.getMessage()]
    assert len(msgs) == 1 and msgs[0].levelno == logging.INFO
    assert "NVML Shared Library Not Found" in msgs[0].getMessage()


def test_the_real_pynvml_here_reports_no_library(caplog):
    # No GPU on this machine: the default module path must say so, not raise.
    caplog.set_level(logging.INFO, logger="runwatch.collectors")
    c = NvmlCollector()
    assert c.open() is False
    assert any("no GPU metrics" in r.getMessage() for r in caplog.records)


def test_recorded_h100_readings_come_out_in_units():
    c = NvmlCollector(RecordedNvml.h100(gpus=2))
    assert c.open()
    (labels, r), (labels1, _) = c.poll()
    assert labels == {"gpu": 0} and labels1 == {"gpu": 1}
    assert r["gpu_temp_c"] == 62.0
    assert r["gpu_power_w"] == 640.0 and r["gpu_power_limit_w"] == 700.0
    assert r["gpu_util_pct"] == 98.0 and r["gpu_mem_util_pct"] == 61.0
    assert r["gpu_mem_total_gib"] == pytest.approx(81_559 / 1024)
    assert r["gpu_mem_used_gib"] == pytest.approx(71_204 / 1024)
    assert r["gpu_clock_sm_mhz"] == 1980.0
    assert r["gpu_throttle_thermal"] == 0.0 and r["gpu_throttle_power"] == 0.0
    assert r["gpu_ecc_corrected"] == 0.0 and r["gpu_retired_pages"] == 0.0
    assert r["gpu_remapped_rows_unc"] == 0.0 and r["gpu_remap_failure"] == 0.0
    assert [d.name for d in c.devices] == ["NVIDIA H100 80GB HBM3"] * 2
    c.close()


def test_frames_advance_per_poll_and_throttle_bits_decode():
    frames = [{}, {"temp": 84, "reasons": 0x40}, {"temp": 80, "reasons": 0x04, "ecc_unc": 2}]
    c = NvmlCollector(RecordedNvml.h100(gpus=1, frames=frames))
    c.open()
    seen = [c.poll()[0][1] for _ in range(4)]
    assert [s["gpu_temp_c"] for s in seen] == [62.0, 84.0, 80.0, 80.0]
    assert [s["gpu_throttle_thermal"] for s in seen] == [0.0, 1.0, 0.0, 0.0]
    assert [s["gpu_throttle_power"] for s in seen] == [0.0, 0.0, 1.0, 1.0]
    assert seen[2]["gpu_ecc_uncorrected"] == 2.0


def test_unsupported_reading_is_dropped_once_and_never_asked_again():
    nv = RecordedNvml.h100(gpus=1, unsupported=("nvmlDeviceGetRemappedRows",))
    c = NvmlCollector(nv)
    c.open()
    for _ in range(3):
        ((_, r),) = c.poll()
        assert "gpu_remapped_rows_corr" not in r and "gpu_temp_c" in r
    assert nv.calls["nvmlDeviceGetRemappedRows"] == 1


def test_xids_are_drained_with_their_gpu_and_criticality():
    nv = RecordedNvml.h100(gpus=4, frames=[{}, {}])
    c = NvmlCollector(nv)
    c.open()
    nv.inject_xid(2, 79)
    nv.inject_xid(3, 13)
    assert [(x.gpu, x.xid, x.critical) for x in c.poll_xids()] == [(2, 79, True), (3, 13, False)]
    assert c.poll_xids() == []


def test_xid_in_a_recorded_frame_reaches_the_event_path():
    c = NvmlCollector(RecordedNvml.h100(gpus=2, frames=[{}, {"xids": [48]}]))
    c.open()
    c.poll()
    assert c.poll_xids() == []
    c.poll()
    assert [(x.gpu, x.xid) for x in c.poll_xids()] == [(0, 48), (1, 48)]


def test_a_transient_error_skips_the_reading_for_this_poll_only(monkeypatch):
    nv = RecordedNvml.h100(gpus=1)
    c = NvmlCollector(nv)
    c.open()
    real = nv.nvmlDeviceGetPowerUsage
    monkeypatch.setattr(
        nv,
        "nvmlDeviceGetPowerUsage",
        lambda h: (_ for _ in ()).throw(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)),
    )
    ((_, r),) = c.poll()
    assert "gpu_power_w" not in r and "gpu_temp_c" in r
    monkeypatch.setattr(nv, "nvmlDeviceGetPowerUsage", real)
    ((_, r),) = c.poll()
    assert r["gpu_power_w"] == 640.0


def test_critical_xid_lists_agree_between_collector_and_detector():
    assert CRITICAL_XIDS == DETECTOR_CRITICAL_XIDS
    assert {48, 63, 64, 74, 79, 92, 94, 95, 119, 120} <= CRITICAL_XIDS
    assert nvml_mod.log.name == "runwatch.collectors"
