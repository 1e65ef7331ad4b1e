"""The compiled batch kernels against ``update``, on random curves and random parameters.

``update`` is the one definition of what a detector does; ``update_many`` runs the points
it does not flag in a compiled kernel (``runwatch/detect/_*_kernel.pyx``). The seeded
curves of ``test_batch.py`` pin the common paths; here every default detector meets
random parameter sets (small windows, short patience, quick adaptation) and curves with
the awkward values a kernel must treat as ``update`` does: NaN and Inf, zeros, negative
and signed-zero values, rounded values (ties and zero differences), huge and tiny values,
level shifts, plateaus and rises. Signals and pickled state must be equal bit for bit,
whatever the cuts between ``update_many`` calls.
"""

from __future__ import annotations

import itertools
import math
import pickle

import numpy as np
import pytest

from runwatch.detect.deviation import CurveDeviation
from runwatch.detect.divergence import Divergence
from runwatch.detect.lr import LRSanity
from runwatch.detect.regression import Regression
from runwatch.detect.spike import Spike
from runwatch.detect.stall import Stall


def _curve(rng: np.random.Generator, n: int) -> list[float]:
    """A noisy falling (or rising, or flat) curve with trouble spliced in."""
    s = np.arange(1, n + 1, dtype=float)
    kind = rng.integers(0, 4)
    base = [
        2.0 + 5.0 * s ** -rng.uniform(0.1, 0.8),  # a loss
        1.0 + 1e-4 * s,  # a slow rise
        np.full(n, rng.uniform(0.1, 5.0)),  # flat (a step time)
        rng.standard_normal(n) * 0.1,  # around zero (an RL loss, a signed series)
    ][kind]
    y = base * np.exp(rng.uniform(0.001, 0.05) * rng.standard_normal(n))
    for _ in range(rng.integers(0, 6)):  # spikes and dips
        y[rng.integers(0, n)] *= rng.choice([0.2, 1.5, 3.0, 30.0])
    if rng.random() < 0.4:  # a level shift or a plateau
        at = int(rng.integers(n // 4, n))
        y[at:] = y[at:] * rng.uniform(1.02, 1.3) if rng.random() < 0.5 else y[at]
    if rng.random() < 0.3:
        y = np.round(y, int(rng.integers(1, 3)))  # quantised: ties, zero differences
    odd = [math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, 1e300, 1e-300]
    for _ in range(rng.integers(0, 5)):
        y[rng.integers(0, n)] = odd[rng.integers(0, len(odd))]
    return y.tolist()


def _params(cls: type, rng: np.random.Generator) -> dict:
    r = rng.integers
    if cls is Spike:
        window = int(r(4, 80))
        center = int(r(1, window + 1))
        threshold = float(rng.uniform(1.0, 8.0))
        return {
            "threshold": threshold,
            "continue_threshold": float(rng.uniform(0.1, threshold)),
            "window": window,
            "center_window": center,
            "min_points": int(r(center, window + 1)),
            "sustain": int(r(1, 8)),
            "adapt_after": int(r(1, 300)),
            "space": str(rng.choice(["auto", "log", "linear"])),
        }
    if cls is Stall:
        return {
            "min_window": int(r(5, 60)),
            "max_window": int(r(60, 400)),
            "patience": int(r(1, 30)),
            "min_points": int(r(50, 600)),
            "per_octave": int(r(2, 12)),
            "adapt_after": int(r(1, 400)),
            "long_min_points": int(r(50, 600)),
            "long_test": bool(r(0, 2)),
        }
    if cls is CurveDeviation:
        return {
            "span": int(r(2, 60)),
            "patience": int(r(1, 30)),
            "min_points": int(r(50, 600)),
            "stall_window": int(r(20, 300)),
            "adapt_after": int(r(1, 400)),
            "refit_growth": float(rng.uniform(1.1, 2.0)),
        }
    if cls is Divergence:
        return {
            "span": int(r(2, 40)),
            "patience": int(r(1, 10)),
            "warmup": int(r(10, 200)),
            "block": int(r(8, 300)),
            "ref_blocks": int(r(2, 20)),
            "adapt_after": int(r(1, 300)),
            "space": str(rng.choice(["auto", "log", "linear"])),
        }
    if cls is Regression:
        return {
            "higher_is_better": bool(r(0, 2)),
            "window": int(r(8, 160)),
            "recent": int(r(1, 12)),
            "persist": int(r(1, 8)),
            "min_points": int(r(8, 60)),
            "adapt_after": int(r(1, 300)),
        }
    return {"slope_points": int(r(2, 12)), "adapt_after": int(r(1, 80))}  # LRSanity


@pytest.mark.parametrize("cls", [Spike, Stall, CurveDeviation, Divergence, Regression, LRSanity])
def test_kernels_equal_update_on_random_curves_and_parameters(cls):
    rng = np.random.default_rng(sum(map(ord, cls.__name__)))
    compared = 0
    for _ in range(25):
        try:
            one = cls(**_params(cls, rng))
        except ValueError:
            continue  # a random combination the constructor refuses (e.g. min > max)
        n = int(rng.integers(300, 3000))
        values = _curve(rng, n)
        first = int(rng.integers(0, 5))
        steps = list(range(first, first + 3 * n, 3))
        many = pickle.loads(pickle.dumps(one))
        want = []
        for i, (st, v) in enumerate(zip(steps, values, strict=True)):
            try:
                sig = one.update(st, v)
            except (OverflowError, ZeroDivisionError, ValueError):
                want.append((i, "error"))  # the Monitor's guard counts it; so must batch
                continue
            if sig is not None:
                want.append((i, repr(sig)))
        got = []
        cuts = [0, *sorted(rng.integers(0, n, 3).tolist()), n]
        for a, b in itertools.pairwise(cuts):
            errors: list[int] = []
            sigs = many.update_many(steps[a:b], values[a:b], on_error=errors.append)
            found = [(a + i, repr(s)) for i, s in sigs]
            found += [(a + i, "error") for i in errors]
            got += sorted(found)
        assert got == want
        assert pickle.dumps(many.__dict__) == pickle.dumps(one.__dict__)
        compared += len(want)
    assert compared > 20  # the curves did make the detectors speak


@pytest.mark.parametrize("cls", [Spike, Stall, CurveDeviation, Divergence, Regression, LRSanity])
@pytest.mark.parametrize("inputs", ["float steps", "int values", "numpy scalars"])
def test_inputs_a_replay_never_gives_go_through_update_alike(cls, inputs):
    """The kernels take int steps and float values (what replay and live detection give);
    anything else must still come out exactly as ``update`` point by point makes it."""
    rng = np.random.default_rng(3)
    n = 2000
    curve = (2.0 + 5.0 * np.arange(1, n + 1) ** -0.3) * np.exp(0.02 * rng.standard_normal(n))
    curve[[500, 1500]] *= 3.0
    steps: list = list(range(n))
    values: list = curve.tolist()
    if inputs == "float steps":
        steps = [s + 0.5 for s in steps]
    elif inputs == "int values":
        values = [int(v * 1000) for v in values]
    else:
        steps, values = list(np.arange(n)), list(curve)
    one, many = cls(), cls()
    want = [(i, repr(sig)) for i, (st, v) in enumerate(zip(steps, values, strict=True))
            if (sig := one.update(st, v)) is not None]  # fmt: skip
    assert [(i, repr(sig)) for i, sig in many.update_many(steps, values)] == want
    assert pickle.dumps(many.__dict__) == pickle.dumps(one.__dict__)
