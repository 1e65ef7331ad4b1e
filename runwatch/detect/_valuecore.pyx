# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""What the Regression and Divergence cores share: a sorted window of the last values, and
the driver of a core whose step judges a value alone (the step number plays no part).

A core subclasses ``ValueCore`` and defines two cdef methods: ``_step(value)``, the one
definition of its per-point step (state in C fields, an ``Outcome`` back), and
``_record()``, the tuple that describes the point just flagged. ``update`` (live) and
``update_many`` (replay) both run that same ``_step``; ``update_many`` runs the quiet
points without the GIL and with no Python call, and stops only at flagged points.
"""

from libc.math cimport INFINITY, fabs
from libc.stdlib cimport free, malloc

from runwatch._pyfloat cimport Window, lower_bound, window_push

import numpy as np


cdef inline void _take(double x, double* top, double* second) noexcept nogil:
    """Keep the largest two of the values seen in ``top`` and ``second``."""
    if x > top[0]:
        second[0] = top[0]
        top[0] = x
    elif x > second[0]:
        second[0] = x


cdef class SortedWindow:
    """The last ``cap`` values (finite: no NaN to order), in arrival order and sorted: a
    ``_pyfloat.Window`` with its memory, and the order statistics the cores read.

    Equal values stay in arrival order, as ``sorted`` would leave them, so an order
    statistic is even the same zero (0.0 or -0.0).

    Parameters
    ----------
    cap : int
        How many values the window keeps (at least 1).
    """

    def __cinit__(self, Py_ssize_t cap) -> None:
        if cap < 1:
            raise ValueError(f"cap={cap} is invalid; valid values: an integer in [1, inf]")
        self.w.ring = <double*>malloc(2 * cap * sizeof(double))
        if self.w.ring == NULL:
            raise MemoryError()
        self.w.srt = self.w.ring + cap
        self.w.cap = cap
        self.w.head = self.w.n = 0

    def __dealloc__(self) -> None:
        free(self.w.ring)

    @property
    def cap(self) -> int:
        """How many values the window keeps."""
        return self.w.cap

    @property
    def n(self) -> int:
        """How many values it holds."""
        return self.w.n

    cdef Py_ssize_t size(self) noexcept nogil:
        """How many values it holds."""
        return self.w.n

    cdef void push(self, double v) noexcept nogil:
        """Append ``v``, dropping the oldest value once the window is full."""
        window_push(&self.w, v)

    cdef void clear(self) noexcept nogil:
        self.w.head = self.w.n = 0

    cdef double upper_median(self) noexcept nogil:
        """``sorted(values)[n // 2]`` (n >= 1)."""
        return self.w.srt[self.w.n // 2]

    cdef double at(self, Py_ssize_t i) noexcept nogil:
        """The ``i``-th value, oldest first (``0 <= i < n``)."""
        i += self.w.head
        return self.w.ring[i - self.w.cap if i >= self.w.cap else i]

    cdef void median_mad(self, double* med, double* mad) noexcept nogil:
        """The median and the MAD (unscaled) of the values (n >= 1).

        The distances to the median of the values below it grow downwards (``lo``), of the
        others upwards (``up``): the smallest ``h + 1`` distances are the first ``a`` of one
        side and the first ``h + 1 - a`` of the other, ``a`` found by bisection; the MAD is
        the largest of those (the mean of the largest two, for an even count).
        """
        cdef const double* s = self.w.srt
        cdef Py_ssize_t n = self.w.n, h = n // 2, k = h + 1, r, nl, nu, a, b, lo, hi
        cdef double m, top, second
        m = s[h] if n % 2 else 0.5 * (s[h - 1] + s[h])
        r = lower_bound(s, n, m)  # lo[j] = |s[r - 1 - j] - m|, up[j] = |s[r + j] - m|
        nl, nu = r, n - r
        lo, hi = (k - nu if k > nu else 0), (k if k < nl else nl)
        while lo < hi:  # the least a whose next up distance is not below lo[a]
            a = (lo + hi) >> 1
            if fabs(s[r + k - a - 1] - m) > fabs(s[r - 1 - a] - m):
                lo = a + 1
            else:
                hi = a
        a, b = lo, k - lo
        top, second = -INFINITY, -INFINITY
        if a:
            top = fabs(s[r - a] - m)
            if a > 1:
                second = fabs(s[r - a + 1] - m)
        if b:
            _take(fabs(s[r + b - 1] - m), &top, &second)
            if b > 1:
                _take(fabs(s[r + b - 2] - m), &top, &second)
        med[0] = m
        mad[0] = top if n % 2 else 0.5 * (second + top)

    cdef list values(self):
        """The values, oldest first."""
        return [self.at(i) for i in range(self.w.n)]

    cdef assign(self, values):
        """Make the window hold ``values`` (oldest first; the last ``cap`` of them)."""
        self.clear()
        for v in values:
            self.push(v)


cdef class ValueCore:
    """The driver of a core that judges values alone: ``update`` and ``update_many`` both
    run the subclass's ``_step``."""

    cdef Outcome _step(self, double value) noexcept nogil:
        return QUIET

    cdef tuple _record(self):
        return ()

    cdef object _outcome(self, Outcome out):
        """The flag record of the point just stepped, or the error Python's arithmetic
        would have raised at it."""
        if out == FLAGGED:
            return self._record()
        if out == ZERO_SCALE:
            return ZeroDivisionError("float division by zero")
        return OverflowError("math range error")

    def update(self, step, double value):
        """One point: None if nothing is flagged, else the flag record (a tuple).

        Parameters
        ----------
        step : int
            The point's step (not used: the core judges the value alone).
        value : float
            The point's value.
        """
        cdef Outcome out = self._step(value)
        if out == QUIET:
            return None
        rec = self._outcome(out)
        if isinstance(rec, Exception):
            raise rec
        return rec

    def update_many(self, steps, values):
        """``update`` over many points; ``(index, record)`` for each flagged point, where
        a point ``update`` raises at has the exception as its record.

        Parameters
        ----------
        steps : sequence of int
            The points' steps (not used).
        values : sequence of float
            The points' values, converted to float64 once.
        """
        cdef const double[::1] v = np.ascontiguousarray(values, dtype=np.float64)
        cdef Py_ssize_t i = 0, n = v.shape[0]
        cdef Outcome out = QUIET
        flagged = []
        while i < n:
            with nogil:
                while i < n:
                    out = self._step(v[i])
                    if out != QUIET:
                        break
                    i += 1
            if i < n:
                flagged.append((i, self._outcome(out)))
                i += 1
        return flagged

