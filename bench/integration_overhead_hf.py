"""Benchmark: what RunwatchCallback adds to each logged step of a Hugging Face Trainer.

A real ``Trainer`` (a one-layer GPT-2 from a config, CPU) is driven at training cadence
without training: each step does ~10 ms of other work (a busy loop, so the caches and the
writer thread see what they would), then the timed part, the Trainer's own per-step
callback events and its ``log()`` call as ``_maybe_log_save_evaluate`` makes it with
``logging_steps=1``:

    callback_handler.on_step_begin(...); callback_handler.on_step_end(...); trainer.log(logs)

Setups, each a fresh Trainer, measured interleaved step by step in a new random order each
step, so that the machine's drift over a repeat, and what the setup before leaves behind
(TensorBoard's writer thread, say), fall on all of them alike. Each setup runs its own copy
of the timed code (``own_code``: ``Trainer.log`` and the handler's events), so that its
bytecode specialises to its own objects, as in a process with one Trainer; before
2026-11-29 all setups ran one copy (``--shared-code``). The setups:

- ``hf alone``: the Trainer's default callbacks, ``report_to=[]`` (the baseline);
- ``+ RunwatchCallback``: the same plus the callback with a real SQLite store and live
  detection on, as a user gets it from two lines;
- ``+ RunwatchCallback left in HF's dispatch`` (anchor): the same, put back in the
  handler's list after it left, so HF dispatches every event to it as before 3f6def8
  (what leaving the dispatch saves);
- ``+ empty TrainerCallback`` (anchor): a callback that does nothing, so what HF's
  dispatch of any one callback's events costs at this cadence (the floor of a callback);
  its ``on_log`` is the function ``DefaultFlowCallback`` ran just before, warm;
- ``+ a callback with its own empty on_log`` (anchor): what any callback that logs pays,
  its own ``on_log`` called on cold caches, doing nothing;
- ``+ TensorBoardCallback`` (anchor): ``report_to=["tensorboard"]``, HF's own integration;
- ``hf alone, a second Trainer`` (anchor): the baseline again, so how far two identical
  setups read apart (the figure's noise floor);
- anchors without a Trainer: ``run.log`` of the same values at the same cadence and back to
  back, and the callback's own work per log, back to back: the append to HF's
  ``log_history`` that marks the entry, beyond a plain list's (the callback is out of HF's
  per-step dispatch while training, ``runwatch.integrations.hf_dispatch``).

Printed: median and p99 of the timed part per setup and repeat, and each setup's median
beyond the baseline; also the CPU time of the callback's writer thread per logged step,
which does the work the training thread no longer does (it holds the GIL meanwhile).
Goal: RunwatchCallback <= 5 us median beyond HF's own logging.

    python bench/integration_overhead_hf.py [--steps 1500] [--repeats 3] [--work-ms 10]
                                            [--shared-code]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from hook_cadence import STALL_NS, schedstat  # bench/: a stall; a thread's scheduler statistics
from transformers.trainer_callback import CallbackHandler

import runwatch
from runwatch.integrations.hf import RunwatchCallback

RESULTS = Path(__file__).parent / "results" / "integration_overhead_hf.md"
SETUPS = (
    "hf alone",
    "+ RunwatchCallback",
    "+ RunwatchCallback left in HF's dispatch",
    "+ empty TrainerCallback",
    "+ a callback with its own empty on_log",
    "+ TensorBoardCallback",
    "hf alone, a second Trainer",
)
RAW = (
    "run.log alone, same cadence",
    "run.log alone, back to back",
    "RunwatchCallback's mark per log, back to back",
)
WRITER = "RunwatchCallback's writer thread, CPU per logged step"
STALL_US = STALL_NS / 1000
SETTLED_US = 3.0


OWN_CODE = {  # what the timed part runs whose bytecode specialises to a setup's objects
    transformers.Trainer: ("log",),
    CallbackHandler: ("call_event", "on_step_begin", "on_step_end", "on_log"),
}


def own_code(fn: Any) -> Any:
    """``fn`` with a code object of its own. CPython (3.11+) specialises each code object's
    bytecode to the types it meets: one ``Trainer.log`` shared by every setup meets a plain
    ``log_history`` and a marking one by turns, which a process with one Trainer never
    does, and every setup pays the misses (README-integrations-hf.md)."""
    copy = types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    copy.__kwdefaults__, copy.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    return copy


def own_class(cls: type, tag: str) -> type:
    """A subclass of ``cls`` whose methods in ``OWN_CODE`` have code of their own."""
    return type(
        f"{cls.__name__}_{tag}", (cls,), {n: own_code(getattr(cls, n)) for n in OWN_CODE[cls]}
    )


def timed_part(trainer: Any, handler: Any, args: Any, state: Any, logs: dict) -> None:
    """What the Trainer does per step with ``logging_steps=1``: the step's callback events
    and ``_maybe_log_save_evaluate``'s ``log()``."""
    trainer.control = handler.on_step_begin(args, state, trainer.control)
    state.global_step += 1
    trainer.control = handler.on_step_end(args, state, trainer.control)
    trainer.log(logs)


