"""``runwatch metrics``, and framework names understood end to end from real file formats."""

from __future__ import annotations

import json
import math
import random

import pytest

from runwatch.cli import main
from runwatch.store import open_store


def _wide_csv(path, blow_up_at=None, n=400):
    """A W&B-style export: `_step` and `train/...` columns, as HF's W&B reporting names them
    (`_runtime` is W&B's own clock, which the wide import drops)."""
    rng = random.Random(0)
    lines = ["_step,train/loss,train/grad_norm,train/learning_rate,train/epoch,_runtime"]
    for step in range(n):
        loss = 4.0 * (step + 10) ** -0.3 * (1 + 0.01 * rng.gauss(0, 1))
        if blow_up_at is not None and step >= blow_up_at:
            loss *= 1.8 ** (step - blow_up_at + 1)
        lines.append(f"{step},{loss},{1 + 0.05 * rng.random()},3e-4,{step / 100},{step * 0.5}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_metrics_shows_each_series_role_and_detectors(tmp_path, capsys):
    db = str(tmp_path / "s.db")
    assert main(["import", str(_wide_csv(tmp_path / "w.csv")), "--db", db, "--run", "r"]) == 0
    capsys.readouterr()
    assert main(["metrics", "--db", db, "--run", "r", "--format", "json"]) == 0
    got = {rec["metric"]: rec for rec in _json_lines(capsys.readouterr().out)}
    assert {m: r["role"] for m, r in got.items()} == {
        "train/loss": "loss",
        "train/grad_norm": "grad_norm",
        "train/learning_rate": "lr",
        "train/epoch": "index",
    }
    loss = got["train/loss"]
    assert (loss["points"], loss["first_step"], loss["last_step"]) == (400, 0, 399)
    assert loss["labels"] == {} and loss["override"] is False
    assert "spike" in loss["detectors"] and "divergence" in loss["detectors"]
    assert got["train/epoch"]["detectors"] == ["nonfinite"]

    assert main(["metrics", "--db", db, "--run", "r", "--roles", '{"train/*": "other"}']) == 0
    table = capsys.readouterr().out
    assert "other (override)" in table and "train/loss" in table
    row = next(line for line in table.splitlines() if line.strip().startswith("train/loss"))
    # As "other" it gets the generic detector, and its name says a rise is the worse way.
    assert "rise" in row and "drop" not in row and "divergence" not in row


def test_metrics_refuses_an_unknown_role(tmp_path, capsys):
    db = str(tmp_path / "s.db")
    main(["import", str(_wide_csv(tmp_path / "w.csv")), "--db", db, "--run", "r"])
    assert main(["metrics", "--db", db, "--run", "r", "--roles", '{"x": "lossy"}']) == 2
    assert "'lossy'" in capsys.readouterr().err


def test_a_wandb_style_loss_blow_up_is_found_with_default_settings(tmp_path, capsys):
    db = str(tmp_path / "s.db")
    path = _wide_csv(tmp_path / "w.csv", blow_up_at=300)
    assert main(["import", str(path), "--db", db, "--run", "r"]) == 0
    assert main(["analyze", "--db", db, "--run", "r", "--format", "json"]) == 0
    capsys.readouterr()
    with open_store(db, readonly=True) as store:
        found = store.anomalies("r")
    on_loss = found[found["metric"] == "train/loss"]
    assert not on_loss.empty
    assert on_loss["severity"].isin(["warning", "critical"]).any()
    assert (on_loss["start_step"] >= 295).all() and on_loss["start_step"].min() <= 305


def test_a_tensorboard_loss_blow_up_is_found_with_default_settings(tmp_path):
    torch_tb = pytest.importorskip("torch.utils.tensorboard")
    logdir = tmp_path / "logs"
    writer = torch_tb.SummaryWriter(str(logdir / "run1"))
    rng = random.Random(1)
    for step in range(400):
        loss = 4.0 * (step + 10) ** -0.3 * (1 + 0.01 * rng.gauss(0, 1))
        if step >= 300:
            loss *= 1.8 ** (step - 299)
        writer.add_scalar("Loss/train", min(loss, 1e30), step)
        writer.add_scalar("Accuracy/test", 0.5 + step / 1000, step)
    writer.close()
    db = str(tmp_path / "s.db")
    assert main(["import", str(logdir), "--db", db]) == 0
    assert main(["analyze", "--db", db, "--run", "run1"]) == 0
    with open_store(db, readonly=True) as store:
        found = store.anomalies("run1")
    on_loss = found[found["metric"] == "Loss/train"]
    assert on_loss["severity"].isin(["warning", "critical"]).any()
    assert math.isclose(on_loss["start_step"].min(), 300, abs_tol=5)


@pytest.mark.parametrize(
    ("name", "text"), [("__/", "run,step,metric,value\nr,0,loss,1\nr,1,__/,2\n")]
)
def test_a_metric_name_of_only_separators_is_refused_with_its_line(tmp_path, capsys, name, text):
    db = tmp_path / "s.db"
    src = tmp_path / "a.csv"
    src.write_text(text)
    assert main(["import", str(src), "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "a.csv:3" in err and repr(name) in err
    if db.exists():
        with open_store(str(db), readonly=True) as store:
            assert store.runs().empty
