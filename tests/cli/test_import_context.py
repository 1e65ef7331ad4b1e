"""``runwatch import`` of JSONL events and step context, restarts within a file, bad lines."""

from __future__ import annotations

import json

import pytest

from runwatch.cli import main
from runwatch.store import open_store


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _point(step, metric="loss", value=1.0, **extra):
    return {"run": "r", "step": step, "metric": metric, "value": value, **extra}


def test_points_events_and_context_in_one_file(tmp_path, db_path, capsys):
    rows = [
        {"run": "r", "step": 0, "context": {"shard": "s1", "source": "web"}},
        *[_point(s) for s in range(0, 5)],
        {"run": "r", "step": 5, "context": {"shard": "s2"}},
        *[_point(s) for s in range(5, 8)],
        {"run": "r", "step": 8, "context": {"shard": "s2"}},  # no change: not stored
        {"run": "r", "step": 8, "context": {"source": None}, "time": 1700000000.0},
        {
            "run": "r",
            "step": 8,
            "event": "crash",
            "message": "CUDA error: an illegal memory access",
            "time": 1700000001.0,
            "rank": 3,
            "host": "node7",
        },
        *[_point(s) for s in range(8, 10)],
    ]
    src = _jsonl(tmp_path / "mixed.jsonl", rows)
    assert main(["import", str(src), "--db", str(db_path)]) == 0
    assert "imported 10 points in 1 series into run 'r'" in capsys.readouterr().out
    with open_store(str(db_path), readonly=True) as store:
        contexts = store.contexts("r")
        events = store.events("r", kinds=["crash"])
        exposure = store.context_exposure("r")
        attempts = store.attempts("r")
    assert contexts["step"].tolist() == [0, 5, 8]
    assert contexts["context"].tolist() == [
        {"shard": "s1", "source": "web"},
        {"shard": "s2", "source": "web"},
        {"shard": "s2"},
    ]
    assert contexts["time"].tolist()[2] == 1700000000.0
    assert exposure == {"shard": {"s1": 5, "s2": 5}, "source": {"web": 8}}
    crash = events.iloc[0]
    assert (crash["step"], crash["rank"], crash["host"]) == (8, 3, "node7")
    assert crash["message"] == "CUDA error: an illegal memory access"
    assert len(attempts) == 1


def test_a_step_that_goes_back_starts_one_new_attempt_for_every_series(tmp_path, db_path):
    rows = [
        *[r for s in range(0, 10) for r in (_point(s), _point(s, "lr", 1e-3))],
        # the restarted process: its context first, then its points from step 6
        {"run": "r", "step": 6, "context": {"shard": "after"}},
        {"run": "r", "step": 6, "event": "note", "message": "resumed"},
        *[r for s in range(6, 12) for r in (_point(s, value=2.0), _point(s, "lr", 5e-4))],
        _point(7, "eval_loss", 3.0),  # a series first seen after the restart
    ]
    rows.insert(0, {"run": "r", "step": 0, "context": {"shard": "before"}})
    src = _jsonl(tmp_path / "restart.jsonl", rows)
    assert main(["import", str(src), "--db", str(db_path)]) == 0
    with open_store(str(db_path), readonly=True) as store:
        attempts = store.attempts("r")
        points = store.read_points("r", all_attempts=True)
        contexts = store.contexts("r")
        note = store.events("r", kinds=["note"])
        live = store.read_series("r", "loss")
        at = store.context_at("r", [5, 6, 11], [None, None, None])
    assert attempts["attempt"].tolist() == [1, 2]
    assert attempts["start_step"].tolist() == [0, 6]
    by_attempt = points.groupby(["metric", "attempt"]).size().to_dict()
    assert by_attempt == {
        ("eval_loss", 2): 1,
        ("loss", 1): 10,
        ("loss", 2): 6,
        ("lr", 1): 10,
        ("lr", 2): 6,
    }
    assert contexts[["step", "attempt"]].values.tolist() == [[0, 1], [6, 2]]
    assert note["attempt"].tolist() == [2]
    assert live["value"].tolist() == [1.0] * 6 + [2.0] * 6
    assert at == [{"shard": "before"}, {"shard": "after"}, {"shard": "after"}]


