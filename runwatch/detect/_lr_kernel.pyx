# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""``LRSanity.update`` over the points it learns from without a word, compiled.

Batch replay's LR series: nearly every point is on its schedule's line and is simply
learned. This loop does exactly what ``LRSanity.update`` does for those points (the same
operations in the same order: ``update`` stays the definition, ``tests/detect/
test_batch.py`` checks the two agree) and stops at the first point ``update`` must judge
itself: one it would flag, or one of an LR that has never been above zero.
"""

from libc.math cimport isfinite
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc


def learn_quiet(det, const int64_t[::1] steps, const double[::1] values, Py_ssize_t i) -> int:
    """Move ``det`` (an ``LRSanity``) over ``steps``/``values`` from index ``i`` as its
    ``update`` would, up to the first point that ``update`` could flag (returned; the
    length of the series when there is none). Non-finite values are skipped, as
    ``update`` does."""
    cdef Py_ssize_t n = steps.shape[0], size = det.slope_points, count, head, k
    cdef Py_ssize_t last, first
    cdef int64_t* ws = <int64_t*> malloc(size * sizeof(int64_t))
    cdef double* wv = <double*> malloc(size * sizeof(double))
    if ws == NULL or wv == NULL:
        free(ws)
        free(wv)
        raise MemoryError()
    cdef long long learned = det._n, min_points = det.min_points
    cdef double peak = det._peak, jump_tol = det.jump_tol, zero_frac = det.zero_frac
    cdef double v, slope, pred, resid
    cdef int64_t step, gap
    cdef bint moved = False
    try:
        # The window of accepted points as a ring: ``head`` is the oldest of ``count``.
        count, head = len(det._vals), 0
        for k in range(count):
            ws[k] = det._steps[k]
            wv[k] = det._vals[k]
        while i < n:
            v = values[i]
            if not isfinite(v):
                i += 1
                continue
            if peak <= 0 and v <= 0:
                break  # never above zero yet: ``update`` counts toward its warning
            if learned >= min_points and count >= 2:
                last = (head + count - 1) % size
                gap = ws[last] - ws[head]
                slope = (wv[last] - wv[head]) / <double>gap if gap > 0 else 0.0
                pred = wv[last] + slope * <double>(steps[i] - ws[last])
                resid = (v - pred) / peak if peak > 0 else 0.0
                if v <= zero_frac * peak or resid > jump_tol or resid < -jump_tol:
                    break  # a point ``update`` flags
                moved = True  # an unflagged point ends any flagged run
            step = steps[i]
            if count < size:
                ws[(head + count) % size] = step
                wv[(head + count) % size] = v
                count += 1
            else:
                ws[head] = step
                wv[head] = v
                head = (head + 1) % size
            learned += 1
            if v > peak:
                peak = v
            i += 1
        det._steps[:] = [ws[(head + k) % size] for k in range(count)]
        det._vals[:] = [wv[(head + k) % size] for k in range(count)]
        det._n = learned
        det._peak = peak
        if moved:
            det._flagged = 0
            det._zero = False
        return i
    finally:
        free(ws)
        free(wv)
