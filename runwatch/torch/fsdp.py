"""FSDP2 (``fully_shard``): each rank's own time and its wait in FSDP's collectives, per step.

FSDP2 runs two collectives per parameter group: an all-gather of the parameters before a
module's forward (and before its backward when it resharded) and a reduce-scatter of its
gradients after its backward. :func:`instrument_fsdp` hands every FSDP module a thin wrapper
of the communication it already had (``set_custom_all_gather`` / ``set_custom_reduce_scatter``:
same calls, same buffers, so gradients and parameters stay byte-identical) that adds the time
each call blocks to the step's wait, and a forward pre-hook on the root that delimits steps.
Per rank and per step:

- ``comm_wait_time``: time blocked in the step's all-gathers and reduce-scatters, i.e. the wait
  for the slowest rank plus the transfer. The straggler waits least.
- ``step_time_compute``: the step's wall time minus that wait, all the rank did on its own
  (role ``step_time``: the straggler detector's own-time signal).

Where a step starts: at the root's forward pre-hook (ahead of FSDP's own, which all-gathers the
root's parameters), and only if a reduce-scatter ran since the last start. Why there: the root
forward is the one point each training step passes once and FSDP itself starts a step there
(lazy init, root pre-forward); the backward's *last* reduce-scatter cannot be recognised when
it runs (the root may own no parameters; the post-backward order is FSDP's). Requiring a
reduce-scatter folds micro-batches accumulated without gradient sync and evaluation forwards
into the step they precede, as DDP's hook (which sees only the all-reduce) does.

Step ``k`` is logged when step ``k+1`` starts: a rank that never arrives at a collective never
starts the next step and stays one step behind (the hang detector's cue). The first step
(start-up, FSDP's lazy init) is not logged. On the CPU (gloo) FSDP's collectives are blocking
calls timed with the wall clock; an all-gather issued with ``async_op=True`` (explicit
prefetch, ``unshard_async_op``) is waited for later inside FSDP, so only its launch counts as
wait. On a GPU the collectives run on FSDP's streams: CUDA events around each (on the stream
it runs on) and at each step start, read a step later once ``query()`` says done, never a
sync. There the wait is the collectives' duration (peers included), partly overlapped with
compute, so own time (wall - wait, floored at 0) is a lower bound; not run here (no GPU).

FSDP1 (``FullyShardedDataParallel``) is refused in one line: its all-gathers take no hook, so
its wait cannot be measured. See bench/README-stragglers.md.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from runwatch.hook.run import Run
from runwatch.hook.sections import COMPUTE_METRIC, WAIT_METRIC
from runwatch.torch.ddp import NotInstrumentable, _require_group, _run_or_raise, _Timer, _timers

log = logging.getLogger("runwatch.torch")

__all__ = ["FSDPTimer", "instrument_fsdp", "is_fsdp"]


class FSDPTimer(_Timer):
    """Per-step wall time and collective wait of one FSDP2 model; built by
    :func:`instrument_fsdp`. ``start`` runs in the root's forward pre-hook, ``comm`` around
    every collective (the backward's on autograd's thread on a GPU)."""

    def __init__(
        self, run: Run, *, cuda: bool = False, clock: Callable[[], float] = time.perf_counter
    ):
        super().__init__(run, cuda=cuda, clock=clock)
        self._began: Any = None  # this step's start stamp
        self._wait = 0.0  # CPU: seconds blocked in this step's collectives
        self._comms: list[tuple[Any, Any]] = []  # CUDA: (start, end) events of each collective
        self._reduced = False  # a reduce-scatter ran since the step began
        # One rank: FSDP copies the gradients instead of reduce-scattering them, so every
        # root forward starts a step.
        self.every_forward = False
        self._started = 0  # steps started (the first is start-up, not logged)
        self._ready: deque[tuple[int, Any, Any, list[tuple[Any, Any]]]] = deque()

    def start(self) -> None:
        """The root's forward begins: close the step in flight if its gradients were reduced."""
        if self._began is not None and not (self._reduced or self.every_forward):
            return  # a micro-batch without gradient sync, or an evaluation forward
        began = time.perf_counter()
        now = self._stamp()
        if self._began is not None and self._started > 1:
            self._close(now)
        self._began = now
        self._wait = 0.0
        self._comms = []
        self._reduced = False
        self._started += 1
        self._next_step()
        self.overhead_s += time.perf_counter() - began

    def comm(self, inner: Any, reduce: bool, *args: Any, **kwargs: Any) -> Any:
        """Run one of FSDP's collectives (``inner(*args, **kwargs)``), adding the time it
        blocks to the step's wait; only the code around the call counts as this timer's
        cost."""
        t0 = time.perf_counter()
        if self.cuda:
            start = self._stamp()
            t1 = time.perf_counter()
            work = inner(*args, **kwargs)
            t2 = time.perf_counter()
            self._comms.append((start, self._stamp()))
        else:
            mark = self.clock()
            t1 = time.perf_counter()
            work = inner(*args, **kwargs)
            t2 = time.perf_counter()
            self._wait += self.clock() - mark
        self._reduced = self._reduced or reduce
        self.overhead_s += (t1 - t0) + (time.perf_counter() - t2)
        return work

    def _close(self, end: Any) -> None:
        if self.cuda:
            self._ready.append((self._step, self._began, end, self._comms))
            self._emit()
            return
        wall = end - self._began
        self.last_compute = max(wall - self._wait, 0.0)
        self.steps += 1
        self.run.log_labeled(
            {COMPUTE_METRIC: self.last_compute, WAIT_METRIC: self._wait}, {}, self._step
        )

    def _emit(self) -> None:
        while self._ready:
            step, began, end, comms = self._ready[0]
            if not end.query() or not all(e.query() for _, e in comms):
                return  # not finished on the GPU yet: read it next step
            wall = began.elapsed_time(end) / 1000.0
            wait = sum(s.elapsed_time(e) for s, e in comms) / 1000.0
            self.last_compute = max(wall - wait, 0.0)
            self._ready.popleft()
            self.steps += 1
            self.run.log_labeled({COMPUTE_METRIC: self.last_compute, WAIT_METRIC: wait}, {}, step)

    def flush(self) -> None:
        """Log the step in flight as ended now (after the last step; ``flush_all``)."""
        if self._began is not None and self._started > 1 and (self._reduced or self.every_forward):
            self._close(self._stamp())
            self._began = None
        if self.cuda:
            self._emit()


