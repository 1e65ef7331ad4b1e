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
others of its size, each size from the smaller ones. This module holds what is fitted and
how it is used; ``runwatch.expect.family_fit`` fits it and measures those errors."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from runwatch.expect.binning import bin_arrays
from runwatch.expect.lrlaw import lr_areas
from runwatch.expect.powerlaw import residual_sigma
from runwatch.expect.schedule_transfer import TransferCurve
from runwatch.expect.size_scaling import scale_to

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
"""The relative drift per square root of an e-fold of steps (``drift_span``) assumed when
the family cannot measure its own (a single run)."""


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
    """Relative drift per ``drift_span`` of a run's level against the family's curve
    after it is measured (leave-one-out at a quarter of each run's steps, RMS;
    ``runwatch.expect.family_fit``)."""
    measured: dict[str, int] = field(default_factory=dict)
    """How many leave-one-out errors each figure rests on (0: the default assumed)."""
    size_laws_alike: tuple[str, ...] = ()
    """The other size laws whose leave-one-out errors cannot be told from the chosen one's
    (``runwatch.expect.family_fit``): the band reaches what they expect too."""
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
        """The 90% half-width, relative per ``drift_span``, of the drift (``drift_rel``)."""
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
        dist = 0.0 if x.min() <= math.log(params) <= x.max() else efolds_beyond(params, x)
        if len(self.sizes) == 1 and abs(math.log(params) - x[0]) > SAME_SIZE:
            dist = max(dist, abs(math.log(params) - x[0]))
        return dist


T90 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812)
"""Student-t 95% quantiles for 1..10 degrees of freedom (a two-sided 90% band)."""


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


def efolds_beyond(params: float, x: np.ndarray) -> float:
    """E-folds of size from the family's range to ``params`` (0 inside it)."""
    lp = math.log(params)
    return float(max(lp - x.max(), x.min() - lp, 0.0))


def areas_at(
    lr_steps: np.ndarray, lr_share: np.ndarray, upto: int
) -> tuple[np.ndarray, np.ndarray]:
    """S1 and S2 at every step 0..upto of an LR given as a share of its peak."""
    return lr_areas(lr_steps, lr_share, int(upto))


def drift_span(steps: np.ndarray, seen: int) -> np.ndarray:
    """How far a run's level against its family's curve may have drifted from step ``seen``
    by each of ``steps``, in units of the family's drift: the square root of the e-folds of
    steps between (0 up to ``seen``), as a random walk in log steps. Levels wander and
    settle (bumps mid-run, a last quarter that still moves), so a short span late in a run
    drifts more than its share of a long one (``bench/README-forecast-family.md``)."""
    start = max(int(seen), 1)
    return np.sqrt(np.log(np.maximum(np.asarray(steps, dtype=float), start) / start))


def final_value(m: Member) -> float:
    """A run's final value: the median of its last few points (one noisy point is not it)."""
    order = np.argsort(m.steps)
    tail = m.values[order][np.isfinite(m.values[order])][-5:]
    return float(np.median(tail))


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
    spread = residual_sigma(logs) if logs.size > 2 else prior_sd
    return float(np.median(logs)), max(spread / math.sqrt(logs.size), 1e-4)
