"""A Lightning DDP job (its own launcher: ``strategy="ddp"`` re-runs this script per rank,
setting ``LOCAL_RANK``, ``NODE_RANK`` and ``WORLD_SIZE`` but not ``RANK``).

    python tests/torch/lightning_job.py OUT_DIR [SLOW_RANK]

Rank 0 logs through ``RunwatchLogger`` into ``OUT_DIR/rw.db``; ``GradNormCallback`` turns
``runwatch.torch`` on. From step 40 ``SLOW_RANK`` sleeps 30 ms more a step. Each process
writes the rank ``runwatch.hook.ranks.rank_info`` reads, before and after the process group
is up, to ``OUT_DIR/rank-<pid>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from runwatch.hook.ranks import rank_info
from runwatch.integrations.lightning import GradNormCallback, RunwatchLogger

OUT = Path(".")
SLOW = -1
BEFORE: int | None = None


class Job(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
        )

    def training_step(self, batch, batch_idx):
        if self.global_rank == SLOW and self.global_step >= 40:
            time.sleep(0.030)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def on_train_start(self) -> None:
        info = rank_info()
        (OUT / f"rank-{os.getpid()}.json").write_text(
            json.dumps(
                {
                    "env_rank": BEFORE,
                    "rank": info.rank,
                    "world": info.world_size,
                    "global_rank": self.global_rank,
                    "has_RANK": "RANK" in os.environ,
                }
            )
        )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    global OUT, SLOW, BEFORE
    OUT = Path(sys.argv[1])
    SLOW = int(sys.argv[2]) if len(sys.argv) > 2 else -1
    BEFORE = rank_info().rank  # from the launcher's variables only: no process group yet
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 32, generator=g)
    data = DataLoader(TensorDataset(x, x[:, :1]), batch_size=32)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=3,
        strategy="ddp",
        max_steps=90,
        logger=RunwatchLogger(name="lit-ddp", store=str(OUT / "rw.db"), cpu_wait=False),
        callbacks=[GradNormCallback()],
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    trainer.fit(Job(), data)


if __name__ == "__main__":
    main()
