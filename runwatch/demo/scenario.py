"""A seeded, realistic training run with real faults, for ``runwatch demo`` and for tests.

The curves follow what a small GPT-style pre-training run logs (one value per step):

- ``lr``: linear warm-up over the first 5% of steps, then cosine decay to 10% of the peak.
- ``loss``: a power law in the *area under the LR schedule* (the sum of LR so far), the form
  of LR-schedule-aware scaling laws; so loss falls slowly during warm-up, fastest at peak LR,
  and flattens as the LR decays. Noise is multiplicative, ~1.2% of the loss, as in a
  per-step training loss.
- ``grad_norm``: lognormal around a level that decays from ~1.5 to ~0.3, with rare 2x blips.
- ``step_time_s`` and ``tokens_per_s``: ~0.34 s per step of 2^19 tokens, 2% noise.

Faults sit at fixed fractions of ``steps`` (see :func:`fault_plan`), so any ``steps >= 200``
gives the same story: a loss spike preceded by a grad-norm burst, a NaN loss (grad norm inf),
a checkpoint every ~10% of steps, a crash followed by a restart from the last checkpoint
(steps go back and are redone), and a ~30% throughput drop over the last 15% of the run.

>>> steps = list(demo_scenario(steps=200, seed=1))
>>> steps[0].step, sorted(steps[0].metrics)
(1, ['grad_norm', 'loss', 'lr', 'step_time_s', 'tokens_per_s'])
>>> [s.restart_from for s in steps if s.restart_from is not None]
[140]
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

MIN_STEPS = 200
"""Fewer steps cannot hold the faults apart (warm-up, spike, NaN, crash, slowdown)."""

METRICS: tuple[str, ...] = ("loss", "grad_norm", "lr", "tokens_per_s", "step_time_s")

PEAK_LR = 6e-4
MIN_LR_FRACTION = 0.1
TOKENS_PER_STEP = 2**19
STEP_TIME_S = 0.34
LOSS_START = 10.8  # ~ln(50257): a GPT-2 vocabulary at initialisation
LOSS_FLOOR = 2.0
LOSS_EXPONENT = 0.6
LOSS_SCALE_STEPS = 70.0  # LR-area (in peak-LR steps) over which the loss falls by ~2^0.6
LOSS_NOISE = 0.012  # relative per-step noise of a training loss
SPIKE_SIGMAS = (9.0, 7.0, 4.0, 2.0)  # the loss spike, in units of the local noise
GRAD_BURST = (4.0, 6.5)  # grad-norm multipliers on the two steps before the spike
SLOWDOWN = 0.7  # throughput kept during the slowdown


@dataclass(frozen=True, slots=True)
class DemoStep:
    """One logged training step.

    ``event`` is ``(kind, message)`` with a kind from ``runwatch.model.EVENT_KINDS``.
    ``restart_from`` is set on the first step after a crash: the process restarted from the
    checkpoint at that step, so this and the following steps redo steps already logged.
    """

    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    event: tuple[str, str] | None = None
    restart_from: int | None = None


class DemoFault(NamedTuple):
    """A fault written into the demo run: what, at which step, in words."""

    kind: str
    step: int
    description: str


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Where the faults go for a run of ``steps`` steps (steps are numbered 1..steps)."""

    steps: int
    warmup_steps: int
    checkpoint_every: int
    spike_step: int
    spike_steps: int
    nan_step: int
    crash_step: int
    restart_from: int
    slowdown_step: int

    @property
    def checkpoints(self) -> list[int]:
        """Steps at which a checkpoint is saved (once each, by the attempt that gets there)."""
        return list(range(self.checkpoint_every, self.steps + 1, self.checkpoint_every))


