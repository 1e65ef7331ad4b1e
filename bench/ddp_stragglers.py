"""Straggler figures of issue 25 on real torchrun DDP jobs (3 ranks, gloo, the CPU).

    python bench/ddp_stragglers.py [--trials 3] [--steps 250] [--out FILE.md] [--fsdp]

Each trial is one ``torchrun --nproc_per_node 3 tests/torch/ddp_job.py`` job: the user logs
``loss`` and the wall ``step_time`` as the README shows, plus the one line
``runwatch.torch.instrument(model)``. Cases, seeded (trial t slows rank t mod 3):

- ``+50%`` / ``+10%``: one rank's own time (its device's share) grows by that much from step
  100. Named = a straggler episode on that rank opened by step 150 (within 50 steps).
- ``all +100%``: every rank's device takes 100% of the 10 ms device time more from step 100
  (the same on every rank): the per-series Monitor's
  step-time episodes over the three ranks (``analyze_run`` on each rank's store), before and
  after ``merge_job_wide``; one finding per metric is the goal.
- ``none``: no rank slowed.

Healthy ranks accused counts straggler episodes that name a rank that was not slowed, in
every trial (warm-up included). The cost is measured in the same runs: the hook's own time
(``StepTimer.overhead_s`` + ``done_overhead_s``) over the rank's summed wall step time.
The per-rank medians of own time and wait before and after step 100 are printed per trial.

``--fsdp`` runs the same one-rank and clean cases on ``tests/torch/ddp_job.py --fsdp`` (the
model sharded with FSDP2's ``fully_shard``; wait = time blocked in its all-gathers and
reduce-scatters) and writes ``bench/results/fsdp_stragglers.md``; it has no all-ranks case.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import runwatch  # noqa: E402
from runwatch.detect.fleet.jobwide import merge_job_wide  # noqa: E402
from runwatch.detect.fleet.monitor import fleet_anomalies  # noqa: E402
from runwatch.pipeline.analysis import analyze_run  # noqa: E402

JOB = ROOT / "tests" / "torch" / "ddp_job.py"
JOBS = {"ddp": ("ddp-job", []), "fsdp": ("fsdp-job", ["--fsdp"])}  # run name, job flags
TORCHRUN = Path(sys.executable).with_name("torchrun")
FROM = 100
WITHIN = 50
RANKS = 3


def run_trial(case: str, trial: int, steps: int, base: Path, kind: str = "ddp") -> dict:
    name, flags = JOBS[kind]
    out = base / f"{case.replace(' ', '_').replace('%', 'pc').replace('+', '')}-{trial}"
    out.mkdir(parents=True)
    slow = trial % RANKS
    args = ["--steps", str(steps), "--seed", str(trial), "--from-step", str(FROM)]
    if case in ("+50%", "+10%"):
        args += ["--slow", str(slow), "--factor", "0.5" if case == "+50%" else "0.1"]
    elif case == "all +100%":
        args += ["--all", "--factor", "1.0"]
    began = time.perf_counter()
    proc = subprocess.run(
        [
            str(TORCHRUN),
            "--standalone",
            "--nproc_per_node",
            str(RANKS),
            str(JOB),
            *flags,
            "--out",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"{case} trial {trial} failed:\n{proc.stderr[-2000:]}")
    pts = pd.concat(
        [
            runwatch.open_store(str(out / f"rank{r}.db"), readonly=True).read_points(name)
            for r in range(RANKS)
        ],
        ignore_index=True,
    )
    slowed = {slow} if case in ("+50%", "+10%") else set()
    stragglers = [a for a in fleet_anomalies(pts) if a.detector == "straggler"]
    named = [
        a
        for a in stragglers
        if a.labels.get("rank") in slowed and FROM <= a.details["detected_at"] <= FROM + WITHIN
    ]
    accused = [a for a in stragglers if a.labels.get("rank") not in slowed and case != "all +100%"]
    accused_all = [a for a in stragglers if a.labels.get("rank") not in slowed]
    row = {
        "case": case,
        "trial": trial,
        "slow_rank": sorted(slowed),
        "wall_s": wall,
        "named": bool(named),
        "delay": (min(a.details["detected_at"] for a in named) - FROM) if named else None,
        "accused": [(a.labels["rank"], a.start_step, a.details["detected_at"]) for a in accused],
        "accused_n": len(accused_all),
        "episodes": [(a.labels.get("rank"), a.details["detected_at"]) for a in stragglers],
        "signals": sorted({a.details.get("signal") for a in stragglers}),
        "wait_agrees": [a.details.get("wait_agrees") for a in named],
    }
    for metric, col in (
        ("step_time_compute", "own"),
        ("comm_wait_time", "wait"),
        ("step_time", "wall"),
    ):
        rows = pts[pts["metric"] == metric]
        before = rows[rows["step"].between(20, FROM - 1)].groupby("rank")["value"].median()
        after = rows[rows["step"] >= FROM + 10].groupby("rank")["value"].median()
        row[col] = (
            [round(1000 * float(before.get(r, float("nan"))), 2) for r in range(RANKS)],
            [round(1000 * float(after.get(r, float("nan"))), 2) for r in range(RANKS)],
        )
    if case == "all +100%":
        per_rank = []
        for r in range(RANKS):
            store = runwatch.open_store(str(out / f"rank{r}.db"))
            per_rank += [
                a
                for a in analyze_run(store, name, save=False).anomalies
                if a.metric in ("step_time", "step_time_compute")
            ]
        merged = merge_job_wide(per_rank, ranks=RANKS)
        row["episodes_before"] = len(per_rank)
        row["findings_after"] = len(merged)
        row["job_wide"] = [(a.detector, a.metric, a.details.get("ranks")) for a in merged]
    costs = []
    for r in range(RANKS):
        info = json.loads((out / f"rank{r}.json").read_text())
        costs.append(info["overhead_s"] / sum(info["step_time"]))
    row["cost"] = max(costs)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="default 250 (DDP), 200 (FSDP)")
    p.add_argument("--fsdp", action="store_true", help="the FSDP2 job, not DDP")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    kind = "fsdp" if args.fsdp else "ddp"
    args.steps = args.steps or (200 if args.fsdp else 250)
    args.out = args.out or str(ROOT / "bench" / "results" / f"{kind}_stragglers.md")
    cases = [("+50%", args.trials), ("+10%", args.trials), ("all +100%", 2), ("none", 2)]
    if args.fsdp:  # an FSDP step is ~4x a DDP step here: the one-rank cases and clean
        cases.remove(("all +100%", 2))
    rows = []
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for case, n in cases:
            for t in range(n):
                row = run_trial(case, t, args.steps, Path(tmp), kind)
                rows.append(row)
                print(json.dumps(row), flush=True)
    total = time.perf_counter() - began
    text = report(rows, args, total, kind)
    Path(args.out).write_text(text)
    print(text)
    return 0


def report(rows: list[dict], args: argparse.Namespace, total: float, kind: str = "ddp") -> str:
    def share(case: str) -> str:
        rs = [r for r in rows if r["case"] == case]
        hit = [r for r in rs if r["named"]]
        delays = ", ".join(str(r["delay"]) for r in hit) or "-"
        return f"{len(hit)}/{len(rs)} (delays {delays} steps)"

    accused = sum(r["accused_n"] for r in rows if r["case"] != "all +100%")
    accused_all = sum(r["accused_n"] for r in rows if r["case"] == "all +100%")
    jw = [r for r in rows if r["case"] == "all +100%"]
    cost = max(r["cost"] for r in rows)
    title = "FSDP2 (fully_shard)" if kind == "fsdp" else "DDP"
    flag = " --fsdp" if kind == "fsdp" else ""
    lines = [
        f"# {title} stragglers (issue 25): real torchrun, 3 ranks, gloo, CPU",
        "",
        f"`python bench/ddp_stragglers.py{flag} --trials {args.trials} --steps {args.steps}`, "
        f"{time.strftime('%Y-%m-%d')}, {total:.0f} s in all. See bench/README-stragglers.md.",
        "",
        "| figure | goal | measured |",
        "|---|---|---|",
        f"| slowed rank named within {WITHIN} steps, +50% own time | >= 95% | {share('+50%')} |",
        f"| slowed rank named within {WITHIN} steps, +10% own time | >= 95% | {share('+10%')} |",
        f"| healthy ranks accused (one-rank and clean trials) | 0 | {accused} |",
    ]
    if jw:
        lines += [
            f"| stragglers named when all ranks slowed | 0 | {accused_all} |",
            "| job-wide slowdown: per-rank step-time episodes -> findings after merge | one "
            "per metric | "
            + "; ".join(f"{r['episodes_before']} -> {r['findings_after']}" for r in jw)
            + " |",
        ]
    lines += [
        f"| hook cost per step (its own time / wall step time, worst rank) | <= 1% | {cost:.3%} |",
        "",
        "## Trials",
        "",
        "| case | trial | slow rank | named (delay) | accused (rank, onset, detected) | "
        "own ms before -> after | wait ms before -> after | wall ms after | cost | "
        "every straggler episode (rank, detected at) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['trial']} | {r['slow_rank'] or '-'} | "
            f"{'yes (' + str(r['delay']) + ')' if r['named'] else 'no'} | "
            f"{r['accused'] or '-'} | {r['own'][0]} -> {r['own'][1]} | "
            f"{r['wait'][0]} -> {r['wait'][1]} | {r['wall'][1]} | {r['cost']:.3%} | "
            f"{r['episodes'] or '-'} |"
        )
    if jw:
        lines += ["", "Job-wide findings after the merge:", ""]
        for r in jw:
            lines.append(f"- trial {r['trial']}: {r['job_wide']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
