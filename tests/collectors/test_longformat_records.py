"""JSONL events and step context in the long-format reader, and their import across chunks."""

from __future__ import annotations

import functools
import json

import pytest

from runwatch.collectors import importer
from runwatch.collectors.longformat import (
    ContextRow,
    EventRow,
    LongFormatError,
    LongFormatReader,
    read_long_format,
)
from runwatch.store import open_store

ROWS = [
    {"run": "r", "step": 0, "context": {"shard": "a"}, "rank": 1},
    {"run": "r", "step": 0, "metric": "loss", "value": 1.0, "rank": 1},
    {"run": "r", "step": 1, "metric": "loss", "value": 1.0, "rank": 1},
    {"run": "r", "step": 2, "metric": "loss", "value": 1.0, "rank": 1},
    {"run": "r", "step": 2, "event": "oom", "message": "out of memory", "rank": 1},
    {"run": "r", "step": 1, "context": {"shard": "b"}, "rank": 1},
    {"run": "r", "step": 1, "metric": "loss", "value": 2.0, "rank": 1},
    {"run": "r", "step": 2, "metric": "loss", "value": 2.0, "rank": 1},
    {"run": "r", "step": 3, "metric": "loss", "value": 2.0, "rank": 1},
]


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_records_come_with_their_line_and_the_points_before_them(src):
    reader = LongFormatReader(src, chunk_rows=2)
    chunks = list(reader.items())
    points = sum(len(chunk) for chunk, _ in chunks)
    records = [r for _, recs in chunks for r in recs]
    assert points == 6
    assert [(type(r).__name__, r.line, r.before) for r in records] == [
        ("ContextRow", 1, 0),
        ("EventRow", 5, 3),
        ("ContextRow", 6, 3),
    ]
    event = records[1]
    assert isinstance(event, EventRow)
    assert (event.kind, event.step, event.rank, event.time) == ("oom", 2, 1, None)
    assert isinstance(records[2], ContextRow) and records[2].context == {"shard": "b"}


def test_plain_iteration_still_gives_only_points(src):
    frames = list(read_long_format(src))
    assert sum(len(f) for f in frames) == 6
    assert list(frames[0].columns) == [
        "run",
        "step",
        "metric",
        "value",
        "time",
        "rank",
        "host",
        "gpu",
    ]


def test_a_non_finite_context_value_names_its_line(tmp_path):
    path = tmp_path / "nan.jsonl"
    path.write_text('{"run":"r","step":1,"context":{"lr_scale":NaN}}\n')
    with pytest.raises(LongFormatError, match=r"nan.jsonl:1: column 'context'.*finite"):
        list(read_long_format(path))


@pytest.mark.parametrize("chunk_rows", [1, 2, 3, 100])
def test_import_is_the_same_whatever_the_chunk_size(src, tmp_path, monkeypatch, chunk_rows):
    monkeypatch.setattr(
        importer, "LongFormatReader", functools.partial(LongFormatReader, chunk_rows=chunk_rows)
    )
    db = tmp_path / f"c{chunk_rows}.db"
    with open_store(str(db)) as store:
        summary = importer.import_long_format(store, src)
        points = store.read_points("r", all_attempts=True)
        contexts = store.contexts("r")
        oom = store.events("r", kinds=["oom"])
    assert summary.restarts == {"r": 1} and summary.contexts == {"r": 2}
    assert points[["step", "attempt"]].values.tolist() == [
        [0, 1],
        [1, 1],
        [2, 1],
        [1, 2],
        [2, 2],
        [3, 2],
    ]
    assert contexts[["step", "attempt", "rank"]].values.tolist() == [[0, 1, 1], [1, 2, 1]]
    assert oom["attempt"].tolist() == [1]
