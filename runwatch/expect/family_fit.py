"""Fitting a recipe's family: each size's laws, the size law chosen, and the family's own
errors, measured by leaving runs out.

Each schedule of a size is predicted from the others of its size (the transfer error,
inside and beyond the base curve), each size from the smaller ones by each size law (which
law the errors favour, and which they cannot tell apart), and each run's end from its level
at a quarter of its steps (the drift). ``runwatch.expect.family`` holds what is fitted and
how it is used; ``bench/README-forecast-family.md`` how the rules were chosen."""

from __future__ import annotations

import math

import numpy as np

from runwatch.expect.binning import bin_arrays
from runwatch.expect.family import (
    DRIFT_REL,
    FIT_FROM,
    PRIOR_WEIGHT,
    SAME_SIZE,
    SIZE_REL_PER_EFOLD,
    TRANSFER_REL,
    TRANSFER_REL_PER_EFOLD,
    FamilyFit,
    Member,
    SizeLaw,
    areas_at,
    drift_span,
    efolds_beyond,
    final_value,
    law_regime,
    level_offset,
)
from runwatch.expect.lrlaw import fit_area_law
from runwatch.expect.powerlaw import MIN_POINTS, TooLittleData
from runwatch.expect.schedule_transfer import UNANNEALED, transfer_curve
from runwatch.expect.size_scaling import FLOORED

DRIFT_AT = 0.25
"""Where in each family run its level is measured for the drift's leave-one-out."""

F90 = (39.86, 9.0, 5.391, 4.107, 3.453, 3.055, 2.785, 2.589, 2.44, 2.323)
"""The F distribution's 90% quantiles for n and n degrees of freedom, n = 1..10 (beyond,
the last is used: a laxer test than it should be, so more laws alike and wider bands)."""


def _size_law(members: list[Member]) -> SizeLaw:
    """The transfer curve of one size, from its runs' binned later points, with the
    LR-annealing law fitted jointly over them."""
    a1, a2, ys = [], [], []
    for m in members:
        s1, s2 = areas_at(m.lr_steps, m.lr_share, m.last_step)
        keep = np.isfinite(m.values) & (m.steps >= FIT_FROM * m.last_step)
        bs, bv, _ = bin_arrays(m.steps[keep], m.values[keep])
        idx = np.clip(bs.round().astype(int), 0, s1.size - 1)
        a1.append(np.maximum(s1[idx], 1e-9))
        a2.append(s2[idx])
        ys.append(bv)
    y = np.concatenate(ys)
    if y.size < MIN_POINTS:
        names = ", ".join(m.name for m in members)
        raise TooLittleData(int(y.size), MIN_POINTS, f"binned points in family run(s) {names}")
    law = fit_area_law(np.concatenate(a1), np.concatenate(a2), y)
    params = float(np.median([m.params for m in members]))
    transfer = transfer_curve(np.concatenate(a1), np.concatenate(a2), y, law)
    return SizeLaw(params, transfer, tuple(members))


def _by_size(members: list[Member]) -> list[list[Member]]:
    """The runs grouped by size (parameter counts within ``SAME_SIZE``), smallest first."""
    groups: list[list[Member]] = []
    for m in sorted(members, key=lambda m: m.params):
        if groups and m.params <= groups[-1][0].params * (1.0 + SAME_SIZE):
            groups[-1].append(m)
        else:
            groups.append([m])
    return groups


def _predict_final(fit: FamilyFit, m: Member) -> float:
    return float(fit.expected(m.params, m.lr_steps, m.lr_share, m.last_step)[-1])


