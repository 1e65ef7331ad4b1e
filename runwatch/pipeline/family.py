"""Family forecasts of stored runs: the family's runs and the target's plan, read from the
store and their configs, checked with errors that name the run and the key.

What ``forecast --family``, ``analyze --family`` and ``runwatch.init(family=...)`` share.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from runwatch.detect.roles import role_of
from runwatch.expect.family import FIT_FROM, Member, final_value
from runwatch.expect.family_fit import fit_family
from runwatch.expect.family_forecast import family_forecast
from runwatch.expect.forecast import Forecast
from runwatch.expect.planned import BadSchedule, planned_lr
from runwatch.expect.powerlaw import TooLittleData
from runwatch.expect.reference import ReferenceCurve
from runwatch.expect.schedule import project_lr
from runwatch.model import LR_METRICS
from runwatch.pipeline.reads import MissingMetricError, read_metric
from runwatch.pipeline.runconfig import run_config
from runwatch.store import Store

log = logging.getLogger("runwatch.pipeline.family")

PARAMS_KEYS = ("params", "n_params", "num_params", "num_parameters")
TOTAL_STEP_KEYS = ("total_steps", "max_steps", "train_steps", "num_steps", "steps", "train_iters")
CURVE_POINTS = 400
"""Points of the family curve handed to the expected-curve detector (log-spaced)."""


def config_of(store: Store, run: str) -> dict[str, Any]:
    """``run``'s stored config (an error naming it when there is no such run)."""
    store.run_id(run)
    runs = store.runs()
    row = runs[runs["name"] == run]
    return run_config(row.iloc[0]["config"] if not row.empty else None)


def params_of(config: Mapping[str, Any]) -> float | None:
    """The parameter count a config gives (``params`` or a common alias), else None."""
    for key in PARAMS_KEYS:
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


def total_steps_of(config: Mapping[str, Any]) -> int | None:
    """The planned last step a config gives (``total_steps``, ``max_steps``, ...)."""
    for key in TOTAL_STEP_KEYS:
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return int(value)
    return None


def _exists(store: Store, run: str) -> bool:
    return bool((store.runs()["name"] == run).any())


def _logged_lr(store: Store, run: str) -> tuple[np.ndarray, np.ndarray] | None:
    if not _exists(store, run):  # a live run not started yet: nothing logged
        return None
    for name in LR_METRICS:
        frame = store.read_series(run, name)
        if not frame.empty:
            return frame["step"].to_numpy(float), frame["value"].to_numpy(float)
    return None


def _peak(config: Mapping[str, Any], logged: np.ndarray | None) -> float | None:
    sched = config.get("schedule")
    planned = sched.get("peak_lr") if isinstance(sched, Mapping) else None
    for value in (planned, config.get("peak_lr")):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    if logged is not None and np.isfinite(logged).any() and np.nanmax(logged) > 0:
        return float(np.nanmax(logged))
    return None


def lr_share(
    store: Store, run: str, config: Mapping[str, Any], final_step: int, upto: int | None = None
) -> tuple[np.ndarray, np.ndarray, str] | None:
    """``run``'s LR as a share of its peak to ``final_step``, and where it came from: the LR
    it logged (up to ``upto``), with its config's planned schedule where nothing is logged
    ("logged+planned", "planned"), else the logged decay carried on (``project_lr``;
    "logged"). None when there is neither a logged LR nor a schedule."""
    logged = _logged_lr(store, run)
    if logged is not None and upto is not None:
        keep = logged[0] <= upto
        logged = (logged[0][keep], logged[1][keep]) if keep.any() else None
    sched = config.get("schedule")
    plan = None
    if sched is not None:
        try:
            plan = planned_lr(sched, final_step)
        except BadSchedule as exc:
            raise ValueError(f"run {run!r}: {exc}") from None
    peak = _peak(config, None if logged is None else logged[1])
    if logged is not None and peak is not None:
        ls, share = logged[0], logged[1] / peak
        if plan is not None:  # the plan where the log has no points: before it, after it
            out = (plan[0] < ls.min()) | (plan[0] > ls.max())
            order = np.argsort(np.r_[ls, plan[0][out]], kind="stable")
            steps = np.r_[ls, plan[0][out]][order]
            return steps, np.r_[share, plan[1][out]][order], "logged+planned"
        projected = project_lr(ls, share, final_step)
        return projected.steps, projected.values, "logged"
    if plan is not None:
        return plan[0], plan[1], "planned"
    return None


