"""``runwatch demo``: play the demo scenario through the real hook into a store.

The demo is an ordinary user of the public API: ``runwatch.init``, ``run.log``,
``run.event``; the crash ends the first process's run (status ``crashed``) and the restart
resumes it under the same name, as a job scheduler restarting a training script would, so the
store shows two attempts and the redone steps as lost work.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pandas as pd

import runwatch
from runwatch.demo.scenario import TOKENS_PER_STEP, demo_scenario, describe_faults

log = logging.getLogger("runwatch.demo")


@dataclass
class DemoReport:
    """What the demo wrote, for the command to print."""

    db: str
    run: str
    steps: int
    points: int
    metrics: list[str]
    attempts: int
    faults: list[tuple[str, int, str]]
    anomalies: list[tuple[int, int, str, str, str, str]]
    """(start, end, severity, detector, metric, message) found live, by start step: every
    one of warning or worse, and the info ones while the list stays short."""
    unlisted_info: int
    """Info anomalies left out of ``anomalies`` (a long demo finds many one-point spikes)."""
    incidents: list[tuple[str, int, str]]
    """(severity, members, title) of the incidents the anomalies and events formed live."""

    @property
    def serious_count(self) -> int:
        """Anomalies of warning or worse (all of them are listed)."""
        return sum(severity != "info" for _, _, severity, *_ in self.anomalies)

    def __str__(self) -> str:
        lines = [
            f"wrote run {self.run!r} to {self.db}: {self.points:,} points of "
            f"{len(self.metrics)} metrics ({', '.join(self.metrics)}) over {self.steps:,} steps "
            f"in {self.attempts} attempts",
            "faults in it:",
        ]
        lines += [f"  step {step:>6}  {kind:<15} {text}" for kind, step, text in self.faults]
        info = len(self.anomalies) - self.serious_count + self.unlisted_info
        lines.append(
            f"found while it ran: {self.serious_count} anomalies of warning or worse "
            f"and {info} info:"
        )
        for start, end, severity, detector, metric, message in self.anomalies:
            where = f"{start}" if start == end else f"{start}-{end}"
            lines.append(
                f"  steps {where:>11}  {severity:<8} {detector:<19} {metric:<13} {message}"
            )
        if self.unlisted_info:
            lines.append(
                f"  ... and {self.unlisted_info} more info "
                f"(all of them: runwatch analyze --db {self.db} --run {self.run})"
            )
        lines.append(f"grouped by cause into {len(self.incidents)} incidents:")
        lines += [
            f"  {severity:<8} {members:>3} member{'s' if members != 1 else ' '}  {title}"
            for severity, members, title in self.incidents
        ]
        lines.append(
            f"look at it: runwatch dashboard --db {self.db}; "
            f"runwatch incidents --db {self.db} --run {self.run}; "
            f"runwatch export --db {self.db} --run {self.run}"
        )
        return "\n".join(lines)


def run_demo(
    db: str, *, steps: int = 3000, pace: float = 0.0, seed: int = 0, name: str | None = None
) -> DemoReport:
    """Stream the scenario into ``db``; ``pace`` > 0 limits it to that many steps/s."""
    name = name or f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    # params and tokens_per_step let the dashboard draw a tokens axis and place the run in
    # the scaling view (compute = 6 x params x tokens).
    config = {
        "model": "gpt2-124m (simulated)",
        "steps": steps,
        "seed": seed,
        "peak_lr": 6e-4,
        "params": 124_000_000,
        "tokens_per_step": TOKENS_PER_STEP,
    }
    # The step times are simulated, not measured here: this host's CPU wait says nothing.
    run = runwatch.init(
        name=name, project="demo", config=config, store=db, resume=False, cpu_wait=False
    )
    points, attempts = 0, 1
    metrics: set[str] = set()
    for item in demo_scenario(steps, seed=seed):
        if item.restart_from is not None:
            run.finish(status="crashed")
            run = runwatch.init(name=name, project="demo", store=db, resume=True, cpu_wait=False)
            attempts += 1
        run.log(item.metrics, step=item.step)
        points += len(item.metrics)
        metrics.update(item.metrics)
        if item.event is not None:
            kind, message = item.event
            run.event(kind, step=item.step, message=message)
        if pace > 0:
            time.sleep(1.0 / pace)
    run.finish()
    faults = [(f.kind, f.step, f.description) for f in describe_faults(steps)]
    with runwatch.open_store(db) as store:
        found = store.anomalies(name, source="live")
        incidents = [
            (r.severity, int(r.count), r.title)
            for r in store.incidents(name, source="live").itertuples(index=False)
        ]
    listed, unlisted = _listed(found)
    return DemoReport(
        db, name, steps, points, sorted(metrics), attempts, faults, listed, unlisted, incidents
    )


LISTED_AT_MOST = 20
"""Anomalies the report lists before it leaves info ones out (warnings are always listed)."""


def _listed(found: pd.DataFrame) -> tuple[list[tuple[int, int, str, str, str, str]], int]:
    """Every anomaly of warning or worse and, up to ``LISTED_AT_MOST`` in all, the earliest
    info ones, by start step; and how many info ones were left out. Info matters here: the
    demo's injected one-point loss spike recovers at once, so it is info, not a warning.
    ``found`` is in the store's order (by start step), and so is the list."""
    serious = found["severity"] != "info"
    room = max(LISTED_AT_MOST - int(serious.sum()), 0)
    keep = serious | (~serious).cumsum().le(room)
    listed = [
        (int(r.start_step), int(r.end_step), r.severity, r.detector, r.metric, r.message)
        for r in found[keep].itertuples()
    ]
    return listed, int((~keep).sum())


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


WATCHABLE_PACE = 20.0
"""Steps per second when the dashboard is open: 3,000 steps take 2.5 minutes, slow enough to
watch the spike, the NaN and the restart arrive, fast enough to see the whole story."""


def serve_demo(
    db: str,
    *,
    steps: int = 3000,
    seed: int = 0,
    pace: float | None = None,
    host: str = "127.0.0.1",
    port: int = 8501,
    open_browser: bool = True,
) -> int:
    """Serve the dashboard on ``db`` and stream the demo run into it at a watchable pace.

    The dashboard runs as a child process (started before the first step, so the run is
    seen live); after the run ends it stays up until Ctrl-C. Returns the exit code.
    """
    from runwatch.dashboard.server import (
        free_port,
        launch,
        open_browser_if_desktop,
        startup_log,
        url_of,
        wait_ready,
    )

    runwatch.open_store(db).close()  # the store exists before the dashboard looks at it
    port = free_port(host, port)
    proc = launch(db, host, port)
    url = url_of(host, port)
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (a scheduler, `kill`) ends the demo like Ctrl-C: the server goes with it.
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        if not wait_ready(url, timeout=60, proc=proc):
            raise RuntimeError(f"the dashboard did not start on {url}: {startup_log(proc)}")
        name = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
        pace = pace or WATCHABLE_PACE
        print(
            f"dashboard: {url}\nstreaming run {name!r} into {db} at {pace:g} steps/s "
            f"(~{steps / pace:.0f} s); Ctrl-C to stop",
            flush=True,
        )
        if open_browser:
            open_browser_if_desktop(url)
        print(run_demo(db, steps=steps, pace=pace, seed=seed, name=name), flush=True)
        print(f"the run has finished; the dashboard stays up at {url} (Ctrl-C to stop)", flush=True)
        proc.wait()
    except KeyboardInterrupt:
        print("stopping the dashboard", file=sys.stderr)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # never leave a server behind
                proc.kill()
    return 0
