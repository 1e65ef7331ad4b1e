"""Benchmark: what ``import runwatch`` and ``runwatch.init()`` cost a training process.

Each case runs in a fresh interpreter (nothing cached in ``sys.modules``), and the cases are
interleaved round-robin for ``--repeats`` rounds, so a noisy moment on this shared machine
hits every case alike. Per case it prints the median and the spread (min-max) of:

- time: wall time of the measured statement inside the child (interpreter start-up excluded);
- CPU: the process's CPU time over the same statement (all threads), which a busy machine
  inflates far less than the wall time;
- RSS: resident memory after the statement minus before it (``VmRSS``), in MB.

The runwatch cases measure ``import runwatch`` plus ``runwatch.init(...)`` (the issue's goal:
at most 0.3 s and +60 MB); they then log 20 steps and ``finish()``, which is timed apart,
with the RSS at the end. The anchors are the imports a training script pays for the other
tools: wandb, TensorBoard (PyTorch's ``SummaryWriter`` and tensorboardX) and, for scale,
torch itself. A missing anchor is reported as such (``pip install -e '.[bench]'``).

After the table it lists what each runwatch case leaves in ``sys.modules`` at its end:
runwatch's modules, the third-party packages, and any compiled module of runwatch's own
(the hook must import without one).

    python bench/import_cost.py [--repeats 7] [--root PATH] [--only runwatch]

``--root`` measures another checkout (for "before" figures), e.g. ``--root /tmp/rw/base``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

GOAL_S = 0.3
GOAL_MB = 60.0

# The child: measure one case, print one JSON line. ``{setup}`` is timed; ``{after}`` is not
# part of the goal (it logs a little and finishes the run).
CHILD = r"""
import json, os, sys, time
def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
store = sys.argv[1]
r0 = rss_mb()
t0, c0 = time.perf_counter(), time.process_time()
{setup}
t1, c1 = time.perf_counter(), time.process_time()
r1 = rss_mb()
{after}
t2 = time.perf_counter()
r2 = rss_mb()
stdlib = sys.stdlib_module_names
mods = sorted(sys.modules)
own = [m for m in mods if m == "runwatch" or m.startswith("runwatch.")]
compiled = [
    m for m in own
    if str(getattr(sys.modules[m], "__file__", "") or "").endswith((".so", ".pyd"))
]
third = sorted({{
    m.split(".")[0] for m in mods
    if not m.startswith("_") and m.split(".")[0] not in stdlib and m.split(".")[0] != "runwatch"
}})
print(json.dumps({{
    "time": t1 - t0, "cpu": c1 - c0, "rss": r1 - r0, "after_time": t2 - t1, "after_rss": r2 - r0,
    "own": own, "compiled": compiled, "third": third,
}}))
"""

RUN_AFTER = """
for step in range(20):
    run.log({"loss": 2.0 - step * 0.01, "lr": 3e-4}, step=step)
run.finish()
"""

# name -> (what is timed, what runs after, the module that must be importable)
CASES: dict[str, tuple[str, str, str]] = {
    "import runwatch": ("import runwatch", "", "runwatch"),
    "import runwatch + init(monitor=False)": (
        "import runwatch\nrun = runwatch.init(name='bench', store=store, monitor=False)",
        RUN_AFTER,
        "runwatch",
    ),
    "import runwatch + init() (monitor on)": (
        "import runwatch\nrun = runwatch.init(name='bench', store=store)",
        RUN_AFTER,
        "runwatch",
    ),
    "import wandb": ("import wandb", "", "wandb"),
    "import torch.utils.tensorboard": ("import torch.utils.tensorboard", "", "tensorboard"),
    "from torch.utils.tensorboard import SummaryWriter": (
        "from torch.utils.tensorboard import SummaryWriter",
        "",
        "tensorboard",
    ),
    "import tensorboardX": ("import tensorboardX", "", "tensorboardX"),
    "import torch": ("import torch", "", "torch"),
}
RUNWATCH_CASES = [name for name in CASES if "runwatch" in name]


def available(module: str, root: Path) -> bool:
    if module == "runwatch":
        return (root / "runwatch" / "__init__.py").exists()
    return importlib.util.find_spec(module) is not None


def child_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWATCH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env["WANDB_MODE"] = "disabled"
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # do not write .pyc files into --root
    return env


def run_case(name: str, root: Path, workdir: Path, n: int) -> dict:
    setup, after, _ = CASES[name]
    code = CHILD.format(setup=setup, after=after)
    store = workdir / f"case{n}.db"
    out = subprocess.run(
        [sys.executable, "-c", code, str(store)],
        cwd=workdir,  # not the checkout: the child imports runwatch from --root only
        env=child_env(root),
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{name} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def spread(values: list[float], fmt: str) -> str:
    med = statistics.median(values)
    return f"{med:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="rounds (>= 5 for a median)")
    parser.add_argument(
        "--root", type=Path, default=Path(__file__).resolve().parents[1], help="checkout"
    )
    parser.add_argument("--only", metavar="TEXT", help="only the cases whose name has TEXT")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    wanted = [name for name in CASES if args.only is None or args.only in name]
    cases = [name for name in wanted if available(CASES[name][2], root)]
    missing = [name for name in wanted if name not in cases]

    results: dict[str, list[dict]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory(prefix="rw-import-") as tmp:
        n = 0
        for _ in range(args.repeats):
            for name in cases:
                results[name].append(run_case(name, root, Path(tmp), n))
                n += 1

    print(f"# python {sys.version.split()[0]}, runwatch from {root}, {args.repeats} rounds")
    print("# median (min-max); time excludes interpreter start-up")
    head = (
        f"| {'case':<50} | {'time s':<19} | {'CPU s':<19} | {'RSS +MB':<19} "
        f"| {'finish s':<19} | end +MB |"
    )
    print(head)
    print("|" + "|".join("-" * (len(c) + 0) for c in head.split("|")[1:-1]) + "|")
    for name in cases:
        rs = results[name]
        times = [r["time"] for r in rs]
        cpu = [r["cpu"] for r in rs]
        rss = [r["rss"] for r in rs]
        finish = spread([r["after_time"] for r in rs], ".3f") if CASES[name][1] else "-"
        end = f"{statistics.median(r['after_rss'] for r in rs):.0f}" if CASES[name][1] else "-"
        print(
            f"| {name:<50} | {spread(times, '.3f'):<19} | {spread(cpu, '.3f'):<19} "
            f"| {spread(rss, '.1f'):<19} "
            f"| {finish:<19} | {end:>7} |"
        )
    for name in missing:
        print(f"| {name:<50} | {'not installed':<19} | {'':<19} | {'':<19} | {'':<19} | {'':>7} |")

    print()
    for name in RUNWATCH_CASES[1:]:
        if name not in results:
            continue
        t = statistics.median(r["time"] for r in results[name])
        m = statistics.median(r["rss"] for r in results[name])
        verdict = "met" if t <= GOAL_S and m <= GOAL_MB else "NOT met"
        print(f"goal (<= {GOAL_S} s, <= +{GOAL_MB:.0f} MB) for {name}: {verdict}")

    for name in RUNWATCH_CASES:
        if name not in results:
            continue
        first = results[name][0]
        print(f"\nafter `{name}`{' and finish()' if CASES[name][1] else ''}:")
        print(f"  runwatch modules ({len(first['own'])}): {' '.join(first['own'])}")
        print(f"  third-party packages ({len(first['third'])}): {' '.join(first['third'])}")
        print(f"  compiled runwatch modules: {' '.join(first['compiled']) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
