"""The anomalies found on every real run are pinned: a faster path must not change them.

``golden_real_runs.json`` holds, per real run in ``shared/data/real_runs``, the anomalies
of ``analyze_frame`` (their ``to_json_dict`` plus ``is_open`` and ``details``). Regenerate
it only for a deliberate change of behaviour, with
``python tests/detect/test_golden_real.py --write``, and say so in the change.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest

from runwatch.detect import analyze_frame

GOLDEN = Path(__file__).with_name("golden_real_runs.json")
REAL_RUNS = Path(__file__).resolve().parents[2].parent / "shared/data/real_runs"


def _dump(run: str, fast: bool = True) -> list[dict]:
    df = pd.read_csv(REAL_RUNS / f"{run}.csv")
    out = []
    for a in analyze_frame(df, fast=fast):
        d = a.to_json_dict(run)
        d["is_open"] = a.is_open
        d["details"] = a.details
        out.append(d)
    # Through JSON, so NaN and tuples compare as the stored file does.
    return json.loads(json.dumps(out, sort_keys=True))


def _golden() -> dict:
    return json.loads(GOLDEN.read_text())


RUNS = sorted(p.stem for p in REAL_RUNS.glob("*.csv")) if REAL_RUNS.is_dir() else []


def _same(a, b) -> bool:
    """Equal anomalies: the same keys, strings, steps and severities exactly, floats to
    1e-9 relative. The last bits of a float follow the numpy/scipy build (their SIMD
    loops round differently from release to release), which is not behaviour; an alarm
    that appears, goes or moves is. NaN equals NaN here, as in the stored file."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
            return False
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("run", RUNS or ["(no data)"])
def test_anomalies_on_real_runs_match_the_golden_file(run):
    if run == "(no data)":
        pytest.skip("real training curves not found beside the repo (shared/data/real_runs)")
    golden = _golden()
    assert run in golden, f"{run} missing from {GOLDEN.name}: regenerate it"
    got = _dump(run)
    want = golden[run]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert _same(g, w), (g, w)


@pytest.mark.parametrize("run", ["mng_llmc_gpt2_124m", "dschat_rlhf_opt1.3b"])
def test_streaming_path_matches_the_golden_file_too(run):
    if not (REAL_RUNS / f"{run}.csv").is_file():
        pytest.skip("real training curves not found beside the repo (shared/data/real_runs)")
    assert _same(_dump(run, fast=False), _golden()[run])


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    if sys.argv[1:] == ["--write"]:
        GOLDEN.write_text(json.dumps({r: _dump(r) for r in RUNS}, sort_keys=True, indent=0))
        print(f"wrote {GOLDEN}")
