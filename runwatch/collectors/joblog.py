"""Job log files (a training job's stdout) read as metrics and events, finished or live.

A preset knows one tool's metric line (the formats are quoted in each parser below, taken from
the tools' own print statements and real logs):

- ``megatron``: Megatron-LM / Megatron-DeepSpeed ``iteration N/ M | lm loss: ... |`` lines and
  ``validation loss at iteration N | lm loss value: ... |``;
- ``nanogpt``: karpathy/nanoGPT (``iter N: loss x, time Tms, mfu m%``, ``step N: train loss
  x, val loss y``) and the modded-nanogpt speedrun (``step:N/M train_loss:x train_time:Tms``);
- ``llmc``: llm.c (``step N/M | loss x (+z)| norm g (+z)| lr l | T ms | ... tok/s``, ``val
  loss x``) and its main.log (``s:N trl:x lr:l norm:g``, ``s:N tel:x``);
- ``torchtitan``: ``step: N  loss: x  grad_norm: g  memory: mGiB(p%)  tps: t  ...`` (ANSI
  colours stripped);
- ``hf``: the Hugging Face Trainer's printed log dicts. They carry no step, so the n-th
  training dict is step n (evaluation dicts take the step of the last training dict);
- ``regex``: a user pattern whose named groups are ``step`` (required), ``loss`` (required)
  and any other metric names.

Any other line may be an event: an NCCL watchdog timeout, an XID or an OOM (classified by
:func:`runwatch.hook.log_patterns.classify_log_message`, as the logging handler does), a
Python traceback (``crash``, or ``oom`` when its exception is one) or a CUDA error (``log``).
A line a preset recognises but cannot read in full (a garbled loss) is a
:class:`JobLogError` naming the file and line: the import stores nothing; a watcher logs it
and carries on, so one bad line never becomes half a point.

:func:`import_log` writes a finished log through the long-format importer (one transaction, a
step that goes back starts a new attempt); :class:`LogSource` follows a growing log across
rotation, truncation and watcher restarts.
"""

from __future__ import annotations

import calendar
import hashlib
import logging
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from runwatch.collectors.importer import ConfigMerge, ImportSummary, _Importer, _merge
from runwatch.collectors.longformat import EventRow, LongFormatError
from runwatch.log_patterns import classify_log_message
from runwatch.store import Store

log = logging.getLogger("runwatch.collectors.joblog")

PRESETS: tuple[str, ...] = ("megatron", "nanogpt", "llmc", "torchtitan", "hf", "regex")

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RANK_PREFIX = re.compile(r"^\s*\[(?:rank\d+|default\d+)\]:\s?")
_STAMP = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?(Z)?")
_TRACEBACK = "Traceback (most recent call last):"
_CUDA_ERROR = re.compile(r"CUDA error:|cudaError\w*|CUDNN_STATUS_\w+|NCCL error", re.IGNORECASE)
_NUMBER = re.compile(r"^[-+]?(?:\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)$")


class JobLogError(LongFormatError):
    """A job log line that cannot be read (``path:line: why``), or a bad preset/pattern."""


class _Halfway(Exception):
    """A line the preset recognises, with a field it cannot read."""


def _num(text: str, what: str) -> float:
    """A printed number: ``1,234``, ``5.1E+00``, ``nan``, ``inf`` (any case)."""
    t = text.strip().strip("'\"")
    m = re.fullmatch(r"(?:np\.float\d+|tensor)\((.*?)\)", t)
    if m:
        t = m.group(1).split(",")[0].strip()
    low = t.lower().lstrip("+")
    if low in ("nan", "-nan"):
        return math.nan
    if low in ("inf", "infinity", "-inf", "-infinity"):
        return -math.inf if low.startswith("-") else math.inf
    if not _NUMBER.match(t):
        raise _Halfway(f"{what} is not a number: {text.strip()!r}")
    return float(t.replace(",", ""))


def _step(text: str) -> int:
    try:
        step = int(text.strip())
    except ValueError:
        raise _Halfway(f"the step is not an integer: {text.strip()!r}") from None
    if step < 0:
        raise _Halfway(f"the step is negative: {step}")
    return step


