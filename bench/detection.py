"""The labelled detection benchmark of issue 3, on the real runs in shared/data/real_runs.

    python bench/detection.py [--quick] [--data DIR] [--every K]

What it does, all in one run, with a seeded RNG:
1. Clean real curves: replay the full Monitor over every run and count alarms of severity
   warning or worse per 100,000 trainer steps, with and without the windows of real events
   (``KNOWN_EVENTS``: what shared/data/real_runs/SOURCES.md documents, plus two step-time
   level shifts we found by eye in the numbers and list with their evidence). Both counts
   are printed.
2. Injected faults on copies of the curves: NaN/Inf, spikes of 6x, 10x and 20x the curve's
   local noise (robust sigma of log first differences over the 200 points before the
   fault), divergence, plateau, level shift, throughput drop, LR jump and LR to zero, at
   several positions and durations. Recall, median delay (trainer steps), precision and
   false alarms for our Monitor and two baselines: a static threshold (set once, at 10% of
   the run, to 1.2x the loss level then / 1.5x the step time then) and a rolling z-score
   (mean/std of the previous 30 points, |z| > 3).
3. Forecast of the final loss from the first 10/25/50% of steps: median absolute % error
   and 90%-band coverage.
4. Replay throughput of the full default detector set, points/s.

Runs listed in ``HELD_OUT`` were not used for tuning; they are reported separately.
``--every K`` replays every run as a trainer logging every K steps writes it (window means,
``logged_every``), the faults injected on what it logged.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runwatch.detect import analyze_frame  # noqa: E402
from runwatch.expect import forecast  # noqa: E402
from runwatch.model import severity_rank  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "real_runs"

HELD_OUT = frozenset(
    {
        "mng_fp4_19k",
        "mng_muon_6k",
        "mng_valueembed_1530",
        "mlm_mixtral_8x7b_h100",
        "mlm_t5_h100",
        "dschat_rlhf_opt1.3b",
    }
)
"""Chosen before tuning; never used to pick a parameter."""

# (run, metric or None for any, first step, last step, source)
KNOWN_EVENTS: tuple[tuple[str, str | None, int, int, str], ...] = (
    ("mlm_gpt3_15b_h100", "step_time_ms", 2100, 2300, "SOURCES: throughput anomaly 4.3x"),
    ("mlm_gpt3_15b_h100", "step_time_ms", 27100, 35700, "ours: step time 1430->1525 ms (+6.5%)"),
    ("mlm_dsv3_proxy_h100", "step_time_ms", 29955, 30800, "ours: step time 12.0->16.8 s (+40%)"),
    ("mlm_dsv3_proxy_h100", "step_time_ms", 140, 400, "ours: step time 11.7->13.5 s (+15%)"),
    ("mlm_nemotron3_super_gb200", "step_time_ms", 0, 10**9, "SOURCES: quasi-periodic slow steps"),
    ("mlm_mixtral_8x7b_h100", "train_loss", 3850, 3850, "SOURCES: loss spike x1.39"),
    ("mlm_mixtral_8x7b_h100", "train_loss", 4260, 4260, "SOURCES: loss spike x1.25"),
    ("mng_scaleup1b_20k", "train_loss", 14738, 14738, "SOURCES: single-step spike x1.9"),
    ("mng_scaleup1b_20k", "train_loss", 5964, 5964, "SOURCES: single-step spike"),
    ("mng_scaleup1b_20k", "train_loss", 17992, 17992, "SOURCES: single-step spike"),
    ("mng_scaleup1b_15k", "train_loss", 11236, 11236, "SOURCES: spike x1.9"),
    ("mng_scaleup1b_15k", "train_loss", 11879, 11879, "SOURCES: spike x1.9"),
    ("mng_fp4_19k", "train_loss", 14257, 14257, "SOURCES: largest spike x1.98"),
    ("mng_llmc_gpt2_124m", "grad_norm", 9025, 9025, "SOURCES: grad_norm spike x7.5"),
    ("mng_llmc_gpt2_124m", "grad_norm", 7435, 7435, "SOURCES: grad_norm spike x5.3"),
    (
        "mlm_nemotron3_super_gb200",
        "grad_num_zeros",
        500,
        1600,
        "SOURCES: grad_num_zeros very large early on; ours: 38M -> 651M zeros, steps 570-1580",
    ),
)
"""Real events in the clean curves: an alarm overlapping one (± EVENT_MARGIN steps) is a
true detection of a real event, not a false alarm. Incident excerpts (incident_*.csv)
are all real incidents and are not used as clean curves at all."""

EVENT_MARGIN = 200


def _alarm_is_known(run: str, metric: str, lo: int, hi: int) -> bool:
    for r, m, a, b, _ in KNOWN_EVENTS:
        same = r == run and (m is None or m == metric)
        if same and lo <= b + EVENT_MARGIN and hi >= a - EVENT_MARGIN:
            return True
    return False


def load_runs(data: Path) -> dict[str, pd.DataFrame]:
    runs = {}
    for path in sorted(data.glob("*.csv")):
        if path.stem.startswith("incident_"):
            continue
        df = pd.read_csv(path)
        runs[path.stem] = df[["metric", "step", "value"]].copy()
    return runs


WINDOW_LAST = frozenset({"lr"})
"""Metrics a trainer logs as their value at the window's last step; the rest as the mean."""


