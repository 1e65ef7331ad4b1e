"""Make the real 10-rank straggler trace of issue 17 (item 6): a CPU DDP job, one slow rank.

    torchrun --standalone --nproc_per_node 10 bench/ddp_straggler_trace.py --out DIR
    python bench/ddp_straggler_trace.py --export DIR bench/data/ddp10_straggler.csv

Each rank trains a tiny MLP on its own shard (gloo, CPU, one thread per rank), times its own
forward+backward (the compute before it waits on the all-reduce) and logs it as
``step_time`` through ``runwatch.init`` (the rank label comes from torchrun), to a store of
its own in ``DIR``. The gradients are then all-reduced by hand, so every step is
synchronous as in DDP but the logged time is the rank's own.

Rank 3 is the documented straggler: for ``SHORT`` steps it spins an extra 2x its compute
(a short, large slowdown: 3x its own compute time), and for ``LONG`` steps an extra 0.3x
(1.3x). The JSON beside the CSV holds the intended factors and the measured ones (rank
3's median ratio to the fleet median over each stretch). Every rank shares the machine's
noise: ten processes on two loaded cores.
``--export`` merges the ranks' stores into one long-format CSV (run, step, metric, value,
rank) with the ground truth in ``bench/data/ddp10_straggler.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

STEPS = 600
SLOW_RANK = 3
SHORT = (180, 187)  # steps [180, 187): 7 steps at 3x its own compute (2x extra sleep)
LONG = (380, 480)  # steps [380, 480): 100 steps at 1.3x
RUN = "ddp10-straggler"


def spin(seconds: float) -> None:
    """Busy for ``seconds``: a slower device computes, it does not sleep (and a sleep of a
    millisecond overshoots by as much on a loaded machine)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def train(out: Path, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import runwatch

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)
    )
    for p in model.parameters():  # every rank starts from rank 0's weights
        dist.broadcast(p.data, 0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4096, 64)
    y = x[:, :8].sum(dim=1, keepdim=True)
    store = out / f"rank{rank}.db"
    with runwatch.init(name=RUN, store=str(store), monitor=False) as run:
        for step in range(steps):
            i = (step * 64) % 4096
            began = time.perf_counter()
            loss = nn.functional.mse_loss(model(x[i : i + 64]), y[i : i + 64])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            compute = time.perf_counter() - began
            if rank == SLOW_RANK and SHORT[0] <= step < SHORT[1]:
                spin(2.0 * compute)
            elif rank == SLOW_RANK and LONG[0] <= step < LONG[1]:
                spin(0.3 * compute)
            took = time.perf_counter() - began
            for p in model.parameters():  # the collective, after the rank's own time
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
            opt.step()
            run.log({"step_time": took}, step=step)
    dist.destroy_process_group()


def export(out: Path, csv: Path) -> None:
    import pandas as pd

    import runwatch

    frames = []
    for db in sorted(out.glob("rank*.db")):
        pts = runwatch.open_store(str(db), readonly=True).read_points(RUN, ["step_time"])
        frames.append(pts[["step", "metric", "value", "rank"]])
    df = pd.concat(frames).sort_values(["step", "rank"], kind="stable")
    df.insert(0, "run", RUN)
    df["rank"] = df["rank"].astype(int)
    df.to_csv(csv, index=False, float_format="%.6g")
    wide = df.pivot(index="step", columns="rank", values="value")
    ratio = wide[SLOW_RANK] / wide.median(axis=1)

    def measured(a: int, b: int) -> float:
        return round(float(ratio.loc[a : b - 1].median()), 3)

    truth = {
        "run": RUN,
        "ranks": int(df["rank"].nunique()),
        "steps": int(df["step"].max()) + 1,
        "slow_rank": SLOW_RANK,
        "short": {
            "first": SHORT[0],
            "last": SHORT[1] - 1,
            "factor": 3.0,
            "measured": measured(*SHORT),
        },
        "long": {"first": LONG[0], "last": LONG[1] - 1, "factor": 1.3, "measured": measured(*LONG)},
        "made_by": "torchrun --standalone --nproc_per_node 10 bench/ddp_straggler_trace.py",
    }
    csv.with_suffix(".json").write_text(json.dumps(truth, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/ddp10", help="directory of the ranks' stores")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--export", nargs=2, metavar=("DIR", "CSV"), help="merge DIR into CSV")
    args = p.parse_args(argv)
    if args.export:
        export(Path(args.export[0]), Path(args.export[1]))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if "RANK" not in os.environ:
        print("run me under torchrun (see the module docstring)", file=sys.stderr)
        return 2
    train(out, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
