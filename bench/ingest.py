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
4. replicas (PostgreSQL only): ``--replicas`` servers on one fresh database behind a load
   balancer (``--balancer``: HAProxy when installed, else bench/balancer.py's round-robin TCP
   balancer; ``none`` gives the clients every replica's URL instead), the steady load for
   ``--duration`` s, one replica SIGKILLed every ``--kill-every`` s (round robin) and restarted
   10 s later on the same port. Checks every (series, step) is stored once from the raw point
   rows; reports batch latency, client retries and failovers, each replica's CPU.

    python bench/ingest.py --db pg-local --phases replicas --ranks 256 --duration 300
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
from types import SimpleNamespace

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


class PgSampler(threading.Thread):
    """Once a second: the database's active sessions and those waiting on a lock (the store's
    one advisory write lock serializes every write transaction). Not commits/s: PostgreSQL 15
    flushes a busy backend's counters to pg_stat_database lazily, so a 1 s rate is wrong."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.waiting, self.active, self.stop_flag = url, [], [], False

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop_flag:
                waiting, active = conn.execute(
                    "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'),"
                    " count(*) FILTER (WHERE state = 'active') - 1"
                    " FROM pg_stat_activity WHERE datname = current_database()"
                ).fetchone()
                self.waiting.append(waiting)
                self.active.append(active)
                time.sleep(1.0)


class TimedBackend(HttpBackend):
    """Records how long each batch POST takes to be acknowledged (durable)."""

    latencies: list[float]
    failures = 0  # requests that failed and will be retried (the transport's own count)
    failovers = 0  # moves to the next of several URLs (``--balancer none``)

    def _post(self, lines: list[bytes], points: int) -> str:
        t0 = time.perf_counter()
        status = super()._post(lines, points)
        if status == "ok":
            self.latencies.append(time.perf_counter() - t0)
        return status

    def _failed(self, problem: str, retry_after: str | None = None) -> None:
        self.failures += 1
        super()._failed(problem, retry_after)

    def _fail_over(self, problem: str) -> bool:
        moved = super()._fail_over(problem)
        self.failovers += moved
        return moved


def _ranks_worker(
    url: str | list[str], name: str, ranks: list[int], duration: float, spill: str, out
) -> None:
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
            "retries": sum(b.failures for b in backends),
            "failovers": sum(b.failovers for b in backends),
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
    parser.add_argument("--replicas", type=int, default=3, help="replicas phase: servers")
    parser.add_argument(
        "--kill-every", type=float, default=60.0, help="replicas phase: SIGKILL period, s"
    )
    parser.add_argument(
        "--balancer",
        choices=["auto", "haproxy", "tcp", "none"],
        default="auto",
        help="replicas phase: haproxy if installed (auto), the bench's TCP balancer, or none "
        "(clients get every replica's URL and fail over themselves)",
    )
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

    if "replicas" in phases:
        if label == "postgresql":
            rows += _replicas_phase(args, root, fresh("replicas"), f"replicas-{tag}")
        else:
            print("# replicas: PostgreSQL only (--db pg-local or a URL); skipped", flush=True)

    if "dashboard" in phases:
        rows += _dashboard_phase(label, fresh("dashboard"))

    if "migrate" in phases and label == "postgresql":
        rows += _migrate_phase(args, root, fresh("migrate"))
    print(f"# {label}: done", flush=True)


def _make_balancer(kind: str, ports: list[int], root: Path):
    from balancer import Haproxy, TcpBalancer

    if kind == "haproxy" or (kind == "auto" and Haproxy.available()):
        return Haproxy(ports, root).start()
    return TcpBalancer(ports, root).start()


def _replicas_phase(args, root: Path, db: str, name: str) -> list[tuple[str, str, str]]:
    """``--replicas`` servers on one database behind a balancer (or, with ``--balancer none``,
    the client's own URL list); the steady load for ``--duration`` s while one replica is
    SIGKILLed every ``--kill-every`` s (round robin) and restarted 10 s later on its port."""
    extra = ["--no-detect"] if args.no_detect else []
    servers = [Server(db, root, *extra) for _ in range(args.replicas)]
    for server in servers:
        server.start()
    balancer = None
    if args.balancer == "none":
        url: str | list[str] = [s.url for s in servers]
        via = "no balancer: each client has the replicas' URLs (url=[...]) and fails over"
    else:
        balancer = _make_balancer(args.balancer, [s.port for s in servers], root)
        url, via = balancer.url, balancer.name
    print(f"# replicas: {args.replicas} x runwatch serve on {name}, clients via {via}", flush=True)
    samplers = [Sampler(s) for s in servers]
    if balancer is not None and balancer.proc is not None:
        samplers.append(Sampler(balancer))
    pg = PgSampler(db)
    for sampler in [*samplers, pg]:
        sampler.start()
    queue: mp.Queue = mp.Queue()
    per = [list(range(args.ranks))[i :: args.procs] for i in range(args.procs)]
    spill = tempfile.mkdtemp(prefix="runwatch-bench-spill-")
    procs = [
        mp.Process(target=_ranks_worker, args=(url, name, r, args.duration, spill, queue))
        for r in per
    ]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    clients = [Sampler(SimpleNamespace(proc=p)) for p in procs]  # type: ignore[arg-type]
    for sampler in clients:
        sampler.start()
    kills: list[tuple[float, int, float]] = []  # (at s, replica, s until it answered again)
    for k in range(1, int(args.duration // args.kill_every) + 1):
        at = k * args.kill_every
        if at >= args.duration:
            break
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        victim = servers[(k - 1) % len(servers)]
        victim.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        victim.proc.wait()
        print(f"# replicas: SIGKILL replica {(k - 1) % len(servers)} at {at:.0f} s", flush=True)
        time.sleep(max(0.0, killed + 10.0 - time.monotonic()))
        victim.start()
        kills.append((at, (k - 1) % len(servers), time.monotonic() - killed))
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    elapsed = time.monotonic() - t0
    for sampler in [*samplers, *clients, pg]:
        sampler.stop_flag = True
    lb_stats = balancer.stats() if balancer is not None else {}
    if balancer is not None:
        balancer.stop()
    for server in servers:
        server.stop()
    check = _verify_exact(db, name, results[0]["steps"])
    lat = np.array([x for r in results for x in r["latencies"]]) * 1e3
    logged = sum(r["logged"] for r in results)
    cpu = [float(np.mean(s.cpu)) if s.cpu else 0.0 for s in samplers[: len(servers)]]
    rows = [
        (
            "replicas: setup",
            f"{args.replicas} x serve",
            f"one PostgreSQL database; clients via {via}; live detection "
            + ("off" if args.no_detect else "on"),
        ),
        (
            "replicas: SIGKILLs (at s: replica, down for)",
            str(len(kills)),
            "; ".join(f"{at:.0f} s: r{i}, {down:.1f} s" for at, i, down in kills),
        ),
        (
            "replicas: points logged / stored",
            f"{logged:,} / {check['stored']:,}",
            f"lost {check['missing']:,}, doubled {check['doubled']:,}, "
            f"dropped by clients {sum(r['dropped'] for r in results)}",
        ),
        (
            "replicas: series with a wrong count",
            f"{check['wrong_series']} of {check['series']}",
            f"each series steps 0..N-1 once, in order: {check['ordered']}",
        ),
        (
            "replicas: steps not stored once per series",
            f"{check['wrong_steps']} of {results[0]['steps']}",
            "points per step counted over all series",
        ),
        (
            "replicas: ingest rate",
            f"{logged / args.duration:,.0f} points/s",
            f"logged over {args.duration:.0f} s; last ack after {elapsed:.0f} s",
        ),
        (
            "replicas: batch POST latency p50 / p99 / max",
            f"{np.percentile(lat, 50):,.1f} / {np.percentile(lat, 99):,.1f} / {lat.max():,.0f} ms",
            f"{len(lat):,} batches acknowledged; send to durable ack of one POST",
        ),
        (
            "replicas: client retries / failovers",
            f"{sum(r['retries'] for r in results):,} / {sum(r['failovers'] for r in results):,}",
            "failed requests retried later; moves to another URL",
        ),
        (
            "replicas: server CPU mean, each replica",
            " / ".join(f"{c:.0f}%" for c in cpu),
            f"% of one core; sum {sum(cpu):.0f}%",
        ),
        (
            "replicas: client processes' CPU, sum of means",
            f"{sum(float(np.mean(c.cpu)) for c in clients if c.cpu):.0f}%",
            f"{args.procs} processes of {args.ranks // args.procs} ranks; % of one core",
        ),
    ]
    rows.append(
        (
            "replicas: anomalies stored for the run",
            check["anomalies"],
            "by detector; the load is clean (values rise 0.001 per step), so any is a false alarm",
        )
    )
    rows.append(
        (
            "replicas: PostgreSQL sessions active / waiting on a lock",
            f"{np.mean(pg.active):.1f} / {np.mean(pg.waiting):.1f}",
            f"means of 1 s samples; max waiting {max(pg.waiting)}",
        )
    )
    if len(samplers) > len(servers):
        rows.append(("replicas: balancer CPU mean", f"{np.mean(samplers[-1].cpu):.0f}%", ""))
    if lb_stats:
        rows.append(
            (
                "replicas: balancer counters",
                "",
                ", ".join(f"{k} {v:,}" for k, v in lb_stats.items()),
            )
        )
    return rows


def _verify_exact(db: str, name: str, steps: int) -> dict:
    """Every (series, step) of the bench's metrics stored exactly once, counted from the raw
    point rows (not the series summary), so a doubled point cannot hide."""
    with Store(db, readonly=True) as store:
        series = store.series(name)
        series = series[series["metric"].isin(METRICS)]
        ids = series["series_id"].tolist()
        per_step = np.zeros(steps, dtype=np.int64)
        stored = missing = doubled = wrong_series = 0
        ordered = True
        for i in range(0, len(ids), 256):
            raw = read_blocks(store._conn, ids[i : i + 256])
            seen = set()
            for sid, group in raw.groupby("series_id", sort=False):
                seen.add(sid)
                got = group["step"].to_numpy()
                counts = np.bincount(got, minlength=steps)
                stored += len(got)
                per_step += counts[:steps]
                missing += int((counts[:steps] == 0).sum())
                doubled += int(np.clip(counts[:steps] - 1, 0, None).sum() + counts[steps:].sum())
                wrong_series += len(got) != steps
                ordered &= bool(np.array_equal(got, np.arange(steps)))
            absent = len(set(ids[i : i + 256]) - seen)
            missing += absent * steps
            wrong_series += absent
        anomalies = store.anomalies(name)["detector"].value_counts()
    return {
        "anomalies": ", ".join(f"{d} {n}" for d, n in anomalies.items()) or "none",
        "series": len(ids),
        "stored": stored,
        "missing": missing,
        "doubled": doubled,
        "wrong_series": wrong_series,
        "wrong_steps": int((per_step != len(ids)).sum()),
        "ordered": ordered,
    }


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