def _name(key: str) -> str:
    """A printed label as a metric name: ``mtp_1 loss`` -> ``mtp_1_loss``."""
    return re.sub(r"[^0-9a-z]+", "_", key.strip().lower()).strip("_")


def _stamp(line: str) -> float | None:
    """Unix seconds of a timestamp near the start of the line (local time unless ``Z``)."""
    m = _STAMP.search(line[:80])
    if not m:
        return None
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    frac = float("0." + m.group(7)) if m.group(7) else 0.0
    fields = (y, mo, d, h, mi, s, 0, 0, -1)
    try:
        base = calendar.timegm(fields) if m.group(8) else time.mktime(fields)
    except (OverflowError, ValueError):
        return None
    return base + frac


Parsed = tuple[int | None, dict[str, float]]  # (step or None: the last step), metrics


# -- presets ---------------------------------------------------------------------------------
_MEGATRON_ITER = re.compile(r"\biteration\s+(\S+?)\s*/\s*\d+\s*\|(.*)$")
_MEGATRON_VAL = re.compile(r"validation loss at iteration\s+(\S+?)\s*(?:\|| on )(.*)$")
_MEGATRON_KEYS = {
    "consumed samples": "consumed_samples",
    "consumed tokens": "consumed_tokens",
    "learning rate": "lr",
    "global batch size": "global_batch_size",
    "gloabl batch size": "global_batch_size",
    "lm loss": "loss",
    "loss": "loss",
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
    "num zeros": "grad_num_zeros",
    "params norm": "params_norm",
    "number of skipped iterations": "skipped_iters",
    "number of nan iterations": "nan_iters",
    "samples per second": "samples_per_s",
    "tflops": "tflops_per_gpu",
    "throughput per gpu (tflop/s/gpu)": "tflops_per_gpu",
    "actual seqlen": "seqlen",
}


def _megatron(line: str, state: dict[str, Any]) -> Parsed | None:
    """``[2025-05-27 15:23:07] iteration 1/ 24000 | consumed samples: 1024 | elapsed time per
    iteration (ms): 271607.0 | learning rate: 1.500000E-06 | ... | lm loss: 1.192634E+01 |
    loss scale: 1.0 | grad norm: 5.960 | ...`` (Megatron-LM ``training_log``; Megatron-
    DeepSpeed prints ``elapsed time per iteration (s)``, ``TFLOPs``, ``samples per second``)."""
    m = _MEGATRON_ITER.search(line)
    if m:
        step = _step(m.group(1))
        metrics: dict[str, float] = {}
        for part in m.group(2).split("|"):
            if ":" not in part:
                continue
            key, _, text = part.rpartition(":")
            key = key.strip()
            low = key.lower()
            if low.startswith("elapsed time per iteration"):
                scale = 1.0 if "(ms)" in low else 1000.0
                metrics["step_time_ms"] = _num(text.split("/")[0], key) * scale
                continue
            name = _MEGATRON_KEYS.get(low) or _name(key)
            metrics[name] = _num(text, key)
        return step, metrics
    m = _MEGATRON_VAL.search(line)
    if m:
        step = _step(m.group(1))
        metrics = {}
        for part in m.group(2).split("|"):
            if ":" not in part:
                continue
            key, _, text = part.rpartition(":")
            low = key.strip().lower()
            if low.endswith(" value"):
                base = low[: -len(" value")]
                name = "val_loss" if base in ("lm loss", "loss") else "val_" + _name(base)
            elif low.endswith(" ppl"):
                base = low[: -len(" ppl")]
                name = "val_ppl" if base in ("lm loss", "loss") else "val_" + _name(base) + "_ppl"
            else:
                continue
            metrics[name] = _num(text, key.strip())
        return step, metrics
    return None


_MNG = re.compile(r"^\s*step:(\S+?)/\d+\s+(.*)$")
_LLMC_LOG = re.compile(r"^\s*s:(\S+)\s+(\w+:.*)$")
_LLMC_LOG_KEYS = {"trl": "loss", "tel": "val_loss", "lr": "lr", "norm": "grad_norm"}
_NANOGPT_ITER = re.compile(r"^\s*iter\s+(\S+?):\s*(.*)$")
_NANOGPT_EVAL = re.compile(r"^\s*step\s+(\S+?):\s*(train loss.*)$")


