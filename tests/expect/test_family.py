"""The family law: schedule transfer within a size, extrapolation over sizes, bands from
the family's own errors, and the update by the target's points."""

from __future__ import annotations

import numpy as np
import pytest

from runwatch.expect.family import FamilyFit, Member, law_regime
from runwatch.expect.family_fit import fit_family
from runwatch.expect.family_forecast import family_forecast
from runwatch.expect.lrlaw import lr_areas
from runwatch.expect.planned import planned_lr
from runwatch.expect.size_scaling import FLOORED, scale_to

COSINE = {"name": "cosine", "warmup": 50, "final_lr_fraction": 0.1}
CONSTANT = {"name": "constant", "warmup": 50}
WSD = {"name": "wsd", "warmup": 50, "decay_start": 3000, "final_lr_fraction": 0.1}


def law_curve(params: float, schedule: dict, total: int, seed: int = 0):
    """A run that follows L = E(N) + A·S1^-α - C·S2 exactly, with E(N) a power law in N and
    a little noise: what the family law assumes, so it must recover it."""
    steps, share = planned_lr(schedule, total)
    s1, s2 = lr_areas(steps, share, total)
    level = 2.0 * (params / 1e6) ** -0.07
    loss = level + 3.0 * np.maximum(s1, 1.0) ** -0.5 - 4e-4 * s2
    noise = np.random.default_rng(seed).normal(0, 0.003, loss.size)
    return steps, loss + noise, share


def member(name, params, schedule, total, seed=0):
    steps, loss, share = law_curve(params, schedule, total, seed)
    return Member(name, params, steps[1:], loss[1:], steps, share)


def bent_member(name, params, seed):
    """A run whose final loss is quadratic in log N, which none of the size laws is."""
    steps, loss, share = law_curve(1e6, COSINE, 2000, seed)
    x = np.log(params / 1e4)
    return Member(
        name, params, steps[1:], (loss * (1.5 - 0.15 * x + 0.01 * x * x))[1:], steps, share
    )


def truth(params, schedule, total):
    _steps, loss, _ = law_curve(params, schedule, total, seed=99)
    return float(np.median(loss[-5:]))


def saturating_member(name, schedule, total, seed=0, depth=0.08):
    """A run whose decay is worth a share of the loss that saturates as it anneals (``depth``
    at most), as the CPU families' runs show, where the LR-annealing law's credit C·S2
    keeps growing with a longer decay."""
    steps, share = planned_lr(schedule, total)
    s1, s2 = lr_areas(steps, share, total)
    loss = (2.0 + 3.0 * np.maximum(s1, 1.0) ** -0.5) * (1 - depth * (1 - np.exp(-s2 / 200)))
    loss = loss + np.random.default_rng(seed).normal(0, 0.003, loss.size)
    return Member(name, 1e6, steps[1:], loss[1:], steps, share)


def test_schedule_transfer_predicts_another_schedule_and_length_before_it_starts():
    # A constant-LR run and a short cosine teach the base curve and what annealing is
    # worth; a longer cosine and a WSD run are predicted from them by their LR alone.
    family = [saturating_member("k4k", CONSTANT, 4000), saturating_member("c2k", COSINE, 2000, 1)]
    fit = fit_family(family)
    for schedule in (COSINE, WSD):
        steps, share = planned_lr(schedule, 4000)
        f = family_forecast(fit, 1e6, steps, share, 4000)
        want = float(np.median(saturating_member("t", schedule, 4000, 99).values[-5:]))
        assert f.model == "family" and f.upto == 0 and f.final_step == 4000
        assert abs(f.predicted / want - 1) < 0.01
        assert f.lower <= want <= f.upper


def test_a_transfer_inside_what_the_runs_measured_is_narrow_and_past_their_base_wider():
    # Held out from the constant run alone, the cosine run's anneal is unknown: the family
    # does not count that as its transfer error. The constant run held out from the cosine
    # one reaches past that run's unannealed points: an error per e-fold of S1 beyond them.
    family = [saturating_member("k4k", CONSTANT, 4000), saturating_member("c2k", COSINE, 2000, 1)]
    fit = fit_family(family)
    assert fit.measured["transfer"] == 0 and fit.measured["transfer_beyond"] == 1
    assert fit.measured["drift"] == 0  # nor the drift after the level: neither case tells it
    halves = {}
    for schedule, total in ((WSD, 4000), (CONSTANT, 8000)):
        steps, share = planned_lr(schedule, total)
        f = family_forecast(fit, 1e6, steps, share, total)
        want = float(np.median(saturating_member("t", schedule, total, 99).values[-5:]))
        assert f.lower <= want <= f.upper
        halves[total] = f.upper / f.predicted - 1
        base_reach = fit.sizes[0].transfer.base_reach
        far = max(0.0, float(np.log(lr_areas(steps, share, total)[0][-1] / base_reach)))
        assert fit.beyond_base(steps, share, total) == pytest.approx(far)
    assert halves[4000] < 0.04 < halves[8000]


