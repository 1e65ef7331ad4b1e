"""Ingest server benchmark: many ranks, a peak rate, and a SIGKILL in the middle.

    python bench/ingest.py [--ranks 256] [--duration 300] [--kill-duration 60] [--peak-duration 10]
    python bench/ingest.py --db sqlite --db pg-local --phases peak,migrate --peak-no-detect

``--db`` picks the store(s), each phase running once per store in the same run: ``sqlite`` (a
fresh file per phase, the default), ``pg-local`` (a throwaway PostgreSQL cluster started here,
fsync on, one fresh database per phase) or a ``postgresql://`` URL (every phase into that
database; run names carry the time, so runs of the bench do not collide). The ``migrate``
phase (PostgreSQL only) writes ``--migrate-points`` points into an SQLite store and times
``runwatch migrate`` of it into a fresh database, verification included.

Three phases, each against a real ``runwatch serve`` subprocess on 127.0.0.1 (live detection
on, as shipped), on this 2-core machine, clients and server sharing the cores:

1. steady: ``--ranks`` simulated ranks, each a real ``Run`` with an ``HttpBackend`` (its own
   writer thread and keep-alive connection, flushing every second), run as threads spread over
   ``--procs`` client processes; each logs 20 metrics per step at 5 steps/s. Checks that every
   logged point is stored exactly once; reports server CPU and peak RSS (psutil) and the p50/p99
   latency of one batch POST, from send to the durable acknowledgement.
2. kill: the same load for ``--kill-duration`` s; the server is SIGKILLed at a third of it and
   restarted 10 s later on the same store. Checks every point arrives once, in step order.
3. peak: a few client processes post large pre-encoded columnar JSON batches (64 series x 2,000
   points) as fast as the server acknowledges them; reports points/s stored.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

from runwatch.hook.run import Run
from runwatch.hook.transport import HttpBackend
from runwatch.store import Store
from runwatch.store.points import read_blocks

HERE = Path(__file__).resolve().parent
TOKEN = "bench-token"
METRICS = [f"step_time_{i}" if i < 2 else f"gpu_metric_{i}" for i in range(20)]


class Server:
    def __init__(self, db: str, root: Path, *extra: str) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.db, self.extra = db, extra
        self.token_file = root / f"server-{self.port}.token"
        self.token_file.write_text(TOKEN)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runwatch.cli",
                "serve",
                "--db",
                str(self.db),
                "--port",
                str(self.port),
                "--token-file",
                str(self.token_file),
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
        )
        for _ in range(400):
            try:
                httpx.get(f"{self.url}/api/v1/health", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("server did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


class Sampler(threading.Thread):
    """Server CPU (% of one core) and RSS, once a second."""

    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True)
        self.server, self.cpu, self.rss, self.stop_flag = server, [], [], False

    def run(self) -> None:
        proc = None
        while not self.stop_flag:
            try:
                if proc is None or proc.pid != self.server.proc.pid:
                    proc = psutil.Process(self.server.proc.pid)
                    proc.cpu_percent(None)
                time.sleep(1.0)
                self.cpu.append(proc.cpu_percent(None))
                self.rss.append(proc.memory_info().rss)
            except (psutil.Error, AttributeError):
                proc = None
                time.sleep(0.2)


class TimedBackend(HttpBackend):
    """Records how long each batch POST takes to be acknowledged (durable)."""

    latencies: list[float]

    def _post(self, lines: list[bytes], points: int) -> str:
        t0 = time.perf_counter()
        status = super()._post(lines, points)
        if status == "ok":
            self.latencies.append(time.perf_counter() - t0)
        return status


def _ranks_worker(url: str, name: str, ranks: list[int], duration: float, spill: str, out) -> None:
    runs, backends = [], []
    for rank in ranks:
        backend = TimedBackend(
            url,
            TOKEN,
            launch_id="bench",
            world_size=256,
            rank=rank,
            host=f"node-{rank // 8}",
            spill_dir=spill,
            max_backoff_s=1.0,
            finish_drain_s=120,
        )
        backend.latencies = []
        backends.append(backend)
        runs.append(
            Run(
                name,
                backend=backend,
                labels={"rank": rank, "host": f"node-{rank // 8}"},
                monitor=False,
                flush_interval=1.0,
            )
        )
    steps = int(duration * 5)
    t0 = time.monotonic()
    for step in range(steps):
        delay = t0 + step / 5 - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        for rank, run in zip(ranks, runs, strict=True):
            run.log({m: rank + step * 1e-3 + i for i, m in enumerate(METRICS)}, step=step)
    finishing = [threading.Thread(target=run.finish, kwargs={"timeout": 180}) for run in runs]
    for thread in finishing:  # ranks finish together, as a real job's do
        thread.start()
    for thread in finishing:
        thread.join()
    out.put(
        {
            "logged": sum(r.stats()["logged"] for r in runs),
            "written": sum(r.stats()["written"] for r in runs),
            "dropped": sum(sum(r.stats()["dropped"].values()) for r in runs),
            "latencies": [x for b in backends for x in b.latencies],
            "steps": steps,
        }
    )


def _run_ranks(server: Server, name: str, args, duration: float, kill_at: float | None = None):
    queue: mp.Queue = mp.Queue()
    per = [list(range(args.ranks))[i :: args.procs] for i in range(args.procs)]
    spill = tempfile.mkdtemp(prefix="runwatch-bench-spill-")
    procs = [
        mp.Process(target=_ranks_worker, args=(server.url, name, r, duration, spill, queue))
        for r in per
    ]
    sampler = Sampler(server)
    sampler.start()
    for p in procs:
        p.start()
    if kill_at is not None:
        time.sleep(kill_at)
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait()
        time.sleep(10.0)
        server.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    sampler.stop_flag = True
    return results, sampler


def _verify(db: str, name: str, expected_per_series: int) -> tuple[int, int, int, bool]:
    """(series, points stored, series with a wrong count, every series in step order) of the
    metrics the bench logs (the hook may add series of its own, e.g. host_cpu_wait)."""
    with Store(db, readonly=True) as store:
        series = store.series(name)
        series = series[series["metric"].isin(METRICS)]
        wrong = int((series["points"] != expected_per_series).sum())
        ordered = True
        ids = series["series_id"].tolist()
        for i in range(0, len(ids), 256):
            raw = read_blocks(store._conn, ids[i : i + 256])
            for _, group in raw.groupby("series_id", sort=False):
                steps = group["step"].to_numpy()
                ordered &= bool(np.array_equal(steps, np.arange(expected_per_series)))
    return len(series), int(series["points"].sum()), wrong, ordered


def _peak_worker(url: str, name: str, worker: int, duration: float, out) -> None:
    n, k = 2000, 64
    rng = np.random.default_rng(worker)
    series = ",".join(
        json.dumps(
            {
                "metric": f"m{i}",
                "labels": {"rank": worker},
                "steps": list(range(n)),
                "times": (1.7e9 + np.arange(n) * 0.2).tolist(),
                "values": rng.random(n).round(6).tolist(),
            },
            separators=(",", ":"),
        )
        for i in range(k)
    ).encode()
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    cid = f"peak-{worker}"
    run = client.post(
        "/api/v1/runs", json={"name": name, "client_id": cid, "launch_id": "p"}
    ).json()
    points, seq, deadline = 0, 0, time.monotonic() + duration
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        body = b'{"client_id":"%s","seq":%d,"attempt":%d,"series":[%s]}' % (
            cid.encode(),
            seq,
            run["attempt"],
            series,
        )
        reply = client.post(
            f"/api/v1/runs/{run['run_id']}/batches",
            content=body,
            headers={"Content-Type": "application/json"},
        )
        if reply.status_code == 200:
            points += reply.json()["points"]
            seq += 1
    out.put((points, time.monotonic() - t0, len(series)))


def _peak(server: Server, name: str, duration: float, workers: int):
    queue: mp.Queue = mp.Queue()
    sampler = Sampler(server)
    sampler.start()
    procs = [
        mp.Process(target=_peak_worker, args=(server.url, name, w, duration, queue))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    sampler.stop_flag = True
    points = sum(r[0] for r in results)
    elapsed = max(r[1] for r in results)
    return points / elapsed, results[0][2], sampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--procs", type=int, default=4, help="client processes for the ranks")
    parser.add_argument("--duration", type=float, default=300.0, help="steady phase, seconds")
    parser.add_argument("--kill-duration", type=float, default=60.0)
    parser.add_argument("--peak-duration", type=float, default=10.0)
    parser.add_argument("--peak-workers", type=int, default=3)
    parser.add_argument("--phases", default="steady,kill,peak")
    parser.add_argument(
        "--db",
        action="append",
        help="sqlite (default), pg-local, or a postgresql:// URL; repeat to compare stores",
    )
    parser.add_argument("--migrate-points", type=int, default=10_000_000)
    parser.add_argument(
        "--peak-no-detect",
        action="store_true",
        help="peak phase with `serve --no-detect` (store only)",
    )
    parser.add_argument(
        "--no-detect", action="store_true", help="steady/kill phases without live detection"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="runwatch-bench-ingest-"))
    rows: list[tuple[str, str, str]] = []
    print(
        f"# runwatch ingest bench: {args.ranks} ranks as threads (one Run + writer + "
        f"connection each) in {args.procs} processes; {len(METRICS)} points/step at 5 steps/s; "
        f"{os.cpu_count()} cores shared by clients and server",
        flush=True,
    )
    cluster = None
    try:
        for db in args.db or ["sqlite"]:
            if db == "pg-local":
                from runwatch.store.postgres_local import LocalCluster

                if cluster is None:
                    cluster = LocalCluster(fsync=True).start()
                fresh = _pg_local_databases(cluster)
                label = "postgresql"
            elif db == "sqlite":
                fresh = _sqlite_files(root)
                label = "sqlite"
            else:
                fresh = _same_url(db)
                label = "postgresql"
            _run_phases(args, root, label, fresh, rows)
    finally:
        if cluster is not None:
            cluster.stop()
    _print(rows, final=True)


def _sqlite_files(root: Path):
    return lambda phase: str(root / f"{phase}.db")


def _pg_local_databases(cluster):
    count = iter(range(1_000_000))
    return lambda phase: cluster.create_database(f"bench_{phase}_{next(count)}")


def _same_url(url: str):
    return lambda phase: url


def _run_phases(args, root: Path, label: str, fresh, rows: list[tuple[str, str, str]]) -> None:
    phases = args.phases.split(",")
    tag = time.strftime("%H%M%S")
    if "steady" in phases:
        name = f"steady-{tag}"
        server = Server(fresh("steady"), root, *(["--no-detect"] if args.no_detect else []))
        server.start()
        results, sampler = _run_ranks(server, name, args, args.duration)
        server.stop()
        lat = np.array([x for r in results for x in r["latencies"]]) * 1e3
        logged = sum(r["logged"] for r in results)
        n_series, stored, wrong, ordered = _verify(server.db, name, results[0]["steps"])
        rows += [
            (
                f"{label} steady: duration",
                f"{args.duration:.0f} s",
                "live detection " + ("off" if args.no_detect else "on"),
            ),
            (
                f"{label} steady: points logged / stored",
                f"{logged:,} / {stored:,}",
                f"lost {logged - stored:,}, dropped {sum(r['dropped'] for r in results)}",
            ),
            (
                f"{label} steady: series with a wrong count",
                f"{wrong} of {n_series}",
                f"in order: {ordered}",
            ),
            (f"{label} steady: ingest rate", f"{logged / args.duration:,.0f} points/s", ""),
            (
                f"{label} steady: batch POST latency p50 / p99",
                f"{np.percentile(lat, 50):.1f} / {np.percentile(lat, 99):.1f} ms",
                f"{len(lat):,} batches",
            ),
            (
                f"{label} steady: server CPU mean / max",
                f"{np.mean(sampler.cpu):.0f}% / {np.max(sampler.cpu):.0f}%",
                "% of one core",
            ),
            (f"{label} steady: server RSS max", f"{max(sampler.rss) / 2**20:.0f} MiB", ""),
        ]

    if "kill" in phases:
        name = f"kill-{tag}"
        server = Server(fresh("kill"), root, *(["--no-detect"] if args.no_detect else []))
        server.start()
        results, _ = _run_ranks(server, name, args, args.kill_duration, args.kill_duration / 3)
        server.stop()
        logged = sum(r["logged"] for r in results)
        n_series, stored, wrong, ordered = _verify(server.db, name, results[0]["steps"])
        rows += [
            (
                f"{label} kill: SIGKILL at / restart after",
                f"{args.kill_duration / 3:.0f} s / 10 s",
                "",
            ),
            (
                f"{label} kill: points logged / stored",
                f"{logged:,} / {stored:,}",
                f"lost or doubled {abs(logged - stored):,}",
            ),
            (
                f"{label} kill: series with a wrong count",
                f"{wrong} of {n_series}",
                f"each series steps 0..N-1 once, in order: {ordered}",
            ),
        ]

    if "peak" in phases:
        server = Server(fresh("peak"), root, *(["--no-detect"] if args.peak_no_detect else []))
        server.start()
        rate, body, sampler = _peak(server, f"peak-{tag}", args.peak_duration, args.peak_workers)
        server.stop()
        rows += [
            (f"{label} peak: live detection", "off" if args.peak_no_detect else "on", ""),
            (
                f"{label} peak: points/s stored",
                f"{rate:,.0f}",
                f"{args.peak_workers} clients, 128,000 points per {body / 2**20:.1f} MiB JSON body",
            ),
            (f"{label} peak: server CPU mean", f"{np.mean(sampler.cpu):.0f}%", "% of one core"),
        ]

    if "dashboard" in phases:
        rows += _dashboard_phase(label, fresh("dashboard"))

    if "migrate" in phases and label == "postgresql":
        rows += _migrate_phase(args, root, fresh("migrate"))
    print(f"# {label}: done", flush=True)


def _dashboard_phase(label: str, db: str) -> list[tuple[str, str, str]]:
    """bench/dashboard.py's 1M-step x 10-metric run, and its Run page reads (cold caches)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_dashboard", HERE / "dashboard.py")
    assert spec is not None and spec.loader is not None
    dash = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dash)
    t0 = time.perf_counter()
    dash.build(db, 1_000_000)
    built = time.perf_counter() - t0
    ready = []
    for _ in range(3):
        elapsed, _, spike, nan, _ = dash.page_data(db)
        ready.append(elapsed)
    return [
        (
            f"{label} dashboard: Run page data ready",
            f"{np.median(ready):.2f} s",
            f"median of 3 cold reads ({', '.join(f'{r:.2f}' for r in ready)}); spike and NaN "
            f"shown: {spike and nan}; 1M steps x 10 metrics written in {built:.0f} s",
        )
    ]


