"""The writer in live detection's process (``runwatch.hook.forward``): what the training
process sends it, and what comes back."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch

import runwatch


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("runwatch")}


def test_the_training_process_only_forwards_and_the_child_writes(db_path: Path) -> None:
    run = runwatch.init(name="f", store=db_path, cpu_wait=False)
    assert "runwatch-forward" in _threads()
    assert not _threads() & {"runwatch-writer", "runwatch-detect"}
    for step in range(100):
        run.log({"loss": 1.0 / (step + 1), "lr": 3e-4}, step=step)
    assert run.flush()
    stats = run.stats()
    assert (stats["written"], stats["pending"], stats["dropped"]) == (200, 0, {})
    run.log({"loss": 5.0}, step=10)  # the job resumed from a checkpoint
    assert run.flush() and run.stats()["attempt"] == 2
    run.finish()
    with runwatch.open_store(db_path) as store:
        loss = store.read_series("f", "loss")  # the latest attempt's view
        assert loss["step"].tolist() == [*range(10), 10] and loss["value"].iloc[-1] == 5.0
        assert store.runs().iloc[0]["status"] == "finished"


def test_tensors_and_numpy_numbers_are_read_here_and_the_child_never_imports_torch(
    db_path: Path,
) -> None:
    run = runwatch.init(name="t", store=db_path, cpu_wait=False)
    child = run._extras.process._proc.pid
    run.log({"loss": torch.tensor(2.5), "gn": np.float32(0.5)}, step=np.int64(3))
    run.log({"loss": torch.ones(3), "odd": (lambda: 1)}, step=4)
    assert run.flush()
    with open(f"/proc/{child}/maps") as f:
        assert "libtorch" not in f.read()
    run.finish()
    assert run.stats()["dropped"] == {"bad_value": 2}
    with runwatch.open_store(db_path) as store:
        loss = store.read_series("t", "loss")
        assert (loss["step"].tolist(), loss["value"].tolist()) == ([3], [2.5])
        assert store.read_series("t", "gn")["value"].tolist() == [0.5]


def test_context_and_events_reach_the_store_through_the_child(db_path: Path) -> None:
    with runwatch.init(name="c", store=db_path, cpu_wait=False) as run:
        run.log({"loss": 1.0}, step=0, context={"dataset": "web", "seq": 2048})
        run.event("checkpoint", step=0, message="ckpt-0")
        run.log({"loss": 0.9}, step=1)
    with runwatch.open_store(db_path) as store:
        kinds = store.events("c")["kind"].tolist()
        contexts = store.contexts("c")
    assert "checkpoint" in kinds and "finish" in kinds
    assert contexts["step"].tolist() == [0]
    assert contexts["context"].tolist() == [{"dataset": "web", "seq": 2048}]


def test_stats_follow_the_child_between_flushes(db_path: Path) -> None:
    import time

    with runwatch.init(name="s", store=db_path, cpu_wait=False) as run:
        deadline = time.monotonic() + 20
        step = 0
        while run.stats()["written"] < 100 and time.monotonic() < deadline:
            run.log({"loss": 1.0}, step=step)
            step += 1
            time.sleep(0.002)
        assert run.stats()["written"] >= 100  # without a flush: the child said so
