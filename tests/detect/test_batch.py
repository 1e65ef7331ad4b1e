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
from runwatch.detect.divergence import Divergence
from runwatch.detect.lr import LRSanity
from runwatch.detect.regression import Regression
from runwatch.detect.spikescore import SpikeScore
from runwatch.detect.stall import Stall

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
    assert pickle.dumps(many) == pickle.dumps(one)  # the same state


def test_a_detector_error_counts_the_same_in_batch_and_streaming(monkeypatch):
    # Through the default loop, which calls update on every point (LRSanity's own
    # update_many reaches update only at the points it could flag).
    monkeypatch.setattr(LRSanity, "update_many", Detector.update_many)
    real = LRSanity.update

    def flaky(self, step, value):
        if step % 500 == 7:
            raise RuntimeError("detector bug")
        return real(self, step, value)

    monkeypatch.setattr(LRSanity, "update", flaky)
    lr = np.minimum(1.0, np.arange(3000) / 300) * 3e-4
    df = pd.DataFrame({"metric": "lr", "step": np.arange(3000), "value": lr})
    fast, slow = Monitor(), Monitor()
    a = analyze_frame(df, monitor=fast)
    b = analyze_frame(df, monitor=slow, fast=False)
    assert canon(a) == canon(b)
    assert fast.health == slow.health
    assert fast.health["detector_errors"] == 6


def test_a_refit_error_in_the_batched_deviation_counts_as_in_streaming(monkeypatch):
    # A refit runs inside update (the batched path calls it there); after the error the
    # rest of the batch goes through the plain loop.
    real = CurveDeviation._refit
    calls = {"n": 0}

    def flaky(self, step):
        calls["n"] += 1
        if calls["n"] % 3 == 2:
            raise RuntimeError("detector bug")
        return real(self, step)

    monkeypatch.setattr(CurveDeviation, "_refit", flaky)
    v = loss_curve(9000, seed=2)
    v[6000:] = v[6000]  # a plateau, so there is something to flag
    df = pd.DataFrame({"metric": "loss", "step": np.arange(1, 9001), "value": v})
    fast, slow = Monitor(), Monitor()
    a = analyze_frame(df, monitor=fast)
    calls["n"] = 0
    b = analyze_frame(df, monitor=slow, fast=False)
    assert canon(a) == canon(b)
    assert fast.health == slow.health
    assert fast.health["detector_errors"] > 0


def trouble_curves() -> dict[str, tuple[list[int], list[float]]]:
    """Loss curves that make CurveDeviation, Stall and Divergence speak: plateaus (stall,
    above the band), a rise, an LR anneal (below the band), a huge step gap, NaN inside
    episodes, a loss that goes negative (log space ends)."""
    rng = np.random.default_rng(5)
    n = 12000
    s = np.arange(1, n + 1)
    base = 2.0 + 9.0 * (s + 50.0) ** -0.35
    noisy = base * np.exp(0.004 * rng.standard_normal(n))
    plateau = noisy.copy()
    plateau[5000:] = plateau[4999] * np.exp(0.004 * rng.standard_normal(n - 5000))
    plateau[8000:8100] = math.nan  # NaN in the middle of an episode
    anneal = noisy.copy()
    anneal[7000:] *= np.linspace(1.0, 0.8, n - 7000)
    rise = noisy.copy()
    rise[4000:] *= 1.0 + np.minimum(np.arange(n - 4000) / 3000, 0.2)
    jump = noisy.copy()
    jump[6000:8000] *= 1.1  # a step up and back down (a slower data path, say)
    jump[6000:8000:50] *= 3.0  # with isolated slow steps inside
    gap_s = s.copy()
    gap_s[6000:] = gap_s[6000:] * 5  # the steps jump: beyond twice the last learned one
    quiet_late = noisy.copy()
    quiet_late[::1000] = math.inf
    return {
        "plateau": (s.tolist(), plateau.tolist()),
        "anneal": (s.tolist(), anneal.tolist()),
        "rise": (s.tolist(), rise.tolist()),
        "jump": (s.tolist(), jump.tolist()),
        "gap": (gap_s.tolist(), noisy.tolist()),
        "inf": (s.tolist(), quiet_late.tolist()),
        "sign_change": (s.tolist(), (noisy - 3.0).tolist()),  # log space ends mid-run
        # Logged every 50 steps: the windows are thinned by the cadence.
        "sparse": ((s * 50).tolist()[:1200], plateau[::10].tolist()),
    }


def _split_run(det: Detector, steps, values, cuts, stream_every: int = 0):
    """Signals of ``det`` fed in batches cut at ``cuts``; with ``stream_every`` the first
    ``stream_every`` points after each cut go through ``update`` instead."""
    got = []
    for a, b in itertools.pairwise([0, *cuts, len(steps)]):
        k = min(b, a + stream_every)
        for i in range(a, k):
            if (sig := det.update(steps[i], values[i])) is not None:
                got.append((i, repr(sig)))
        got += [(k + i, repr(sig)) for i, sig in det.update_many(steps[k:b], values[k:b])]
    return got


