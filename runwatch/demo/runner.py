"""``runwatch demo``: play the demo scenario through the real hook into a store.

The demo is an ordinary user of the public API: ``runwatch.init``, ``run.log``,
``run.event``; the crash ends the first process's run (status ``crashed``) and the restart
resumes it under the same name, as a job scheduler restarting a training script would, so the
store shows two attempts and the redone steps as lost work.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import runwatch
from runwatch.demo.scenario import demo_scenario, describe_faults

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

    def __str__(self) -> str:
        lines = [
            f"wrote run {self.run!r} to {self.db}: {self.points:,} points of "
            f"{len(self.metrics)} metrics ({', '.join(self.metrics)}) over {self.steps:,} steps "
            f"in {self.attempts} attempts",
            "faults in it:",
        ]
        lines += [f"  step {step:>6}  {kind:<15} {text}" for kind, step, text in self.faults]
        lines.append(
            f"look at it: runwatch runs --db {self.db}; "
            f"runwatch export --db {self.db} --run {self.run}"
        )
        return "\n".join(lines)


def run_demo(
    db: str, *, steps: int = 3000, pace: float = 0.0, seed: int = 0, name: str | None = None
) -> DemoReport:
    """Stream the scenario into ``db``; ``pace`` > 0 limits it to that many steps/s."""
    name = name or f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    config = {"model": "gpt2-124m (simulated)", "steps": steps, "seed": seed, "peak_lr": 6e-4}
    run = runwatch.init(name=name, project="demo", config=config, store=db, resume=False)
    points, attempts = 0, 1
    metrics: set[str] = set()
    for item in demo_scenario(steps, seed=seed):
        if item.restart_from is not None:
            run.finish(status="crashed")
            run = runwatch.init(name=name, project="demo", store=db, resume=True)
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
    return DemoReport(db, name, steps, points, sorted(metrics), attempts, faults)
