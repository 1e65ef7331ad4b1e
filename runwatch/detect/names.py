"""A metric's role from its name, as the tools people train with write it.

Names are read as words: path components (``/``, ``.``), separators (space, ``-``, ``_``)
and CamelCase split them, units in brackets (``(s)``, ``(%)``, ``(GiB)``) and split
prefixes or suffixes (``train``, ``val``, ``eval``, ``test``) are set aside, and the words
left decide. Look-alikes come first: a loss scale is not a loss, a parameter norm is not a
gradient norm, a running total is not a rate, an index or a clock is not a metric to
judge. The names this is checked against, with their sources, are in
``tests/detect/data/framework_metric_names.csv``.
"""

from __future__ import annotations

import re

# fmt: off
_UNITS = re.compile(r"\([^)]*\)|\[[^\]]*\]")
_WORDS = re.compile(r"[A-Z]{2,}s(?![a-z])|[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_VERSUS = re.compile(r"[\s_-]vs[\s_-]")
_SPLITS = frozenset(("train", "training", "val", "valid", "validation", "eval", "test", "dev"))
_EVAL_SPLITS = frozenset(("val", "valid", "validation", "eval", "test", "dev"))
_TIME_UNITS = frozenset({
    "s", "sec", "secs", "second", "seconds", "ms", "min", "mins", "minutes", "h", "hour",
    "hours",
})
_COUNT_NOUNS = frozenset({
    "tokens", "token", "samples", "sample", "examples", "sequences", "batches", "flos",
    "floss", "flops", "gflops", "timesteps", "episodes", "updates", "ooms", "retries",
})
_COUNT_WORDS = frozenset(("total", "num", "n", "number", "consumed", "seen", "cumulative"))
_INDEX_WORDS = frozenset({
    "epoch", "epochs", "step", "steps", "iteration", "iter", "iterations", "global", "trainer",
    "micro",
})
_CLOCK_WORDS = frozenset(("runtime", "timestamp", "elapsed", "wall", "clock", "time", "uptime"))
_STEP_WORDS = frozenset(("step", "iteration", "iter", "batch", "it"))
_PHASE_WORDS = frozenset({
    "forward", "backward", "optimizer", "generator", "data", "loading", "load", "fetch",
    "comm", "allreduce", "reduce", "gather", "h2d", "d2h", "checkpoint", "save",
})
_RATE_WORDS = frozenset(("tps", "tflops", "mfu", "throughput", "wps", "tgs", "fps"))
_SECOND = frozenset(("s", "sec", "second", "seconds"))
_HIGHER_IS_BETTER = frozenset({
    "acc", "accuracy", "reward", "rewards", "rew", "return", "returns", "score", "f1", "bleu",
    "rouge", "rougel", "precision", "recall", "auc", "auroc", "map", "iou", "dice", "exact",
    "match", "win", "winrate", "pass", "success", "explained",
})
_LOWER_IS_BETTER = frozenset({
    "error", "err", "errors", "wer", "cer", "mse", "mae", "rmse", "latency", "runtime",
    "skipped", "nan",
})
_LOSS_WORDS = frozenset(("loss", "losses", "nll", "ppl", "perplexity", "bpb", "bpc"))
_NOT_LR = frozenset(("momentum", "weight", "decay", "beta", "betas", "eps"))
_NOT_GRAD_NORM = frozenset(("ratio", "exp", "moment"))
# fmt: on


def name_words(metric: str) -> list[str]:
    """The lower-case words of a metric name, units in brackets left out.

    >>> name_words("train/CrossEntropyLoss"), name_words("mfu(%)"), name_words("lr-AdamW/pg1")
    (['train', 'cross', 'entropy', 'loss'], ['mfu'], ['lr', 'adam', 'w', 'pg', '1'])
    """
    return [w.lower() for w in _WORDS.findall(_UNITS.sub(" ", metric))]


def role_from_name(metric: str) -> str:
    """The role a metric's name gives it: one of ``runwatch.detect.roles.ROLES``.

    >>> [role_from_name(m) for m in ("lm loss", "loss-scale", "optim/total_grad_norm")]
    ['loss', 'loss_scale', 'grad_norm']
    >>> [role_from_name(m) for m in ("params-norm", "consumed_samples", "_runtime", "tps")]
    ['other', 'counter', 'index', 'throughput']
    """
    if metric == "host_cpu_wait":
        return "cpu_wait"
    # Megatron's "lm loss vs samples": the metric before "vs", on another x-axis.
    words = name_words(_VERSUS.split(metric, maxsplit=1)[0])
    if not words:
        return "other"
    core = [w for w in words if w not in _SPLITS] or words
    found = set(core)
    if "loss" in found and found & {"scale", "scaler"}:
        return "loss_scale"
    if ("lr" in found or {"learning", "rate"} <= found) and not found & _NOT_LR:
        return "lr"
    grad = found & {"grad", "grads", "gradient", "gradients"}
    threshold = core[0] == "max" and core[1:2] == ["grad"]  # max_grad_norm: the clip limit
    if grad and "norm" in found and not found & _NOT_GRAD_NORM and not threshold:
        return "grad_norm"
    if metric.split("/", 1)[0].lower() == "time":
        return _composer_time(core, found)
    if _is_counter(words, found):
        return "counter"
    if _is_index(core, found, evaluated=bool(set(words) & _EVAL_SPLITS)):
        return "index"
    if _is_rate(core, found):
        return "throughput"
    if found & _LOSS_WORDS or {"cross", "entropy"} <= found:
        return "loss"
    if _is_step_time(core, found):
        return "step_time"
    if core[-1] in _INDEX_WORDS - {"global", "trainer"} and not found & _LOWER_IS_BETTER:
        return "index"  # grpo_collection_iteration, micro_step
    return "other"


def worse_direction(metric: str) -> str | None:
    """Which way a metric of no other role gets worse, by its name: "up", "down", or None
    when the name does not say.

    >>> [worse_direction(m) for m in ("eval_accuracy", "eval/WER", "kl")]
    ['down', 'up', None]
    """
    words = set(name_words(metric))
    better = bool(words & _HIGHER_IS_BETTER)
    worse = bool(words & (_LOWER_IS_BETTER | _LOSS_WORDS))
    if better == worse:
        return None
    return "down" if better else "up"


def _composer_time(core: list[str], found: set[str]) -> str:
    """Composer's and Stable-Baselines3's ``time/...``: positions and running totals, but
    ``time/secs_per_step`` is a step time and ``time/fps`` a rate."""
    if _is_rate(core, found):
        return "throughput"
    if "per" in found and _is_step_time(core, found):
        return "step_time"
    if found & _COUNT_NOUNS and "epoch" not in found:
        return "counter"
    return "index"


def _is_counter(words: list[str], found: set[str]) -> bool:
    """A running total: consumed or seen so far, a total or number of tokens, samples, FLOs;
    skipped samples; bytes over the network or to disk; a bare count (Lightning's
    ``samples``)."""
    if "per" in found:
        return False
    if found & {"consumed", "seen", "cumulative"} or found & {"flos", "floss"} == found:
        return True
    if found & _COUNT_NOUNS and (found & _COUNT_WORDS or "skipped" in found):
        return True
    if found & {"network", "disk"} and found & {"recv", "sent", "in", "out", "receive", "transmit"}:
        return True
    return len(words) == 1 and words[0] in _COUNT_NOUNS | {"lengths"}


def _is_index(core: list[str], found: set[str], evaluated: bool) -> bool:
    """A position or a clock: epoch, step, iteration, W&B's ``_step``/``_runtime``/
    ``_timestamp``, a cumulative train time; not an eval pass's own runtime."""
    left = [w for w in core if w not in _TIME_UNITS]
    if not left or "per" in left:
        return False
    if all(w in _INDEX_WORDS for w in left):
        return True
    if "runtime" in found and evaluated:
        return False  # HF's eval_runtime: how long one evaluation took
    clock = _CLOCK_WORDS | ({"total"} if "time" in found else set())
    return all(w in clock for w in left)


def _is_rate(core: list[str], found: set[str]) -> bool:
    """Work per unit of time: ``*_per_second``, ``tokens/s``, TFLOPs, MFU, throughput."""
    if found & _RATE_WORDS:
        return True
    for i, word in enumerate(core[:-1]):
        if word == "per" and core[i + 1] in _SECOND:
            return True
    return len(core) >= 2 and core[-1] in _SECOND and core[-2] in _COUNT_NOUNS | {"it"}


def _is_step_time(core: list[str], found: set[str]) -> bool:
    """Time per step or iteration: ``step_time``, ``iteration-time``, ``elapsed time per
    iteration (ms)``, ``secs_per_step``, modded-nanogpt's ``step_avg``, an end-to-end
    time; not the time of one phase of the step (``forward-backward-time``)."""
    if found & _PHASE_WORDS:
        return False
    timed = found & {"time", "duration", "latency"} or ("per" in found and found & _TIME_UNITS)
    if timed and found & _STEP_WORDS:
        return True
    if found == {"step", "avg"}:
        return True
    e2e = {"end", "to"} <= found or "e2e" in "".join(core)
    return bool(timed) and e2e
