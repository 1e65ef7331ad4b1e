"""The expected-curve fits' solver: the compiled Levenberg-Marquardt (``_lm.pyx``) against
``scipy.optimize.least_squares`` where the fits run (issue 16).

The fits run in two places: CurveDeviation's refits during live watching and replay
(``runwatch analyze``, ``bench/replay_speed.py``), and ``runwatch forecast``. This script

1. records the fit calls (``fit_power_law`` / ``fit_area_law`` with their arguments) made
   by a batch replay of every real run in ``shared/data/real_runs`` and by the forecasts
   of ``bench/detection.py`` (train or val loss at 10/25/50% of each run, with the LR
   where the run logs one, as ``runwatch forecast`` does);
2. times those exact calls with each solver in place (the same fit code: grid start,
   better of the two starts, soft-L1 scale; only ``cost_at``/``solve`` differ; scipy runs
   ``method="trf"``, the only one with bounds and a robust loss, with the same soft-L1
   ``f_scale``, the analytic Jacobian and, with ``--tight``, tolerances of 1e-12),
   interleaved, ``--repeats`` times: total fit time per replay and the per-fit median;
3. times whole replays (all runs, ``analyze_frame``) and the forecasts with each solver,
   interleaved (CPU seconds, medians);
4. compares the results: the fitted curves and their soft-L1 costs per fit, the anomaly episodes
   of every run (detector, metric, steps, severity) and all their floats, and the
   forecasts' predicted values and bands. Results: ``bench/README-fit-solver.md``.

    .venv/bin/python bench/fit_solver.py              # 3 interleaved repeats
    .venv/bin/python bench/fit_solver.py --repeats 5 --tight
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runwatch.detect import analyze_frame  # noqa: E402
from runwatch.expect import _lm, forecast, lrlaw, powerlaw  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "real_runs"
FRACTIONS = (0.10, 0.25, 0.50)


# ---------------------------------------------------------------- the scipy solver
def _residuals(p, xs, ys, sws, zs):
    """Weighted residuals and Jacobian of either law, as ``_lm.pyx`` forms them."""
    b = xs if zs is not None else xs + p[3]
    q = np.power(b, -p[2])
    r = p[0] + p[1] * q - ys
    j = np.empty((xs.size, 4))
    j[:, 0] = 1.0
    j[:, 1] = q
    t = -p[1] * q
    j[:, 2] = t * np.log(b)
    if zs is not None:
        r = r - p[3] * zs
        j[:, 3] = -zs
    else:
        j[:, 3] = t * p[2] / b
    if sws is not None:
        r = sws * r
        j *= sws[:, None]
    return r, j


def scipy_cost_at(xs, ys, sws, p, f2, zs=None) -> float:
    """``_lm.cost_at`` in numpy: the soft-L1 cost f²·Σ(√(1 + r²/f²) − 1)."""
    r, _ = _residuals(np.asarray(p, dtype=float), xs, ys, sws, zs)
    return float(f2 * np.sum(np.sqrt(1.0 + r * r / f2) - 1.0))


def scipy_solver(tight: bool) -> Callable:
    """``_lm.solve``'s signature on ``least_squares(method="trf", loss="soft_l1")``.

    A parameter whose bounds are equal (C of an area law with no anneal in its data) is
    held out of the vector: scipy needs lower < upper."""
    tol = {"ftol": 1e-12, "xtol": 1e-12, "gtol": 1e-12} if tight else {}

    def solve(xs, ys, sws, p0, lo, hi, f2, max_iter=100, ftol=1e-10, zs=None):
        p0, lo, hi = (np.asarray(v, dtype=float) for v in (p0, lo, hi))
        if not math.isfinite(scipy_cost_at(xs, ys, sws, p0, f2, zs)):
            return p0.tolist(), math.inf
        free = lo < hi
        full = p0.copy()

        def fun(pf):
            full[free] = pf
            return _residuals(full, xs, ys, sws, zs)[0]

        def jac(pf):
            full[free] = pf
            return _residuals(full, xs, ys, sws, zs)[1][:, free]

        res = least_squares(
            fun,
            p0[free],
            jac=jac,
            bounds=(lo[free], hi[free]),
            method="trf",
            loss="soft_l1",
            f_scale=math.sqrt(f2),
            **tol,
        )
        p = p0.copy()
        p[free] = res.x
        return p.tolist(), float(res.cost)

    return solve


SOLVERS = {"lm": (_lm.cost_at, _lm.solve)}


@contextlib.contextmanager
def using(name: str) -> Iterator[None]:
    """Every fit in ``runwatch.expect`` runs on solver ``name`` inside the block."""
    cost_at, solve = SOLVERS[name]
    mods = (powerlaw, lrlaw)
    saved = [(m.cost_at, m.solve) for m in mods]
    for m in mods:
        m.cost_at, m.solve = cost_at, solve
    try:
        yield
    finally:
        for m, (c, s) in zip(mods, saved, strict=True):
            m.cost_at, m.solve = c, s


# ---------------------------------------------------------------- the workloads
def load_runs(data: Path) -> dict[str, pd.DataFrame]:
    """Every real run (incident excerpts included: the golden tests replay them too)."""
    return {p.stem: pd.read_csv(p) for p in sorted(data.glob("*.csv"))}


def forecast_cases(runs: dict[str, pd.DataFrame]) -> list[tuple[np.ndarray, np.ndarray, dict]]:
    """The forecasts of ``bench/detection.py``: (steps, values, forecast's keywords)."""
    out = []
    for run, df in runs.items():
        if run.startswith("incident_"):
            continue
        metrics = set(df["metric"])
        m = next((x for x in ("train_loss", "val_loss") if x in metrics), None)
        if m is None:
            continue
        g = df[df["metric"] == m].sort_values("step", kind="stable")
        s, v = g["step"].to_numpy(), g["value"].to_numpy(float)
        if np.nanmin(v) <= 0:
            continue  # an RL loss around zero: no curve to forecast
        lr = df[df["metric"] == "lr"].sort_values("step", kind="stable")
        ls, lv = (None, None) if lr.empty else (lr["step"].to_numpy(), lr["value"].to_numpy())
        fs = int(s[-1])
        for frac in FRACTIONS:
            up = int(s[0] + frac * (fs - s[0]))
            kw = {"upto": up, "final_step": fs, "lr_steps": ls, "lr_values": lv}
            out.append((s, v, kw))
    return out


def run_forecasts(cases) -> list[tuple[str, float, float, float] | None]:
    """(model, predicted, lower, upper) of each case (None: too little data)."""
    out = []
    for s, v, kw in cases:
        try:
            f = forecast(s, v, **kw)
        except ValueError:
            out.append(None)
            continue
        out.append((f.model, f.predicted, f.lower, f.upper))
    return out


FIT_CODES = {
    powerlaw.fit_power_law.__code__: ("power", powerlaw.fit_power_law),
    lrlaw.fit_area_law.__code__: ("area", lrlaw.fit_area_law),
}


def record_fits(work: Callable[[], object]) -> list[tuple[str, Callable, dict]]:
    """The fit calls ``work`` makes, with their arguments (copied), in order."""
    calls: list[tuple[str, Callable, dict]] = []

    def prof(frame, event, arg):
        if event == "call" and frame.f_code in FIT_CODES:
            kind, fn = FIT_CODES[frame.f_code]
            args = {
                k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v
                for k, v in frame.f_locals.items()
            }
            calls.append((kind, fn, args))

    sys.setprofile(prof)
    try:
        work()
    finally:
        sys.setprofile(None)
    return calls


def time_fits(calls) -> tuple[list[float], list]:
    """CPU seconds and result of each recorded fit, re-run as called (CPU time: the
    machine is shared)."""
    times, results = [], []
    for _, fn, args in calls:
        t0 = time.process_time()
        r = fn(**args)
        times.append(time.process_time() - t0)
        results.append(r)
    return times, results


def solve_cpu(calls) -> float:
    """CPU seconds spent in the solver's ``solve`` alone while re-running the fits (the
    rest of a fit, the grid start above all, is the same code for both solvers)."""
    spent = [0.0]
    mods = (powerlaw, lrlaw)
    saved = [m.solve for m in mods]

    def timed(solve):
        def run(*a, **k):
            t0 = time.process_time()
            try:
                return solve(*a, **k)
            finally:
                spent[0] += time.process_time() - t0

        return run

    for m, solve in zip(mods, saved, strict=True):
        m.solve = timed(solve)
    try:
        for _, fn, args in calls:
            fn(**args)
    finally:
        for m, solve in zip(mods, saved, strict=True):
            m.solve = solve
    return spent[0]


def episodes(anoms) -> list[tuple]:
    return [(a.detector, a.metric, a.start_step, a.end_step, a.severity) for a in anoms]


def floats_of(anoms) -> list[float]:
    out = []
    for a in anoms:
        for v in (a.score, a.observed, a.expected, a.lower, a.upper, *a.details.values()):
            if isinstance(v, float):
                out.append(v)
    return out


def rel(a: float, b: float) -> float:
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def fitted(kind: str, args: dict, law) -> tuple[np.ndarray, np.ndarray]:
    """(the law's curve, the values) at the fit's own finite points, in raw units."""
    if kind == "power":
        x, y, _ = powerlaw.finite_points(args["steps"], args["values"], args["weights"])
        return law.predict(x), y
    s1, s2 = np.asarray(args["s1"], float), np.asarray(args["s2"], float)
    y = np.asarray(args["values"], float)
    ok = np.isfinite(s1) & np.isfinite(s2) & np.isfinite(y) & (s1 > 0)
    return law.predict_areas(s1[ok], s2[ok]), y[ok]


def soft_l1_cost(curve: np.ndarray, y: np.ndarray) -> float:
    """The soft-L1 cost of a curve on the fit's points, at the fit's own scale."""
    f = powerlaw.soft_l1_scale(y, float(np.ptp(y)))
    return float(f * f * np.sum(np.sqrt(1.0 + ((curve - y) / f) ** 2) - 1.0))


def compare(calls, lm_laws, sp_laws) -> tuple[float, float, float]:
    """Over the fits: the largest relative gap between the two fitted curves at the fit's
    points, and the smallest and largest ratio of scipy's soft-L1 cost to the LM's."""
    gap, lo, hi = 0.0, math.inf, 0.0
    for (kind, _, a), l1, l2 in zip(calls, lm_laws, sp_laws, strict=True):
        c1, y = fitted(kind, a, l1)
        c2, _ = fitted(kind, a, l2)
        gap = max(gap, float(np.max(np.abs(c1 - c2) / np.maximum(np.abs(c1), 1e-300))))
        k1, k2 = soft_l1_cost(c1, y), soft_l1_cost(c2, y)
        ratio = k2 / k1 if k1 > 0 else 1.0
        lo, hi = min(lo, ratio), max(hi, ratio)
    return gap, lo, hi


# ---------------------------------------------------------------- the report
def measure(runs, cases, repeats: int) -> dict:
    """Record the fit calls (LM in place), then time them, whole replays and the
    forecasts with each solver, interleaved ``repeats`` times."""
    with using("lm"):
        calls = {
            run: record_fits(lambda df=df: analyze_frame(df, fast=True)) for run, df in runs.items()
        }
        calls[FORECASTS] = record_fits(lambda: run_forecasts(cases))
    m: dict = {
        "calls": calls,
        "fit_s": {n: {k: [] for k in calls} for n in SOLVERS},
        "laws": {n: {} for n in SOLVERS},
        "solve_cpu": {n: [] for n in SOLVERS},
        "replay_cpu": {n: [] for n in SOLVERS},
        "forecast_cpu": {n: [] for n in SOLVERS},
        "anomalies": {n: {} for n in SOLVERS},
        "forecasts": {},
    }
    for _ in range(repeats):
        for n in SOLVERS:
            with using(n):
                for k, c in calls.items():
                    t, laws = time_fits(c)
                    m["fit_s"][n][k].append(t)
                    m["laws"][n][k] = laws
                m["solve_cpu"][n].append(sum(solve_cpu(c) for c in calls.values()))
                c0 = time.process_time()
                for run, df in runs.items():
                    m["anomalies"][n][run] = analyze_frame(df, fast=True)
                m["replay_cpu"][n].append(time.process_time() - c0)
                c0 = time.process_time()
                m["forecasts"][n] = run_forecasts(cases)
                m["forecast_cpu"][n].append(time.process_time() - c0)
    return m


FORECASTS = "(forecasts)"


def report(m: dict, points: int) -> None:
    """Print the table and the summary lines (markdown)."""
    med = statistics.median
    print(
        "| fits of | fits | LM total ms | scipy total ms | LM median us | scipy median us "
        "| curves max rel gap | scipy/LM cost min-max | episodes equal "
        "| anomaly floats max rel diff |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    total = {n: 0.0 for n in SOLVERS}
    per_fit: dict[str, list[float]] = {n: [] for n in SOLVERS}
    for k, calls in m["calls"].items():
        if not calls:
            continue
        reps = {n: m["fit_s"][n][k] for n in SOLVERS}
        tot = {n: med(sum(t) for t in reps[n]) for n in SOLVERS}
        per = {n: [med(x) for x in zip(*reps[n], strict=True)] for n in SOLVERS}
        for n in SOLVERS:
            total[n] += tot[n]
            per_fit[n] += per[n]
        gap, lo, hi = compare(calls, m["laws"]["lm"][k], m["laws"]["scipy"][k])
        if k == FORECASTS:
            eq, fd = "-", "-"
        else:
            a1, a2 = m["anomalies"]["lm"][k], m["anomalies"]["scipy"][k]
            eq = "yes" if episodes(a1) == episodes(a2) else "NO"
            f1, f2 = floats_of(a1), floats_of(a2)
            fd = f"{max((rel(u, v) for u, v in zip(f1, f2, strict=False)), default=0.0):.1e}"
        print(
            f"| {k} | {len(calls)} | {tot['lm'] * 1e3:.1f} | {tot['scipy'] * 1e3:.0f} "
            f"| {med(per['lm']) * 1e6:.0f} | {med(per['scipy']) * 1e6:.0f} "
            f"| {gap:.1e} | {lo:.5f}-{hi:.5f} | {eq} | {fd} |"
        )
    print()
    n_fits = sum(len(c) for c in m["calls"].values())
    print(
        f"all {n_fits} fits: LM {total['lm']:.3f} s, scipy {total['scipy']:.3f} s "
        f"(x{total['scipy'] / total['lm']:.1f}); per fit (median) LM "
        f"{med(per_fit['lm']) * 1e6:.0f} us, scipy {med(per_fit['scipy']) * 1e6:.0f} us"
    )
    sl, ss = med(m["solve_cpu"]["lm"]), med(m["solve_cpu"]["scipy"])
    print(
        f"of which in the solver's solve alone: LM {sl:.3f} s, scipy {ss:.3f} s "
        f"(the rest, grid start and bookkeeping, is the same code)"
    )
    rl, rs = med(m["replay_cpu"]["lm"]), med(m["replay_cpu"]["scipy"])
    print(
        f"batch replay of all runs, CPU s (median): LM {rl:.3f}, scipy {rs:.3f} "
        f"(x{rs / rl:.2f}); {points / rl:,.0f} vs {points / rs:,.0f} points/s"
    )
    fl, fsc = med(m["forecast_cpu"]["lm"]), med(m["forecast_cpu"]["scipy"])
    n_fc = len(m["forecasts"]["lm"])
    print(
        f"{n_fc} forecasts, CPU s (median): LM {fl:.3f}, scipy {fsc:.3f} (x{fsc / fl:.2f}); "
        f"per forecast {fl / n_fc * 1e3:.1f} vs {fsc / n_fc * 1e3:.1f} ms"
    )
    worst, same_model = 0.0, True
    for a, b in zip(m["forecasts"]["lm"], m["forecasts"]["scipy"], strict=True):
        if a is None or b is None:
            same_model &= a is b
            continue
        same_model &= a[0] == b[0]
        worst = max(worst, *(rel(u, v) for u, v in zip(a[1:], b[1:], strict=True)))
    print(
        f"forecasts: same model in every case: {same_model}; predicted, lower, upper "
        f"max rel diff {worst:.1e}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tight", action="store_true", help="scipy's tolerances at 1e-12")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    SOLVERS["scipy"] = (scipy_cost_at, scipy_solver(args.tight))
    runs = load_runs(args.data)
    cases = forecast_cases(runs)
    points = sum(len(d) for d in runs.values())
    tol = "1e-12" if args.tight else "scipy's defaults (1e-8)"
    print(
        f"{len(runs)} runs, {points:,} points, {len(cases)} forecasts, {args.repeats} "
        f"interleaved repeats; least_squares(method='trf', loss='soft_l1'), tolerances {tol}"
    )
    print()
    report(measure(runs, cases, args.repeats), points)


if __name__ == "__main__":
    main()
