"""A DDP communication hook that times each rank's own compute and its wait in the all-reduce.

The hook wraps DDP's default all-reduce (``allreduce_hook``: same gradients, same numbers)
and stamps two moments per step: when this rank handed its *last* gradient bucket to the
all-reduce (its own work for the step is done), and when the step's all-reduce came back.
Then, per rank and per step:

- ``step_time_compute`` = last bucket handed over - previous step's all-reduce back: all this
  rank did on its own (optimizer step, data, forward, backward). Its role is ``step_time``,
  so the straggler detector reads it as the rank's own time.
- ``comm_wait_time`` = all-reduce back - last bucket handed over: the time this rank waited
  for the slowest one (plus the transfer). The straggler waits least.

On the CPU (gloo) the stamps are wall clocks. On a GPU they are CUDA events recorded on the
current stream, read one step later only once ``query()`` says they are done: the hot path
never synchronises. The figures of step ``k`` are logged at step ``k+1`` on the training thread, at
the step the user's own ``run.log`` uses; on the CPU the compute is logged as soon as it is
known, before the wait, so a rank that never arrives shows one step behind the others (the
hang detector names it). The first step (start-up) is not logged. Costs: one clock read and
a ``Future.then`` per bucket, measured in ``StepTimer.overhead_s``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runwatch.hook.run import Run, current_run
from runwatch.hook.sections import COMPUTE_METRIC, WAIT_METRIC

if TYPE_CHECKING:
    from runwatch.torch.fsdp import FSDPTimer

log = logging.getLogger("runwatch.torch")

__all__ = ["COMPUTE_METRIC", "WAIT_METRIC", "NotInstrumentable", "StepTimer", "instrument"]


class NotInstrumentable(ValueError):
    """The model or process cannot be timed (no process group, not DDP, a hook already set)."""


class _Timer:
    """What the DDP and FSDP timers share: the run, the clock (wall or CUDA events), the cost
    counters, the step label and registration for :func:`flush_all`.

    ``steps`` counts the steps logged; ``overhead_s`` + ``done_overhead_s`` is what the
    timing itself cost (``done_overhead_s`` on a collective's thread, where there is one).
    """

    def __init__(
        self, run: Run, *, cuda: bool = False, clock: Callable[[], float] = time.perf_counter
    ):
        self.run = run
        self.cuda = cuda
        self.clock = clock
        self.steps = 0
        self.last_compute = math.nan  # seconds, this rank's latest own time
        self.overhead_s = 0.0  # time spent in this timer's own code (the cost figure)
        self.done_overhead_s = 0.0  # the same, on the collective's thread
        self._step = -1  # the step label of the iteration in flight

    def _next_step(self) -> None:
        """Label the iteration that starts now: the run's step, or one past the last label
        when the user has not logged since (labels never repeat)."""
        run_step = self.run.step
        self._step = run_step if run_step > self._step else self._step + 1

    def _stamp(self) -> Any:
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return self.clock()

    def flush(self) -> None:  # pragma: no cover - each timer has its own
        raise NotImplementedError


class StepTimer(_Timer):
    """Per-step stamps of one DDP model; built by :func:`instrument`.

    ``bucket`` and ``done`` are called from the comm hook (``done`` on the collective's
    thread); everything else runs on the training thread.
    """

    def __init__(
        self, run: Run, *, cuda: bool = False, clock: Callable[[], float] = time.perf_counter
    ):
        super().__init__(run, cuda=cuda, clock=clock)
        self._launch: Any = None  # this iteration's last-bucket stamp
        self._done: Any = None  # this iteration's latest all-reduce stamp
        self._prev_done: Any = None  # the previous iteration's
        self._ready: deque[tuple[int, Any, Any, Any]] = deque()  # (step, prev_done, launch, done)

    # -- called from the hook ------------------------------------------------------------
    def bucket(self, is_last: bool, first: bool) -> None:
        """A bucket is handed to the all-reduce; ``first`` starts a new iteration."""
        if first:
            self._close_iteration()
            self._next_step()
        if is_last:
            self._launch = self._stamp()
            if not self.cuda and self._prev_done is not None:
                # Logged now, before the wait: a rank that never arrives leaves the others'
                # compute at this step and its own one step behind (the hang detector's cue).
                self.last_compute = self._launch - self._prev_done
                self.run.log_labeled({COMPUTE_METRIC: self.last_compute}, {}, self._step)

    def done(self, fut: Any) -> Any:
        """A bucket's all-reduce came back (the collective's thread): stamp, pass the value."""
        began = time.perf_counter()
        self._done = self._stamp()
        value = fut.value()
        self.done_overhead_s += time.perf_counter() - began
        return value

    # -- training thread -----------------------------------------------------------------
    def _close_iteration(self) -> None:
        if self._launch is not None and self._done is not None:
            if self._prev_done is not None:
                self._ready.append((self._step, self._prev_done, self._launch, self._done))
            self._prev_done = self._done
        self._launch = self._done = None
        self._emit()

    def _emit(self) -> None:
        while self._ready:
            step, prev, launch, done = self._ready[0]
            if self.cuda:
                if not done.query():  # not finished on the GPU yet: read it next step
                    return
                self.last_compute = prev.elapsed_time(launch) / 1000.0
                wait = launch.elapsed_time(done) / 1000.0
                data = {COMPUTE_METRIC: self.last_compute, WAIT_METRIC: max(wait, 0.0)}
            else:
                data = {WAIT_METRIC: max(done - launch, 0.0)}
            self._ready.popleft()
            self.steps += 1
            self.run.log_labeled(data, {}, step)

    def flush(self) -> None:
        """Log the last iteration's wait (after the last step; :func:`flush_all` does it for
        every instrumented model, and the Lightning and HF integrations call that)."""
        self._close_iteration()


def instrument(
    model: Any, run: Run | None = None, *, process_group: Any = None
) -> StepTimer | FSDPTimer:
    """Time compute and collective wait per step on this rank of a DDP or FSDP2 ``model``.

    For DDP, registers a comm hook that wraps DDP's default all-reduce (gradients unchanged);
    for an FSDP2 model (``fully_shard``), see :func:`runwatch.torch.fsdp.instrument_fsdp`.
    Logs ``step_time_compute`` and ``comm_wait_time`` into ``run`` (default: the current
    run) with the rank's labels. Raises :class:`NotInstrumentable` (one line, nothing
    registered) without a process group, for a model that is neither, or when a hook is
    already set.
    """
    try:
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel
    except ImportError as exc:  # pragma: no cover - torch is the extra
        raise NotInstrumentable(f"runwatch.torch needs PyTorch: {exc}") from None
    _require_group(dist)
    if not isinstance(model, DistributedDataParallel):
        from runwatch.torch import fsdp

        if fsdp.is_fsdp(model):
            return fsdp.instrument_fsdp(model, run)
        raise NotInstrumentable(
            f"runwatch.torch.instrument: the model is a {type(model).__name__}, not "
            "DistributedDataParallel; wrap it first: model = DDP(model), or "
            "fully_shard(model) for FSDP2"
        )
    run = _run_or_raise(run)
    cuda = any(p.is_cuda for p in model.parameters())
    timer = StepTimer(run, cuda=cuda)
    state = _HookState(timer, process_group)
    try:
        model.register_comm_hook(state, _timed_allreduce)
    except (RuntimeError, ValueError) as exc:
        raise NotInstrumentable(
            f"runwatch.torch.instrument: DDP refused the comm hook ({str(exc).splitlines()[0]})"
        ) from None
    state.allreduce = allreduce_hook
    _timers.append(timer)
    log.info(
        "runwatch.torch: timing compute and all-reduce wait per step (%s)",
        "CUDA events" if cuda else "wall clock",
    )
    return timer


def _require_group(dist: Any) -> None:
    """Raise :class:`NotInstrumentable` unless a process group is up."""
    if not dist.is_available() or not dist.is_initialized():
        raise NotInstrumentable(
            "runwatch.torch.instrument: no torch.distributed process group is up; call "
            "dist.init_process_group() (torchrun) first: one process has no straggler"
        )


def _run_or_raise(run: Run | None) -> Run:
    """``run``, else the current run (else :class:`NotInstrumentable`)."""
    run = run if run is not None else current_run()
    if run is None:
        raise NotInstrumentable(
            "runwatch.torch.instrument: no run; call runwatch.init() first or pass run="
        )
    return run


class _HookState:
    """What DDP hands the hook back: the timer and the group the default all-reduce uses."""

    def __init__(self, timer: StepTimer, process_group: Any) -> None:
        self.timer = timer
        self.process_group = process_group
        self.allreduce: Any = None


def _timed_allreduce(state, bucket):
    """DDP's default all-reduce, with this rank's stamps around it."""
    timer = state.timer
    t0 = time.perf_counter()
    try:
        timer.bucket(bucket.is_last(), bucket.index() == 0)
    except Exception:  # a runwatch bug must not stop training
        log.exception("runwatch.torch: timing failed; gradients are still reduced")
    t1 = time.perf_counter()
    fut = state.allreduce(state.process_group, bucket)  # DDP's own cost, not ours
    t2 = time.perf_counter()
    out = fut.then(timer.done)
    timer.overhead_s += (t1 - t0) + (time.perf_counter() - t2)
    return out


_timers: list[_Timer] = []  # DDP and FSDP timers alike, for flush_all


def flush_all() -> None:
    """Log every instrumented model's last iteration (before ``run.finish``)."""
    for timer in _timers:
        try:
            timer.flush()
        except Exception:
            log.exception("runwatch.torch: could not log the last step's timing")