def test_a_family_that_never_annealed_leaves_room_below_for_a_run_that_does():
    # Constant-LR runs cannot say what a decay is worth: the mean expects nothing of it,
    # and the lower end reaches the single-run forecast's allowance for an unseen anneal.
    family = [saturating_member(f"k{n}", CONSTANT, n, i, 0.045) for i, n in enumerate((2000, 4000))]
    fit = fit_family(family)
    steps, share = planned_lr(COSINE, 2000)
    f = family_forecast(fit, 1e6, steps, share, 2000)
    want = float(np.median(saturating_member("t", COSINE, 2000, 99, 0.045).values[-5:]))
    flat = fit.expected(1e6, steps, share, 2000)[-1]
    assert f.predicted == pytest.approx(flat) and want < flat / 1.04
    assert f.lower <= want <= f.upper


def test_a_larger_size_is_extrapolated_and_its_band_widens_with_distance():
    members = [member(f"n{p:g}", p, COSINE, 2000, i) for i, p in enumerate((1e5, 3e5, 1e6))]
    fit = fit_family(members)
    assert fit.measured["size"]  # three sizes: the family measures its own size error
    steps, share = planned_lr(COSINE, 2000)
    near = family_forecast(fit, 3e6, steps, share, 2000)
    far = family_forecast(fit, 3e7, steps, share, 2000)
    want = truth(3e6, COSINE, 2000)
    assert abs(near.predicted / want - 1) < 0.02
    assert near.lower <= want <= near.upper
    assert (far.upper - far.lower) / far.predicted > (near.upper - near.lower) / near.predicted


def test_the_targets_own_points_move_the_forecast_to_its_level():
    # Three sizes, so that the family's size law is the one its runs follow, and the
    # prior forecast is off by the target's own level only.
    fit = fit_family([member(f"n{p:g}", p, COSINE, 2000, i) for i, p in enumerate((1e5, 3e5, 1e6))])
    steps, share = planned_lr(COSINE, 2000)
    prior = family_forecast(fit, 3e6, steps, share, 2000)
    # The target is 3% worse than its size predicts (a worse data mix, say).
    s, loss, _ = law_curve(3e6, COSINE, 2000, seed=5)
    loss = loss * 1.03
    updated = family_forecast(fit, 3e6, steps, share, 2000, steps=s[1:], values=loss[1:], upto=500)
    final = float(np.median(loss[-5:]))
    assert abs(updated.predicted / final - 1) < abs(prior.predicted / final - 1)
    assert abs(updated.predicted / final - 1) < 0.01
    assert updated.upto == 500
    mean, lower, upper = updated.curve(np.array([1.0, 500.0, 2000.0]))
    assert (lower < mean).all() and (mean < upper).all()


def test_one_size_cannot_say_how_loss_scales_so_another_size_gets_a_wide_band():
    fit = fit_family([member("a", 1e6, COSINE, 2000)])
    steps, share = planned_lr(COSINE, 2000)
    same = family_forecast(fit, 1e6, steps, share, 2000)
    other = family_forecast(fit, 1e7, steps, share, 2000)
    assert (other.upper - other.lower) / other.predicted > 2 * (
        same.upper - same.lower
    ) / same.predicted


def test_an_empty_family_is_refused():
    with pytest.raises(ValueError, match="at least one run"):
        fit_family([])


def test_a_loss_nearing_its_floor_over_size_is_scaled_by_the_floor_law():
    # Final losses E + A·N^-a with a floor E = 1.5: a log-log line through the smaller
    # sizes is optimistic for a larger one; with five sizes the family's own
    # leave-one-out errors choose the floor law, which is not.
    def floored(name, params, seed):
        steps, loss, share = law_curve(1e6, COSINE, 2000, seed)
        size_term = 1.5 + 2.0 * (params / 1e5) ** -0.5
        return Member(name, params, steps[1:], (loss * size_term / 2.0)[1:], steps, share)

    sizes = (1e5, 2e5, 4e5, 8e5, 1.6e6)
    fit = fit_family([floored(f"n{i}", p, i) for i, p in enumerate(sizes)])
    # The line and the prior are ruled out; the shared law, of the same form, is not.
    assert fit.size_law in ("floor", "shared") and set(fit.size_laws) == {"floor", "shared"}
    steps, share = planned_lr(COSINE, 2000)
    f = family_forecast(fit, 6.4e6, steps, share, 2000)
    want = float(np.median(floored("t", 6.4e6, 99).values[-5:]))
    line = FamilyFit(fit.sizes, 0.0, 0.0, "loglog").expected(6.4e6, steps, share, 2000)[-1]
    assert abs(f.predicted / want - 1) < abs(line / want - 1)
    assert f.lower <= want <= f.upper


