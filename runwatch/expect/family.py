"""The expected curve from a recipe's family: earlier runs at other sizes and schedules.

Within a model size, the runs' schedules differ and their loss over the LR's progress
does not, so a constant-LR and a short cosine run teach the base curve and what annealing
is worth, and another schedule or length of the same model is predicted from its LR alone
(``runwatch.expect.schedule_transfer``: lined up by the LR's areas, not by raw step); a run
of the target's own schedule and length is followed as it went. Across sizes, the loss at
every step of the target's schedule is carried to its size by a law per step
(``runwatch.expect.size_scaling``), the one the family's own leave-one-out errors favour,
or the mean of the laws those errors cannot tell apart, weighted by their likelihood;
beyond the largest size, the laws are fitted on the sizes where their shape holds
(``law_regime``). The band comes from those errors: each schedule predicted from the
others of its size, each size from the smaller ones."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from runwatch.expect.binning import bin_arrays
from runwatch.expect.lrlaw import fit_area_law, lr_areas
from runwatch.expect.powerlaw import MIN_POINTS, TooLittleData
from runwatch.expect.schedule_transfer import UNANNEALED, TransferCurve, transfer_curve
from runwatch.expect.size_scaling import FLOORED, scale_to

FIT_FROM = 0.1
"""A member's points before this share of its steps are left out of its size's fit: the
warmup and first fast drop say little about where a run ends."""

SAME_SIZE = 0.02
"""Runs whose parameter counts differ by less than this share are one size."""

SAME_PLAN = 0.02
"""A run has the target's plan when its length and its LR (as a share of the peak, RMS)
differ by less than this share."""

TRANSFER_REL = 0.01
"""The relative error assumed for a schedule transfer when the family cannot measure its
own (one run per size): about the schedule transfer's error on the real and CPU families'
held-out schedules (``bench/README-forecast-family.md``)."""

TRANSFER_REL_PER_EFOLD = 0.02
"""The relative error per e-fold of forward area S1 beyond a size's base curve assumed when
the family cannot measure its own (as ``SIZE_REL_PER_EFOLD`` for size)."""

DRIFT_REL = 0.01
"""The relative drift per e-fold of steps assumed when the family cannot measure its own
(a single run)."""

DRIFT_AT = 0.25
"""Where in each family run its level is measured for the drift's leave-one-out."""

UPDATE_FROM = 0.5
"""A run's level is measured on its points after this share of the steps seen so far."""

PRIOR_WEIGHT = 2
"""How many leave-one-out errors the assumed errors (``TRANSFER_REL``, ``DRIFT_REL``,
``SIZE_REL_PER_EFOLD``) count as when pooled with the family's own."""

SIZE_REL_PER_EFOLD = 0.02
"""The relative error per e-fold of size extrapolation assumed when the family has too
few sizes to measure its own (fewer than three)."""

Z90 = 1.645


@dataclass(frozen=True)
class Member:
    """One earlier run of the recipe: its size, its metric's points and its LR as a share of
    the peak up to its last step (logged, or planned from its config)."""

    name: str
    params: float
    steps: np.ndarray
    values: np.ndarray
    lr_steps: np.ndarray
    lr_share: np.ndarray

    @property
    def last_step(self) -> int:
        return int(np.nanmax(self.steps))


@dataclass(frozen=True)
class SizeLaw:
    """What the family's runs of one model size say: their observed curves, and the
    schedule transfer learned from them (``runwatch.expect.schedule_transfer``). A target
    with the schedule and length of one of the runs is expected to follow that run as it
    went; another schedule, the transfer curve at its LR's areas."""

    params: float
    transfer: TransferCurve
    runs: tuple[Member, ...]

    def curve(
        self, lr_steps: np.ndarray, lr_share: np.ndarray, final: int, law_credit: bool = False
    ) -> np.ndarray:
        """The loss this size is expected to have at steps 0..``final`` of a plan. With
        ``law_credit``, annealing beyond what the runs reached earns the law's credit
        (``TransferCurve.predict``)."""
        same = _same_schedule(self.runs, lr_steps, lr_share, final)
        if same is not None:
            bs, bv, _ = bin_arrays(same.steps, same.values)
            steps = np.arange(final + 1, dtype=float)
            return np.interp(np.log1p(steps), np.log1p(bs), bv)
        s1, s2 = areas_at(lr_steps, lr_share, final)
        return self.transfer.predict(s1, s2, law_credit)


