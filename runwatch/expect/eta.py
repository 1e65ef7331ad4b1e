"""A wall-clock ETA that counts the failures still to come, with a 90% band, and goodput.

At scale a crash and its restart are a steady cost: the downtime until the next attempt
logs again, and the steps redone since the last checkpoint. From a run's attempts (time and
step spans), its failure times and its recent pace, :func:`failure_aware_eta` takes

- the **failure rate** per hour of running, old failures faded by an exponential weight
  with a half-life (``HALF_LIFE_SHARE`` of the running time so far: root causes get fixed);
- the **cost of a failure**: mean downtime + mean redone steps x pace;
- the **failures to come** in the remaining running time, Poisson at that rate, with the
  rate's own uncertainty (a flat prior: the count's predictive law is negative binomial).
  With no failure seen in T hours the rate's 95% bound is 3/T (the "rule of three"), so the
  band still allows for failures and ``eta_upper > eta_lower``;
- **goodput**: time spent on steps the final curve keeps / wall time since the start.

Pure: numpy only, no store. bench/README-eta.md has the reasoning and the measured errors.

>>> spans = AttemptSpans([0.0, 1300.0], [1000.0, 2300.0], [0, 90], [100, 190])
>>> e = failure_aware_eta(spans, pace=10.0, remaining_steps=100)
>>> e.failures, round(e.goodput, 3), e.eta_lower <= e.eta_seconds < e.eta_upper
(1, 0.822, True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

HALF_LIFE_SHARE = 0.5
"""The failure weight's half-life as a share of the running time so far: failures of the
first half of a run count half as much as the latest ones."""

LEVEL = 0.90
Z90 = 1.645
DEFAULT_DOWNTIME_S = 600.0
"""The downtime assumed for a failure before any was seen (requeue, start, load a
checkpoint): only the band's upper edge uses it, as the rate is 0 until then."""
MAX_REDO_SHARE = 0.5
"""The remaining running time grows by the redone steps of the failures in it; the growth
is capped at this share (a run that redoes more than it does has no ETA worth the name)."""


@dataclass(frozen=True)
class AttemptSpans:
    """Per attempt (in order): the time and step of its first and last point."""

    start_time: Sequence[float]
    end_time: Sequence[float]
    start_step: Sequence[float]
    end_step: Sequence[float]

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        out = tuple(
            np.asarray(a, dtype=float)
            for a in (self.start_time, self.end_time, self.start_step, self.end_step)
        )
        if len({a.shape for a in out}) != 1 or out[0].ndim != 1 or out[0].size == 0:
            raise ValueError("attempt spans: four 1-d arrays of one non-zero length")
        return out  # type: ignore[return-value]


@dataclass(frozen=True)
class FailureAwareEta:
    """Remaining wall time with its 90% band (s), goodput so far, failures so far."""

    eta_seconds: float
    eta_lower: float
    eta_upper: float
    goodput: float | None
    failures: int
    failure_rate_per_h: float = 0.0
    """Faded failures per hour of running."""
    expected_failures: float = 0.0
    """Failures expected in the remaining time."""
    cost_per_failure_s: float = 0.0
    """Mean downtime + mean redone steps x pace."""

    def as_json(self) -> dict[str, float | None]:
        return {
            "eta_seconds": self.eta_seconds,
            "eta_lower": self.eta_lower,
            "eta_upper": self.eta_upper,
            "goodput": self.goodput,
        }


