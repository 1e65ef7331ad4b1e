# cython: language_level=3
"""What the Regression and Divergence cores share (see ``_valuecore.pyx``)."""

from runwatch._pyfloat cimport Window

cdef enum Outcome:
    QUIET = 0  # nothing flagged at this point
    FLAGGED = 1  # flagged: the core's ``_record`` describes it
    ZERO_SCALE = 2  # Python would have raised ZeroDivisionError here
    OVERFLOW = 3  # Python would have raised OverflowError here (math.exp)


cdef class SortedWindow:
    cdef Window w

    cdef Py_ssize_t size(self) noexcept nogil
    cdef void push(self, double v) noexcept nogil
    cdef void clear(self) noexcept nogil
    cdef double upper_median(self) noexcept nogil
    cdef double at(self, Py_ssize_t i) noexcept nogil
    cdef void median_mad(self, double* med, double* mad) noexcept nogil
    cdef list values(self)
    cdef assign(self, values)


cdef class ValueCore:
    cdef Outcome _step(self, double value) noexcept nogil
    cdef tuple _record(self)
    cdef object _outcome(self, Outcome out)
