"""A run's planned LR schedule, from its config: the LR it will use before it has logged it.

A forecast made before a run starts, or early in it, needs the LR to the last step: the
annealing still to come decides the final loss. The config's ``schedule`` says what is
planned, as a share of the peak LR at every step:

- ``name``: "constant", "cosine", "linear" (a decay from the end of the warmup to the last
  step) or "wsd" (warmup, stable, then a decay from ``decay_start`` to the last step);
- ``warmup``: warm-up steps (a linear ramp from 0; default 0);
- ``decay_start``: the step the decay starts at ("wsd" only; needed there);
- ``final_lr_fraction``: the LR at the last step as a share of the peak (default 0);
- ``decay_shape``: "cosine" or "linear", the shape of a "wsd" decay (default "linear");
- ``peak_lr``: the peak LR itself (optional; the laws use shares of the peak).

>>> steps, share = planned_lr({"name": "cosine", "final_lr_fraction": 0.1}, 100)
>>> round(float(share[0]), 2), round(float(share[50]), 2), round(float(share[100]), 2)
(1.0, 0.55, 0.1)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

SCHEDULE_NAMES = ("constant", "cosine", "linear", "wsd")
SCHEDULE_FIELDS = ("name", "warmup", "decay_start", "final_lr_fraction", "decay_shape", "peak_lr")
DECAY_SHAPES = ("cosine", "linear")


class BadSchedule(ValueError):
    """A config's ``schedule`` that cannot be read; the message names the key."""


def check_schedule(schedule: Any, total_steps: int | None = None) -> dict[str, Any]:
    """The schedule with its defaults filled in; ``BadSchedule`` naming the key that is
    unknown, missing or of the wrong kind."""
    if not isinstance(schedule, Mapping):
        raise BadSchedule(f"schedule must be a JSON object, not {type(schedule).__name__}")
    unknown = sorted(set(schedule) - set(SCHEDULE_FIELDS))
    if unknown:
        raise BadSchedule(
            f"schedule has unknown field(s) {', '.join(unknown)}; "
            f"known: {', '.join(SCHEDULE_FIELDS)}"
        )
    name = schedule.get("name")
    if name not in SCHEDULE_NAMES:
        raise BadSchedule(f"schedule.name {name!r} is not one of {', '.join(SCHEDULE_NAMES)}")
    out = {"name": name, "warmup": 0, "final_lr_fraction": 0.0, "decay_shape": "linear"}
    out |= dict(schedule)
    for key in ("warmup", "decay_start"):
        value = out.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
        ):
            raise BadSchedule(f"schedule.{key} must be a step count >= 0, not {value!r}")
    frac = out["final_lr_fraction"]
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac <= 1:
        raise BadSchedule(f"schedule.final_lr_fraction must be in [0, 1], not {frac!r}")
    if out["decay_shape"] not in DECAY_SHAPES:
        raise BadSchedule(
            f"schedule.decay_shape {out['decay_shape']!r} is not one of {', '.join(DECAY_SHAPES)}"
        )
    peak = out.get("peak_lr")
    if peak is not None and (isinstance(peak, bool) or not isinstance(peak, (int, float))):
        raise BadSchedule(f"schedule.peak_lr must be a number, not {peak!r}")
    if name == "wsd" and out.get("decay_start") is None:
        raise BadSchedule("schedule.decay_start is needed for a 'wsd' schedule")
    start = out.get("decay_start")
    if total_steps is not None and start is not None and start > total_steps:
        raise BadSchedule(f"schedule.decay_start {start} is after total_steps {total_steps}")
    return out


def planned_lr(schedule: Mapping[str, Any], total_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps 0..total_steps, the LR as a share of the peak at each) for ``schedule``."""
    sched = check_schedule(schedule, total_steps)
    steps = np.arange(int(total_steps) + 1, dtype=float)
    warm = float(sched["warmup"])
    floor = float(sched["final_lr_fraction"])
    share = np.ones_like(steps)
    name = sched["name"]
    if name != "constant":
        start = float(sched["decay_start"]) if name == "wsd" else warm
        shape = sched["decay_shape"] if name == "wsd" else name
        t = np.clip((steps - start) / max(total_steps - start, 1.0), 0.0, 1.0)
        left = 0.5 * (1.0 + np.cos(np.pi * t)) if shape == "cosine" else 1.0 - t
        share = floor + (1.0 - floor) * left
    if warm > 0:
        share = np.where(steps < warm, share * (steps + 1.0) / warm, share)
    return steps, share
