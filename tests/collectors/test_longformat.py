"""Long format: exact errors, real files, and a write/read round trip."""

from __future__ import annotations

import gzip
import io
import json
import math
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwatch.collectors.longformat import (
    COLUMNS,
    LongFormatError,
    LongFormatReader,
    detect_format,
    read_long_format,
    write_long_format,
)

REAL_RUNS = Path(__file__).resolve().parents[2].parent / "shared/data/real_runs"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_bytes(text.encode())
    return path


def _read_all(path: Path, **kwargs) -> pd.DataFrame:
    chunks = list(read_long_format(path, **kwargs))
    if not chunks:
        return pd.DataFrame(columns=list(COLUMNS))
    return pd.concat(chunks, ignore_index=True)


def _error(path: Path, **kwargs) -> LongFormatError:
    with pytest.raises(LongFormatError) as info:
        _read_all(path, **kwargs)
    return info.value


# ----------------------------------------------------------------------------- reading


def test_csv_chunks_have_the_documented_columns_and_dtypes(tmp_path):
    path = _write(tmp_path, "a.csv", "run,step,metric,value\nr,1,loss,2.5\nr,2,loss,2.25\n")
    df = _read_all(path)
    assert list(df.columns) == list(COLUMNS)
    assert {c: str(t) for c, t in df.dtypes.items()} == {
        "run": "object",
        "step": "int64",
        "metric": "object",
        "value": "float64",
        "time": "float64",
        "rank": "Int64",
        "host": "object",
        "gpu": "Int64",
    }
    assert df["value"].tolist() == [2.5, 2.25]
    assert df["time"].isna().all() and df["rank"].isna().all() and df["gpu"].isna().all()
    assert df["host"].tolist() == [None, None]


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "quoted-slow-path"])
def test_nan_and_inf_spellings_are_real_values(tmp_path, fast):
    spellings = ["nan", "NaN", "NAN", "nAn", "inf", "-inf", "Infinity", "-Infinity", "INF"]
    run = "r" if fast else '"r"'
    rows = "".join(f"{run},{i},loss,{s}\n" for i, s in enumerate(spellings))
    df = _read_all(_write(tmp_path, "a.csv", "run,step,metric,value\n" + rows))
    got = df["value"].tolist()
    assert all(math.isnan(v) for v in got[:4])
    assert got[4:] == [math.inf, -math.inf, math.inf, -math.inf, math.inf]


def test_optional_columns_in_any_order_with_blanks(tmp_path):
    text = (
        "gpu,host,metric,value,run,step,rank,time\n"
        "3,node-1,loss,1.5,r,10,7,1700000000.25\n"
        ",,loss,2.5,r,11,,\n"
    )
    df = _read_all(_write(tmp_path, "a.csv", text))
    assert df["gpu"].tolist() == [3, pd.NA]
    assert df["rank"].tolist() == [7, pd.NA]
    assert df["host"].tolist() == ["node-1", None]
    assert df["time"].iloc[0] == 1700000000.25 and math.isnan(df["time"].iloc[1])
    assert df["step"].tolist() == [10, 11]


def test_integral_float_steps_are_accepted_like_pandas_writes_them(tmp_path):
    df = _read_all(_write(tmp_path, "a.csv", "run,step,metric,value\nr,3.0,loss,1\n"))
    assert df["step"].tolist() == [3]


def test_blank_lines_and_crlf_and_bom_are_tolerated(tmp_path):
    text = "\ufeffrun,step,metric,value\r\nr,1,loss,1\r\n\r\nr,2,loss,2\r\n"
    df = _read_all(_write(tmp_path, "a.csv", text))
    assert df["step"].tolist() == [1, 2]
    assert df["value"].tolist() == [1.0, 2.0]


def test_quoted_fields_with_commas_and_newlines(tmp_path):
    text = 'run,step,metric,value,host\n"r,1",1,loss,1,"a\nb"\nr,2,"m""x",2,\n'
    df = _read_all(_write(tmp_path, "a.csv", text))
    assert df["run"].tolist() == ["r,1", "r"]
    assert df["host"].tolist() == ["a\nb", None]
    assert df["metric"].tolist() == ["loss", 'm"x']


