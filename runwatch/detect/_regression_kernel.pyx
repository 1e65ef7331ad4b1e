# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Regression's per-point loop, compiled.

Batch replay hands Regression whole step-time and throughput series, whose points are
nearly all quiet (not flagged). ``Quiet.run`` does those points as ``Regression.update``
does, operation for operation (libm ``log``/``exp``, Python's ``min``/``max``
tie-breaking, the same median and MAD), and returns at the first point ``update`` must do
itself: a flagged one, or one where Python raises. State comes from the detector's plain attributes
and goes back to them, so detectors still pickle and clone as before.

The baseline window and the recent window are kept sorted as points come and go: a
median, or an order statistic of the deviations from it, is one of the values whatever
sorted them (the values are finite: no NaN to order).
"""

from libc.math cimport INFINITY, exp, fabs, isfinite, log
from libc.stdlib cimport free, malloc

from runwatch._pyfloat cimport Window, lower_bound, py_max, py_min, window_push, window_unpush


cdef inline void _take(double x, double* top, double* second) noexcept nogil:
    """Keep the largest two of the values seen in ``top`` and ``second``."""
    if x > top[0]:
        second[0] = top[0]
        top[0] = x
    elif x > second[0]:
        second[0] = x


cdef void _median_mad(const Window* w, double* med, double* mad) noexcept nogil:
    """``regression._median_mad`` of the window (n >= 1): the median of the sorted
    values, and the middle order statistic(s) of their distances to it. The distances
    of the values below the median grow downwards (``lo``), the others upwards (``up``):
    the smallest ``h + 1`` distances are the first ``a`` of one side and ``h + 1 - a``
    of the other, ``a`` found by bisection."""
    cdef const double* s = w.srt
    cdef Py_ssize_t n = w.n, h = n // 2, k = h + 1, r, nl, nu, a, b, lo, hi
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
    # The largest two of lo[:a] and up[:b]: the k-th and (k-1)-th distances.
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


cdef void _fill(Window* w, list values):
    """Set the window to ``values`` (oldest first)."""
    w.head = w.n = 0
    for v in values:
        window_push(w, <double>v)


cdef list _values(const Window* w):
    """The window's values, oldest first."""
    return [w.ring[(w.head + i) % w.cap] for i in range(w.n)]


cdef class Quiet:
    """Regression ``det``'s quiet points, compiled: ``run`` does them as ``det.update``
    would and stops at the first point ``update`` must do itself.

    One lives for one ``update_many`` call. The detector's attributes stay its state:
    ``run`` reads them and writes them back at every stop. Its C copy of the baseline
    window is kept across stops while ``det._buf`` is still the list it wrote (``update``
    replaces it, on adapting, and learns nothing on the points it is given), so a run of
    flagged points does not rebuild it for each.
    """

    cdef object det, buf_list
    cdef Window buf, rec
    cdef Py_ssize_t min_points
    cdef double sign, k, h, clip, min_scale, min_change

    def __cinit__(self, object det) -> None:
        self.det = det
        self.buf.cap, self.rec.cap = det.window, det.recent
        self.buf.head = self.buf.n = self.rec.head = self.rec.n = 0
        self.buf.ring = <double*>malloc(2 * (self.buf.cap + self.rec.cap) * sizeof(double))
        if self.buf.ring == NULL:
            raise MemoryError()
        self.buf.srt = self.buf.ring + self.buf.cap
        self.rec.ring = self.buf.srt + self.buf.cap
        self.rec.srt = self.rec.ring + self.rec.cap
        self.min_points = det.min_points
        self.sign, self.k, self.h, self.clip = det._sign, det.k, det.h, det.clip
        self.min_scale, self.min_change = det.min_scale, det.min_change

    def __dealloc__(self) -> None:
        free(self.buf.ring)

    def run(self, const double[::1] values, Py_ssize_t start) -> int:
        """Do ``values[start:]`` while ``update`` would flag nothing; return the first
        point it must do itself (len(values): none), with the detector's state where
        ``update`` leaves it before that point."""
        det = self.det
        cdef Py_ssize_t n = values.shape[0], i = start, since = det._since
        cdef Py_ssize_t min_points = self.min_points
        cdef double sign = self.sign, k = self.k, h = self.h, clip = self.clip
        cdef double min_scale = self.min_scale, min_change = self.min_change
        cdef double center = det._center, scale = det._scale, cusum = det._cusum
        cdef bint flagged = det._flagged != 0, learned = False
        cdef double v, d, z, zc, cus, grown, old, med, mad
        cdef Window* buf = &self.buf
        cdef Window* rec = &self.rec
        if det._buf is not self.buf_list or len(det._buf) != buf.n:
            _fill(buf, det._buf)
            self.buf_list = det._buf
        _fill(rec, det._recent)
        with nogil:
            while i < n:
                v = values[i]
                if not (v > 0 and isfinite(v)):
                    i += 1
                    continue
                d = sign * log(v)
                if buf.n >= min_points:
                    if scale == 0.0:
                        break  # update raises (a zero scale: min_scale 0, no spread)
                    old = window_push(rec, d)
                    z = (d - center) / scale
                    zc = py_min(py_max(z, -clip), clip)
                    cus = py_max(0.0, cusum + zc - k)
                    grown = exp(rec.srt[rec.n // 2] - center)  # change = grown - 1.0
                    if grown == INFINITY or not (cus <= h or grown - 1.0 < min_change):
                        window_unpush(rec, d, old)
                        break  # flagged (or an overflow update raises on)
                    cusum = cus
                    flagged = False
                    if not z < clip:
                        i += 1
                        continue  # an outlier: not learned
                else:
                    window_push(rec, d)
                # Regression._learn
                window_push(buf, d)
                learned = True
                since += 1
                if since >= 8 or buf.n <= min_points:
                    since = 0
                    _median_mad(buf, &med, &mad)
                    center = med
                    scale = py_max(1.4826 * mad, min_scale)
                i += 1
        if learned:
            det._buf = self.buf_list = _values(buf)
        det._recent = _values(rec)
        det._center, det._scale, det._since, det._cusum = center, scale, since, cusum
        if not flagged:
            det._flagged = 0
        return i
