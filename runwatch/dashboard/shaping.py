"""Pure frame transforms behind the dashboard: smoothing, x-axes, health, compute, scaling law,
and the Markdown tables of the Run page.

Nothing here imports Streamlit, so every rule a person reads off a page (what makes a run
"critical", how tokens are counted, which law is fitted) is unit-tested on plain frames.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from itertools import accumulate
from typing import Any

import numpy as np
import pandas as pd

from runwatch.detect.roles import role_of

X_AXES: tuple[str, ...] = ("step", "wall time", "tokens")
HEALTH: tuple[str, ...] = ("healthy", "warning", "critical")
HEALTH_COLOR = {"healthy": "green", "warning": "orange", "critical": "red"}
"""Streamlit badge colours per health state."""
SEVERITY_BADGE = {"info": "yellow", "warning": "orange", "critical": "red"}
"""Streamlit badge colours per anomaly severity (the chart's markers use the same hues)."""
STATE_BADGE = {"needs verdict": "gray", "benign": "green", "real": "red", "watch": "blue"}
"""Streamlit badge colours per triage state (``triage_state``)."""
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]<>|$~:])")
"""What Markdown, LaTeX (``$``), badges and emoji codes (``:``) would read as syntax."""

_COMPUTE_KEYS = ("compute", "flops", "total_flops", "compute_flops")
_PARAM_KEYS = ("params", "n_params", "num_params", "parameters", "model_params")
_TOKEN_KEYS = ("tokens", "total_tokens", "train_tokens")


_MODEL_TEXT = {
    "power_law": "a robust power law in the step, fitted on the run so far",
    "lr_law": "the LR-schedule-aware law (summed LR and annealing, Tissue et al. 2024), "
    "fitted on the run so far",
    "reference": "an earlier, known-good run's curve (reference mode)",
}


def model_text(model: str, lr_note: str | None = None) -> str:
    """What the expected curve's model is, in words, for a tooltip; ``lr_note`` is what
    the forecast made of the logged LR (``Forecast.lr_note``).

    >>> model_text("reference")
    "an earlier, known-good run's curve (reference mode)"
    >>> model_text("lr_law", "the LR's cosine decay carried on to step 9000")
    "the LR-schedule-aware law (...), fitted on the run so far; the LR's cosine decay ..."
    """
    words = _MODEL_TEXT.get(model, f"model {model}")
    return words if lr_note is None else f"{words}; {lr_note}"


def ema(values: np.ndarray | pd.Series, weight: float) -> np.ndarray:
    """TensorBoard's debiased EMA: ``weight`` 0 is raw, 0.99 very smooth.

    Non-finite values pass through unsmoothed and do not enter the average (as in
    TensorBoard), so a NaN loss stays visible instead of poisoning every later point.

    >>> ema(np.array([1.0, np.nan, 3.0]), 0.5).round(3).tolist()
    [1.0, nan, 2.333]
    """
    x = np.asarray(values, dtype=np.float64)
    if weight <= 0 or x.size == 0:
        return x.copy()
    if not 0 <= weight < 1:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    out = x.copy()
    ok = np.isfinite(x)
    finite = x[ok]
    if finite.size:
        # s[k] = (1 - w) x[k] + w s[k-1]: the same float operations as scipy.signal.lfilter,
        # without importing scipy.signal (slow to import) for this one call.
        steps = accumulate(((1.0 - weight) * finite).tolist(), lambda s, v: v + weight * s)
        smooth = np.fromiter(steps, dtype=np.float64, count=finite.size)
        debias = 1.0 - weight ** np.arange(1, finite.size + 1)
        out[ok] = smooth / debias
    return out


