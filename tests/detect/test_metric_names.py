"""Roles from the metric names that frameworks really write (issue 24), both ways: the names
that must get a role, and the look-alikes that must not. The table and where each name
comes from: ``tests/detect/data/framework_metric_names.csv`` and its README."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from runwatch.detect.names import role_from_name, worse_direction

TABLE = Path(__file__).with_name("data") / "framework_metric_names.csv"
ROWS = list(csv.DictReader(TABLE.open()))
KNOWN_MISSES = {
    # Names a name alone cannot settle; what runwatch does with them instead.
    "time": "a clock in Lightning's Throughput, a step time in nanoGPT's stdout: index",
    "s": "llm.c's step key; its log preset maps it to the step",
    "trl": "llm.c's train loss key; the llmc log preset names it train_loss",
    "tel": "llm.c's eval loss key; the llmc log preset names it val_loss",
    "norm": "llm.c's grad norm key; the llmc log preset names it grad_norm",
    "skipped": "DeepSpeed's running total of skipped steps; read as more-is-worse",
    "agent_steps": "a running total of env steps; read as an index, also not judged",
    "Train/Samples/elapsed_time_ms_step": "DeepSpeed's optimizer-step phase; read as step time",
    "eval/downstream/hellaswag": "a benchmark's name says nothing of its direction: both",
}
LOOK_ALIKES = {"loss_scale", "counter", "index", "other", "other:up", "other:down"}


def _got(name: str) -> str:
    role = role_from_name(name)
    if role != "other":
        return role
    direction = worse_direction(name)
    return "other" if direction is None else f"other:{direction}"


def test_the_table_is_broad():
    frameworks = {row["framework"] for row in ROWS}
    assert len(ROWS) >= 400 and len(frameworks) >= 12
    assert all(row["source"].strip() for row in ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['framework']}:{r['name']}" for r in ROWS])
def test_a_framework_name_gets_its_role(row):
    if row["name"] in KNOWN_MISSES:
        pytest.skip(KNOWN_MISSES[row["name"]])
    assert _got(row["name"]) == row["role"]


def test_at_least_95_percent_of_the_table_and_no_look_alike_taken_for_a_watched_role():
    got = [(row, _got(row["name"])) for row in ROWS]
    assert sum(g == row["role"] for row, g in got) / len(got) >= 0.95
    taken = [
        row["name"]
        for row, g in got
        if row["role"] in LOOK_ALIKES and g in ("loss", "grad_norm", "lr")
    ]
    assert taken == []


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("loss-scale", "loss_scale"),
        ("amp/loss_scale", "loss_scale"),
        ("params-norm", "other"),
        ("optim/param/blocks.0.weight.norm", "other"),
        ("grad_clip_coef", "other"),
        ("train/max_grad_norm", "other"),
        ("lr-AdamW-momentum", "other"),
        ("throughput/total_tokens", "counter"),
        ("consumed-samples", "counter"),
        ("total_flos", "counter"),
        ("epoch", "index"),
        ("_step", "index"),
        ("_runtime", "index"),
        ("_timestamp", "index"),
        ("train_time_ms", "index"),
        # and the names that must match, in each convention
        ("Loss/train", "loss"),
        ("train/CrossEntropyLoss", "loss"),
        ("lm loss vs samples", "loss"),
        ("train_loss_step", "loss"),
        ("val_ppl", "loss"),
        ("optim/learning_rate_group0", "lr"),
        ("lr-AdamW/pg1", "lr"),
        ("grad_2.0_norm_total", "grad_norm"),
        ("mfu(%)", "throughput"),
        ("TFLOPs", "throughput"),
        ("tokens per gpu per second (tgs)", "throughput"),
        ("elapsed time per iteration (ms)", "step_time"),
        ("time_metrics/end_to_end(s)", "step_time"),
        ("forward-backward-time", "other"),
    ],
)
def test_separators_case_units_and_look_alikes(name, role):
    assert role_from_name(name) == role


def test_an_empty_or_separator_only_name_has_no_role_but_other():
    assert role_from_name("") == role_from_name("__/") == "other"
