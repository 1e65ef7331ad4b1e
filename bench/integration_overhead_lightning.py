"""Benchmark: what RunwatchLogger (and GradNormCallback) add to a Lightning training step.

A real ``lightning.pytorch.Trainer`` on the CPU trains a tiny MLP; each training step first
spins for ``--work-ms`` (default 10 ms) of other work, as a real step would, so the logging
code runs with the caches a training step leaves behind. The module logs 4 scalars per step
with ``self.log`` and ``log_every_n_steps=1``. The same run is repeated with no logger,
Lightning's own ``CSVLogger`` (the anchor), ``RunwatchLogger`` and ``RunwatchLogger`` plus
``GradNormCallback``, in turn, ``--repeats`` times.

Measured per logged step, by timing wrappers around the calls Lightning makes:
- logger: the time inside the logger's ``log_metrics`` and ``save`` (what a logger adds
  beyond Lightning's own logging, which is the same for every logger);
- connector: Lightning's whole ``_LoggerConnector.log_metrics`` (tensor-to-float conversion
  and the logger calls), the framework's logging path end to end;
- callback: GradNormCallback's hooks per step (its gradient norm is real work, not logging).

    python bench/integration_overhead_lightning.py [--steps 800] [--repeats 2] [--work-ms 10]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

import runwatch
from runwatch.integrations.lightning import GradNormCallback, RunwatchLogger

RESULTS = Path(__file__).parent / "results" / "integration_overhead_lightning.md"


class Spinning(pl.LightningModule):
    """A tiny MLP whose training step spins ``work_s`` first (the rest of a real step)."""

    def __init__(self, work_s: float) -> None:
        super().__init__()
        self.work_s = work_s
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        end = time.perf_counter() + self.work_s
        while time.perf_counter() < end:
            pass
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log_dict(
            {
                "train_loss": loss,
                "train_mae": (self.net(x) - y).abs().mean().detach(),
                "lr": 1e-3,
                "tokens_per_s": 1024.0 / max(self.work_s, 1e-6),
            }
        )
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _timed(
    fn: Callable[..., Any], into: list[float], cpu: list[float] | None = None
) -> Callable[..., Any]:
    pc, tt = time.perf_counter, time.thread_time

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        c0 = tt()
        t0 = pc()
        try:
            return fn(*args, **kwargs)
        finally:
            into.append(pc() - t0)
            if cpu is not None:
                cpu.append(tt() - c0)

    return wrapper


class NullLogger(pl.loggers.Logger):
    """Does nothing: the floor of any Lightning logger (and of the timing wrappers)."""

    name = "null"
    version = 0

    def log_metrics(self, metrics: Any, step: Any = None) -> None:
        pass

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


class BareRunLogger(NullLogger):
    """``run.log`` and nothing else: runwatch's own cost at this call site, so that
    RunwatchLogger minus this is what the integration itself adds."""

    def __init__(self, run: runwatch.Run) -> None:
        super().__init__()
        self.run = run

    def log_metrics(self, metrics: Any, step: Any = None) -> None:
        self.run.log(metrics, step=step)


class Timings:
    def __init__(self) -> None:
        self.logger: list[float] = []  # log_metrics + save, summed per logged step below
        self.logger_cpu: list[float] = []
        self.save: list[float] = []
        self.connector: list[float] = []
        self.callback: list[float] = []
        self.step_wall: list[float] = []


def one_fit(kind: str, steps: int, work_s: float, workdir: Path, rep: int) -> Timings:
    t = Timings()
    callbacks: list[pl.Callback] = []
    logger: Any = False
    bare = None
    if kind == "csv":
        logger = CSVLogger(str(workdir / "csv"), name=f"r{rep}")
    elif kind == "null":
        logger = NullLogger()
    elif kind == "bare":
        bare = runwatch.init(name=f"bench-{kind}-{rep}", store=str(workdir / "rw.db"))
        logger = BareRunLogger(bare)
    elif kind.startswith("runwatch"):
        logger = RunwatchLogger(name=f"bench-{kind}-{rep}", store=str(workdir / "rw.db"))
    if kind == "runwatch+grad":
        cb = GradNormCallback()
        for hook in ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end"):
            setattr(cb, hook, _timed(getattr(cb, hook), t.callback))
        callbacks.append(cb)
    if logger is not False:
        logger.log_metrics = _timed(logger.log_metrics, t.logger, t.logger_cpu)
        logger.save = _timed(logger.save, t.save)

    class StepClock(pl.Callback):
        def on_train_batch_start(self, *a: Any) -> None:
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, *a: Any) -> None:
            t.step_wall.append(time.perf_counter() - self.t0)

    callbacks.append(StepClock())
    g = torch.Generator().manual_seed(rep)
    x = torch.randn(512, 16, generator=g)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=32)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=logger,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    connector = trainer._logger_connector
    connector.log_metrics = _timed(connector.log_metrics, t.connector)
    trainer.fit(Spinning(work_s), data)
    if bare is not None:
        bare.finish()
    if kind.startswith("runwatch") or bare is not None:
        # every point must have reached the store, or the figure would flatter the logger
        store = runwatch.open_store(workdir / "rw.db")
        n = len(store.read_series(f"bench-{kind}-{rep}", "train_loss"))
        assert n == steps, f"{kind}: {n} of {steps} train_loss points stored"
    return t


def per_step(t: Timings, callback_hooks: int = 3) -> dict[str, np.ndarray]:
    logger = np.asarray(t.logger)
    save = np.asarray(t.save)
    out = {"connector": np.asarray(t.connector), "step": np.asarray(t.step_wall)}
    if len(logger):
        out["logger"] = logger + save[: len(logger)]  # Lightning calls save after each
        out["logger_cpu"] = np.asarray(t.logger_cpu)
    if t.callback:
        cb = np.asarray(t.callback)
        cb = cb[: len(cb) // callback_hooks * callback_hooks].reshape(-1, callback_hooks)
        out["callback"] = cb.sum(1)
    return out


def us(x: float) -> str:
    return f"{x * 1e6:,.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--work-ms", type=float, default=10.0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)

    kinds = ["none", "null", "csv", "bare", "runwatch", "runwatch+grad"]
    stats: dict[str, dict[str, list[tuple[float, float]]]] = {k: {} for k in kinds}
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for kind in kinds:
                t = one_fit(kind, args.steps, args.work_ms / 1e3, Path(tmp), rep)
                for what, arr in per_step(t).items():
                    arr = arr[10:]  # the first steps pay for imports and allocations
                    pair = (float(np.median(arr)), float(np.percentile(arr, 99)))
                    stats[kind].setdefault(what, []).append(pair)
                print(f"  rep {rep} {kind}: done", file=sys.stderr)
    elapsed = time.time() - started

    def cell(kind: str, what: str) -> tuple[str, str]:
        pairs = stats[kind].get(what)
        if not pairs:
            return "-", "-"
        med = [p[0] for p in pairs]
        p99 = [p[1] for p in pairs]
        return (
            f"{us(statistics.median(med))} [{us(min(med))}-{us(max(med))}]",
            f"{us(statistics.median(p99))} [{us(min(p99))}-{us(max(p99))}]",
        )

    label = {
        "none": "no logger",
        "null": "a Logger that does nothing (floor)",
        "bare": "a Logger calling `run.log` only (runwatch's own cost here)",
        "csv": "Lightning `CSVLogger` (anchor)",
        "runwatch": "`RunwatchLogger`",
        "runwatch+grad": "`RunwatchLogger` + `GradNormCallback`",
    }
    lines = [
        "| logger | in the logger: median (us) | p99 (us) | its CPU: median (us) | Lightning's "
        "logging path: median (us) | p99 (us) | GradNormCallback / step: median (us) | p99 "
        "(us) | step wall: median (ms) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind in kinds:
        lg, lg99 = cell(kind, "logger")
        cpu, _ = cell(kind, "logger_cpu")
        cn, cn99 = cell(kind, "connector")
        cb, cb99 = cell(kind, "callback")
        wall = statistics.median(p[0] for p in stats[kind]["step"]) * 1e3
        row = [label[kind], lg, lg99, cpu, cn, cn99, cb, cb99, f"{wall:.2f}"]
        lines.append("| " + " | ".join(row) + " |")

    def med(kind: str, what: str) -> float:
        return statistics.median(p[0] for p in stats[kind][what])

    rw, csv, bare, null = (med(k, "logger") for k in ("runwatch", "csv", "bare", "null"))
    path = {k: med(k, "connector") for k in kinds}
    summary = [
        f"- Inside the logger, median per logged step: RunwatchLogger {us(rw)} us, a bare "
        f"`run.log` {us(bare)} us, CSVLogger {us(csv)} us, a Logger doing nothing {us(null)} us.",
        f"- Beyond the framework's own logger (CSVLogger): {us(rw - csv)} us "
        f"(goal <= 5 us: {'met' if rw - csv <= 5e-6 else 'NOT met'}).",
        f"- What the integration adds beyond runwatch's own `run.log`: {us(rw - bare)} us "
        f"(goal <= 5 us: {'met' if rw - bare <= 5e-6 else 'NOT met'}).",
        f"- Beyond no logger at all (Lightning's logging path, end to end): "
        f"{us(path['runwatch'] - path['none'])} us with RunwatchLogger, "
        f"{us(path['csv'] - path['none'])} us with CSVLogger.",
    ]
    table = "\n".join(lines)
    print(table)
    print("\n".join(summary))

    head = (
        "# Lightning integration overhead: `bench/integration_overhead_lightning.py`\n\n"
        f"- Measured: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{elapsed:.0f} s\n"
        f"- Machine: {os.cpu_count()} shared cores, load {os.getloadavg()[0]:.1f}; Python "
        f"{platform.python_version()}, lightning {pl.__version__}, torch {torch.__version__}\n"
        f"- Command: `python bench/integration_overhead_lightning.py --steps {args.steps} "
        f"--repeats {args.repeats} --work-ms {args.work_ms:g}`\n\n"
        f"A real Trainer, {args.steps} steps of {args.work_ms:g} ms spin + a tiny MLP, 4 "
        "scalars per step through `self.log_dict`, `log_every_n_steps=1`, live detection "
        "on (runwatch's default). Per logged step; median over the repeats [min-max]; the "
        "first 10 steps left out.\n\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(head + table + "\n\n" + "\n".join(summary) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