def _same_schedule(
    runs: tuple[Member, ...], lr_steps: np.ndarray, lr_share: np.ndarray, final: int
) -> Member | None:
    """The run that has the plan's length and LR (within ``SAME_PLAN``), if any."""
    grid = np.linspace(0, final, 256)
    plan = np.interp(grid, lr_steps, lr_share)
    for run in runs:
        if abs(run.last_step - final) > SAME_PLAN * final + 1:
            continue
        theirs = np.interp(grid, run.lr_steps, run.lr_share)
        if float(np.sqrt(np.mean((theirs - plan) ** 2))) <= SAME_PLAN:
            return run
    return None


@dataclass(frozen=True)
class FamilyFit:
    """The family's laws by size, the size law chosen, and the relative errors measured
    on its own runs."""

    sizes: tuple[SizeLaw, ...]
    transfer_rel: float
    """Relative error of a schedule transfer (leave-one-schedule-out, RMS)."""
    size_rel_per_efold: float
    """Relative error per e-fold of size extrapolation (leave-the-largest-out, RMS)."""
    size_law: str = "prior"
    """How the loss scales over size (``runwatch.expect.size_scaling``)."""
    drift_rel: float = DRIFT_REL
    """Relative drift per e-fold of steps of a run's level against the family's curve
    after it is measured (leave-one-out at ``DRIFT_AT`` of each run's steps, RMS)."""
    measured: dict[str, int] = field(default_factory=dict)
    """How many leave-one-out errors each figure rests on (0: the default assumed)."""
    size_laws_alike: tuple[str, ...] = ()
    """The other size laws whose leave-one-out errors cannot be told from the chosen one's
    (``_choose_size_law``): the band reaches what they expect too."""
    size_law_weights: tuple[float, ...] = ()
    """The weights of ``size_laws`` in the expected curve, by the likelihood of their
    leave-one-out errors (empty: the chosen law alone; 0: the line beside a law with a
    floor, which the band reaches but the mean leaves out)."""
    transfer_rel_per_efold: float = TRANSFER_REL_PER_EFOLD
    """Relative error of a schedule transfer per e-fold of S1 beyond the base curve's reach
    (leave-one-schedule-out, RMS): a run longer than any unannealed stretch."""

    @property
    def size_laws(self) -> tuple[str, ...]:
        """The chosen size law, then the laws alike to it."""
        return (self.size_law, *self.size_laws_alike)

    @property
    def mixed_laws(self) -> tuple[str, ...]:
        """The size laws the expected curve averages, each of which the band reaches;
        empty when one law is used alone."""
        return self.size_laws if self.size_laws_alike else ()

    @property
    def params(self) -> np.ndarray:
        return np.array([s.params for s in self.sizes])

    def expected(
        self,
        params: float,
        lr_steps: np.ndarray,
        lr_share: np.ndarray,
        final: int,
        *,
        law: str | None = None,
        law_credit: bool = False,
    ) -> np.ndarray:
        """The loss a run of ``params`` with this plan is expected to have, steps 0..final,
        by ``law`` over size (default: the size laws, weighted); ``law_credit``: see
        ``SizeLaw.curve``."""
        curves = np.array([s.curve(lr_steps, lr_share, int(final), law_credit) for s in self.sizes])
        return self._scaled(curves, params, law)

    def _scaled(self, curves: np.ndarray, params: float, law: str | None) -> np.ndarray:
        """The sizes' ``curves`` carried to ``params`` by ``law``, or, by default, by each
        size law the family cannot rule out, averaged with their weights."""
        weighted = self._weighted_laws(law)
        fitted, sizes = self._regime(curves, params)
        return sum(w * scale_to(fitted, sizes, params, each) for w, each in weighted)

    def _regime(self, curves: np.ndarray, params: float) -> tuple[np.ndarray, np.ndarray]:
        """The sizes' curves and parameter counts the laws carry to ``params``: beyond the
        largest size, those of the laws' regime (``law_regime``); else every size."""
        start = law_regime(curves[:, -1], self.params) if params >= self.params[-1] else 0
        return curves[start:], self.params[start:]

    def _weighted_laws(self, law: str | None) -> list[tuple[float, str]]:
        """(weight, size law) pairs: ``law`` alone, else the chosen law or the laws the
        family cannot rule out with their weights."""
        if law is not None or not self.size_law_weights:
            return [(1.0, law or self.size_law)]
        pairs = zip(self.size_law_weights, self.size_laws, strict=True)
        return [(w, each) for w, each in pairs if w > 0]

    def final_by_size(
        self,
        params: np.ndarray,
        lr_steps: np.ndarray,
        lr_share: np.ndarray,
        final: int,
        law: str | None = None,
    ) -> np.ndarray:
        """The final value expected of runs of each of ``params`` with this plan by ``law``
        over size (default: as ``expected``; the scaling view's line), the sizes' curves
        computed once. A per-step law needs their last step only; the shared law, their
        later steps."""
        curves = np.array([s.curve(lr_steps, lr_share, int(final)) for s in self.sizes])
        weighted = self._weighted_laws(law)
        finals = []
        for p in params:
            fitted, sizes = self._regime(curves, p)
            ends = fitted[:, -1:]
            finals.append(
                sum(
                    w * scale_to(fitted if each == "shared" else ends, sizes, p, each)[-1]
                    for w, each in weighted
                )
            )
        return np.array(finals)

    def drift_half(self) -> float:
        """The 90% half-width, relative per e-fold of steps, of the drift (``drift_rel``)."""
        return t90(self.measured.get("drift", 0) + PRIOR_WEIGHT) * self.drift_rel

    def beyond_base(self, lr_steps: np.ndarray, lr_share: np.ndarray, final: int) -> float:
        """E-folds of the plan's forward area beyond the base curve of the size that reaches
        least far (0 where a run of the plan is followed, or inside every reach)."""
        s1 = float(areas_at(lr_steps, lr_share, int(final))[0][-1])
        beyond = [
            math.log(max(s1, 1e-9) / s.transfer.base_reach)
            for s in self.sizes
            if s.transfer.base_reach > 0
            and _same_schedule(s.runs, lr_steps, lr_share, int(final)) is None
        ]
        return max([0.0, *beyond])

    def beyond_half(self, lr_steps: np.ndarray, lr_share: np.ndarray, final: int) -> float:
        """The 90% half-width, relative, of a plan's schedule transfer for its S1 past the
        base curve (``beyond_base``). A run's level does not tell it: the base is
        extrapolated over the steps still to come."""
        n = self.measured.get("transfer_beyond", 0)
        beyond = self.beyond_base(lr_steps, lr_share, final)
        return t90(n + PRIOR_WEIGHT) * self.transfer_rel_per_efold * beyond

    def half_width(self, params: float) -> float:
        """The 90% band's half-width, relative, of a forecast made before the run starts:
        each error measured by the family is taken at a Student-t quantile for the few
        errors it rests on."""
        dist = self._size_efolds(params)
        transfer = t90(self.measured.get("transfer", 0) + PRIOR_WEIGHT) * self.transfer_rel
        size = t90(self.measured.get("size", 0) + PRIOR_WEIGHT) * self.size_rel_per_efold * dist
        return math.hypot(transfer, size)

    def prior_dof(self, params: float) -> int:
        """The degrees of freedom of ``half_width``'s error: the fewest errors one of its
        terms rests on (the assumed ones counted as ``PRIOR_WEIGHT``)."""
        n = self.measured.get("transfer", 0)
        if self._size_efolds(params) > 0:
            n = min(n, self.measured.get("size", 0))
        return n + PRIOR_WEIGHT

    def _size_efolds(self, params: float) -> float:
        """E-folds of size extrapolation to ``params`` (a one-size family: its distance)."""
        x = np.log(self.params)
        dist = 0.0 if x.min() <= math.log(params) <= x.max() else _efolds(params, x)
        if len(self.sizes) == 1 and abs(math.log(params) - x[0]) > SAME_SIZE:
            dist = max(dist, abs(math.log(params) - x[0]))
        return dist