def _migrate_phase(args, root: Path, url: str) -> list[tuple[str, str, str]]:
    """Write ``--migrate-points`` points (100 series, 1 Hz steps) into SQLite; migrate them."""
    from runwatch.store.postgres_migrate import migrate_store

    source = str(root / f"migrate-source-{time.time_ns()}.db")
    n_series = 100
    per = args.migrate_points // n_series
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    with Store(source) as store:
        run_id, attempt = store.start_run("migrate")
        sids = [store.series_id(run_id, f"m{i % 20}", {"rank": i // 20}) for i in range(n_series)]
        chunk = 20_000
        for lo in range(0, per, chunk):
            steps = np.arange(lo, min(lo + chunk, per))
            times = 1.7e9 + steps.astype(float)
            store.write(
                run_id,
                attempt,
                {sid: (steps, times, rng.normal(size=len(steps)).round(5)) for sid in sids},
            )
    written = time.perf_counter() - t0
    size = Path(source).stat().st_size
    report = migrate_store(source, url)
    import psycopg

    with psycopg.connect(url) as conn:
        pg_bytes = conn.execute("SELECT pg_total_relation_size('point_blocks')").fetchone()[0]
    return [
        (
            "postgresql migrate: point_blocks size",
            f"{pg_bytes / 2**20:.0f} MiB",
            f"{pg_bytes / max(report.points, 1):.2f} bytes/point with TOAST and index "
            f"(SQLite file: {size / max(report.points, 1):.2f})",
        ),
        (
            "postgresql migrate: points",
            f"{report.points:,}",
            f"{n_series} series; SQLite file {size / 2**20:.0f} MiB, written in {written:.0f} s",
        ),
        (
            "postgresql migrate: points/s",
            f"{report.points_per_s:,.0f}",
            f"{report.seconds:.1f} s, copy and verification (counts, SHA-256 per table)",
        ),
        ("postgresql migrate: verified", str(report.verified), "; ".join(report.mismatches)),
    ]


def _print(rows: list[tuple[str, str, str]], final: bool = False) -> None:
    if not final:
        return
    width = max(len(r[0]) for r in rows)
    vwidth = max(len(r[1]) for r in rows)
    print(f"{'measure':<{width}}  {'value':<{vwidth}}  note")
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:<{vwidth}}  {note}")


if __name__ == "__main__":
    main()
