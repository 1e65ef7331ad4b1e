"""Stall: the loss stops improving at the pace its own earlier progress predicts."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from runwatch.detect._stall_core import StallCore
from runwatch.detect.base import (
    Detector,
    LRAware,
    Signal,
    check_lengths,
    check_number,
    signals_of,
)

_NAN = math.nan


class Stall(LRAware, Detector):
    """The (log) loss stops falling where its own earlier progress says it should fall.

    In log-step space a power law is close to a straight line over an octave or two, and
    a loss curve bends slowly, so the run's own recent past predicts its near future. The
    detector keeps bin means of the (log) loss on log-spaced steps (``per_octave`` bins per
    doubling, bounded memory) and two adjacent windows of the last ``2 W`` points, ``W`` =
    ``window_frac`` of the points seen (between ``min_window`` and ``max_window``). The
    reference slope is a least-squares line of the bin means against ln(step) over the
    ``ref_octaves`` octaves before the older window; the expected fall from the older to the
    newer window is that slope times the distance between their mean ln(step). The observed
    fall is the difference of the two window means (each point first clipped to the running
    median of 5 ± 3 noise sigmas, so a spike barely moves a mean). It flags (warning) when,
    for ``patience`` points in a row, the expected fall is clear of the noise - ``z``
    standard errors of the window-mean difference (noise: the robust scale of first
    differences), ``z_resid`` robust sigmas of the statistic's own past scatter on unflagged
    stretches (autocorrelated noise, curvature), and ``min_fall`` - and the observed fall
    is below ``stall_frac`` of it. A loss that rises is flagged too (it is not improving).

    An octave test runs beside it (``long_test``), for slow curves whose short windows
    cannot tell a plateau from noise: the same comparison between the older and the newer
    half of the last octave of steps (log-spaced bins of every point, bounded memory), with
    the reference slope from the learned bins before that octave and ``long_z_resid``
    robust sigmas of its own past scatter (the last two octaves of it), from
    ``long_min_points`` points on. Half an octave of points averages the noise
    down far more than a window of ``window_frac`` of the points, so a plateau on a noisy,
    slowly falling curve is found - later, but found.

    Catches: silent plateaus (a frozen layer, data stuck on a few shards, an LR stuck at 0
    that is not logged), from a few hundred points after they start, whatever the level
    of a fitted curve.
    Misses: a plateau while the loss was already nearly flat (the expected fall is then
    within the noise; on a warmup-stable-decay schedule that is the whole stable phase,
    until the decay that the plateau skips shows it); a slowdown to more than
    ``stall_frac`` of the expected pace; the first ``long_min_points`` points. Without a
    logged LR, a schedule that flattens the loss on purpose (a step decay, an LR annealed
    to zero at the very end) looks like a stall.

    LR schedules: once the run's learning rate is known (``use_lr``: the Monitor hands
    each loss series the run's :class:`~runwatch.expect.LRClock`), progress is measured
    against ln(S1), the summed LR, in place of ln(step): a step decay to 1% of the LR, or
    an LR annealed to zero, slows the loss on purpose and is then expected. When the LR
    first arrives the detector starts afresh. (An LR stuck at zero is then no stall either:
    ``LRSanity`` on the LR series reports it.)

    Baseline protection: while a stall is flagged, its points are not binned, so the
    reference slope stays the one from before the stall. The cost: after ``adapt_after``
    flagged points the detector forgets its reference and learns the curve afresh.

    Parameters
    ----------
    window_frac : float
        Each window's length as a fraction of the points seen, in [0.001, 0.5].
    min_window, max_window : int
        Bounds of a window's length in points (``min_window`` >= 4).
    ref_octaves : float
        Octaves of learned bins the reference slope is fitted over.
    stall_frac : float
        Flag while the observed fall is below this fraction of the expected one.
    z : float
        Standard errors of the window-mean difference the expected fall must exceed.
    z_resid : float
        Robust sigmas of the window test's own past scatter it must exceed too.
    min_fall : float
        Smallest expected fall (in log units while the loss is positive) worth judging.
    patience : int
        Consecutive points the test must hold before a point is flagged.
    min_points : int
        Points seen before the window test runs (at least ``2 * min_window``).
    per_octave : int
        Log-spaced bins per doubling of the step, in [1, 64].
    adapt_after : int
        Flagged points after which the reference is forgotten and learned afresh.
    long_test : bool
        Run the octave test beside the window test.
    long_z_resid : float
        Robust sigmas of the octave test's own past scatter it must exceed.
    long_min_points : int
        Points seen before the octave test runs.

    Examples
    --------
    >>> import random
    >>> rng = random.Random(4)
    >>> d = Stall()
    >>> s = range(1, 4001)
    >>> curve = [2.0 + 9.0 * i ** -0.4 * (1 + 0.005 * rng.gauss(0, 1)) for i in s]
    >>> curve[2000:] = [curve[1999] * (1 + 0.005 * rng.gauss(0, 1)) for _ in range(2000)]
    >>> hits = [(i, sig.severity) for i, v in zip(s, curve) if (sig := d.update(i, v))]
    >>> hits[0][0] > 2000, hits[0][1]
    (True, 'warning')
    """

    name = "stall"
    quiet = 50

    def __init__(
        self,
        window_frac: float = 0.07,
        min_window: int = 30,
        max_window: int = 1000,
        ref_octaves: float = 1.5,
        stall_frac: float = 0.25,
        z: float = 4.0,
        z_resid: float = 3.0,
        min_fall: float = 0.002,
        patience: int = 20,
        min_points: int = 1000,
        per_octave: int = 8,
        adapt_after: int = 5000,
        long_test: bool = True,
        long_z_resid: float = 1.5,
        long_min_points: int = 500,
    ) -> None:
        check_number("window_frac", window_frac, low=0.001, high=0.5)
        check_number("min_window", min_window, low=4, integer=True)
        check_number("max_window", max_window, low=min_window, integer=True)
        check_number("ref_octaves", ref_octaves, low=0.25, high=10.0)
        check_number("stall_frac", stall_frac, low=0.0, high=1.0)
        check_number("z", z, low=0.0)
        check_number("z_resid", z_resid, low=0.0)
        check_number("min_fall", min_fall, low=0.0)
        check_number("patience", patience, low=1, integer=True)
        check_number("min_points", min_points, low=2 * min_window, integer=True)
        check_number("per_octave", per_octave, low=1, high=64, integer=True)
        check_number("adapt_after", adapt_after, low=1, integer=True)
        self.window_frac = window_frac
        self.min_window = min_window
        self.max_window = max_window
        self.ref_octaves = ref_octaves
        self.stall_frac = stall_frac
        self.z = z
        self.z_resid = z_resid
        self.min_fall = min_fall
        self.patience = patience
        self.min_points = min_points
        self.per_octave = per_octave
        self.adapt_after = adapt_after
        self.long_test = long_test
        self.long_z_resid = long_z_resid
        self.long_min_points = long_min_points
        super().__init__()

    def _reset(self) -> None:
        self._core = StallCore(
            self.window_frac,
            self.min_window,
            self.max_window,
            self.ref_octaves,
            self.stall_frac,
            self.z,
            self.z_resid,
            self.min_fall,
            self.patience,
            self.min_points,
            self.per_octave,
            self.adapt_after,
            self.long_test,
            self.long_z_resid,
            self.long_min_points,
        )

    @property
    def stalls(self) -> int:
        """How many stalls were declared."""
        return self._core.stalls

    @property
    def n_bins(self) -> tuple[int, int]:
        """How many log-spaced bins the detector holds: (learned, every point's)."""
        return self._core.n_bins

    def update(self, step: int, value: float) -> Signal | None:
        ar = self._areas_now(step)
        rec = self._core.update(step, value, _NAN if ar is None else ar[0])
        return None if rec is None else self._signal(value, rec)

    def update_many(
        self,
        steps: Sequence[int],
        values: Sequence[float],
        on_error: Callable[[int], None] | None = None,
        areas: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> list[tuple[int, Signal]]:
        """``update`` point by point, in the core's compiled loop over the series.

        ``areas``: each point's LR areas as the clock gave them live (NaN before the LR;
        see ``CurveDeviation.update_many``); required once the detector's clock has the
        LR.
        """
        self._need_areas(areas)
        check_lengths(steps, values)
        s1 = None if areas is None else areas[0]
        records = self._core.update_many(steps, values, s1, on_error)
        return signals_of(records, values, self._signal, on_error)

    def _signal(self, value: float, rec: tuple) -> Signal:
        """A stall's signal from the core's flag record: the fall over the last ``w``
        points, or over the last octave (the octave test flagged it)."""
        long, w, d_exp, d_obs, level_a, now, log = rec
        span = "the last octave" if long else f"the last {w} points"
        exp_now = level_a - d_exp
        upper = level_a - self.stall_frac * d_exp
        if log:
            now, exp_now, upper = math.exp(now), math.exp(exp_now), math.exp(upper)
        score = d_exp / max(d_obs, 1e-12) if d_obs > 0 else 1000.0
        msg = (
            f"loss stopped improving: fell {d_obs:.3g} over {span} where its "
            f"earlier progress predicts {d_exp:.3g}" + (" (log units)" if log else "")
        )
        return Signal(
            "warning",
            min(score, 1000.0),
            value,
            exp_now,
            None,
            upper,
            msg,
            {"smoothed": now, "expected_fall": d_exp, "fall": d_obs, "window": w},
        )
