"""Schedule transfer within one model size: a base curve over the LR's forward area, times
what annealing is worth, both read off the family's own runs.

The base B(S1) is the loss of the points no decay has lowered yet (annealing area S2 below
``UNANNEALED``): a constant-LR run, and every run before its decay. What annealing is worth
is the ratio R(S2) = loss / B(S1) of the annealed points, by S2. A plan's expected loss is
B(S1)·R(S2) at its own areas, so schedules are lined up by the LR's progress, not by step.
Beyond the points' reach B follows the LR-annealing law (``runwatch.expect.lrlaw``), joined
to them, and R holds at the most annealing a run reached: a longer decay of the same depth
is expected to be worth no more than the runs saw (``bench/README-forecast-family.md``);
what the law would credit it with, or, when no run annealed, the single-run forecast's
allowance for an unseen anneal, is the band's to hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runwatch.expect.binning import bin_arrays
from runwatch.expect.forecast import ANNEAL_ALLOWANCE
from runwatch.expect.lrlaw import AreaLaw

UNANNEALED = 1.0
"""A point whose annealing area S2 is below this (a tenth of the LR's peak dropped for ten
steps, or less) has not been lowered by a decay: it measures the base curve."""


@dataclass(frozen=True)
class TransferCurve:
    """The base curve's knots (log S1, loss), the anneal ratio's knots (S2 from 0, ratio
    from 1), and the law fitted on the same points, which carries the base beyond its
    knots and says what annealing beyond the ratio's reach would earn."""

    law: AreaLaw
    base: tuple[np.ndarray, np.ndarray]
    anneal: tuple[np.ndarray, np.ndarray]
    base_reach: float = 0.0
    """The largest S1 the base is read off the runs at (without base points, the largest
    the law was fitted at): beyond it the base is the law's extrapolation."""

    @property
    def anneal_reach(self) -> float:
        """The largest annealing area S2 the runs reached."""
        return float(self.anneal[0][-1])

    def predict(self, s1: np.ndarray, s2: np.ndarray, law_credit: bool = False) -> np.ndarray:
        """The loss expected at a plan's areas ``s1``, ``s2`` (in step order). With
        ``law_credit``, annealing beyond the runs' reach earns what the law's C·S2 says
        instead of nothing more; when no run annealed at all, the law knows nothing of it
        either, and the plan's annealing earns up to ``ANNEAL_ALLOWANCE`` by its end."""
        s1 = np.maximum(np.asarray(s1, dtype=float), 1e-9)
        s2 = np.asarray(s2, dtype=float)
        kx, ky = self.anneal
        expected = self._base(s1) * np.interp(s2, kx, ky)
        if not law_credit:
            return expected
        if self.anneal_reach > 0:
            return expected - self.law.C * np.maximum(s2 - self.anneal_reach, 0.0)
        full = float(s2.max(initial=0.0))
        if full < UNANNEALED:
            return expected
        return expected * (1.0 - ANNEAL_ALLOWANCE * np.clip(s2 / full, 0.0, 1.0))

    def _base(self, s1: np.ndarray) -> np.ndarray:
        """B(S1): the base points inside their reach, the law with no anneal beyond it,
        shifted to meet them."""
        plain = self.law.predict_areas(s1, np.zeros_like(s1))
        kx, ky = self.base
        if kx.size == 0:
            return plain
        x = np.log(s1)
        ends = self.law.predict_areas(np.exp(kx[[0, -1]]), np.zeros(2))
        below = plain + ky[0] - ends[0]
        above = plain + ky[-1] - ends[1]
        return np.where(x < kx[0], below, np.where(x > kx[-1], above, np.interp(x, kx, ky)))


def transfer_curve(
    s1: np.ndarray, s2: np.ndarray, values: np.ndarray, law: AreaLaw
) -> TransferCurve:
    """The curve of one size from its runs' (binned) points at areas ``s1``, ``s2``."""
    s1 = np.maximum(np.asarray(s1, dtype=float), 1e-9)
    s2 = np.asarray(s2, dtype=float)
    y = np.asarray(values, dtype=float)
    flat = s2 < UNANNEALED
    bs, bv, _ = bin_arrays(s1[flat], y[flat])
    no_anneal = (np.array([0.0]), np.array([1.0]))
    reach = float(bs.max()) if bs.size else float(s1.max(initial=0.0))
    curve = TransferCurve(law, (np.log(bs), bv), no_anneal, reach)
    if flat.all():
        return curve
    below = curve._base(s1[~flat])
    ok = (below > 0) & (y[~flat] > 0)  # a ratio says nothing across zero
    rs, rv, _ = bin_arrays(s2[~flat][ok], y[~flat][ok] / below[ok])
    return TransferCurve(law, curve.base, (np.r_[0.0, rs], np.r_[1.0, rv]), reach)
