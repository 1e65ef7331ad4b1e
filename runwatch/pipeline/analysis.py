"""Analysis of a stored run: replaying the Monitor over it, and forecasting a metric.

This is what ``runwatch analyze`` and ``runwatch forecast`` do, kept out of the command line
so the dashboard and the demo call the same code. A replay replaces the run's earlier replay
results in the store (so the dashboard shows the latest), and every forecast stores the
expected curve it fitted, sampled for drawing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from runwatch.detect.fleet.jobwide import merge_job_wide
from runwatch.detect.monitor import Monitor
from runwatch.detect.replay import replay, replay_input
from runwatch.detect.roles import role_of
from runwatch.expect.eta import FailureAwareEta
from runwatch.expect.forecast import Forecast, eta_seconds, forecast
from runwatch.expect.reference import ReferenceCurve
from runwatch.model import LR_METRICS, Anomaly
from runwatch.pipeline.family import family_curves, forecast_family, total_steps_of
from runwatch.pipeline.fleet import run_fleet_anomalies
from runwatch.pipeline.incidents import refresh_incidents
from runwatch.pipeline.reads import read_metric
from runwatch.pipeline.runconfig import aligned_sample, run_config, tokens_per_step
from runwatch.store import Store

log = logging.getLogger("runwatch.pipeline.analysis")

CURVE_SAMPLES = 400
"""Points of a stored expected curve: enough to draw it smoothly on a log or linear axis."""


@dataclass
class Analysis:
    """A replay's result: the anomaly episodes and the run-level health figures."""

    run: str
    anomalies: list[Anomaly]
    health: dict[str, Any]


