"""Hugging Face Transformers: a ``TrainerCallback`` that feeds a runwatch run.

Two lines of user code::

    from runwatch.integrations.hf import RunwatchCallback
    trainer = Trainer(..., callbacks=[RunwatchCallback(store="runs.db")])

The run starts in ``on_train_begin``, when the Trainer knows the model and the number of
optimizer steps, so the config holds ``params``, ``total_steps`` and the planned LR
``schedule`` from the start (the store takes a run's config when the run begins). Metrics
keep HF's names except ``learning_rate`` -> ``lr``; ``step_time_s`` and ``tokens_per_s``
are measured here. While ``train()`` runs the callback is out of HF's per-step dispatch
and the training thread only marks each new ``log_history`` entry with the time
(``hf_dispatch``); the writer thread reads it (``Run.follow``). Under DDP each rank's own
time and all-reduce wait are logged too (``runwatch.torch``), turned on at the first
forward. A crash leaving ``train()`` is never seen by a callback: the run stays open and
runwatch's exit hook records the uncaught exception as a crash
(bench/README-integrations-hf.md has the reasoning).
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections import deque
from collections.abc import Mapping
from functools import partial
from time import time
from typing import Any

from transformers import TrainerCallback

from runwatch.hook.ranks import keeps_metric
from runwatch.hook.run import Run, init
from runwatch.integrations.hf_dispatch import MarkingHistory, OutOfDispatch, calling_handler

log = logging.getLogger("runwatch.integrations.hf")

_RENAME = {"learning_rate": "lr"}
"""HF log keys whose runwatch name differs; every other numeric key is kept as HF names it
(``loss``, ``grad_norm``, ``epoch``, ``eval_loss``, ``train_runtime``, ...)."""

_NUMBER = (int, float)
"""Numbers, bools aside: in the stored config (``_plain``) and in the logged entries
(``_LogHistoryReader``, which also takes anything with ``.item()``)."""


def _plain(value: Any) -> Any:
    """A JSON-safe copy: dicts and lists kept, numbers and strings as they are, the rest as
    ``str`` (enums, dtypes, paths), so the stored config reads the same everywhere."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, _NUMBER):
        return value if not isinstance(value, float) or math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return str(getattr(value, "value", value))


def hf_schedule(args: Any, total_steps: int) -> dict[str, Any] | None:
    """runwatch's planned ``schedule`` (runwatch.expect.planned) for the Trainer's LR
    scheduler, or None for schedulers runwatch cannot plan (restarts, polynomial, plateau)."""
    kind = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
    kwargs = args.lr_scheduler_kwargs if isinstance(args.lr_scheduler_kwargs, Mapping) else {}
    warmup = int(args.get_warmup_steps(total_steps))
    peak = float(args.learning_rate)
    out: dict[str, Any] = {"warmup": warmup, "peak_lr": peak}
    if kind in ("constant", "constant_with_warmup"):
        return {"name": "constant", **out, "warmup": warmup if kind.endswith("warmup") else 0}
    if kind in ("linear", "cosine"):
        return {"name": kind, **out}
    if kind in ("cosine_with_min_lr", "cosine_warmup_with_min_lr"):
        rate = kwargs.get("min_lr_rate")
        if rate is None and kwargs.get("min_lr") is not None and peak > 0:
            rate = float(kwargs["min_lr"]) / peak
        return {"name": "cosine", **out, "final_lr_fraction": float(rate or 0.0)}
    if kind == "warmup_stable_decay" and "num_decay_steps" in kwargs:
        shape = kwargs.get("decay_type", "cosine")
        if shape not in ("cosine", "linear"):
            return None
        stable = kwargs.get("num_stable_steps")
        start = (
            warmup + int(stable) if stable is not None else total_steps - kwargs["num_decay_steps"]
        )
        return {
            "name": "wsd",
            **out,
            "decay_start": int(start),
            "decay_shape": shape,
            "final_lr_fraction": float(kwargs.get("min_lr_ratio", 0.0)),
        }
    return None


