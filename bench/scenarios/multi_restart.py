"""A generated multi-restart run with crashes from three known causes (issue 17, figures).

    python bench/scenarios/multi_restart.py OUT.jsonl [--truth TRUTH.json] [--seed 17]
        [--steps 20000] [--small]

Writes a JSONL file for ``runwatch import`` (points, events and step context rows, in the
order a run's logs would hold them) and, with ``--truth``, what the grouping should find.

The run: 16 ranks on 4 hosts (``n0`` .. ``n3``, 4 ranks each), about 20k steps, a checkpoint
every 250 steps, data shards changing every 500 steps as step context (``{"shard": "s00"}``
.. ``"s39"``, logged by rank 0 as the hook does; ``--context-rank none`` writes run-wide rows
without a rank), and crashes from three causes, each followed by a restart from the
last checkpoint (the steps go back: a new attempt):

a. **data bug**: an ``IndexError`` (numbers varying) at some steps reading shard ``s17``, on
   whichever rank read the bad record (any host);
b. **failing host**: ``n2``'s GPU logs ``Xid 79`` ("GPU has fallen off the bus"); the rank
   hangs in the driver, and about 600 s later the other ranks' NCCL watchdogs time out;
c. **flaky link** between ``n1`` and ``n3``: a rank on one of them dies with
   ``NCCL WARN NET/IB : Got completion from peer <ip><port> with error 12, ..., vendor err
   129`` (peer on the other host), at random steps.

Message texts follow real ones (NCCL's ``host:pid:tid [dev] file:line NCCL WARN`` prefix,
the kernel's ``NVRM: Xid (PCI:...)`` line, PyTorch's ``ProcessGroupNCCL`` watchdog line),
with PIDs, addresses, ports, sequence numbers and sizes varying. Points: ``loss``,
``grad_norm``, ``lr`` and ``tokens_per_s`` on rank 0, ``step_time`` on every rank; the
first step of each attempt is slow (warm-up), as in real restarts.

Everything is drawn from one seeded RNG, so a seed gives the same file byte for byte.
``--small`` makes a ~2k-step version for tests (shards every 50 steps, checkpoints every
25, the same causes and counts).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

RUN = "multi_restart"
HOSTS = ("n0", "n1", "n2", "n3")
RANKS_PER_HOST = 4
BAD_SHARD = "s17"
FAILING_HOST = "n2"
LINK_HOSTS = ("n1", "n3")
T0 = 1_750_000_000.0  # a fixed start time: the file does not depend on the clock
NCCL_TIMEOUT_MS = 600_000


@dataclass
class Config:
    """The scenario's knobs; :func:`small` scales it down for tests."""

    seed: int = 17
    steps: int = 20_000
    shard_every: int = 500
    checkpoint_every: int = 250
    data_crashes: int = 5
    xid_crashes: int = 4
    link_crashes: int = 10
    step_time: float = 0.45
    tokens_per_step: int = 16 * 8 * 1024
    run: str = RUN
    context_rank: int | None = 0
    """The rank the context rows name: 0, as rank 0 logs the run-level context with the
    hook; None writes run-wide rows without a rank."""


def small(seed: int = 17) -> Config:
    """A ~2k-step version with the same causes and counts (for tests)."""
    return Config(seed=seed, steps=2_000, shard_every=50, checkpoint_every=25)


@dataclass
class Truth:
    """What the grouping should find: per cause, its crash steps and the expected top
    hypotheses."""

    run: str
    steps: int
    ranks: int
    hosts: list[str]
    attempts: int = 1
    causes: dict[str, dict[str, Any]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)


# ------------------------------------------------------------------ message texts
def _ip(host: str) -> str:
    return f"10.42.0.{11 + HOSTS.index(host)}"


def _pci(rng: random.Random) -> str:
    return f"0000:{rng.choice(['1b', '3b', '5e', '86', 'af', 'd8'])}:00"


def index_error(rng: random.Random) -> str:
    """The crash of the data bug: an out-of-range token index from a bad record."""
    size = rng.choice([50_257, 50_304, 32_000, 65_536])
    index = size + rng.randrange(1, 40_000)
    return f"IndexError: index {index} is out of bounds for dimension 0 with size {size}"


def xid_line(rng: random.Random, pid: int) -> str:
    """The kernel's Xid 79 line, as dmesg shows it on the failing host."""
    stamp = f"[{rng.uniform(1_000, 900_000):.6f}]"
    return (
        f"{stamp} NVRM: Xid (PCI:{_pci(rng)}): 79, pid={pid}, name=pt_main_thread, "
        "GPU has fallen off the bus."
    )


def watchdog_line(rng: random.Random, rank: int, seq: int) -> tuple[str, float]:
    """A peer rank's NCCL watchdog timeout, as PyTorch's ProcessGroupNCCL prints it, and
    how long the collective ran (s): the watchdog checks every few hundred ms."""
    numel = rng.choice([1, 4_194_304, 16_777_216, 25_165_824])
    ran = NCCL_TIMEOUT_MS + rng.randrange(5, 400)
    text = (
        f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
        f"OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, Timeout(ms)={NCCL_TIMEOUT_MS}) "
        f"ran for {ran} milliseconds before timing out."
    )
    return text, ran / 1000