class OwnEmptyOnLog(transformers.TrainerCallback):
    """A callback that logs nothing, with its own ``on_log`` (anchor)."""

    def on_log(self, args, state, control, **kwargs):
        return None


def make_trainer(
    setup: str, tmp: Path, tag: str, shared_code: bool = False
) -> tuple[transformers.Trainer, Any, RunwatchCallback | None]:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
    args = transformers.TrainingArguments(
        output_dir=str(tmp / f"out-{tag}"),
        max_steps=10**6,
        logging_steps=1,
        report_to=["tensorboard"] if setup == "+ TensorBoardCallback" else [],
        use_cpu=True,
        save_strategy="no",
    )
    callbacks = []
    watching = None
    if setup.startswith("+ RunwatchCallback"):
        watching = RunwatchCallback(name=f"bench-{tag}", store=str(tmp / "bench.db"))
        callbacks.append(watching)
    elif setup == "+ empty TrainerCallback":
        callbacks.append(transformers.TrainerCallback())
    elif setup == "+ a callback with its own empty on_log":
        callbacks.append(OwnEmptyOnLog())
    trainer_class = transformers.Trainer if shared_code else own_class(transformers.Trainer, tag)
    trainer = trainer_class(
        model=transformers.GPT2LMHeadModel(config), args=args, callbacks=callbacks
    )
    if not shared_code:
        trainer.callback_handler.__class__ = own_class(CallbackHandler, tag)
    state, control = trainer.state, trainer.control
    state.max_steps = args.max_steps
    # What train() does before its first step: every callback sees on_train_begin.
    trainer.control = trainer.callback_handler.on_train_begin(args, state, control)
    if setup == "+ RunwatchCallback left in HF's dispatch":
        watching._out.restore()  # as when no handler is found: every event dispatched to it
        watching._out = None
    return trainer, args, watching


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += sum(range(200))


