# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Spike's and SpikeScore's per-point loops, compiled.

Spike runs on every loss and grad-norm series; batch replay hands it whole series, whose
points are nearly all quiet (learned, not flagged). These loops do those points as the
Python ``update`` does, operation for operation (libm ``log`` as ``math.log``, Python's
``max`` tie-breaking, CPython's ``math.fsum``), and return to Python at the first point
it must judge itself. State comes from the detector's plain attributes and goes back to
them, so detectors still pickle and clone as before.

Spike's median of the last ``center_window`` values and the order statistics of
``robust_scale`` come from windows kept sorted as points come and go (the differences
merged in every 8 points, when the scale needs them): a median or an order statistic is
one of the values, whatever sorted them.
"""

from libc.math cimport fabs, isfinite, log, sqrt
from libc.stdlib cimport free, malloc
from libc.string cimport memmove

from runwatch._pyfloat cimport insert_sorted, replace_sorted, stable_sort


cdef struct Baseline:
    double* z          # learned values; the buffer is z[lo:hi]
    Py_ssize_t lo, hi, cap
    double* centre     # the last min(hi - lo, cw) values, sorted
    double* diffs      # |z[j] - z[j - 1]| for flo < j < fhi, sorted
    Py_ssize_t flo, fhi
    double* spare      # room for as many differences, and for those to add and remove
    double* adds
    double* drops
    Py_ssize_t cw, window, min_points, since
    double scale


cdef void _flush_diffs(Baseline* b) noexcept nogil:
    """Bring the sorted differences from z[flo:fhi] to the buffer z[lo:hi] in one merge:
    the scale needs them every 8 points, and ~8 differences come and go meanwhile."""
    cdef Py_ssize_t j, i, r = 0, nr = 0, na = 0, ia = 0, m = 0, out = 0
    cdef double v
    cdef double* t
    if b.fhi - b.flo > 1:
        m = b.fhi - b.flo - 1
    for j in range(b.flo + 1, b.lo + 1 if b.lo + 1 < b.fhi else b.fhi):
        b.drops[nr] = fabs(b.z[j] - b.z[j - 1])
        nr += 1
    for j in range(b.fhi if b.fhi > b.lo + 1 else b.lo + 1, b.hi):
        b.adds[na] = fabs(b.z[j] - b.z[j - 1])
        na += 1
    stable_sort(b.drops, nr)
    stable_sort(b.adds, na)
    for i in range(m):
        v = b.diffs[i]
        if r < nr and v == b.drops[r]:
            r += 1  # one value dropped for each to drop: they are all in diffs
            continue
        while ia < na and b.adds[ia] < v:
            b.spare[out] = b.adds[ia]
            out += 1
            ia += 1
        b.spare[out] = v
        out += 1
    while ia < na:
        b.spare[out] = b.adds[ia]
        out += 1
        ia += 1
    t = b.diffs
    b.diffs = b.spare
    b.spare = t
    b.flo, b.fhi = b.lo, b.hi


cdef double _robust_scale(const Baseline* b) noexcept nogil:
    """``base.robust_scale`` of the buffer, from its sorted differences (flushed)."""
    cdef Py_ssize_t n = b.hi - b.lo, j
    cdef double scale
    if n < 3:
        return 0.0
    j = (n - 1) // 2
    scale = 1.0484 * b.diffs[j]
    if scale == 0.0:
        # The quantised fallback: half the smallest nonzero difference (all are >= 0).
        while j < n - 1 and not b.diffs[j] > 0.0:
            j += 1
        scale = 0.5 * (b.diffs[j] if j < n - 1 else 0.0)
    return scale


cdef void _learn(Baseline* b, double x) noexcept nogil:
    """``Spike._learn(x)``: the buffer, the sorted windows and the scale."""
    cdef Py_ssize_t nb = b.hi - b.lo
    if b.hi == b.cap:
        _flush_diffs(b)  # the differences to drop are read before the buffer moves
        memmove(b.z, b.z + b.lo, nb * sizeof(double))
        b.lo = b.flo = 0
        b.hi = b.fhi = nb
    if nb >= b.cw:
        replace_sorted(b.centre, b.cw, b.z[b.hi - b.cw], x)
    else:
        insert_sorted(b.centre, nb, x)
    if nb == b.window:
        b.lo += 1
    b.z[b.hi] = x
    b.hi += 1
    b.since += 1
    if b.since >= 8 or b.hi - b.lo <= b.min_points:
        b.since = 0
        _flush_diffs(b)
        b.scale = _robust_scale(b)


def quiet_stretch(d, const double[::1] values, Py_ssize_t i) -> int:
    """Run Spike ``d``'s ``update`` over ``values[i:]`` while it flags nothing; return
    the index of the first point ``update`` must judge itself (flagged, or not positive
    in log space), or ``len(values)``, with ``d``'s state moved up to that point."""
    cdef Py_ssize_t n = values.shape[0], k, h
    cdef bint in_log = d._log
    cdef Py_ssize_t run = d._run
    cdef double threshold = d.threshold, cont = d.continue_threshold
    cdef double min_delta = d.min_delta
    cdef double v, x, center, sc, dev, zz
    cdef list buf = d._buf
    cdef Baseline b
    b.cw, b.window, b.min_points = d.center_window, d.window, d.min_points
    b.since, b.scale = d._since_scale, d._scale
    b.cap = 4 * b.window
    b.lo = b.hi = 0
    b.z = <double*>malloc(b.cap * sizeof(double))
    b.centre = <double*>malloc(b.cw * sizeof(double))
    b.diffs = <double*>malloc(4 * b.window * sizeof(double))
    if b.z == NULL or b.centre == NULL or b.diffs == NULL:
        free(b.z)
        free(b.centre)
        free(b.diffs)
        raise MemoryError()
    b.spare, b.adds, b.drops = b.diffs + b.window, b.diffs + 2 * b.window, b.diffs + 3 * b.window
    try:
        for k in range(len(buf)):
            b.z[k] = buf[k]
        b.hi = len(buf)
        h = b.hi - b.cw if b.hi > b.cw else 0
        for k in range(h, b.hi):
            insert_sorted(b.centre, k - h, b.z[k])
        b.flo = b.fhi = 0
        _flush_diffs(&b)
        with nogil:
            while i < n:
                v = values[i]
                if not isfinite(v):
                    i += 1
                    continue
                if in_log:
                    if v <= 0:
                        break
                    x = log(v)
                else:
                    x = v
                if b.hi - b.lo >= b.min_points:
                    k = b.hi - b.lo if b.hi - b.lo < b.cw else b.cw
                    h = k // 2
                    center = b.centre[h] if k % 2 else 0.5 * (b.centre[h - 1] + b.centre[h])
                    sc = 1e-12 if 1e-12 > b.scale else b.scale  # max(scale, 1e-12)
                    dev = x - center
                    zz = dev / sc
                    if not (zz < (cont if run else threshold) or dev < min_delta):
                        break
                    run = 0
                _learn(&b, x)
                i += 1
        d._buf = [b.z[k] for k in range(b.lo, b.hi)]
        d._scale = b.scale
        d._since_scale = b.since
        d._run = run
        return i
    finally:
        free(b.z)
        free(b.centre)
        free(b.diffs if b.diffs < b.spare else b.spare)


cdef double _fsum(const double* a, Py_ssize_t n, bint squares, double* p) noexcept nogil:
    """CPython 3.11's ``math.fsum`` of ``a[:n]`` (of their squares if ``squares``), for
    finite terms whose sum cannot overflow; ``p``: room for ``n`` partials."""
    cdef Py_ssize_t i, j, m = 0, t
    cdef double x, y, hi, yr, lo = 0.0, tmp
    for t in range(n):
        x = a[t] * a[t] if squares else a[t]
        i = 0
        for j in range(m):
            y = p[j]
            if fabs(x) < fabs(y):
                tmp = x
                x = y
                y = tmp
            hi = x + y
            yr = hi - x
            lo = y - yr
            if lo != 0.0:
                p[i] = lo
                i += 1
            x = hi
        m = i
        if x != 0.0:
            p[m] = x
            m += 1
    hi = 0.0
    if m > 0:
        m -= 1
        hi = p[m]
        # Add the partials from the top while the sum stays exact.
        while m > 0:
            x = hi
            m -= 1
            y = p[m]
            hi = x + y
            yr = hi - x
            lo = y - yr
            if lo != 0.0:
                break
        # Half-even rounding across partials, as fsum fixes it up.
        if m > 0 and ((lo < 0.0 and p[m - 1] < 0.0) or (lo > 0.0 and p[m - 1] > 0.0)):
            y = lo * 2.0
            x = hi + y
            yr = x - hi
            if y == yr:
                hi = x
    return hi


def score_many(s, const double[::1] values) -> int:
    """``SpikeScore.update`` of ``s`` over ``values`` in order; return how many spikes."""
    cdef Py_ssize_t w = s.window, n = values.shape[0], i
    cdef Py_ssize_t pos = s._pos, since = s._since_rebuild, k, seen = 0, spikes = 0
    cdef double sigmas = s.sigmas, total = s._sum, sumsq = s._sumsq
    cdef double v, old, mean, var
    cdef list ring = s._ring
    cdef double* r = <double*>malloc(2 * w * sizeof(double))
    if r == NULL:
        raise MemoryError()
    try:
        k = len(ring)
        for i in range(k):
            r[i] = ring[i]
        with nogil:
            for i in range(n):
                v = values[i]
                if not isfinite(v):
                    continue
                seen += 1
                if fabs(v) > 1e100:
                    spikes += 1  # kept out of the window, as update does
                    continue
                if k >= 2:
                    mean = total / k
                    var = sumsq / k - mean * mean
                    if 0.0 > var:
                        var = 0.0
                    if var > 0 and fabs(v - mean) > sigmas * sqrt(var):
                        spikes += 1
                if k < w:
                    r[k] = v
                    k += 1
                else:
                    old = r[pos]
                    r[pos] = v
                    pos = (pos + 1) % w
                    total -= old
                    sumsq -= old * old
                total += v
                sumsq += v * v
                since += 1
                if since >= w:
                    since = 0
                    total = _fsum(r, k, False, r + w)
                    sumsq = _fsum(r, k, True, r + w)
        s._ring = [r[i] for i in range(k)]
        s._pos = pos
        s._sum = total
        s._sumsq = sumsq
        s._since_rebuild = since
        s._n += seen
        s._n_spikes += spikes
        return spikes
    finally:
        free(r)