def fit_family(members: list[Member]) -> FamilyFit:
    """Fit the family's laws, choose how its loss scales over size, and measure its own
    errors by leaving runs out."""
    if not members:
        raise ValueError("a family needs at least one run")
    groups = _by_size(members)
    sizes = tuple(_size_law(g) for g in groups)
    held_out = _same_size_cases(groups)
    inside, beyond = _transfer_errors(held_out)
    size_law, size_errs, alike, weights = _choose_size_law(groups, sizes)
    drift = _drift_errors(groups, sizes, size_law, held_out)
    measured = {
        "transfer": len(inside),
        "transfer_beyond": len(beyond),
        "size": len(size_errs),
        "drift": len(drift),
    }
    return FamilyFit(
        sizes,
        _pooled(inside, TRANSFER_REL),
        _pooled(size_errs, SIZE_REL_PER_EFOLD),
        size_law,
        _pooled(drift, DRIFT_REL),
        measured,
        alike,
        weights,
        _pooled(beyond, TRANSFER_REL_PER_EFOLD),
    )


def _pooled(errors: list[float], prior: float) -> float:
    """The RMS of the family's leave-one-out errors, pooled with the assumed error as
    ``PRIOR_WEIGHT`` errors more: a few lucky leave-one-outs do not make a narrow band."""
    n = len(errors)
    total = float(np.sum(np.square(errors))) + PRIOR_WEIGHT * prior**2
    return math.sqrt(total / (n + PRIOR_WEIGHT))


def _per_efold(err: float, efolds: float) -> float:
    """A relative error per e-fold of extrapolation, counted as at least half an e-fold (a
    short reach says little of the rate)."""
    return err / max(efolds, 0.5)


def _transfer_errors(
    held_out: list[tuple[SizeLaw, Member, float]],
) -> tuple[list[float], list[float]]:
    """Each run of a size with several, predicted from the others of its size
    (``_same_size_cases``): relative errors where its forward area stays inside their base
    curve's reach, and per e-fold beyond it."""
    inside, beyond = [], []
    for size, held, far in held_out:
        err = _predict_final(FamilyFit((size,), 0.0, 0.0), held) / final_value(held) - 1.0
        if far > 0:
            beyond.append(_per_efold(err, far))
        else:
            inside.append(err)
    return inside, beyond


def _same_size_cases(groups: list[list[Member]]) -> list[tuple[SizeLaw, Member, float]]:
    """Each run of a size with several, held out: the others' size law, the run, and the
    e-folds of its forward area beyond their base curve. A run that anneals, held out from
    runs that never did, is left out: what annealing is worth is unknown there, and the
    band's allowance for it (``TransferCurve.predict``) is what holds such a run."""
    cases = []
    for group in groups:
        for i, held in enumerate(group if len(group) > 1 else []):
            try:
                size = _size_law(group[:i] + group[i + 1 :])
            except ValueError:
                continue
            s1, s2 = areas_at(held.lr_steps, held.lr_share, held.last_step)
            if size.transfer.anneal_reach <= 0 and s2[-1] >= UNANNEALED:
                continue
            cases.append((size, held, math.log(max(s1[-1], 1e-9) / size.transfer.base_reach)))
    return cases


def _drift_errors(
    groups: list[list[Member]],
    sizes: tuple[SizeLaw, ...],
    size_law: str,
    held_out: list[tuple[SizeLaw, Member, float]],
) -> list[float]:
    """How far a run ends from the family's curve once its level at ``DRIFT_AT`` of its
    steps is measured, per ``drift_span`` to its end: each size from the second on, from the smaller
    sizes; each run of a size with several, from the others of its size, where its forward
    area stays inside their base curve (beyond it, ``FamilyFit.beyond_half`` holds it)."""
    cases: list[tuple[FamilyFit, Member]] = []
    for k in range(1, len(groups)):
        cases += [(FamilyFit(sizes[:k], 0.0, 0.0, size_law), m) for m in groups[k]]
    cases += [(FamilyFit((size,), 0.0, 0.0), held) for size, held, far in held_out if far <= 0]
    errors = []
    for fit, m in cases:
        prior = fit.expected(m.params, m.lr_steps, m.lr_share, m.last_step)
        seen = int(DRIFT_AT * m.last_step)
        level = level_offset(prior, m.steps, m.values, seen, 0.0)
        offset = 0.0 if level is None else level[0]
        span = float(drift_span(np.array([m.last_step]), seen)[0])
        errors.append((prior[-1] * math.exp(offset) / final_value(m) - 1.0) / span)
    return errors


