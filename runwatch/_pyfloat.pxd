# cython: language_level=3
"""Small float helpers shared by the compiled cores (``runwatch/detect/_*_core.pyx``,
``runwatch/expect/_lm.pyx``), in one place.

Python's two-argument ``max``/``min`` (the first argument unless the second is strictly
greater / smaller: NaN never is), a stable sort of a few values (equal values, 0.0 and
-0.0 among them, keep their order), binary searches, and a sorted window kept up to date
as values come and go (``Window``: a median or an order statistic is one of the values).
Inline functions: each core compiles its own copy, with no call between modules.
"""

from libc.math cimport NAN
from libc.string cimport memmove


cdef inline double py_max(double a, double b) noexcept nogil:
    """Python's ``max(a, b)``: ``a`` unless ``b`` is greater."""
    return b if b > a else a


cdef inline double py_min(double a, double b) noexcept nogil:
    """Python's ``min(a, b)``: ``a`` unless ``b`` is smaller."""
    return b if b < a else a


cdef inline void stable_sort(double* a, Py_ssize_t n) noexcept nogil:
    """``a[:n] = sorted(a[:n])`` for a few values (an insertion sort: stable as ``sorted``)."""
    cdef Py_ssize_t i, j
    cdef double v
    for i in range(1, n):
        v = a[i]
        j = i
        while j > 0 and a[j - 1] > v:
            a[j] = a[j - 1]
            j -= 1
        a[j] = v


cdef inline Py_ssize_t lower_bound(const double* a, Py_ssize_t n, double v) noexcept nogil:
    """The first index of the sorted ``a[:n]`` whose value is not below ``v`` (a search
    without data-dependent branches: a window's order is noise, unpredictable)."""
    cdef const double* base = a
    cdef Py_ssize_t half
    if n == 0:
        return 0
    while n > 1:
        half = n >> 1
        base += half * (base[half - 1] < v)
        n -= half
    return (base - a) + (base[0] < v)








cdef inline Py_ssize_t upper_bound(const double* a, Py_ssize_t n, double v) noexcept nogil:
    """The first index of the sorted ``a[:n]`` whose value is above ``v`` (branch-free)."""
    cdef const double* base = a
    cdef Py_ssize_t half
    if n == 0:
        return 0
    while n > 1:
        half = n >> 1
        base += half * (base[half - 1] <= v)
        n -= half
    return (base - a) + (base[0] <= v)


cdef struct Window:
    double* ring       # the last ``cap`` values in arrival order: ring[(head + i) % cap]
    double* srt        # the same values as ``sorted`` orders them (equals by arrival)
    Py_ssize_t cap, head, n


cdef inline double window_push(Window* w, double v) noexcept nogil:
    """Append ``v`` (finite), dropping the oldest value if the window is full; return the
    dropped value (NaN: none). ``srt`` stays what ``sorted`` makes of the window: the
    dropped value is the oldest of its equals, ``v`` the newest of its (0.0 and -0.0 are
    equal but not the same float)."""
    cdef double old = NAN
    cdef Py_ssize_t i
    if w.n == w.cap:
        old = w.ring[w.head]
        w.ring[w.head] = v
        w.head = w.head + 1 if w.head + 1 < w.cap else 0
        i = lower_bound(w.srt, w.n, old)
        memmove(w.srt + i, w.srt + i + 1, (w.n - i - 1) * sizeof(double))
        w.n -= 1
    else:
        i = w.head + w.n
        w.ring[i - w.cap if i >= w.cap else i] = v
    i = upper_bound(w.srt, w.n, v)
    memmove(w.srt + i + 1, w.srt + i, (w.n - i) * sizeof(double))
    w.srt[i] = v
    w.n += 1
    return old