def _nanogpt(line: str, state: dict[str, Any]) -> Parsed | None:
    """modded-nanogpt: ``step:126/1750 train_loss:4.1234 train_time:12432ms step_avg:98.67ms``
    and ``step:125/1750 val_loss:4.2887 train_time:12345ms step_avg:98.76ms``; karpathy/nanoGPT:
    ``iter 100: loss 4.1234, time 123.45ms, mfu 12.34%`` and ``step 250: train loss 4.1234, val
    loss 4.2345``; llm.c's main.log (modded-nanogpt's llmc record): ``s:0 trl:10.9``."""
    m = _MNG.match(line)
    if m:
        step = _step(m.group(1))
        metrics: dict[str, float] = {}
        for token in m.group(2).split():
            key, sep, text = token.partition(":")
            if not sep:
                raise _Halfway(f"expected key:value, got {token!r}")
            unit = "ms" if text.endswith("ms") else ""
            value = _num(text[: len(text) - len(unit)], key)
            if key == "train_loss":
                metrics["loss"] = value
            elif key == "train_time":
                metrics["train_time_ms"] = value
                if "val_loss" in m.group(2):  # a validation line: the clock, not a step
                    continue
                last = state.get("train_time")
                if last is not None and step > last[0]:
                    metrics["step_time_ms"] = (value - last[1]) / (step - last[0])
                state["train_time"] = (step, value)
            else:
                metrics[_name(key) + ("_ms" if unit else "")] = value
        return step, metrics
    found = _llmc_log(line)
    if found is not None:
        return found
    m = _NANOGPT_ITER.match(line)
    if m:
        step = _step(m.group(1))
        metrics = {}
        for part in m.group(2).split(","):
            words = part.split()
            if len(words) != 2:
                raise _Halfway(f"expected 'name value', got {part.strip()!r}")
            key, text = words
            if text.endswith("ms"):
                metrics[f"{_name(key)}_ms"] = _num(text[:-2], key)
            elif text.endswith("%"):
                metrics[f"{_name(key)}_pct"] = _num(text[:-1], key)
            else:
                metrics[_name(key)] = _num(text, key)
        if "time_ms" in metrics:
            metrics["step_time_ms"] = metrics.pop("time_ms")
        return step, metrics
    m = _NANOGPT_EVAL.match(line)
    if m:
        step = _step(m.group(1))
        metrics = {}
        for part in m.group(2).split(","):
            key, _, text = part.strip().rpartition(" ")
            name = {"train loss": "eval_train_loss", "val loss": "val_loss"}.get(key, _name(key))
            metrics[name] = _num(text, key)
        return step, metrics
    return None


def _llmc_log(line: str) -> Parsed | None:
    m = _LLMC_LOG.match(line)
    if not m:
        return None
    step = _step(m.group(1))
    metrics: dict[str, float] = {}
    for token in m.group(2).split():
        key, sep, text = token.partition(":")
        if not sep:
            raise _Halfway(f"expected key:value, got {token!r}")
        metrics[_LLMC_LOG_KEYS.get(key, _name(key))] = _num(text, key)
    return step, metrics


_LLMC_STEP = re.compile(r"^\s*step\s+(\S+?)/\d+\s*\|(.*)$")
_LLMC_CPU = re.compile(r"^\s*step\s+(\S+?):\s*train loss\s+(\S+)\s*\(took\s+(\S+)\s*ms\)")
_LLMC_VAL = re.compile(r"^\s*val loss\s+(\S+)\s*$")
_LLMC_PART = re.compile(r"^\s*([A-Za-z_ ]*?)\s*(-?[^\s(]+)\s*(\S*)\s*(?:\(.*\))?\s*$")


