"""Metric roles from names, and each role's default detector set.

A role is decided once per series, when the series is first seen, so the hot path never
matches names again.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping

from runwatch.detect.base import Detector
from runwatch.detect.nonfinite import NonFinite
from runwatch.detect.spike import Spike

ROLES: tuple[str, ...] = (
    "loss",
    "grad_norm",
    "lr",
    "throughput",
    "step_time",
    "cpu_wait",
    "other",
)
TIMING_ROLES: tuple[str, ...] = ("throughput", "step_time")
"""Roles whose points a busy host holds (``runwatch.detect.busy``)."""

# (pattern, role), first match wins; fnmatch patterns on the lower-cased metric name.
_NAME_RULES: tuple[tuple[str, str], ...] = (
    ("loss", "loss"),
    ("train_loss", "loss"),
    ("val_loss", "loss"),
    ("*_loss", "loss"),
    ("grad_norm*", "grad_norm"),
    ("lr", "lr"),
    ("learning_rate", "lr"),
    ("tokens_per_s*", "throughput"),
    ("samples_per_s*", "throughput"),
    ("*throughput*", "throughput"),
    ("tflops*", "throughput"),
    ("step_time*", "step_time"),
    ("iteration_time*", "step_time"),
    ("host_cpu_wait", "cpu_wait"),
)


def role_of(metric: str, overrides: Mapping[str, str] | None = None) -> str:
    """The role of ``metric``: a config override (exact name or fnmatch pattern) or its name.

    >>> role_of("val_loss"), role_of("grad_norm/total"), role_of("tflops_per_gpu")
    ('loss', 'grad_norm', 'throughput')
    >>> role_of("gpu_mem"), role_of("gpu_mem", {"gpu_*": "step_time"})
    ('other', 'step_time')
    """
    if overrides:
        if metric in overrides:
            return overrides[metric]
        for pattern, role in overrides.items():
            if fnmatch.fnmatchcase(metric, pattern):
                return role
    name = metric.lower()
    for pattern, role in _NAME_RULES:
        if fnmatch.fnmatchcase(name, pattern):
            return role
    return "other"


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
        Spike(threshold=6.0, warn_ratio=20.0, critical_ratio=100.0, sustain=50, sustain_ratio=3.0),
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
    "other": lambda: _other(None),
}
"""Role -> factory of a fresh default detector list; NonFinite always comes first. A metric
of role ``other`` gets :func:`detectors_for`'s list, which its name may narrow."""

# Words in a metric's name that say which way is worse, or that it is an index, a clock or
# a running total (whose level is no health signal). Whole words of the name, lower case.
_HIGHER_IS_BETTER = frozenset(
    [
        "acc",
        "accuracy",
        "reward",
        "rewards",
        "return",
        "returns",
        "score",
        "f1",
        "bleu",
        "rouge",
        "rougel",
        "precision",
        "recall",
        "auc",
        "auroc",
        "map",
        "iou",
        "dice",
        "em",
        "exact",
        "match",
        "win",
        "winrate",
        "pass",
        "mfu",
    ]
)
_LOWER_IS_BETTER = frozenset(
    [
        "ppl",
        "perplexity",
        "error",
        "err",
        "errors",
        "wer",
        "cer",
        "mse",
        "mae",
        "rmse",
        "nll",
        "latency",
        "bpb",
        "bpc",
    ]
)
_COUNTERS = frozenset(
    [
        "epoch",
        "epochs",
        "step",
        "steps",
        "iteration",
        "iter",
        "runtime",
        "timestamp",
        "consumed",
        "total",
        "seen",
        "flos",
    ]
)
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


def name_words(metric: str) -> list[str]:
    """The lower-case words of a metric name: split at ``/ . _ - ``, spaces and CamelCase.

    >>> name_words("eval/MeanReward"), name_words("val_ppl"), name_words("_runtime")
    (['eval', 'mean', 'reward'], ['val', 'ppl'], ['runtime'])
    """
    return [w.lower() for w in _WORDS.findall(metric)]


def worse_direction(metric: str) -> str | None:
    """Which way ``metric`` gets worse by its name: "up", "down", or None when it does not say;
    "counter" for an index, a clock or a running total (not judged by its level).

    >>> [worse_direction(m) for m in ("eval_accuracy", "val_ppl", "kl", "consumed_samples")]
    ['down', 'up', None, 'counter']
    """
    words = set(name_words(metric))
    if words & _COUNTERS:
        return "counter"
    better, worse = bool(words & _HIGHER_IS_BETTER), bool(words & _LOWER_IS_BETTER)
    if better == worse:
        return None
    return "down" if better else "up"


def _other(metric: str | None) -> list[Detector]:
    from runwatch.detect.change import Change

    direction = worse_direction(metric) if metric is not None else None
    if direction == "counter":
        return [NonFinite()]
    if direction is None:
        return [NonFinite(), Change("up"), Change("down")]
    return [NonFinite(), Change(direction)]


def detectors_for(role: str, metric: str) -> list[Detector]:
    """A fresh default detector list for ``metric`` of ``role``: the role's, and for a metric
    of no known role, rises and drops in the direction its name calls worse (both when it
    does not say; none when it is a counter or a clock).

    >>> [d.name for d in detectors_for("other", "reward_mean")]
    ['nonfinite', 'drop']
    """
    if role == "other":
        return _other(metric)
    return DEFAULT_DETECTORS[role]()
