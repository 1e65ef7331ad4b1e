"""PyTorch Lightning: a ``Logger`` that feeds a runwatch run, and a callback for the
gradient norm and step time.

Two lines of user code::

    from runwatch.integrations.lightning import GradNormCallback, RunwatchLogger
    trainer = Trainer(logger=RunwatchLogger(store="runs.db"), callbacks=[GradNormCallback()])

The run starts lazily, when Lightning hands over the model (``log_graph``, right after
``log_hyperparams``), so its config holds the hyperparameters, ``params`` and
``total_steps`` from the start: the store takes a run's config when the run begins.
Only global rank 0 logs (Lightning's ``rank_zero_only``), because Lightning's DDP launcher
sets ``LOCAL_RANK`` but not ``RANK`` and every process would otherwise look like rank 0.

Under DDP, ``GradNormCallback`` also turns on :mod:`runwatch.torch` when training starts: each
rank's own compute and all-reduce wait per step (``step_time_compute``, ``comm_wait_time``),
what the straggler detector needs. Every rank logs them when the run pushes to a server
(``url=`` or ``$RUNWATCH_URL``: ranks other than 0 then start a run of their own, labelled
with their rank); into a local store only rank 0 writes, so only its own time and wait are
kept (its wait still says that the job waits for someone). ``stragglers=False`` turns it off.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from runwatch.hook.run import Run, current_run, init

log = logging.getLogger("runwatch.integrations.lightning")

_STATUS = {"success": "finished", "finished": "finished"}
"""Lightning's finalize statuses that mean the run ended well; any other ("failed", or
an unknown one) is recorded as crashed."""


def _plain(params: Mapping[str, Any] | Namespace) -> dict[str, Any]:
    """Hyperparameters as a plain dict (a Namespace, nested Namespaces, callables named)."""
    if isinstance(params, Namespace):
        params = vars(params)
    out: dict[str, Any] = {}
    for key, value in dict(params).items():
        if isinstance(value, Namespace | Mapping):
            value = _plain(value)
        elif callable(value) and not isinstance(value, type):
            value = getattr(value, "__name__", repr(value))
        out[str(key)] = value
    return out


def _called_from_lightning_setup() -> bool:
    """Whether Lightning's ``_call_setup_hook`` asked (through ``rank_zero_experiment``).
    Should Lightning rename it, the run starts there and late hyperparameters are warned
    about (tests/integrations/test_lightning.py pins the complete config)."""
    frame = sys._getframe(2)
    for _ in range(3):
        if frame is None:
            return False
        if frame.f_code.co_name == "_call_setup_hook":
            return True
        frame = frame.f_back
    return False


class RunwatchLogger(pl.loggers.Logger):
    """A Lightning ``Logger`` writing to a runwatch run (live detection and alerts included).

    ``name`` and every keyword (``store``, ``project``, ``config``, ``url``, ``monitor``,
    ``webhook``, ...) go to :func:`runwatch.init`. Metrics keep Lightning's names
    (``train_loss``, ``lr-AdamW``, ``epoch``) at Lightning's step. ``experiment`` is the
    runwatch :class:`~runwatch.Run` (started on first use).
    """

    def __init__(self, name: str | None = None, **options: Any) -> None:
        super().__init__()
        if name is None:
            # Decided once so that ``name`` is the same before and after the run starts.
            name = os.environ.get("RUNWATCH_RUN") or time.strftime("run-%Y%m%d-%H%M%S")
        self._name = name
        self._config: dict[str, Any] = dict(options.pop("config", None) or {})
        self._options = options
        self._run: Run | None = None
        self._warned_late = False

    # -- identity ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> str:
        """Empty: a runwatch run has no versions (running the same name again is a new
        attempt of the same run), so Lightning's checkpoints go to ``<root>/<name>/
        checkpoints`` rather than ``<root>/<name>/version_None/checkpoints``."""
        return ""

    @property
    @rank_zero_experiment
    def experiment(self) -> Run:
        """The runwatch run, started now if Lightning has not started it yet.

        Lightning touches this in its setup, before the hyperparameters and the model are
        known; that touch does not start the run, so the stored config is complete."""
        if self._run is None and _called_from_lightning_setup():
            return None  # type: ignore[return-value]  # Lightning discards it
        return self._start()

    @property
    def run(self) -> Run | None:
        """The runwatch run if this process logs one (global rank 0, started), else None."""
        return self._run

    def _start(self) -> Run:
        if self._run is None:
            self._run = init(self._name, config=self._config, **self._options)
        return self._run

    # -- what Lightning calls ---------------------------------------------------------------
    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace, *args: Any, **kw: Any) -> None:
        """Merge ``params`` into the run's config (stored when the run starts)."""
        self._merge(_plain(params))

    @rank_zero_only
    def log_graph(self, model: torch.nn.Module, input_array: Any = None) -> None:
        """Lightning's hand-over of the model: add ``params`` and ``total_steps``, then
        start the run (the last point before training where both are known)."""
        extra: dict[str, Any] = {}
        try:
            extra["params"] = sum(p.numel() for p in model.parameters())
            trainer = getattr(model, "_trainer", None)
            if trainer is not None and trainer.state.fn == "fit":
                total = trainer.estimated_stepping_batches
                if total != float("inf"):
                    extra["total_steps"] = int(total)
        except Exception as exc:  # a config detail must never stop training
            log.debug("runwatch: params/total_steps not known: %s", exc)
        for key, value in extra.items():
            self._config.setdefault(key, value)  # what the user gave wins
        self._start()

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """``run.log(metrics, step=step)``: queued for the writer thread, never blocks.

        The rank is checked only while no run exists (ranks other than 0 never start one):
        one Python call less per step, which after a training step's work runs with cold
        caches at a few microseconds each (bench/results/integration_overhead_lightning.md)."""
        run = self._run
        if run is None:
            if rank_zero_only.rank != 0:
                return
            run = self._start()
        run.log(metrics, step=step)

    def save(self) -> None:
        """Nothing: Lightning calls it after every ``log_metrics``, and the run's writer
        thread already writes every ``flush_interval`` seconds."""

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Finish the run: "success" as finished, "failed" (an exception) as crashed, with a
        crash event naming the exception; Ctrl-C (also "failed" to Lightning) as finished.
        A later fit or test on this logger resumes the run as a new attempt."""
        run, self._run = self._run, None
        if run is None:
            if status in _STATUS:
                return  # nothing was logged: no empty run
            run = self._start()
            self._run = None
        outcome = _STATUS.get(status, "crashed")
        exc = sys.exc_info()[1]  # Lightning calls this while handling the exception
        if isinstance(exc, KeyboardInterrupt):
            outcome = "finished"  # stopped by a person, as runwatch's own Run.__exit__ has it
        elif outcome == "crashed":
            message = f"{type(exc).__name__}: {exc}" if exc is not None else f"Lightning {status}"
            run.event("crash", message=message)
        run.finish(status=outcome)

    def _merge(self, params: dict[str, Any]) -> None:
        if self._run is not None and not self._warned_late:
            self._warned_late = True
            log.warning(
                "runwatch: hyperparameters logged after run %r started are not stored (the "
                "config is stored when the run starts); pass config= to RunwatchLogger",
                self._name,
            )
        self._config.update(params)


def _total_norm(module: torch.nn.Module) -> torch.Tensor | float:
    """The total L2 norm of ``module``'s gradients, as a 0-d tensor: the writer thread turns
    it into a float, so a GPU run does not wait here for the backward pass to finish.
    ``_foreach_norm`` is what ``clip_grad_norm_`` uses; it takes half the time of
    ``get_total_norm`` on small models, which also handles grads on several devices."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return float("nan")
    try:
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    except RuntimeError:  # grads on several devices
        return torch.nn.utils.get_total_norm(grads, 2.0)


