"""The figures of issue 17 (incidents), each against the code before the change, in one run.

    python bench/incidents.py [PART ...] [--quick] [--before /tmp/wt-before] [--repeats N]

PART is any of ``real scenario alerts detection replay`` (default: all); each runs alone.
``--before`` is a worktree of 8ca7193 (before incidents), built in place
(``git worktree add --detach /tmp/wt-before 8ca7193 && cd /tmp/wt-before &&
python setup.py build_ext --inplace``). Every figure runs with DEFAULT settings.

- ``real``: the healthy real runs mng_llmc_gpt2_124m, mng_adamw_gpt2_124m and
  mlm_gpt3_15b_a100: ``runwatch import`` + ``runwatch analyze`` in each tree; open incidents
  (this tree; goal <= 10 per run) against the anomaly episodes (both trees; the code before
  has no incidents).
- ``scenario``: ``bench/scenarios/multi_restart.py`` (16 ranks, 4 hosts, ~20k steps, many
  restarts, crashes from a data bug, a failing host and a flaky link) imported and analyzed;
  per cause, whether one incident holds all its crashes and its top hypothesis is the
  cause (shard=s17; host=n2; hosts n1 and n3 the top two), and crash incidents against the
  3 crash signatures the scenario has. The code before cannot import events or context:
  it gets the points only (its anomaly episodes are counted; its incidents are none).
- ``alerts``: ``bench/alert_latency.py`` (NaN -> webhook, default rules), both trees.
- ``detection``: ``bench/detection.py`` recall (runwatch(any), per fault kind) and false
  alarms per 100k steps, both trees.
- ``replay``: ``bench/replay_against.py --before`` (batch replay throughput, interleaved).

Timing figures are repeated (``--repeats``, default 3; 1 with ``--quick``) and reported as
median and range: the machine has 2 shared, noisy cores. ``--quick`` also uses the small
scenario, 5 alert trials and ``detection.py --quick``. Logs of the sub-benches go to
``--logs`` (default /tmp/bench-incidents).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "real_runs"
"""As bench/detection.py and replay_against.py find it: a worktree in /tmp needs /tmp/shared."""
REAL_RUNS = ("mng_llmc_gpt2_124m", "mng_adamw_gpt2_124m", "mlm_gpt3_15b_a100")
PARTS = ("real", "scenario", "alerts", "detection", "replay")
CRASH_KINDS = ("crash", "oom", "nccl_timeout", "hang", "xid")
"""Event kinds that end (or hang) a process: an incident holding one is a crash incident."""

# Run runwatch's command line from a given tree (the tree's own package, asserted).
CLI = (
    "import sys; sys.path.insert(0, sys.argv[1]); import runwatch; "
    "assert runwatch.__file__.startswith(sys.argv[1]), runwatch.__file__; "
    "from runwatch.cli import main; sys.exit(main(sys.argv[2:]))"
)
COUNT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from runwatch.store import open_store
store = open_store(sys.argv[2], readonly=True)
out = {}
for run in sys.argv[3:]:
    a = store.anomalies(run, source="replay")
    rec = {"episodes": len(a), "warn+": int((a["severity"] != "info").sum())}
    if hasattr(store, "incidents"):
        inc = store.incidents(run, source="replay")
        rec["incidents"] = len(inc)
        rec["open"] = int((inc["status"] == "open").sum())
        rec["open_warn+"] = int(((inc["status"] == "open") & (inc["severity"] != "info")).sum())
    out[run] = rec
print(json.dumps(out))
"""


def _py() -> str:
    return sys.executable