def analyze_run(
    store: Store,
    run: str,
    config: Mapping[str, Any] | None = None,
    *,
    save: bool = True,
    reference: str | None = None,
    align: str = "step",
    family: list[str] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> Analysis:
    """Replay the default detectors over the run's stored points and events.

    ``reference``: reference mode, each loss metric that run has too is judged against
    its curve there (aligned by ``align``, not shifted: a lasting difference from the
    known-good run is what is reported), and the stored expected curve is that curve.
    ``family``: family mode, each loss metric is judged against what those earlier runs of
    the recipe predict for this run before it starts (``runwatch.pipeline.family``).
    ``progress(phase, points done, points in all)`` follows a long replay (a progress bar).
    """
    tell = progress or (lambda phase, done, total: None)
    points = store.read_points(run)
    n = len(points)
    tell("replaying", 0, n)
    events = store.events(run)
    monitor = Monitor(config)
    losses = _loss_metrics(points, monitor.config)
    if reference is not None and family:
        raise ValueError("give --reference or --family, not both")
    if reference is not None:
        monitor.references = reference_curves(store, reference, run, monitor.config, losses, align)
    elif family:
        monitor.references = family_curves(store, family, run, losses)
    replayed = lambda done: tell("replaying", done, n)  # noqa: E731
    # The replay's arrays are all it needs of the frame: freeing the frame first keeps
    # one copy of the run's points in memory, not two, while the detectors work.
    arrays = replay_input(points)
    del points
    anomalies = replay(arrays, events, monitor=monitor, progress=replayed)
    del arrays
    tell("cross-rank checks", n, n)
    # Cross-rank detectors (stragglers, hangs, hardware) see every attempt: the ranks that
    # were behind when a hang struck are in the attempt its restart superseded. Only the
    # series they use are read again.
    anomalies += run_fleet_anomalies(store, run, events, monitor.config)
    # One slowdown of the whole job is one finding with its ranks listed, not one per rank.
    ranks = store.series(run)["rank"].dropna().nunique()
    anomalies = merge_job_wide(anomalies, ranks=int(ranks) or None)
    if save:
        tell("storing", n, n)
        store.save_anomalies(store.run_id(run), "replay", anomalies, replace=True)
        refresh_incidents(store, run, "replay", monitor.config)
        for metric in losses:
            try:
                # The curve the replay judged by, not a second read of the reference run;
                # in family mode the family's forecast, updated by the run's points.
                if family:
                    forecast_run(store, run, metric, family=family)
                else:
                    forecast_run(store, run, metric, reference=monitor.references.get(metric))
            except ValueError as exc:
                log.info("no expected curve for %s/%s: %s", run, metric, exc)
    return Analysis(run, anomalies, monitor.health)


def _loss_metrics(points: pd.DataFrame, roles: Mapping[str, str]) -> list[str]:
    return [m for m in points["metric"].unique() if role_of(m, roles) == "loss"]


def default_loss_metric(store: Store, run: str) -> str:
    """The metric to forecast when none is named: ``loss``, else ``train_loss``, else the
    first (by name) metric whose role is loss, as most runs log one training loss."""
    known = sorted(store.series(run)["metric"].unique())
    losses = [m for m in known if role_of(m) == "loss"]
    for name in ("loss", "train_loss"):
        if name in losses:
            return name
    if not losses:
        raise ValueError(
            f"run {run!r} has no loss metric to forecast; name one with --metric "
            f"(it has: {', '.join(known) or 'no metrics'})"
        )
    return losses[0]


def planned_final_step(store: Store, run: str) -> int | None:
    """The run's planned last step, read from its config (total_steps, max_steps, ...)."""
    runs = store.runs()
    row = runs[runs["name"] == run]
    return None if row.empty else total_steps_of(run_config(row.iloc[0]["config"]))


def forecast_run(
    store: Store,
    run: str,
    metric: str,
    *,
    upto: int | None = None,
    final_step: int | None = None,
    target: float | None = None,
    reference: str | ReferenceCurve | None = None,
    align: str = "step",
    family: list[str] | None = None,
    save: bool = True,
) -> Forecast:
    """Fit the expected curve of ``metric`` on steps <= ``upto`` and forecast ``final_step``.

    ``final_step`` defaults to the run's planned steps (from its config), else its last
    step. The LR-aware law is used when the run logged ``lr`` (or ``learning_rate``).
    ``reference``: the expected curve is that earlier run's ``metric`` instead (aligned by
    ``align``, see :func:`reference_curve`), or a curve already read from it.
    ``target``: also the step at which the expected curve reaches that value
    (``Forecast.target_step``). ``family``: the forecast of the recipe's earlier runs
    (``runwatch.pipeline.family.forecast_family``), from step 0 when ``upto`` is 0.
    """
    series = store.read_series(run, metric)
    if family:
        if reference is not None:
            raise ValueError("give --reference or --family, not both")
        result = forecast_family(
            store, run, metric, family, upto=upto, final_step=final_step, target=target
        )
        steps, times = series["step"].to_numpy(), series["time"].to_numpy()
        eta = eta_seconds(times, steps, result.upto, result.final_step)
        result = dataclasses.replace(result, eta_seconds=eta)
        if save:
            _save_curve(store, run, metric, result, series, family)
        return result
    if series.empty:
        series = read_metric(store, run, metric)  # raises, naming what the run has
    if final_step is None:
        final_step = planned_final_step(store, run) or int(series["step"].max())
    lr = _learning_rate(store, run)
    ref = (
        reference_curve(store, reference, metric, run, align)
        if isinstance(reference, str)
        else reference
    )
    result = forecast(
        series["step"].to_numpy(),
        series["value"].to_numpy(),
        times=series["time"].to_numpy(),
        lr_steps=None if lr is None else lr["step"].to_numpy(),
        lr_values=None if lr is None else lr["value"].to_numpy(),
        upto=upto,
        final_step=final_step,
        target=target,
        reference=ref,
    )
    if save:
        _save_curve(store, run, metric, result, series)
    return result


def curve_frame(result: Forecast, first: int, last: int) -> pd.DataFrame:
    """The forecast's expected curve and band sampled for drawing, steps first..last."""
    first = max(first, 1)
    steps = np.unique(np.geomspace(first, max(last, first + 1), CURVE_SAMPLES).round())
    mean, lower, upper = result.curve(steps)
    return pd.DataFrame({"step": steps, "expected": mean, "lower": lower, "upper": upper})


def _save_curve(
    store: Store,
    run: str,
    metric: str,
    result: Forecast,
    series: pd.DataFrame,
    family: list[str] | None = None,
) -> None:
    """Store the expected curve (a family's from step 1: it is known before the run)."""
    first = 1 if result.model == "family" else int(series["step"].min())
    last = max(result.final_step, int(series["step"].max()) if len(series) else 0)
    store.save_expected_curve(
        store.run_id(run),
        metric,
        result.model,
        result.upto,
        result.final_step,
        curve_frame(result, first, last),
        family,
    )


ALIGNMENTS = ("step", "tokens")


def reference_curve(
    store: Store, reference: str, metric: str, run: str, align: str = "step"
) -> ReferenceCurve:
    """``reference``'s ``metric`` as an expected curve for ``run``, in ``run``'s steps.

    ``align="tokens"`` rescales the reference's steps by the two runs' tokens per step
    (config ``tokens_per_step``/``batch_tokens``, else the median of tokens_per_s x
    step_time_s), for a run with another batch size; "step" takes steps as they are.
    The curve is shifted by the median offset over the steps ``run`` has (same shape,
    maybe another level: ``ReferenceCurve``).
    """
    if align not in ALIGNMENTS:
        raise ValueError(f"unknown alignment {align!r}; valid: {', '.join(ALIGNMENTS)}")
    if reference == run:
        raise ValueError(f"the reference must be another run than {run!r}")
    store.run_id(reference)  # a clear error for an unknown run
    series = read_metric(store, reference, metric, "reference run")
    steps = series["step"].to_numpy(dtype=float)
    if align == "tokens":
        steps = steps * _tokens_per_step(store, reference) / _tokens_per_step(store, run)
    return ReferenceCurve(steps, series["value"].to_numpy(dtype=float))


def reference_curves(
    store: Store,
    reference: str,
    run: str,
    roles: Mapping[str, str] | None = None,
    metrics: list[str] | None = None,
    align: str = "step",
) -> dict[str, ReferenceCurve]:
    """Reference mode for a whole run: ``reference``'s curve of each of its loss metrics
    (by ``roles``), or of those of ``metrics`` it has; an error if there is none. What
    ``Monitor(references=...)`` takes, for ``analyze --reference`` and for
    ``runwatch.init(reference=...)``."""
    if reference == run:
        raise ValueError(f"the reference must be another run than {run!r}")
    store.run_id(reference)  # a clear error for an unknown run
    theirs = [m for m in store.series(reference)["metric"].unique() if role_of(m, roles) == "loss"]
    wanted = theirs if metrics is None else [m for m in metrics if m in theirs]
    if not wanted:
        raise ValueError(f"reference run {reference!r} has no loss metric of run {run!r}")
    return {m: reference_curve(store, reference, m, run, align) for m in wanted}


def _tokens_per_step(store: Store, run: str) -> float:
    runs = store.runs()
    row = runs[runs["name"] == run]
    config = run_config(row.iloc[0]["config"] if not row.empty else None)
    # The dashboard's own sample: steps one of the two lacks give NaN products, which
    # tokens_per_step leaves out.
    frames = {name: store.read_series(run, name) for name in ("tokens_per_s", "step_time_s")}
    tps = tokens_per_step(config, aligned_sample(frames))
    if tps is None:
        raise ValueError(
            f"cannot align run {run!r} by tokens: its config has no tokens_per_step "
            "(or batch_tokens) and it logs no tokens_per_s with step_time_s"
        )
    return tps


def _learning_rate(store: Store, run: str) -> pd.DataFrame | None:
    for name in LR_METRICS:
        frame = store.read_series(run, name)
        if not frame.empty:
            return frame
    return None


def forecast_json(
    run: str,
    metric: str,
    result: Forecast,
    *,
    target: float | None = None,
    reference: str | None = None,
    align: str = "step",
    family: list[str] | None = None,
    eta: FailureAwareEta | None = None,
) -> dict[str, Any]:
    """The ``runwatch forecast --format json`` object (docs/architecture.md): a public contract.

    The DESIGN keys always; ``target``/``target_step`` only with a target,
    ``reference``/``align`` only with a reference run, ``family`` and ``curve`` only with
    a family (and ``size_law``/``size_laws_alike``/``size_law_weights`` when it has
    several sizes), and with
    ``eta`` (a failure-aware ETA) ``eta_seconds`` is that one, with
    ``eta_lower``/``eta_upper``/``goodput`` beside it (extensions, so a script written for
    the original object sees exactly it).
    """
    extra: dict[str, Any] = {}
    if target is not None:
        extra |= {"target": target, "target_step": result.target_step}
    if reference is not None:
        extra |= {"reference": reference, "align": align}
    eta_fields: dict[str, Any] = {"eta_seconds": result.eta_seconds}
    if eta is not None:  # with failures and restarts still to come (runwatch.pipeline.eta)
        eta_fields = eta.as_json()
    if family:
        frame = curve_frame(result, 1, result.final_step)
        extra |= {"family": list(family), "curve": frame.to_dict(orient="list")}
        if result.size_laws:
            weights = result.size_law_weights or (1.0,)
            extra |= {
                "size_law": result.size_laws[0],
                "size_laws_alike": list(result.size_laws[1:]),
                "size_law_weights": dict(zip(result.size_laws, weights, strict=True)),
            }
    return {
        "run": run,
        "metric": metric,
        "upto": result.upto,
        "final_step": result.final_step,
        "predicted": result.predicted,
        "lower": result.lower,
        "upper": result.upper,
        "model": result.model,
        **eta_fields,
        **extra,
    }
