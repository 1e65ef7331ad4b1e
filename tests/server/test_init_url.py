"""runwatch.init(url=..., token=...) against a real server: ranks, policy, one attempt."""

from __future__ import annotations

import numpy as np
import pytest

import runwatch
from runwatch.store import open_store

from .conftest import TOKEN, ServerProcess


def test_ranks_of_one_launch_share_a_run_and_rank_policy_applies(server, monkeypatch, tmp_path):
    monkeypatch.setenv("RUNWATCH_LAUNCH_ID", "job-42")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RUNWATCH_SPILL_DIR", str(tmp_path / "spill"))
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        with runwatch.init(name="ddp", url=server.url, token=TOKEN) as run:
            for step in range(20):
                run.log({"loss": 3.0 - step * 0.01, "step_time_s": 0.5 + rank * 0.1}, step=step)
        # rank 1's run-level loss is not kept, and is counted as such
        assert run.stats()["dropped"] == ({} if rank == 0 else {"other_rank": 20})
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
    with runwatch.init(name="env", all_ranks=True, cpu_wait=False) as run:
        run.log({"loss": 1.0}, step=0)
    with open_store(str(server.db), readonly=True) as store:
        series = store.series("env")
    assert series[["metric", "rank"]].values.tolist() == [["loss", 3]]


def _log_curve(name: str, url: str, offset: float = 0.0, **options) -> None:
    rng = np.random.default_rng(2)
    with runwatch.init(name=name, url=url, token=TOKEN, **options) as run:
        for step in range(1, 5001):
            loss = 2.0 + offset + 8.0 * (step + 20.0) ** -0.4 + rng.normal(0, 0.005)
            run.log({"loss": loss}, step=step)


def _deviations(db, run: str):
    with open_store(str(db), readonly=True) as store:
        found = store.anomalies(run)
    return found[(found["source"] == "live") & (found["detector"] == "curve_deviation")]


def test_reference_mode_through_the_server(server, token_file, monkeypatch, tmp_path):
    monkeypatch.setenv("RUNWATCH_SPILL_DIR", str(tmp_path / "spill"))
    # The fixture's server stores only: reference mode is refused, by name, at init.
    with pytest.raises(ValueError, match=r"reference.*no live detection"):
        runwatch.init(name="early", url=server.url, token=TOKEN, reference="baseline")
    detecting = ServerProcess(tmp_path / "detected.db", token_file)
    detecting.start()
    try:
        _log_curve("baseline", detecting.url)
        _log_curve("plain", detecting.url, offset=0.06)
        _log_curve("versus", detecting.url, offset=0.06, reference="baseline")
        # A reference the server cannot use fails init, naming it, before the run exists.
        with pytest.raises(ValueError, match="nope"):
            runwatch.init(name="lost", url=detecting.url, token=TOKEN, reference="nope")
    finally:
        detecting.stop()
    assert _deviations(detecting.db, "plain").empty  # a fit adapts to the run's own level
    found = _deviations(detecting.db, "versus")
    assert (found["severity"] == "warning").any()
    assert found["message"].str.contains("worse").all()
    with open_store(str(detecting.db), readonly=True) as store:
        assert "lost" not in set(store.runs()["name"])


def test_the_client_fails_over_to_another_server_on_one_database(tmp_path, monkeypatch):
    """Two servers on one store (each its own writer, one database behind them: here one
    SQLite file): the first is killed mid-run and the client goes on through the second,
    every point stored once."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    db = tmp_path / "shared.db"
    first, second = (ServerProcess(db, token, "--no-detect") for _ in range(2))
    first.start()
    second.start()
    monkeypatch.setenv("RUNWATCH_SPILL_DIR", str(tmp_path / "spill"))
    try:
        run = runwatch.init(name="ha", url=[first.url, second.url], token=TOKEN, cpu_wait=False)
        for step in range(40):
            run.log({"loss": 3.0 - step * 0.01}, step=step)
        assert run.flush(20)
        first.kill()
        for step in range(40, 80):
            run.log({"loss": 3.0 - step * 0.01}, step=step)
        run.finish(timeout=30)
        assert run.stats()["dropped"] == {}
        with open_store(str(db), readonly=True) as store:
            steps = store.read_points("ha", all_attempts=True)["step"].tolist()
        assert steps == list(range(80))
    finally:
        second.stop()


def test_a_url_that_names_no_server_is_refused():
    with pytest.raises(ValueError, match="names no server"):
        runwatch.init(name="x", url=" , ", token=TOKEN)
    with pytest.raises(ValueError, match="'localhost:8765' is invalid"):
        runwatch.init(name="x", url="localhost:8765", token=TOKEN)
