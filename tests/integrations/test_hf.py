"""RunwatchCallback with a real ``transformers.Trainer`` on the CPU: a one-layer GPT-2 built
from a config (no downloads) on token sequences made here."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import textwrap
import time
from collections import deque
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import runwatch  # noqa: E402
from runwatch.integrations.hf import (  # noqa: E402
    RunwatchCallback,
    _LogHistoryReader,
    hf_schedule,
)

SEQ = 16
BATCH = 4
STEPS = 24


def _model(nan_at: int | None = None) -> transformers.GPT2LMHeadModel:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
    if nan_at is None:
        return transformers.GPT2LMHeadModel(config)

    class NanAt(transformers.GPT2LMHeadModel):
        """Returns a NaN loss on its ``nan_at``-th training forward (counting from 1)."""

        calls = 0

        def forward(self, input_ids=None, labels=None, **kwargs):
            out = super().forward(input_ids=input_ids, labels=labels, **kwargs)
            if self.training:
                NanAt.calls += 1
                if NanAt.calls == nan_at:
                    out.loss = out.loss * float("nan")
            return out

    return NanAt(config)


def _data(n: int = BATCH * STEPS) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (n, SEQ), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def _trainer(
    tmp_path: Path, callback: RunwatchCallback, model=None, **args
) -> transformers.Trainer:
    options = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=BATCH,
        max_steps=STEPS,
        logging_steps=1,
        learning_rate=1e-3,
        warmup_steps=4,
        lr_scheduler_type="cosine",
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    options.update(args)
    return transformers.Trainer(
        model=model if model is not None else _model(),
        args=transformers.TrainingArguments(**options),
        train_dataset=_data(),
        eval_dataset=_data(8),
        callbacks=[callback],
    )


def test_trainer_run_is_stored_with_config_and_mapped_metrics(tmp_path, db_path):
    callback = RunwatchCallback(name="hf-tiny", store=str(db_path), seq_len=SEQ)
    trainer = _trainer(tmp_path, callback, eval_strategy="steps", eval_steps=12)
    trainer.train()
    params = sum(p.numel() for p in trainer.model.parameters())

    with runwatch.open_store(str(db_path)) as store:
        runs = store.runs()
        assert runs.iloc[0]["name"] == "hf-tiny" and runs.iloc[0]["status"] == "finished"
        config = json.loads(store._conn.execute("SELECT config FROM runs").fetchone()[0])
        assert config["params"] == params and config["total_steps"] == STEPS
        assert config["tokens_per_step"] == BATCH * SEQ
        assert config["model"]["n_embd"] == 32 and config["trainer"]["max_steps"] == STEPS
        assert config["schedule"] == {"name": "cosine", "warmup": 4, "peak_lr": 1e-3}
        metrics = set(store.series("hf-tiny")["metric"])
        assert {"loss", "grad_norm", "lr", "epoch", "step_time_s", "tokens_per_s"} <= metrics
        assert {"eval_loss", "train_runtime"} <= metrics
        assert "learning_rate" not in metrics
        loss = store.read_series("hf-tiny", "loss")
        assert loss["step"].tolist() == list(range(1, STEPS + 1))
        lr = store.read_series("hf-tiny", "lr")
        # the LR each optimizer step used: a ramp from 0 (step 1) to the peak after the 4
        # warmup steps, then a cosine decay
        assert lr["value"].iloc[0] == 0.0 and lr.loc[lr["value"].idxmax(), "step"] == 5
        assert lr["value"].iloc[-1] < 0.05 * 1e-3
        assert store.read_series("hf-tiny", "eval_loss")["step"].tolist() == [12, 24]
        step_time = store.read_series("hf-tiny", "step_time_s")["value"]
        tokens = store.read_series("hf-tiny", "tokens_per_s")["value"]
        assert len(step_time) == STEPS and (step_time > 0).all()
        assert tokens.to_numpy() == pytest.approx(BATCH * SEQ / step_time.to_numpy())


def test_an_eval_or_a_checkpoint_does_not_read_as_a_slow_step(tmp_path, db_path, monkeypatch):
    """The timing window restarts when an eval or a save ends; the steps before it in the
    same window are left out rather than counted with the eval. The callback's clock is
    one that only the model moves (10 ms a training forward, 50 s an eval batch), so the
    machine's own stalls cannot decide the test."""
    clock = [time.time()]
    monkeypatch.setattr("runwatch.integrations.hf.time", lambda: clock[0])
    monkeypatch.setattr("runwatch.integrations.hf_dispatch.time", lambda: clock[0])

    class SlowEval(transformers.GPT2LMHeadModel):
        def forward(self, input_ids=None, labels=None, **kwargs):
            clock[0] += 0.01 if self.training else 50.0
            return super().forward(input_ids=input_ids, labels=labels, **kwargs)

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
    callback = RunwatchCallback(name="eval", store=str(db_path))
    trainer = _trainer(
        tmp_path,
        callback,
        model=SlowEval(config),
        logging_steps=4,
        eval_strategy="steps",
        eval_steps=6,
        per_device_eval_batch_size=4,
        save_strategy="steps",
        save_steps=10,
    )
    trainer.train()
    with runwatch.open_store(str(db_path)) as store:
        step_time = store.read_series("eval", "step_time_s")
    # windows end at steps 4, 8, ..., 24; evals at 6, 12, 18, 24 restart them
    assert step_time["step"].tolist() == [4, 8, 12, 16, 20, 24]
    # an eval counted in a window of 4 steps would read 25 s a step or more
    assert step_time["value"].tolist() == pytest.approx([0.01] * 6)
    # the state HF saved with the checkpoint keeps the log history
    saved = json.loads((tmp_path / "out" / "checkpoint-10" / "trainer_state.json").read_text())
    assert [e["step"] for e in saved["log_history"] if "loss" in e] == [4, 8]