def test_small_chunks_cover_every_row_once(tmp_path):
    rows = "".join(f"r,{i},loss,{i / 7!r}\n" for i in range(1000))
    path = _write(tmp_path, "a.csv", "run,step,metric,value\n" + rows)
    chunks = list(read_long_format(path, chunk_rows=50))
    assert len(chunks) > 5
    df = pd.concat(chunks, ignore_index=True)
    assert df["step"].tolist() == list(range(1000))
    assert df["value"].tolist() == [i / 7 for i in range(1000)]


def test_gzip_and_jsonl_and_ndjson(tmp_path):
    csv_text = "run,step,metric,value\nr,1,loss,nan\n"
    json_text = '{"run":"r","step":1,"metric":"loss","value":"nan","rank":2}\n'
    for name, text in [
        ("a.csv.gz", csv_text),
        ("a.jsonl", json_text),
        ("a.ndjson", json_text),
        ("a.jsonl.gz", json_text),
    ]:
        df = _read_all(_write(tmp_path, name, text))
        assert df["step"].tolist() == [1], name
        assert math.isnan(df["value"].iloc[0]), name


def test_jsonl_accepts_bare_nan_numbers_and_nulls(tmp_path):
    text = (
        '{"run":"r","step":1,"metric":"loss","value":NaN,"time":null,"host":null}\n'
        '{"run":"r","step":2,"metric":"loss","value":-Infinity,"gpu":"1"}\n'
        "\n"
        '{"run":"r","step":3,"metric":"loss","value":"1.5","extra":[1]}\n'
    )
    df = _read_all(_write(tmp_path, "a.jsonl", text))
    assert df["step"].tolist() == [1, 2, 3]
    assert math.isnan(df["value"].iloc[0])
    assert df["value"].iloc[1:].tolist() == [-math.inf, 1.5]
    assert df["gpu"].tolist() == [pd.NA, 1, pd.NA]


def test_explicit_format_overrides_the_extension(tmp_path):
    path = _write(tmp_path, "data.txt", '{"run":"r","step":1,"metric":"m","value":1}\n')
    assert _read_all(path, fmt="jsonl")["value"].tolist() == [1.0]


def test_progress_in_bytes(tmp_path):
    rows = "".join(f"r,{i},loss,{i}\n" for i in range(5000))
    path = _write(tmp_path, "a.csv", "run,step,metric,value\n" + rows)
    reader = read_long_format(path, chunk_rows=500)
    assert isinstance(reader, LongFormatReader)
    assert reader.bytes_read == 0
    assert reader.total_bytes == path.stat().st_size
    seen = []
    for _ in reader:
        seen.append(reader.bytes_read)
    assert seen == sorted(seen)
    assert 0 < seen[0] < reader.total_bytes
    assert reader.bytes_read == reader.total_bytes
    assert reader.rows_read == 5000


def test_reader_closes_its_file(tmp_path):
    path = _write(tmp_path, "a.csv", "run,step,metric,value\nr,1,loss,1\n")
    with read_long_format(path) as reader:
        next(reader)
    assert reader._raw is not None and reader._raw.closed


# ----------------------------------------------------------------------------- errors

HEADER = "run,step,metric,value\n"

CSV_ERRORS = [
    # (body after the header, line, column, words in the message)
    ("r,1,loss,1\nr,1.5,loss,1\n", 3, "step", "non-negative integer, got '1.5'"),
    ("r,1,loss,1\nr,-1,loss,1\n", 3, "step", "non-negative integer, got '-1'"),
    ("r,x,loss,1\n", 2, "step", "non-negative integer, got 'x'"),
    ("r,,loss,1\n", 2, "step", "empty step"),
    ("r,99999999999999999999,loss,1\n", 2, "step", "too large"),
    ("r,1,loss,1\nr,2,loss,abc\n", 3, "value", "not a number: 'abc'"),
    ("r,1,loss,\n", 2, "value", "empty value"),
    ("r,1,loss,1_0\n", 2, "value", "not a number"),
    ("r,1,,1\n", 2, "metric", "empty metric"),
    (",1,loss,1\n", 2, "run", "empty run"),
    ("r,1,loss,1\nr,2,loss\n", 3, None, "wrong number of fields: expected 4, got 3"),
    ("r,1,loss,1\nr,2,loss,1,9\n", 3, None, "wrong number of fields: expected 4, got 5"),
    ("r,1,loss,1\n\n\nr,2,loss,oops\n", 5, "value", "not a number"),
    ('r,1,"loss\nx",1\nr,2,loss,nope\n', 4, "value", "not a number"),
    ('r,1,"loss,1\n', 2, None, "bad CSV"),
]


