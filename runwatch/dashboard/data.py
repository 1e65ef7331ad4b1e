"""Every read the dashboard makes, cached: one module, so pages never touch SQL or the Store.

Readers take plain hashable arguments (the store path, the run name, a step window) and
return small frames: series come back already downsampled to at most ``MAX_POINTS`` per
trace (min/max per bucket, so no spike or NaN is lost), because the browser, not the store,
is the bottleneck for a million-step run. The TTLs are short (``LIVE_TTL``) so a live run's
panels move on every fragment tick without each tick re-reading a quiet run from disk.

The store is opened read-only once per path (``st.cache_resource``) and shared by every
session; WAL mode lets it read while a training process writes. Verdicts are the one write,
through a short-lived writable store.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from runwatch.dashboard import shaping
from runwatch.dashboard.charts_fleet import straggler_table
from runwatch.detect.fleet.monitor import fleet_anomalies
from runwatch.expect.forecast import FIT_FROM, eta_seconds, forecast
from runwatch.model import LR_METRICS
from runwatch.pipeline.analysis import planned_final_step
from runwatch.pipeline.eta import eta_report
from runwatch.pipeline.family import scaling_view
from runwatch.pipeline.fleet import fleet_report
from runwatch.store import Store, open_store

log = logging.getLogger("runwatch.dashboard")

MAX_POINTS = 4000
"""Points per trace on screen: dense enough to look continuous on a 4K monitor."""
LIVE_TTL = 2.0
FORECAST_TTL = 15.0
FORECAST_POINTS = MAX_POINTS
"""The fit reads what the loss panel draws (one cached read serves both)."""
CURVE_SAMPLES = 300
FLEET_TTL = 5.0
"""The Fleet page replays its detectors on each read: a longer TTL than the live panels."""


@st.cache_resource(show_spinner=False)
def reader(db: str) -> Store:
    """The shared read-only store for ``db`` (errors are not cached: a fixed store opens)."""
    log.info("opening %s read-only", db)
    return open_store(db, readonly=True)


@st.cache_data(ttl=LIVE_TTL, show_spinner=False)
def runs(db: str) -> pd.DataFrame:
    return reader(db).runs()


@st.cache_data(ttl=LIVE_TTL, show_spinner=False)
def metrics(db: str, run: str) -> list[str]:
    return sorted(reader(db).series(run)["metric"].unique().tolist())


@st.cache_data(ttl=LIVE_TTL, show_spinner=False)
def watched(db: str, run: str) -> pd.DataFrame:
    """Each series of the run with its role and the detectors watching it (no step span:
    that would read every point)."""
    from runwatch.pipeline.watched import as_frame, watched_series

    return as_frame(watched_series(reader(db), run, spans=False))


@st.cache_data(ttl=LIVE_TTL, show_spinner=False)
def attempts(db: str, run: str) -> pd.DataFrame:
    return reader(db).attempts(run)


@st.cache_data(ttl=LIVE_TTL, show_spinner=False)
def events(db: str, run: str) -> pd.DataFrame:
    return reader(db).events(run)


@st.cache_data(ttl=LIVE_TTL, show_spinner=False)
def anomalies(db: str, run: str | None = None) -> pd.DataFrame:
    """Anomalies (live ones, or replayed where a run has none live) with a triage state."""
    frame = shaping.pick_source(reader(db).anomalies(run))
    return frame.assign(state=frame["verdict"].map(shaping.triage_state))


@st.cache_data(ttl=LIVE_TTL, show_spinner=False)
def verdicts(db: str, anomaly_id: int) -> pd.DataFrame:
    return reader(db).verdicts(anomaly_id)


@st.cache_data(ttl=LIVE_TTL, show_spinner=False, max_entries=512)
def downsampled(
    db: str, run: str, metric: str, start: int | None, end: int | None, max_points: int
) -> pd.DataFrame:
    """The live points of a window, min/max-downsampled: one read shared by the panels and
    the forecast (the loss and LR panels read exactly what the fit reads)."""
    return reader(db).read_series(run, metric, start=start, end=end, max_points=max_points)


@st.cache_data(ttl=LIVE_TTL, show_spinner=False, max_entries=512)
def series_view(
    db: str,
    run: str,
    metric: str,
    start: int | None = None,
    end: int | None = None,
    smoothing: float = 0.0,
    max_points: int = MAX_POINTS,
) -> pd.DataFrame:
    """step, time, value, attempt, superseded, smooth: at most ``max_points`` rows.

    The live points come downsampled from the store (min, max and first NaN per bucket,
    from block summaries when the window is large), so a million-step panel reads a few
    tens of thousands of points, not a million. Smoothing is TensorBoard's EMA; on a
    downsampled window it runs over the kept points with the weight raised to the number
    of steps each one stands for, so the line looks as smooth as the full-resolution EMA
    would. The redone steps of earlier attempts get a quarter of the budget; they are drawn
    faded for context.
    """
    store = reader(db)
    live = downsampled(db, run, metric, start, end, max_points).assign(superseded=False)
    span = float(live["step"].iloc[-1] - live["step"].iloc[0]) if len(live) > 1 else 0.0
    per_point = max(1.0, span / max(len(live) - 1, 1))
    weight = smoothing**per_point if smoothing > 0 else 0.0
    live = live.assign(smooth=shaping.ema(live["value"].to_numpy(), weight))
    old = store.read_redone(run, metric, start=start, end=end, max_points=max(3, max_points // 4))
    if len(old):
        live = pd.concat([live, old.assign(smooth=old["value"])], ignore_index=True)
    return live.reset_index(drop=True)


@st.cache_data(ttl=LIVE_TTL, show_spinner=False)
def latest_values(db: str, run: str, metrics_: tuple[str, ...], lookback: int = 500) -> dict:
    """Each metric's last finite value and its step (reads only the last ``lookback`` steps)."""
    store = reader(db)
    out: dict[str, tuple[int, float]] = {}
    last = runs(db).set_index("name").get("last_step", pd.Series(dtype=float)).get(run)
    start = None if last is None or pd.isna(last) else max(0, int(last) - lookback)
    for metric in metrics_:
        frame = store.read_series(run, metric, start=start)
        frame = frame[np.isfinite(frame["value"])]
        if len(frame):
            out[metric] = (int(frame["step"].iloc[-1]), float(frame["value"].iloc[-1]))
    return out