def test_the_mean_weighs_and_the_band_holds_each_size_law_the_errors_cannot_rule_out():
    # Final losses quadratic in log N, which none of the laws is: their leave-the-larger-out
    # errors are alike, so the mean is their weighted mean and the band reaches each one's
    # expectation, the chosen law's too, with its own band.
    sizes = (1e5, 2e5, 4e5, 8e5, 1.6e6)
    fit = fit_family([bent_member(f"n{i}", p, i) for i, p in enumerate(sizes)])
    assert fit.size_laws_alike and fit.size_law not in fit.size_laws_alike
    steps, share = planned_lr(COSINE, 2000)
    f = family_forecast(fit, 4e6, steps, share, 2000)
    half = fit.half_width(4e6)
    ends = [fit.expected(4e6, steps, share, 2000, law=law)[-1] for law in fit.size_laws]
    assert f.lower <= min(ends) * np.exp(-half) * (1 + 1e-9)
    assert f.upper >= max(ends) * np.exp(half) * (1 - 1e-9)
    weights = np.array(fit.size_law_weights)
    assert weights.size == len(fit.size_laws) and weights.sum() == pytest.approx(1.0)
    assert weights[0] == weights.max() and (weights > 0).all()  # the chosen law weighs most
    assert f.predicted == pytest.approx(float(weights @ ends), rel=1e-12)
    assert min(ends) < f.predicted < max(ends)
    assert f.size_laws == (fit.size_law, *fit.size_laws_alike)  # named, for the JSON
    assert f.size_law_weights == fit.size_law_weights


def test_the_line_beside_a_law_with_a_floor_is_held_by_the_band_not_the_mean():
    # Three sizes bent in log N: one leave-the-larger-out error each cannot tell the line
    # from the prior law. The line cannot flatten, so it is not chosen and weighs nothing
    # in the mean; the band still reaches what it expects.
    fit = fit_family([bent_member(f"n{i}", p, i) for i, p in enumerate((1e5, 2e5, 4e5))])
    assert "loglog" in fit.size_laws_alike and fit.size_law in FLOORED
    weights = dict(zip(fit.size_laws, fit.size_law_weights, strict=True))
    assert weights["loglog"] == 0 and sum(weights.values()) == pytest.approx(1.0)
    steps, share = planned_lr(COSINE, 2000)
    f = family_forecast(fit, 1.6e6, steps, share, 2000)
    ends = {law: fit.expected(1.6e6, steps, share, 2000, law=law)[-1] for law in weights}
    assert f.predicted == pytest.approx(sum(w * ends[law] for law, w in weights.items()))
    assert ends["loglog"] < f.predicted  # the line is the optimistic one, and left out
    assert f.lower <= ends["loglog"] * np.exp(-fit.half_width(1.6e6)) * (1 + 1e-9)


def test_two_sizes_flatten_towards_a_floor_by_the_prior_exponent():
    # Final losses of a Chinchilla-form family, E + A·N^-0.34: from two sizes the line is
    # optimistic for a size 4x larger, the floor law with the prior exponent is not.
    def chinchilla(name, params, seed):
        steps, loss, share = law_curve(1e6, COSINE, 2000, seed)
        size_term = 1.7 + 400.0 * params**-0.34
        return Member(name, params, steps[1:], (loss * size_term / 2.0)[1:], steps, share)

    fit = fit_family([chinchilla("25m", 25e6, 0), chinchilla("100m", 100e6, 1)])
    assert fit.size_law == "prior"
    steps, share = planned_lr(COSINE, 2000)
    f = family_forecast(fit, 400e6, steps, share, 2000)
    want = float(np.median(chinchilla("t", 400e6, 99).values[-5:]))
    line = FamilyFit(fit.sizes, 0.0, 0.0, "loglog").expected(400e6, steps, share, 2000)[-1]
    assert abs(f.predicted / want - 1) < 0.005 < abs(line / want - 1)
    assert f.lower <= want <= f.upper


