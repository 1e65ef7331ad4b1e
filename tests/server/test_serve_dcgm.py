"""`runwatch serve --dcgm URL`: the server writes its running runs' GPU readings from a real
Prometheus into those runs, where the live fleet detectors see them."""

from __future__ import annotations

import concurrent.futures
import signal
import socket
import subprocess
import sys
import time

import numpy as np

import runwatch
from runwatch.collectors.dcgm import GpuReading
from runwatch.model import LABEL_KEYS, label_value
from runwatch.server.dcgm import ServerDcgm
from runwatch.store import Store

from ..collectors.test_dcgm import prometheus_scraping
from .conftest import TOKEN, ServerProcess

HOSTNAME = socket.gethostname()


def _gpu_labels(store: Store, run: str) -> list[dict]:
    series = store.series(run)
    out = []
    for rec in series[series["metric"] == "gpu_temp_c"].to_dict("records"):
        labels = {k: label_value(rec[k]) for k in LABEL_KEYS}
        out.append({k: v for k, v in labels.items() if v is not None})
    return sorted(out, key=lambda r: (r["host"], r["gpu"]))


def test_serve_dcgm_writes_the_running_runs_gpus_under_their_ranks(
    tmp_path, token_file, monkeypatch
):
    (tmp_path / "prom").mkdir()
    with prometheus_scraping(tmp_path / "prom", (HOSTNAME, "node-b")) as prometheus:
        db = tmp_path / "served.db"
        server = ServerProcess(db, token_file, "--dcgm", prometheus.url, "--dcgm-interval", "0.2")
        server.start()
        try:
            monkeypatch.setenv("RUNWATCH_SPILL_DIR", str(tmp_path / "spill"))
            # A 4-rank job on two hosts, as the server sees it: ranks 0-1 on this host and
            # 2-3 on node-b log their step times under their rank and host.
            labels = {"rank": 0, "host": HOSTNAME}
            run = runwatch.init(name="job", url=server.url, token=TOKEN, labels=labels)
            placement = [(1, HOSTNAME), (2, "node-b"), (3, "node-b")]
            store = runwatch.open_store(str(db))
            hot_gpu = {"rank": 3, "host": "node-b", "gpu": 1}
            deadline = time.monotonic() + 15
            step = 0
            while time.monotonic() < deadline:  # train until the server has polled a few times
                run.log({"loss": 2.0 - 0.001 * step, "step_time": 0.1}, step=step)
                for rank, host in placement:
                    run.log_labeled({"step_time": 0.1}, {"rank": rank, "host": host}, step=step)
                step += 1
                time.sleep(0.05)
                if step % 10 == 0 and len(store.read_series("job", "gpu_temp_c", hot_gpu)) >= 3:
                    break
            run.finish()
            # Each GPU under the rank that drives it (ranks in order on each host).
            assert _gpu_labels(store, "job") == [
                {"rank": 2, "host": "node-b", "gpu": 0},
                {"rank": 3, "host": "node-b", "gpu": 1},
                {"rank": 0, "host": HOSTNAME, "gpu": 0},
                {"rank": 1, "host": HOSTNAME, "gpu": 1},
            ]
            hot = store.read_series("job", "gpu_temp_c", hot_gpu)
            assert len(hot) >= 3 and set(hot["value"]) == {91.0}
            xids = store.events("job", ["xid"])
            assert len(xids) == 1 and (xids.iloc[0]["rank"], xids.iloc[0]["host"]) == (3, "node-b")
            # The server's live detection saw them: the hardware rules name the GPU.
            found = store.anomalies("job")
            hardware = found[found["detector"] == "hardware"]
            assert ("xid", "critical") in set(
                zip(hardware["metric"], hardware["severity"], strict=True)
            )
            assert all(labels == hot_gpu for labels in hardware["labels"])
        finally:
            assert server.stop() in (0, -signal.SIGTERM)


def test_serve_refuses_a_malformed_dcgm_url_with_exit_2(tmp_path, token_file):
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "runwatch.cli", "serve", "--db", str(tmp_path / "x.db")),
            *("--token-file", str(token_file), "--dcgm", "prometheus:9090"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "'prometheus:9090' is malformed" in proc.stderr


class _Fleet:
    """A Prometheus stub: two GPUs on node-b and one on node-c."""

    def gpus(self, at=None, hosts=None):
        readings = [
            GpuReading("node-b", 0, {"gpu_temp_c": 60.0}),
            GpuReading("node-b", 1, {"gpu_temp_c": 61.0}),
            GpuReading("node-c", 0, {"gpu_temp_c": 62.0}),
        ]
        return [g for g in readings if hosts is None or g.host in hosts]


def _write(store: Store, run_id: int, metric: str, labels: dict, step: int, at: float) -> None:
    sid = store.series_id(run_id, metric, labels)
    arrays = (np.array([step]), np.array([at]), np.array([0.1]))
    store.write(run_id, 1, {sid: arrays})


def test_only_runs_whose_step_moves_are_polled(db_path):
    t0 = time.time()
    with runwatch.open_store(str(db_path)) as store:
        # Ranks 4 and 5 of a job on node-b, and a run on node-c killed two hours ago (its
        # status still says running).
        job, _ = store.start_run("job")
        for rank in (4, 5):
            _write(store, job, "step_time", {"rank": rank, "host": "node-b"}, 10, t0)
        old, _ = store.start_run("old")
        _write(store, old, "loss", {"host": "node-c"}, 3, t0 - 7200)
    clock = [t0 + 1]
    taken: list[tuple[int, list]] = []

    def submit(run_id, batches):
        taken.append((run_id, batches))
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result({"points": 0})
        return done

    poller = ServerDcgm(
        str(db_path), "http://prom:9090", submit, stale_s=600, dcgm=_Fleet(), clock=lambda: clock[0]
    )
    poller.poll_once()
    assert [run_id for run_id, _ in taken] == [job]
    # The ranks on node-b in order drive GPUs 0 and 1; readings are at the run's last step.
    assert [(s.labels.as_dict(), s.steps) for s in taken[0][1][0].series] == [
        ({"rank": 4, "host": "node-b", "gpu": 0}, [10]),
        ({"rank": 5, "host": "node-b", "gpu": 1}, [10]),
    ]
    # The job's step stands still for longer than stale_s: no polls until it moves again.
    taken.clear()
    clock[0] = t0 + 602
    poller.poll_once()
    assert taken == []
    with runwatch.open_store(str(db_path)) as store:
        _write(store, job, "step_time", {"rank": 4, "host": "node-b"}, 11, t0 + 602)
    poller.poll_once()
    assert [(run_id, b[0].series[0].steps) for run_id, b in taken] == [(job, [11])]
    poller.stop()
