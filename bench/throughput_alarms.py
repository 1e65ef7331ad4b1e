"""Throughput and step-time alarms on real clean runs, and recall of injected slowdowns.

    python bench/throughput_alarms.py                  # the table, older checkouts vs this
    python bench/throughput_alarms.py --before /tmp/wt-before --seeds 3
    python bench/throughput_alarms.py --export DB --to bench/data/tiny_lm_quiet   # new data

What it measures (issue 17, item 6), for the code of this checkout ("after") and of older
checkouts ("before", e.g. ``git worktree add /tmp/wt-before 8ca7193`` with its ``.pyx``
built in place), each in a subprocess that imports only its own checkout:

1. False alarms: regression episodes of severity warning or worse, per 100,000 clean
   steps, on each set of tiny-LM runs made on this 2-core machine (``CPU_SETS``:
   ``step_time_s``, ``tokens_per_s`` and, where the hook read it, ``host_cpu_wait`` of
   ``examples/train_tiny_lm.py``, 1,500 steps each) and on the step-time / throughput
   series of the real runs in ``../shared/data/real_runs`` (quiet GPU clusters; episodes
   on the real events that ``bench/detection.py`` lists in ``KNOWN_EVENTS`` are not false).
   Info episodes are counted beside them.
2. Recall: copies of the clean runs with a slowdown injected at a seeded random position
   (step time x1.5 for 50 steps, x1.2 for 300 steps; tokens/s divided alike; the CPU wait
   left as it was, since the run, not the host, slowed), also into the real runs' step
   time. Recall at warning+ and at any severity, the median delay (steps from the
   slowdown's start), and the warning+ recall of the slowdowns that did not land on a
   busy host. Each seed places every slowdown anew; the spread over seeds is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data"
CLEAN = DATA / "tiny_lm_clean"
CPU_SETS = (
    ("busy", "tiny_lm_clean", "tiny-LM CPU runs on a busy machine, with CPU wait"),
    ("quiet", "tiny_lm_quiet", "tiny-LM CPU runs on a quiet machine, with CPU wait"),
    ("no_wait", "tiny_lm_clean_no_wait", "older tiny-LM CPU runs, no CPU wait"),
)
"""(key, directory under bench/data, what the runs are) of each set of clean CPU runs."""
CPU_WAIT = "host_cpu_wait"
BUSY_WAIT = 0.1  # runwatch.detect.busy.BUSY_WAIT; here too, for checkouts without it
REAL = ROOT.parent / "shared" / "data" / "real_runs"
KINDS = (("x1.5/50", 1.5, 50), ("x1.2/300", 1.2, 300))
THROUGHPUT = ("step_time", "throughput")


# ---------------------------------------------------------------- data
def export(db: str, out: Path = CLEAN, steps: int = 1500) -> list[str]:
    """Write each complete tiny-LM run of ``db`` to ``out/<run>.csv.gz`` (long format)."""
    sys.path.insert(0, str(ROOT))
    import runwatch

    store = runwatch.open_store(db, readonly=True)
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for name in store.runs()["name"]:
        pts = store.read_points(name, ["step_time_s", "tokens_per_s", CPU_WAIT])
        timing = pts[pts["metric"] != CPU_WAIT]
        if timing.empty or timing.groupby("metric")["step"].nunique().min() < steps:
            continue  # a run that crashed or was cut short is not a clean run
        df = pts[["step", "metric", "value"]].copy()
        df.insert(0, "run", name)
        df.to_csv(out / f"{name}.csv.gz", index=False, float_format="%.6g")
        done.append(name)
    return done


def clean_runs(where: Path = CLEAN) -> dict[str, pd.DataFrame]:
    return {p.name.split(".")[0]: pd.read_csv(p) for p in sorted(where.glob("*.csv.gz"))}


def busy_wait(df: pd.DataFrame, t0: int, t1: int) -> float:
    """The share of steps ``t0``..``t1`` whose CPU-wait sample (the latest at or before the
    step) reached BUSY_WAIT: a slowdown there lands on a busy host."""
    w = df[df["metric"] == CPU_WAIT].sort_values("step")
    if w.empty:
        return 0.0
    steps = np.arange(t0, t1 + 1)
    idx = np.searchsorted(w["step"].to_numpy(), steps, side="right") - 1
    busy = np.append(w["value"].to_numpy() >= BUSY_WAIT, False)
    return float(busy[idx].mean())


def real_runs() -> dict[str, pd.DataFrame]:
    """The real runs' step-time and throughput series (incident excerpts excluded)."""
    from runwatch.detect.roles import role_of

    out = {}
    for path in sorted(REAL.glob("*.csv")):
        if path.stem.startswith("incident_"):
            continue
        df = pd.read_csv(path)
        keep = [m for m in df["metric"].unique() if role_of(m) in THROUGHPUT]
        if keep:
            out[path.stem] = df[df["metric"].isin(keep)][["step", "metric", "value"]]
    return out


