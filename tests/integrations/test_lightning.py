"""RunwatchLogger and GradNormCallback on a real Lightning Trainer (CPU, a tiny MLP)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pl = pytest.importorskip("lightning.pytorch")
torch = pytest.importorskip("torch")

from lightning.pytorch.callbacks import LearningRateMonitor  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import runwatch  # noqa: E402
from runwatch.integrations.lightning import GradNormCallback, RunwatchLogger  # noqa: E402


class TinyRegressor(pl.LightningModule):
    """A 2-layer MLP; ``fail_at`` raises in that training step, ``nan_from`` makes the loss
    NaN from that step on."""

    def __init__(self, hidden: int = 16, lr: float = 1e-2, fail_at: int = -1, nan_from: int = -1):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)
        )

    def training_step(self, batch, batch_idx):
        if self.global_step == self.hparams.fail_at:
            raise RuntimeError("boom in training_step")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if 0 <= self.hparams.nan_from <= self.global_step:
            loss = loss * float("nan")
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _loader(n: int = 256, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=16, shuffle=False)


def _fit(db: Path, module: pl.LightningModule, name: str = "lit", **logger_options):
    logger = RunwatchLogger(name=name, store=str(db), **logger_options)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=40,
        logger=logger,
        callbacks=[GradNormCallback(), LearningRateMonitor(logging_interval="step")],
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        val_check_interval=8,
        limit_val_batches=2,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, _loader(), _loader(64, seed=1))
    return logger, trainer


def test_fit_stores_metrics_config_and_finished_status(tmp_path: Path) -> None:
    db = tmp_path / "rw.db"
    _, trainer = _fit(db, TinyRegressor(), config={"team": "nlp"})
    store = runwatch.open_store(db)

    runs = store.runs()
    assert runs["name"].tolist() == ["lit"]
    assert runs["status"].tolist() == ["finished"]
    config = json.loads(runs["config"][0])
    assert config["team"] == "nlp"  # the user's config
    assert config["hidden"] == 16 and config["lr"] == 1e-2  # save_hyperparameters()
    assert config["params"] == sum(p.numel() for p in trainer.lightning_module.parameters())
    assert config["total_steps"] == 40  # trainer.estimated_stepping_batches

    loss = store.read_series("lit", "train_loss")
    assert loss["step"].tolist() == list(range(40))  # Lightning's steps, kept
    assert loss["value"].map(math.isfinite).all()
    assert len(store.read_series("lit", "val_loss")) == 5  # every 8 batches
    assert store.read_series("lit", "lr-AdamW")["value"].min() < 1e-2  # the StepLR decays

    grad = store.read_series("lit", "grad_norm")
    assert grad["step"].tolist() == list(range(40))  # aligned with train_loss
    assert (grad["value"] > 0).all()
    step_time = store.read_series("lit", "step_time_s")
    assert len(step_time) == 40 and (step_time["value"] > 0).all()


def test_grad_norm_is_the_total_l2_norm_before_the_optimizer_step(tmp_path: Path) -> None:
    db = tmp_path / "rw.db"
    seen: list[float] = []

    class Recorder(pl.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            sq = sum(float(p.grad.pow(2).sum()) for p in pl_module.parameters())
            seen.append(math.sqrt(sq))

    logger = RunwatchLogger(name="norms", store=str(db))
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=5,
        logger=logger,
        callbacks=[GradNormCallback(), Recorder()],
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        gradient_clip_val=1e-3,  # clipping comes after: the logged norm is the raw one
    )
    trainer.fit(TinyRegressor(), _loader())
    logged = runwatch.open_store(db).read_series("norms", "grad_norm")["value"].tolist()
    assert logged == pytest.approx(seen, rel=1e-5)
    assert min(logged) > 1e-3


def test_an_exception_in_training_marks_the_run_crashed(tmp_path: Path) -> None:
    db = tmp_path / "rw.db"
    with pytest.raises(RuntimeError, match="boom"):
        _fit(db, TinyRegressor(fail_at=12), name="dies")
    store = runwatch.open_store(db)
    assert store.runs()["status"].tolist() == ["crashed"]
    crashes = store.events("dies", kinds=["crash"])
    assert crashes["message"].str.contains("RuntimeError: boom in training_step").any()
    assert store.read_series("dies", "train_loss")["step"].max() == 11  # points before it kept


def test_a_nan_loss_is_stored_as_a_nonfinite_anomaly(tmp_path: Path) -> None:
    db = tmp_path / "rw.db"
    _fit(db, TinyRegressor(nan_from=25), name="nan")
    store = runwatch.open_store(db)
    anomalies = store.anomalies("nan")
    nonfinite = anomalies[anomalies["detector"] == "nonfinite"]
    assert "train_loss" in set(nonfinite["metric"])
    first = nonfinite[nonfinite["metric"] == "train_loss"]["start_step"].min()
    assert first == 25
    assert store.runs()["status"].tolist() == ["finished"]


def test_experiment_is_the_runwatch_run_and_a_later_test_resumes_it(tmp_path: Path) -> None:
    db = tmp_path / "rw.db"
    logger, trainer = _fit(db, TinyRegressor(), name="again")
    assert logger.run is None  # finished with the fit
    trainer.test(trainer.lightning_module, _loader(32, seed=2))
    store = runwatch.open_store(db)
    assert len(store.attempts("again")) == 2  # the test resumed the run as a new attempt
    assert store.runs()["status"].tolist() == ["finished"]
    assert len(store.read_series("again", "test_loss")) == 1
    run = logger.experiment
    assert isinstance(run, runwatch.Run) and run.name == "again"
    run.finish()


def test_ranks_other_than_zero_start_no_run(tmp_path: Path, monkeypatch) -> None:
    from lightning.pytorch.utilities import rank_zero_only

    db = tmp_path / "rw.db"
    monkeypatch.setattr(rank_zero_only, "rank", 1)  # what DDP sets on a second process
    logger = RunwatchLogger(name="r1", store=str(db))
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"train_loss": 1.0}, step=0)
    logger.finalize("success")
    assert logger.run is None
    assert not db.exists()


def test_ctrl_c_finishes_the_run_without_a_crash(tmp_path: Path) -> None:
    db = tmp_path / "rw.db"

    class Interrupted(TinyRegressor):
        def training_step(self, batch, batch_idx):
            if self.global_step == 5:
                raise KeyboardInterrupt
            return super().training_step(batch, batch_idx)

    with pytest.raises(SystemExit):  # Lightning turns Ctrl-C into sys.exit(1)
        _fit(db, Interrupted(), name="stopped")
    store = runwatch.open_store(db)
    assert store.runs()["status"].tolist() == ["finished"]
    assert store.events("stopped", kinds=["crash"]).empty


def test_without_hparams_autologging_the_run_starts_at_the_first_batch(tmp_path: Path) -> None:
    db = tmp_path / "rw.db"
    logger = RunwatchLogger(name="plain", store=str(db), config={"total_steps": 6})
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=6,
        logger=logger,
        callbacks=[GradNormCallback()],
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        enable_autolog_hparams=False,
    )
    trainer.fit(TinyRegressor(), _loader())
    store = runwatch.open_store(db)
    assert store.read_series("plain", "grad_norm")["step"].tolist() == list(range(6))
    assert json.loads(store.runs()["config"][0]) == {"total_steps": 6}


def test_under_ddp_only_rank_zero_logs(tmp_path: Path) -> None:
    """Two CPU processes (gloo; forked, which starts in seconds where spawn re-imports
    torch in each rank): one run, each step's loss stored once."""
    db = tmp_path / "rw.db"
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_fork",
        max_steps=6,
        logger=RunwatchLogger(name="ddp", store=str(db)),
        callbacks=[GradNormCallback()],
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    trainer.fit(TinyRegressor(), _loader())
    assert trainer.world_size == 2
    store = runwatch.open_store(db)
    runs = store.runs()
    assert runs["name"].tolist() == ["ddp"] and runs["status"].tolist() == ["finished"]
    assert len(store.attempts("ddp")) == 1  # a second rank would have resumed it
    assert store.read_series("ddp", "train_loss")["step"].tolist() == list(range(6))
    assert store.read_series("ddp", "grad_norm")["step"].tolist() == list(range(6))


def test_checkpoints_go_under_the_run_name(tmp_path: Path) -> None:
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=RunwatchLogger(name="ck", store=str(tmp_path / "rw.db")),
        default_root_dir=str(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(TinyRegressor(), _loader())
    assert Path(trainer.checkpoint_callback.dirpath) == tmp_path / "ck" / "checkpoints"
    assert list((tmp_path / "ck" / "checkpoints").glob("*.ckpt"))
