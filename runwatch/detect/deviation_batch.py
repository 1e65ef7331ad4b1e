"""CurveDeviation's batch path: ``CurveDeviation.update_many`` without ``update`` calls.

Kept apart from the detector because only batch replay needs it; every figure here is
formed by the same float operations in the same order as ``CurveDeviation.update``
forms it (``tests/detect/test_batch.py`` checks signals and state bit for bit).
"""

from __future__ import annotations

import math
from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np

from runwatch.detect.base import ema_many, running_medians, smooth_many, smoothed_state
from runwatch.expect.lrlaw import AreaLaw

if TYPE_CHECKING:
    from runwatch.detect.deviation import CurveDeviation


class Batch:
    """One ``CurveDeviation.update_many`` call: the smoothing of every finite point of the
    batch, computed up front, and the stretches that need no ``update`` call.
    ``areas``: each point's LR areas (NaN before the LR), or None without an LR clock."""

    def __init__(
        self,
        d: CurveDeviation,
        st: np.ndarray,
        x: np.ndarray,
        steps: list,
        areas: tuple[np.ndarray, np.ndarray] | None,
    ) -> None:
        self.d = d
        self.st = st
        self.x = x
        self.steps = steps
        self.s1l: list[float] | None = None
        self.s2l: list[float] | None = None
        self.first_area: int | None = None
        if areas is not None:
            self.s1, self.s2 = areas
            self.s1l, self.s2l = self.s1.tolist(), self.s2.tolist()
            known = np.flatnonzero(~np.isnan(self.s1))
            self.first_area = int(known[0]) if known.size else None
        self.n0 = d._n
        self.recent0 = list(d._recent)
        xl = x.tolist()
        self.xl = xl
        self.ema, self.ad = _smooth_many(d, x, xl)
        self.ema_l = self.ema.tolist()

    def areas(self, j: int) -> tuple[float, float] | None:
        """Point ``j``'s areas as ``update`` takes them (None before the LR)."""
        if self.s1l is None:
            return None
        s1 = self.s1l[j]
        return None if s1 != s1 else (s1, self.s2l[j])

    def set_smooth(self, j: int) -> None:
        """Put the smoothing state where ``update`` leaves it after the first ``j`` points."""
        smoothed_state(self.d, self.n0, self.xl, self.ad, self.ema, self.recent0, 5, j)

    def learn_all(self, a: int, b: int) -> int:
        """Points a..b-1 without a law: ``update`` learns each of them."""
        d = self.d
        d._exp_ema = math.nan
        d._over = d._under = d._flagged = 0
        self._learn(np.arange(a, b))
        return b

    def _learn(self, idx: np.ndarray) -> None:
        if idx.size == 0:
            return
        d = self.d
        il = idx.tolist()
        extra = (self.s1[idx], self.s2[idx]) if d._by_area else ()
        d._bins.add_many([self.steps[i] for i in il], self.x[idx], *extra)
        top = self.steps[il[-1]]  # steps are in order: the last is the largest
        if top > d._last_learned:
            d._last_learned = float(top)

    def quiet_stretch(self, a: int, b: int, out: list, idx: np.ndarray, values) -> int:
        """Run points a..b-1 as ``update`` would while none rises above the band, stalls
        or jumps too far; return where that stops, with the state moved up to it. Points
        below the band count as ``update`` counts them, and ``(index, signal)`` for those
        flagged ("better than expected") go to ``out``."""
        d = self.d
        law = d._law
        assert law is not None
        st = self.st[a:b]
        stf = st.astype(float)
        ema = self.ema[a:b]
        n = b - a
        now = self._parts(law, stf, a, b)
        exp_v = ema_many(d._exp_ema, now + law.E, d._alpha, d._beta)
        sigma = 0.886 * self.ad[a:b] * d._ema_sd
        fs = d._fit_step
        extrap = np.array(list(map(math.log, (np.maximum(stf, fs) / fs).tolist())))
        half = np.maximum(
            d.band_sigmas * sigma,
            (d.rel_margin + d._val_err + d.extrap_rel * extrap) * np.abs(exp_v),
        )
        fall = now
        seen = np.ones(n, dtype=bool)
        if isinstance(law, AreaLaw):
            half += d.unseen_anneal * law.C * np.maximum(self.s2[a:b] - d._s2_seen, 0.0)
            seen = self.s2[a:b] <= d._s2_seen
            fall = np.array(list(map(law.forward, self.s1l[a:b])))
        stop = ema > exp_v + half
        learn = ema <= exp_v + d.learn_frac * half
        # Beyond twice the last learned step (before this point): update drops the law.
        prev_top = np.maximum.accumulate(np.where(learn, stf, -math.inf))
        top = np.maximum(np.concatenate(([-math.inf], prev_top[:-1])), d._last_learned)
        stop |= stf > 2.0 * top
        # The slope test against the hist entry ``stall_window`` - 1 places back.
        hist, w = d._hist, d.stall_window
        h0 = len(hist)
        j0 = max(0, w - h0)  # the first point whose test runs (hist is full then)
        if j0 < n:
            q0 = h0 + j0 + 1 - w  # its entry's index in hist + this stretch
            old = hist[q0 : q0 + n - j0]
            s0 = max(q0 - h0, 0)
            s1 = s0 + n - j0 - len(old)
            then_s = np.concatenate((np.array([h[0] for h in old], dtype=float), stf[s0:s1]))
            then_e = np.concatenate((np.array([h[1] for h in old]), ema[s0:s1]))
            then = np.concatenate((_hist_falls(law, old), fall[s0:s1]))
            d_exp = then - fall[j0:]
            e_now = ema[j0:]
            d_obs = then_e - e_now
            need = np.maximum(
                d.band_sigmas * math.sqrt(2.0) * sigma[j0:], d.stall_min * np.abs(e_now)
            )
            stop[j0:] |= (then_s < stf[j0:]) & (d_exp > need) & (d_obs < d.stall_frac * d_exp)
        c = int(np.argmax(stop)) if stop.any() else n
        if c == 0:
            return a
        # Below the band: a run of points counts up, and from ``patience`` on it is info.
        below = ((ema[:c] < exp_v[:c] - half[:c]) & seen[:c]).astype(np.int64)
        if below.any():
            run = np.cumsum(below)
            reset = np.maximum.accumulate(np.where(below == 0, run, -1))
            count = np.where(reset >= 0, run - reset, run + d._under) * below
            d._under = int(count[-1])
            for j in np.flatnonzero(count >= d.patience).tolist():
                d._under = int(count[j])
                sig = d._signal(
                    "info", self.steps[a + j], values[int(idx[a + j])], float(ema[j]),
                    float(exp_v[j]), float(half[j]), "below",
                )  # fmt: skip
                out.append((int(idx[a + j]), sig))
            d._under = int(count[-1])
        else:
            d._under = 0
        keep = min(c, w)
        lo, hi = a + c - keep, a + c
        new = list(
            zip(
                self.steps[lo:hi], self.ema_l[lo:hi],
                self.s1l[lo:hi] if self.s1l is not None else [math.nan] * (hi - lo),
                strict=True,
            )
        )  # fmt: skip
        d._hist = (hist + new)[-w:] if h0 + keep > w else hist + new
        d._exp_ema = float(exp_v[c - 1])
        self._learn(a + np.flatnonzero(learn[:c]))
        return a + c

    def _parts(self, law, stf: np.ndarray, a: int, b: int) -> np.ndarray:
        """The law less its constant at points a..b-1, as ``update`` forms each."""
        if isinstance(law, AreaLaw):
            return np.array(list(map(law.part, self.s1l[a:b], self.s2l[a:b])))
        return _power_parts(law, stf)