# ---------------------------------------------------------------- measuring
def _episodes(df: pd.DataFrame):
    from runwatch.detect import analyze_frame

    return [a for a in analyze_frame(df) if a.detector == "regression"]


def _warn(a) -> bool:
    return a.severity in ("warning", "critical")


def _members(episodes: list) -> list | None:
    """Anomaly episodes as incident members (their labels, the empty ones left out); None
    for code that forms no incidents."""
    try:
        from runwatch.detect.incidents import Member
    except ImportError:
        return None
    return [
        Member("anomaly", i, a.detector, a.start_step, a.end_step, a.severity, a.metric,
               tuple(sorted((k, v) for k, v in a.labels.items() if v is not None)))
        for i, a in enumerate(episodes)
    ]  # fmt: skip


def _warning_incidents(episodes: list) -> int | None:
    """How many incidents the warning+ episodes of one run make (what a person is alerted
    about: one notification per incident); None for code that forms no incidents."""
    members = _members(episodes)
    if members is None:
        return None
    from runwatch.detect.incidents import form_incidents

    return sum(inc.severity != "info" for inc in form_incidents(members))


def false_alarms(runs: dict[str, pd.DataFrame], known=None) -> dict:
    warn = info = steps = 0
    incidents: int | None = 0
    where = []
    for run, df in runs.items():
        steps += int(df["step"].max() - df["step"].min()) + 1
        kept = []
        for a in _episodes(df):
            if known is not None and known(run, a.metric, a.start_step, a.end_step):
                continue
            kept.append(a)
            if _warn(a):
                warn += 1
                where.append(f"{run}:{a.metric}@{a.start_step}")
            else:
                info += 1
        found = _warning_incidents(kept)
        incidents = None if found is None or incidents is None else incidents + found
    per = 100_000 / max(steps, 1)
    return {"steps": steps, "warn": warn, "info": info, "warn_100k": warn * per,
            "info_100k": info * per, "where": where[:20], "incidents": incidents,
            "incidents_100k": None if incidents is None else incidents * per}  # fmt: skip


def inject(df: pd.DataFrame, factor: float, dur: int, rng: np.random.Generator, lo: int = 200):
    """A copy of ``df`` slowed by ``factor`` for ``dur`` steps from a random step: step times
    multiplied, throughputs divided. Returns the copy, the first and the last slowed step."""
    from runwatch.detect.roles import role_of

    steps = np.sort(df["step"].unique())
    t0 = int(steps[int(rng.integers(lo, steps.size - dur - 1))])
    t1 = int(steps[np.searchsorted(steps, t0) + dur - 1])
    out = df.copy()
    inside = (out["step"] >= t0) & (out["step"] <= t1)
    for m in out["metric"].unique():
        role = role_of(m)
        sel = inside & (out["metric"] == m)
        if role == "step_time":
            out.loc[sel, "value"] *= factor
        elif role == "throughput":
            out.loc[sel, "value"] /= factor
    return out, t0, t1


def _overlapping(eps, t0: int, t1: int) -> list:
    return [a for a in eps if a.start_step <= t1 and a.end_step >= t0]