def fault_plan(steps: int) -> FaultPlan:
    """Place the faults at fixed fractions of ``steps``.

    >>> p = fault_plan(3000)
    >>> p.spike_step, p.nan_step, p.crash_step, p.restart_from, p.slowdown_step
    (1050, 1650, 2160, 2100, 2551)
    """
    if steps < MIN_STEPS:
        raise ValueError(f"the demo needs steps >= {MIN_STEPS}, got {steps}")
    every = max(10, round(steps / 10))
    crash = round(0.72 * steps)
    restart = (crash // every) * every
    if crash - restart < 2:  # never crash right on a checkpoint: some work must be lost
        crash = restart + 2
    nan = round(0.55 * steps)
    if nan % every == 0:
        nan += 1  # keep the NaN off a checkpoint step, so each is seen on its own
    slowdown = round(0.85 * steps) + 1
    return FaultPlan(
        steps=steps,
        warmup_steps=max(10, round(0.05 * steps)),
        checkpoint_every=every,
        spike_step=round(0.35 * steps),
        spike_steps=len(SPIKE_SIGMAS),
        nan_step=nan,
        crash_step=crash,
        restart_from=restart,
        slowdown_step=slowdown,
    )


def describe_faults(steps: int = 3000) -> list[DemoFault]:
    """The faults :func:`demo_scenario` writes, in step order, so the demo can say what it did.

    >>> [f.kind for f in describe_faults(3000)]
    ['checkpoint', 'grad_spike', 'loss_spike', 'nan', 'crash', 'restart', 'throughput_drop']
    """
    p = fault_plan(steps)
    last = p.spike_step + p.spike_steps - 1
    return [
        DemoFault(
            "checkpoint",
            p.checkpoint_every,
            f"a checkpoint every {p.checkpoint_every} steps ({len(p.checkpoints)} in all)",
        ),
        DemoFault(
            "grad_spike",
            p.spike_step - len(GRAD_BURST),
            f"grad_norm bursts {GRAD_BURST[0]:g}-{GRAD_BURST[1]:g}x on the two steps "
            "before the loss spike",
        ),
        DemoFault(
            "loss_spike",
            p.spike_step,
            f"loss spikes {SPIKE_SIGMAS[0]:g}x the local noise at step {p.spike_step} and "
            f"recovers by step {last + 1}",
        ),
        DemoFault("nan", p.nan_step, f"loss is NaN and grad_norm inf at step {p.nan_step}"),
        DemoFault("crash", p.crash_step, f"the process crashes after step {p.crash_step}"),
        DemoFault(
            "restart",
            p.restart_from,
            f"restart from the checkpoint at step {p.restart_from}: steps "
            f"{p.restart_from + 1}-{p.crash_step} are redone ({p.crash_step - p.restart_from} "
            "steps of lost work)",
        ),
        DemoFault(
            "throughput_drop",
            p.slowdown_step,
            f"tokens_per_s drops {1 - SLOWDOWN:.0%} (step_time_s up) from step "
            f"{p.slowdown_step} to the end",
        ),
    ]


def lr_schedule(steps: int) -> np.ndarray:
    """LR at steps 1..steps (index 0 is step 1): linear warm-up, then cosine to 10% of peak."""
    plan_warmup = max(10, round(0.05 * steps))
    t = np.arange(1, steps + 1, dtype=np.float64)
    warm = PEAK_LR * t / plan_warmup
    progress = np.clip((t - plan_warmup) / max(1, steps - plan_warmup), 0.0, 1.0)
    floor = PEAK_LR * MIN_LR_FRACTION
    decay = floor + (PEAK_LR - floor) * 0.5 * (1 + np.cos(math.pi * progress))
    return np.where(t <= plan_warmup, warm, decay)


def expected_loss(steps: int) -> np.ndarray:
    """The noise-free loss at steps 1..steps: a power law in the area under the LR schedule."""
    area = np.cumsum(lr_schedule(steps)) / PEAK_LR
    return LOSS_FLOOR + (LOSS_START - LOSS_FLOOR) * (1 + area / LOSS_SCALE_STEPS) ** (
        -LOSS_EXPONENT
    )


def demo_scenario(steps: int = 3000, seed: int = 0) -> Iterator[DemoStep]:
    """Yield the demo run's steps in the order a training process would log them.

    The same ``steps`` and ``seed`` give the same values. After the crash, steps go back to
    the checkpoint and are redone with fresh noise, as a real restart would.
    """
    plan = fault_plan(steps)
    rng = np.random.default_rng(seed)
    lr = lr_schedule(steps)
    base_loss = expected_loss(steps)
    first = [(step, 0) for step in range(1, plan.crash_step + 1)]
    second = [(step, 1) for step in range(plan.restart_from + 1, steps + 1)]
    for step, attempt in first + second:
        yield _step(plan, rng, step, attempt, float(lr[step - 1]), float(base_loss[step - 1]))


def _step(
    plan: FaultPlan, rng: np.random.Generator, step: int, attempt: int, lr: float, loss: float
) -> DemoStep:
    # Every step draws the same number of random values, so a fault never shifts the noise of
    # the steps after it: two plans that differ in one fault differ only there.
    noise, grad_noise, blip, blip_size, time_noise = rng.standard_normal(5)
    loss *= math.exp(LOSS_NOISE * noise)
    offset = step - plan.spike_step
    if 0 <= offset < plan.spike_steps:
        loss *= 1 + SPIKE_SIGMAS[offset] * LOSS_NOISE

    level = 0.3 + 1.2 * math.exp(-step / (0.1 * plan.steps))
    grad_norm = level * math.exp(0.15 * grad_noise)
    if blip > 2.33:  # ~1% of steps: an ordinary, harmless blip
        grad_norm *= 1.5 + 0.5 * abs(blip_size)
    before = plan.spike_step - step
    if 1 <= before <= len(GRAD_BURST):
        grad_norm *= GRAD_BURST[len(GRAD_BURST) - before]
    elif offset == 0:
        grad_norm *= 3.0

    step_time = STEP_TIME_S * math.exp(0.02 * time_noise)
    if step >= plan.slowdown_step:
        step_time /= SLOWDOWN
    if step == plan.nan_step:
        loss, grad_norm = math.nan, math.inf

    metrics = {
        "loss": loss,
        "grad_norm": grad_norm,
        "lr": lr,
        "tokens_per_s": TOKENS_PER_STEP / step_time,
        "step_time_s": step_time,
    }
    event: tuple[str, str] | None = None
    restart_from: int | None = None
    if attempt == 1 and step == plan.restart_from + 1:
        restart_from = plan.restart_from
        event = (
            "restart",
            f"restarted from the checkpoint at step {plan.restart_from} after a crash at step "
            f"{plan.crash_step}",
        )
    elif attempt == 0 and step == plan.crash_step:
        event = (
            "crash",
            "rank 5 on node-2 exited with SIGABRT (exit code -6) after a NCCL watchdog timeout",
        )
    elif step % plan.checkpoint_every == 0:
        event = ("checkpoint", f"saved checkpoint at step {step}")
    return DemoStep(step=step, metrics=metrics, event=event, restart_from=restart_from)
