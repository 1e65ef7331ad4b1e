"""``runwatch.init(dcgm=URL)``: a run polls a real Prometheus for its GPUs' DCGM readings."""

from __future__ import annotations

import http.server
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import runwatch
from runwatch.attach import dcgm_options
from runwatch.collectors.dcgm import DcgmSource, PrometheusSource, RankMap
from runwatch.collectors.dcgm_poller import DcgmPoller
from runwatch.model import LABEL_KEYS, label_value

from .test_dcgm import free_port, prometheus_scraping

HOSTNAME = socket.gethostname()
LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "PMI_RANK")
LAUNCHER += ("OMPI_COMM_WORLD_RANK", "RUNWATCH_DCGM_URL", "RUNWATCH_URL")


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusSource]:
    """This host and node-b, two GPUs each; node-b's GPU 1 runs at 91 degC with XID 79."""
    with prometheus_scraping(tmp_path_factory.mktemp("prom"), (HOSTNAME, "node-b")) as source:
        yield source


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain process unless a test says otherwise (CI may run under a launcher)."""
    for name in LAUNCHER:
        monkeypatch.delenv(name, raising=False)


def _train(run: runwatch.Run, seconds: float) -> None:
    """Log a loss for ``seconds``, as a training loop would, while the poller runs."""
    step = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        run.log({"loss": 2.0 - 0.001 * step}, step=step)
        step += 1
        time.sleep(0.02)


def _gpu_series(db: Path, run: str, metric: str) -> list[dict]:
    series = runwatch.open_store(str(db)).series(run)
    rows = series[series["metric"] == metric]
    out = []
    for rec in rows.to_dict("records"):
        labels = {k: label_value(rec[k]) for k in LABEL_KEYS}
        out.append({k: v for k, v in labels.items() if v is not None})
    return sorted(out, key=lambda r: (r["host"], r["gpu"]))


def test_init_dcgm_logs_this_hosts_gpus_as_labelled_series(prometheus, db_path):
    run = runwatch.init(name="dcgm", store=db_path, dcgm=prometheus.url, dcgm_interval=0.2)
    _train(run, 1.2)
    run.finish()
    store = runwatch.open_store(str(db_path))
    # A single process: its host's GPUs by host and index, no rank; node-b is not asked for.
    assert _gpu_series(db_path, "dcgm", "gpu_temp_c") == [
        {"host": HOSTNAME, "gpu": 0},
        {"host": HOSTNAME, "gpu": 1},
    ]
    temps = store.read_series("dcgm", "gpu_temp_c", {"host": HOSTNAME, "gpu": 1})
    assert len(temps) >= 3 and set(temps["value"]) == {61.0}  # a poll every 0.2 s
    assert set(store.series("dcgm")["metric"]) >= {"gpu_power_w", "gpu_mem_used_gib", "loss"}
    assert store.runs().set_index("name").loc["dcgm", "status"] == "finished"


def test_rank_zero_polls_every_host_under_block_ranks_and_xids_become_events(
    prometheus, db_path, monkeypatch
):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("RUNWATCH_DCGM_URL", prometheus.url)  # the environment is enough
    run = runwatch.init(
        name="job", store=db_path, dcgm_interval=0.2, dcgm_hosts=[HOSTNAME, "node-b"]
    )
    _train(run, 1.2)
    run.finish()
    store = runwatch.open_store(str(db_path))
    assert _gpu_series(db_path, "job", "gpu_temp_c") == [
        {"rank": 2, "host": "node-b", "gpu": 0},
        {"rank": 3, "host": "node-b", "gpu": 1},
        {"rank": 0, "host": HOSTNAME, "gpu": 0},
        {"rank": 1, "host": HOSTNAME, "gpu": 1},
    ]
    hot = store.read_series("job", "gpu_temp_c", {"rank": 3, "host": "node-b", "gpu": 1})
    assert set(hot["value"]) == {91.0}
    xids = store.events("job", ["xid"])
    # The exporter gauges the last XID: one event, not one per poll.
    assert len(xids) == 1
    xid = xids.iloc[0]
    assert (xid["rank"], xid["host"]) == (3, "node-b")
    assert "XID 79" in xid["message"]
    # The live fleet detectors saw both: the hardware rules name the GPU.
    found = store.anomalies("job")
    hardware = found[found["detector"] == "hardware"]
    assert {(a["metric"], a["severity"]) for a in hardware.to_dict("records")} == {
        ("xid", "critical"),  # XID 79: the GPU fell off the bus
        ("gpu_temp_c", "warning"),  # 91 degC
    }
    assert all(labels == {"rank": 3, "host": "node-b", "gpu": 1} for labels in hardware["labels"])


def test_a_dead_prometheus_is_one_warning_and_the_run_finishes(db_path, caplog):
    url = f"http://127.0.0.1:{free_port()}"
    caplog.set_level(logging.DEBUG, logger="runwatch")
    run = runwatch.init(name="dead", store=db_path, dcgm=url, dcgm_interval=0.05, monitor=False)
    _train(run, 0.6)
    run.finish()
    warnings = [
        r for r in caplog.records if r.levelno >= logging.WARNING and "DCGM" in r.getMessage()
    ]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert url in warnings[0].getMessage() and "trying again" in warnings[0].getMessage()
    retries = [r for r in caplog.records if "failed again" in r.getMessage()]
    assert len(retries) >= 3  # it kept polling at the interval
    store = runwatch.open_store(str(db_path))
    assert store.runs().set_index("name").loc["dead", "status"] == "finished"
    assert len(store.read_series("dead", "loss")) > 10
    assert not (store.series("dead")["metric"].str.startswith("gpu_")).any()


@pytest.mark.parametrize("url", ["prometheus:9090", "http://", "ftp://prom:9090", "http://h:port"])
def test_a_malformed_url_fails_init_naming_it_before_anything_is_written(db_path, url):
    with pytest.raises(ValueError, match=r"Prometheus URL .* is malformed") as info:
        runwatch.init(name="bad", store=db_path, dcgm=url)
    assert repr(url) in str(info.value)
    assert not db_path.exists() or "bad" not in set(
        runwatch.open_store(str(db_path)).runs()["name"]
    )


def test_a_malformed_url_in_the_environment_fails_too(db_path, monkeypatch):
    monkeypatch.setenv("RUNWATCH_DCGM_URL", "prom:9090")
    with pytest.raises(ValueError, match="'prom:9090'"):
        runwatch.init(name="bad-env", store=db_path)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dcgm_interval": 0}, "dcgm_interval=0 is invalid"),
        ({"dcgm_hosts": "node-a"}, "dcgm_hosts='node-a' is invalid"),
        ({"dcgm_hosts": []}, r"dcgm_hosts=\[\] is invalid"),
    ],
)
def test_bad_dcgm_options_are_refused_naming_them(db_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        runwatch.init(name="bad-opt", store=db_path, dcgm="http://prom:9090", **kwargs)


def test_only_rank_zero_or_a_single_process_polls():
    url = "http://prom:9090"
    single = dcgm_options(url, 15.0, None, env={})
    assert single is not None and single["ranks"] is None and single["hosts"] == [HOSTNAME]
    assert dcgm_options(url, 15.0, None, env={"RANK": "3", "WORLD_SIZE": "8"}) is None
    zero = dcgm_options(url, 15.0, ["a", "b"], env={"RANK": "0", "WORLD_SIZE": "8"})
    assert zero is not None and zero["ranks"].rank("b", 3) == 7  # 4 GPUs per host
    assert dcgm_options(None, 15.0, None, env={}) is None
    assert dcgm_options("", 15.0, None, env={"RUNWATCH_DCGM_URL": url}) is None  # "" turns it off


def test_host_names_with_regex_characters_are_matched_literally(prometheus):
    found = DcgmSource(prometheus).gpus(hosts=["node-b", "no.de-b", "node-(b)|.*"])
    assert [(g.host, g.gpu) for g in found] == [("node-b", 0), ("node-b", 1)]


def test_prometheus_answering_again_is_logged_once(prometheus, caplog):
    class Flaky:
        def __init__(self) -> None:
            self.calls = 0

        def gpus(self, at=None, hosts=None):
            self.calls += 1
            if self.calls in (2, 3):
                return DcgmSource(PrometheusSource(f"http://127.0.0.1:{free_port()}")).gpus()
            return DcgmSource(prometheus).gpus(hosts=hosts)

    class Sink:
        def __init__(self) -> None:
            self.points = 0
            self.events: list[str] = []

        def log_labeled(self, data, labels, step=None):
            self.points += len(data)

        def event(self, kind, step=None, message="", **attrs):
            self.events.append(kind)

    caplog.set_level(logging.INFO, logger="runwatch")
    sink = Sink()
    poller = DcgmPoller(sink, prometheus.url, hosts=["node-b"], dcgm=Flaky(), ranks=RankMap({}))
    for _ in range(5):
        poller.poll_once()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot read DCGM" in m for m in messages) == 1
    assert sum("answers again" in m for m in messages) == 1
    assert poller.stats()["failures"] == 2 and sink.points > 0
    # node-b's XID 79 is told once: the outage does not make it new again.
    assert sink.events == ["xid"]


class _NotPrometheus(http.server.BaseHTTPRequestHandler):
    """A server that answers, but not as Prometheus does: an HTML page, or JSON of another shape."""

    def do_GET(self) -> None:
        if "html" in self.server.mode:  # type: ignore[attr-defined]
            body, kind = b"<html>not found</html>", "text/html"
        else:
            body = b'{"status": "success", "data": {"result": [{"labels": {}}]}}'
            kind = "application/json"
        self.send_response(404 if kind == "text/html" else 200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.mark.parametrize("mode", ["html", "json of another shape"])
def test_a_url_that_is_not_prometheus_is_one_warning_and_no_error(mode, caplog):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotPrometheus)
    server.mode = mode  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    caplog.set_level(logging.WARNING, logger="runwatch")
    try:
        poller = DcgmPoller(_Discard(), url, hosts=["node-b"])
        for _ in range(3):
            poller.poll_once()
        poller.stop()
    finally:
        server.shutdown()
        server.server_close()
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert url in caplog.records[0].getMessage()
    assert poller.stats()["failures"] == 3


class _Discard:
    def log_labeled(self, data, labels, step=None):
        raise AssertionError("nothing should be logged")

    def event(self, kind, step=None, message="", **attrs):
        raise AssertionError("nothing should be logged")