def recall(runs: dict[str, pd.DataFrame], seed: int, repeats: int) -> dict:
    """Per slowdown kind: the share caught at warning+ and at any severity, the median
    delay at warning+ and how many trials were masked (the clean copy already had a
    warning+ episode over the slowdown's steps: those are left out of the warning+
    recall). Caught: an episode overlaps the slowdown that the clean copy has not (at that
    severity); its delay counts from the later of its start and the slowdown's.
    ``warn_quiet``: the warning+ recall of the slowdowns of which at most half landed on
    a busy host (``busy`` counts the others)."""
    rng = np.random.default_rng(seed)
    base = {run: _episodes(df) for run, df in runs.items()}
    res = {}
    for label, factor, dur in KINDS:
        warn = anyc = n = masked = busy = warn_quiet = 0
        delays = []
        for run, df in runs.items():
            if df["step"].nunique() < dur + 400:
                continue
            for _ in range(repeats):
                faulty, t0, t1 = inject(df, factor, dur, rng)
                eps = _overlapping(_episodes(faulty), t0, t1)
                clean = _overlapping(base[run], t0, t1)
                n += 1
                old = {(a.metric, a.start_step) for a in clean}
                anyc += any((a.metric, a.start_step) not in old or _warn(a) for a in eps)
                if any(_warn(a) for a in clean):
                    masked += 1
                    continue
                w = [a for a in eps if _warn(a)]
                on_busy = busy_wait(df, t0, t1) > 0.5
                busy += on_busy
                if w:
                    warn += 1
                    warn_quiet += not on_busy
                    delays.append(max(min(a.start_step for a in w), t0) - t0)
        res[label] = {"n": n, "masked": masked, "warn": warn / max(n - masked, 1),
                      "any": anyc / max(n, 1), "busy": busy,
                      "warn_quiet": warn_quiet / max(n - masked - busy, 1),
                      "delay": float(np.median(delays)) if delays else None}  # fmt: skip
    return res


def ddp_figures() -> dict:
    """On the real 10-rank trace: the ranks Regression warns about (per-rank step time),
    the ranks the fleet straggler detector names, with their episodes, and the ranks named
    by the warning incidents the two make together (None for code without incidents)."""
    from runwatch.detect import analyze_frame
    from runwatch.detect.fleet.stragglers import StragglerDetector

    df = pd.read_csv(ROOT / "bench" / "data" / "ddp10_straggler.csv")
    found = analyze_frame(df)
    warned = [a for a in found if _warn(a)]
    wide = df.pivot(index="step", columns="rank", values="value").sort_index()
    det = StragglerDetector()
    for step, row in wide.iterrows():
        det.update(int(step), row.to_numpy())
    det.finish()
    return {
        "regression_ranks": sorted({int(a.labels["rank"]) for a in warned}),
        "regression_episodes": len(warned),
        "straggler": [(int(e.labels["rank"]), e.start_step, e.end_step) for e in det.episodes],
        "incident_ranks": _incident_ranks([*found, *det.episodes], df["rank"].nunique()),
    }


def _incident_ranks(episodes: list, ranks: int) -> list[int] | None:
    """The ranks the warning+ incidents of ``episodes`` name (each a metric ``ranks``
    ranks report); None for code that forms no incidents."""
    members = _members(episodes)
    if members is None:
        return None
    from runwatch.detect.incidents import form_incidents

    try:
        incidents = form_incidents(members, ranks={"step_time": ranks})
    except TypeError:  # the first calibration's form_incidents knew no rank counts
        incidents = form_incidents(members)
    named = {
        int(dict(members[i].labels)["rank"])
        for inc in incidents
        if inc.severity != "info"
        for _, i in inc.members
        if "rank" in dict(members[i].labels)
    }
    return sorted(named)