class GradNormCallback(pl.Callback):
    """Log ``grad_norm`` (total L2 norm of the gradients, before clipping) and
    ``step_time_s`` (wall time of each training batch) to the trainer's runwatch run.

    Both are logged together, at the end of the batch, at the step Lightning logs that
    batch's training metrics (``trainer.global_step`` when the batch began, i.e. before its
    optimizer step), so a spike in the gradient norm and one in the loss line up. The run
    is the trainer's :class:`RunwatchLogger` run, else the run :func:`runwatch.init`
    started last; ranks other than 0 do nothing.
    """

    def __init__(self, clock: Any = time.perf_counter, *, stragglers: bool = True) -> None:
        self._clock = clock
        self._stragglers = stragglers
        self._rank_run: Run | None = None  # a rank other than 0's own run (server only)
        self._logger: RunwatchLogger | None = None
        self._started = 0.0
        self._step = 0
        self._norm: torch.Tensor | float | None = None
        self._warned = False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._logger = next((lg for lg in trainer.loggers if isinstance(lg, RunwatchLogger)), None)

    def _run(self, trainer: pl.Trainer) -> Run | None:
        if trainer.global_rank != 0:
            return None
        logger = self._logger
        # The logger's run starts at Lightning's log_graph; without hparams autologging it
        # starts here, at the first batch.
        run = (logger._run or logger._start()) if logger is not None else current_run()
        if run is None and not self._warned:
            self._warned = True
            log.warning(
                "runwatch: GradNormCallback found no RunwatchLogger on the trainer and no "
                "runwatch run; grad_norm and step_time_s are not logged"
            )
        return run

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Under DDP, time each rank's compute and wait (see the module doc)."""
        if not self._stragglers:
            return
        from torch.nn.parallel import DistributedDataParallel

        model = getattr(trainer.strategy, "model", None)
        if not isinstance(model, DistributedDataParallel):
            return
        try:
            import runwatch.torch as rt

            run = self._run(trainer) if trainer.global_rank == 0 else self._start_rank_run()
            if run is not None:
                rt.instrument(model, run)
        except Exception as exc:  # one line, and training goes on without the timing
            log.warning("runwatch: no per-rank timing: %s", exc)

    def _start_rank_run(self) -> Run | None:
        """A run for a rank other than 0, when the logger pushes to a server (one SQLite
        file takes one writer: rank 0)."""
        logger = self._logger
        if logger is None:
            return None
        options = dict(logger._options)
        if not (options.get("url") or os.environ.get("RUNWATCH_URL")):
            return None
        self._rank_run = init(logger.name, config=logger._config, **options)
        return self._rank_run

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Run.finish logs the last step's runwatch.torch wait (rank 0's at the logger's
        # finalize).
        if self._rank_run is not None:
            self._rank_run.finish()
            self._rank_run = None

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._norm = None
        self._step = trainer.global_step
        self._started = self._clock()

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        if trainer.global_rank == 0:
            self._norm = _total_norm(pl_module)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        elapsed = self._clock() - self._started
        run = self._run(trainer)
        if run is None:
            return
        data: dict[str, Any] = {"step_time_s": elapsed}
        if self._norm is not None:  # not on a batch that only accumulated
            data["grad_norm"] = self._norm
        run.log(data, step=self._step)