def family_members(store: Store, family: Sequence[str], metric: str) -> list[Member]:
    """The family's runs as ``Member``s of ``metric``; a ``ValueError`` naming the run that
    has no ``params``, no such metric, or no LR (logged or planned)."""
    members = []
    for name in family:
        config = config_of(store, name)
        params = params_of(config)
        if params is None:
            raise ValueError(
                f"family run {name!r} has no params (parameter count) in its config; add it "
                f"with: runwatch import FILE --run {name} --append --config '{{\"params\": N}}'"
            )
        series = read_metric(store, name, metric, "family run")
        last = int(series["step"].max())
        share = lr_share(store, name, config, max(total_steps_of(config) or 0, last))
        if share is None:
            raise ValueError(
                f"family run {name!r} has no logged lr and no schedule in its config: "
                "the family law needs each run's learning rate"
            )
        members.append(
            Member(
                name,
                params,
                series["step"].to_numpy(float),
                series["value"].to_numpy(float),
                share[0],
                share[1],
            )
        )
    return members


def check_family(family: Sequence[str], run: str) -> list[str]:
    """The family's names, each once, without ``run`` itself (an error if it is there)."""
    names = list(dict.fromkeys(family))
    if not names:
        raise ValueError("--family needs at least one run")
    if run in names:
        raise ValueError(f"the family must be other runs than {run!r}")
    return names


def target_plan(
    store: Store,
    run: str,
    members: list[Member],
    final_step: int | None,
    upto: int | None = None,
    config: Mapping[str, Any] | None = None,
) -> tuple[float, int, np.ndarray, np.ndarray]:
    """The target's params, final step and LR share to it; a ``ValueError`` naming the key
    the target's config lacks. Without an LR or schedule of its own, the target is taken to
    follow the largest family run's schedule, stretched to its length (with a warning).
    ``config``: the target's, when it is not stored yet (a live run being started)."""
    config = config_of(store, run) if config is None else config
    params = params_of(config)
    if params is None:
        raise ValueError(
            f"run {run!r} has no params (parameter count) in its config; a family forecast "
            f"needs it: runwatch import FILE --run {run} --append --config '{{\"params\": N}}'"
        )
    fin = final_step or total_steps_of(config)
    if fin is None:
        raise ValueError(
            f"run {run!r} has no total_steps in its config; give --final-step or add it with "
            "--config '{\"total_steps\": N}'"
        )
    if params < min(m.params for m in members) * 0.98:
        log.warning(
            "run %r (%.3g params) is smaller than every family run: the family law is "
            "extrapolated down and the band widened",
            run,
            params,
        )
    share = lr_share(store, run, config, fin, upto)
    if share is not None:
        return params, fin, share[0], share[1]
    like = max(members, key=lambda m: (m.params, m.last_step))
    log.warning(
        "run %r has no logged lr and no schedule in its config: taking family run %r's "
        "schedule, stretched to step %d",
        run,
        like.name,
        fin,
    )
    return params, fin, like.lr_steps * (fin / max(like.last_step, 1)), like.lr_share


def forecast_family(
    store: Store,
    run: str,
    metric: str,
    family: Sequence[str],
    *,
    upto: int | None = None,
    final_step: int | None = None,
    target: float | None = None,
    eta_seconds: float | None = None,
    config: Mapping[str, Any] | None = None,
) -> Forecast:
    """``run``'s forecast of ``metric`` from ``family``, updated by its points to ``upto``
    (all of them when None; none when ``upto`` is 0: the forecast before it starts).
    ``config``: the target's, when it is not stored yet (a live run being started)."""
    members = family_members(store, check_family(family, run), metric)
    fit = fit_family(members)
    params, fin, lr_steps, share = target_plan(store, run, members, final_step, upto, config)
    steps = values = None
    started = _exists(store, run)
    series = store.read_series(run, metric) if started else None
    if series is not None and not series.empty and (upto is None or upto > 0):
        steps, values = series["step"].to_numpy(float), series["value"].to_numpy(float)
    return family_forecast(
        fit,
        params,
        lr_steps,
        share,
        fin,
        steps=steps,
        values=values,
        upto=upto,
        target=target,
        eta_seconds=eta_seconds,
    )