def test_counted_tokens_give_tokens_per_s(tmp_path, db_path):
    callback = RunwatchCallback(name="tok", store=str(db_path))
    _trainer(tmp_path, callback, max_steps=6, include_num_input_tokens_seen="all").train()
    with runwatch.open_store(str(db_path)) as store:
        tokens = store.read_series("tok", "tokens_per_s")["value"].to_numpy()
        step_time = store.read_series("tok", "step_time_s")["value"].to_numpy()
        seen = store.read_series("tok", "num_input_tokens_seen")["value"].tolist()
    assert seen == [BATCH * SEQ * k for k in range(1, 7)]
    assert tokens == pytest.approx(BATCH * SEQ / step_time)


def test_nan_loss_is_stored_as_a_nonfinite_anomaly(tmp_path, db_path):
    # HF's default logging_nan_inf_filter replaces a NaN loss by the window's mean before any
    # callback sees it; the NaN grad norm of that step still gets through.
    callback = RunwatchCallback(name="nan", store=str(db_path))
    _trainer(tmp_path, callback, model=_model(nan_at=9), max_steps=14).train()
    callback2 = RunwatchCallback(name="nan-unfiltered", store=str(db_path))
    _trainer(
        tmp_path, callback2, model=_model(nan_at=9), max_steps=14, logging_nan_inf_filter=False
    ).train()

    with runwatch.open_store(str(db_path)) as store:
        grad = store.read_series("nan", "grad_norm")
        assert math.isnan(grad.loc[grad["step"] == 9, "value"].iloc[0])
        found = store.anomalies("nan")
        hits = found[(found["detector"] == "nonfinite") & (found["metric"] == "grad_norm")]
        assert hits["start_step"].min() == 9
        found = store.anomalies("nan-unfiltered")
        hits = found[(found["detector"] == "nonfinite") & (found["metric"] == "loss")]
        assert hits["start_step"].min() == 9


_CRASHING = """
import sys
sys.path.insert(0, sys.argv[2])
import transformers
from test_hf import _model, _data, _trainer
from runwatch.integrations.hf import RunwatchCallback
from pathlib import Path

class Boom(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 5:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

trainer = _trainer(Path(sys.argv[3]), RunwatchCallback(name="boom", store=sys.argv[1]))
trainer.add_callback(Boom())
trainer.train()
"""