def is_fsdp(model: Any) -> bool:
    """Whether ``model`` is sharded by FSDP (FSDP2's ``fully_shard`` or FSDP1)."""
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:  # pragma: no cover - an old torch
        return False
    return isinstance(model, FSDPModule | FullyShardedDataParallel)


def instrument_fsdp(model: Any, run: Run | None = None) -> FSDPTimer:
    """Time own compute and collective wait per step on this rank of an FSDP2 ``model``.

    ``model`` is the root ``fully_shard``-ed module (the one the training step calls). Wraps
    the all-gather and reduce-scatter of every FSDP module in it and hooks the root's
    forward. Raises :class:`NotInstrumentable` (one line, nothing changed) for FSDP1, without
    a process group, or when FSDP refuses a custom collective.
    """
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    if isinstance(model, FullyShardedDataParallel):
        raise NotInstrumentable(
            "runwatch.torch.instrument: FSDP1 (FullyShardedDataParallel) is not timed: its "
            "all-gathers take no hook; shard with FSDP2's fully_shard(model) instead"
        )
    if not isinstance(model, FSDPModule):
        raise NotInstrumentable(
            f"runwatch.torch.instrument: the model is a {type(model).__name__}, not an FSDP2 "
            "module; shard it first: fully_shard(model)"
        )
    _require_group(dist)
    run = _run_or_raise(run)
    cuda = any(p.is_cuda for p in model.parameters())
    timer = FSDPTimer(run, cuda=cuda)
    timer.every_forward = dist.get_world_size() == 1
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    plans = []
    for module in modules:
        gather, scatter = _current_comms(module)
        plans.append((module, _TimedAllGather(gather, timer), _TimedReduceScatter(scatter, timer)))
    done: list[tuple[Any, Any, Any]] = []
    try:
        for module, gather, scatter in plans:
            module.set_custom_all_gather(gather)
            module.set_custom_reduce_scatter(scatter)
            done.append((module, gather.inner, scatter.inner))
    except (RuntimeError, ValueError) as exc:
        for module, gather_inner, scatter_inner in done:  # put FSDP's own back
            module.set_custom_all_gather(gather_inner)
            module.set_custom_reduce_scatter(scatter_inner)
        raise NotInstrumentable(
            "runwatch.torch.instrument: FSDP refused a custom collective "
            f"({str(exc).splitlines()[0]})"
        ) from None
    model.register_forward_pre_hook(_start_hook(timer), prepend=True)
    _timers.append(timer)
    log.info(
        "runwatch.torch: timing own time and FSDP collective wait per step on %d FSDP modules (%s)",
        len(modules),
        "CUDA events" if cuda else "wall clock",
    )
    return timer


def _current_comms(module: Any) -> tuple[Any, Any]:
    """The all-gather and reduce-scatter ``module`` uses now (FSDP's defaults unless set).

    FSDP2 has setters but no getters: the groups' attributes are read, so a collective the
    user set is wrapped, not replaced."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
        DefaultAllGather,
        DefaultReduceScatter,
    )

    try:
        groups = module._get_fsdp_state()._fsdp_param_groups
    except AttributeError:  # another torch: assume FSDP's defaults
        groups = []
    gather = getattr(groups[0], "_all_gather_comm", None) if groups else None
    scatter = getattr(groups[0], "_reduce_scatter_comm", None) if groups else None
    if isinstance(gather, _TimedAllGather) or isinstance(scatter, _TimedReduceScatter):
        raise NotInstrumentable("runwatch.torch.instrument: this FSDP model is already timed")
    return gather or DefaultAllGather(), scatter or DefaultReduceScatter()


def _start_hook(timer: FSDPTimer) -> Callable[..., None]:
    def start(module: Any, args: Any) -> None:
        try:
            timer.start()
        except Exception:  # a runwatch bug must not stop training
            log.exception("runwatch.torch: step timing failed; training goes on")

    return start


def _comm_classes() -> tuple[type, type]:
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

    return AllGather, ReduceScatter


_AllGather, _ReduceScatter = _comm_classes()


class _TimedComm:
    """FSDP's own collective (``inner``), called unchanged with the same buffers, its
    blocking time added to the step's wait; ``reduce`` says whether it reduces gradients
    (a reduce-scatter: the step's gradients were synced)."""

    reduce = False

    def __init__(self, inner: Any, timer: FSDPTimer) -> None:
        self.inner = inner
        self.timer = timer

    def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.timer.comm(self.inner, self.reduce, *args, **kwargs)


class _TimedAllGather(_TimedComm, _AllGather):
    """FSDP's all-gather, timed."""


class _TimedReduceScatter(_TimedComm, _ReduceScatter):
    """FSDP's reduce-scatter, timed."""

    reduce = True
