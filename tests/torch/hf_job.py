"""A ``transformers.Trainer`` DDP job under torchrun (gloo, the CPU), logged by RunwatchCallback.

    torchrun --nproc_per_node 3 tests/torch/hf_job.py OUT_DIR SLOW_RANK

A one-layer GPT-2 built from a config (no downloads). Rank 0 logs into ``OUT_DIR/rw.db``;
from optimizer step 30 ``SLOW_RANK`` sleeps 30 ms more a step, before its forward.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import transformers

from runwatch.integrations.hf import RunwatchCallback

STEPS = 70


class SlowRank(transformers.TrainerCallback):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def on_step_begin(self, args, state, control, **kwargs):
        if args.process_index == self.rank and state.global_step >= 30:
            time.sleep(0.030)


def main() -> None:
    out, slow = Path(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (4 * STEPS * 3, 16), generator=g)
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = transformers.TrainingArguments(
        output_dir=str(out / "out"),
        per_device_train_batch_size=4,
        max_steps=STEPS,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    callback = RunwatchCallback("hf-ddp", store=str(out / "rw.db"), cpu_wait=False)
    trainer = transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config),
        args=args,
        train_dataset=data,
        callbacks=[callback, SlowRank(slow)],
    )
    trainer.train()


if __name__ == "__main__":
    main()
    # The run is finished (on_train_end). An ordinary exit tears down gloo's threads, which
    # can abort it ("terminate called without an active exception", pytorch/pytorch#179291),
    # and destroying the group first hung in 1 of 6 loaded runs, with or without a barrier.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
