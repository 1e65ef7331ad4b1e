"""Which rank and host this process is, read once from the launcher's environment.

torchrun (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``), SLURM (``SLURM_PROCID``,
``SLURM_LOCALID``, ``SLURM_NTASKS``), Open MPI (``OMPI_COMM_WORLD_RANK``, ...) and other MPIs
(``PMI_RANK``, ``PMI_SIZE``) each say it differently; the first launcher found wins, in that
order, because torchrun inside a SLURM allocation sets both and its own variables are the ones
the training code's process group uses.

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

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

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
    """Rank, local rank and world size from the first launcher whose rank variable is set."""
    host = host if host is not None else socket.gethostname()
    for rank_key, local_key, size_key in _LAUNCHERS:
        rank = _int(env, rank_key)
        if rank is not None:
            return RankInfo(rank, _int(env, local_key), _int(env, size_key), host)
    return RankInfo(None, None, None, host)


def rank_labels(env: Mapping[str, str] = os.environ, host: str | None = None) -> dict:
    """Series labels for this process: ``rank`` (when launched as one of several) and
    ``host``. A single process outside any launcher gets only ``host``."""
    info = rank_info(env, host)
    labels: dict = {}
    if info.rank is not None:
        labels["rank"] = info.rank
    labels["host"] = info.host
    return labels


def keeps_metric(metric: str, rank: int | None) -> bool:
    """The default policy: rank 0 (or a process without a rank) logs everything; other ranks
    log only their own timing and telemetry (:data:`PER_RANK_PREFIXES`)."""
    if rank is None or rank == 0:
        return True
    return metric.startswith(PER_RANK_PREFIXES)


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