def test_exception_leaving_train_marks_the_run_crashed(tmp_path, db_path):
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(_CRASHING),
            str(db_path),
            str(Path(__file__).parent),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 1, child.stderr
    assert "illegal memory access" in child.stderr
    with runwatch.open_store(str(db_path)) as store:
        assert store.runs().iloc[0]["status"] == "crashed"
        crash = store.events("boom", kinds=["crash"]).iloc[0]
        assert "illegal memory access" in crash["message"]
        assert store.read_series("boom", "loss")["step"].max() == 4


_DDP = """
import sys
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from test_hf import _trainer
from runwatch.integrations.hf import RunwatchCallback

callback = RunwatchCallback(name="ddp", store=sys.argv[1])
trainer = _trainer(Path(sys.argv[3]), callback, max_steps=6, ddp_backend="gloo")
assert trainer.args.world_size == 2
trainer.train()
# As torch asks of every script: without it gloo's threads can abort the process as the
# interpreter shuts down (pytorch/pytorch#179291), which fails a run that went well.
import torch.distributed as dist
dist.barrier()  # every rank past train(): destroying the group alone can hang
dist.destroy_process_group()
"""


def test_under_ddp_only_rank_zero_writes_a_local_store(tmp_path, db_path):
    """Two CPU ranks (torchrun, gloo) and one SQLite file: one run, one attempt, each
    step's loss once, labelled rank 0. Rank 1 resuming the run would make two attempts."""
    script = tmp_path / "ddp.py"
    script.write_text(textwrap.dedent(_DDP))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            f"--master_port={port}",
            str(script),
            str(db_path),
            str(Path(__file__).parent),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    with runwatch.open_store(str(db_path)) as store:
        runs = store.runs()
        assert runs["name"].tolist() == ["ddp"] and runs["status"].tolist() == ["finished"]
        assert len(store.attempts("ddp")) == 1
        assert store.read_series("ddp", "loss")["step"].tolist() == list(range(1, 7))
        assert set(store.series("ddp")["rank"]) == {0}


def test_a_caught_crash_is_closed_when_train_runs_again(tmp_path, db_path):
    class Once(transformers.TrainerCallback):
        fired = False

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3 and not Once.fired:
                Once.fired = True
                raise RuntimeError("first attempt dies")

    callback = RunwatchCallback(name="retry", store=str(db_path))
    trainer = _trainer(tmp_path, callback, max_steps=6)
    trainer.add_callback(Once())
    with pytest.raises(RuntimeError):
        trainer.train()
    trainer.train()
    # back in its place once, though the first train() left without on_train_end
    assert [type(c) for c in trainer.callback_handler.callbacks].count(RunwatchCallback) == 1
    with runwatch.open_store(str(db_path)) as store:
        assert store.runs().iloc[0]["status"] == "finished"
        assert len(store.attempts("retry")) == 2
        assert store.read_series("retry", "loss")["step"].tolist()[-6:] == list(range(1, 7))
        assert len(store.events("retry", kinds=["crash"])) == 1