def _llmc(line: str, state: dict[str, Any]) -> Parsed | None:
    """llm.c train_gpt2.cu: ``step    1/19560 | loss 11.010029 (+0.00z)| norm 15.4321
    (+0.00z)| lr 8.57e-07 | 1234.56 ms | 45.6% bf16 MFU | 424567 tok/s`` (older builds: ``train
    loss``, no z-scores), ``val loss 3.2722``; train_gpt2.c (CPU): ``step 0: train loss 5.356
    (took 1234.5 ms)``; and the main.log it writes: ``s:0 trl:10.9 lr:... norm:...``."""
    m = _LLMC_STEP.match(line)
    if m:
        step = _step(m.group(1))
        metrics: dict[str, float] = {}
        for part in m.group(2).split("|"):
            part = re.sub(r"\([^)]*\)", "", part).strip()
            if not part:
                continue
            words = part.split()
            if words[-1] in ("ms",) and len(words) == 2:
                metrics["step_time_ms"] = _num(words[0], "step time")
            elif words[-1] == "tok/s":
                metrics["tokens_per_s"] = _num(words[0], "tok/s")
            elif words[-1] == "MFU":
                metrics["mfu_pct"] = _num(words[0].rstrip("%"), "MFU")
            else:
                key, value = " ".join(words[:-1]), words[-1]
                unit = "ms" if value.endswith("ms") else ""
                name = {"loss": "loss", "train loss": "loss", "norm": "grad_norm"}.get(key)
                name = name or _name(key) + ("_ms" if unit else "")
                metrics[name] = _num(value[: len(value) - len(unit)], key)
        return step, metrics
    m = _LLMC_CPU.match(line)
    if m:
        return _step(m.group(1)), {
            "loss": _num(m.group(2), "train loss"),
            "step_time_ms": _num(m.group(3), "took"),
        }
    m = _LLMC_VAL.match(line)
    if m:
        return state.get("last"), {"val_loss": _num(m.group(1), "val loss")}
    return _llmc_log(line)


_TITAN = re.compile(r"\bstep:\s*(\S+)\s+(loss:.*)$")
_TITAN_PAIR = re.compile(r"(\w+):\s*(\S+)")


def _torchtitan(line: str, state: dict[str, Any]) -> Parsed | None:
    """torchtitan train.py: ``[titan] 2025-01-10 12:00:00,123 - root - INFO - step:  1  loss:
    12.2345  grad_norm:  1.2345  memory: 12.34GiB(15.67%)  tps: 1,234  tflops: 12.34  mfu:
    4.56%`` (colour codes stripped before this runs)."""
    m = _TITAN.search(line)
    if not m:
        return None
    step = _step(m.group(1))
    metrics: dict[str, float] = {}
    for key, text in _TITAN_PAIR.findall(m.group(2)):
        if key == "memory":
            gib = re.match(r"([^G(]+)GiB(?:\(([^%]+)%\))?", text)
            if not gib:
                raise _Halfway(f"memory is not 'xGiB(p%)': {text!r}")
            metrics["memory_gib"] = _num(gib.group(1), key)
            if gib.group(2):
                metrics["memory_pct"] = _num(gib.group(2), key)
        elif text.endswith("%"):
            metrics[f"{key}_pct"] = _num(text[:-1], key)
        else:
            metrics[{"tps": "tokens_per_s"}.get(key, key)] = _num(text, key)
    return step, metrics


_HF_DICT = re.compile(r"\{\s*'(?:loss|eval_\w+|train_runtime|grad_norm|learning_rate)'\s*:.*\}")
_HF_PAIR = re.compile(r"'(\w+)'\s*:\s*('[^']*'|[^,}]+)")
_HF_NAMES = {"learning_rate": "lr", "eval_loss": "val_loss"}


def _hf(line: str, state: dict[str, Any]) -> Parsed | None:
    """Hugging Face Trainer (ProgressCallback / PrinterCallback): ``{'loss': '2.345',
    'grad_norm': '1.23', 'learning_rate': '4.5e-05', 'epoch': '0.1'}`` (transformers 5 quotes
    the values, 4 does not). The n-th training dict is step n; a dict with ``step`` uses it."""
    m = _HF_DICT.search(line)
    if not m:
        return None
    pairs = dict(_HF_PAIR.findall(m.group(0)))
    if "train_runtime" in pairs:  # the end-of-training summary, not a step
        return None
    metrics = {_HF_NAMES.get(k, k): _num(v, k) for k, v in pairs.items() if k != "step"}
    if "step" in pairs:
        step: int | None = _step(pairs["step"].strip("'"))
    elif "loss" in pairs:
        step = state.get("hf_n", 0) + 1
    else:  # evaluation: the step of the last training dict
        step = state.get("last")
    if "loss" in pairs and step is not None:
        state["hf_n"] = step
    return step, metrics