def test_the_band_rests_on_the_familys_own_errors_pooled_with_the_assumed_ones():
    one = fit_family([member("c", 1e6, COSINE, 2000)])
    assert one.measured == {"transfer": 0, "transfer_beyond": 0, "size": 0, "drift": 0}
    many = fit_family(
        [member(f"n{p:g}", p, COSINE, 2000, i) for i, p in enumerate((1e5, 3e5, 1e6))]
    )
    assert many.measured["size"] == 1 and many.measured["drift"] == 2
    # A law-following family's near-zero errors narrow the size band, but not to nothing.
    assert 0 < many.size_rel_per_efold < one.size_rel_per_efold


def test_the_band_reaches_a_longer_anneal_worth_what_the_law_credits():
    """A 4,000-step cosine anneals further than any family run. The mean expects it to be
    worth no more than the runs saw; in a family that follows the LR-annealing law, whose
    credit C·S2 keeps growing, the lower end must hold the run that earns it."""
    short_wsd = {**WSD, "decay_start": 1500}
    plans = ((COSINE, 2000), (CONSTANT, 4000), (CONSTANT, 2000), (short_wsd, 2000))
    fit = fit_family([member(f"r{i}", 1e6, p, n, i) for i, (p, n) in enumerate(plans)])
    reach = max(lr_areas(*planned_lr(p, n), n)[1][-1] for p, n in plans)
    steps, share = planned_lr(COSINE, 4000)
    s1, s2 = lr_areas(steps, share, 4000)
    saturated = 2.0 + 3.0 * s1[-1] ** -0.5 - 4e-4 * min(s2[-1], reach)
    want = truth(1e6, COSINE, 4000)
    f = family_forecast(fit, 1e6, steps, share, 4000)
    assert abs(f.predicted / saturated - 1) < 0.01  # the mean holds at the runs' reach
    assert f.lower <= want < saturated / 1.03 and saturated <= f.upper
    followed = family_forecast(fit, 1e6, *planned_lr(COSINE, 2000), 2000)
    assert followed.predicted / followed.lower < np.exp(fit.half_width(1e6)) + 1e-9


def test_a_family_whose_gap_between_sizes_holds_over_the_steps_may_share_it():
    # Chinchilla's separable form, L = g(s) + A·N^-a: with four sizes or more the shared
    # size law is a candidate, and where it is the one used the scaling view draws it.
    def separable(name, params, seed):
        steps, loss, share = law_curve(1e6, COSINE, 2000, seed)
        return Member(
            name, params, steps[1:], (loss + 0.8 * (params / 1e5) ** -0.8)[1:], steps, share
        )

    sizes = (1e5, 2e5, 4e5, 8e5, 1.6e6)
    fit = fit_family([separable(f"n{i}", p, i) for i, p in enumerate(sizes)])
    assert "shared" in fit.size_laws
    steps, share = planned_lr(COSINE, 2000)
    want = float(np.median(law_curve(1e6, COSINE, 2000, 99)[1][-5:]) + 0.8 * 64**-0.8)
    shared = fit.expected(6.4e6, steps, share, 2000, law="shared")[-1]
    prior = fit.expected(6.4e6, steps, share, 2000, law="prior")[-1]
    assert abs(shared / want - 1) < 0.015 < abs(prior / want - 1)
    assert fit.size_law_weights and "prior" not in fit.size_laws  # ruled out
    f = family_forecast(fit, 6.4e6, steps, share, 2000)
    assert f.lower <= want <= f.upper
    ends = fit.final_by_size(np.array([6.4e6]), steps, share, 2000, law="shared")
    assert ends[0] == pytest.approx(shared)  # the scaling view's line is the forecast's


def test_the_laws_regime_is_the_largest_sizes_whose_fall_does_not_steepen():
    params = np.array([1e5, 2e5, 4e5, 8e5, 1.6e6])
    floor = 1.5 + 2.0 * (params / 1e5) ** -0.5  # a floor law: the fall slows at every size
    assert law_regime(floor, params) == 0
    # The two smallest fall slowly, then faster (a bend below), then slower again.
    bent = np.array([3.0, 2.95, 2.6, 2.45, 2.38])
    assert law_regime(bent, params) == 1
    # Steepening all the way: no three sizes show a law's shape, so every size is kept.
    assert law_regime(np.array([3.0, 2.98, 2.9, 2.7, 2.2]), params) == 0
    assert law_regime(bent[:2], params[:2]) == 0


