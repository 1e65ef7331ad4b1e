"""Which rank and host this process is, read once from the launcher's environment.

A ``torch.distributed`` process group that is already up says it best and wins. Otherwise
torchrun (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``), SLURM (``SLURM_PROCID``,
``SLURM_LOCALID``, ``SLURM_NTASKS``), Open MPI (``OMPI_COMM_WORLD_RANK``, ...) and other MPIs
(``PMI_RANK``, ``PMI_SIZE``) each say it differently; the first launcher found wins, in that
order, because torchrun inside a SLURM allocation sets both and its own variables are the ones
the training code's process group uses. Lightning's DDP launcher sets no global rank at all,
only ``NODE_RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``: its rank is ``NODE_RANK`` x devices per
node + ``LOCAL_RANK`` (devices from ``LOCAL_WORLD_SIZE``, or 0 x anything on node 0). A process
of a multi-process job whose rank cannot be told (``WORLD_SIZE`` > 1, no rank) would write into
the same series as its peers: :func:`rank_info` warns once, naming the variables to set.

Why label every series: a straggler is one rank's step time, a bad GPU one host's telemetry;
without rank and host on the series they would be averaged away. Why not every metric on every
rank: the loss is the same all-reduced number on every rank, and logging it from each one
multiplies the server's work by the number of ranks for nothing. :func:`keeps_metric` is that
default policy.

>>> rank_labels({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}, host="node-a")
{'rank': 3, 'host': 'node-a'}
>>> keeps_metric("loss", 3), keeps_metric("step_time", 3), keeps_metric("loss", 0)
(False, True, True)
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

log = logging.getLogger("runwatch.hook")

_LAUNCHERS: tuple[tuple[str, str, str], ...] = (
    ("RANK", "LOCAL_RANK", "WORLD_SIZE"),  # torchrun / torch.distributed.launch
    ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),  # MPICH / Intel MPI
)

PER_RANK_PREFIXES: tuple[str, ...] = (
    "step_time",
    "iteration_time",
    "data_time",
    "throughput",
    "tokens_per_s",
    "samples_per_s",
    "gpu_",
    "host_",
    "mem_",
    "nccl_",
    "comm_",
)
"""Metrics every rank logs by default (its own timing and telemetry); the rest are run-level
and logged by rank 0 only."""


@dataclass(frozen=True, slots=True)
class RankInfo:
    """Where this process sits in the job; None where the launcher did not say."""

    rank: int | None
    local_rank: int | None
    world_size: int | None
    host: str


def _int(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key)
    if value is None or not value.strip():
        return None
    try:
        return int(value)
    except ValueError:
        return None


def rank_info(env: Mapping[str, str] = os.environ, host: str | None = None) -> RankInfo:
    """Rank, local rank and world size: from a live ``torch.distributed`` process group,
    else from the first launcher whose rank variable is set, else Lightning's variables.

    >>> rank_info({"NODE_RANK": "1", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4",
    ...            "WORLD_SIZE": "8"}, host="h").rank
    6
    """
    host = host if host is not None else socket.gethostname()
    local = _int(env, "LOCAL_RANK")
    dist = _torch_group()
    if dist is not None:
        return RankInfo(dist[0], local, dist[1], host)
    for rank_key, local_key, size_key in _LAUNCHERS:
        rank = _int(env, rank_key)
        if rank is not None:
            return RankInfo(rank, _int(env, local_key), _int(env, size_key), host)
    size = _int(env, "WORLD_SIZE")
    if local is not None and size is not None and size > 1:  # Lightning's launcher
        node = _int(env, "NODE_RANK") or _int(env, "GROUP_RANK") or 0
        per_node = _int(env, "LOCAL_WORLD_SIZE")
        if node == 0:
            return RankInfo(local, local, size, host)
        if per_node:
            return RankInfo(node * per_node + local, local, size, host)
    if size is not None and size > 1:
        _warn_collision(size)
    return RankInfo(None, None, size, host)


def _torch_group() -> tuple[int, int] | None:
    """(rank, world size) of torch's default process group if torch is loaded and it is up;
    torch is never imported here (the hook stays light)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # a half-initialised group: fall back to the environment
        return None
    return None