class RunwatchCallback(TrainerCallback):
    """Log a ``transformers.Trainer`` run to runwatch (live detection and alerts included).

    ``name`` (default ``$RUNWATCH_RUN``, else ``args.run_name``, else the output directory's
    name) and every keyword (``store``, ``project``, ``config``, ``url``, ``webhook``,
    ``family``, ``monitor``, ...) go to :func:`runwatch.init`. ``seq_len`` declares the
    tokens per sample, giving ``tokens_per_step`` (the Trainer's global batch x seq_len) and
    ``tokens_per_s`` when the Trainer does not count tokens itself
    (``include_num_input_tokens_seen``). ``run`` is the runwatch Run while training.
    """

    def __init__(self, name: str | None = None, *, seq_len: int | None = None, **options: Any):
        self._name = name
        self._seq_len = seq_len
        self._config: dict[str, Any] = dict(options.pop("config", None) or {})
        self._options = options
        self.run: Run | None = None
        self._marks: deque[tuple[Any, ...]] | None = None  # to the writer (_LogHistoryReader)
        self._out: OutOfDispatch | None = None  # while train() runs

    # -- start -----------------------------------------------------------------------------
    def _run_name(self, args: Any) -> str:
        if self._name:
            return self._name
        if os.environ.get("RUNWATCH_RUN"):
            return os.environ["RUNWATCH_RUN"]
        if args.run_name:
            return str(args.run_name)
        return os.path.basename(os.path.normpath(args.output_dir or "")) or "hf-trainer"

    def _run_config(self, args: Any, state: Any, model: Any) -> dict[str, Any]:
        total = int(state.max_steps)
        config: dict[str, Any] = {"total_steps": total, "trainer": _plain(args.to_dict())}
        if model is not None:
            config["params"] = sum(p.numel() for p in model.parameters())
            model_config = getattr(model, "config", None)
            if hasattr(model_config, "to_dict"):
                config["model"] = _plain(model_config.to_dict())
        schedule = hf_schedule(args, total) if total > 0 else None
        if schedule is not None:
            config["schedule"] = schedule
        if self._seq_len:
            batch = args.per_device_train_batch_size * args.gradient_accumulation_steps
            config["tokens_per_step"] = int(batch * args.world_size * self._seq_len)
        config.update(self._config)  # what the user gave wins
        return config

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.run is not None:
            # train() ran before without reaching on_train_end: it raised and was caught.
            self.run.event("crash", message="train() ended without on_train_end")
            self.run.finish(status="crashed")
        options = dict(self._options)
        if args.world_size > 1:
            pushes = options.get("store") is None and (
                options.get("url") or os.environ.get("RUNWATCH_URL")
            )
            if not pushes and args.process_index != 0:
                # Several processes and one SQLite file: only rank 0 writes the run; another
                # rank would resume it as a new attempt. Push to a server (url=) to see ranks.
                log.debug("runwatch: rank %d does not log to a local store", args.process_index)
                return
            # Ranks come from the Trainer, which knows them even when the launcher's
            # variables are not the ones runwatch reads (accelerate, deepspeed): rank 0 logs
            # everything, other ranks their own timing (runwatch.hook.ranks).
            options.setdefault("labels", {"rank": args.process_index, "host": socket.gethostname()})
            if not options.get("all_ranks") and args.process_index != 0:
                options.setdefault("keep_metric", partial(keeps_metric, rank=args.process_index))
        config = self._run_config(args, state, model)
        self.run = init(self._run_name(args), config=config, **options)
        if args.world_size > 1 and model is not None:
            _time_ranks_when_wrapped(model, self.run)
        self._marks = deque()
        self.run.follow(_LogHistoryReader(self._marks, config.get("tokens_per_step")))
        # Trainer.log's append marks each entry with its time.
        state.log_history = MarkingHistory(state.log_history, self._marks)
        # The first step's begin starts the first timing window; then HF's no-op again.
        self.on_step_begin = self._restart_window
        # Out of HF's per-step dispatch until on_train_end (hf_dispatch says why).
        handler = calling_handler(self)
        self._out = OutOfDispatch(handler, self) if handler is not None else None
        log.debug("runwatch: run %r started from the HF Trainer", self.run.name)

    def _restart_window(self, args, state, control, **kwargs):
        # Evaluation, checkpoints and prediction are not training steps: the next timing
        # window starts when they end (and the first one at the first step's begin), so an
        # eval does not read as a slow step.
        self.__dict__.pop("on_step_begin", None)
        marks = self._marks
        if marks is not None:
            marks.append((None, time(), state.global_step, state.num_input_tokens_seen or 0))

    on_evaluate = on_save = on_predict = _restart_window

    # -- end ---------------------------------------------------------------------------------
    def on_train_end(self, args, state, control, **kwargs):
        run, self.run = self.run, None
        self.__dict__.pop("on_step_begin", None)
        if run is not None:
            run.finish()  # logs the last step's runwatch.torch wait first, reads the last log
        if type(state.log_history) is MarkingHistory:
            state.log_history = list(state.log_history)
        self._marks = None
        if self._out is not None:
            self._out.restore()
            self._out = None