@pytest.mark.parametrize(("body", "line", "column", "words"), CSV_ERRORS)
def test_csv_errors_name_the_exact_line(tmp_path, body, line, column, words):
    err = _error(_write(tmp_path, "bad.csv", HEADER + body))
    assert err.line == line
    assert err.column == column
    assert err.field == column
    assert words in err.message
    assert str(err).startswith(f"{tmp_path / 'bad.csv'}:{line}: ")


def test_csv_error_deep_in_a_large_file_has_the_exact_line(tmp_path):
    rows = [f"r,{i},loss,{i}.5\n" for i in range(250_000)]
    rows[199_999] = "r,199999,loss,\n"
    path = _write(tmp_path, "big.csv", HEADER + "".join(rows))
    err = _error(path, chunk_rows=30_000)
    assert (err.line, err.column) == (200_001, "value")


def test_optional_column_errors(tmp_path):
    text = "run,step,metric,value,rank,gpu,time\nr,1,loss,1,,,\nr,2,loss,1,-3,,\n"
    err = _error(_write(tmp_path, "a.csv", text))
    assert (err.line, err.column) == (3, "rank")
    text = "run,step,metric,value,rank,gpu,time\nr,1,loss,1,0,GPU-abc,\n"
    err = _error(_write(tmp_path, "b.csv", text))
    assert (err.line, err.column) == (2, "gpu")
    text = "run,step,metric,value,time\nr,1,loss,1,yesterday\n"
    err = _error(_write(tmp_path, "c.csv", text))
    assert (err.line, err.column) == (2, "time")


def test_short_row_is_an_error_even_when_only_optional_fields_are_missing(tmp_path):
    text = "run,step,metric,value,time,host\nr,1,loss,1,5,h,extra\nr,2,loss,1,5\n"
    err = _error(_write(tmp_path, "a.csv", text))
    assert err.line == 2
    assert "wrong number of fields: expected 6, got 7" in err.message


def test_header_errors(tmp_path):
    err = _error(_write(tmp_path, "a.csv", "run,step,value\nr,1,1\n"))
    assert (err.line, err.column) == (1, "metric")
    assert "required column 'metric'" in err.message
    err = _error(_write(tmp_path, "b.csv", "run,step,metric,value,step\n"))
    assert (err.line, err.column) == (1, "step")
    assert "duplicate" in err.message
    err = _error(_write(tmp_path, "c.csv", ""))
    assert err.line == 1 and "empty file" in err.message


