"""Live detection finds the episodes replay finds: on every real run and on the bench's
injected faults, the Monitor fed as the live thread feeds it (``update_batch`` on batches
of random sizes, in the order the writer delivers them) ends with exactly the episodes of
``analyze_frame`` over the whole run."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from runwatch.detect import Monitor
from runwatch.detect.replay import analyze_frame, replay_input

from ..detect.conftest import bench_module, real_run, real_run_names


def episodes(anomalies) -> list[str]:
    """Episodes as comparable strings, in a fixed order (NaN compares equal this way)."""
    return sorted(
        json.dumps({**a.to_json_dict("r"), "details": a.details}, default=str, sort_keys=True)
        for a in anomalies
    )


def live(df: pd.DataFrame, seed: int) -> list[str]:
    """The episodes a live run finds: rows in replay order, cut into random batches."""
    rows = replay_input(df)
    mon = Monitor()
    rng = np.random.default_rng(seed)
    n = len(rows)
    cuts = np.unique(np.r_[0, np.cumsum(rng.integers(1, 5000, n // 1000 + 2)), n])
    for a, b in itertools.pairwise(cuts[cuts <= n]):
        part = slice(a, b)
        labels = {k: v[part] for k, v in rows.labels.items()}
        found = mon.update_batch(rows.metric[part], labels, rows.steps[part], rows.values[part])
        assert found is not None, f"rows {a}-{b} could not be fed as a batch"
    mon.finish()
    return episodes(mon.anomalies)


@pytest.mark.parametrize("run", real_run_names() or ["(no data)"])
def test_live_episodes_equal_replay_on_every_real_run(run):
    df = real_run(run)
    assert live(df, seed=len(run)) == episodes(analyze_frame(df))


def test_live_episodes_equal_replay_on_the_bench_injected_faults():
    bench = bench_module("detection")
    # Without shared/ beside the checkout, real_run skips, as for the test above.
    runs = {name: real_run(name) for name in real_run_names()[:6] or ["(no data)"]}
    faults = bench.make_faults(runs, np.random.default_rng(0), quick=True)
    assert faults
    found = 0
    for k, fault in enumerate(faults):
        df = pd.DataFrame({"metric": fault.metric, "step": fault.steps, "value": fault.values})
        got, want = live(df, seed=k), episodes(analyze_frame(df))
        assert got == want, f"{fault.run} {fault.metric} {fault.kind} {fault.size}"
        found += len(want)
    assert found > 0  # faults are found, so the equality checks real episodes