def failure_aware_eta(
    attempts: AttemptSpans,
    failure_times: Sequence[float] | None = None,
    *,
    pace: float,
    remaining_steps: float,
    now: float | None = None,
    start_time: float | None = None,
    checkpoint_every: float | None = None,
    half_life_s: float | None = None,
    pace_spread: float = 0.0,
    default_downtime_s: float = DEFAULT_DOWNTIME_S,
) -> FailureAwareEta:
    """The remaining wall time to do ``remaining_steps`` at ``pace`` s/step, failures
    included (module doc).

    ``failure_times`` (wall s) default to each attempt's end but the last. An attempt's
    downtime is from its last point to the next one's first; its redone steps are those
    from the next attempt's first step on (that step included). ``checkpoint_every`` (steps)
    is a prior for the redone steps: half an interval, weighted as one failure.
    ``pace_spread`` is the pace's relative sd (the band widens by it). ``now`` defaults to
    the last point, ``start_time`` to the first.
    """
    if not pace > 0 or not math.isfinite(pace):
        raise ValueError(f"pace must be a positive number of seconds per step, got {pace}")
    t0, t1, s0, s1 = attempts.arrays()
    now = float(t1[-1]) if now is None else float(now)
    start = float(t0[0]) if start_time is None else float(start_time)
    fails = t1[:-1] if failure_times is None else np.asarray(failure_times, dtype=float)
    run_s = np.maximum(t1 - t0, 0.0)
    uptime = float(run_s.sum())

    # Cost of a failure, from every attempt boundary (a restart).
    downtime = np.maximum(t0[1:] - t1[:-1], 0.0)
    redone = np.maximum(s1[:-1] - s0[1:] + 1.0, 0.0)
    prior_n = 1.0 if checkpoint_every else 0.0
    prior_redo = checkpoint_every / 2.0 if checkpoint_every else 0.0
    redo_mean = (
        (float(redone.sum()) + prior_n * prior_redo) / (redone.size + prior_n)
        if redone.size + prior_n
        else 0.0
    )
    if downtime.size:
        down_mean, down_sd = float(downtime.mean()), float(downtime.std())
    else:
        down_mean, down_sd = float(default_downtime_s), 0.0
    cost_sd = math.hypot(down_sd, float(redone.std()) * pace if redone.size else 0.0)
    cost = down_mean + redo_mean * pace

    # Faded rate per second of running; the half-life is on the running clock too.
    half = HALF_LIFE_SHARE * uptime if half_life_s is None else float(half_life_s)
    ages = uptime - _running_clock(fails, t0, t1)
    if half > 0 and math.isfinite(half) and uptime > 0:
        weights = 0.5 ** (ages / half)
        exposure = half / math.log(2) * (1.0 - 0.5 ** (uptime / half))
    else:
        weights, exposure = np.ones_like(ages), uptime
    n_w = float(weights.sum())
    rate = n_w / exposure if exposure > 0 else 0.0

    clean = max(float(remaining_steps), 0.0) * pace
    if clean <= 0:
        return FailureAwareEta(0.0, 0.0, 0.0, _goodput(t0, t1, s0, s1, start, now), fails.size)
    redo_s = redo_mean * pace
    running = clean * (1.0 + min(rate * redo_s, MAX_REDO_SHARE))
    expected = rate * running
    eta = clean + expected * cost

    # Band: the count's negative binomial (rate ~ Gamma(n_w + 1, exposure)), each failure
    # costing the mean cost with the observed spread, and the pace's own spread.
    alpha = (1.0 - LEVEL) / 2.0
    n_lo, n_hi = _negbin_quantiles(n_w + 1.0, exposure / (exposure + running), alpha)
    if exposure <= 0:
        n_lo, n_hi = 0, 0
    clean_lo = clean * max(1.0 - Z90 * pace_spread, 0.0)
    clean_hi = clean * (1.0 + Z90 * pace_spread)
    lower = clean_lo + max(n_lo * cost - Z90 * math.sqrt(n_lo) * cost_sd, 0.0)
    upper = clean_hi + n_hi * cost + Z90 * math.sqrt(n_hi) * cost_sd
    return FailureAwareEta(
        eta_seconds=float(eta),
        eta_lower=float(min(lower, eta)),
        eta_upper=float(max(upper, eta)),
        goodput=_goodput(t0, t1, s0, s1, start, now),
        failures=int(fails.size),
        failure_rate_per_h=rate * 3600.0,
        expected_failures=float(expected),
        cost_per_failure_s=float(cost),
    )


def _running_clock(times: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """Running seconds (time inside attempts) up to each wall time in ``times``."""
    if times.size == 0:
        return times
    inside = np.clip(times[:, None] - t0[None, :], 0.0, np.maximum(t1 - t0, 0.0)[None, :])
    return inside.sum(axis=1)


def _goodput(
    t0: np.ndarray, t1: np.ndarray, s0: np.ndarray, s1: np.ndarray, start: float, now: float
) -> float | None:
    """Time on steps no later attempt redid / wall time; an attempt's time is spread evenly
    over its steps (its first point's step is its startup, counted as downtime)."""
    wall = now - start
    if wall <= 0:
        return None
    # Each attempt's first redone step: the lowest first step of any later attempt.
    later = np.minimum.accumulate(np.append(s0[1:], np.inf)[::-1])[::-1]
    steps = s1 - s0
    kept = np.clip(np.minimum(s1, later - 1.0) - s0, 0.0, None)
    share = np.divide(kept, steps, out=np.zeros_like(steps), where=steps > 0)
    return float(min((np.maximum(t1 - t0, 0.0) * share).sum() / wall, 1.0))


def _negbin_quantiles(shape: float, p: float, alpha: float) -> tuple[int, int]:
    """The ``alpha`` and ``1 - alpha`` quantiles of a negative binomial count
    (P(k) = C(k + shape - 1, k) p^shape (1 - p)^k), by summing its pmf."""
    if p >= 1.0:
        return 0, 0
    pmf = math.exp(shape * math.log(p))
    if pmf < 1e-250:  # many failures: the normal approximation (the pmf sum underflows)
        mean, sd = shape * (1 - p) / p, math.sqrt(shape * (1 - p)) / p
        return max(int(mean - Z90 * sd), 0), math.ceil(mean + Z90 * sd)
    cdf, k, lo = pmf, 0, None
    while True:
        if lo is None and cdf >= alpha:
            lo = k
        if cdf >= 1.0 - alpha or k > 100_000:
            return int(lo if lo is not None else k), k
        pmf *= (k + shape) / (k + 1) * (1.0 - p)
        k += 1
        cdf += pmf
