"""What watches each series of a run: its role, where the role came from, its detectors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from runwatch.detect.roles import ROLES, detectors_for, override_of, role_of
from runwatch.model import LABEL_KEYS
from runwatch.pipeline.runconfig import run_config
from runwatch.store import Store

COLUMNS = ("metric", "labels", "points", "first_step", "last_step", "role", "override")


def run_roles(store: Store, run: str, roles: Mapping[str, str] | None = None) -> dict[str, str]:
    """The role overrides in force for ``run``: its config's ``roles``, then ``roles`` over
    them (the command line's)."""
    found = store.runs()
    row = found[found["name"] == run]
    config = run_config(row.iloc[0]["config"]) if not row.empty else {}
    merged = dict(config.get("roles") or {})
    merged.update(roles or {})
    for metric, role in merged.items():
        if role not in ROLES:
            raise ValueError(
                f"role {role!r} for metric {metric!r} is invalid; valid values: {', '.join(ROLES)}"
            )
    return merged


def watched_series(
    store: Store, run: str, roles: Mapping[str, str] | None = None, *, spans: bool = True
) -> list[dict[str, Any]]:
    """One record per series of ``run``: metric, labels, points, first and last step, role,
    whether that role is an override, and the names of the default detectors watching it
    (the Monitor's, for live watching and ``runwatch analyze`` alike). ``spans=False``
    leaves the steps None and reads no point."""
    overrides = run_roles(store, run, roles)
    catalogue = store.series(run)
    keys = ["metric", *LABEL_KEYS]
    steps: dict[tuple, tuple[int, int]] = {}
    points = store.read_points(run) if spans else None
    if points is not None and not points.empty:
        grouped = points.groupby(keys, dropna=False, sort=False)["step"].agg(["min", "max"])
        steps = {_key(k): (int(lo), int(hi)) for k, (lo, hi) in grouped.iterrows()}
    out = []
    for rec in catalogue.to_dict("records"):
        metric = rec["metric"]
        labels = {k: rec[k] for k in LABEL_KEYS if not _missing(rec[k])}
        first, last = steps.get(_key(tuple(rec[k] for k in keys)), (None, None))
        role = role_of(metric, overrides)
        out.append(
            {
                "metric": metric,
                "labels": labels,
                "points": int(rec["points"]),
                "first_step": first,
                "last_step": last,
                "role": role,
                "override": override_of(metric, overrides) is not None,
                "detectors": [d.name for d in detectors_for(role, metric)],
            }
        )
    return out


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def _key(values: tuple) -> tuple:
    """A series key whose missing labels compare equal (None, NaN)."""
    return tuple(None if _missing(v) else str(v) for v in values)


def as_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """``watched_series`` as a table to show: labels, steps and detectors as text, and an
    overridden role marked so."""
    frame = pd.DataFrame(records, columns=[*COLUMNS, "detectors"])
    frame["labels"] = [
        ", ".join(f"{k}={v}" for k, v in labels.items()) for labels in frame["labels"]
    ]
    frame["steps"] = [
        "" if lo is None else f"{lo}-{hi}"
        for lo, hi in zip(frame["first_step"], frame["last_step"], strict=True)
    ]
    frame["role"] = [
        f"{role} (override)" if over else role
        for role, over in zip(frame["role"], frame["override"], strict=True)
    ]
    frame["detectors"] = [", ".join(d) for d in frame["detectors"]]
    return frame
