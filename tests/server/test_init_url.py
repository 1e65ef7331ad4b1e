"""runwatch.init(url=..., token=...) against a real server: ranks, policy, one attempt."""

from __future__ import annotations

import runwatch
from runwatch.store import open_store

from .conftest import TOKEN


def test_ranks_of_one_launch_share_a_run_and_rank_policy_applies(server, monkeypatch, tmp_path):
    monkeypatch.setenv("RUNWATCH_LAUNCH_ID", "job-42")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RUNWATCH_SPILL_DIR", str(tmp_path / "spill"))
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        with runwatch.init(name="ddp", url=server.url, token=TOKEN) as run:
            for step in range(20):
                run.log({"loss": 3.0 - step * 0.01, "step_time_s": 0.5 + rank * 0.1}, step=step)
            assert run.stats()["dropped"] == {}
    with open_store(str(server.db), readonly=True) as store:
        series = store.series("ddp")
        runs = store.runs()
    loss_ranks = sorted(series[series["metric"] == "loss"]["rank"].tolist())
    time_ranks = sorted(series[series["metric"] == "step_time_s"]["rank"].tolist())
    assert loss_ranks == [0]  # run-level metrics come from rank 0 only
    assert time_ranks == [0, 1]  # every rank logs its own step time
    assert runs.set_index("name").loc["ddp", "attempts"] == 1


def test_token_from_the_environment_and_all_ranks_opt_out(server, monkeypatch, tmp_path):
    monkeypatch.setenv("RUNWATCH_URL", server.url)
    monkeypatch.setenv("RUNWATCH_TOKEN", TOKEN)
    monkeypatch.setenv("RUNWATCH_SPILL_DIR", str(tmp_path / "spill"))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with runwatch.init(name="env", all_ranks=True) as run:
        run.log({"loss": 1.0}, step=0)
    with open_store(str(server.db), readonly=True) as store:
        series = store.series("env")
    assert series[["metric", "rank"]].values.tolist() == [["loss", 3]]