def logged_every(df: pd.DataFrame, every: int) -> pd.DataFrame:
    """The run as a trainer logging every ``every`` steps writes it (HF ``logging_steps``,
    Lightning ``log_every_n_steps`` with ``on_step`` means): one point per window of
    ``every`` steps, at its last step, the window's mean (the LR: its last value)."""
    if every <= 1:
        return df
    out = []
    for metric, g in df.groupby("metric", sort=False):
        g = g.sort_values("step", kind="stable")
        window = g["step"].to_numpy() // every
        grouped = g.groupby(window, sort=True)
        values = grouped["value"].last() if metric in WINDOW_LAST else grouped["value"].mean()
        out.append(pd.DataFrame({"metric": metric, "step": grouped["step"].max(), "value": values}))
    return pd.concat(out, ignore_index=True)


def run_steps(df: pd.DataFrame) -> int:
    return int(df["step"].max() - df["step"].min()) + 1


# ---------------------------------------------------------------- baselines
def _episodes(flags: np.ndarray, steps: np.ndarray, quiet: int = 5) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    idx = np.flatnonzero(flags)
    if idx.size == 0:
        return out
    start = prev = idx[0]
    for i in idx[1:]:
        if i - prev > quiet:
            out.append((int(steps[start]), int(steps[prev])))
            start = i
        prev = i
    out.append((int(steps[start]), int(steps[prev])))
    return out


def baseline_static(steps: np.ndarray, values: np.ndarray, role: str) -> list[tuple[int, int]]:
    """A fixed threshold, set once at 10% of the run (what a W&B/Grafana rule does)."""
    n = values.size
    k = max(int(0.1 * n), 10)
    if n <= k:
        return []
    level = np.nanmedian(values[max(k - 50, 0) : k])
    if role == "lr":
        return []
    thr = level * (1.5 if role == "step_time" else 1.2)
    flags = np.zeros(n, dtype=bool)
    with np.errstate(invalid="ignore"):
        flags[k:] = values[k:] > thr
    return _episodes(flags, steps)


def baseline_zscore(steps: np.ndarray, values: np.ndarray, window: int = 30, z: float = 3.0):
    """W&B's z-score automation: mean/std of the previous ``window`` points, |z| > 3."""
    s = pd.Series(values)
    prev = s.shift(1).rolling(window, min_periods=window)
    mu, sd = prev.mean().to_numpy(), prev.std().to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        zz = np.abs((values - mu) / sd)
    flags = np.nan_to_num(zz, nan=0.0) > z
    return _episodes(flags, steps)


# ---------------------------------------------------------------- faults
@dataclass
class Fault:
    run: str
    metric: str
    kind: str
    size: str
    t0: int  # index of the first faulty point
    t1: int  # index of the last faulty point
    steps: np.ndarray
    values: np.ndarray  # faulty copy
    held_out: bool

    @property
    def step0(self) -> int:
        return int(self.steps[self.t0])

    @property
    def remaining(self) -> int:
        return int(self.steps[-1] - self.steps[self.t0]) + 1


def local_noise(values: np.ndarray, t0: int, window: int = 200) -> float:
    lv = np.log(np.maximum(values[max(t0 - window, 0) : t0], 1e-12))
    d = np.abs(np.diff(lv))
    return float(1.0484 * np.median(d)) if d.size else 0.0


def rolling_trend(values: np.ndarray, width: int = 101) -> np.ndarray:
    return pd.Series(values).rolling(width, center=True, min_periods=1).median().to_numpy()


PLATEAU_SIZES = ("<3x", "3-6x", ">=6x")


