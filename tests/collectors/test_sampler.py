"""The sampler thread with a real run and store: GPU and host series, XIDs as events."""

from __future__ import annotations

import json
import logging
import time

import runwatch
from runwatch.collectors.recorded_nvml import RecordedNvml
from runwatch.collectors.sampler import Sampler, start_system_metrics


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_system_metrics_land_in_the_store_under_gpu_labels_with_xid_events(db_path):
    nv = RecordedNvml.h100(gpus=2, frames=[{}, {"temp": 70, "xids": []}, {"temp": 71}])
    run = runwatch.init(name="sys", store=db_path, labels={"rank": 3, "host": "node-7"})
    run.log({"loss": 2.0}, step=5)
    sampler = start_system_metrics(run, interval_s=0.02, nvml=nv)
    nv.inject_xid(1, 79)
    wait_for(lambda: sampler.polls >= 3)
    assert sampler.stop(5.0)
    run.finish()
    store = runwatch.open_store(str(db_path))
    series = store.series("sys")
    temps = series[series["metric"] == "gpu_temp_c"]
    assert sorted(temps["gpu"].tolist()) == [0, 1]
    assert set(temps["rank"]) == {3} and set(temps["host"]) == {"node-7"}
    host = series[series["metric"] == "host_cpu_pct"]
    assert len(host) == 1 and host["gpu"].isna().all()
    pts = store.read_series(
        "sys", "gpu_temp_c", {"rank": 3, "host": "node-7", "gpu": 1}, all_attempts=True
    )
    assert pts["value"].tolist()[:3] == [62.0, 70.0, 71.0] and set(pts["step"]) == {5}
    xid = store.events("sys", kinds=["xid"])
    assert len(xid) == 1
    assert (xid["rank"].item(), xid["host"].item()) == (3, "node-7")
    assert json.loads(xid["attrs"].item()) == {"xid": 79, "gpu": 1, "critical": True}
    assert "critical XID 79 on GPU 1" in xid["message"].item()


def test_without_nvml_host_metrics_are_still_collected(db_path, caplog):
    caplog.set_level(logging.INFO, logger="runwatch.collectors")
    run = runwatch.init(name="cpu-only", store=db_path)
    sampler = start_system_metrics(run, interval_s=0.02, nvml=RecordedNvml.missing())
    wait_for(lambda: sampler.polls >= 2)
    sampler.stop()
    run.finish()
    metrics = set(runwatch.open_store(str(db_path)).series("cpu-only")["metric"])
    assert "host_mem_pct" in metrics and not any(m.startswith("gpu_") for m in metrics)
    infos = [r for r in caplog.records if "no GPU metrics" in r.getMessage()]
    assert len(infos) == 1 and infos[0].levelno == logging.INFO


class Sink:
    def __init__(self):
        self.points, self.events = [], []

    def log_labeled(self, data, labels, step=None):
        self.points.append((labels, data))

    def event(self, kind, step=None, message="", **attrs):
        self.events.append((kind, attrs))


def test_a_collector_bug_is_logged_and_counted_never_raised(caplog):
    sink = Sink()
    s = Sampler(sink, nvml=RecordedNvml.h100(gpus=1), host=False)
    s.gpus.poll = lambda: 1 / 0
    s.poll_once()
    s.poll_once()
    assert s.errors == 2 and s.polls == 2 and sink.points == []
    assert any("ZeroDivisionError" in r.getMessage() for r in caplog.records)
    s.stop()


def test_stop_is_prompt_even_with_a_long_interval():
    s = Sampler(Sink(), nvml=RecordedNvml.h100(gpus=1), interval_s=3600.0).start()
    wait_for(lambda: s.polls == 1)
    t0 = time.monotonic()
    assert s.stop(5.0) and not s.running
    assert time.monotonic() - t0 < 1.0


def test_bad_interval_is_rejected_naming_valid_values():
    import pytest

    with pytest.raises(ValueError, match="valid values"):
        Sampler(Sink(), interval_s=0, gpu=False, host=False)


def test_poll_cost_is_far_below_half_a_percent_of_a_core_at_ten_seconds():
    s = Sampler(Sink(), nvml=RecordedNvml.h100(gpus=8), host=True, interval_s=10.0)
    for _ in range(50):
        s.poll_once()
    assert s.stats()["core_fraction"] < 0.005
    s.stop()
