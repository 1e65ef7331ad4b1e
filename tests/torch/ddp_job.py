"""A small data-parallel job for the straggler tests and bench: torchrun, gloo, the CPU.

    torchrun --standalone --nproc_per_node 3 tests/torch/ddp_job.py --out DIR [--slow RANK]
        [--factor 0.5] [--from-step 100] [--all] [--hang RANK --hang-step S] [--steps N]
        [--fsdp] [--no-instrument]

Each rank trains a small MLP plus ``--device-ms`` of simulated accelerator time a step (a
sleep: the host idles while the device computes, as with a GPU; three ranks computing on two
cores would time the scheduler, not the ranks). It logs ``loss`` and its wall ``step_time``
as the README shows and calls ``runwatch.torch.instrument(model)``, into a store of its own
(``DIR/rank{r}.db``). From ``--from-step`` a slowed rank's device takes ``factor`` x the
rank's healthy own time (its median ``step_time_compute`` so far) more each step; ``--all``
slows every rank's device by ``factor`` x ``--device-ms``, the same on all. A hanging rank
sleeps ``--hang-s`` at ``--hang-step`` and exits, leaving the others waiting in the
collective. ``--no-instrument`` runs without the hook. The model is wrapped in DDP, or with
``--fsdp`` sharded by FSDP2 (``fully_shard`` on each linear layer, then on the root; the run
is then ``fsdp-job``). ``DIR/rank{r}.json`` holds the wall step times, the hook's own cost,
and sha256 digests of the rank's parameters and gradients (its shards under FSDP) after the
last step, to compare with ``--no-instrument``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

RUNS = {False: "ddp-job", True: "fsdp-job"}


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
    p.add_argument("--fsdp", action="store_true")
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    import runwatch
    import runwatch.torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)
    )
    if args.fsdp:
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    else:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(args.seed * 100 + rank)
    x = torch.randn(4096, 64, generator=g)
    y = x[:, :8].sum(dim=1, keepdim=True)
    out = Path(args.out)
    own: list[float] = []
    base = 0.0
    steps: list[float] = []
    with runwatch.init(
        name=RUNS[args.fsdp], store=str(out / f"rank{rank}.db"), monitor=False, cpu_wait=False
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
            loss.backward()  # DDP all-reduces the gradients here; FSDP reduce-scatters
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
    info = {"rank": rank, "step_time": steps, **digests(model), **cost}
    (out / f"rank{rank}.json").write_text(json.dumps(info))
    dist.destroy_process_group()
    return 0


def digests(model) -> dict[str, str]:
    """sha256 of the rank's parameters and of their gradients (the local shards under FSDP)."""

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    params = list(model.parameters())
    return {
        kind: hashlib.sha256(
            b"".join(
                local(t).detach().numpy().tobytes()
                for t in (params if kind == "params" else (q.grad for q in params))
            )
        ).hexdigest()
        for kind in ("params", "grads")
    }


if __name__ == "__main__":
    sys.exit(main())
