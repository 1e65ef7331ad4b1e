"""A run's config and what follows from it: checked config, parsed config, tokens per step.

Used by ``import --config`` (checking), ``runs`` (the planned columns), ``analyze``/
``forecast`` (tokens alignment of a reference run) and the dashboard.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from runwatch.expect.planned import BadSchedule, check_schedule

_TOKENS_PER_STEP_KEYS = ("tokens_per_step", "batch_tokens", "tokens_per_batch")
LISTED_KEYS = ("params", "total_steps", "tokens_per_step", "schedule")
"""The config keys ``runwatch runs`` shows (columns, and keys of ``--format json``)."""


class BadRunConfig(ValueError):
    """A run config that cannot be stored; ``key`` is the config key at fault (None when
    the config as a whole is wrong)."""

    def __init__(self, key: str | None, message: str) -> None:
        super().__init__(message)
        self.key = key


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive_number(key: str, value: Any, what: str) -> int | float:
    if not _number(value) or value <= 0:
        raise BadRunConfig(key, f"{key} must be a positive number ({what}), not {value!r}")
    return value


def _params(value: Any) -> int | float:
    return _positive_number("params", value, "the parameter count")


def _tokens_per_step(value: Any) -> int | float:
    return _positive_number("tokens_per_step", value, "tokens per optimizer step")


def _total_steps(value: Any) -> int:
    # JSON writes 1e5 as a float: a whole number of steps is taken in either spelling.
    if not _number(value) or value <= 0 or not float(value).is_integer():
        raise BadRunConfig(
            "total_steps", f"total_steps must be a positive whole number of steps, not {value!r}"
        )
    return int(value)


def _family(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise BadRunConfig("family", f"family must be a list of run names, not {value!r}")
    return value


def _reference(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise BadRunConfig("reference", f"reference must be a run name, not {value!r}")
    return value


_CHECKS: dict[str, Callable[[Any], Any]] = {
    "params": _params,
    "total_steps": _total_steps,
    "tokens_per_step": _tokens_per_step,
    "family": _family,
    "reference": _reference,
}


def _schedule(schedule: Any, total_steps: int | None, note: str = "") -> None:
    try:
        check_schedule(schedule, total_steps)
    except BadSchedule as exc:
        raise BadRunConfig("schedule", f"{exc}{note}") from exc


def check_run_config(obj: Any) -> dict[str, Any]:
    """``obj`` as a run config: the keys with a meaning checked (``params``,
    ``total_steps``, ``tokens_per_step``, ``schedule``, ``family``, ``reference``; see
    docs/architecture.md), every other key kept as given. Raises :class:`BadRunConfig`
    naming the key, so ``import --config`` can refuse before it writes anything.

    >>> check_run_config({"params": 1.2e8, "total_steps": 5e3, "lr": 3e-4})
    {'params': 120000000.0, 'total_steps': 5000, 'lr': 0.0003}
    >>> check_run_config({"schedule": {"name": "cosine", "warmpu": 100}})
    Traceback (most recent call last):
    ...
    runwatch.pipeline.runconfig.BadRunConfig: schedule has unknown field(s) warmpu; ...
    """
    if not isinstance(obj, Mapping):
        raise BadRunConfig(None, f"a run config must be a JSON object, not {_kind(obj)}")
    out = dict(obj)
    for key, check in _CHECKS.items():
        if key in out:
            out[key] = check(out[key])
    if "schedule" in out:
        _schedule(out["schedule"], out.get("total_steps"))
    return out


def merge_run_config(stored: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` (checked by :func:`check_run_config`) merged into a run's ``stored``
    config, its keys winning; a schedule is checked again against the merged
    ``total_steps`` when either is new (a stored ``total_steps`` may not be a valid one:
    runs logged through ``runwatch.init`` keep their config as given).

    >>> merge_run_config({"total_steps": 1000, "lr": 1}, {"lr": 2})
    {'total_steps': 1000, 'lr': 2}
    """
    merged = {**stored, **given}
    if "schedule" in merged and ("schedule" in given or "total_steps" in given):
        try:
            total = _total_steps(merged.get("total_steps"))
        except BadRunConfig:
            total = None
        _schedule(merged["schedule"], total, " (merged with the run's stored config)")
    return merged


def listed_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config keys ``runwatch runs`` lists (:data:`LISTED_KEYS`), each None when
    absent or not valid (a run logged through ``runwatch.init`` keeps its config as given).

    >>> listed_config({"params": 7e9, "total_steps": "long"})
    {'params': 7000000000.0, 'total_steps': None, 'tokens_per_step': None, 'schedule': None}
    """
    out: dict[str, Any] = {}
    for key in LISTED_KEYS:
        value = config.get(key)
        try:
            if key == "schedule":
                _schedule(value, None)
            elif value is not None:
                value = _CHECKS[key](value)
        except BadRunConfig:
            value = None
        out[key] = value
    return out


def _kind(value: Any) -> str:
    """A JSON value's kind in JSON's words, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else type(value).__name__


def run_config(raw: str | None) -> dict[str, Any]:
    """The run's config JSON as a dict ({} when empty or not an object)."""
    import json

    try:
        parsed = json.loads(raw or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def tokens_per_step(config: Mapping[str, Any], sample: pd.DataFrame | None = None) -> float | None:
    """Tokens processed per step: a config key, else median(tokens_per_s x step_time_s).

    ``sample`` has columns tokens_per_s and step_time_s aligned by step (may be None).

    >>> tokens_per_step({"tokens_per_step": 4096})
    4096.0
    """
    for key in _TOKENS_PER_STEP_KEYS:
        value = config.get(key)
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    if sample is not None and {"tokens_per_s", "step_time_s"} <= set(sample.columns):
        product = (sample["tokens_per_s"] * sample["step_time_s"]).to_numpy(dtype=float)
        product = product[np.isfinite(product) & (product > 0)]
        if product.size:
            return float(np.median(product))
    return None


def aligned_sample(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Metrics side by side by step (latest attempt only, one row per step), for
    :func:`tokens_per_step`; downsampled frames align on the steps they share."""
    columns = {}
    for metric, frame in frames.items():
        live = frame[~frame["superseded"]] if "superseded" in frame else frame
        columns[metric] = live.drop_duplicates("step", keep="last").set_index("step")["value"]
    return pd.DataFrame(columns).reset_index(drop=True) if columns else pd.DataFrame()