def plateau_size(trend: np.ndarray, t0: int, noise: float) -> str:
    """A plateau's size: the progress it takes away by the end of the run (the fall of the
    log trend from the fault to the last point) in units of the local noise, bucketed like
    the spike sizes. A plateau with little progress left to lose (late in a run, or in the
    stable phase of a warmup-stable-decay schedule) is small: no detector can tell it
    from the real curve before the run ends, because the curves barely differ."""
    lost = (math.log(trend[t0]) - math.log(trend[-1])) / max(noise, 1e-12)
    return PLATEAU_SIZES[0] if lost < 3 else PLATEAU_SIZES[1] if lost < 6 else PLATEAU_SIZES[2]


def make_faults(
    runs: dict[str, pd.DataFrame],
    rng: np.random.Generator,
    quick: bool,
    min_loss_points: int = 1500,
):
    faults: list[Fault] = []
    positions = (0.3, 0.6) if quick else (0.25, 0.5, 0.75)
    for run, df in runs.items():
        held = run in HELD_OUT
        metrics = set(df["metric"])
        loss = "train_loss" if "train_loss" in metrics else None
        series = {m: g.sort_values("step", kind="stable") for m, g in df.groupby("metric")}

        def arr(m, series=series):
            g = series[m]
            return g["step"].to_numpy(np.int64), g["value"].to_numpy(float)

        if loss is not None:
            st, v = arr(loss)
            if v.size < min_loss_points or np.nanmin(v) <= 0:
                loss = None
        if loss is not None:
            n = v.size
            trend = rolling_trend(v)
            for pos in positions:
                t0 = int(pos * n) + int(rng.integers(-20, 21))
                f = v.copy()
                f[t0] = [np.nan, np.inf][int(rng.integers(0, 2))]
                faults.append(Fault(run, loss, "nan_inf", "-", t0, t0, st, f, held))
                sig = local_noise(v, t0)
                for k in (6, 10, 20):
                    for dur in (1, 3) if quick else (1, 3, 10):
                        f = v.copy()
                        f[t0 : t0 + dur] = np.exp(np.log(f[t0 : t0 + dur]) + k * sig)
                        faults.append(
                            Fault(
                                run, loss, "spike", f"{k}x/{dur}pt", t0, t0 + dur - 1, st, f, held
                            )
                        )
                for rate in (0.002, 0.005, 0.01):
                    f = v.copy()
                    ds = (st[t0:] - st[t0]).astype(float)
                    f[t0:] = f[t0:] * np.exp(np.minimum(rate * ds, math.log(100.0)))
                    faults.append(
                        Fault(run, loss, "divergence", f"{rate:.3f}/step", t0, n - 1, st, f, held)
                    )
                f = v.copy()
                f[t0:] = v[t0:] - trend[t0:] + trend[t0]
                size = plateau_size(trend, t0, sig)
                faults.append(Fault(run, loss, "plateau", size, t0, n - 1, st, f, held))
                for shift in (0.03, 0.05, 0.10):
                    f = v.copy()
                    f[t0:] *= 1 + shift
                    faults.append(
                        Fault(run, loss, "level_shift", f"+{shift:.0%}", t0, n - 1, st, f, held)
                    )
        if "step_time_ms" in metrics:
            st, v = arr("step_time_ms")
            n = v.size
            if n >= 400:
                for pos in positions:
                    t0 = int(pos * n) + int(rng.integers(-5, 6))
                    for drop in (0.05, 0.10, 0.25):
                        for dur in (50, n - t0):
                            f = v.copy()
                            f[t0 : t0 + dur] *= 1 + drop
                            size = f"+{drop:.0%}/" + ("rest" if dur == n - t0 else f"{dur}pt")
                            faults.append(
                                Fault(
                                    run,
                                    "step_time_ms",
                                    "throughput",
                                    size,
                                    t0,
                                    min(t0 + dur, n) - 1,
                                    st,
                                    f,
                                    held,
                                )
                            )
        if "lr" in metrics:
            st, v = arr("lr")
            n = v.size
            for pos in positions:
                t0 = int(pos * n) + int(rng.integers(-20, 21))
                f = v.copy()
                f[t0 : t0 + 20] *= 3.0
                faults.append(Fault(run, "lr", "lr_jump", "x3/20pt", t0, t0 + 19, st, f, held))
                f = v.copy()
                f[t0:] = 0.0
                faults.append(Fault(run, "lr", "lr_zero", "rest", t0, n - 1, st, f, held))
    return faults


# ---------------------------------------------------------------- scoring
WINDOW_AFTER = {"nan_inf": 0, "spike": 5}
"""How long after a short fault ends a detection still counts (points)."""