def test_invalid_utf8_is_reported_on_its_line(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes(b"run,step,metric,value\nr,1,loss,1\nr\xff,2,loss,1\n")
    err = _error(path)
    assert err.line == 3 and "UTF-8" in err.message


JSONL_ERRORS = [
    ('{"run":"r","step":1,"metric":"m","value":1}\n{"run":"r"\n', 2, None, "bad JSON"),
    ("[1,2]\n", 1, None, "not an object (got list)"),
    ('{"run":"r","step":1,"metric":"m"}\n', 1, "value", "missing required key 'value'"),
    ('{"run":"r","step":1.5,"metric":"m","value":1}\n', 1, "step", "non-negative integer"),
    ('{"run":"r","step":-2,"metric":"m","value":1}\n', 1, "step", "non-negative integer"),
    ('{"run":"r","step":true,"metric":"m","value":1}\n', 1, "step", "non-negative integer"),
    ('{"run":"r","step":1,"metric":"m","value":"high"}\n', 1, "value", "not a number"),
    ('{"run":"r","step":1,"metric":"m","value":null}\n', 1, "value", "null"),
    ('{"run":"r","step":1,"metric":"m","value":""}\n', 1, "value", "empty value"),
    ('{"run":"r","step":1,"metric":"","value":1}\n', 1, "metric", "empty metric"),
    ('{"run":7,"step":1,"metric":"m","value":1}\n', 1, "run", "must be a string"),
    ('{"run":"r","step":1,"metric":"m","value":1,"host":3}\n', 1, "host", "must be a string"),
    ('\n\n{"run":"r","step":1,"metric":"m","value":1,"rank":-1}\n', 3, "rank", "non-negative"),
]


@pytest.mark.parametrize(("text", "line", "column", "words"), JSONL_ERRORS)
def test_jsonl_errors_name_the_exact_line(tmp_path, text, line, column, words):
    err = _error(_write(tmp_path, "bad.jsonl", text))
    assert (err.line, err.column) == (line, column)
    assert words in err.message


def test_unknown_format(tmp_path):
    path = _write(tmp_path, "a.parquet", "x")
    with pytest.raises(LongFormatError, match="unknown format") as info:
        read_long_format(path)
    assert info.value.line is None
    with pytest.raises(LongFormatError, match="unknown format 'xml'"):
        detect_format("a.csv", fmt="xml")


def test_corrupt_gzip_is_a_long_format_error(tmp_path):
    path = tmp_path / "a.csv.gz"
    path.write_bytes(gzip.compress(b"run,step,metric,value\nr,1,loss,1\n" * 100)[:40])
    with pytest.raises(LongFormatError, match="gzip"):
        _read_all(path)


def test_missing_file_fails_at_construction(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_long_format(tmp_path / "nope.csv")


def test_error_is_a_value_error_and_pickles():
    err = LongFormatError("a.csv", 3, "bad", "step")
    assert isinstance(err, ValueError)
    back = pickle.loads(pickle.dumps(err))
    assert (back.path, back.line, back.message, back.column) == ("a.csv", 3, "bad", "step")


# ----------------------------------------------------------------------------- writing


def test_writer_jsonl_omits_absent_fields_and_keeps_json_standard():
    frame = pd.DataFrame(
        {"run": ["r", "r"], "step": [1, 2], "metric": ["loss"] * 2, "value": [np.nan, 1.0]}
    )
    out = io.StringIO()
    assert write_long_format([frame], out, fmt="jsonl") == 2
    lines = out.getvalue().splitlines()
    assert json.loads(lines[0]) == {"run": "r", "step": 1, "metric": "loss", "value": "nan"}
    assert json.loads(lines[1]) == {"run": "r", "step": 2, "metric": "loss", "value": 1.0}


def test_writer_refuses_a_frame_without_required_columns():
    with pytest.raises(ValueError, match="'value'"):
        write_long_format(
            [pd.DataFrame({"run": ["r"], "step": [1], "metric": ["m"]})], io.StringIO()
        )


_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=12,
)
# A metric name needs a word (a letter or digit): one of only separators is refused.
_metric = _text.filter(lambda t: any(c.isalnum() for c in t))
_floats = st.floats(allow_nan=True, allow_infinity=True)
_row = st.fixed_dictionaries(
    {
        "run": _text,
        "step": st.integers(0, 2**63 - 1),
        "metric": _metric,
        "value": _floats,
        "time": st.one_of(st.just(math.nan), st.floats(allow_nan=False, allow_infinity=False)),
        "rank": st.one_of(st.none(), st.integers(0, 2**31)),
        "host": st.one_of(st.none(), _text),
        "gpu": st.one_of(st.none(), st.integers(0, 255)),
    }
)


def _frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "run": pd.Series([r["run"] for r in rows], dtype=object),
            "step": np.array([r["step"] for r in rows], dtype=np.int64),
            "metric": pd.Series([r["metric"] for r in rows], dtype=object),
            "value": np.array([r["value"] for r in rows], dtype=np.float64),
            "time": np.array([r["time"] for r in rows], dtype=np.float64),
            "rank": pd.array([r["rank"] for r in rows], dtype="Int64"),
            "host": pd.Series([r["host"] for r in rows], dtype=object),
            "gpu": pd.array([r["gpu"] for r in rows], dtype="Int64"),
        }
    )


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(_row, min_size=1, max_size=20), fmt=st.sampled_from(["csv", "jsonl"]))
def test_write_then_read_round_trips_exactly(tmp_path_factory, rows, fmt):
    frame = _frame(rows)
    out = io.StringIO()
    write_long_format([frame.iloc[:3], frame.iloc[3:]], out, fmt=fmt)
    path = tmp_path_factory.mktemp("rt") / f"x.{fmt}"
    path.write_text(out.getvalue(), encoding="utf-8", newline="")
    back = _read_all(path, chunk_rows=7)
    pd.testing.assert_frame_equal(back, frame, check_exact=True)
    # signs of zero and infinities survive too (a NaN's sign bit carries no meaning)
    real = ~np.isnan(frame["value"].to_numpy())
    assert np.array_equal(np.signbit(back["value"])[real], np.signbit(frame["value"])[real])