def measure(seeds: list[int], repeats: int) -> dict:
    import runwatch.detect  # from PYTHONPATH, before detection.py puts this checkout first

    sys.path.insert(0, str(ROOT / "bench"))
    from detection import _alarm_is_known

    print(f"measuring {runwatch.detect.__file__}", file=sys.stderr)

    out: dict = {"ddp": ddp_figures(), "cpu": {}}
    for key, where, _ in CPU_SETS:
        runs = clean_runs(DATA / where)
        out["cpu"][key] = {
            "runs": len(runs),
            "clean": false_alarms(runs),
            "recall": {s: recall(runs, s, repeats) for s in seeds},
        }
    real = real_runs()
    out["real"] = false_alarms(real, _alarm_is_known)
    out["recall_real"] = {s: recall(real, s, repeats) for s in seeds}
    return out


def natural_slowdowns(runs: dict[str, pd.DataFrame], base: int = 256) -> dict[str, float]:
    """Per injected kind (factor, duration), how many stretches of the clean step times
    are already that slow: the median of ``duration`` steps at least ``factor`` x the
    median of the ``base`` steps before them (after the first 100 steps; overlapping
    windows counted once), per 100k steps. No detector is involved."""
    out = {}
    steps = 0
    counts = dict.fromkeys([k for k, _, _ in KINDS], 0)
    for df in runs.values():
        st = df[df["metric"] == "step_time_s"].sort_values("step")["value"]
        st = st.reset_index(drop=True)
        steps += len(st)
        for label, factor, dur in KINDS:
            now = st.rolling(dur).median()
            before = st.shift(dur).rolling(base).median()
            hit = (now >= factor * before).to_numpy().copy()
            hit[:100] = False
            counts[label] += int(np.sum(hit[1:] & ~hit[:-1]) + hit[0])
    for label in counts:
        out[label] = counts[label] * 100_000 / max(steps, 1)
    return out


# ---------------------------------------------------------------- the table
def _in(code: Path, seeds: list[int], repeats: int) -> dict:
    """``measure`` run in a subprocess that imports runwatch from ``code`` only."""
    env = dict(os.environ, PYTHONPATH=str(code))
    args = [sys.executable, __file__, "--measure", "--seeds", ",".join(map(str, seeds)),
            "--repeats", str(repeats)]  # fmt: skip
    # The data and the known events come from this checkout; the detectors from ``code``.
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _spread(xs: list[float]) -> str:
    lo, hi = min(xs), max(xs)
    return f"{np.mean(xs):.2f}" + ("" if lo == hi else f" ({lo:.2f}-{hi:.2f})")