class _LogHistoryReader:
    """The HF log entries the callback marked, as ``Run.follow`` items, on the writer thread.

    Each entry's numbers under runwatch's names (``_RENAME``; strings, bools and ``step``
    left out). A training log (one with ``loss``) also gets ``step_time_s`` and
    ``tokens_per_s`` over its window: from the previous training log, or from the last
    restart mark (first step, end of an eval, a checkpoint or a prediction) if later.
    """

    def __init__(self, marks: deque[tuple[Any, ...]], tokens_per_step: float | None):
        self._marks = marks
        self._tokens_per_step = tokens_per_step
        self._window: tuple[float, int, int] | None = None  # (time, step, tokens seen) at start

    def __call__(self) -> list[tuple[int, float, dict[str, Any]]]:
        items = []
        marks = self._marks
        while marks:
            mark = marks.popleft()
            if mark[0] is None:
                self._window = mark[1:]
                continue
            entry, when = mark
            step = entry.get("step")
            if type(step) is not int:
                continue
            numbers = {
                _RENAME.get(key, key): value
                for key, value in entry.items()
                if key != "step" and (type(value) in _NUMBER or hasattr(value, "item"))
            }
            if "loss" in entry:
                numbers.update(self._timing(when, step, entry.get("num_input_tokens_seen")))
            if numbers:
                items.append((step, when, numbers))
        return items

    def _timing(self, when: float, step: int, seen: int | None) -> dict[str, float]:
        window, self._window = self._window, (when, step, seen or 0)
        if window is None:
            return {}
        began, first, seen_then = window
        steps, spent = step - first, when - began
        if steps <= 0 or spent <= 0:
            return {}
        timing = {"step_time_s": spent / steps}
        if seen:
            timing["tokens_per_s"] = (seen - seen_then) / spent
        elif self._tokens_per_step:
            timing["tokens_per_s"] = self._tokens_per_step * steps / spent
        return timing


def _time_ranks_when_wrapped(model: Any, run: Run) -> None:
    """Turn on :mod:`runwatch.torch` (each rank's own time and collective wait) at the
    model's first forward under DDP or FSDP2.

    Why then: a callback gets the model the Trainer wraps, never the wrapper, and the
    Trainer wraps it (through accelerate) only after ``on_train_begin``. DDP names itself
    while its forward runs (``DistributedDataParallel._get_active_ddp_module``), and a comm
    hook may be registered up to the first backward. FSDP2 (``fully_shard``) shards the
    model in place, so by its first forward the model itself is the ``FSDPModule``. Not DDP
    or FSDP2 (DeepSpeed, FSDP1, one process): nothing is timed.
    """
    from torch.nn.parallel import DistributedDataParallel

    def first_forward(module: Any, inputs: Any) -> None:
        handle.remove()
        try:
            from torch.distributed.fsdp import FSDPModule

            import runwatch.torch as rt

            if isinstance(model, FSDPModule):
                rt.instrument(model, run)
                return
            ddp = DistributedDataParallel._get_active_ddp_module()
            if ddp is None or ddp.module is not model:
                log.debug("runwatch: the model is not run by DDP or FSDP2; no per-rank timing")
                return
            rt.instrument(ddp, run)
        except Exception as exc:  # one line, and training goes on without the timing
            log.warning("runwatch: no per-rank timing: %s", exc)

    handle = model.register_forward_pre_hook(first_forward)
