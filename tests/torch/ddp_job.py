"""A small DDP job for the straggler tests and bench: torchrun, gloo, the CPU.

    torchrun --standalone --nproc_per_node 3 tests/torch/ddp_job.py --out DIR [--slow RANK]
        [--factor 0.5] [--from-step 100] [--all] [--hang RANK --hang-step S] [--steps N]

Each rank trains a small MLP plus ``--device-ms`` of simulated accelerator time a step (a
sleep: the host idles while the device computes, as with a GPU; three ranks computing on two
cores would time the scheduler, not the ranks). It logs ``loss`` and its wall ``step_time``
as the README shows and calls ``runwatch.torch.instrument(model)``, into a store of its own
(``DIR/rank{r}.db``). From ``--from-step`` a slowed rank's device takes ``factor`` x the
rank's healthy own time (its median ``step_time_compute`` so far) more each step; ``--all``
slows every rank's device by ``factor`` x ``--device-ms``, the same on all. A hanging rank
sleeps ``--hang-s`` at ``--hang-step`` and exits, leaving the others waiting in the
all-reduce. ``--no-instrument`` runs without the hook.
``DIR/rank{r}.json`` holds the wall step times and the hook's own cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

RUN = "ddp-job"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--slow", type=int, default=-1)
    p.add_argument("--factor", type=float, default=0.5)
    p.add_argument("--from-step", type=int, default=100)
    p.add_argument("--all", action="store_true")
    p.add_argument("--hang", type=int, default=-1)
    p.add_argument("--hang-step", type=int, default=80)
    p.add_argument("--hang-s", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--device-ms", type=float, default=10.0)
    p.add_argument("--no-instrument", action="store_true")
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import runwatch
    import runwatch.torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = DDP(
        nn.Sequential(
            nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)
        )
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(args.seed * 100 + rank)
    x = torch.randn(4096, 64, generator=g)
    y = x[:, :8].sum(dim=1, keepdim=True)
    out = Path(args.out)
    own: list[float] = []
    base = 0.0
    steps: list[float] = []
    with runwatch.init(
        name=RUN, store=str(out / f"rank{rank}.db"), monitor=False, cpu_wait=False
    ) as run:
        timer = None if args.no_instrument else runwatch.torch.instrument(model)
        for step in range(args.steps):
            began = time.perf_counter()
            slowed = args.all or rank == args.slow
            if timer is not None and timer.last_compute == timer.last_compute:
                own.append(timer.last_compute)  # the rank's own time, as the hook measures
            if slowed and step == args.from_step:
                base = statistics.median(own[-50:]) if own else 0.0
            extra = 0.0
            if slowed and step >= args.from_step:
                # A slower device takes `factor` x the rank's healthy own time more; with
                # --all every device takes the same `factor` x device time more (a job-wide
                # cause, equal on every rank).
                extra = args.factor * (args.device_ms / 1000.0 if args.all else base)
            # The device's share of the step: the host waits while it computes, as with a
            # GPU (3 ranks spinning on 2 cores would time the scheduler, not the ranks).
            time.sleep(args.device_ms / 1000.0 + extra)
            if rank == args.hang and step == args.hang_step:
                time.sleep(args.hang_s)
                run.flush()
                os._exit(3)
            i = (step * args.batch) % (4096 - args.batch)
            loss = nn.functional.mse_loss(model(x[i : i + args.batch]), y[i : i + args.batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces the gradients here
            opt.step()
            took = time.perf_counter() - began
            steps.append(took)
            run.log({"loss": loss.item(), "step_time": took}, step=step)
        runwatch.torch.flush_all()
    cost = (
        {}
        if timer is None
        else {"overhead_s": timer.overhead_s + timer.done_overhead_s, "timed_steps": timer.steps}
    )
    (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "step_time": steps, **cost}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
