"""Benchmark: what ``run.log`` costs at training cadence, not in a tight loop (issue 23).

A training loop calls the hook once per step, after milliseconds of other work, so every
call runs on cold caches, and whatever the call sets off in other threads (a writer woken
per put) competes with the next step for the GIL. Measured here, each in a fresh process:

- per call of 4 scalars, median and p99, after 10 ms busy (a CPU-bound step), 30 ms sleep
  (a GPU-bound step waiting in a sync) and 1 ms busy; contenders interleaved step by step
  in one process: a bare ``SimpleQueue.put((step, time.time(), d.copy()))`` (the floor),
  ``run.log``, the HF ``RunwatchCallback.on_log`` and the Lightning ``RunwatchLogger``
  ``.log_metrics`` (both wrap the same run, so one writer thread serves the process);
- the same back to back (the tight-loop figure the README used to give alone);
- the wall time logging adds per step to a loop that holds the GIL (a fixed amount of
  Python work, about 1 ms a step): blocks of steps with ``run.log``, with a bare put and
  with nothing, interleaved, every block building the same dict (only the call differs);
  added = (block - block without logging) / steps, median over block pairs. A 0.15 s idle
  gap after each block (untimed) lets the writer finish, so a block's leftover is not
  charged to the next one; the leftover (at most one tick's work) is not charged at all, a
  small underestimate for both versions. Beside it, the CPU time runwatch's own threads
  (writer, live detection, samplers) spend per logged step over the same blocks and gaps:
  an upper bound of the GIL they can take from the loop, and far steadier than the wall
  time on a shared machine (their I/O and compression run without the GIL);
- anchors: the hook before this change (a git worktree of the previous commit, ``--before``),
  wandb offline ``log`` and tensorboardX's 4 ``add_scalar``, after 10 ms busy, each with its
  own interleaved bare put.

Every version runs ``--repeats`` times in alternation; the spread is printed.

    python bench/hook_cadence.py [--before /tmp/hook_before] [--repeats 2] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "hook_cadence.md"
PAUSES = (
    ("10 ms busy", "busy", 0.010),
    ("30 ms sleep", "sleep", 0.030),
    ("1 ms busy", "busy", 0.001),
)


def values(i: int) -> dict[str, float]:
    """What a training loop logs at step ``i``: a falling loss and a grad norm with their
    step-to-step noise (deterministic), a constant LR, a throughput. The values follow the
    step across the bench's phases, as a run's curve does: values that jump back or stay
    exactly constant make detection flag and grow episodes on every point, a cost no
    healthy run has."""
    noise = math.sin(i * 12.9898) * 43758.5453 % 1.0 - 0.5  # uniform in [-0.5, 0.5)
    return {
        "loss": (2.0 + 9.0 * (i + 50.0) ** -0.4) * (1.0 + 0.02 * noise),
        "grad_norm": 0.8 + 0.1 * noise,
        "lr": 3e-4,
        "tokens_per_s": 250_000.0 * (1.0 + 0.01 * noise),
    }


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def pause(kind: str, seconds: float) -> None:
    if kind == "busy":
        busy(seconds)
    else:
        time.sleep(seconds)


STALL_NS = 50_000
"""A call this slow met one of the machine's stalls (bench/README-hook-cadence.md, "The
machine's stalls"): about 140 µs, some 14 times a second, on whatever runs first after a
pause, a bare put as much as ``run.log``."""


def stats_us(ns: list[int]) -> dict[str, float]:
    ordered = sorted(ns)
    n = len(ordered)
    return {
        "median": ordered[n // 2] / 1e3,
        "p99": ordered[min(n - 1, int(n * 0.99))] / 1e3,
        "stalled %": 100.0 * sum(1 for x in ordered if x > STALL_NS) / n,
        "n": n,
    }


def schedstat(tid: int | None = None) -> tuple[float, float]:
    """A thread's (default: this one's) seconds on a CPU and seconds runnable but waiting
    for one (Linux scheduler statistics)."""
    tid = threading.get_native_id() if tid is None else tid
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        on_cpu, waiting, _ = f.read().split()
    return int(on_cpu) / 1e9, int(waiting) / 1e9


CHILD = "live detection process (a child; takes no GIL)"
IN_THREAD = "this change, detection in a thread"
"""A version: this checkout with ``RUNWATCH_LIVE_DETECTION=thread`` (the place before)."""


def background_cpu() -> dict[str, float]:
    """Seconds on a CPU so far of each of runwatch's own threads in this process (the
    writer, live detection, samplers): an upper bound of the GIL they can take from the
    loop. Under ``CHILD``, the CPU of this process's children (live detection's process
    since 2026-11-27), which the machine spends but the loop does not wait for."""
    found: dict[str, float] = {}  # two runs have two writers: summed by name
    for t in threading.enumerate():
        if t.name.startswith("runwatch") and t.native_id is not None:
            found[t.name] = found.get(t.name, 0.0) + schedstat(t.native_id)[0]
    children = 0.0
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            for child in f.read().split():
                for thread in os.listdir(f"/proc/{child}/task"):
                    with open(f"/proc/{child}/task/{thread}/schedstat") as g:
                        children += int(g.read().split()[0]) / 1e9
    if children:
        found[CHILD] = children
    return found


def calibrate_work(target_s: float = 0.001) -> int:
    """Iterations of a pure-Python loop (holds the GIL) that take about ``target_s``."""
    n = 10_000
    while True:
        t = time.perf_counter()
        work(n)
        took = time.perf_counter() - t
        if took > 0.02:
            return max(1, int(n * target_s / took))
        n *= 2


def work(n: int) -> int:
    """``n`` rounds of Python that hold the GIL and allocate nothing. A loop that allocated
    (``x += i`` over a range makes two ints a round) ran 3-4% faster in blocks that also kept
    a bare put's dicts alive: pymalloc's pools, not logging, set its speed, and the wall
    estimator read that as 30-40 µs per step (bench/README-hook-cadence.md)."""
    x = 0
    for _ in itertools.repeat(None, n):
        x = x ^ 1
    return x


# -- the child processes -------------------------------------------------------------------
def child_runwatch(src: str, steps: dict[str, int], blocks: int, block_steps: int) -> dict:
    sys.path.insert(0, src)
    import runwatch

    assert runwatch.__file__.startswith(src), runwatch.__file__
    from runwatch.integrations.hf import RunwatchCallback
    from runwatch.integrations.lightning import RunwatchLogger

    tmp = tempfile.mkdtemp(prefix="hook_cadence_")
    run = runwatch.init(name="cadence", store=os.path.join(tmp, "runwatch.db"))
    # Both integrations wrap this run: one writer thread for the process, as in training.
    callback = RunwatchCallback()
    callback.run = run
    hf_args = hf_state = hf_control = type("Obj", (), {})()
    logger = RunwatchLogger("cadence")
    logger._run = run
    bare: queue.SimpleQueue[Any] = queue.SimpleQueue()
    step = [0]

    def c_put(d: dict[str, float]) -> None:
        bare.put((step[0], time.time(), d.copy()))

    def c_log(d: dict[str, float]) -> None:
        run.log(d, step=step[0])

    hf_state.log_history = []  # type: ignore[attr-defined]
    if hasattr(callback, "_marks"):  # since 2026-11-27 the writer reads HF's log_history
        from runwatch.integrations.hf import _LogHistoryReader

        callback._marks = collections.deque()
        run.follow(_LogHistoryReader(callback._marks, None))

    def c_hf(d: dict[str, float]) -> None:
        hf_state.global_step = step[0]  # type: ignore[attr-defined]
        hf_state.log_history.append({**d, "step": step[0]})  # Trainer.log's own append
        callback.on_log(hf_args, hf_state, hf_control, logs=d)

    def c_pl(d: dict[str, float]) -> None:
        logger.log_metrics(d, step=step[0])

    contenders = {"bare put": c_put, "run.log": c_log, "hf on_log": c_hf, "lightning": c_pl}
    out: dict[str, Any] = {"src": runwatch.__file__}
    timer = time.perf_counter_ns
    for label, kind, seconds in PAUSES:
        ns: dict[str, list[int]] = {name: [] for name in contenders}
        names = list(contenders)
        for i in range(steps[label]):
            pause(kind, seconds)
            name = names[i % len(names)]
            call = contenders[name]
            d = values(step[0] + 1)
            step[0] += 1
            t = timer()
            call(d)
            ns[name].append(timer() - t)
        out[label] = {name: stats_us(v) for name, v in ns.items()}
        while not bare.empty():
            bare.get_nowait()
    tight: dict[str, list[int]] = {"bare put": [], "run.log": []}
    for name in tight:
        call = contenders[name]
        dicts = [values(step[0] + k + 1) for k in range(20_000)]
        for d in dicts:
            step[0] += 1
            t = timer()
            call(d)
            tight[name].append(timer() - t)
    out["tight loop"] = {name: stats_us(v) for name, v in tight.items()}
    run.flush()
    while not bare.empty():
        bare.get_nowait()
    # Wall time added per step to a GIL-holding loop.
    n_work = calibrate_work()
    kinds = ("run.log", "bare put")
    added: dict[str, list[float]] = {k: [] for k in kinds}
    held: dict[str, list[float]] = {k: [] for k in kinds}
    behind: dict[str, list[float]] = {k: [] for k in kinds}
    by_thread: dict[str, list[float]] = {}  # run.log's added CPU, thread by thread
    for b in range(blocks):
        walls: dict[str, float] = {}
        off: dict[str, float] = {}
        background: dict[str, dict[str, float]] = {}
        order = ("none", *kinds) if b % 2 == 0 else (*reversed(kinds), "none")
        for kind in order:
            call = contenders.get(kind)
            cpu0, queued0 = schedstat()
            bg0 = background_cpu()
            t = time.perf_counter()
            for _ in range(block_steps):
                work(n_work)
                # The user's dict: every block builds it, only logging differs. By the
                # block's own index the loss jumped back up at each block, a spike no
                # training loop makes, and detection had every point of it to judge.
                d = values(step[0] + 1)
                if call is not None:
                    step[0] += 1
                    call(d)
            walls[kind] = time.perf_counter() - t
            cpu1, queued1 = schedstat()
            # Neither on a CPU nor runnable: blocked, and a loop that never sleeps nor does
            # I/O blocks only on the GIL. Unlike the wall time, this does not move with
            # what other processes do to the loop's CPU time on a shared machine.
            off[kind] = walls[kind] - (cpu1 - cpu0) - (queued1 - queued0)
            time.sleep(0.15)  # the block's points are written and judged in this pause too
            bg1 = background_cpu()
            background[kind] = {name: bg1[name] - bg0.get(name, 0.0) for name in bg1}
            while not bare.empty():
                bare.get_nowait()
        for kind in kinds:
            added[kind].append((walls[kind] - walls["none"]) / block_steps * 1e6)
            held[kind].append((off[kind] - off["none"]) / block_steps * 1e6)
            none = sum(v for n, v in background["none"].items() if n != CHILD)
            in_process = sum(v for n, v in background[kind].items() if n != CHILD)
            behind[kind].append((in_process - none) / block_steps * 1e6)
        for name, cpu in background["run.log"].items():
            extra = cpu - background["none"].get(name, 0.0)
            by_thread.setdefault(name, []).append(extra / block_steps * 1e6)
    out["wall added"] = {
        kind: {"median": statistics.median(v), "blocks": v} for kind, v in added.items()
    }
    out["gil wait added"] = {
        kind: {"median": statistics.median(v), "blocks": v} for kind, v in held.items()
    }
    out["background cpu added"] = {
        kind: {"median": statistics.median(v), "blocks": v} for kind, v in behind.items()
    }
    out["background by thread"] = {n: statistics.median(v) for n, v in by_thread.items()}
    writer = [t for t in threading.enumerate() if t.name == "runwatch-writer"]
    if writer:
        run.flush()
        cpu, _ = schedstat(writer[0].native_id)
        out["writer cpu s"] = cpu
        out["points"] = run.stats()["written"]
    out["step ms"] = None
    t = time.perf_counter()
    work(n_work)
    out["step ms"] = (time.perf_counter() - t) * 1e3
    run.finish()
    return out


def child_anchor(which: str, steps: int) -> dict:
    tmp = tempfile.mkdtemp(prefix=f"hook_cadence_{which}_")
    if which == "wandb":
        import wandb

        os.environ["WANDB_SILENT"] = "true"
        run = wandb.init(mode="offline", dir=tmp, project="bench")

        def call(d: dict[str, float], i: int) -> None:
            run.log(d, step=i)

        version = f"wandb {wandb.__version__} offline log"
    else:
        import tensorboardX

        writer = tensorboardX.SummaryWriter(tmp)

        def call(d: dict[str, float], i: int) -> None:
            for k, v in d.items():
                writer.add_scalar(k, v, i)

        version = f"tensorboardX {tensorboardX.__version__}, 4 add_scalar"
    bare: queue.SimpleQueue[Any] = queue.SimpleQueue()
    ns: dict[str, list[int]] = {"bare put": [], "tool": []}
    timer = time.perf_counter_ns
    for i in range(steps):
        busy(0.010)
        d = values(i)
        t = timer()
        if i % 2:
            call(d, i)
            ns["tool"].append(timer() - t)
        else:
            bare.put((i, time.time(), d.copy()))
            ns["bare put"].append(timer() - t)
    if which == "wandb":
        run.finish()
    else:
        writer.close()
    return {"name": version, **{k: stats_us(v) for k, v in ns.items()}}


def spawn(args: list[str], env_extra: dict[str, str] | None = None) -> dict | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWATCH_")}
    env["PYTHONWARNINGS"] = "ignore"
    env.update(env_extra or {})
    proc = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, env=env, timeout=600
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the report ----------------------------------------------------------------------------
def spread(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    if len(xs) == 1 or min(xs) == max(xs):
        return f"{xs[0]:.1f}"
    return f"{min(xs):.1f}-{max(xs):.1f}"


def report(results: dict[str, list[dict]], anchors: dict[str, list[dict]], args: Any) -> str:
    lines = [
        f"# hook cadence: {platform.node()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"`python bench/hook_cadence.py --repeats {args.repeats}"
        f"{' --quick' if args.quick else ''}`; µs, min-max over repeats "
        "(each a fresh process).",
        "",
        "| one call of 4 scalars | version | median µs | p99 µs | median / bare put | "
        f"p99 / bare put | calls over {STALL_NS // 1000} µs, % |",
        "|---|---|---|---|---|---|---|",
    ]
    for version, runs in results.items():
        if not runs:
            continue
        for label in ("tight loop", *(p[0] for p in PAUSES)):
            names = (
                ("run.log", "bare put")
                if label == "tight loop"
                else ("run.log", "hf on_log", "lightning", "bare put")
            )
            for name in names:
                med = [r[label][name]["median"] for r in runs]
                p99 = [r[label][name]["p99"] for r in runs]
                rm = [r[label][name]["median"] / r[label]["bare put"]["median"] for r in runs]
                rp = [r[label][name]["p99"] / r[label]["bare put"]["p99"] for r in runs]
                stalled = [r[label][name].get("stalled %", math.nan) for r in runs]
                ratio = name != "bare put"
                lines.append(
                    f"| {name}, {label} | {version} | {spread(med)} | {spread(p99)} | "
                    f"{spread(rm) + 'x' if ratio else ''} | {spread(rp) + 'x' if ratio else ''} | "
                    f"{spread(stalled)} |"
                )
    for runs in anchors.values():
        for r in runs:
            lines.append(
                f"| {r['name']}, 10 ms busy | anchor | {r['tool']['median']:.1f} | "
                f"{r['tool']['p99']:.1f} | {r['tool']['median'] / r['bare put']['median']:.1f}x | "
                f"{r['tool']['p99'] / r['bare put']['p99']:.1f}x | "
                f"{r['tool'].get('stalled %', math.nan):.1f} |"
            )
    counts = {
        label: r[label]["bare put"]["n"]
        for runs in results.values()
        for r in runs
        for label in ("tight loop", *(p[0] for p in PAUSES))
    }
    lines += [
        "",
        "Calls per contender and process: "
        + ", ".join(f"{n} {label}" for label, n in counts.items()),
    ]
    for key, title in (
        ("wall added", "wall time added per logged step, GIL-holding loop"),
        ("gil wait added", "time the loop waited for the GIL, added per logged step"),
        ("background cpu added", "CPU of runwatch's threads added per logged step (GIL bound)"),
    ):
        lines += ["", f"| {title} | version | median over blocks µs | blocks (each repeat) |"]
        lines.append("|---|---|---|---|")
        for version, runs in results.items():
            for name in ("run.log", "bare put"):
                if any(key not in r for r in runs):
                    continue  # a result file from before this measure
                meds = [r[key][name]["median"] for r in runs]
                every = "; ".join(
                    " ".join(f"{x:.1f}" for x in r[key][name]["blocks"]) for r in runs
                )
                lines.append(f"| {name} | {version} | {spread(meds)} | {every} |")
    lines += [
        "",
        "| the writer thread's CPU time, whole child process | version | µs per point written |",
        "|---|---|---|",
    ]
    for version, runs in results.items():
        per = [r["writer cpu s"] / r["points"] * 1e6 for r in runs if r.get("points")]
        lines.append(f"| runwatch-writer | {version} | {spread(per)} |")
    lines += [
        "",
        "| run.log's added CPU per logged step, by thread | version | median over blocks µs |",
        "|---|---|---|",
    ]
    for version, runs in results.items():
        names = sorted({n for r in runs for n in r.get("background by thread", {})})
        for name in names:
            meds = [
                r["background by thread"][name]
                for r in runs
                if name in r.get("background by thread", {})
            ]
            lines.append(f"| {name} | {version} | {spread(meds)} |")
    if any(results.values()):
        step_ms = [r["step ms"] for runs in results.values() for r in runs]
        lines.append("")
        lines.append(
            f"A step of the GIL-holding loop took {spread(step_ms)} ms of Python work; "
            f"blocks of {args.block_steps} steps."
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="/tmp/hook_before", help="checkout of the old hook")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--block-steps", type=int, default=400)
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0
    # Four contenders take turns: 300 calls each at 10 ms and 30 ms, so a p99 is the third
    # largest call rather than the largest (100 and 50 calls each until 2026-11-27). At 1 ms
    # about 1% of all calls meet a stall, so a p99 of 500 calls fell on either side of it by
    # chance: 4,000 calls each (500 until 2026-11-27).
    steps = {
        "10 ms busy": int(1200 * scale),
        "30 ms sleep": int(1200 * scale),
        "1 ms busy": int(16000 * scale),
    }
    blocks = max(2, int(args.blocks * scale))
    if args.child == "runwatch":
        print(json.dumps(child_runwatch(args.src, steps, blocks, args.block_steps)))
        return
    if args.child in ("wandb", "tensorboardX"):
        print(json.dumps(child_anchor(args.child, int(200 * scale))))
        return
    versions = {"this change": str(HERE.parent), IN_THREAD: str(HERE.parent)}
    if Path(args.before, "runwatch").is_dir():
        versions["before"] = args.before
    else:
        print(f"no checkout of the old hook at {args.before}: that anchor is left out")
    results: dict[str, list[dict]] = {v: [] for v in versions}
    anchors: dict[str, list[dict]] = {"wandb": [], "tensorboardX": []}
    started = time.perf_counter()
    for rep in range(args.repeats):
        order = list(versions.items()) if rep % 2 == 0 else list(versions.items())[::-1]
        for version, src in order:
            got = spawn(
                [
                    "--child",
                    "runwatch",
                    "--src",
                    src,
                    "--block-steps",
                    str(args.block_steps),
                    "--blocks",
                    str(args.blocks),
                ]
                + (["--quick"] if args.quick else []),
                {"RUNWATCH_LIVE_DETECTION": "thread"} if version == IN_THREAD else None,
            )
            if got is not None:
                results[version].append(got)
            print(
                f"  repeat {rep + 1}, {version}: {time.perf_counter() - started:.0f} s",
                file=sys.stderr,
            )
        for which in anchors:
            got = spawn(["--child", which] + (["--quick"] if args.quick else []))
            if got is not None:
                anchors[which].append(got)
            else:
                print(f"  {which}: not installed or failed; left out", file=sys.stderr)
    text = report(results, anchors, args)
    print(text)
    if not args.no_save:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