def test_a_csv_written_metric_by_metric_stays_one_attempt(tmp_path, db_path):
    lines = ["run,step,metric,value"]
    lines += [f"r,{s},loss,1.0" for s in range(50)]
    lines += [f"r,{s},lr,0.1" for s in range(50)]
    src = tmp_path / "by_metric.csv"
    src.write_text("\n".join(lines) + "\n")
    assert main(["import", str(src), "--db", str(db_path)]) == 0
    with open_store(str(db_path), readonly=True) as store:
        assert len(store.attempts("r")) == 1
        assert len(store.read_points("r")) == 100


def test_append_adds_an_attempt_and_a_restart_inside_adds_another(tmp_path, db_path):
    first = _jsonl(tmp_path / "a.jsonl", [_point(s) for s in range(5)])
    second = _jsonl(
        tmp_path / "b.jsonl",
        [*[_point(s) for s in range(5, 9)], *[_point(s, value=9.0) for s in range(7, 10)]],
    )
    assert main(["import", str(first), "--db", str(db_path)]) == 0
    assert main(["import", str(second), "--db", str(db_path), "--append"]) == 0
    with open_store(str(db_path), readonly=True) as store:
        attempts = store.attempts("r")
        live = store.read_series("r", "loss")
    assert attempts["attempt"].tolist() == [1, 2, 3]
    assert attempts["reason"].tolist()[2] == "restart"
    assert live["step"].tolist() == list(range(10))
    assert live["value"].tolist() == [1.0] * 7 + [9.0] * 3


@pytest.mark.parametrize(
    ("row", "column", "says"),
    [
        ({"run": "r", "step": 3, "context": "s17"}, "context", "must be an object"),
        ({"run": "r", "step": 3, "context": {"shard": [1, 2]}}, "context", "'shard'"),
        ({"run": "r", "step": 3, "context": {"shard": {"a": 1}}}, "context", "dict"),
        ({"run": "r", "context": {"shard": "s1"}}, "step", "missing required key 'step'"),
        ({"run": "r", "step": 3, "event": "explosion"}, "event", "unknown event kind"),
        ({"run": "r", "step": 3, "event": "crash", "message": 7}, "message", "string"),
        (
            {"run": "r", "step": 3, "event": "crash", "metric": "loss", "value": 1},
            "event",
            "not several",
        ),
        (
            {"run": "r", "step": 3, "context": {f"k{i}": i for i in range(101)}},
            "context",
            "more than the 100",
        ),
    ],
)
def test_a_bad_event_or_context_line_is_exit_2_naming_it_and_writes_nothing(
    tmp_path, db_path, capsys, row, column, says
):
    good = _jsonl(tmp_path / "good.jsonl", [_point(s) for s in range(3)])
    assert main(["import", str(good), "--db", str(db_path)]) == 0
    capsys.readouterr()
    rows = [
        _point(3),
        {"run": "r", "step": 3, "context": {"shard": "ok"}},
        {"run": "r", "step": 3, "event": "note"},
        row,
    ]
    src = _jsonl(tmp_path / "bad.jsonl", rows)
    assert main(["import", str(src), "--db", str(db_path), "--append"]) == 2
    err = capsys.readouterr().err
    assert f"bad.jsonl:4: column {column!r}" in err
    assert says in err
    with open_store(str(db_path), readonly=True) as store:
        assert len(store.attempts("r")) == 1  # the appended attempt was rolled back
        assert store.contexts("r").empty
        assert store.events("r", kinds=["note"]).empty
        assert len(store.read_points("r")) == 3


def test_a_run_wide_context_row_goes_back_with_the_ranks(tmp_path, db_path):
    rows = []
    for step in range(0, 8):
        if step in (0, 4):
            rows.append({"run": "r", "step": step, "context": {"shard": f"a{step}"}})
        rows += [_point(step, "step_time", 0.5, rank=rank) for rank in (0, 1)]
    # restarted from step 3: the run-wide row comes first, then the ranks' points
    rows.append({"run": "r", "step": 3, "context": {"shard": "b3"}})
    rows += [_point(s, "step_time", 0.6, rank=r) for s in range(3, 6) for r in (1, 0)]
    src = _jsonl(tmp_path / "ranks.jsonl", rows)
    assert main(["import", str(src), "--db", str(db_path)]) == 0
    with open_store(str(db_path), readonly=True) as store:
        attempts = store.attempts("r")
        contexts = store.contexts("r")
        exposure = store.context_exposure("r")
    assert attempts["start_step"].tolist() == [0, 3]
    assert contexts[["step", "attempt"]].values.tolist() == [[0, 1], [3, 2], [4, 1]]
    assert exposure == {"shard": {"a0": 3, "b3": 3}}