def _compile_pattern(pattern: str | None, path: str | Path) -> re.Pattern[str]:
    if not pattern:
        raise JobLogError(path, None, "--preset regex needs --pattern REGEX")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        msg = f"--pattern is not a valid regular expression: {exc}"
        raise JobLogError(path, None, msg) from None
    for group in ("step", "loss"):
        if group not in compiled.groupindex:
            raise JobLogError(
                path,
                None,
                f"--pattern has no (?P<{group}>...) group; it needs 'step' and 'loss', e.g. "
                r"'it (?P<step>\d+) loss (?P<loss>\S+)'",
            )
    return compiled


class _Parser:
    """One log's parser: lines in, ``("point", ...)``/``("event", ...)`` items out."""

    def __init__(self, path: str | Path, preset: str, pattern: str | None) -> None:
        if preset not in PRESETS:
            raise JobLogError(path, None, f"unknown preset {preset!r}; one of {', '.join(PRESETS)}")
        self.path = str(path)
        self.state: dict[str, Any] = {}
        self.traceback: list[str] | None = None
        self.regex = _compile_pattern(pattern, path) if preset == "regex" else None
        parsers: dict[str, Callable[[str, dict[str, Any]], Parsed | None]] = {
            "megatron": _megatron,
            "nanogpt": _nanogpt,
            "llmc": _llmc,
            "torchtitan": _torchtitan,
            "hf": _hf,
            "regex": self._regex,
        }
        self.parse = parsers[preset]

    def _regex(self, line: str, state: dict[str, Any]) -> Parsed | None:
        assert self.regex is not None
        m = self.regex.search(line)
        if not m:
            return None
        metrics = {k: _num(v, k) for k, v in m.groupdict().items() if k != "step" and v is not None}
        return _step(m.group("step")), metrics

    def feed(self, raw: str, lineno: int, now: float | None) -> list[tuple[Any, ...]]:
        """Items of one line (without its newline); :class:`JobLogError` on a halfway match."""
        line = _RANK_PREFIX.sub("", _ANSI.sub("", raw)).rstrip("\r")
        if "\r" in line:  # a progress bar redrawn on the same line: its last state
            line = line.rsplit("\r", 1)[-1]
        when = _stamp(line)
        when = now if when is None else when
        out: list[tuple[Any, ...]] = []
        if self.traceback is not None:
            if line.startswith((" ", "\t")) or not line.strip() or line.startswith(_TRACEBACK):
                if line.strip() and not line.startswith(_TRACEBACK):
                    self.traceback.append(line.strip())
                return out
            out.append(self._crash(line.strip(), when))
            return out
        if line.strip().startswith(_TRACEBACK):
            self.traceback = []
            return out
        try:
            parsed = self.parse(line, self.state)
        except _Halfway as exc:
            raise JobLogError(self.path, lineno, f"{exc} in {raw.strip()[:200]!r}") from None
        if parsed is not None:
            step, metrics = parsed
            if step is None:
                step = self.state.get("last")
            if step is not None and metrics:
                self.state["last"] = step
                out.append(("point", step, metrics, when))
            return out
        kind, attrs = classify_log_message(line)
        if kind == "log" and not _CUDA_ERROR.search(line):
            return out  # an ordinary line
        out.append(("event", self.state.get("last"), kind, line.strip()[:500], when, attrs))
        return out

    def _crash(self, message: str, when: float | None) -> tuple[Any, ...]:
        self.traceback = None
        kind, attrs = classify_log_message(message)
        if kind == "log":
            kind = "crash"
        return ("event", self.state.get("last"), kind, message[:500], when, attrs)

    def flush(self, when: float | None) -> list[tuple[Any, ...]]:
        """At the end of a finished file: a traceback cut short is still a crash."""
        if self.traceback is None:
            return []
        last = self.traceback[-1] if self.traceback else _TRACEBACK
        return [self._crash(f"traceback cut short: {last}", when)]


