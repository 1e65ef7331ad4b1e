"""Timed sections of a training step, for loops no comm hook can see (``run.section``).

``with sections.section("compute"):`` times a block with the wall clock and adds it to the
current step's total for that section; the totals are logged once per step, when the next
step's first section starts (or on :meth:`Sections.flush`), under the rank's labels. As in
NVIDIA resiliency-ext's detection sections, the user marks what is the rank's own work and
what is waiting: ``compute`` is logged as ``step_time_compute`` (the straggler detector's
own-time signal), ``wait``/``comm`` as ``comm_wait_time``, any other name ``N`` as
``section_N_time``. The step is the one the run's next ``run.log`` uses.

>>> class FakeRun:
...     step = 0
...     logged = []
...     def log_labeled(self, data, labels, step=None):
...         self.logged.append((step, data))
>>> run, ticks = FakeRun(), iter([0.0, 0.25, 0.25, 0.5, 1.0, 1.5])
>>> s = Sections(run, clock=lambda: next(ticks))
>>> with s.section("compute"):
...     pass
>>> with s.section("wait"):
...     pass
>>> run.step = 1
>>> with s.section("compute"):
...     pass
>>> run.logged
[(0, {'step_time_compute': 0.25, 'comm_wait_time': 0.25})]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

COMPUTE_METRIC = "step_time_compute"
WAIT_METRIC = "comm_wait_time"
_NAMES = {"compute": COMPUTE_METRIC, "wait": WAIT_METRIC, "comm": WAIT_METRIC}


def section_metric(name: str) -> str:
    """The metric a section is logged as."""
    return _NAMES.get(name) or f"section_{name}_time"


class Sections:
    """Per-step totals of named sections for one run (``run`` needs ``step`` and
    ``log_labeled``); not thread-safe: one training thread times its own step."""

    def __init__(self, run: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        self.run = run
        self.clock = clock
        self._step: int | None = None
        self._totals: dict[str, float] = {}

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Time the block as part of section ``name`` of the current step."""
        step = self.run.step
        if self._step is not None and step != self._step:
            self.flush()
        self._step = step
        began = self.clock()
        try:
            yield
        finally:
            metric = section_metric(name)
            self._totals[metric] = self._totals.get(metric, 0.0) + (self.clock() - began)

    def flush(self) -> None:
        """Log the current step's totals now (after the last step)."""
        if self._totals and self._step is not None:
            self.run.log_labeled(self._totals, {}, self._step)
        self._totals = {}
