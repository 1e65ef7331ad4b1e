"""``Monitor.update_batch`` (live detection's path) equals ``Monitor.update`` row by row,
batch after batch, on a Monitor that already holds state: episodes open across batches, the
LR clock, precursor links, and the episodes each batch reports as changed."""

from __future__ import annotations

import itertools
import math
import pickle

import numpy as np
import pandas as pd
import pytest

from runwatch.detect import Monitor
from runwatch.model import LABEL_KEYS

from .conftest import canon, loss_curve, real_run


def scenario() -> pd.DataFrame:
    """Loss, grad norm, LR and per-rank step time with faults, in replay order."""
    n = 6000
    rng = np.random.default_rng(7)
    s = np.arange(n)
    loss = loss_curve(n, seed=3)
    loss[1500:1530] *= 1.8
    loss[[2000, 2001, 2040]] = [math.nan, math.inf, math.nan]  # one episode, over a cut
    loss[4200:] *= np.exp(0.003 * np.arange(n - 4200))
    gn = 0.3 * np.exp(0.05 * rng.standard_normal(n))
    gn[1497:1500] *= 30
    lr = np.minimum((s + 1) / 300, 1.0) * 3e-4 * (0.55 + 0.45 * np.cos(np.pi * s / n))
    frames = [
        pd.DataFrame({"metric": "grad_norm", "step": s, "value": gn}),
        pd.DataFrame({"metric": "loss", "step": s, "value": loss}),
        pd.DataFrame({"metric": "lr", "step": s[::2], "value": lr[::2]}),
    ]
    for rank in range(2):
        st = np.exp(0.01 * rng.standard_normal(n)) * (1.3 if rank else 1.0)
        st[3000:] *= 1.2
        frames.append(pd.DataFrame({"metric": "step_time", "step": s, "value": st, "rank": rank}))
    df = pd.concat(frames, ignore_index=True)
    return df.iloc[np.argsort(df["step"].to_numpy(), kind="stable")].reset_index(drop=True)


def ordered(df: pd.DataFrame) -> pd.DataFrame:
    return df.iloc[np.argsort(df["step"].to_numpy(), kind="stable")].reset_index(drop=True)


def rows_of(df: pd.DataFrame):
    cols = [k for k in LABEL_KEYS if k in df.columns]
    metric = df["metric"].to_numpy(dtype=object)
    labels = {k: df[k].to_numpy(dtype=object) for k in cols}
    return metric, labels, df["step"].to_numpy(np.int64), df["value"].to_numpy(float)


def state(m: Monitor) -> bytes:
    return pickle.dumps(
        [
            {k: v for k, v in vars(d).items() if k != "_clock"}
            for s in m._series.values()
            for d in s.detectors
        ]
    )


def _stream_chunk(m: Monitor, metric, labels, steps, values) -> list[str]:
    changed = {}
    for i in range(steps.size):
        lab = {k: v[i] for k, v in labels.items() if not pd.isna(v[i])}
        for a in m.update(metric[i], lab, int(steps[i]), float(values[i])):
            changed[id(a)] = a
    return sorted(canon(changed.values()))


@pytest.mark.parametrize(
    "name", ["scenario", "mng_llmc_gpt2_124m", "mlm_mixtral_8x7b_h100", "mng_soap_6k"]
)
def test_update_batch_in_random_batches_equals_streaming(name):
    df = scenario() if name == "scenario" else ordered(real_run(name))
    metric, labels, steps, values = rows_of(df)
    rng = np.random.default_rng(5)
    cuts = np.r_[0, np.cumsum(rng.integers(1, 4000, steps.size // 500 + 2)), steps.size]
    # One-row batches around the scenario's faults: every episode is open over a cut.
    near = np.flatnonzero((steps >= 1490) & (steps <= 1540) | (steps >= 1995) & (steps <= 2050))
    cuts = np.unique(np.r_[cuts, near])
    cuts = cuts[cuts <= steps.size]
    fast, slow = Monitor(), Monitor()
    for a, b in itertools.pairwise(cuts):
        part = slice(a, b)
        got = fast.update_batch(
            metric[part], {k: v[part] for k, v in labels.items()}, steps[part], values[part]
        )
        assert got is not None
        want = _stream_chunk(slow, metric[part], labels and {k: v[part] for k, v in labels.items()},
                             steps[part], values[part])  # fmt: skip
        assert sorted(canon(got)) == want, f"batch {a}-{b}"
    assert state(fast) == state(slow)
    fast.finish()
    slow.finish()
    assert canon(fast.anomalies) == canon(slow.anomalies)
    assert fast.health == slow.health
    assert fast.lr_clock.last == slow.lr_clock.last


def test_a_batch_that_goes_back_is_refused_untouched():
    df = scenario()
    metric, labels, steps, values = rows_of(df)
    m = Monitor()
    first = slice(0, 20_000)
    assert m.update_batch(metric[first], {k: v[first] for k, v in labels.items()},
                      steps[first], values[first]) is not None  # fmt: skip
    before = (state(m), canon(m.anomalies), m.health)
    redo = slice(10_000, 12_000)  # steps already seen: a restart's redone steps
    assert m.update_batch(metric[redo], {k: v[redo] for k, v in labels.items()},
                      steps[redo], values[redo]) is None  # fmt: skip
    assert (state(m), canon(m.anomalies), m.health) == before


def test_points_after_a_restart_event_close_the_rewind_window_as_streaming_does():
    """After ``restart``, the first points that do not go back end the chance to rewind;
    a late point after that is out of order, in both paths."""
    from runwatch.model import Event

    df = scenario()
    metric, labels, steps, values = rows_of(df)
    fast, slow = Monitor(), Monitor()
    head, tail = slice(0, 10_000), slice(10_000, 12_000)
    for part in (head,):
        cols = {k: v[part] for k, v in labels.items()}
        fast.update_batch(metric[part], cols, steps[part], values[part])
        _stream_chunk(slow, metric[part], cols, steps[part], values[part])
    for m in (fast, slow):
        m.event(Event(kind="restart", step=int(steps[10_000]), time=0.0))
    cols = {k: v[tail] for k, v in labels.items()}
    assert fast.update_batch(metric[tail], cols, steps[tail], values[tail]) is not None
    _stream_chunk(slow, metric[tail], cols, steps[tail], values[tail])
    for m in (fast, slow):
        m.update("loss", {}, 5, 9.0)  # a late point, not a restart
    assert fast.health["out_of_order_points"] == slow.health["out_of_order_points"] == 1
    assert state(fast) == state(slow)
