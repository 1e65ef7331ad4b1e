"""A real (tiny) PyTorch language model trained on the CPU, monitored by runwatch.

A 2-layer causal Transformer learns a synthetic "language" (a noisy order-2 Markov chain over
32 tokens, made here: no downloads). It logs what a real pre-training loop logs -- loss,
gradient norm, learning rate (warm-up then cosine), tokens/s and step time -- saves a
checkpoint every ``--checkpoint-every`` steps and can be made to misbehave on purpose:

    python examples/train_tiny_lm.py --steps 300 --db runwatch.db
    python examples/train_tiny_lm.py --steps 300 --nan-at 120          # a NaN loss
    python examples/train_tiny_lm.py --steps 300 --crash-at 200        # dies at step 200 ...
    python examples/train_tiny_lm.py --steps 300 --resume              # ... resumes from the
                                                                      # last checkpoint
    runwatch analyze --db runwatch.db --run tiny-lm

Needs ``pip install torch==2.13.0`` (the CPU build).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from torch import nn

import runwatch

VOCAB, CONTEXT, WIDTH = 32, 16, 32


def make_corpus(n_tokens: int, seed: int = 0) -> torch.Tensor:
    """A noisy order-2 Markov chain: learnable structure, a known floor on the loss."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.randint(0, VOCAB, (VOCAB, VOCAB), generator=gen)
    tokens = torch.empty(n_tokens, dtype=torch.long)
    tokens[:2] = torch.randint(0, VOCAB, (2,), generator=gen)
    noise = torch.rand(n_tokens, generator=gen)
    random_tokens = torch.randint(0, VOCAB, (n_tokens,), generator=gen)
    for i in range(2, n_tokens):
        follow = table[tokens[i - 2], tokens[i - 1]]
        tokens[i] = random_tokens[i] if noise[i] < 0.1 else follow
    return tokens


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        layer = nn.TransformerEncoderLayer(WIDTH, nhead=4, dim_feedforward=64, batch_first=True)
        self.body = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(CONTEXT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos
        return self.head(self.body(h, mask=self.mask, is_causal=True))


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--db", default="runwatch.db")
    parser.add_argument("--run", default="tiny-lm")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--nan-at", type=int, help="make the loss NaN at this step")
    parser.add_argument("--crash-at", type=int, help="raise an error at this step")
    parser.add_argument("--resume", action="store_true", help="resume from the last checkpoint")
    args = parser.parse_args()

    torch.manual_seed(0)
    corpus = make_corpus(50_000)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    ckpt = Path(args.checkpoint_dir) / f"{args.run}.pt"
    start = 0
    if args.resume and ckpt.exists():
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
    config = {
        "steps": args.steps,
        "batch": args.batch,
        "context": CONTEXT,
        "peak_lr": args.lr,
        "params": sum(p.numel() for p in model.parameters()),
    }
    gen = torch.Generator().manual_seed(start)
    with runwatch.init(name=args.run, project="examples", config=config, store=args.db) as run:
        for step in range(start, args.steps):
            began = time.perf_counter()
            lr = lr_at(step, args.steps, args.lr, warmup=max(1, args.steps // 20))
            for group in opt.param_groups:
                group["lr"] = lr
            idx = torch.randint(0, len(corpus) - CONTEXT - 1, (args.batch,), generator=gen)
            x = torch.stack([corpus[i : i + CONTEXT] for i in idx.tolist()])
            y = torch.stack([corpus[i + 1 : i + CONTEXT + 1] for i in idx.tolist()])
            loss = nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
            if step == args.nan_at:
                loss = loss * float("nan")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if torch.isfinite(loss):
                opt.step()
            took = time.perf_counter() - began
            run.log(
                {
                    "loss": loss.detach(),
                    "grad_norm": grad_norm,
                    "lr": lr,
                    "tokens_per_s": args.batch * CONTEXT / took,
                    "step_time_s": took,
                },
                step=step,
            )
            if step == args.crash_at:
                raise RuntimeError(f"simulated crash at step {step}")
            if step % args.checkpoint_every == 0 and step > 0:
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                torch.save(
                    {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt
                )
                run.event("checkpoint", step=step, message=f"saved {ckpt}")


if __name__ == "__main__":
    main()
