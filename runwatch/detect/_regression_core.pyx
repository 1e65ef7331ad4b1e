# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Regression's state and per-point step, compiled (the one definition of both).

``regression.Regression`` is the public face: it validates the parameters, builds this
core, and turns the flag records into Signals. Live watching (``update``) and batch
replay (``update_many``, see ``_valuecore.ValueCore``) run the same ``_step``.
"""

cimport cython
from libc.math cimport INFINITY, exp, isfinite, log

from runwatch.detect._valuecore cimport (
    FLAGGED, OVERFLOW, QUIET, ZERO_SCALE, Outcome, SortedWindow, ValueCore,
)


@cython.final
cdef class RegressionCore(ValueCore):
    """CUSUM of clipped robust z against a baseline window, on log values turned so that
    "worse" is positive.

    A flag record is ``(change, cusum, points, center, scale)``: the relative worsening of
    the recent median, the CUSUM, how many points in a row are flagged, and the baseline's
    median and robust scale (log units), all as they were when the point was flagged
    (before adapting to a lasting change).

    The parameters are ``Regression``'s, in its order, but for ``persist``, ``warn_change``
    and ``critical_change`` (the Signal's business); ``Regression`` validates them.
    """

    cdef SortedWindow buf, rec
    cdef double sign, k, h, clip, min_scale, min_change
    cdef Py_ssize_t min_points, adapt_after
    cdef double center, scale, _cusum
    cdef Py_ssize_t since, flagged, _changes
    cdef double f_change, f_cusum, f_center, f_scale  # the last flagged point's record
    cdef Py_ssize_t f_points

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
    ) -> None:
        self.sign = -1.0 if higher_is_better else 1.0
        self.buf, self.rec = SortedWindow(window), SortedWindow(recent)
        self.k, self.h, self.clip = k, h, clip
        self.min_scale, self.min_change = min_scale, min_change
        self.min_points, self.adapt_after = min_points, adapt_after
        self.center, self.scale, self._cusum = 0.0, min_scale, 0.0
        self.since = self.flagged = self._changes = 0

    @property
    def cusum(self) -> float:
        """The CUSUM of clipped robust z (0 after adapting to a lasting change)."""
        return self._cusum

    @property
    def changes(self) -> int:
        """How many regressions were declared."""
        return self._changes

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

    cdef Outcome _step(self, double value) noexcept nogil:
        cdef double d, z, c, change
        cdef Py_ssize_t j
        if not (value > 0 and isfinite(value)):
            return QUIET
        d = self.sign * log(value)
        self.rec.push(d)
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
            return OVERFLOW
        change -= 1.0
        if self._cusum <= self.h or change < self.min_change:
            self.flagged = 0
            if z < self.clip:  # a bad outlier is not learned
                self._learn(d)
            return QUIET
        if not self.flagged:
            self._changes += 1
        self.flagged += 1
        self.f_change, self.f_cusum, self.f_points = change, self._cusum, self.flagged
        self.f_center, self.f_scale = self.center, self.scale
        if self.flagged >= self.adapt_after:  # the recent level is the new baseline
            self.buf.clear()
            for j in range(self.rec.size()):
                self.buf.push(self.rec.at(j))
            self._refresh()
            self._cusum = 0.0
            self.flagged = 0
        return FLAGGED

    cdef tuple _record(self):
        return (self.f_change, self.f_cusum, self.f_points, self.f_center, self.f_scale)

    def __reduce__(self):
        params = (
            self.sign < 0, self.buf.cap, self.rec.cap, self.k, self.h, self.clip,
            self.min_scale, self.min_change, self.min_points, self.adapt_after,
        )
        return RegressionCore, params, self.__getstate__()

    def __getstate__(self):
        return (
            self.buf.values(), self.rec.values(), self.center, self.scale, self.since,
            self._cusum, self.flagged, self._changes,
        )

    def __setstate__(self, state) -> None:
        buf, rec, self.center, self.scale, self.since, self._cusum, self.flagged, changes = state
        self._changes = changes
        self.buf.assign(buf)
        self.rec.assign(rec)