def measure_setups(
    steps: int, work: float, tmp: Path, tag: str, shared_code: bool = False
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Every setup's timed part, interleaved step by step (a fresh Trainer each, in a new
    random order each step), each step after its own ``work`` seconds of busy work: the
    machine's drift over a repeat, and what the setup before leaves behind, fall on all
    setups alike, and every call still runs on cold caches. Returned: the wall time of each
    (us), and the training thread's CPU time over it (us), which leaves out the machine's
    stalls (time the CPU was taken from the thread; bench/README-hook-cadence.md). Each
    setup runs code of its own (``own_code``) unless ``shared_code``."""
    trainers = {s: make_trainer(s, tmp, f"{tag}-{k}", shared_code) for k, s in enumerate(SETUPS)}
    parts = {s: timed_part if shared_code else own_code(timed_part) for s in SETUPS}
    rng = np.random.default_rng(0)
    loss = 4.0 + rng.normal(0, 0.05, steps)
    grad = np.exp(rng.normal(0, 0.2, steps))
    out = {s: np.empty(steps) for s in SETUPS}
    on_cpu = {s: np.empty(steps) for s in SETUPS}
    writer = trainers["+ RunwatchCallback"][2].run._writer.worker._thread.native_id
    writer_cpu = schedstat(writer)[0]
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    with open(os.devnull, "w") as sink:  # HF prints each log (ProgressCallback): keep it
        for i in range(steps):
            for j in rng.permutation(len(SETUPS)):
                setup = SETUPS[j]
                trainer, args, _ = trainers[setup]
                handler, state = trainer.callback_handler, trainer.state
                busy(work)
                logs = {"loss": float(loss[i]), "grad_norm": float(grad[i]), "learning_rate": 3e-4}
                with contextlib.redirect_stdout(sink):
                    c0 = cpu_clock()
                    t0 = clock()
                    parts[setup](trainer, handler, args, state, logs)
                    out[setup][i] = clock() - t0
                    on_cpu[setup][i] = cpu_clock() - c0
    writer_cpu = schedstat(writer)[0] - writer_cpu
    for trainer, args, _ in trainers.values():
        trainer.control = trainer.callback_handler.on_train_end(
            args, trainer.state, trainer.control
        )
    timed = {s: v / 1000.0 for s, v in out.items()}  # us
    timed[WRITER] = np.array([writer_cpu / steps * 1e6])
    return timed, {s: v / 1000.0 for s, v in on_cpu.items()}


def measure_raw(setup: str, steps: int, work: float, tmp: Path, tag: str) -> np.ndarray:
    """The hook by itself: ``run.log`` of the same values, no Trainer (anchor)."""
    run = runwatch.init(name=f"raw-{tag}", store=str(tmp / "bench.db"))
    work = work if setup.endswith("same cadence") else 0.0
    out = np.empty(steps)
    clock = time.perf_counter_ns
    for i in range(steps):
        if work:
            busy(work)
        logs = {"loss": 4.0, "grad_norm": 1.0, "lr": 3e-4, "epoch": 0.5}
        t0 = clock()
        run.log(logs, step=i)
        out[i] = clock() - t0
    run.finish()
    return out / 1000.0


def measure_direct(setup: str, steps: int, work: float, tmp: Path, tag: str) -> np.ndarray:
    """The callback's own work on the training thread: the first step's mark, then per
    log ``Trainer.log``'s append to ``state.log_history``, which marks the entry, timed
    back to back beyond the same append to a plain list, with a real run behind it (the
    writer never idle)."""
    trainer, args, _ = make_trainer("+ RunwatchCallback", tmp, tag)
    state, control = trainer.state, trainer.control
    trainer.callback_handler.on_step_begin(args, state, control)
    plain: list[dict[str, Any]] = []
    out = np.empty(steps * 10)
    clock = time.perf_counter_ns
    for i in range(len(out)):
        entry = {"loss": 4.0, "grad_norm": 1.0, "learning_rate": 3e-4, "epoch": 0.5, "step": i}
        t0 = clock()
        plain.append(entry)
        t1 = clock()
        state.log_history.append(entry)
        out[i] = (clock() - t1) - (t1 - t0)
    trainer.callback_handler.on_train_end(args, state, control)
    return out / 1000.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work-ms", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--shared-code",
        action="store_true",
        help="all setups run one copy of HF's code, as this bench did before 2026-11-29",
    )
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    transformers.logging.set_verbosity_error()

    rows: dict[str, list[tuple[float, float]]] = {s: [] for s in SETUPS + RAW + (WRITER,)}
    means: dict[str, list[float]] = {s: [] for s in SETUPS + RAW + (WRITER,)}
    cpu_rows: dict[str, list[float]] = {s: [] for s in SETUPS}
    stalled: dict[str, list[float]] = {s: [] for s in SETUPS}
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(opts.repeats):
            timed, on_cpu = measure_setups(
                opts.steps, opts.work_ms / 1000, Path(tmp), str(r), opts.shared_code
            )
            for setup, us in on_cpu.items():
                cpu_rows[setup].append(float(np.median(us)))
                stalled[setup].append(float(np.mean(timed[setup] - us > STALL_US)) * 100)
            for setup in RAW:
                how = measure_direct if setup == RAW[2] else measure_raw
                timed[setup] = how(setup, opts.steps, opts.work_ms / 1000, Path(tmp), f"{r}")
            for setup, us in timed.items():
                rows[setup].append((float(np.median(us)), float(np.percentile(us, 99))))
                means[setup].append(float(np.mean(us)))
    elapsed = time.time() - started

    base = [m for m, _ in rows["hf alone"]]
    lines = [
        "| setup | median us (per repeat) | p99 us (per repeat) | mean us (per repeat) "
        "| median beyond hf alone, us |",
        "|---|---|---|---|---|",
    ]
    for setup in SETUPS + RAW + (WRITER,):
        med = [m for m, _ in rows[setup]]
        p99 = [p for _, p in rows[setup]]
        beyond = [m - b for m, b in zip(med, base, strict=True)]
        extra = (
            f"{statistics.median(beyond):+.1f} ({' / '.join(f'{b:+.1f}' for b in beyond)})"
            if setup in SETUPS
            else "(off the training thread)"
            if setup == WRITER
            else "(no Trainer)"
        )
        lines.append(
            f"| {setup} | {' / '.join(f'{m:.1f}' for m in med)} | "
            f"{' / '.join(f'{p:.1f}' for p in p99)} | "
            f"{' / '.join(f'{m:.1f}' for m in means[setup])} | {extra} |"
        )
    # A repeat is settled when its two identical baselines agree: on this machine whole
    # minutes come when cold memory costs several times more, unevenly between objects,
    # and the two "hf alone" Trainers then read tens of µs apart (README-integrations-hf).
    again = [m - b for (m, _), b in zip(rows["hf alone, a second Trainer"], base, strict=True)]
    settled = [abs(a) <= SETTLED_US for a in again]
    beyond_each = [m - b for (m, _), b in zip(rows["+ RunwatchCallback"], base, strict=True)]
    kept = [b for b, ok in zip(beyond_each, settled, strict=True) if ok]
    runwatch_beyond = statistics.median(kept) if kept else math.nan
    verdict = "no settled repeat" if not kept else "met" if runwatch_beyond <= 5.0 else "NOT met"
    header = (
        f"{opts.steps} logged steps x {opts.repeats} repeats per setup, {opts.work_ms:g} ms of "
        f"other work between steps; timed: on_step_begin + on_step_end + Trainer.log(). "
        f"transformers {transformers.__version__}, torch {torch.__version__}, Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs; {elapsed:.0f} s. "
        + (
            "All setups ran one copy of HF's code (--shared-code)."
            if opts.shared_code
            else "Each setup ran its own copy of the timed code (Trainer.log, the handler's "
            "events), as a process with one Trainer does."
        )
    )
    raw = statistics.median(m for m, _ in rows[RAW[0]])
    summary = (
        f"The hook alone (`run.log` at the same cadence, no Trainer): {raw:.1f} us median; "
        f"back to back: {statistics.median(m for m, _ in rows[RAW[1]]):.1f} us; "
        f"the callback's mark per log back to back: "
        f"{statistics.median(m for m, _ in rows[RAW[2]]):.1f} us.\n\n"
    )
    summary += (
        f"Goal <= 5 us median beyond HF's own logging: {verdict} ({runwatch_beyond:+.1f} us, "
        f"median over the {len(kept)} of {len(again)} repeats whose two hf-alone Trainers "
        f"read within {SETTLED_US:g} us of each other). "
    )
    for anchor, said in (
        ("+ empty TrainerCallback", "a callback that does nothing"),
        ("+ a callback with its own empty on_log", "a callback with its own empty on_log"),
    ):
        beyond = [
            m - e for (m, _), (e, _) in zip(rows["+ RunwatchCallback"], rows[anchor], strict=True)
        ]
        summary += (
            f"Beyond {said}: {statistics.median(beyond):+.1f} us "
            f"({' / '.join(f'{b:+.1f}' for b in beyond)}). "
        )
    summary += (
        f"The baseline against itself (a second Trainer): "
        f"{' / '.join(f'{b:+.1f}' for b in again)} us."
    )
    cpu_base = cpu_rows["hf alone"]
    cpu_lines = [
        "The training thread's CPU time over the same timed parts, which leaves out the "
        "machine's stalls (the wall time a part spent with its CPU taken away), and the "
        f"share of parts that met one (wall over CPU by more than {STALL_US:.0f} us):",
        "",
        "| setup | CPU median us (per repeat) | CPU median beyond hf alone, us | "
        "parts stalled, % (per repeat) |",
        "|---|---|---|---|",
    ]
    for setup in SETUPS:
        beyond = [c - b for c, b in zip(cpu_rows[setup], cpu_base, strict=True)]
        cpu_lines.append(
            f"| {setup} | {' / '.join(f'{c:.1f}' for c in cpu_rows[setup])} | "
            f"{statistics.median(beyond):+.1f} ({' / '.join(f'{b:+.1f}' for b in beyond)}) | "
            f"{' / '.join(f'{x:.0f}' for x in stalled[setup])} |"
        )
    text = "\n".join([header, "", *lines, "", summary, "", *cpu_lines])
    print(text)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(
        "# RunwatchCallback overhead per logged step (bench/integration_overhead_hf.py)\n\n"
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"`python bench/integration_overhead_hf.py --steps {opts.steps} "
        f"--repeats {opts.repeats} --work-ms {opts.work_ms:g}"
        f"{' --shared-code' if opts.shared_code else ''}`\n\n{text}\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
