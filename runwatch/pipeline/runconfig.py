"""A stored run's config and what follows from it: parsed config, tokens per step.

Used by ``analyze``/``forecast`` (tokens alignment of a reference run) and the dashboard.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

_TOKENS_PER_STEP_KEYS = ("tokens_per_step", "batch_tokens", "tokens_per_batch")


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