# ----------------------------------------------------------------------------- real files


def _real_files() -> list[Path]:
    return sorted(REAL_RUNS.glob("*.csv")) if REAL_RUNS.is_dir() else []


@pytest.mark.skipif(not _real_files(), reason="shared/data/real_runs is not present")
@pytest.mark.parametrize("path", _real_files(), ids=lambda p: p.name)
def test_real_runs_read_completely(path):
    df = _read_all(path)
    with open(path, encoding="utf-8") as fh:
        data_lines = sum(1 for line in fh if line.strip()) - 1
    assert len(df) == data_lines
    assert (df["run"] == path.stem).all()
    assert (df["step"] >= 0).all()
    # the same numbers as a plain pandas read
    plain = pd.read_csv(path)
    assert np.array_equal(df["value"].to_numpy(), plain["value"].to_numpy(), equal_nan=True)
    assert df["step"].tolist() == plain["step"].tolist()


@pytest.mark.skipif(not _real_files(), reason="shared/data/real_runs is not present")
def test_real_run_round_trips_through_jsonl_gz(tmp_path):
    src = REAL_RUNS / "mng_llmc_gpt2_124m.csv"
    frame = _read_all(src)
    out = io.StringIO()
    write_long_format([frame], out, fmt="jsonl")
    path = tmp_path / "x.jsonl.gz"
    path.write_bytes(gzip.compress(out.getvalue().encode()))
    pd.testing.assert_frame_equal(_read_all(path), frame, check_exact=True)


def test_writer_quotes_carriage_returns_commas_and_quotes(tmp_path):
    frame = pd.DataFrame(
        {
            "run": ["a\rb", "plain"],
            "step": [1, 2],
            "metric": ['m,"x"', "loss"],
            "value": [1.0, 2.0],
            "host": ["h\nz", None],
        }
    )
    out = io.StringIO()
    write_long_format([frame], out)
    path = tmp_path / "q.csv"
    path.write_text(out.getvalue(), encoding="utf-8", newline="")
    back = _read_all(path)
    assert back["run"].tolist() == ["a\rb", "plain"]
    assert back["metric"].tolist() == ['m,"x"', "loss"]
    assert back["host"].tolist() == ["h\nz", None]


def test_crlf_file_without_final_newline_takes_the_fast_path(tmp_path, monkeypatch):
    from runwatch.collectors import longformat

    def no_slow_path(*args):
        raise AssertionError("clean CSV should not need the row-by-row parser")

    monkeypatch.setattr(longformat, "_slow_csv_chunk", no_slow_path)
    text = "run,step,metric,value,time\r\nr,1,loss,nan,1.5\r\nr,2,loss,-inf,nan\r\nr,3,loss,4,"
    df = _read_all(_write(tmp_path, "a.csv", text))
    assert df["step"].tolist() == [1, 2, 3]
    assert df["value"].tolist()[1:] == [-math.inf, 4.0] and math.isnan(df["value"].iloc[0])
    assert df["time"].iloc[0] == 1.5 and df["time"].iloc[1:].isna().all()