def metrics_by_role(metrics: list[str], config: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The first metric of each role (loss, grad_norm, lr, throughput, step_time).

    ``loss`` itself wins over ``val_loss`` and friends: the training loss is the curve
    people watch, the others are drawn when asked for.

    >>> metrics_by_role(["val_loss", "loss", "lr", "gpu_mem"])
    {'loss': 'loss', 'lr': 'lr'}
    """
    overrides = dict((config or {}).get("roles", {}) or {})
    found: dict[str, str] = {}
    for metric in sorted(metrics, key=lambda m: (m != "loss", m)):
        role = role_of(metric, overrides)
        if role != "other" and role not in found:
            found[role] = metric
    return found


def with_x(frame: pd.DataFrame, axis: str, tps: float | None) -> pd.DataFrame:
    """Add the column ``x`` for the chosen axis: step, wall time (datetime) or tokens."""
    if axis == "step" or (axis == "tokens" and not tps):
        return frame.assign(x=frame["step"])
    if axis == "tokens":
        return frame.assign(x=frame["step"].astype(float) * float(tps or 0))
    if axis == "wall time":
        return frame.assign(x=pd.to_datetime(frame["time"], unit="s", utc=True))
    raise ValueError(f"unknown x axis {axis!r}; valid: {', '.join(X_AXES)}")


def steps_to_x(steps: Any, axis: str, tps: float | None, ref: pd.DataFrame | None) -> Any:
    """Map steps (anomalies, restarts, the expected curve) onto the chosen axis.

    Wall time is interpolated from ``ref`` (a series with step and time): an anomaly's step
    gets the time at which that step was logged.
    """
    s = np.asarray(steps, dtype=float)
    if axis == "tokens" and tps:
        return s * tps
    if axis == "wall time" and ref is not None and len(ref):
        t = np.interp(s, ref["step"].to_numpy(float), ref["time"].to_numpy(float))
        return pd.to_datetime(t, unit="s", utc=True)
    return s


def pick_source(anomalies: pd.DataFrame) -> pd.DataFrame:
    """One set of anomalies per run: the live ones, or the replayed ones if none were live.

    ``runwatch analyze`` finds the same episodes again, so showing both would double them.
    """
    if anomalies.empty:
        return anomalies
    has_live = anomalies.groupby("run")["source"].transform(lambda s: (s == "live").any())
    keep = np.where(has_live, anomalies["source"] == "live", anomalies["source"] == "replay")
    return anomalies[keep].reset_index(drop=True)


def triage_state(verdict: Any) -> str:
    """'needs verdict' until a person judged it; then the verdict."""
    return verdict if isinstance(verdict, str) and verdict else "needs verdict"


def unresolved(anomalies: pd.DataFrame) -> pd.DataFrame:
    """Anomalies that still count against a run: no verdict yet, or judged real."""
    if anomalies.empty:
        return anomalies
    return anomalies[anomalies["verdict"].isna() | (anomalies["verdict"] == "real")]


def health_of(anomalies: pd.DataFrame) -> str:
    """healthy / warning / critical: the worst severity among unresolved anomalies.

    Info-level findings (a 5-sigma blip) are listed but never turn a run orange.

    >>> health_of(pd.DataFrame({"severity": ["info", "warning"], "verdict": [None, None]}))
    'warning'
    """
    bad = unresolved(anomalies)
    severities = set(bad["severity"]) if not bad.empty else set()
    if "critical" in severities:
        return "critical"
    if "warning" in severities:
        return "warning"
    return "healthy"


def format_age(seconds: float | None) -> str:
    """'42 s', '5 min', '3.2 h', '2.0 d' (or '-' when unknown).

    >>> format_age(42), format_age(300), format_age(3 * 3600 + 720)
    ('42 s', '5 min', '3.2 h')
    """
    if seconds is None or not math.isfinite(seconds):
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def compute_of(
    config: Mapping[str, Any], final_step: float | None, tps: float | None
) -> float | None:
    """Training compute in FLOPs: a ``compute``/``flops`` config key, else 6 x params x tokens.

    Tokens come from a ``tokens`` config key, else final step x tokens per step. 6·N·D is
    the usual dense-transformer estimate (forward + backward), which is what scaling-law
    plots of sibling runs use; a run that logs its own FLOPs should put them in the config.

    >>> compute_of({"params": 1e8}, 1000, 4096)
    2457600000000000.0
    """
    for key in _COMPUTE_KEYS:
        value = config.get(key)
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    params = next(
        (float(config[k]) for k in _PARAM_KEYS if isinstance(config.get(k), (int, float))), None
    )
    tokens = next(
        (float(config[k]) for k in _TOKEN_KEYS if isinstance(config.get(k), (int, float))), None
    )
    if tokens is None and final_step and tps:
        tokens = float(final_step) * tps
    if params and tokens and params > 0 and tokens > 0:
        return 6.0 * params * tokens
    return None


def fit_scaling_law(compute: np.ndarray, loss: np.ndarray) -> tuple[float, float] | None:
    """Fit L = a · C^(-b) by least squares in log-log; None with fewer than 2 usable runs.

    A pure power law (no irreducible term) is what a handful of sibling runs can support;
    a three-parameter law needs more runs than most teams have at one size ladder.

    >>> a, b = fit_scaling_law(np.array([1e18, 1e19, 1e20]), np.array([4.0, 3.2, 2.56]))
    >>> round(b, 4)
    0.0969
    """
    c = np.asarray(compute, dtype=float)
    y = np.asarray(loss, dtype=float)
    ok = np.isfinite(c) & np.isfinite(y) & (c > 0) & (y > 0)
    if ok.sum() < 2 or np.unique(c[ok]).size < 2:
        return None
    slope, intercept = np.polyfit(np.log(c[ok]), np.log(y[ok]), 1)
    return float(math.exp(intercept)), float(-slope)


def runs_summary(
    runs: pd.DataFrame,
    anomalies: pd.DataFrame,
    latest: Mapping[str, float | None],
    forecasts: Mapping[str, Mapping[str, Any] | None],
    now: float,
    incidents: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The Runs page table: one row per run, newest first.

    ``latest`` maps run -> loss now; ``forecasts`` run -> the forecast dict (expected_now,
    predicted, lower, upper, eta_seconds) or None. A run with ``incidents`` is judged by
    them (health from the unresolved ones, "open" = incidents waiting for a verdict); a
    run without any (stored before incidents existed) by its anomalies.
    """
    rows = []
    for rec in runs.itertuples(index=False):
        mine = anomalies[anomalies["run"] == rec.name] if len(anomalies) else anomalies
        own = (
            incidents[incidents["run"] == rec.name]
            if incidents is not None and len(incidents)
            else None
        )
        if own is not None and len(own):
            mine = own
            open_n = int((own["status"] == "open").sum())
        else:
            open_n = len(unresolved(mine)) if len(mine) else 0
        fc = forecasts.get(rec.name) or {}
        last_time = rec.last_time if pd.notna(rec.last_time) else None
        age = None if last_time is None else now - float(last_time)
        loss_now = latest.get(rec.name)
        expected_now = fc.get("expected_now")
        rows.append(
            {
                "health": health_of(mine) if len(mine) else "healthy",
                "run": rec.name,
                "status": rec.status,
                "last step": None if pd.isna(rec.last_step) else int(rec.last_step),
                "age": (
                    format_age(age)
                    if rec.status == "running" or age is None
                    else format_age(age) + " ago"
                ),
                "loss now": loss_now,
                "vs expected": (
                    None
                    if loss_now is None or expected_now is None or not expected_now
                    else loss_now / expected_now - 1.0
                ),
                "forecast final": fc.get("predicted"),
                "band": (
                    f"{fc['lower']:.3f} – {fc['upper']:.3f}" if fc.get("lower") is not None else ""
                ),
                "ETA": format_age(fc.get("eta_seconds")) if rec.status == "running" else "done",
                "open": open_n,
                "attempts": int(rec.attempts),
            }
        )
    table = pd.DataFrame(rows)
    return table.iloc[::-1].reset_index(drop=True) if len(table) else table


def markdown_text(value: Any) -> str:
    """``value`` as literal Markdown: its ``|``, ``$``, ``*``, ``[`` ... are escaped, so a
    message such as "loss 2.3 | expected $2.1" neither breaks a table row nor turns into
    LaTeX, and its line breaks become spaces.

    >>> print(markdown_text("a|b $x$ *y*"))
    a\\|b \\$x\\$ \\*y\\*
    """
    text = " ".join(str(value).split())
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def markdown_table(frame: pd.DataFrame, raw: tuple[str, ...] = ()) -> str:
    """``frame`` as a GitHub-flavoured Markdown table; the ``raw`` columns already hold
    Markdown (a severity badge) and are not escaped.

    The Run page lists its anomalies and events this way rather than with ``st.dataframe``:
    the data grid is a large JavaScript chunk that a cold browser evaluates after plotly.js,
    on the page's critical path, for tables of a few dozen rows (bench/README-dashboard.md).

    >>> print(markdown_table(pd.DataFrame({"a": [1], "b": ["x|y"]})))
    | a | b |
    | --- | --- |
    | 1 | x\\|y |
    """
    head = "| " + " | ".join(markdown_text(c) for c in frame.columns) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    body = [
        "| "
        + " | ".join(
            str(v) if c in raw else markdown_text("" if pd.isna(v) else v)
            for c, v in zip(frame.columns, row, strict=True)
        )
        + " |"
        for row in frame.itertuples(index=False)
    ]
    return "\n".join([head, rule, *body])


def anomaly_rows(anomalies: pd.DataFrame, limit: int) -> pd.DataFrame:
    """The Run page's anomaly list: the ``limit`` most recent, newest first, one column of
    steps, the severity and the state as coloured badges (for ``markdown_table(...,
    raw=("severity", "state"))``).

    >>> a = pd.DataFrame({"id": [1], "severity": ["critical"], "detector": ["nonfinite"],
    ...     "metric": ["loss"], "start_step": [5], "end_step": [5], "state": ["needs verdict"],
    ...     "message": ["NaN"]})
    >>> anomaly_rows(a, 10).iloc[0].to_dict()["severity"]
    ':red-badge[critical]'
    """
    recent = anomalies.sort_values(["start_step", "id"]).iloc[::-1].head(limit)
    # Word joiners keep a step range on one line (badges do not wrap); the message wraps.
    steps = [
        f"{a:,}" if a == b else f"{a:,}\u2060–\u2060{b:,}"
        for a, b in zip(recent["start_step"], recent["end_step"], strict=True)
    ]
    return pd.DataFrame(
        {
            "#": recent["id"].to_numpy(),
            "severity": [
                f":{SEVERITY_BADGE.get(v, 'gray')}-badge[{v}]" for v in recent["severity"]
            ],
            "detector": recent["detector"].to_numpy(),
            "metric": recent["metric"].to_numpy(),
            "steps": steps,
            "state": [f":{STATE_BADGE.get(v, 'gray')}-badge[{v}]" for v in recent["state"]],
            "message": recent["message"].to_numpy(),
        }
    )
