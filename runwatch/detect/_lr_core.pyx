# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""LRSanity's state and per-point step, compiled.

``LRCore`` is the whole of an ``LRSanity`` detector but the parameters and the Signal:
the line of the last accepted points, the peak LR, and the run of flagged points. Live
watching calls ``update`` a point at a time, replay ``update_many`` over whole series;
both run the same C step.
"""

import numpy as np

from libc.math cimport isfinite
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc

cpdef enum Kind:
    """What a flagged point is (the first field of its record)."""
    NEVER_SET = 1  # the LR has never been above zero
    TO_ZERO = 2
    JUMP_UP = 3
    DROP = 4


cdef class LRCore:
    """An ``LRSanity`` detector's state and per-point step (``LRSanity`` is its face).

    ``update`` and ``update_many`` return, for each flagged point, the record
    ``(kind, pred, resid, peak, n)``: what was found (a ``Kind``), the LR its schedule
    predicts, the residual relative to the peak LR, the peak LR (after the point when it
    is learned) and how many points were learned. Parameters as ``LRSanity`` takes them
    (validated there).
    """

    cdef double jump_tol, zero_frac, zero_from
    cdef Py_ssize_t size, min_points, adapt_after, zero_run
    cdef int64_t* steps           # the last accepted points, a ring: the oldest at ``head``
    cdef double* vals
    cdef Py_ssize_t head, count, flagged
    cdef long long n
    cdef double highest
    cdef bint zero
    # The flagged point's record, filled by _step.
    cdef int f_kind
    cdef double f_pred, f_resid, f_peak

    def __cinit__(self, double jump_tol, double zero_frac, double zero_from,
                  Py_ssize_t slope_points, Py_ssize_t min_points, Py_ssize_t adapt_after,
                  Py_ssize_t zero_run):
        self.jump_tol, self.zero_frac, self.zero_from = jump_tol, zero_frac, zero_from
        self.size, self.min_points = slope_points, min_points
        self.adapt_after, self.zero_run = adapt_after, zero_run
        self.steps = <int64_t*>malloc(slope_points * sizeof(int64_t))
        self.vals = <double*>malloc(slope_points * sizeof(double))
        if not (self.steps and self.vals):
            raise MemoryError()
        self.head = self.count = self.flagged = self.n = 0
        self.highest = 0.0
        self.zero = False

    def __dealloc__(self):
        free(self.steps)
        free(self.vals)

    def __reduce__(self):
        params = (self.jump_tol, self.zero_frac, self.zero_from, self.size, self.min_points,
                  self.adapt_after, self.zero_run)
        return LRCore, params, (self.line, self.n, self.highest, self.flagged, self.zero)

    def __setstate__(self, tuple state):
        cdef Py_ssize_t i
        line, self.n, self.highest, self.flagged, self.zero = state
        self.head, self.count = 0, len(line)
        for i in range(self.count):
            self.steps[i], self.vals[i] = line[i]

    @property
    def line(self) -> list:
        """The accepted ``(step, lr)`` points the prediction extends, the oldest first."""
        cdef Py_ssize_t i, k
        out = []
        for i in range(self.count):
            k = (self.head + i) % self.size
            out.append((self.steps[k], self.vals[k]))
        return out

    @property
    def peak(self) -> float:
        return self.highest

    def rewind(self):
        """Forget the line (a resume restarts the schedule from its checkpoint)."""
        self.head = self.count = 0

    cdef void _learn(self, int64_t step, double value) noexcept nogil:
        cdef Py_ssize_t k = (self.head + self.count) % self.size
        if self.count < self.size:
            self.count += 1
        else:
            self.head = (self.head + 1) % self.size
        self.steps[k] = step
        self.vals[k] = value
        self.n += 1
        if value > self.highest:
            self.highest = value

    cdef bint _step(self, int64_t step, double value) noexcept nogil:
        """One point: True if it is flagged (its record in the ``f_`` fields)."""
        cdef Py_ssize_t first, last
        cdef int64_t gap
        cdef double slope, pred, resid, peak = self.highest
        if not isfinite(value):
            return False
        if peak <= 0 and value <= 0:
            # Never above zero yet: a warmup from 0 leaves this at once, a missing LR not.
            self._learn(step, value)
            self.f_kind, self.f_pred, self.f_resid, self.f_peak = NEVER_SET, 0.0, 0.0, peak
            return self.n >= self.zero_run
        if self.n < self.min_points or self.count < 2:
            self._learn(step, value)
            return False
        first = self.head
        last = (self.head + self.count - 1) % self.size
        gap = self.steps[last] - self.steps[first]
        slope = (self.vals[last] - self.vals[first]) / <double>gap if gap > 0 else 0.0
        pred = self.vals[last] + slope * <double>(step - self.steps[last])
        resid = (value - pred) / peak if peak > 0 else 0.0
        self.f_kind, self.f_pred, self.f_resid, self.f_peak = 0, pred, resid, peak
        if value <= self.zero_frac * peak:
            if self.vals[last] > self.zero_from * peak or self.zero:
                self.zero = True
                self.f_kind = TO_ZERO
        elif resid > self.jump_tol:
            self.f_kind = JUMP_UP
        elif resid < -self.jump_tol:
            # Step-decay schedules drop like this: worth a look, not an alarm; learned.
            self._learn(step, value)
            self.flagged = 0
            self.f_kind, self.f_peak = DROP, self.highest
            return True
        if not self.f_kind:
            self.flagged = 0
            self.zero = False
            self._learn(step, value)
            return False
        self.flagged += 1
        if self.flagged >= self.adapt_after:
            # Accept the new schedule: start the line afresh from this point.
            self.flagged = 0
            self.zero = False
            self.head = self.count = 0
            self._learn(step, value)
        return True

    cdef tuple _record(self):
        return (self.f_kind, self.f_pred, self.f_resid, self.f_peak, self.n)

    def update(self, int64_t step, double value):
        """Judge one point; its record if flagged, else None."""
        return self._record() if self._step(step, value) else None

    def update_many(self, steps, values) -> list:
        """``update`` over a whole series; ``(index, record)`` of the flagged points."""
        cdef const int64_t[::1] s = np.ascontiguousarray(steps, dtype=np.int64)
        cdef const double[::1] v = np.ascontiguousarray(values, dtype=np.float64)
        cdef Py_ssize_t i = 0, n = v.shape[0]
        cdef list out = []
        while i < n:
            with nogil:
                while i < n and not self._step(s[i], v[i]):
                    i += 1
            if i < n:
                out.append((i, self._record()))
                i += 1
        return out