def _point_by_point(det: Detector, steps, values):
    return [(i, repr(sig)) for i, x in enumerate(zip(steps, values, strict=True))
            if (sig := det.update(*x)) is not None]  # fmt: skip


SPEAKS = {
    CurveDeviation: {"plateau", "rise", "anneal", "sparse"},
    Stall: {"plateau", "rise", "gap"},
    Divergence: {"rise"},
    Regression: {"jump"},
}


@pytest.mark.parametrize("cls", list(SPEAKS), ids=lambda c: c.__name__)
@pytest.mark.parametrize("curve", list(trouble_curves()))
def test_batched_smoothers_equal_update_on_curves_that_flag(cls, curve):
    steps, values = trouble_curves()[curve]
    one = cls()
    want = _point_by_point(one, steps, values)
    if curve in SPEAKS[cls]:
        assert want, "the curve should make the detector speak"
    rng = np.random.default_rng(len(curve))
    for cuts, stream_every in (
        ([], 0),
        (sorted(rng.integers(0, len(steps), 7).tolist()), 0),
        (sorted(rng.integers(0, len(steps), 5).tolist()), 37),  # batches, then update
        (list(range(97, len(steps), 997)), 1),
    ):
        many = cls()
        assert _split_run(many, steps, values, cuts, stream_every) == want
        assert pickle.dumps(many.__dict__) == pickle.dumps(one.__dict__)


def test_batched_deviation_splits_at_every_refit_and_inside_episodes():
    steps, values = trouble_curves()["plateau"]
    one = CurveDeviation()
    want = _point_by_point(one, steps, values)
    # Refits happen at the 1000th, 1501st, 2252nd ... point; cut just before, at and after.
    fits, nxt = [], 1000
    while nxt < len(steps):
        fits.append(nxt)
        nxt = int(nxt * 1.5) + 1
    flagged = [i for i, _ in want]
    cuts = sorted({c for f in fits for c in (f - 2, f - 1, f)} | set(flagged[::25]))
    many = CurveDeviation()
    assert _split_run(many, steps, values, cuts) == want
    assert pickle.dumps(many.__dict__) == pickle.dumps(one.__dict__)


def test_batched_paths_fall_back_to_the_loop_for_unsorted_or_odd_inputs():
    steps, values = trouble_curves()["plateau"]
    steps = steps[:3000]
    values = values[:3000]
    steps[1500], steps[1501] = steps[1501], steps[1500]  # out of order
    for cls in (CurveDeviation, Stall, Divergence, Regression):
        one, many = cls(), cls()
        assert many.update_many(steps, values) == [
            (i, s) for i, x in enumerate(zip(steps, values, strict=True))
            if (s := one.update(*x)) is not None
        ]  # fmt: skip
        assert pickle.dumps(many.__dict__) == pickle.dumps(one.__dict__)
        one, many = cls(), cls()
        fsteps = [float(x) for x in sorted(steps)]
        want = _point_by_point(one, fsteps, values)
        assert [(i, repr(s)) for i, s in many.update_many(fsteps, values)] == want
        assert pickle.dumps(many.__dict__) == pickle.dumps(one.__dict__)


@pytest.mark.parametrize("cls", DETECTORS, ids=lambda c: c.__name__)
def test_update_many_rejects_steps_and_values_of_different_lengths(cls):
    with pytest.raises(ValueError, match="differ in length: 3 != 2"):
        cls().update_many([1, 2, 3], [0.5, 0.4])


@pytest.mark.parametrize("run", real_run_names() or ["(no data)"])
def test_batch_replay_equals_streaming_on_every_real_run(run):
    df = real_run(run)
    fast, slow = Monitor(), Monitor()
    a = analyze_frame(df, monitor=fast)
    b = analyze_frame(df, monitor=slow, fast=False)
    assert canon(a) == canon(b)
    assert fast.health == slow.health


def test_a_spike_across_hundreds_of_decades_is_reported_not_raised():
    """A loss of 1e-300 for a while, then 1e300: the log deviation is ~1380 and its ratio
    overflows a float; the spike still comes out (an infinite ratio), on both paths."""
    values = [1e-300 * (1.0 + 0.01 * (i % 7)) for i in range(100)] + [1e300, 1.0]
    steps = list(range(len(values)))
    one, many = Spike(), Spike()
    flagged = [(i, sig) for i, v in enumerate(values) if (sig := one.update(i, v)) is not None]
    assert [i for i, _ in flagged] == [100, 101]
    assert flagged[0][1].severity == "critical"
    assert math.isinf(flagged[0][1].details["peak_ratio"])
    assert [(i, repr(s)) for i, s in many.update_many(steps, values)] == [
        (i, repr(s)) for i, s in flagged
    ]