def _power_parts(law, steps: np.ndarray) -> np.ndarray:
    """A·max(step + s0, 1e-9)^-α with Python's pow, as ``update`` computes it."""
    return law.A * _pow(np.maximum(steps + law.s0, 1e-9), -law.alpha)


def _hist_falls(law, hist: list[tuple[int, float, float]]) -> np.ndarray:
    """What the slope test takes of the law at ``hist`` entries (see ``_stall_check``)."""
    if isinstance(law, AreaLaw):
        return np.array([law.forward(h[2]) for h in hist])
    return _power_parts(law, np.array([h[0] for h in hist], dtype=float))


def _pow(base: np.ndarray, exp: float) -> np.ndarray:
    """``base ** exp`` element by element with Python's float pow (numpy's may differ)."""
    return np.array(list(map(pow, base.tolist(), repeat(exp))))


def _smooth_many(
    d: CurveDeviation, x: np.ndarray, xl: list[float]
) -> tuple[np.ndarray, np.ndarray]:
    """The loss EMA and the noise EMA after each of ``x`` (``xl``: as a list), as
    ``_smooth`` forms them."""
    k = 1 if d._n == 0 else 0  # the first point of the series only starts the EMA
    e = float(x[0]) if k else d._ema
    meds = running_medians(d._recent, xl, 5)
    prev = d._prev if d._n else x[0]
    diffs = np.abs(np.diff(np.concatenate(([prev], x))))
    ads, emas = smooth_many(d._absdiff, e, d._alpha, d._beta, diffs[k:], meds[k:])
    if k:
        return np.concatenate(([e], emas)), np.concatenate(([d._absdiff], ads))
    return emas, ads
