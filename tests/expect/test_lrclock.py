"""The LR clock: Tissue et al.'s S1 and S2 as a run goes, equal to ``lr_areas``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runwatch.expect import LRClock, fit_area_law, lr_areas
from runwatch.expect._lrclock import momentum
from runwatch.expect.lrclock import areas_at


def schedule(n: int = 6000) -> np.ndarray:
    """Warmup, cosine decay to 10%, with a short LR bump in the middle."""
    s = np.arange(n)
    lr = np.minimum((s + 1) / 300, 1.0) * 3e-4 * (0.55 + 0.45 * np.cos(np.pi * s / n))
    lr[3000:3050] *= 2.0
    return lr


@pytest.mark.parametrize("every", [1, 7, 250])
def test_clock_equals_lr_areas_at_every_logged_step(every):
    lr = schedule()
    logged = np.arange(0, lr.size, every)
    clock = LRClock(keep=lr.size)
    peak = float(np.max(lr[logged]))
    s1, s2 = lr_areas(logged, lr[logged], int(logged[-1]))
    for st in logged.tolist():
        clock.add(st, float(lr[st]))
        got1, got2 = clock.areas(st)
        # lr_areas normalises by the peak LR; the clock keeps raw units.
        assert got1 / peak == pytest.approx(s1[st], rel=1e-9)
        assert got2 / peak == pytest.approx(s2[st], rel=1e-9, abs=1e-12)


def test_clock_holds_the_lr_flat_past_the_last_logged_step():
    clock = LRClock()
    clock.add(0, 1.0)
    clock.add(10, 0.5)  # a decrease: the annealing momentum is up
    s1, s2 = clock.areas(10)
    later1, later2 = clock.areas(110)
    assert later1 == pytest.approx(s1 + 0.5 * 100)
    assert later2 > s2  # the momentum keeps adding, decaying
    # ... and converges: the whole drop of 0.5, over 1 - λ, at most.
    assert clock.areas(10_000_000)[1] == pytest.approx(clock.areas(1_000_000)[1])
    assert clock.areas(10_000_000)[1] <= s2 + 0.5 / (1 - 0.999)


def test_warmup_adds_no_annealing_area():
    clock = LRClock()
    for st in range(500):
        clock.add(st, 1e-3 * (st + 1) / 500)
    assert clock.areas(499)[1] == 0.0
    assert clock.areas(499)[0] > 0.0


def test_rewind_gives_the_areas_of_the_redone_schedule():
    lr = schedule(2000)
    clock = LRClock()
    for st in range(1500):
        clock.add(st, float(lr[st]))
    clock.rewind(1200)  # restart from a checkpoint at step 1200
    redo = lr.copy()
    redo[1200:] *= 0.5  # the restart lowered the LR
    for st in range(1200, 2000):
        clock.add(st, float(redo[st]))
    fresh = LRClock()
    for st in range(2000):
        fresh.add(st, float(redo[st]))
    assert clock.areas(1999) == pytest.approx(fresh.areas(1999), rel=1e-12)


def test_areas_before_any_lr_are_unknown_and_repeats_are_ignored():
    clock = LRClock()
    assert clock.areas(5) is None and not clock
    clock.add(3, 2.0)
    clock.add(3, 9.0)  # a repeated step keeps the first LR
    assert clock.areas(3) == (8.0, 0.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_lr_is_refused_with_its_step(bad):
    with pytest.raises(ValueError, match="step 7"):
        LRClock().add(7, bad)


def test_area_law_recovers_a_noiseless_law_and_fits_without_an_anneal():
    lr = schedule(8000)
    s1, s2 = lr_areas(np.arange(lr.size), lr, lr.size - 1)
    idx = np.unique(np.geomspace(300, lr.size - 1, 120).astype(int))
    y = 2.0 + 3.0 * s1[idx] ** -0.4 - 0.002 * s2[idx]
    law = fit_area_law(s1[idx], s2[idx], y)
    assert law.predict_areas(s1[idx], s2[idx]) == pytest.approx(y, rel=1e-4)
    flat = fit_area_law(s1[idx], np.zeros(idx.size), 2.0 + 3.0 * s1[idx] ** -0.4)
    assert flat.C == 0.0
    assert flat.part(s1[-1], 5.0) == pytest.approx(3.0 * s1[-1] ** -0.4, rel=1e-3)


@pytest.mark.parametrize("seed", range(4))
def test_add_many_makes_the_states_add_makes_bit_for_bit(seed):
    """Batch replay feeds the LR through ``add_many``, live watching through ``add``: the
    same states (one compiled step behind both). Gaps of every size (one beyond the decay
    table, one past 64-bit ``k·(k+1)``), repeated steps, NaN and a warmup are in the
    series."""
    rng = np.random.default_rng(seed)
    steps = np.cumsum(rng.choice([0, 1, 1, 1, 5, 250], size=3000)) + int(rng.integers(-3, 3))
    steps[1500:] += 60_000  # a gap longer than MAX_GAP
    steps[2500:] += 4_000_000_000  # k·(k+1) beyond 64 bits: Python's integers do it
    lrs = schedule(3000) * rng.uniform(0.5, 1.5)
    lrs[rng.integers(0, 3000, 20)] = math.nan
    one = LRClock(keep=10_000)
    made = []
    for i, (st, lr) in enumerate(zip(steps.tolist(), lrs.tolist(), strict=True)):
        if math.isfinite(lr):
            before = one.last
            one.add(st, lr)
            if one.last is not before:
                made.append(i)
    many = LRClock(keep=1000)
    first = len(steps) // 3  # the batch continues a clock already fed
    for st, lr in zip(steps[:first].tolist(), lrs[:first].tolist(), strict=True):
        if math.isfinite(lr):
            many.add(st, lr)
    got_made, states = many.add_many(steps[first:], lrs[first:])
    want = list(one._states)
    assert [i + first for i in got_made.tolist()] == [i for i in made if i >= first]
    assert [(int(r[0]), *r[1:]) for r in states.tolist()] == want[-len(states) :]
    assert list(many._states) == want[-1000:]


def test_areas_at_answers_what_the_clock_answered_live():
    """Replay's ``areas_at`` gives each point the areas ``LRClock.areas`` gave it when it
    came, from the LR points of the rows before it (NaN before any LR)."""
    rng = np.random.default_rng(5)
    n = 2000
    steps = np.cumsum(rng.choice([0, 1, 1, 3, 400], size=n)) + 10
    lr_row = (rng.random(n) < 0.3) & (np.arange(n) > 50)  # rows that log the LR
    lrs = schedule(n)
    live = LRClock(keep=n)
    want = []
    for i, st in enumerate(steps.tolist()):
        want.append(live.areas(st) or (math.nan, math.nan))
        if lr_row[i]:
            live.add(st, float(lrs[i]))
    batch = LRClock(keep=n)
    rows = np.flatnonzero(lr_row)
    made, states = batch.add_many(steps[rows], lrs[rows])
    s1, s2 = areas_at(states, rows[made], np.arange(n), steps)
    np.testing.assert_array_equal(s1, [w[0] for w in want])
    np.testing.assert_array_equal(s2, [w[1] for w in want])
    empty = areas_at(np.empty((0, 5)), np.empty(0, dtype=np.int64), np.arange(3), steps[:3])
    assert np.isnan(empty).all()


def test_momentum_is_scipys_lfilter_to_the_bit():
    """``lr_areas`` forms the annealing momentum without importing scipy.signal (its
    import is most of the hook's); the floats are lfilter's."""
    lfilter = pytest.importorskip("scipy.signal").lfilter
    rng = np.random.default_rng(11)
    for decay in (0.999, 0.9, 0.5, 0.0, 1.0):
        x = rng.standard_normal(20_000) * 10.0 ** rng.uniform(-8, 3, 20_000)
        x[rng.random(x.size) < 0.3] = 0.0
        x[::7] = np.maximum(x[::7], 0.0)
        assert momentum(x, decay).tobytes() == lfilter([1.0], [1.0, -decay], x).tobytes()
