"""Metric roles from names, and each role's default detector set.

A role is decided once per series, when the series is first seen, so the hot path never
matches names again.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping

from runwatch.detect.backsteps import CounterReset, LossScaleDrop
from runwatch.detect.base import Detector
from runwatch.detect.names import role_from_name, worse_direction
from runwatch.detect.nonfinite import NonFinite
from runwatch.detect.spike import Spike

ROLES: tuple[str, ...] = (
    "loss",
    "grad_norm",
    "lr",
    "throughput",
    "step_time",
    "cpu_wait",
    "loss_scale",
    "counter",
    "index",
    "other",
)
TIMING_ROLES: tuple[str, ...] = ("throughput", "step_time")
"""Roles whose points a busy host holds (``runwatch.detect.busy``)."""


def role_of(metric: str, overrides: Mapping[str, str] | None = None) -> str:
    """The role of ``metric``: a config override (exact name or fnmatch pattern) or its name.

    >>> role_of("val_loss"), role_of("grad_norm/total"), role_of("tflops_per_gpu")
    ('loss', 'grad_norm', 'throughput')
    >>> role_of("gpu_mem"), role_of("gpu_mem", {"gpu_*": "step_time"})
    ('other', 'step_time')
    """
    return override_of(metric, overrides) or role_from_name(metric)


def override_of(metric: str, overrides: Mapping[str, str] | None) -> str | None:
    """The role ``overrides`` give ``metric`` (its exact name first, then the first fnmatch
    pattern that matches), or None when they say nothing about it."""
    if not overrides:
        return None
    if metric in overrides:
        return overrides[metric]
    for pattern, role in overrides.items():
        if fnmatch.fnmatchcase(metric, pattern):
            return role
    return None


def _loss() -> list[Detector]:
    from runwatch.detect.deviation import CurveDeviation
    from runwatch.detect.divergence import Divergence
    from runwatch.detect.stall import Stall

    return [NonFinite(), Spike(), Divergence(), CurveDeviation(), Stall()]


def _grad_norm() -> list[Detector]:
    # Grad norms are burstier than losses (heavy tails, often printed to 2 decimals): a
    # higher threshold keeps info noise down, and only large or lasting bursts are warnings.
    return [
        NonFinite(),
        Spike(
            threshold=6.0,
            warn_ratio=20.0,
            critical_ratio=100.0,
            sustain=50,
            sustain_ratio=3.0,
            shift_ratio=3.0,
        ),
    ]


def _lr() -> list[Detector]:
    from runwatch.detect.lr import LRSanity

    return [NonFinite(), LRSanity()]


def _throughput() -> list[Detector]:
    from runwatch.detect.regression import Regression

    return [NonFinite(), Regression(higher_is_better=True)]


def _step_time() -> list[Detector]:
    from runwatch.detect.regression import Regression

    return [NonFinite(), Regression(higher_is_better=False)]


def _cpu_wait() -> list[Detector]:
    from runwatch.detect.busy import HostBusy

    return [NonFinite(), HostBusy()]


DEFAULT_DETECTORS: dict[str, Callable[[], list[Detector]]] = {
    "loss": _loss,
    "grad_norm": _grad_norm,
    "lr": _lr,
    "throughput": _throughput,
    "step_time": _step_time,
    "cpu_wait": _cpu_wait,
    "loss_scale": lambda: [NonFinite(), LossScaleDrop()],
    "counter": lambda: [NonFinite(), CounterReset()],
    "index": lambda: [NonFinite()],
    "other": lambda: _other(None),
}
"""Role -> factory of a fresh default detector list; NonFinite always comes first. A metric
of role ``other`` gets :func:`detectors_for`'s list, which its name may narrow."""


def _other(metric: str | None) -> list[Detector]:
    from runwatch.detect.change import Change

    direction = worse_direction(metric) if metric is not None else None
    if direction is None:
        return [NonFinite(), Change("up"), Change("down")]
    return [NonFinite(), Change(direction)]


def detectors_for(role: str, metric: str) -> list[Detector]:
    """A fresh default detector list for ``metric`` of ``role``: the role's, and for a metric
    of no known role, rises and drops in the direction its name calls worse (both when it
    does not say).

    >>> [d.name for d in detectors_for("other", "reward_mean")]
    ['nonfinite', 'drop']
    """
    if role == "other":
        return _other(metric)
    return DEFAULT_DETECTORS[role]()