def family_references(
    store: Store,
    family: Sequence[str],
    run: str,
    config: Mapping[str, Any],
    roles: Mapping[str, str] | None = None,
) -> dict[str, ReferenceCurve]:
    """Family mode for a live run being started with ``config``: the family curve of each
    loss metric (by ``roles``) of the first family run, as ``runwatch.init(family=...)``
    and the server's run start use it; a ``ValueError`` naming what is wrong."""
    names = check_family(family, run)
    store.run_id(names[0])  # a clear error for an unknown run
    losses = [m for m in store.series(names[0])["metric"].unique() if role_of(m, roles) == "loss"]
    if not losses:
        raise ValueError(f"family run {names[0]!r} has no loss metric")
    return family_curves(store, names, run, losses, config=config)


def family_curves(
    store: Store,
    family: Sequence[str],
    run: str,
    metrics: Sequence[str],
    final_step: int | None = None,
    config: Mapping[str, Any] | None = None,
) -> dict[str, ReferenceCurve]:
    """Family mode for the expected-curve detector: each loss metric's family curve for
    ``run`` before it starts, with the family's band as the curve's own margin. What
    ``Monitor(references=...)`` takes for ``analyze --family`` and ``init(family=...)``;
    metrics the family lacks or logs too rarely are left out (an error, naming why, when
    none is left)."""
    curves, missed = {}, []
    for metric in metrics:
        try:
            fc = forecast_family(
                store, run, metric, family, upto=0, final_step=final_step, config=config
            )
        except (MissingMetricError, TooLittleData) as exc:
            # A metric the family lacks, or logs too rarely to fit (HF's one-point
            # ``train_loss``), is left to the run's own fit; the others are judged.
            log.info("no family curve for %s: %s", metric, exc)
            missed.append(f"{metric}: {exc}")
            continue
        steps = np.unique(np.geomspace(1, fc.final_step, CURVE_POINTS).round())
        mean, _, upper = fc.curve(steps)
        # Judged from where the family's laws were fitted on (its runs' later steps), with
        # the band's widest upper end over those steps.
        first = FIT_FROM * fc.final_step
        judged = steps >= first
        band = float(np.max(upper[judged] / mean[judged] - 1.0))
        curves[metric] = ReferenceCurve(steps, mean, offset=False, rel_band=band, first_step=first)
    if not curves:
        why = "; ".join(missed) or "it has none"
        raise ValueError(f"no family curve for any of run {run!r}'s loss metrics ({why})")
    return curves


def scaling_view(
    store: Store, run: str, metric: str, family: Sequence[str], points: int = 50
) -> dict[str, Any]:
    """What the Compare page's scaling view draws: each family run's final ``metric`` by
    params, the family law's final value over params for ``run``'s planned LR (with its
    band), and ``run``'s own forecast (with what it has logged so far).

    Keys: ``runs`` (name, params, final), ``law`` (params, expected, lower, upper) and
    ``forecast`` (params, predicted, lower, upper, upto).
    """
    members = family_members(store, check_family(family, run), metric)
    fit = fit_family(members)
    params, fin, lr_steps, share = target_plan(store, run, members, None)
    lo = min(min(m.params for m in members), params) / 1.5
    hi = max(max(m.params for m in members), params) * 1.5
    grid = np.geomspace(lo, hi, points)
    means = fit.final_by_size(grid, lr_steps, share, fin)
    # The band reaches what each size law the family cannot rule out expects, too.
    finals = [means] + [
        fit.final_by_size(grid, lr_steps, share, fin, law) for law in fit.mixed_laws
    ]
    low, high = np.min(finals, axis=0), np.max(finals, axis=0)
    law = []
    far = fit.beyond_half(lr_steps, share, fin)
    for p, mean, bottom, top in zip(grid, means, low, high, strict=True):
        half = math.hypot(fit.half_width(p), far)
        law.append((float(p), float(mean), bottom * math.exp(-half), top * math.exp(half)))
    fc = forecast_family(store, run, metric, family, final_step=fin)
    return {
        "runs": [(m.name, m.params, final_value(m)) for m in members],
        "law": law,
        "forecast": {
            "params": params,
            "predicted": fc.predicted,
            "lower": fc.lower,
            "upper": fc.upper,
            "upto": fc.upto,
        },
    }
