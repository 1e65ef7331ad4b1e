"""Rank labels, the default per-rank metric policy, launch ids, and the backend from env."""

from __future__ import annotations

import pytest

from runwatch.hook.ranks import keeps_metric, launch_id, rank_info, rank_labels
from runwatch.hook.transport import HttpBackend, make_backend_from_env


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}, (5, 1, 8)),
        ({"SLURM_PROCID": "17", "SLURM_LOCALID": "1", "SLURM_NTASKS": "64"}, (17, 1, 64)),
        ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}, (3, None, 4)),
        ({"PMI_RANK": "2", "PMI_SIZE": "4"}, (2, None, 4)),
        ({"RANK": "1", "SLURM_PROCID": "9"}, (1, None, None)),  # torchrun inside SLURM wins
        ({}, (None, None, None)),
    ],
)
def test_rank_comes_from_the_launcher_environment(env, expected):
    info = rank_info(env, host="h")
    assert (info.rank, info.local_rank, info.world_size) == expected
    labels = rank_labels(env, host="h")
    assert labels == ({"host": "h"} if expected[0] is None else {"rank": expected[0], "host": "h"})


def test_rank_zero_logs_run_metrics_and_every_rank_its_own_timing_and_telemetry():
    assert keeps_metric("loss", 0) and keeps_metric("loss", None)
    assert not keeps_metric("loss", 7) and not keeps_metric("lr", 7)
    for metric in ("step_time", "step_time_ms", "iteration_time", "gpu_util", "host_cpu"):
        assert keeps_metric(metric, 7)


def test_launch_id_is_shared_by_a_job_start_and_changes_on_restart():
    assert launch_id({"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1"}) == "slurm:42.:1"
    torch0 = launch_id({"TORCHELASTIC_RUN_ID": "j", "TORCHELASTIC_RESTART_COUNT": "0"})
    torch1 = launch_id({"TORCHELASTIC_RUN_ID": "j", "TORCHELASTIC_RESTART_COUNT": "1"})
    assert torch0 != torch1
    assert launch_id({"RUNWATCH_LAUNCH_ID": "x", "SLURM_JOB_ID": "42"}) == "x"
    assert launch_id({}) is None


def test_backend_from_env_needs_a_url_and_never_shows_the_token(tmp_path):
    assert make_backend_from_env(None, None, env={}) is None
    env = {
        "RUNWATCH_URL": "http://127.0.0.1:9",
        "RUNWATCH_TOKEN": "tok-secret",
        "RANK": "2",
        "WORLD_SIZE": "4",
        "RUNWATCH_SPILL_DIR": str(tmp_path),
    }
    backend = make_backend_from_env(None, None, env=env)
    assert isinstance(backend, HttpBackend)
    assert backend.location == "http://127.0.0.1:9" and backend.spill.path.parent == tmp_path
    assert "tok-secret" not in repr(backend) and "tok-secret" not in backend.location
    backend._http.close()
