"""A small FSDP2 job for the straggler tests and bench: torchrun, gloo, the CPU.

    torchrun --standalone --nproc_per_node 3 tests/torch/fsdp_job.py --out DIR [--slow RANK]
        [--factor 0.5] [--from-step 100] [--steps N] [--no-instrument]

The same job as ``ddp_job.py`` (a small MLP plus ``--device-ms`` of simulated accelerator
time a step, a sleep; the user logs ``loss`` and the wall ``step_time``), sharded with FSDP2:
``fully_shard`` on each linear layer, then on the root, and timed by the one line
``runwatch.torch.instrument(model)``. From ``--from-step`` a slowed rank's device takes
``factor`` x the rank's healthy own time (its median ``step_time_compute`` so far) more each
step. ``DIR/rank{r}.json`` holds the wall step times, the hook's own cost, and sha256 digests
of the rank's gradient and parameter shards after the last step (to compare with
``--no-instrument``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

RUN = "fsdp-job"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--slow", type=int, default=-1)
    p.add_argument("--factor", type=float, default=0.5)
    p.add_argument("--from-step", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--device-ms", type=float, default=10.0)
    p.add_argument("--no-instrument", action="store_true")
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    import runwatch
    import runwatch.torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)
    )
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
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
            slowed = rank == args.slow
            if timer is not None and timer.last_compute == timer.last_compute:
                own.append(timer.last_compute)  # the rank's own time, as the hook measures
            if slowed and step == args.from_step:
                base = statistics.median(own[-50:]) if own else 0.0
            extra = args.factor * base if slowed and step >= args.from_step else 0.0
            # The device's share of the step: the host waits while it computes, as with a
            # GPU (3 ranks spinning on 2 cores would time the scheduler, not the ranks).
            time.sleep(args.device_ms / 1000.0 + extra)
            i = (step * args.batch) % (4096 - args.batch)
            loss = nn.functional.mse_loss(model(x[i : i + args.batch]), y[i : i + args.batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()  # FSDP all-gathers and reduce-scatters here
            opt.step()
            took = time.perf_counter() - began
            steps.append(took)
            run.log({"loss": loss.item(), "step_time": took}, step=step)
        runwatch.torch.flush_all()
    digests = {
        kind: hashlib.sha256(
            b"".join(
                t.to_local().detach().numpy().tobytes()
                for t in (
                    model.parameters() if kind == "params" else (q.grad for q in model.parameters())
                )
            )
        ).hexdigest()
        for kind in ("params", "grads")
    }
    cost = (
        {}
        if timer is None
        else {"overhead_s": timer.overhead_s + timer.done_overhead_s, "timed_steps": timer.steps}
    )
    info = {"rank": rank, "step_time": steps, **digests, **cost}
    (out / f"rank{rank}.json").write_text(json.dumps(info))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
