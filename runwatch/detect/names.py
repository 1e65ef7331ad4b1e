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
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_SPLITS = frozenset(("train", "training", "val", "valid", "validation", "eval", "test", "dev"))
_TIME_UNITS = frozenset(("s", "sec", "secs", "second", "seconds", "ms", "min", "minutes", "h"))
_COUNT_NOUNS = frozenset({
    "tokens", "token", "samples", "sample", "examples", "sequences", "batches", "flos",
    "flops", "gflops",
})
_INDEX_WORDS = frozenset(
    ("epoch", "epochs", "step", "steps", "iteration", "iter", "iterations", "global", "trainer")
)
_CLOCK_WORDS = frozenset(("runtime", "timestamp", "elapsed", "wall", "clock", "time"))
_STEP_WORDS = frozenset(("step", "iteration", "iter", "batch", "it"))
_RATE_WORDS = frozenset(("tps", "tflops", "mfu", "throughput", "wps", "tgs"))
_SECOND = frozenset(("s", "sec", "second", "seconds"))
_HIGHER_IS_BETTER = frozenset({
    "acc", "accuracy", "reward", "rewards", "return", "returns", "score", "f1", "bleu",
    "rouge", "rougel", "precision", "recall", "auc", "auroc", "map", "iou", "dice", "exact",
    "match", "win", "winrate", "pass",
})
_LOWER_IS_BETTER = frozenset({
    "error", "err", "errors", "wer", "cer", "mse", "mae", "rmse", "latency",
})
_LOSS_WORDS = frozenset(("loss", "losses", "nll", "ppl", "perplexity", "bpb", "bpc"))
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
    words = name_words(metric)
    if not words:
        return "other"
    composer_time = metric.split("/", 1)[0].lower() == "time"
    core = [w for w in words if w not in _SPLITS] or words
    found = set(core)
    if "loss" in found and found & {"scale", "scaler"}:
        return "loss_scale"
    if "lr" in found or {"learning", "rate"} <= found:
        return "lr"
    if found & {"grad", "grads", "gradient", "gradients"} and "norm" in found:
        return "grad_norm"
    if composer_time:  # Composer's timestamp: time/token, time/batch, time/epoch...
        return "counter" if found & _COUNT_NOUNS else "index"
    if _is_counter(found):
        return "counter"
    if _is_index(core):
        return "index"
    if found & _LOSS_WORDS or {"cross", "entropy"} <= found:
        return "loss"
    if _is_rate(core, found):
        return "throughput"
    if _is_step_time(core, found):
        return "step_time"
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


def _is_counter(found: set[str]) -> bool:
    """A running total: consumed or seen so far, a total or number of tokens, samples, FLOs."""
    if found & {"consumed", "seen", "cumulative"} or found == {"flos"}:
        return True
    return bool(found & {"total", "num"} and found & _COUNT_NOUNS) and "per" not in found


def _is_index(core: list[str]) -> bool:
    """A position or a clock: epoch, step, iteration, W&B's ``_step``/``_runtime``/
    ``_timestamp``, a cumulative train time."""
    left = [w for w in core if w not in _TIME_UNITS]
    if not left or "per" in left:
        return False
    if all(w in _INDEX_WORDS for w in left):
        return True
    return all(w in _CLOCK_WORDS for w in left)


def _is_rate(core: list[str], found: set[str]) -> bool:
    """Work per unit of time: ``*_per_second``, ``tokens/s``, TFLOPs, MFU, throughput."""
    if found & _RATE_WORDS:
        return True
    if "per" in found:
        after = core[core.index("per") + 1 :]
        return bool(after) and after[0] in _SECOND
    return len(core) >= 2 and core[-1] in _SECOND and core[-2] in _COUNT_NOUNS | {"it"}


def _is_step_time(core: list[str], found: set[str]) -> bool:
    """Time per step or iteration: ``step_time``, ``iteration-time``, ``elapsed time per
    iteration (ms)``, torchtitan's ``time_metrics/end_to_end``."""
    timed = found & {"time", "duration", "latency"}
    if timed and found & _STEP_WORDS:
        return True
    return "time" in found and {"end", "to"} <= found