def test_beyond_a_bend_the_size_law_is_fitted_on_the_sizes_past_it():
    # Final losses on a floor law from 4e5 on; the two smallest sizes sit on a plateau
    # below it (they cannot yet hold what the larger ones learn). Laws fitted over every
    # size read the bend as a fall that keeps steepening.
    def size_term(params):
        law = 1.5 + 2.0 * (params / 1e5) ** -0.5
        return np.where(params < 4e5, 1.5 + 2.0 * 0.5 + 0.08 * (4e5 / params) ** 0.2, law)

    def run(name, params, seed):
        steps, loss, share = law_curve(1e6, COSINE, 2000, seed)
        scale = float(size_term(np.array(params))) / 2.0
        return Member(name, params, steps[1:], (loss * scale)[1:], steps, share)

    sizes = (1e5, 2e5, 4e5, 8e5, 1.6e6, 3.2e6)
    members = [run(f"n{i}", p, i) for i, p in enumerate(sizes)]
    fit = fit_family(members)
    steps, share = planned_lr(COSINE, 2000)
    finals = np.array([s.curve(steps, share, 2000)[-1] for s in fit.sizes])
    assert law_regime(finals, fit.params) == 2
    f = family_forecast(fit, 1.28e7, steps, share, 2000)
    want = float(np.median(run("t", 1.28e7, 99).values[-5:]))
    curves = np.array([s.curve(steps, share, 2000) for s in fit.sizes])
    laws = zip(fit.size_law_weights, fit.size_laws, strict=True)
    over_all = sum(w * scale_to(curves, fit.params, 1.28e7, law)[-1] for w, law in laws)
    assert abs(f.predicted / want - 1) < 0.5 * abs(over_all / want - 1)
    assert f.lower <= want <= f.upper
    # The scaling view's line agrees with the forecast at the target's size.
    line = fit.final_by_size(np.array([1.28e7]), steps, share, 2000)
    assert line[0] == pytest.approx(f.predicted, rel=1e-9)


def test_a_level_the_familys_error_explains_is_weighed_and_one_far_beyond_is_kept():
    fit = fit_family([member(f"n{p:g}", p, COSINE, 2000, i) for i, p in enumerate((1e5, 3e5, 1e6))])
    steps, share = planned_lr(COSINE, 2000)
    prior = family_forecast(fit, 3e6, steps, share, 2000)
    at = np.array([500.0, 2000.0])
    p_seen, p_end = prior.curve(at)[0]
    s, loss, _ = law_curve(3e6, COSINE, 2000, seed=5)
    for worse in (1.01, 1.15):
        f = family_forecast(
            fit, 3e6, steps, share, 2000, steps=s[1:], values=loss[1:] * worse, upto=500
        )
        (m_seen, m_end), (lo_seen, lo_end), (hi_seen, hi_end) = f.curve(at)
        seen_shift, end_shift = m_seen / p_seen - 1, m_end / p_end - 1
        # Where the run is, the forecast follows its points.
        assert seen_shift == pytest.approx(worse - 1, abs=0.003)
        # Three e-folds of steps on, a 1% gap inside the family's error is weighed against
        # the family; a 15% one, far beyond it, is the run's own and is kept.
        if worse < 1.1:
            assert 0 < end_shift < 0.9 * seen_shift
        else:
            assert end_shift == pytest.approx(seen_shift, abs=0.01)
        assert hi_end / lo_end > hi_seen / lo_seen  # the band widens with the steps to come


def test_a_level_read_late_keeps_room_for_the_drift_still_to_come():
    # Levels wander and settle, so the last quarter of a run can move its level by more
    # than its share of the e-folds of steps: the drift grows as a random walk in log
    # steps, and a level read at 75% keeps about half the end's band of one read at 25%
    # (the e-folds' share would be a fifth).
    fit = fit_family([member(f"n{p:g}", p, COSINE, 2000, i) for i, p in enumerate((1e5, 3e5, 1e6))])
    steps, share = planned_lr(COSINE, 2000)
    s, loss, _ = law_curve(3e6, COSINE, 2000, seed=5)
    end_half = {}
    for upto in (500, 1500):
        f = family_forecast(fit, 3e6, steps, share, 2000, steps=s[1:], values=loss[1:], upto=upto)
        _, (lo_seen, lo_end), (hi_seen, hi_end) = f.curve(np.array([upto, 2000.0]))
        assert hi_end / lo_end > hi_seen / lo_seen
        end_half[upto] = np.log(hi_end / lo_end) / 2
    assert 0.4 < end_half[1500] / end_half[500] < 0.7
