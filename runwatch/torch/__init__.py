"""PyTorch distributed training: each rank's own compute and wait time, measured for the user.

In synchronous data-parallel training the wall time of a step is the same on every rank, so a
straggler cannot be seen in it; the time a rank spent on its own (compute) and the time it
spent waiting for the others in the gradient all-reduce can. One line turns it on::

    model = DDP(model)  # or fully_shard(model): FSDP2, timed in its all-gathers/reduce-scatters
    runwatch.torch.instrument(model)  # logs step_time_compute and comm_wait_time per rank

Needs ``torch`` (the ``test`` extra has it). See :mod:`runwatch.torch.ddp` and
:mod:`runwatch.torch.fsdp` (imported when an FSDP model is instrumented).
"""

from runwatch.torch.ddp import (
    COMPUTE_METRIC,
    WAIT_METRIC,
    NotInstrumentable,
    StepTimer,
    flush_all,
    instrument,
)

__all__ = [
    "COMPUTE_METRIC",
    "WAIT_METRIC",
    "NotInstrumentable",
    "StepTimer",
    "flush_all",
    "instrument",
]