def ib_completion_line(rng: random.Random, host: str, local: int, peer: str, pid: int) -> str:
    """NCCL's IB transport error on one end of the flaky link (error 12: retry exceeded)."""
    tid = pid + rng.randrange(30, 900)
    opcode, length = rng.choice([(0, 0), (1, 0), (129, 65_536), (32_616, 0)])
    way = rng.choice(["Recv", "Send"])
    return (
        f"{host}:{pid}:{tid} [{local}] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got "
        f"completion from peer {_ip(peer)}<{rng.randrange(32_768, 60_999)}> with error 12, "
        f"opcode {opcode}, len {length}, vendor err 129 ({way})"
    )


# ------------------------------------------------------------------ curves
def _lr(step: int, total: int) -> float:
    warm = max(1, total // 20)
    if step < warm:
        return 6e-4 * (step + 1) / warm
    frac = (step - warm) / max(1, total - warm)
    return 6e-5 + 0.5 * (6e-4 - 6e-5) * (1 + math.cos(math.pi * min(1.0, frac)))


def _loss(step: int, total: int) -> float:
    return 2.9 + 7.9 * (1 + 20_000 * step / total / 150) ** -0.5


# ------------------------------------------------------------------ the run
class _Writer:
    def __init__(self, out: TextIO, run: str) -> None:
        self.out, self.run = out, json.dumps(run)
        self.rows = {"points": 0, "events": 0, "context": 0}

    def point(self, step: int, metric: str, value: float, t: float, rank: int) -> None:
        host = HOSTS[rank // RANKS_PER_HOST]
        self.out.write(
            f'{{"run":{self.run},"step":{step},"metric":"{metric}","value":{value:.6g},'
            f'"time":{t:.3f},"rank":{rank},"host":"{host}"}}\n'
        )
        self.rows["points"] += 1

    def event(self, step: int, kind: str, message: str, t: float, rank: int | None) -> None:
        row: dict[str, Any] = {"run": json.loads(self.run), "step": step, "event": kind}
        row.update(message=message, time=round(t, 3))
        if rank is not None:
            row.update(rank=rank, host=HOSTS[rank // RANKS_PER_HOST])
        self.out.write(json.dumps(row) + "\n")
        self.rows["events"] += 1

    def context(self, step: int, shard: str, t: float, rank: int | None) -> None:
        where = "" if rank is None else f',"rank":{rank}'
        self.out.write(
            f'{{"run":{self.run},"step":{step},"context":{{"shard":"{shard}"}},'
            f'"time":{t:.3f}{where}}}\n'
        )
        self.rows["context"] += 1


def _triggers(cfg: Config, rng: random.Random) -> dict[int, str]:
    """Crash steps by cause; a step fires once (the first time any attempt reaches it)."""
    ckpt = cfg.checkpoint_every
    taken: set[int] = set()

    def draw(lo: int, hi: int) -> int:
        while True:
            s = rng.randrange(lo, hi)
            # Two steps past a checkpoint or more: the restart must send the steps back.
            if s % ckpt > 2 and not any(abs(s - t) < 3 for t in taken):
                taken.add(s)
                return s

    bad = int(BAD_SHARD[1:])
    lo, hi = bad * cfg.shard_every, (bad + 1) * cfg.shard_every
    out = {draw(lo + 1, hi): "data_bug" for _ in range(cfg.data_crashes)}
    span = (cfg.steps // 40, cfg.steps - cfg.steps // 40)
    out |= {draw(*span): "failing_host" for _ in range(cfg.xid_crashes)}
    out |= {draw(*span): "flaky_link" for _ in range(cfg.link_crashes)}
    return out


def generate(out: TextIO, cfg: Config) -> Truth:
    """Write the scenario to ``out``; return what the grouping should find."""
    rng = random.Random(cfg.seed)
    ranks = len(HOSTS) * RANKS_PER_HOST
    triggers = _triggers(cfg, rng)
    w = _Writer(out, cfg.run)
    truth = Truth(run=cfg.run, steps=cfg.steps, ranks=ranks, hosts=list(HOSTS))
    expected = {
        "data_bug": ["shard=" + BAD_SHARD],
        "failing_host": ["host=" + FAILING_HOST],
        "flaky_link": ["host=" + "+".join(sorted(LINK_HOSTS))],
    }
    for cause, top in expected.items():
        truth.causes[cause] = {"expected_top": top, "crashes": []}
    host_speed = [1.0 + rng.uniform(-0.01, 0.01) for _ in HOSTS]
    t, step, resumed, seq = T0, 0, True, 1_000
    shard = None
    while step < cfg.steps:
        if resumed or step % cfg.shard_every == 0:
            now = f"s{step // cfg.shard_every:02d}"
            if resumed or now != shard:
                w.context(step, now, t, cfg.context_rank)
                shard = now
        cause = triggers.pop(step, None)
        if cause is not None:
            t = _crash(w, rng, cfg, cause, step, t, seq, truth)
            step = (step - 1) // cfg.checkpoint_every * cfg.checkpoint_every + 1
            truth.attempts += 1
            resumed = True
            continue
        common = cfg.step_time * (1 + 0.02 * rng.gauss(0, 1)) * (4.0 if resumed else 1.0)
        for rank in range(ranks):
            host = rank // RANKS_PER_HOST
            own = common * host_speed[host] * (1 + 0.005 * rng.gauss(0, 1))
            w.point(step, "step_time", own, t + own, rank)
            if rank == 0:
                rank0 = own
        t += max(common, rank0)
        noise = math.exp(0.01 * rng.gauss(0, 1))
        w.point(step, "loss", _loss(step, cfg.steps) * noise, t, 0)
        grad = (0.3 + 2.0 * (1 + step / 500) ** -0.5) * math.exp(0.1 * rng.gauss(0, 1))
        w.point(step, "grad_norm", grad, t, 0)
        w.point(step, "lr", _lr(step, cfg.steps), t, 0)
        w.point(step, "tokens_per_s", cfg.tokens_per_step / rank0, t, 0)
        if step and step % cfg.checkpoint_every == 0:
            w.event(step, "checkpoint", f"saved checkpoint at step {step}", t, 0)
        seq += 3
        step += 1
        resumed = False
    truth.rows = dict(w.rows)
    return truth


def _crash(
    w: _Writer,
    rng: random.Random,
    cfg: Config,
    cause: str,
    step: int,
    t: float,
    seq: int,
    truth: Truth,
) -> float:
    """Write one crash of ``cause`` at ``step``; return the time the next attempt starts."""
    ranks = len(HOSTS) * RANKS_PER_HOST
    pid = rng.randrange(2_000, 400_000)
    if cause == "data_bug":
        rank = rng.randrange(ranks)
        t += rng.uniform(0.05, 0.4)
        w.event(step, "crash", index_error(rng), t, rank)
    elif cause == "failing_host":
        host = HOSTS.index(FAILING_HOST)
        rank = host * RANKS_PER_HOST + rng.randrange(RANKS_PER_HOST)
        t += rng.uniform(0.05, 0.4)
        w.event(step, "xid", xid_line(rng, pid), t, rank)
        # The rank hangs in the driver; each peer's collective of that step, enqueued
        # within a step of the Xid, times out after NCCL_TIMEOUT_MS and what it ran for.
        for peer in range(ranks):
            if peer != rank:
                text, ran = watchdog_line(rng, peer, seq)
                enqueued = t + rng.uniform(-cfg.step_time, cfg.step_time)
                w.event(step, "nccl_timeout", text, enqueued + ran, peer)
        t += NCCL_TIMEOUT_MS / 1000 + 2.0
    else:
        host = rng.choice(LINK_HOSTS)
        peer = LINK_HOSTS[1 - LINK_HOSTS.index(host)]
        local = rng.randrange(RANKS_PER_HOST)
        rank = HOSTS.index(host) * RANKS_PER_HOST + local
        t += rng.uniform(0.05, 0.4)
        w.event(step, "crash", ib_completion_line(rng, host, local, peer, pid), t, rank)
    truth.causes[cause]["crashes"].append(
        {"step": step, "rank": rank, "host": HOSTS[rank // RANKS_PER_HOST]}
    )
    return t + rng.uniform(240.0, 420.0)  # requeue, start, load the checkpoint


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the JSONL file to write")
    ap.add_argument("--truth", type=Path, help="write what the grouping should find here")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--steps", type=int, help="steps of the run (default 20000; --small 2000)")
    ap.add_argument("--small", action="store_true", help="the ~2k-step version for tests")
    ap.add_argument(
        "--context-rank",
        choices=["0", "none"],
        default="0",
        help="the rank of the context rows (default 0); none: run-wide rows without a rank",
    )
    args = ap.parse_args(argv)
    cfg = small(args.seed) if args.small else Config(seed=args.seed)
    cfg.context_rank = None if args.context_rank == "none" else 0
    if args.steps is not None:
        if args.steps < 2_000:  # shards of 50 steps leave room for the data bug's crashes
            ap.error(f"--steps must be at least 2000, got {args.steps}")
        scale = args.steps / cfg.steps
        cfg.steps = args.steps
        cfg.shard_every = max(10, round(cfg.shard_every * scale))
        cfg.checkpoint_every = max(5, round(cfg.checkpoint_every * scale))
    with args.out.open("w") as fh:
        truth = generate(fh, cfg)
    if args.truth is not None:
        args.truth.write_text(json.dumps(asdict(truth), indent=1) + "\n")
    n = sum(len(c["crashes"]) for c in truth.causes.values())
    print(
        f"wrote {args.out}: {truth.rows['points']:,} points, {truth.rows['events']:,} events, "
        f"{truth.rows['context']:,} context rows; {n} crashes, {truth.attempts} attempts",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
