"""Job logs: every preset on real lines, events, halfway lines, and a watcher that follows a
file through rotation, truncation and its own restart (a real SQLite store, real files).

The real lines are quoted from public logs (BigScience's chronicles, a Megatron-LM run's
output, the tools' own print statements); the modded-nanogpt and llm.c logs are rebuilt
line for line from the values in /work/shared/data/real_runs (see SOURCES.md there), and the
parsed values must equal the recorded ones.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from runwatch.collectors.joblog import JobLogError, LogSource, import_log, read_log
from runwatch.store import open_store

ROOT = Path(__file__).resolve().parents[2]
REAL = Path("/work/shared/data/real_runs")

# BigScience tr11-176B-ml chronicles.md, quoted verbatim (Megatron-DeepSpeed stdout).
BLOOM = (
    " [default7]: iteration    12695/  115311 | consumed samples:      9841584 | consumed "
    "tokens:  20155564032 | elapsed time per iteration (s): 105.22 | learning rate: 5.969E-05 "
    "| global batch size:  2048 | lm loss: 2.463556E+00 | grad norm: 0.174 | num zeros: 0.0 | "
    "number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: "
    "19.463 | TFLOPs: 149.02 |"
)
# A Megatron-LM (core) run's first iteration line, as printed by training_log().
MEGATRON_LM = (
    "[default0]: [2025-05-27 15:23:07] iteration        1/    24000 | consumed samples:        "
    "  1024 | elapsed time per iteration (ms): 271607.0 | throughput per GPU (TFLOP/s/GPU): "
    "40.4 | learning rate: 1.500000E-06 | global batch size:  1024 | lm loss: 1.192634E+01 | "
    "load_balancing_loss: 1.041994E+00 | loss scale: 1.0 | grad norm: 5.960 | num zeros: 0.0 "
    "| params norm: 238.330 | number of skipped iterations:    0 | number of nan iterations:  "
    " 0 |"
)
NCCL = (
    "[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1024, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600019 milliseconds before timing out."
)
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."


def _write(path: Path, lines: list[str], mode: str = "w") -> None:
    with open(path, mode, encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))


def _real(name: str) -> pd.DataFrame:
    frame = pd.read_csv(REAL / f"{name}.csv")
    return frame.pivot_table(index="step", columns="metric", values="value", aggfunc="last")


def _points(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.pivot_table(index="step", columns="metric", values="value", aggfunc="last")


# -- presets on real lines ----------------------------------------------------------------------
def test_megatron_real_lines(tmp_path: Path) -> None:
    path = tmp_path / "bloom.log"
    _write(path, [BLOOM, "some other line", MEGATRON_LM])
    frame, events, lines = read_log(path, preset="megatron")
    got = _points(frame)
    assert lines == 3 and events == []
    assert got.loc[12695, "loss"] == pytest.approx(2.463556)
    assert got.loc[12695, "step_time_ms"] == pytest.approx(105220.0)  # (s) x 1000
    assert got.loc[12695, "tflops_per_gpu"] == pytest.approx(149.02)
    assert got.loc[12695, "grad_norm"] == pytest.approx(0.174)
    assert got.loc[1, "loss"] == pytest.approx(11.92634)
    assert got.loc[1, "step_time_ms"] == pytest.approx(271607.0)
    assert got.loc[1, "load_balancing_loss"] == pytest.approx(1.041994)
    stamped = frame[frame["step"] == 1]["time"]
    assert stamped.notna().all()  # the line's own [2025-05-27 15:23:07]
    assert frame[frame["step"] == 12695]["time"].isna().all()  # no stamp: importer's clock


def test_megatron_bloom_spike_rebuilt_from_the_real_values(tmp_path: Path) -> None:
    real = _real("incident_bloom176b_spike_it31214")
    lines = [
        f" [default7]: iteration {step:8d}/  115311 | consumed samples: "
        f"{int(row['consumed_samples']):12d} | elapsed time per iteration (s): "
        f"{row['step_time_ms'] / 1000:.2f} | learning rate: {row['lr']:.3E} | lm loss: "
        f"{row['train_loss']:E} | grad norm: {row['grad_norm']:.3f} |"
        for step, row in real.iterrows()
    ]
    path = tmp_path / "spike.log"
    _write(path, lines)
    got = _points(read_log(path, preset="megatron")[0])
    assert list(got.index) == list(real.index)
    np.testing.assert_allclose(got["loss"], real["train_loss"], rtol=1e-6)
    np.testing.assert_allclose(got["grad_norm"], real["grad_norm"], rtol=1e-3)
    assert got["grad_norm"].max() > 900  # the documented climb to 960 at 31219


def test_nanogpt_modded_speedrun_rebuilt_from_the_real_values(tmp_path: Path) -> None:
    real = _real("mng_scaleup1b_20k").iloc[:400]
    lines = []
    for step, row in real.iterrows():
        if not math.isnan(row.get("val_loss", math.nan)):
            lines.append(f"step:{step}/20344 val_loss:{row['val_loss']:.4f} train_time:0ms")
        if not math.isnan(row["train_loss"]):
            lines.append(
                f"step:{step}/20344 train_loss:{row['train_loss']:.4f} "
                f"train_time:{row['train_time_ms']:.0f}ms step_avg:1.00ms"
            )
    path = tmp_path / "mng.txt"
    _write(path, lines)
    got = _points(read_log(path, preset="nanogpt")[0])
    train = real["train_loss"].dropna()
    np.testing.assert_allclose(got.loc[train.index, "loss"], train, rtol=1e-4)
    val = real["val_loss"].dropna()
    np.testing.assert_allclose(got.loc[val.index, "val_loss"], val, rtol=1e-4)
    # step_time_ms as SOURCES.md derives it: train_time(N) - train_time(N-1)
    derived = real["train_time_ms"].diff().dropna().iloc[20:]
    np.testing.assert_allclose(got.loc[derived.index, "step_time_ms"], derived, rtol=1e-6)


@pytest.mark.parametrize("preset", ["nanogpt", "llmc"])
def test_llmc_main_log_rebuilt_from_the_real_values(tmp_path: Path, preset: str) -> None:
    real = _real("mng_llmc_gpt2_124m").iloc[:600]
    lines = []
    for step, row in real.iterrows():
        if not math.isnan(row["val_loss"]):
            lines.append(f"s:{step} tel:{row['val_loss']:.4f}")
        if not math.isnan(row["train_loss"]):
            lines.append(
                f"s:{step} trl:{row['train_loss']:.6f} lr:{row['lr']:.6f} "
                f"norm:{row['grad_norm']:.4f}"
            )
    path = tmp_path / "main.log"
    _write(path, lines)
    got = _points(read_log(path, preset=preset)[0])
    train = real["train_loss"].dropna()
    np.testing.assert_allclose(got.loc[train.index, "loss"], train, rtol=1e-5)
    np.testing.assert_allclose(
        got.loc[train.index, "grad_norm"], real.loc[train.index, "grad_norm"]
    )
    val = real["val_loss"].dropna()
    np.testing.assert_allclose(got.loc[val.index, "val_loss"], val, rtol=1e-4)


def test_llmc_stdout_lines(tmp_path: Path) -> None:
    # train_gpt2.cu's printf0 formats, with and without the z-scores, and its "val loss".
    lines = [
        "step    1/19560 | loss 11.010029 (+0.00z)| norm 15.4321 (+0.00z)| lr 8.57e-07 | "
        "1234.56 ms | 45.6% bf16 MFU | 424567 tok/s",
        "step    2/19560 | train loss 10.950000 | norm 14.0000 | lr 1.71e-06 | 1200.00 ms | "
        "46.0% bf16 MFU | 430000 tok/s",
        "val loss 10.9",
    ]
    path = tmp_path / "llmc.txt"
    _write(path, lines)
    got = _points(read_log(path, preset="llmc")[0])
    assert got.loc[1, "loss"] == pytest.approx(11.010029)
    assert got.loc[2, "tokens_per_s"] == 430000
    assert got.loc[2, "val_loss"] == pytest.approx(10.9)  # at the last step printed
    assert got.loc[1, "step_time_ms"] == pytest.approx(1234.56)


def test_torchtitan_coloured_line(tmp_path: Path) -> None:
    line = (
        "[rank0]:\x1b[32m[titan] 2025-01-10 12:00:00,123 - root - INFO - \x1b[31mstep:  5  "
        "\x1b[32mloss:  9.8765  \x1b[38;2;180;60;0mgrad_norm:  2.5000  \x1b[33mmemory: "
        "12.34GiB(15.67%)  \x1b[34mtps: 1,234  \x1b[36mtflops: 12.34  \x1b[35mmfu: 4.56%\x1b[39m"
    )
    path = tmp_path / "titan.log"
    _write(path, [line])
    frame = read_log(path, preset="torchtitan")[0]
    got = _points(frame)
    assert got.loc[5, "loss"] == pytest.approx(9.8765)
    assert got.loc[5, "tokens_per_s"] == 1234
    assert got.loc[5, "memory_gib"] == pytest.approx(12.34)
    assert got.loc[5, "mfu_pct"] == pytest.approx(4.56)
    assert frame["time"].iloc[0] % 1 == pytest.approx(0.123)


def test_hf_trainer_dicts_from_a_real_trainer(tmp_path: Path) -> None:
    """The dicts a real Trainer prints (transformers' ProgressCallback), on the CPU."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64))
    ids = torch.randint(0, 64, (32, 8))
    data = [{"input_ids": x, "labels": x} for x in ids]
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=6,
        logging_steps=2,
        per_device_train_batch_size=4,
        report_to=[],
        disable_tqdm=True,  # PrinterCallback: print(logs)
        save_strategy="no",
        use_cpu=True,
    )
    from contextlib import redirect_stdout

    out = tmp_path / "hf.log"
    with open(out, "w") as fh, redirect_stdout(fh):
        Trainer(model=model, args=args, train_dataset=data).train()
    assert transformers.__version__
    frame = read_log(out, preset="hf")[0]
    got = _points(frame)
    assert list(got.index) == [1, 2, 3]  # three training dicts: steps 2, 4, 6 counted 1..3
    assert got["loss"].notna().all() and (got["loss"] > 0).all()
    assert {"grad_norm", "lr", "epoch"} <= set(got.columns)