def _match(fault: Fault, episodes):
    """Delay (steps) of the first relevant episode that starts inside the fault window, and
    the number of episodes that have nothing to do with the fault (they neither start in
    nor overlap the window, extended by ``GRACE`` points for smoothed detectors' lag)."""
    hi_idx = min(fault.t1 + WINDOW_AFTER.get(fault.kind, 0), fault.steps.size - 1)
    lo, hi = fault.step0, int(fault.steps[hi_idx])
    hi_grace = int(fault.steps[min(fault.t1 + GRACE, fault.steps.size - 1)])
    delay = None
    outside = 0
    for ep in episodes:
        a, b = ep[0], ep[1]
        relevant = ep[2] if len(ep) > 2 else True
        if relevant and lo <= a <= hi:
            if delay is None:
                delay = a - lo
        elif (b < lo or a > hi_grace) and not _alarm_is_known(fault.run, fault.metric, a, b):
            outside += 1  # a real event of the clean curve is not a false alarm either
    return delay, outside


GRACE = 100


RELEVANT = {
    "nan_inf": {"nonfinite"},
    "spike": {"spike"},
    "divergence": {"divergence", "curve_deviation", "spike", "stall"},
    "plateau": {"curve_deviation", "divergence", "stall"},
    "level_shift": {"curve_deviation", "divergence", "spike", "stall"},
    "throughput": {"regression"},
    "lr_jump": {"lr_sanity"},
    "lr_zero": {"lr_sanity"},
}
"""Which of our detectors count as detecting a fault kind: an unrelated info alarm that
happens to fall inside a long fault window is not a detection."""


def _monitor_episodes(fault: Fault, warn_only: bool, cache: dict) -> list[tuple[int, int]]:
    key = (id(fault), warn_only)
    if key not in cache:
        n_keep = fault.steps.size
        if fault.kind in ("nan_inf", "spike", "lr_jump"):
            n_keep = min(fault.t1 + 50, fault.steps.size)
        pts = pd.DataFrame(
            {"metric": fault.metric, "step": fault.steps[:n_keep], "value": fault.values[:n_keep]}
        )
        anoms = analyze_frame(pts)
        rel = RELEVANT[fault.kind]
        # Unrelated detectors' alarms still count as "other episodes" (they hurt precision).
        cache[(id(fault), False)] = [(a.start_step, a.end_step, a.detector in rel) for a in anoms]
        cache[(id(fault), True)] = [
            (a.start_step, a.end_step, a.detector in rel)
            for a in anoms
            if severity_rank(a.severity) >= 1
        ]
    return cache[key]


def score_faults(faults: list[Fault]) -> pd.DataFrame:
    rows = []
    cache: dict = {}
    for f in faults:
        role = {"train_loss": "loss", "step_time_ms": "step_time", "lr": "lr"}[f.metric]
        eps = {
            "runwatch(any)": _monitor_episodes(f, False, cache),
            "runwatch(warn+)": _monitor_episodes(f, True, cache),
            "static": baseline_static(f.steps, f.values, role),
            "zscore30": baseline_zscore(f.steps, f.values),
        }
        for name, e in eps.items():
            delay, outside = _match(f, e)
            rows.append(
                {
                    "detector": name,
                    "kind": f.kind,
                    "size": f.size,
                    "run": f.run,
                    "held_out": f.held_out,
                    "detected": delay is not None,
                    "delay": delay,
                    "rel_delay": None if delay is None else delay / f.remaining,
                    "outside": outside,
                }
            )
        cache.pop((id(f), False), None)
        cache.pop((id(f), True), None)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- clean curves
def clean_false_alarms(runs: dict[str, pd.DataFrame]):
    rows = []
    points = 0
    elapsed = cpu = 0.0
    for run, df in runs.items():
        t, c = time.perf_counter(), time.process_time()
        anoms = analyze_frame(df)
        elapsed += time.perf_counter() - t
        cpu += time.process_time() - c
        points += len(df)
        warn = [a for a in anoms if severity_rank(a.severity) >= 1]
        n_info = len(anoms) - len(warn)
        known = [a for a in warn if _alarm_is_known(run, a.metric, a.start_step, a.end_step)]
        steps = run_steps(df)
        # Baselines on the loss (and step time) of the clean curve.
        base = {"static": 0, "zscore30": 0}
        for m, role in (("train_loss", "loss"), ("step_time_ms", "step_time")):
            g = df[df["metric"] == m].sort_values("step", kind="stable")
            if len(g) < 50:
                continue
            s, v = g["step"].to_numpy(), g["value"].to_numpy(float)
            base["static"] += len(baseline_static(s, v, role))
            base["zscore30"] += len(baseline_zscore(s, v))
        rows.append(
            {
                "run": run,
                "held_out": run in HELD_OUT,
                "steps": steps,
                "info": n_info,
                "warn_all": len(warn),
                "warn_unexplained": len(warn) - len(known),
                "static": base["static"],
                "zscore30": base["zscore30"],
                "unexplained": [
                    f"{a.detector}:{a.metric}@{a.start_step}" for a in warn if a not in known
                ],
            }
        )
    return pd.DataFrame(rows), (points / elapsed, points / cpu)