# -- import -----------------------------------------------------------------------------------
def read_log(
    path: str | Path, *, preset: str, pattern: str | None = None
) -> tuple[pd.DataFrame, list[EventRow], int]:
    """The whole log as long-format points, events (in file order) and its line count.

    ``run`` is left empty for the caller to fill. A halfway line raises :class:`JobLogError`.
    """
    parser = _Parser(path, preset, pattern)
    steps: list[int] = []
    names: list[str] = []
    values: list[float] = []
    times: list[float] = []
    events: list[EventRow] = []
    lineno = 0

    def add(items: list[tuple[Any, ...]]) -> None:
        for item in items:
            if item[0] == "point":
                _, step, metrics, when = item
                t = math.nan if when is None else when
                for name, value in metrics.items():
                    steps.append(step)
                    names.append(name)
                    values.append(value)
                    times.append(t)
            else:
                _, step, kind, message, when, attrs = item
                events.append(
                    EventRow("", step, kind, message, when, None, None, attrs, lineno, len(steps))
                )

    with open(path, encoding="utf-8", errors="replace", newline="\n") as fh:
        for lineno, raw in enumerate(fh, start=1):
            add(parser.feed(raw.rstrip("\n"), lineno, None))
        add(parser.flush(None))
    n = len(steps)
    frame = pd.DataFrame(
        {
            "run": pd.Series([""] * n, dtype=object),
            "step": np.array(steps, dtype=np.int64),
            "metric": pd.Series(names, dtype=object),
            "value": np.array(values, dtype=np.float64),
            "time": np.array(times, dtype=np.float64),
            "rank": pd.array([None] * n, dtype="Int64"),
            "host": pd.Series([None] * n, dtype=object),
            "gpu": pd.array([None] * n, dtype="Int64"),
        }
    )
    return frame, events, lineno


def import_log(
    store: Store,
    path: str | Path,
    *,
    preset: str,
    pattern: str | None = None,
    run_name: str,
    append: bool = False,
    config: Mapping[str, Any] | None = None,
    merge_config: ConfigMerge = _merge,
) -> ImportSummary:
    """Import a finished job log into run ``run_name``: all of it in one transaction, or
    nothing when a line matches the preset halfway (:class:`JobLogError` names it)."""
    import dataclasses

    frame, events, _ = read_log(path, preset=preset, pattern=pattern)
    frame = frame.assign(run=run_name)
    events = [dataclasses.replace(e, run=run_name) for e in events]
    summary = ImportSummary()
    importer = _Importer(store, Path(path), append, summary, config, merge_config)
    with store.transaction():
        importer.run(run_name)
        importer.chunk(frame, events, 0)
        for run in importer.runs.values():
            run.date(store)
    log.info("imported %s: %d points, %d events", path, len(frame), len(events))
    return summary


# -- watching ---------------------------------------------------------------------------------
def _head_hash(first_line: bytes) -> str:
    return hashlib.sha1(first_line).hexdigest()[:16]