def table(results: dict[str, dict]) -> str:
    rows = ["| figure | goal | " + " | ".join(results) + " |",
            "|---|---|" + "---|" * len(results)]  # fmt: skip

    def row(name, goal, f):
        rows.append(f"| {name} | {goal} | " + " | ".join(f(r) for r in results.values()) + " |")

    first = next(iter(results.values()))
    r = first["real"]
    for key, _, name in CPU_SETS:
        c = first["cpu"][key]
        row(
            f"warnings per 100k clean steps, {c['runs']} {name} ({c['clean']['steps']} steps)",
            "<= 1",
            lambda x, k=key: (
                f"{x['cpu'][k]['clean']['warn_100k']:.0f} ({x['cpu'][k]['clean']['warn']})"
            ),
        )
        row(
            "warning incidents per 100k, same runs (alerts: one per incident)",
            "<= 1",
            lambda x, k=key: (
                "no incidents"
                if x["cpu"][k]["clean"].get("incidents_100k") is None
                else f"{x['cpu'][k]['clean']['incidents_100k']:.0f} "
                f"({x['cpu'][k]['clean']['incidents']})"
            ),
        )
        row("info episodes per 100k, same runs", "-",
            lambda x, k=key: f"{x['cpu'][k]['clean']['info_100k']:.0f}")  # fmt: skip
    row(
        f"warnings per 100k steps, real GPU runs' step time ({r['steps']} steps)",
        "<= 1",
        lambda x: f"{x['real']['warn_100k']:.1f} ({x['real']['warn']})",
    )
    row(
        "10-rank CPU DDP trace: ranks with Regression warnings (episodes)",
        "only rank 3",
        lambda x: f"{x['ddp']['regression_ranks']} ({x['ddp']['regression_episodes']})",
    )
    row(
        "same trace: ranks named by warning incidents (alerted: one per incident)",
        "only rank 3",
        lambda x: (
            "no incidents"
            if x["ddp"].get("incident_ranks") is None
            else str(x["ddp"]["incident_ranks"])
        ),
    )
    row(
        "same trace: straggler episodes (rank, first, last); slowed 180-186 and 380-479",
        "rank 3, both",
        lambda x: " ".join(f"{r}:{a}-{b}" for r, a, b in x["ddp"]["straggler"]) or "none",
    )
    recalls = [(name, ("cpu", key)) for key, _, name in CPU_SETS]
    recalls.append(("real GPU runs", ("recall_real",)))

    def rec(x, path):
        return x["cpu"][path[1]]["recall"] if path[0] == "cpu" else x[path[0]]

    for where, key in recalls:
        for label, _, _ in KINDS:
            seeds = rec(first, key)
            n = seeds[next(iter(seeds))][label]["n"]
            if key[0] == "cpu" and key[1] != "no_wait":
                row(
                    f"recall {label}, {where}, warning+, slowdowns not on a busy host",
                    ">= 0.95",
                    lambda x, k=key, lb=label: _spread(
                        [v[lb].get("warn_quiet", v[lb]["warn"]) for v in rec(x, k).values()]
                    ),
                )
                row(
                    f"slowdowns {label} on a busy host, {where} (per seed)",
                    "-",
                    lambda x, k=key, lb=label: _spread(
                        [float(v[lb].get("busy", 0)) for v in rec(x, k).values()]
                    ),
                )
            for sev in ("warn", "any"):
                row(
                    f"recall {label}, {where}, {'warning+' if sev == 'warn' else 'any severity'}"
                    f" ({n} per seed)",
                    ">= 0.95" if sev == "warn" else "-",
                    lambda x, k=key, lb=label, s=sev: _spread(
                        [v[lb][s] for v in rec(x, k).values()]
                    ),
                )
            row(
                f"median delay {label}, {where}, warning+ (steps)",
                "-",
                lambda x, k=key, lb=label: _spread(
                    [v[lb]["delay"] for v in rec(x, k).values() if v[lb]["delay"] is not None]
                    or [float("nan")]
                ),
            )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--before",
        default="/tmp/wt-before,/tmp/wt-landed",
        help="older checkouts, comma-separated (each labelled by its commit)",
    )
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--repeats", type=int, default=3, help="slowdowns per run, kind and seed")
    p.add_argument("--export", metavar="DB", help="export the clean tiny-LM runs of DB")
    p.add_argument("--to", default=str(CLEAN), help="where --export writes (a CPU_SETS dir)")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.export:
        print("\n".join(export(args.export, Path(args.to))))
        return 0
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.measure:
        print(json.dumps(measure(seeds, args.repeats)))
        return 0
    results = {}
    for before in args.before.split(","):
        if not Path(before, "runwatch").is_dir():
            print(f"no older checkout at {before}: no anchor from it", file=sys.stderr)
            continue
        rev = subprocess.run(["git", "-C", before, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
        results[f"before ({rev})"] = _in(Path(before), seeds, args.repeats)
    results["after"] = _in(ROOT, seeds, args.repeats)
    print(table(results))
    for _, where, name in CPU_SETS:
        nat = natural_slowdowns(clean_runs(DATA / where))
        print(
            f"\nnatural slowdowns already in the {name}, per 100k steps (a"
            " median of the kind's duration at least its factor x the median of the 256"
            " steps before): " + ", ".join(f"{k} {v:.0f}" for k, v in nat.items())
        )
    for name, res in results.items():
        for key, _, what in CPU_SETS:
            print(f"\n{name}: warnings on the {what} at {res['cpu'][key]['clean']['where']}")
        print(f"{name}: real-run warnings at {res['real']['where']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