def _sh(args: list[str], log: Path, cwd: Path | None = None) -> str:
    """Run ``args``, keep its output in ``log``, fail loudly with the log's tail."""
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, cwd=cwd, check=False)
    log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode not in (0, 1):  # analyze exits 1 when anomalies are at --fail-on
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise RuntimeError(f"{' '.join(map(str, args))} exited {proc.returncode}:\n{tail}")
    print(f"    {log.name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return proc.stdout


def cli(tree: Path, args: list[str], log: Path) -> str:
    return _sh([_py(), "-c", CLI, str(tree), *args], log)


def import_and_analyze(tree: Path, src: Path, db: Path, run: str, logs: Path, tag: str) -> None:
    cli(tree, ["import", str(src), "--db", str(db), "--run", run], logs / f"{tag}-import.log")
    cli(tree, ["analyze", "--db", str(db), "--run", run], logs / f"{tag}-analyze.log")


def counts(tree: Path, db: Path, runs: list[str], logs: Path, tag: str) -> dict[str, Any]:
    out = _sh([_py(), "-c", COUNT, str(tree), str(db), *runs], logs / f"{tag}-count.log")
    return json.loads(out.splitlines()[-1])


# ------------------------------------------------------------------ real runs
def bench_real(args: argparse.Namespace, tmp: Path) -> list[tuple[str, str, str, str]]:
    rows = []
    for run in REAL_RUNS:
        src = args.data / f"{run}.csv"
        got = {}
        for name, tree in (("before", args.before), ("after", ROOT)):
            db = tmp / f"real-{name}-{run}.db"
            import_and_analyze(tree, src, db, run, args.logs, f"real-{name}-{run}")
            got[name] = counts(tree, db, [run], args.logs, f"real-{name}-{run}")[run]
        a, b = got["after"], got["before"]
        measured = (
            f"{a['open']} open incidents ({a['open_warn+']} warning+) of {a['episodes']} episodes; "
            f"before: {b['episodes']} episodes ({b['warn+']} warning+), no incidents"
        )
        rows.append((f"open incidents, healthy {run}", "<= 10", measured, _met(a["open"] <= 10)))
    return rows


# ------------------------------------------------------------------ the scenario
def bench_scenario(args: argparse.Namespace, tmp: Path) -> list[tuple[str, str, str, str]]:
    src, truth_path = tmp / "multi_restart.jsonl", tmp / "multi_restart.truth.json"
    gen = [_py(), str(ROOT / "bench" / "scenarios" / "multi_restart.py"), str(src)]
    gen += ["--truth", str(truth_path)] + (["--small"] if args.quick else [])
    _sh(gen, args.logs / "scenario-generate.log")
    truth = json.loads(truth_path.read_text())
    run = truth["run"]
    db = tmp / "scenario-after.db"
    import_and_analyze(ROOT, src, db, run, args.logs, "scenario-after")
    found = judge_scenario(db, truth)
    (args.logs / "scenario-incidents.json").write_text(json.dumps(found, indent=1, default=str))

    # The code before reads points only: give it the file without events and context.
    points = tmp / "multi_restart.points.jsonl"
    with src.open() as fin, points.open("w") as fout:
        fout.writelines(line for line in fin if '"metric"' in line)
    db_before = tmp / "scenario-before.db"
    import_and_analyze(args.before, points, db_before, run, args.logs, "scenario-before")
    before = counts(args.before, db_before, [run], args.logs, "scenario-before")[run]

    rows = []
    anchor = f"before: no incidents ({before['episodes']} episodes, points only)"
    for cause, res in found["causes"].items():
        rows.append(
            (
                f"scenario {cause}: top hypothesis",
                " and ".join(res["expected_top"]) + " first, in one incident",
                f"{res['incidents']} incident(s) hold its {res['crashes']} crashes; top: "
                f"{', '.join(res['top']) or 'none'}; {anchor}",
                _met(res["met"]),
            )
        )
    # The documented context row has no rank: the same scenario with run-wide rows.
    wide, wide_truth = tmp / "multi_restart.wide.jsonl", tmp / "multi_restart.wide.truth.json"
    gen_wide = [*gen[:2], str(wide), "--truth", str(wide_truth), "--context-rank", "none"]
    _sh(gen_wide + (["--small"] if args.quick else []), args.logs / "scenario-wide-generate.log")
    db_wide = tmp / "scenario-wide.db"
    import_and_analyze(ROOT, wide, db_wide, run, args.logs, "scenario-wide")
    res = judge_scenario(db_wide, json.loads(wide_truth.read_text()))["causes"]["data_bug"]
    rows.append(
        (
            "scenario data_bug, run-wide context rows (no rank)",
            "shard=s17 first, in one incident",
            f"{res['incidents']} incident(s) hold its {res['crashes']} crashes; top: "
            f"{', '.join(res['top']) or 'none'}",
            _met(res["met"]),
        )
    )
    n_sig = found["crash_signatures"]
    rows.append(
        (
            "scenario crash incidents",
            f"= crash signatures ({n_sig})",
            f"{found['crash_incidents']} crash incidents of {found['incidents']} "
            f"({found['open']} open); runwatch's signatures of the crash events: "
            f"{found['runwatch_signatures']}; {anchor}",
            _met(found["crash_incidents"] == n_sig),
        )
    )
    return rows


def judge_scenario(db: Path, truth: dict[str, Any]) -> dict[str, Any]:
    """Per cause: which incidents hold its crash events, and their top hypotheses."""
    sys.path.insert(0, str(ROOT))
    from runwatch.detect.fingerprint import signature
    from runwatch.store import open_store

    with open_store(db, readonly=True) as store:
        run = truth["run"]
        incidents = store.incidents(run, source="replay")
        members = {int(i): store.incident_members(int(i)) for i in incidents["id"]}
        events = store.events(run, kinds=list(CRASH_KINDS))
    crash_ids = [
        i
        for i, m in members.items()
        if ((m["kind"] == "event") & m["what"].isin(CRASH_KINDS)).any()
    ]
    out: dict[str, Any] = {
        "incidents": len(incidents),
        "open": int((incidents["status"] == "open").sum()),
        "crash_incidents": len(crash_ids),
        # Each cause prints one message text with its numbers, ids and ends varying:
        # one signature per cause, by construction of the scenario.
        "crash_signatures": len(truth["causes"]),
        # What runwatch's fingerprint makes of the crash events (one per cause is right).
        "runwatch_signatures": len({signature(m or "") for m in events["message"]}),
        "causes": {},
        "crash_incident_titles": [
            str(incidents.loc[incidents["id"] == i, "title"].iloc[0]) for i in crash_ids
        ],
    }
    for cause, spec in truth["causes"].items():
        steps = {c["step"] for c in spec["crashes"]}
        holding = []
        for i in crash_ids:
            m = members[i]
            ev = m[(m["kind"] == "event") & m["what"].isin(CRASH_KINDS)]
            hit = int(ev["step"].isin(steps).sum())
            if hit:
                holding.append((i, hit))
        want = spec["expected_top"]
        tops: list[str] = []
        if len(holding) == 1:
            (i, _), *_ = holding
            hyps = incidents.loc[incidents["id"] == i, "hypotheses"].iloc[0]
            tops = [h["cause"] for h in (hyps if isinstance(hyps, list) else [])][: len(want)]
        else:
            for i, _ in holding:
                hyps = incidents.loc[incidents["id"] == i, "hypotheses"].iloc[0]
                first = hyps[0]["cause"] if isinstance(hyps, list) and hyps else "none"
                tops.append(f"#{i}: {first}")
        out["causes"][cause] = {
            "crashes": len(spec["crashes"]),
            "incidents": len(holding),
            "holding": holding,
            "expected_top": want,
            "top": tops,
            "met": len(holding) == 1 and sorted(tops) == sorted(want),
        }
    return out


# ------------------------------------------------------------------ other benches
def bench_alerts(args: argparse.Namespace, tmp: Path) -> list[tuple[str, str, str, str]]:
    """Each repeat runs both trees (alternating which goes first); the p99 is over all
    trials of a tree, with the range of the per-repeat p99s beside it."""
    import numpy as np

    trials = "5" if args.quick else "20"
    repeats = 1 if args.quick else args.repeats
    trees = {"after": ROOT, "before": args.before}
    lat: dict[str, list[float]] = {"after": [], "before": []}
    p99s: dict[str, list[float]] = {"after": [], "before": []}
    missed = {"after": 0, "before": 0}
    for r in range(repeats):
        for name in ("after", "before") if r % 2 == 0 else ("before", "after"):
            cmd = [_py(), str(ROOT / "bench" / "alert_latency.py"), "--trials", trials]
            cmd += ["--no-storm", "--root", str(trees[name]), "--label", name, "--seed", str(r)]
            out = _sh(cmd, args.logs / f"alerts-{name}-{r}.log")
            got = [float(m.group(1)) for m in re.finditer(r"trial \d+: ([\d.]+) s", out)]
            missed[name] += len(re.findall(r"trial \d+: None", out))
            lat[name] += got
            p99s[name].append(float(np.percentile(got, 99)))

    def text(name: str) -> str:
        a = np.array(lat[name])
        return (
            f"p99 {np.percentile(a, 99):.3f} s (per repeat {min(p99s[name]):.3f}-"
            f"{max(p99s[name]):.3f}), p50 {np.median(a):.3f} s, {len(a)} trials, "
            f"{missed[name]} missed"
        )

    measured = f"{text('after')}; before: {text('before')}"
    ok = float(np.percentile(lat["after"], 99)) <= 1.0 and not missed["after"]
    return [("NaN -> webhook p99, default rules", "<= 1 s", measured, _met(ok))]


_FA = re.compile(r"false alarms per 100k steps, (held-in|held-out): ours ([\d.]+)")


def _detection(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [_py(), str(tree / "bench" / "detection.py")] + (["--quick"] if args.quick else [])
    cmd += ["--data", str(args.data)]
    out = _sh(cmd, args.logs / f"detection-{tree.name}.log", cwd=tree)
    got: dict[str, Any] = {"fa": {}, "recall": {}}
    section = ""
    for line in out.splitlines():
        if m := _FA.search(line):
            got["fa"][m.group(1)] = float(m.group(2))
        if line.startswith("== injected faults, "):
            section = "held-out" if "held-out" in line else "held-in"
        parts = line.split()
        if section and len(parts) >= 4 and parts[1] == "runwatch(any)":
            got["recall"][(section, parts[0])] = float(parts[3])
    return got


def bench_detection(args: argparse.Namespace, tmp: Path) -> list[tuple[str, str, str, str]]:
    after, before = _detection(ROOT, args), _detection(args.before, args)
    worse = [
        f"{s} {k} {before['recall'][(s, k)]:.2f}->{r:.2f}"
        for (s, k), r in after["recall"].items()
        if (s, k) in before["recall"] and r < before["recall"][(s, k)]
    ]
    mean = statistics.mean(after["recall"].values())
    mean_b = statistics.mean(before["recall"].values())
    recall = (
        f"mean over {len(after['recall'])} fault kinds {mean:.3f} (before {mean_b:.3f}); "
        f"lower: {', '.join(worse) or 'none'}"
    )
    fa = ", ".join(
        f"{k} {v:.2f} (before {before['fa'].get(k, float('nan')):.2f})"
        for k, v in after["fa"].items()
    )
    fa_worse = any(v > before["fa"].get(k, v) for k, v in after["fa"].items())
    return [
        ("detection.py recall, runwatch(any)", "no worse", recall, _met(not worse)),
        ("detection.py false alarms /100k steps", "no worse", fa, _met(not fa_worse)),
    ]


_RATE = re.compile(r"^(before|after)\s+cpu\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)")


def bench_replay(args: argparse.Namespace, tmp: Path) -> list[tuple[str, str, str, str]]:
    repeats = "1" if args.quick else str(args.repeats)
    cmd = [_py(), str(ROOT / "bench" / "replay_against.py"), "--before", str(args.before)]
    out = _sh([*cmd, "--repeats", repeats], args.logs / "replay.log")
    rates = {}
    for line in out.splitlines():
        if m := _RATE.match(line):
            rates[m.group(1)] = [int(g.replace(",", "")) for g in m.groups()[1:]]
    same = "identical to before on every run: True" in out
    a, b = rates["after"], rates["before"]
    measured = (
        f"{a[0] / 1e6:.2f}M pts/s CPU (range {a[1] / 1e6:.2f}-{a[2] / 1e6:.2f}M, {repeats} "
        f"repeats); before {b[0] / 1e6:.2f}M ({b[1] / 1e6:.2f}-{b[2] / 1e6:.2f}M); "
        f"x{a[0] / b[0]:.2f}; same episodes: {same}"
    )
    # "No worse" within the noise: the ranges of the two trees overlap, or after is faster.
    ok = a[0] >= b[0] or a[2] >= b[1]
    return [("replay throughput", "no worse", measured, _met(ok))]


def _met(ok: bool) -> str:
    return "yes" if ok else "NO"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("parts", nargs="*", metavar="PART", help=f"{', '.join(PARTS)} (default: all)")
    ap.add_argument("--quick", action="store_true", help="small scenario, fewer trials")
    ap.add_argument("--before", type=Path, default=Path("/tmp/wt-before"))
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--repeats", type=int, default=3, help="repeats of timing figures")
    ap.add_argument("--logs", type=Path, default=Path("/tmp/bench-incidents"))
    args = ap.parse_args(argv)
    parts = args.parts or list(PARTS)
    if unknown := [p for p in parts if p not in PARTS]:
        ap.error(f"unknown part {', '.join(unknown)}; parts: {', '.join(PARTS)}")
    args.before = args.before.resolve()
    if not (args.before / "runwatch").is_dir():
        ap.error(f"--before {args.before} is no checkout of runwatch (see the docstring)")
    if not args.data.is_dir():
        ap.error(f"--data {args.data} is not a directory")
    args.logs.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    rows: list[tuple[str, str, str, str]] = []
    benches = {
        "real": bench_real,
        "scenario": bench_scenario,
        "alerts": bench_alerts,
        "detection": bench_detection,
        "replay": bench_replay,
    }
    with tempfile.TemporaryDirectory(prefix="bench-incidents-") as tmp:
        for part in parts:
            print(f"== {part}", file=sys.stderr, flush=True)
            rows += benches[part](args, Path(tmp))
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"bench/incidents.py {' '.join(parts)}{' --quick' if args.quick else ''}: {when}")
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout.strip()
    state = "with uncommitted changes" if dirty else "clean"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"this tree {commit} ({state}), before {args.before}; load {load}")
    print("| figure | goal | measured | met |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