@st.cache_data(ttl=FORECAST_TTL, show_spinner=False)
def loss_forecast(db: str, run: str, metric: str) -> dict[str, Any] | None:
    """The expected curve fitted on the run so far, its band, and the final value and ETA.

    Fitted on the min/max-downsampled series (``FORECAST_POINTS``), not every point: the fit
    bins points anyway, so its cost does not grow with the run's length.
    None when there is too little data to fit.
    """
    store = reader(db)
    series = downsampled(db, run, metric, None, None, FORECAST_POINTS)
    if series.empty:
        return None
    stored = _stored_forecast(store, run, metric, series)
    if stored is not None:
        return stored
    lr = None
    for name in LR_METRICS:
        lr = downsampled(db, run, name, None, None, FORECAST_POINTS)
        if len(lr):
            break
    last = int(series["step"].max())
    final = planned_final_step(store, run) or last
    try:
        fc = forecast(
            series["step"].to_numpy(),
            series["value"].to_numpy(),
            times=series["time"].to_numpy(),
            lr_steps=None if lr is None or lr.empty else lr["step"].to_numpy(),
            lr_values=None if lr is None or lr.empty else lr["value"].to_numpy(),
            final_step=final,
        )
    except ValueError as exc:
        log.info("no forecast for %s/%s: %s", run, metric, exc)
        return None
    first = max(int(series["step"].min()), 1)
    steps = np.unique(np.geomspace(first, max(fc.final_step, last, first + 1), CURVE_SAMPLES))
    mean, lower, upper = fc.curve(steps.round())
    curve = pd.DataFrame({"step": steps.round(), "expected": mean, "lower": lower, "upper": upper})
    now_mean, now_lower, now_upper = fc.curve(np.array([float(last)]))
    return {
        "model": fc.model,
        "lr_note": fc.lr_note(),
        "predicted": fc.predicted,
        "lower": fc.lower,
        "upper": fc.upper,
        "eta_seconds": fc.eta_seconds,
        "final_step": fc.final_step,
        "last_step": last,
        "fit_from": int(FIT_FROM * last),
        "expected_now": float(now_mean[0]),
        "band_now": (float(now_lower[0]), float(now_upper[0])),
        "curve": curve,
    }


