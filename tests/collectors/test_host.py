"""The host collector: real psutil readings, and rates from counter differences."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runwatch.collectors.host import HostCollector


def test_real_psutil_readings_are_present_and_sane():
    c = HostCollector()
    r = c.poll()
    assert 0.0 <= r["host_cpu_pct"] <= 100.0
    assert 0.0 < r["host_mem_pct"] < 100.0 and r["host_mem_used_gib"] > 0
    assert 0.0 <= r["host_disk_pct"] <= 100.0
    assert "host_net_recv_bps" not in r  # no rate before a second poll
    assert "host_net_recv_bps" in c.poll()


class FakePsutil:
    def __init__(self):
        self.n = 0

    def cpu_percent(self, interval=None):
        return 50.0

    def getloadavg(self):
        return (1.5, 1.0, 0.5)

    def virtual_memory(self):
        return SimpleNamespace(used=8 << 30, percent=33.0)

    def disk_usage(self, path):
        return SimpleNamespace(percent=71.0)

    def disk_io_counters(self):
        return SimpleNamespace(read_bytes=1000 * self.n, write_bytes=4000 * self.n)

    def net_io_counters(self):
        self.n += 1
        return SimpleNamespace(bytes_recv=10_000 * self.n, bytes_sent=2_000 * self.n)


def test_rates_come_from_counter_differences_over_the_injected_clock():
    now = [100.0]
    c = HostCollector(FakePsutil(), clock=lambda: now[0])
    first = c.poll()
    assert first["host_load1"] == 1.5 and first["host_mem_used_gib"] == 8.0
    now[0] = 110.0
    second = c.poll()
    assert second["host_net_recv_bps"] == pytest.approx(1000.0)
    assert second["host_net_sent_bps"] == pytest.approx(200.0)
    assert second["host_disk_read_bps"] == pytest.approx(100.0)


def test_a_failing_sensor_costs_only_its_own_reading():
    ps = FakePsutil()
    ps.disk_usage = lambda path: (_ for _ in ()).throw(OSError("no such mount"))
    r = HostCollector(ps).poll()
    assert "host_disk_pct" not in r and r["host_cpu_pct"] == 50.0