T90 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812)
"""Student-t 95% quantiles for 1..10 degrees of freedom (a two-sided 90% band)."""

F90 = (39.86, 9.0, 5.391, 4.107, 3.453, 3.055, 2.785, 2.589, 2.44, 2.323)
"""The F distribution's 90% quantiles for n and n degrees of freedom, n = 1..10 (beyond,
the last is used: a laxer test than it should be, so more laws alike and wider bands)."""


def law_regime(finals: np.ndarray, params: np.ndarray) -> int:
    """The index of the first size of the laws' regime: the largest sizes, three or more,
    over which the final loss's fall per e-fold of size does not steepen with size, as no
    size law's does. Below it, smaller models fall more slowly with size than the
    next ones, as they are just starting to hold what larger ones learn; a law fitted
    across that bend expects the fall to go on steepening. 0 when the regime would have
    fewer than three sizes: a law's shape cannot be seen in two."""
    slopes = -np.diff(np.log(np.maximum(finals, 1e-12))) / np.diff(np.log(params))
    start = len(slopes) - 1
    while start > 0 and slopes[start - 1] >= slopes[start]:
        start -= 1
    return start if len(params) - start >= 3 else 0


def t90(n: int) -> float:
    """The band's multiplier for an RMS error that rests on ``n`` errors."""
    if n <= 0:
        return Z90
    return T90[n - 1] if n <= len(T90) else Z90 + 1.6 / n