_warned_collision = False


def _warn_collision(size: int) -> None:
    global _warned_collision
    if _warned_collision:
        return
    _warned_collision = True
    log.warning(
        "runwatch: WORLD_SIZE=%d but no rank for this process (no RANK, SLURM_PROCID, "
        "LOCAL_RANK+NODE_RANK+LOCAL_WORLD_SIZE, nor a torch.distributed group yet): its "
        "series collide with the other ranks'; set RANK, or call runwatch.init() after "
        "dist.init_process_group()",
        size,
    )


def rank_labels(env: Mapping[str, str] = os.environ, host: str | None = None) -> dict:
    """Series labels for this process: ``rank`` (when launched as one of several) and
    ``host``. A single process outside any launcher gets only ``host``."""
    info = rank_info(env, host)
    labels: dict = {}
    if info.rank is not None:
        labels["rank"] = info.rank
    labels["host"] = info.host
    return labels


def keeps_metric(metric: str, rank: int | None, per_rank: Iterable[str] = ()) -> bool:
    """The default policy: rank 0 (or a process without a rank) logs everything; other ranks
    log only their own timing and telemetry (:data:`PER_RANK_PREFIXES`) and the names the
    user asked for per rank (``per_rank=[...]``, exact names or prefixes ending in ``*``)."""
    if rank is None or rank == 0:
        return True
    if metric.startswith(PER_RANK_PREFIXES):
        return True
    for name in per_rank:
        if metric == name or (name.endswith("*") and metric.startswith(name[:-1])):
            return True
    return False


class RankPolicy:
    """:func:`keeps_metric` for one rank, which says what it drops: the first time a metric
    is refused, one warning names it and the setting that keeps it, and ``dropped`` counts
    the refused series (the writer counts their points through ``count``).

    >>> policy = RankPolicy(2, per_rank=["compute_time"])
    >>> policy("compute_time"), policy("loss"), policy("loss"), policy.dropped
    (True, False, False, {'loss': 2})
    """

    def __init__(
        self,
        rank: int | None,
        per_rank: Iterable[str] = (),
        count: Callable[[str, int], None] | None = None,
    ) -> None:
        self.rank = rank
        self.per_rank = tuple(per_rank)
        self.count = count
        self.dropped: dict[str, int] = {}

    def __call__(self, metric: str) -> bool:
        if keeps_metric(metric, self.rank, self.per_rank):
            return True
        self.dropped[metric] = self.dropped.get(metric, 0) + 1
        if self.dropped[metric] == 1:
            log.warning(
                "runwatch: rank %s does not keep %r (rank 0 logs run-level metrics); to "
                "keep it on every rank, pass runwatch.init(per_rank=[%r]) or all_ranks=True",
                self.rank,
                metric,
                metric,
            )
        if self.count is not None:
            self.count("other_rank", 1)
        return False


def launch_id(env: Mapping[str, str] = os.environ) -> str | None:
    """An id shared by every rank of one job start and different after a restart.

    ``RUNWATCH_LAUNCH_ID`` if set; else torchrun's rendezvous id with its restart count,
    SLURM's job id (and step) with its requeue count, or the MPI job id. None when no launcher
    says (the server then groups multi-rank starts by time; see ``runwatch.store.ingest``).

    >>> launch_id({"TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_RESTART_COUNT": "2"})
    'torch:job7:2'
    """
    explicit = env.get("RUNWATCH_LAUNCH_ID")
    if explicit:
        return explicit
    if env.get("TORCHELASTIC_RUN_ID"):
        return f"torch:{env['TORCHELASTIC_RUN_ID']}:{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if env.get("SLURM_JOB_ID"):
        step = env.get("SLURM_STEP_ID", "")
        return f"slurm:{env['SLURM_JOB_ID']}.{step}:{env.get('SLURM_RESTART_COUNT', '0')}"
    for key in ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_JOBID"):
        if env.get(key):
            return f"mpi:{env[key]}"
    return None