def _stored_forecast(
    store: Store, run: str, metric: str, series: pd.DataFrame
) -> dict[str, Any] | None:
    """The forecast from the expected curve ``runwatch analyze`` stored, when it was fitted
    on every step the run has now (None otherwise: the page then fits its own).

    Its final value and band are the curve's at the final step; the ETA comes from the
    pace of the run's latest steps.
    """
    meta, curve = store.expected_curve(run, metric)
    last = int(series["step"].max())
    if curve.empty or meta.get("upto") is None or int(meta["upto"]) < last:
        return None
    curve = curve.sort_values("step").reset_index(drop=True)
    steps = curve["step"].to_numpy(dtype=float)
    final = int(meta["final_step"])

    def at(step: float) -> tuple[float, float, float]:
        return tuple(  # type: ignore[return-value]
            float(np.interp(step, steps, curve[c].to_numpy(dtype=float)))
            for c in ("expected", "lower", "upper")
        )

    predicted, lower, upper = at(final)
    now_mean, now_lower, now_upper = at(last)
    return {
        "model": meta["model"],
        "predicted": predicted,
        "lower": lower,
        "upper": upper,
        "eta_seconds": eta_seconds(
            series["time"].to_numpy(), series["step"].to_numpy(), last, final
        ),
        "final_step": final,
        "last_step": last,
        "fit_from": int(FIT_FROM * last),
        "expected_now": now_mean,
        "band_now": (now_lower, now_upper),
        "curve": curve[["step", "expected", "lower", "upper"]],
    }


@st.cache_data(ttl=FORECAST_TTL, show_spinner=False)
def failure_eta(db: str, run: str, final_step: int) -> dict[str, Any] | None:
    """The ETA to ``final_step`` with the failures still to come, its 90% band and the
    goodput so far (``runwatch.pipeline.eta``); None without timed points."""
    eta = eta_report(reader(db), run, final_step=final_step)
    if eta is None:
        return None
    return {
        **eta.as_json(),
        "failures": eta.failures,
        "failure_rate_per_h": eta.failure_rate_per_h,
        "expected_failures": eta.expected_failures,
        "cost_per_failure_s": eta.cost_per_failure_s,
    }


@st.cache_data(ttl=FORECAST_TTL, show_spinner=False)
def family_curve(db: str, run: str, metric: str) -> dict[str, Any] | None:
    """The family curve stored for ``run``'s ``metric`` (``forecast``/``analyze --family``):
    family (the runs' names), upto, final_step and curve (step, expected, lower, upper,
    from step 1); None when the stored curve is another model's, or none is stored."""
    meta, curve = reader(db).expected_curve(run, metric)
    if curve.empty or meta.get("model") != "family":
        return None
    return {
        "family": list(meta.get("family") or []),
        "upto": meta.get("upto"),
        "final_step": meta.get("final_step"),
        "curve": curve.sort_values("step").reset_index(drop=True),
    }


@st.cache_data(ttl=FORECAST_TTL, show_spinner=False)
def family_scaling(db: str, run: str, metric: str, family: tuple[str, ...]) -> dict[str, Any]:
    """The Compare page's scaling view of ``run`` against ``family``
    (``runwatch.pipeline.family.scaling_view``): runs, law and forecast. A ValueError,
    not cached, says why the family cannot be fitted."""
    return scaling_view(reader(db), run, metric, list(family))


