"""The CPU training families' generator: a deterministic corpus, and LRs runwatch would plan."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from runwatch.expect.planned import check_schedule, planned_lr

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "data" / "make_families.py"
_spec = importlib.util.spec_from_file_location("make_families", SCRIPT)
mf = importlib.util.module_from_spec(_spec)
sys.modules["make_families"] = mf  # its dataclass looks its module up
_spec.loader.exec_module(mf)


def test_corpus_is_the_same_for_the_same_seed_and_differs_for_another():
    first = mf.make_chains(4, 300, seed=1)
    assert np.array_equal(first, mf.make_chains(4, 300, seed=1))
    assert not np.array_equal(first, mf.make_chains(4, 300, seed=2))
    assert first.min() >= 0 and first.max() < mf.VOCAB


def test_corpus_follows_its_sparse_tables():
    # every next token must be one the generating mixture gives a non-zero probability to
    chains = mf.make_chains(8, 400, seed=5)
    floor = mf.true_cross_entropy(chains)
    assert np.isfinite(floor) and 0 < floor < np.log(mf.VOCAB)


@pytest.mark.parametrize(
    ("name", "total"), [("cosine", 2000), ("cosine", 4000), ("constant", 4000), ("wsd", 4000)]
)
def test_logged_lr_share_is_runwatchs_planned_lr(name, total):
    schedule = mf.schedule_for(name, total)
    check_schedule(schedule, total)  # runwatch can read the config as written
    steps, share = planned_lr(schedule, total)
    ours = np.array([mf.lr_share(schedule, total, int(s)) for s in steps])
    np.testing.assert_allclose(ours, share, rtol=1e-12, atol=0)


def test_wsd_decays_from_step_3200_and_names_say_so():
    schedule = mf.schedule_for("wsd", 4000)
    assert (schedule["decay_start"], schedule["decay_shape"]) == (3200, "linear")
    assert mf.run_name(64, schedule, 4000, 0) == "cpu_w64_wsd_3200_4000"
    assert mf.run_name(192, mf.schedule_for("cosine", 2000), 2000, 0) == "cpu_w192_cosine_2000"


def test_committed_families_have_a_config_and_a_csv_per_run():
    index_path = mf.OUT / "runs.json"
    if not index_path.exists():
        pytest.skip("bench/data/cpu_families not generated")
    index = json.loads(index_path.read_text())
    for name, config in index.items():
        assert (mf.OUT / f"{name}.csv.gz").exists(), name
        check_schedule(config["schedule"], config["total_steps"])
        assert config["tokens_per_step"] == mf.BATCH * mf.CONTEXT


def test_code_corpus_is_the_files_bytes_in_rows_with_one_nul_between(tmp_path):
    (tmp_path / "b.py").write_bytes(b"y = 2\n")
    (tmp_path / "a.py").write_bytes("x = 'é'\n".encode())
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "c.py").write_bytes(b"left out\n")
    files = mf.stdlib_sources(tmp_path)
    assert [p.name for p in files] == ["a.py", "b.py"]
    blobs = [p.read_bytes() for p in files]
    stream = b"\0".join(blobs)
    assert mf.text_rows(blobs).shape == (0, mf.CODE_ROW)  # shorter than a row: none
    flat = mf.text_rows(blobs, row=4).ravel()
    assert flat.size == len(stream) // 4 * 4
    assert flat.max() == mf.CODE_VOCAB - 1  # the two bytes of "é" share the top token
    assert bytes(flat[:5].astype("uint8")) == b"x = '"


def test_c_corpus_is_the_headers_without_the_cpp_trees(tmp_path):
    for rel in ("stdio.h", "linux/types.h", "c++/12/vector.h", "llvm-14/ir.h", "node/v8.h"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"int x;\n")
    (tmp_path / "notes.txt").write_bytes(b"not a header\n")
    files = mf.c_headers(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in files] == ["linux/types.h", "stdio.h"]


@pytest.mark.parametrize(
    "out, prefix",
    [(mf.CODE_OUT, "code_"), (mf.MAN_OUT, "man_"), (mf.PERL_OUT, "perl_"), (mf.C_OUT, "c_")],
)
def test_committed_text_family_has_a_config_and_a_csv_per_run(out, prefix):
    index_path = out / "runs.json"
    if not index_path.exists():
        pytest.skip(f"{out} not generated")
    index = json.loads(index_path.read_text())
    assert len({c["params"] for n, c in index.items() if n.endswith("cosine_2000")}) >= 5
    for name, config in index.items():
        assert name.startswith(prefix) and (out / f"{name}.csv.gz").exists(), name
        check_schedule(config["schedule"], config["total_steps"])
        assert config["tokens_per_step"] == mf.CODE_BATCH * mf.CODE_CONTEXT
