"""The DCGM path against a real Prometheus server scraping recorded exporter text.

:func:`prometheus_scraping` (a real Prometheus scraping a tiny exporter that serves recorded
``dcgm-exporter`` text for some hosts) is shared with ``test_dcgm_poller.py`` and
``tests/server/test_serve_dcgm.py``.
"""

from __future__ import annotations

import contextlib
import http.server
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from runwatch.collectors.dcgm import DcgmSource, PrometheusError, PrometheusSource, RankMap

PROMETHEUS = shutil.which("prometheus")

LABELS = (
    'gpu="{gpu}",UUID="GPU-{host}-{gpu}",pci_bus_id="00000000:{bus}:00.0",device="nvidia{gpu}",'
    'modelName="NVIDIA H100 80GB HBM3",Hostname="{host}",DCGM_FI_DRIVER_VERSION="535.129.03"'
)
FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
)


def exposition(host: str) -> str:
    """What dcgm-exporter 3.3 serves for a host with two H100s (node-b GPU 1 is hot, XID 79)."""
    lines = []
    for name, kind, help_ in FIELDS:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        for gpu in (0, 1):
            bad = host == "node-b" and gpu == 1
            value = {
                "DCGM_FI_DEV_SM_CLOCK": 1410 if bad else 1980,
                "DCGM_FI_DEV_GPU_TEMP": 91 if bad else 60 + gpu,
                "DCGM_FI_DEV_POWER_USAGE": 612.5,
                "DCGM_FI_DEV_GPU_UTIL": 100,
                "DCGM_FI_DEV_FB_USED": 72_704,
                "DCGM_FI_DEV_XID_ERRORS": 79 if bad else 0,
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 2 if bad else 0,
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
            }[name]
            bus = f"{0x18 + gpu:02X}"
            lines.append(f"{name}{{{LABELS.format(gpu=gpu, host=host, bus=bus)}}} {value}")
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Exporter(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        host = self.path.strip("/").split("/")[0]
        body = exposition(host).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Quiet: the test checks what arrived, not the access log."""


@contextlib.contextmanager
def prometheus_scraping(d: Path, hosts: Sequence[str]) -> Iterator[PrometheusSource]:
    """A real Prometheus scraping, every second, the recorded exporter text of ``hosts``
    (two GPUs each); yields a client once it holds every host's samples. Skips the test if
    the prometheus binary is absent (CI installs it: .ci/run)."""
    if PROMETHEUS is None:
        pytest.skip(
            "prometheus is not installed (apt-get install -y --no-install-recommends prometheus)"
        )
    exporter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{exporter.server_address[1]}"
    jobs = "\n".join(
        f"  - job_name: dcgm-{i}\n    metrics_path: /{h}/metrics\n"
        f"    static_configs: [{{targets: ['{target}']}}]"
        for i, h in enumerate(hosts)
    )
    (d / "prom.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n" + jobs + "\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={d / 'prom.yml'}",
            f"--storage.tsdb.path={d / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(d / "prom.log", "w"),  # noqa: SIM115 (closed with the process)
    )
    url = f"http://127.0.0.1:{port}"
    source = PrometheusSource(url)
    deadline = time.monotonic() + 40
    last_error: Exception | None = None
    try:
        while True:  # the first samples land ~5-6 s after start: poll with a deadline
            try:
                if len(source.query("DCGM_FI_DEV_GPU_TEMP")) == 2 * len(hosts):
                    break
            except PrometheusError as exc:  # not scraped yet: poll again
                last_error = exc
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"prometheus never had the DCGM samples (last error: {last_error}): "
                    f"{(d / 'prom.log').read_text()[-2000:]}"
                )
            time.sleep(0.25)
        yield source
    finally:
        source.close()
        proc.terminate()
        proc.wait(10)
        exporter.shutdown()
        exporter.server_close()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusSource]:
    with prometheus_scraping(tmp_path_factory.mktemp("prom"), ("node-a", "node-b")) as source:
        yield source


def test_dcgm_readings_come_back_under_ranks_hosts_and_gpus(prometheus):
    frame = DcgmSource(prometheus).readings()
    temp = frame[frame["metric"] == "gpu_temp_c"].set_index("rank")
    assert temp.loc[[0, 1, 2, 3], ["host", "gpu"]].values.tolist() == [
        ["node-a", 0],
        ["node-a", 1],
        ["node-b", 0],
        ["node-b", 1],
    ]
    assert temp["value"].tolist() == [60.0, 61.0, 60.0, 91.0]
    mem = frame[(frame["metric"] == "gpu_mem_used_gib") & (frame["rank"] == 3)]
    assert mem["value"].item() == pytest.approx(71.0)  # 72,704 MiB
    assert set(frame["metric"]) >= {"gpu_power_w", "gpu_util_pct", "gpu_ecc_uncorrected"}


def test_dcgm_rank_map_from_the_job_wins_over_host_order(prometheus):
    ranks = RankMap({("node-b", 1): 17, ("node-b", 0): 16, ("node-a", 0): 0, ("node-a", 1): 1})
    source = DcgmSource(prometheus, ranks=ranks, selector='Hostname="node-b"')
    frame = source.readings()
    hot = frame[(frame["metric"] == "gpu_temp_c") & (frame["value"] > 90)]
    assert hot["rank"].tolist() == [17] and set(frame["host"]) == {"node-b"}


def test_dcgm_xid_events_name_the_gpu(prometheus):
    now = time.time()
    ranks = RankMap.by_host_order([("node-a", 0), ("node-a", 1), ("node-b", 0), ("node-b", 1)])
    xids = DcgmSource(prometheus, ranks=ranks).xid_events(now - 120, now, step_s=1)
    assert xids[["xid", "host", "gpu", "rank"]].values.tolist() == [[79, "node-b", 1, 3]]


def test_a_bad_query_raises_with_the_query(prometheus):
    with pytest.raises(PrometheusError, match="query 'rate\\(' failed"):
        prometheus.query("rate(")


def test_an_unreachable_server_raises_prometheus_error():
    source = PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout_s=1)
    with pytest.raises(PrometheusError):
        source.query("up")


def test_a_query_naming_hundreds_of_hosts_goes_as_a_form(prometheus):
    hosts = [f"gpu-node-{i:04d}.cluster.example" for i in range(300)] + ["node-b"]
    assert len(DcgmSource(prometheus).promql(hosts)) > 4000  # too long for a URL
    found = DcgmSource(prometheus).gpus(hosts=hosts)
    assert [(g.host, g.gpu, g.values["gpu_temp_c"]) for g in found] == [
        ("node-b", 0, 60.0),
        ("node-b", 1, 91.0),
    ]