# ---------------------------------------------------------------- forecast
def forecast_table(runs: dict[str, pd.DataFrame]) -> pd.DataFrame:
    rows = []
    for run, df in runs.items():
        metrics = set(df["metric"])
        m = (
            "train_loss"
            if "train_loss" in metrics
            else "val_loss"
            if "val_loss" in metrics
            else None
        )
        if m is None:
            continue
        g = df[df["metric"] == m].sort_values("step", kind="stable")
        s, v = g["step"].to_numpy(), g["value"].to_numpy(float)
        if np.nanmin(v) <= 0:
            continue  # an RL loss around zero: no curve to forecast
        k = max(5, v.size // 100)
        final = float(np.median(v[-k:]))
        fs = int(s[-1])
        # As `runwatch forecast` does: the LR-aware law when the run logs its LR (llm.c).
        lr = df[df["metric"] == "lr"].sort_values("step", kind="stable")
        ls, lv = (None, None) if lr.empty else (lr["step"].to_numpy(), lr["value"].to_numpy())
        for frac in (0.10, 0.25, 0.50):
            up = int(s[0] + frac * (fs - s[0]))
            try:
                f = forecast(s, v, upto=up, final_step=fs, lr_steps=ls, lr_values=lv)
            except ValueError:
                rows.append({"run": run, "frac": frac, "held_out": run in HELD_OUT, "err": None})
                continue
            rows.append(
                {
                    "run": run,
                    "frac": frac,
                    "held_out": run in HELD_OUT,
                    "err": abs(f.predicted - final) / abs(final) * 100,
                    "covered": f.lower <= final <= f.upper,
                }
            )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- report
TARGETS = {
    "nan_inf": "recall>=0.95, delay 0",
    "spike": "recall>=0.95 (>=6x), median delay<=2",
    "divergence": "recall>=0.95, median delay<=50",
    "plateau": "recall>=0.95 (>=6x), delay<=10% of remaining",
    "level_shift": "recall>=0.95, delay<=10% of remaining",
    "throughput": "(no numeric target)",
    "lr_jump": "(no numeric target)",
    "lr_zero": "(no numeric target)",
}


TABLE_DETECTORS = ("runwatch(any)", "runwatch(warn+)", "static", "zscore30")


def _fault_row(label: str, det: str, d: pd.DataFrame, target: str = "") -> str:
    """One row of the fault table: trials, recall, median delays of the hits, extra alarms."""
    hit = d[d["detected"]]
    md = f"{hit['delay'].median():.0f}" if len(hit) else "-"
    mr = f"{hit['rel_delay'].median():.1%}" if len(hit) else "-"
    return (
        f"{label:<12} {det:<16} {len(d):>4} {d['detected'].mean():>7.2f} {md:>10} "
        f"{mr:>8} {d['outside'].mean():>11.2f}  {target}"
    ).rstrip()


def print_fault_table(res: pd.DataFrame, title: str) -> None:
    print(f"\n{title}")
    hdr = (
        f"{'kind':<12} {'detector':<16} {'n':>4} {'recall':>7} {'med.delay':>10} "
        f"{'med.rel':>8} {'extra/trial':>11}  target"
    )
    print(hdr)
    print("-" * len(hdr))
    for kind in TARGETS:
        sub = res[res["kind"] == kind]
        if sub.empty:
            continue
        for det in TABLE_DETECTORS:
            target = TARGETS[kind] if det == "runwatch(any)" else ""
            print(_fault_row(kind, det, sub[sub["detector"] == det], target))
        if kind in ("plateau", "level_shift"):
            _print_by_size(sub)


def _print_by_size(sub: pd.DataFrame) -> None:
    """Rows per size (plateau: lost progress / local noise; level shift: the rise), ours
    and baselines."""
    for size in sorted(set(sub["size"]), key=_size_order):
        for det in TABLE_DETECTORS:
            d = sub[(sub["detector"] == det) & (sub["size"] == size)]
            if not d.empty:
                print(_fault_row("  " + size, det, d))


def _size_order(size: str) -> tuple[int, float]:
    """Largest first: the plateau buckets from ``>=6x``, the level shifts from +10%."""
    if size in PLATEAU_SIZES:
        return (0, -PLATEAU_SIZES.index(size))
    return (1, -float(size.strip("+%")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--quick", action="store_true", help="fewer positions and durations")
    ap.add_argument("--seed", type=int, default=20241)
    ap.add_argument("--kinds", default="", help="comma-separated fault kinds to run (default: all)")
    ap.add_argument(
        "--every",
        type=int,
        default=1,
        help="replay the runs as logged every K steps (window means), as HF and Lightning log",
    )
    args = ap.parse_args(argv)
    if not args.data.is_dir():
        print(f"no data at {args.data}", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    runs = {run: logged_every(df, args.every) for run, df in load_runs(args.data).items()}
    rng = np.random.default_rng(args.seed)

    clean, pps = clean_false_alarms(runs)
    print("== clean real curves: episodes of our Monitor (all detectors) and the baselines ==")
    print(
        f"{'run':<28} {'set':<8} {'steps':>7} {'info':>5} {'warn+':>6} {'unexpl.':>7} "
        f"{'static':>6} {'z30':>5}  unexplained alarms"
    )
    for r in clean.itertuples():
        print(
            f"{r.run:<28} {'held-out' if r.held_out else 'held-in':<8} {r.steps:>7} {r.info:>5} "
            f"{r.warn_all:>6} {r.warn_unexplained:>7} {r.static:>6} {r.zscore30:>5}  "
            f"{', '.join(r.unexplained[:4])}"
        )
    for label, sub in (("held-in", clean[~clean.held_out]), ("held-out", clean[clean.held_out])):
        per = 1e5 / sub["steps"].sum()
        print(
            f"false alarms per 100k steps, {label}: ours {sub['warn_unexplained'].sum() * per:.2f}"
            f" (all warn+ incl. known real events {sub['warn_all'].sum() * per:.2f}); "
            f"static {sub['static'].sum() * per:.2f}; zscore30 {sub['zscore30'].sum() * per:.2f}"
            f"; our info-level episodes {sub['info'].sum() * per:.0f}"
        )

    faults = make_faults(runs, rng, args.quick, max(1500 // args.every, 150))
    if args.kinds:
        faults = [f for f in faults if f.kind in args.kinds.split(",")]
    res = score_faults(faults)
    print_fault_table(res[~res.held_out], "== injected faults, held-in runs ==")
    print_fault_table(res[res.held_out], "== injected faults, held-out runs ==")

    # Precision: alarms (warning+) inside the fault window over all warning+ alarms.
    print(
        "\nprecision (warning+ episodes on faulted series that overlap the fault, with a"
        f" {GRACE}-point grace after it):"
    )
    for det in ("runwatch(warn+)", "static", "zscore30"):
        d = res[res["detector"] == det]
        tp = d["detected"].sum()
        fp = d["outside"].sum()
        print(f"  {det:<16} {tp / max(tp + fp, 1):.3f}  ({tp} true, {fp} other episodes)")

    fc = forecast_table(runs)
    print("\n== forecast of the final loss (median of the last 1% of points) ==")
    print(f"{'fit on':<8} {'set':<9} {'runs':>4} {'med |err| %':>11} {'90% band cov.':>14}  target")
    for frac in (0.10, 0.25, 0.50):
        for label, held in (("held-in", False), ("held-out", True)):
            sub = fc[(fc.frac == frac) & (fc.held_out == held)]
            ok = sub.dropna(subset=["err"])
            tgt = "<=1.5%, >=85%" if frac == 0.25 else ""
            print(
                f"{frac:<8.0%} {label:<9} {len(ok):>4} {ok['err'].median():>11.2f} "
                f"{ok['covered'].mean():>14.2f}  {tgt}"
            )
    print(
        f"\n== replay throughput (all {len(runs)} real runs, full default detector set): "
        f"{pps[0]:,.0f} points/s wall, {pps[1]:,.0f} points/s CPU (target 1,000,000) =="
    )
    print(
        f"faults injected: {len(faults)}; seed {args.seed}; "
        f"bench time {time.perf_counter() - t_start:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
