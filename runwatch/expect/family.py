"""The expected curve from a recipe's family: earlier runs at other sizes and schedules.

One LR-annealing law (``runwatch.expect.lrlaw``: L = E + A·S1^-α - C·S2) is fitted per
model size, jointly over that size's runs: their schedules differ, their law does not, so
a constant-LR and a short cosine run teach what annealing is worth, and the law then
predicts another schedule or length of the same model from its LR alone (schedule
transfer; lined up by the LR's areas, not by raw step). Across sizes, the log loss at every
step of the target's schedule is a straight line in log(params), fitted over the sizes the
family has (a Kaplan-form law per step; ``bench/README-forecast-family.md`` measures the
alternatives). The band comes from the family's own leave-one-out errors: each schedule
predicted from the others of its size, each size from the smaller ones.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from runwatch.expect.binning import bin_arrays
from runwatch.expect.lrlaw import AreaLaw, fit_area_law, lr_areas
from runwatch.expect.powerlaw import MIN_POINTS, TooLittleData

log = logging.getLogger("runwatch.expect.family")

FIT_FROM = 0.1
"""A member's points before this share of its steps are left out of its size's fit: the
warmup and first fast drop say little about where a run ends."""

SAME_SIZE = 0.02
"""Runs whose parameter counts differ by less than this share are one size."""

TRANSFER_REL = 0.01
"""The relative error assumed for a schedule transfer when the family cannot measure its
own (one run per size): the LR-annealing law's error on the real families' held-out
schedules (``bench/README-forecast-family.md``)."""

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
    """The law of one model size, fitted over the family's runs of that size."""

    params: float
    law: AreaLaw
    runs: tuple[str, ...]

    def predict(self, s1: np.ndarray, s2: np.ndarray) -> np.ndarray:
        return self.law.predict_areas(s1, s2)


@dataclass(frozen=True)
class FamilyFit:
    """The family's laws by size, and the relative errors measured on its own runs."""

    sizes: tuple[SizeLaw, ...]
    transfer_rel: float
    """Relative error of a schedule transfer (leave-one-schedule-out, RMS)."""
    size_rel_per_efold: float
    """Relative error per e-fold of size extrapolation (leave-the-largest-out, RMS)."""
    measured: dict[str, bool] = field(default_factory=dict)
    """Which of the two errors the family measured itself (False: the default assumed)."""

    @property
    def params(self) -> np.ndarray:
        return np.array([s.params for s in self.sizes])

    def expected(self, params: float, s1: np.ndarray, s2: np.ndarray) -> np.ndarray:
        """The loss a run of ``params`` is expected to have at the given LR areas."""
        preds = np.array([s.predict(s1, s2) for s in self.sizes])
        if len(self.sizes) == 1:
            return preds[0]
        x = np.log(self.params)
        logs = np.log(np.maximum(preds, 1e-12))
        slope, icept = _line(x, logs)
        return np.exp(icept + slope * math.log(params))

    def half_width(self, params: float) -> float:
        """The 90% band's half-width, relative, of a forecast made before the run starts."""
        x = np.log(self.params)
        dist = 0.0 if x.min() <= math.log(params) <= x.max() else _efolds(params, x)
        if len(self.sizes) == 1 and abs(math.log(params) - x[0]) > SAME_SIZE:
            dist = max(dist, abs(math.log(params) - x[0]))
        rel = math.hypot(self.transfer_rel, self.size_rel_per_efold * dist)
        return Z90 * rel


def _efolds(params: float, x: np.ndarray) -> float:
    """E-folds of size from the family's range to ``params`` (0 inside it)."""
    lp = math.log(params)
    return float(max(lp - x.max(), x.min() - lp, 0.0))


def _line(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares slope and intercept of ``y`` (sizes x steps) over ``x`` (sizes)."""
    xm = x.mean()
    dx = x - xm
    slope = (dx[:, None] * (y - y.mean(axis=0))).sum(axis=0) / float((dx * dx).sum())
    return slope, y.mean(axis=0) - slope * xm


def areas_at(
    lr_steps: np.ndarray, lr_share: np.ndarray, upto: int
) -> tuple[np.ndarray, np.ndarray]:
    """S1 and S2 at every step 0..upto of an LR given as a share of its peak."""
    return lr_areas(lr_steps, lr_share, int(upto))


def _size_law(members: list[Member]) -> SizeLaw:
    """One law fitted jointly over the runs of one size (their binned later points)."""
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
    return SizeLaw(params, law, tuple(m.name for m in members))


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
    s1, s2 = areas_at(m.lr_steps, m.lr_share, m.last_step)
    idx = np.array([m.last_step])
    return float(fit.expected(m.params, s1[idx], s2[idx])[0])


def fit_family(members: list[Member]) -> FamilyFit:
    """Fit the family's laws and measure its own errors by leaving runs out."""
    if not members:
        raise ValueError("a family needs at least one run")
    groups = _by_size(members)
    sizes = tuple(_size_law(g) for g in groups)
    transfer = _transfer_errors(groups)
    size_errs = _size_errors(groups, sizes)
    measured = {"transfer": bool(transfer), "size": bool(size_errs)}
    transfer_rel = _rms(transfer) if transfer else TRANSFER_REL
    size_rel = _rms(size_errs) if size_errs else SIZE_REL_PER_EFOLD
    return FamilyFit(sizes, transfer_rel, size_rel, measured)


def _rms(errors: list[float]) -> float:
    return float(math.sqrt(np.mean(np.square(errors))))


def _transfer_errors(groups: list[list[Member]]) -> list[float]:
    """Each run of a size with several, predicted from the others of its size (relative)."""
    errors = []
    for group in groups:
        if len(group) < 2:
            continue
        for i, held in enumerate(group):
            rest = group[:i] + group[i + 1 :]
            try:
                law = FamilyFit((_size_law(rest),), 0.0, 0.0)
            except ValueError:
                continue
            errors.append(_predict_final(law, held) / final_value(held) - 1.0)
    return errors


def _size_errors(groups: list[list[Member]], sizes: tuple[SizeLaw, ...]) -> list[float]:
    """Each size from the third on, predicted from the smaller sizes: relative error per
    e-fold of extrapolation, for every run of that size."""
    errors = []
    for k in range(2, len(groups)):
        smaller = FamilyFit(sizes[:k], 0.0, 0.0)
        dist = _efolds(sizes[k].params, np.log(smaller.params))
        for m in groups[k]:
            err = _predict_final(smaller, m) / final_value(m) - 1.0
            errors.append(err / max(dist, 0.5))
    return errors