def _efolds(params: float, x: np.ndarray) -> float:
    """E-folds of size from the family's range to ``params`` (0 inside it)."""
    lp = math.log(params)
    return float(max(lp - x.max(), x.min() - lp, 0.0))


def areas_at(
    lr_steps: np.ndarray, lr_share: np.ndarray, upto: int
) -> tuple[np.ndarray, np.ndarray]:
    """S1 and S2 at every step 0..upto of an LR given as a share of its peak."""
    return lr_areas(lr_steps, lr_share, int(upto))


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
    groups: list[list[Member]] = []
    for m in sorted(members, key=lambda m: m.params):
        if groups and m.params <= groups[-1][0].params * (1.0 + SAME_SIZE):
            groups[-1].append(m)
        else:
            groups.append([m])
    return groups


def final_value(m: Member) -> float:
    """A run's final value: the median of its last few points (one noisy point is not it)."""
    order = np.argsort(m.steps)
    tail = m.values[order][np.isfinite(m.values[order])][-5:]
    return float(np.median(tail))


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
    steps is measured, per e-fold of steps: each size from the second on, from the smaller
    sizes; each run of a size with several, from the others of its size, where its forward
    area stays inside their base curve (beyond it, ``FamilyFit.beyond_half`` holds it)."""
    cases: list[tuple[FamilyFit, Member]] = []
    for k in range(1, len(groups)):
        cases += [(FamilyFit(sizes[:k], 0.0, 0.0, size_law), m) for m in groups[k]]
    cases += [(FamilyFit((size,), 0.0, 0.0), held) for size, held, far in held_out if far <= 0]
    errors = []
    for fit, m in cases:
        prior = fit.expected(m.params, m.lr_steps, m.lr_share, m.last_step)
        level = level_offset(prior, m.steps, m.values, int(DRIFT_AT * m.last_step), 0.0)
        offset = 0.0 if level is None else level[0]
        errors.append((prior[-1] * math.exp(offset) / final_value(m) - 1.0) / -math.log(DRIFT_AT))
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
        dist = _efolds(sizes[k].params, np.log(smaller.params))
        for m in groups[k]:
            err = _predict_final(smaller, m) / final_value(m) - 1.0
            errors.append(_per_efold(err, dist))
    return errors


def level_offset(
    prior: np.ndarray, steps: np.ndarray, values: np.ndarray, seen: int, prior_sd: float
) -> tuple[float, float] | None:
    """The run's log offset from the prior curve over its points up to ``seen`` (from
    ``UPDATE_FROM`` of them on), and that offset's sd (from ``prior_sd`` with fewer than
    three bins); None with fewer than three points."""
    ok = np.isfinite(steps) & np.isfinite(values) & (values > 0)
    ok &= (steps <= seen) & (steps >= UPDATE_FROM * seen)
    if ok.sum() < 3:
        return None
    bs, bv, _ = bin_arrays(steps[ok], values[ok])
    idx = np.clip(bs.round().astype(int), 0, prior.size - 1)
    logs = np.log(bv) - np.log(np.maximum(prior[idx], 1e-12))
    offset = float(np.median(logs))
    spread = float(1.4826 * np.median(np.abs(logs - offset))) if logs.size > 2 else prior_sd
    return offset, max(spread / math.sqrt(logs.size), 1e-4)