class LogSource:
    """Follow a job log as it grows: :meth:`read_new` returns what complete lines were added.

    Items: ``("point", step, {metric: value}, time)`` and ``("event", step, kind, message,
    time)``, time in Unix seconds (the line's own timestamp, else now). :meth:`state` /
    :meth:`restore` carry the byte offset, inode and a hash of the first line, so a restarted
    watcher resumes where it stopped. Rotation (renamed away, new file created): the old file
    is read to its end, then the new one from 0. Truncation (or a different first line): start
    over at 0. A last line without its newline waits for the next call.
    """

    def __init__(self, path: str | Path, *, preset: str, pattern: str | None = None) -> None:
        self.path = Path(path)
        self.preset = preset
        self.pattern = pattern
        self._parser = _Parser(path, preset, pattern)
        self._fh: Any = None
        self._inode: int | None = None
        self._offset = 0
        self._line = 0
        self._head: str | None = None

    # -- state --------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Where the source is, as plain JSON-able values."""
        return {
            "path": str(self.path),
            "offset": self._offset,
            "inode": self._inode,
            "head": self._head,
            "line": self._line,
            "last_step": self._parser.state.get("last"),
            "hf_n": self._parser.state.get("hf_n"),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state`; a file that is no longer the one saved starts at 0."""
        self._close()
        self._inode = state.get("inode")
        self._offset = int(state.get("offset") or 0)
        self._line = int(state.get("line") or 0)
        self._head = state.get("head")
        for key, saved in (("last", "last_step"), ("hf_n", "hf_n")):
            if state.get(saved) is not None:
                self._parser.state[key] = state[saved]

    # -- reading ------------------------------------------------------------------------------
    def _close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _start_over(self, why: str) -> None:
        log.info("%s: %s; reading it from the start", self.path, why)
        self._offset = 0
        self._line = 0
        self._head = None
        self._parser.traceback = None

    def _open(self) -> bool:
        """Open the file at ``path``, checking it is the one the state describes."""
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 (kept open to finish a rotated file)
        except FileNotFoundError:
            return False
        st = os.fstat(fh.fileno())
        if self._inode is not None and st.st_ino != self._inode:
            self._start_over("a different file than before (rotated)")
        elif st.st_size < self._offset:
            self._start_over("truncated")
        elif self._head is not None and self._offset:
            first = fh.readline()
            fh.seek(0)
            if _head_hash(first) != self._head:
                self._start_over("its first line changed")
        self._fh = fh
        self._inode = st.st_ino
        return True

    def read_new(self) -> list[tuple[Any, ...]]:
        """Items of the complete lines added since the last call (see the class docstring)."""
        out: list[tuple[Any, ...]] = []
        if self._fh is None and self._inode is not None:
            out += self._finish_rotated()
        if self._fh is None and not self._open():
            return out
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is not None and st.st_ino != self._inode:  # rotated: finish the old file first
            out += self._read(final=True)
            self._close()
            self._inode = None
            self._start_over("rotated")
            if not self._open():
                return out
        elif st is not None and st.st_size < self._offset:
            self._start_over("truncated")
        out += self._read(final=False)
        return out

    def _finish_rotated(self) -> list[tuple[Any, ...]]:
        """Restored while the saved file was rotated away: finish it where it now lives
        (a sibling such as ``train.log.1`` with the saved inode), then the new file from 0."""
        try:
            if os.stat(self.path).st_ino == self._inode:
                return []
        except FileNotFoundError:
            pass
        for sibling in sorted(self.path.parent.glob(self.path.name + "*")):
            try:
                if sibling != self.path and os.stat(sibling).st_ino == self._inode:
                    self._fh = open(sibling, "rb")  # noqa: SIM115 (closed just below)
                    break
            except OSError:
                continue
        else:
            return []
        log.info("%s: finishing %s, the file it was before rotation", self.path, sibling)
        try:
            return self._read(final=True)
        finally:
            self._close()
            self._inode = None
            self._start_over("rotated")

    def _read(self, final: bool) -> list[tuple[Any, ...]]:
        fh = self._fh
        fh.seek(self._offset)
        data = fh.read()
        if not final:
            cut = data.rfind(b"\n") + 1
            data = data[:cut]
        if not data:
            return []
        if self._offset == 0 or self._head is None:
            end = data.find(b"\n")
            if end >= 0 or final:
                self._head = _head_hash(data[: end + 1] if end >= 0 else data)
        self._offset += len(data)
        now = time.time()
        items: list[tuple[Any, ...]] = []
        text = data.decode("utf-8", errors="replace")
        if text.endswith("\n"):
            text = text[:-1]
        for raw in text.split("\n"):
            self._line += 1
            try:
                got = self._parser.feed(raw, self._line, now)
            except JobLogError as exc:
                log.warning("%s (skipped)", exc)
                items.append(("event", self._parser.state.get("last"), "log", str(exc), now))
                continue
            items += [item[:5] for item in got]
        return items