def test_tiny_lm_printing_nanogpt_lines_is_read_back_exactly(tmp_path: Path) -> None:
    """examples/train_tiny_lm.py's model trained a few steps, printing nanoGPT's iter line."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import train_tiny_lm as ex
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    corpus, model = ex.make_corpus(5_000), ex.TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    printed: list[tuple[int, float]] = []
    with open(tmp_path / "tiny.log", "w") as fh:
        for step in range(8):
            idx = torch.randint(0, len(corpus) - ex.CONTEXT - 1, (4,))
            x = torch.stack([corpus[i : i + ex.CONTEXT] for i in idx.tolist()])
            y = torch.stack([corpus[i + 1 : i + ex.CONTEXT + 1] for i in idx.tolist()])
            loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, ex.VOCAB), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            lossf = loss.item()
            printed.append((step, round(lossf, 4)))
            print(f"iter {step}: loss {lossf:.4f}, time 12.50ms, mfu -100.00%", file=fh)
    got = _points(read_log(tmp_path / "tiny.log", preset="nanogpt")[0])
    assert [(s, round(v, 4)) for s, v in got["loss"].items()] == printed
    assert (got["step_time_ms"] == 12.5).all()


def test_regex_preset(tmp_path: Path) -> None:
    path = tmp_path / "custom.log"
    _write(path, ["epoch 1 it 10 loss=2.5 acc=0.1", "noise", "epoch 1 it 20 loss=nan acc=0.2"])
    pattern = r"it (?P<step>\d+) loss=(?P<loss>\S+) acc=(?P<acc>\S+)"
    got = _points(read_log(path, preset="regex", pattern=pattern)[0])
    assert got.loc[10, "loss"] == 2.5 and math.isnan(got.loc[20, "loss"])
    assert got.loc[20, "acc"] == pytest.approx(0.2)
    with pytest.raises(JobLogError, match="no \\(\\?P<loss>"):
        read_log(path, preset="regex", pattern=r"it (?P<step>\d+)")
    with pytest.raises(JobLogError, match="needs --pattern"):
        read_log(path, preset="regex")


# -- events, halfway lines, attempts ----------------------------------------------------------
def test_failures_become_events_at_the_last_step(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    _write(
        path,
        [
            BLOOM,
            NCCL,
            XID,
            "[rank0]: Traceback (most recent call last):",
            '[rank0]:   File "/app/pretrain_gpt.py", line 12, in <module>',
            "[rank0]:     loss.backward()",
            "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
            "GPU 0 has a total capacity of 79.15 GiB",
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            "Traceback (most recent call last):",
            '  File "train.py", line 3, in <module>',
            "ValueError: bad batch",
        ],
    )
    store = open_store(str(tmp_path / "s.db"))
    summary = import_log(store, path, preset="megatron", run_name="job")
    events = store.events("job")
    mine = events[~events["kind"].isin(["start", "resume", "restart", "finish"])]
    assert list(mine["kind"]) == ["nccl_timeout", "xid", "oom", "log", "crash"]
    assert (mine["step"] == 12695).all()
    assert "ValueError: bad batch" in mine["message"].iloc[-1]
    assert summary.events["job"] == 5


def test_halfway_line_is_reported_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "bad.log"
    garbled = BLOOM.replace("lm loss: 2.463556E+00", "lm loss: 2.46#556E+00")
    _write(path, [BLOOM.replace("12695", "12694"), XID, garbled])
    store = open_store(str(tmp_path / "s.db"))
    with pytest.raises(JobLogError) as err:
        import_log(store, path, preset="megatron", run_name="job")
    assert err.value.line == 3 and "lm loss" in str(err.value) and "bad.log:3" in str(err.value)
    assert store.runs().empty


def test_iteration_going_back_starts_a_new_attempt(tmp_path: Path) -> None:
    path = tmp_path / "resumed.log"
    lines = [BLOOM.replace("12695/", f"{s}/") for s in (100, 110, 120, 110, 120, 130)]
    _write(path, lines)
    store = open_store(str(tmp_path / "s.db"))
    summary = import_log(store, path, preset="megatron", run_name="job")
    assert summary.restarts["job"] == 1
    assert len(store.attempts("job")) == 2
    loss = store.read_points("job", ["loss"])
    first, second = sorted(store.attempts("job")["attempt"])
    assert list(loss["step"]) == [100, 110, 120, 130]
    assert list(loss["attempt"]) == [first, second, second, second]


# -- watching ---------------------------------------------------------------------------------
def _line(step: int, loss: float = 2.0) -> str:
    return f" iteration {step:8d}/ 1000 | lm loss: {loss:E} | grad norm: 0.5 |"


def _steps(items: list[tuple]) -> list[int]:
    return [item[1] for item in items if item[0] == "point"]


def test_partial_last_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "live.log"
    src = LogSource(path, preset="megatron")
    assert src.read_new() == []  # not there yet
    _write(path, [_line(1)])
    with open(path, "a") as fh:
        fh.write(_line(2)[:20])
    assert _steps(src.read_new()) == [1]
    with open(path, "a") as fh:
        fh.write(_line(2)[20:] + "\n" + NCCL + "\n")
    items = src.read_new()
    assert _steps(items) == [2]
    (event,) = [i for i in items if i[0] == "event"]
    assert event[1:3] == (2, "nccl_timeout") and isinstance(event[4], float) and len(event) == 5
    point = items[0]
    assert point[2] == {"loss": 2.0, "grad_norm": 0.5} and isinstance(point[3], float)


def test_rotation_finishes_the_old_file_then_follows_the_new(tmp_path: Path) -> None:
    path = tmp_path / "live.log"
    _write(path, [_line(1)])
    src = LogSource(path, preset="megatron")
    assert _steps(src.read_new()) == [1]
    _write(path, [_line(2)], mode="a")
    with open(path, "a") as fh:
        fh.write(_line(3))  # the old file's last line, never terminated
    os.rename(path, tmp_path / "live.log.1")
    _write(path, [_line(4), _line(5)])
    assert _steps(src.read_new()) == [2, 3, 4, 5]
    _write(path, [_line(6)], mode="a")
    assert _steps(src.read_new()) == [6]


def test_truncation_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "live.log"
    _write(path, [_line(1), _line(2), _line(3)])
    src = LogSource(path, preset="megatron")
    assert _steps(src.read_new()) == [1, 2, 3]
    with open(path, "w") as fh:  # truncated in place (copytruncate), then written again
        fh.write(_line(1) + "\n")
    assert _steps(src.read_new()) == [1]


def test_restart_resumes_without_losing_or_doubling(tmp_path: Path) -> None:
    path = tmp_path / "live.log"
    _write(path, [_line(s) for s in range(1, 4)])
    first = LogSource(path, preset="megatron")
    seen = _steps(first.read_new())
    saved = first.state()
    assert {"offset", "inode", "head"} <= set(saved)
    _write(path, [_line(s) for s in range(4, 7)], mode="a")  # written while the watcher is down
    second = LogSource(path, preset="megatron")
    second.restore(saved)
    seen += _steps(second.read_new())
    assert seen == [1, 2, 3, 4, 5, 6]
    # a different file at the same path (same size or larger, other first line): from 0
    path.unlink()
    _write(path, [_line(100), _line(101), _line(102), _line(103)])
    third = LogSource(path, preset="megatron")
    third.restore(second.state())
    assert _steps(third.read_new()) == [100, 101, 102, 103]


def test_watcher_reports_a_halfway_line_and_carries_on(tmp_path: Path) -> None:
    path = tmp_path / "live.log"
    _write(path, [_line(1), " iteration 2/ 1000 | lm loss: 2.x |", _line(3)])
    items = LogSource(path, preset="megatron").read_new()
    assert _steps(items) == [1, 3]
    (event,) = [i for i in items if i[0] == "event"]
    assert event[2] == "log" and "live.log:2" in event[3]


def test_restart_after_a_rotation_finishes_the_rotated_file(tmp_path: Path) -> None:
    path = tmp_path / "live.log"
    _write(path, [_line(1), _line(2)])
    first = LogSource(path, preset="megatron")
    assert _steps(first.read_new()) == [1, 2]
    saved = first.state()
    _write(path, [_line(3)], mode="a")  # written while the watcher is down ...
    os.rename(path, tmp_path / "live.log.1")  # ... then rotated
    _write(path, [_line(4)])
    second = LogSource(path, preset="megatron")
    second.restore(saved)
    assert _steps(second.read_new()) == [3, 4]
    _write(path, [_line(5)], mode="a")
    assert _steps(second.read_new()) == [5]