def _choose_size_law(
    groups: list[list[Member]], sizes: tuple[SizeLaw, ...]
) -> tuple[str, list[float], tuple[str, ...], tuple[float, ...]]:
    """The size law whose leave-the-larger-out errors are smallest, its errors per e-fold,
    the other laws it cannot be told from (their mean square error, over the same errors,
    within the F test's 90% quantile of the best's), and the weights of all of these: the
    likelihood of their errors, MSE^(-n/2) for n errors, normalized. Where a law with a
    floor (``FLOORED``) is among these, the line is not chosen and weighs 0: it cannot
    flatten, and a law that can explains the family's errors as well (the band still
    reaches it). Two sizes cannot tell laws apart: the floor law with the prior exponent,
    as the loss of a larger model flattens. The fitted floor and the shared law need four
    (their first test, three smaller sizes). Where the laws' regime (``law_regime``) has
    four sizes or more, the laws are judged on it alone, as they are fitted on it beyond
    the largest size."""
    start = _family_regime(groups, sizes)
    if len(groups) - start >= 4:
        groups, sizes = groups[start:], sizes[start:]
    prior = _size_errors(groups, sizes, "prior", first=2)
    if len(groups) < 3:
        return "prior", prior, (), ()
    errors = {"prior": prior, "loglog": _size_errors(groups, sizes, "loglog", first=2)}
    if len(groups) >= 4:
        errors["floor"] = _size_errors(groups, sizes, "floor", first=3)
        errors["shared"] = _size_errors(groups, sizes, "shared", first=3)
    common = min(len(e) for e in errors.values())
    if not common:
        return "prior", prior, (), ()
    square = {law: float(np.mean(np.square(e[-common:]))) for law, e in errors.items()}
    best = min(square, key=square.__getitem__)
    limit = F90[min(common, len(F90)) - 1] * square[best]
    within = [law for law in errors if square[law] <= limit]
    floored = [law for law in within if law in FLOORED]
    chosen = min(floored or within, key=square.__getitem__)
    alike = tuple(law for law in within if law != chosen)
    if not alike:
        return chosen, errors[chosen], (), ()

    def likelihood(law: str) -> float:
        """MSE^(-n/2) relative to the best's (an MSE of 0 means the best's is 0 too); the
        line's is 0 beside a law with a floor."""
        if floored and law not in FLOORED:
            return 0.0
        return (square[best] / square[law]) ** (common / 2) if square[law] > 0 else 1.0

    weights = [likelihood(law) for law in (chosen, *alike)]
    total = sum(weights)
    return chosen, errors[chosen], alike, tuple(w / total for w in weights)


def _family_regime(groups: list[list[Member]], sizes: tuple[SizeLaw, ...]) -> int:
    """``law_regime`` of the family's sizes, on their final losses under the plan of the
    largest size's first run."""
    ref = groups[-1][0]
    finals = np.array([s.curve(ref.lr_steps, ref.lr_share, ref.last_step)[-1] for s in sizes])
    return law_regime(finals, np.array([s.params for s in sizes]))


def _size_errors(
    groups: list[list[Member]], sizes: tuple[SizeLaw, ...], law: str, first: int
) -> list[float]:
    """Each size from ``first`` on, predicted by ``law`` from the smaller sizes: relative
    error per e-fold of extrapolation (at least half an e-fold), for every run of it."""
    errors = []
    for k in range(first, len(groups)):
        smaller = FamilyFit(sizes[:k], 0.0, 0.0, law)
        dist = efolds_beyond(sizes[k].params, np.log(smaller.params))
        for m in groups[k]:
            err = _predict_final(smaller, m) / final_value(m) - 1.0
            errors.append(_per_efold(err, dist))
    return errors