def test_the_callback_leaves_hf_dispatch_while_training_and_comes_back(tmp_path, db_path):
    """While train() runs HF dispatches no per-step event to the callback (what each costs
    is bench/README-integrations-hf.md's); after it, the handler is as the user made it."""

    listed = []

    class Watch(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            listed.append([type(c).__name__ for c in trainer.callback_handler.callbacks])

    callback = RunwatchCallback(name="out", store=str(db_path))
    trainer = _trainer(tmp_path, callback, max_steps=6)
    trainer.add_callback(Watch())
    before = list(trainer.callback_handler.callbacks)
    calls = []
    for event in ("on_step_end", "on_log", "on_substep_end", "on_optimizer_step"):
        setattr(callback, event, lambda *a, event=event, **k: calls.append(event))
    trainer.train()
    assert len(listed) == 6 and all("RunwatchCallback" not in names for names in listed)
    assert calls == []
    assert trainer.callback_handler.callbacks == before
    assert not {"on_train_begin", "on_step_begin", "on_save"} & set(vars(trainer.callback_handler))
    assert type(trainer.state.log_history) is list and len(trainer.state.log_history) == 7
    with runwatch.open_store(str(db_path)) as store:
        assert store.read_series("out", "loss")["step"].tolist() == list(range(1, 7))
        assert len(store.read_series("out", "step_time_s")) == 6


def test_a_callback_called_without_a_handler_still_logs(tmp_path, db_path):
    """Events that do not come from HF's CallbackHandler (a custom loop calling the
    callback itself): the callback cannot leave a dispatch, and still logs each entry."""
    callback = RunwatchCallback(name="direct", store=str(db_path))
    trainer = _trainer(tmp_path, callback, max_steps=4)
    args, state, control = trainer.args, trainer.state, trainer.control
    state.max_steps = 4
    callback.on_train_begin(args, state, control, model=trainer.model)
    for step in range(1, 5):
        callback.on_step_begin(args, state, control)
        state.global_step = step
        state.log_history.append({"loss": 3.0 - 0.1 * step, "step": step})
    callback.on_train_end(args, state, control)
    assert callback in trainer.callback_handler.callbacks
    with runwatch.open_store(str(db_path)) as store:
        loss = store.read_series("direct", "loss")
        assert loss["step"].tolist() == [1, 2, 3, 4]
        assert loss["value"].tolist() == pytest.approx([2.9, 2.8, 2.7, 2.6])
        assert len(store.read_series("direct", "step_time_s")) == 4


def test_log_history_entries_become_numbers_under_runwatch_names_with_their_window():
    marks = deque()
    read = _LogHistoryReader(marks, tokens_per_step=None)
    entry = {"loss": 2.5, "learning_rate": 1e-3, "epoch": 1, "tag": "x", "flag": True,
             "g": np.float32(0.5), "hist": [1, 2], "step": 7}  # fmt: skip
    marks.append((None, 100.0, 3, 0))  # the window starts at step 3
    marks.append((entry, 100.2))
    marks.append(({"eval_loss": 3.0, "step": 7}, 100.5))  # not a training log: no timing
    marks.append(({"tag": "only words", "step": 8}, 100.6))  # nothing to log
    items = read()
    assert [(step, when) for step, when, _ in items] == [(7, 100.2), (7, 100.5)]
    numbers = items[0][2]
    assert sorted(numbers) == ["epoch", "g", "loss", "lr", "step_time_s"]
    assert numbers["step_time_s"] == pytest.approx(0.2 / 4)
    assert items[1][2] == {"eval_loss": 3.0}
    assert entry["learning_rate"] == 1e-3 and "lr" not in entry  # HF's entry is untouched
    assert not marks and read() == []


def test_schedules_runwatch_cannot_plan_are_left_out():
    args = transformers.TrainingArguments(
        output_dir="unused", lr_scheduler_type="polynomial", report_to=[], use_cpu=True
    )
    assert hf_schedule(args, 100) is None
    wsd = transformers.TrainingArguments(
        output_dir="unused",
        lr_scheduler_type="warmup_stable_decay",
        lr_scheduler_kwargs={"num_decay_steps": 20, "decay_type": "linear", "min_lr_ratio": 0.1},
        warmup_steps=10,
        report_to=[],
        use_cpu=True,
    )
    assert hf_schedule(wsd, 100) == {
        "name": "wsd",
        "warmup": 10,
        "peak_lr": 5e-5,
        "decay_start": 80,
        "decay_shape": "linear",
        "final_lr_fraction": 0.1,
    }


def test_under_ddp_rank_zero_times_its_own_compute_and_its_wait(tmp_path):
    """torchrun, 3 ranks: RunwatchCallback turns runwatch.torch on by itself; a rank slowed
    from step 30 shows as rank 0's wait, not as its own time."""
    job = Path(__file__).parents[1] / "torch" / "hf_job.py"
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node", "3", str(job), str(tmp_path), "1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = runwatch.open_store(str(tmp_path / "rw.db"), readonly=True)
    pts = store.read_points("hf-ddp", ["step_time_compute", "comm_wait_time", "loss"])
    assert (pts["metric"] == "loss").sum() >= 60  # the callback's own logging goes on
    wait = pts[pts["metric"] == "comm_wait_time"].set_index("step")["value"]
    own = pts[pts["metric"] == "step_time_compute"].set_index("step")["value"]
    assert len(wait) >= 60 and len(own) >= 60
    assert wait.loc[40:].median() - wait.loc[8:28].median() > 0.015
    assert own.loc[40:].median() - own.loc[8:28].median() < 0.010
