"""Batched detector paths (``update_many``) give exactly what ``update`` gives, bit for bit."""

from __future__ import annotations

import itertools
import math
import pickle

import numpy as np
import pandas as pd
import pytest

from runwatch.detect import DETECTORS, Detector, Monitor, Spike, analyze_frame
from runwatch.detect.deviation import CurveDeviation
from runwatch.detect.spikescore import SpikeScore

from .conftest import canon, loss_curve, real_run, real_run_names


def curves() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Seeded curves with every kind of trouble a batched path must get right."""
    rng = np.random.default_rng(11)
    n = 6000
    s = np.arange(1, n + 1)
    loss = loss_curve(n, seed=4)
    loss[[700, 701, 2500, 4100]] *= [3.0, 2.0, 1.6, 8.0]  # spikes, one of two points
    loss[3000:3400] *= 1.15  # a level shift long enough to be adapted to
    loss[1200] = math.nan
    loss[5000:5003] = [math.inf, 0.0, -1.0]  # non-finite, then log space ends
    gn = np.exp(0.3 * rng.standard_normal(n)) * np.round(1.0 + 0.1 * np.sin(s / 50), 2)
    gn[rng.integers(0, n, 40)] *= 30.0  # heavy tail
    st = np.exp(0.01 * rng.standard_normal(n))
    st[::97] *= 3.0  # isolated slow steps
    st[4000:] *= 1.2  # a lasting regression
    lr = np.minimum(1.0, s / 300) * 3e-4 * np.cos(np.minimum(s / n, 1.0) * 1.5)
    lr[2000:2020] *= 3.0
    lr[5500:] = 0.0
    quantised = np.round(loss, 2)  # zero differences: the scale falls back
    return {
        "loss": (s, loss),
        "grad_norm": (s, gn),
        "step_time": (s, st),
        "lr": (s, lr),
        "quantised": (s, quantised),
        "rl_loss": (s, 0.05 * rng.standard_normal(n)),  # around zero: linear space
    }


def _variants(cls: type[Detector]) -> list[Detector]:
    if cls is Spike:
        return [Spike(), Spike(threshold=6.0, sustain=50, window=32, center_window=7)]
    return [cls()]


@pytest.mark.parametrize("cls", DETECTORS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("curve", list(curves()))
def test_update_many_equals_update_point_by_point(cls, curve):
    s, v = curves()[curve]
    rng = np.random.default_rng(len(curve))
    steps, values = s.tolist(), v.tolist()
    for one in _variants(cls):
        many = pickle.loads(pickle.dumps(one))
        want = [(i, repr(sig)) for i, x in enumerate(zip(steps, values, strict=True))
                if (sig := one.update(*x)) is not None]  # fmt: skip
        got = []
        cuts = [0, *sorted(rng.integers(0, len(steps), 4).tolist()), len(steps)]
        for a, b in itertools.pairwise(cuts):
            got += [(a + i, repr(sig)) for i, sig in many.update_many(steps[a:b], values[a:b])]
        assert got == want
        # Same state afterwards: pickles are bit-exact for floats.
        assert pickle.dumps(many.__dict__) == pickle.dumps(one.__dict__)


@pytest.mark.parametrize("window", [2, 7, 1000])
def test_spike_score_update_many_equals_update(window):
    rng = np.random.default_rng(window)
    vals = (5.0 + rng.standard_normal(3000)).tolist()
    vals[100] = vals[2000] = 500.0
    one, many = SpikeScore(window, 3.0), SpikeScore(window, 3.0)
    flags = [one.update(x) for x in vals]
    got = many.update_many(vals[:1]) + many.update_many(vals[1:1234])
    got += many.update_many(vals[1234:])
    assert got == sum(flags) and got > 0
    assert many.__dict__ == one.__dict__


def test_a_detector_error_counts_the_same_in_batch_and_streaming(monkeypatch):
    # CurveDeviation batches through the default loop, which calls update on every point.
    assert CurveDeviation.update_many is Detector.update_many
    real = CurveDeviation.update

    def flaky(self, step, value):
        if step % 500 == 7:
            raise RuntimeError("detector bug")
        return real(self, step, value)

    monkeypatch.setattr(CurveDeviation, "update", flaky)
    df = pd.DataFrame({"metric": "loss", "step": np.arange(3000), "value": loss_curve(3000)})
    fast, slow = Monitor(), Monitor()
    a = analyze_frame(df, monitor=fast)
    b = analyze_frame(df, monitor=slow, fast=False)
    assert canon(a) == canon(b)
    assert fast.health == slow.health
    assert fast.health["detector_errors"] == 6


@pytest.mark.parametrize("run", real_run_names() or ["(no data)"])
def test_batch_replay_equals_streaming_on_every_real_run(run):
    df = real_run(run)
    fast, slow = Monitor(), Monitor()
    a = analyze_frame(df, monitor=fast)
    b = analyze_frame(df, monitor=slow, fast=False)
    assert canon(a) == canon(b)
    assert fast.health == slow.health
