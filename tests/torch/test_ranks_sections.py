"""Ranks from every launcher (Lightning's included), the per-rank policy that says what it
drops, and timed sections: the hook-side pieces of issue 25, called directly."""

from __future__ import annotations

import logging

import pytest

from runwatch.hook import ranks
from runwatch.hook.ranks import RankPolicy, keeps_metric, rank_info
from runwatch.hook.sections import Sections, section_metric
from tests.torch.recording_run import RecordingRun

LIGHTNING = {"NODE_RANK": "0", "LOCAL_RANK": "3", "WORLD_SIZE": "4", "MASTER_PORT": "1"}


def test_lightning_launcher_ranks_come_from_node_and_local_rank():
    assert rank_info(LIGHTNING, host="h").rank == 3
    second_node = {"NODE_RANK": "1", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8"}
    info = rank_info(second_node, host="h")
    assert (info.rank, info.local_rank, info.world_size) == (6, 2, 8)


def test_torchrun_variables_still_win_over_lightnings():
    env = {**LIGHTNING, "RANK": "7", "WORLD_SIZE": "8"}
    assert rank_info(env, host="h").rank == 7


def test_processes_that_would_collide_in_one_series_are_warned_about(caplog, monkeypatch):
    monkeypatch.setattr(ranks, "_warned_collision", False)
    env = {"NODE_RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "8"}  # devices unknown
    with caplog.at_level(logging.WARNING, logger="runwatch.hook"):
        assert rank_info(env, host="h").rank is None
        rank_info(env, host="h")
    warned = [r for r in caplog.records if "collide" in r.getMessage()]
    assert len(warned) == 1 and "WORLD_SIZE=8" in warned[0].getMessage()


def test_a_live_process_group_gives_the_rank(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        info = rank_info({"RANK": "5", "WORLD_SIZE": "9"}, host="h")
        assert (info.rank, info.world_size) == (0, 1)
    finally:
        dist.destroy_process_group()


def test_per_rank_names_are_kept_and_other_drops_warn_once_naming_the_setting(caplog):
    counted: list[tuple[str, int]] = []
    policy = RankPolicy(
        2, per_rank=["compute_time", "attn/*"], count=lambda r, n: counted.append((r, n))
    )
    with caplog.at_level(logging.WARNING, logger="runwatch.hook"):
        kept = [policy(m) for m in ("compute_time", "attn/heads", "step_time", "loss", "loss")]
    assert kept == [True, True, True, False, False]
    assert policy.dropped == {"loss": 2} and counted == [("other_rank", 1)] * 2
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "'loss'" in warning and "per_rank=['loss']" in warning
    assert keeps_metric("anything", 0) and not keeps_metric("compute_time", 1)


def test_sections_sum_per_step_and_log_once_per_step_with_their_metric_names():
    ticks = iter([0.0, 1.0, 1.0, 1.5, 2.0, 2.25, 3.0, 3.5])
    run = RecordingRun()
    s = Sections(run, clock=lambda: next(ticks))
    ran = []  # each timed block runs its body once, inside the section
    with s.section("compute"):
        ran.append("compute")
    with s.section("comm"):
        ran.append("comm")
    with s.section("compute"):  # a second block of the same step adds up
        ran.append("compute")
    run.step = 1
    with s.section("data"):
        ran.append("data")
    s.flush()
    assert ran == ["compute", "comm", "compute", "data"]
    assert run.logged == [
        (0, {"step_time_compute": 1.25, "comm_wait_time": 0.5}),
        (1, {"section_data_time": 0.5}),
    ]
    assert section_metric("wait") == "comm_wait_time"


def test_a_lone_process_with_only_local_rank_stays_unlabelled():
    assert rank_info({"LOCAL_RANK": "0"}, host="h").rank is None
    assert rank_info({"LOCAL_RANK": "0", "WORLD_SIZE": "1"}, host="h").rank is None