def save_verdict(db: str, anomaly_id: int, verdict: str, note: str, author: str | None) -> int:
    """Store a person's verdict, then drop cached anomaly reads so every page shows it."""
    with open_store(db) as store:
        vid = store.add_verdict(verdict, anomaly_id=anomaly_id, note=note, author=author)
    log.info("verdict %s on anomaly %d by %s", verdict, anomaly_id, author)
    anomalies.clear()
    verdicts.clear()
    return vid


@st.cache_data(ttl=LIVE_TTL, show_spinner=False)
def incidents(db: str, run: str | None = None) -> pd.DataFrame:
    """Incidents (per run the live ones, else the replayed ones), one row each, with their
    status and latest verdict (``Store.incidents``)."""
    return reader(db).incidents(run)


@st.cache_data(ttl=LIVE_TTL, show_spinner=False, max_entries=512)
def incident_members(db: str, incident_id: int) -> pd.DataFrame:
    """An incident's anomalies and events, in step order (``Store.incident_members``)."""
    return reader(db).incident_members(incident_id)


@st.cache_data(ttl=LIVE_TTL, show_spinner=False)
def incident_membership(db: str, run: str) -> pd.DataFrame:
    """Every member of the run's incidents with its incident: incident_id, kind, member_id,
    step, what, message (one read per incident; a run has a handful, not hundreds)."""
    store = reader(db)
    columns = ["incident_id", "kind", "member_id", "step", "what", "message"]
    parts = [
        store.incident_members(int(iid)).assign(incident_id=int(iid))[columns]
        for iid in store.incidents(run)["id"]
    ]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


@st.cache_data(ttl=LIVE_TTL, show_spinner=False)
def incident_verdicts(db: str, incident_id: int) -> pd.DataFrame:
    """Every verdict given to an incident, oldest first."""
    every = reader(db).verdicts()
    return every[every["incident_id"] == incident_id].reset_index(drop=True)


def save_incident_verdict(
    db: str, incident_id: int, verdict: str, note: str, author: str | None
) -> int:
    """Store a verdict on an incident (it becomes the incident's status), through a store
    opened read-write for this one write; then drop the cached reads that show it."""
    with open_store(db) as store:
        vid = store.add_verdict(verdict, incident_id=incident_id, note=note, author=author)
    log.info("verdict %s on incident %d by %s", verdict, incident_id, author)
    for cached in (incidents, incident_members, incident_membership, incident_verdicts):
        cached.clear()
    return vid


@st.cache_data(ttl=FLEET_TTL, show_spinner=False)
def per_rank_metrics(db: str, run: str) -> list[str]:
    """Metrics logged by more than one rank: the ones a heatmap can compare."""
    series = reader(db).series(run)
    multi = series.dropna(subset=["rank"]).groupby("metric")["rank"].nunique()
    return sorted(multi[multi > 1].index.tolist())


@st.cache_data(ttl=FLEET_TTL, show_spinner=False)
def rank_points(db: str, run: str, metric: str) -> pd.DataFrame:
    pts = reader(db).read_points(run, [metric])
    return pts.dropna(subset=["rank"])[["step", "rank", "host", "gpu", "value", "time"]]


@st.cache_data(ttl=FLEET_TTL, show_spinner=False)
def fleet_episodes(db: str, run: str, metrics: tuple[str, ...]) -> pd.DataFrame:
    store = reader(db)
    pts = store.read_points(run, list(metrics)) if metrics else store.read_points(run)
    return straggler_table(fleet_anomalies(pts, store.events(run)))


@st.cache_data(ttl=FLEET_TTL, show_spinner=False)
def failures(db: str, run: str) -> dict | None:
    store = reader(db)
    try:
        report = fleet_report(store, run)
    except ValueError:
        return None
    figures = report.to_dict()
    figures["start_time"] = float(store.attempts(run)["start_time"].min())
    return figures


def now() -> float:
    return time.time()
