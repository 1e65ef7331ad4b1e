# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Regression's state and per-point step, compiled (the one definition of both).

``regression.Regression`` is the public face: it validates the parameters, builds this
core, and turns the flag records into Signals. Live watching (``update``) and batch
replay (``update_many``, see ``_valuecore.ValueCore``) run the same ``_step``.
"""

cimport cython
from libc.math cimport INFINITY, NAN, exp, isfinite, isnan, log

from runwatch._pyfloat cimport Window, window_push
from runwatch.detect._valuecore cimport (
    FLAGGED, OVERFLOW, QUIET, ZERO_SCALE, Outcome, SortedWindow, ValueCore,
)

DEF NSCALES = 3
DEF MAXLAG = 256  # the most entries a shift waits before it is learned


cdef inline double _quantile(Window* w, double q) noexcept nogil:
    """``sorted(values)[min(n - 1, int(q * n))]`` (n >= 1)."""
    cdef Py_ssize_t j = <Py_ssize_t>(q * w.n)
    return w.srt[j if j < w.n else w.n - 1]


@cython.final
cdef class RegressionCore(ValueCore):
    """CUSUM of clipped robust z against a baseline window, on log values turned so that
    "worse" is positive; and, per time scale, the run's own history of how far the
    median of the last ``scale`` points strays from the baseline (the calibration).

    A flag record is ``(change, cusum, points, center, scale, unusual, shift, usual,
    at)``: the relative worsening of the recent median, the CUSUM, how many points in a
    row are flagged, the baseline's median and robust scale (log units), whether some
    time scale's shift passed its calibrated threshold, and for the time scale ``at``
    that came nearest to (or furthest past) its threshold: its shift and its threshold
    (log units), all as they were when the point was flagged (before adapting to a
    lasting change).

    The parameters are ``Regression``'s, in its order, but for ``persist``,
    ``warn_change``, ``critical_change`` and ``critical_after`` (the Signal's business),
    with ``warn_floor`` = log(1 + ``warn_change``); ``Regression`` validates them.
    """

    cdef SortedWindow buf, rec
    cdef double sign, k, h, clip, min_scale, min_change
    cdef Py_ssize_t min_points, adapt_after
    cdef double center, scale, _cusum
    cdef Py_ssize_t since, flagged, _changes
    cdef double f_change, f_cusum, f_center, f_scale  # the last flagged point's record
    cdef Py_ssize_t f_points
    # the calibration: per time scale the last ``scales[i]`` values and a history of shifts
    cdef SortedWindow w0, w1, w2, h0, h1, h2, hp
    cdef Py_ssize_t sc[NSCALES]
    cdef double quantile, margin, warn_floor, noise_quantile, noise_margin
    cdef Py_ssize_t min_history, stride, tick, lag, p_head, p_n
    cdef double pend[MAXLAG][NSCALES + 1]  # shifts waiting to be learned (NaN: none)
    cdef bint f_unusual
    cdef double f_shift, f_usual
    cdef Py_ssize_t f_at

    def __init__(
        self,
        bint higher_is_better,
        Py_ssize_t window,
        Py_ssize_t recent,
        double k,
        double h,
        double clip,
        double min_scale,
        double min_change,
        Py_ssize_t min_points,
        Py_ssize_t adapt_after,
        tuple scales,
        Py_ssize_t history,
        Py_ssize_t stride,
        double quantile,
        double margin,
        Py_ssize_t min_history,
        double warn_floor,
        double noise_quantile,
        double noise_margin,
        Py_ssize_t lag,
    ) -> None:
        self.sign = -1.0 if higher_is_better else 1.0
        self.buf, self.rec = SortedWindow(window), SortedWindow(recent)
        self.k, self.h, self.clip = k, h, clip
        self.min_scale, self.min_change = min_scale, min_change
        self.min_points, self.adapt_after = min_points, adapt_after
        self.center, self.scale, self._cusum = 0.0, min_scale, 0.0
        self.since = self.flagged = self._changes = 0
        self.sc[0], self.sc[1], self.sc[2] = scales
        self.w0, self.w1, self.w2 = (
            SortedWindow(scales[0]), SortedWindow(scales[1]), SortedWindow(scales[2])
        )
        self.h0, self.h1, self.h2, self.hp = (
            SortedWindow(history), SortedWindow(history), SortedWindow(history),
            SortedWindow(history),
        )
        self.noise_quantile, self.noise_margin = noise_quantile, noise_margin
        self.stride, self.quantile, self.margin = stride, quantile, margin
        self.min_history, self.warn_floor = min_history, warn_floor
        self.tick = 0
        self.lag, self.p_head, self.p_n = lag, 0, 0
        self.f_unusual, self.f_shift, self.f_usual, self.f_at = False, 0.0, 0.0, 0

    @property
    def cusum(self) -> float:
        """The CUSUM of clipped robust z (0 after adapting to a lasting change)."""
        return self._cusum

    @property
    def changes(self) -> int:
        """How many regressions were declared."""
        return self._changes

    def usual(self, Py_ssize_t i):
        """The calibrated threshold of time scale ``i`` (log units), or None before the
        history holds ``min_history`` shifts."""
        cdef SortedWindow hist = (self.h0, self.h1, self.h2)[i]
        if hist.size() < self.min_history:
            return None
        return self._threshold(&hist.w)

    cdef double _threshold(self, Window* hist) noexcept nogil:
        """``margin`` x the ``quantile`` of the scale's past shifts, floored at
        ``warn_floor`` and at ``noise_margin`` x the ``noise_quantile`` of single points'
        shifts (the history holds ``min_history`` shifts or more)."""
        cdef double q = self.margin * _quantile(hist, self.quantile)
        cdef double p = self.noise_margin * _quantile(&self.hp.w, self.noise_quantile)
        q = q if q > p else p
        return q if q > self.warn_floor else self.warn_floor

    cdef void _refresh(self) noexcept nogil:
        """The baseline's center and scale from the baseline window."""
        cdef double med, mad, s
        self.buf.median_mad(&med, &mad)
        s = 1.4826 * mad
        self.center = med
        self.scale = self.min_scale if self.min_scale > s else s

    cdef void _learn(self, double d) noexcept nogil:
        """Add ``d`` to the baseline (refreshed every 8 points, every point at first)."""
        self.buf.push(d)
        self.since += 1
        if self.since >= 8 or self.buf.size() <= self.min_points:
            self.since = 0
            self._refresh()

    cdef bint _judge(self) noexcept nogil:
        """Judge each full time scale's shift (its median minus the baseline's) against
        its calibrated threshold and record the scale nearest to or furthest past it
        (only flagged points are judged). True: one is unusual."""
        cdef Window* wins[NSCALES]
        cdef Window* hists[NSCALES]
        cdef Py_ssize_t i
        cdef double r, t, best = -INFINITY
        cdef bint unusual = False
        wins[0], wins[1], wins[2] = &self.w0.w, &self.w1.w, &self.w2.w
        hists[0], hists[1], hists[2] = &self.h0.w, &self.h1.w, &self.h2.w
        self.f_shift, self.f_usual, self.f_at = 0.0, self.warn_floor, 0
        for i in range(NSCALES):
            if wins[i].n < self.sc[i]:
                continue
            r = wins[i].srt[wins[i].n // 2] - self.center
            # Not calibrated yet: nothing is unusual (the threshold is infinite).
            t = self._threshold(hists[i]) if hists[i].n >= self.min_history else INFINITY
            if r > t:
                unusual = True
            if r - t > best or (i == 0 and t == INFINITY):
                best = r - t
                self.f_shift, self.f_usual, self.f_at = r, t, i
        return unusual

    cdef void _track(self, double d) noexcept nogil:
        """Every ``stride`` points, queue each full scale's shift and this point's for the
        histories (all of them: a burst that recurs is usual for the run)."""
        cdef Window* wins[NSCALES]
        cdef Py_ssize_t i
        cdef double shifts[NSCALES]
        self.tick += 1
        if self.tick < self.stride:
            return
        self.tick = 0
        wins[0], wins[1], wins[2] = &self.w0.w, &self.w1.w, &self.w2.w
        for i in range(NSCALES):
            if wins[i].n >= self.sc[i]:
                shifts[i] = wins[i].srt[wins[i].n // 2] - self.center
            else:
                shifts[i] = NAN
        self._defer(shifts, d - self.center)

    cdef void _defer(self, double* shifts, double point) noexcept nogil:
        """Queue this entry's shifts; learn the entry ``lag`` entries old. The wait keeps
        a slowdown's own onset out of the history it is judged against, while a burst
        that passed is learned (and so is usual when it comes back)."""
        cdef Py_ssize_t i, j
        cdef double* out
        if self.lag == 0:
            self._learn_shifts(shifts, point)
            return
        j = (self.p_head + self.p_n) % self.lag
        if self.p_n == self.lag:  # full: the oldest leaves for the histories
            out = self.pend[self.p_head]
            self._learn_shifts(out, out[NSCALES])
            self.p_head = (self.p_head + 1) % self.lag
        else:
            self.p_n += 1
        for i in range(NSCALES):
            self.pend[j][i] = shifts[i]
        self.pend[j][NSCALES] = point

    cdef void _learn_shifts(self, double* shifts, double point) noexcept nogil:
        window_push(&self.hp.w, point)
        if not isnan(shifts[0]):
            window_push(&self.h0.w, shifts[0])
        if not isnan(shifts[1]):
            window_push(&self.h1.w, shifts[1])
        if not isnan(shifts[2]):
            window_push(&self.h2.w, shifts[2])

    cdef Outcome _step(self, double value) noexcept nogil:
        cdef double d, z, c, change
        cdef Py_ssize_t j
        cdef bint unusual, flag
        if not (value > 0 and isfinite(value)):
            return QUIET
        d = self.sign * log(value)
        self.rec.push(d)
        self.w0.push(d)
        self.w1.push(d)
        self.w2.push(d)
        if self.buf.size() < self.min_points:
            self._learn(d)
            return QUIET
        if self.scale == 0.0:
            return ZERO_SCALE  # min_scale 0 and a baseline with no spread
        z = (d - self.center) / self.scale
        c = z if z > -self.clip else -self.clip
        c = c if c < self.clip else self.clip
        c = self._cusum + c - self.k
        self._cusum = c if c > 0.0 else 0.0
        change = exp(self.rec.upper_median() - self.center)
        if change == INFINITY:
            self._track(d)
            return OVERFLOW
        change -= 1.0
        flag = not (self._cusum <= self.h or change < self.min_change)
        # Judged against the history as it was before this point; both against the
        # baseline before this point is learned.
        unusual = self._judge() if flag else False
        self._track(d)
        if not flag:
            self.flagged = 0
            if z < self.clip:  # a bad outlier is not learned
                self._learn(d)
            return QUIET
        if not self.flagged:
            self._changes += 1
        self.flagged += 1
        self.f_change, self.f_cusum, self.f_points = change, self._cusum, self.flagged
        self.f_center, self.f_scale = self.center, self.scale
        self.f_unusual = unusual
        if self.flagged >= self.adapt_after:  # the recent level is the new baseline
            self.buf.clear()
            for j in range(self.rec.size()):
                self.buf.push(self.rec.at(j))
            self._refresh()
            self._cusum = 0.0
            self.flagged = 0
        return FLAGGED

    cdef tuple _record(self):
        return (
            self.f_change, self.f_cusum, self.f_points, self.f_center, self.f_scale,
            self.f_unusual, self.f_shift, self.f_usual, self.sc[self.f_at],
        )

    def __reduce__(self):
        params = (
            self.sign < 0, self.buf.cap, self.rec.cap, self.k, self.h, self.clip,
            self.min_scale, self.min_change, self.min_points, self.adapt_after,
            (self.sc[0], self.sc[1], self.sc[2]), self.h0.cap, self.stride, self.quantile,
            self.margin, self.min_history, self.warn_floor, self.noise_quantile,
            self.noise_margin, self.lag,
        )
        return RegressionCore, params, self.__getstate__()

    def __getstate__(self):
        return (
            self.buf.values(), self.rec.values(), self.center, self.scale, self.since,
            self._cusum, self.flagged, self._changes,
            self.w0.values(), self.w1.values(), self.w2.values(),
            self.h0.values(), self.h1.values(), self.h2.values(), self.hp.values(),
            self.tick, self._pending(),
        )

    cdef list _pending(self):
        """The queued entries, oldest first, each a tuple of the scales' shifts and the
        point's."""
        cdef Py_ssize_t j, i, at
        out = []
        for j in range(self.p_n):
            at = (self.p_head + j) % self.lag
            out.append(tuple(self.pend[at][i] for i in range(NSCALES + 1)))
        return out

    def __setstate__(self, state) -> None:
        (buf, rec, self.center, self.scale, self.since, self._cusum, self.flagged, changes,
         w0, w1, w2, h0, h1, h2, hp, self.tick, pending) = state
        self._changes = changes
        self.buf.assign(buf)
        self.rec.assign(rec)
        self.w0.assign(w0)
        self.w1.assign(w1)
        self.w2.assign(w2)
        self.h0.assign(h0)
        self.h1.assign(h1)
        self.h2.assign(h2)
        self.hp.assign(hp)
        cdef Py_ssize_t j, i
        self.p_head, self.p_n = 0, len(pending)
        for j, entry in enumerate(pending):
            for i in range(NSCALES + 1):
                self.pend[j][i] = entry[i]
