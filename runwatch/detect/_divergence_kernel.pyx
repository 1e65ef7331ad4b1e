# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Divergence's per-point loop, compiled.

Batch replay hands Divergence whole loss series, whose points are nearly all quiet (not
flagged). ``quiet`` does those points as ``Divergence.update`` does, operation for
operation (libm ``log``, ``base.noise_step`` and ``base.ema_step``, Python's ``min``/``max``
tie-breaking), and returns at the first point ``update`` must do itself: one that would be
flagged, or the end of log space. State comes from the detector's plain attributes and
goes back to them, so detectors still pickle and clone as before.

The running-median window is kept sorted as points come and go, equal values in arrival
order as ``sorted`` leaves them (0.0 and -0.0 are equal but not the same float).
"""

from libc.math cimport INFINITY, fabs, isfinite, log
from libc.stdlib cimport free, malloc
from libc.string cimport memmove

from runwatch._pyfloat cimport Window, window_push, window_unpush
from runwatch.detect.base import NOISE_KEEP, NOISE_RATE

cdef double noise_rate = NOISE_RATE, noise_keep = NOISE_KEEP  # base.noise_step's weights


cdef inline double _py_min_of(const double* a, Py_ssize_t n) noexcept nogil:
    """Python's ``min`` of ``a[:n]`` (n >= 1): the first value none after is below."""
    cdef double m = a[0]
    cdef Py_ssize_t i
    for i in range(1, n):
        if a[i] < m:
            m = a[i]
    return m


def quiet(object det, const double[::1] values, Py_ssize_t start) -> int:
    """Run ``det.update`` (a Divergence, its values floats) over ``values[start:]`` while
    it flags nothing and stays in its space; return the first point it must do itself
    (len(values): none), with ``det``'s state where ``update`` leaves it before that
    point."""
    cdef Py_ssize_t n = values.shape[0], i = start, cnt = det._n, cur_n = det._cur_n
    cdef Py_ssize_t warmup = det.warmup, block = det.block, ref_blocks = det.ref_blocks
    cdef Py_ssize_t patience = det.patience, over = det._over, nb = 0
    cdef bint in_log = det._log, log_only = det.space == "log", reset = False
    cdef double alpha = det._alpha, beta = det._beta, ema_sd = det._ema_sd
    cdef double threshold = det.threshold, floor = det.min_rise if det._log else 0.0
    cdef double ema = det._ema, prev = det._prev, absdiff = det._absdiff
    cdef double cur_sum = det._cur_sum, ref = INFINITY
    cdef double v, x, d, t, ad, e, old, rise, need
    cdef Window rec
    cdef double* blocks
    rec.cap = det.median_window
    rec.head = rec.n = 0
    rec.ring = <double*>malloc((2 * rec.cap + ref_blocks) * sizeof(double))
    if rec.ring == NULL:
        raise MemoryError()
    rec.srt = rec.ring + rec.cap
    blocks = rec.srt + rec.cap
    try:
        for x in det._recent:
            window_push(&rec, x)
        for x in det._blocks:
            blocks[nb] = x
            nb += 1
        if nb:
            ref = _py_min_of(blocks, nb)
        with nogil:
            while i < n:
                v = values[i]
                if not isfinite(v) or (in_log and v <= 0 and log_only):
                    i += 1
                    continue  # update ignores it
                if in_log and v <= 0:
                    break  # update leaves log space
                x = log(v) if in_log else v
                if cnt == 0:
                    cnt = 1
                    ema = prev = x
                    i += 1
                    continue
                # The smoothing, in locals until the point is known to be quiet.
                d = fabs(x - prev)
                if absdiff != absdiff:  # base.noise_step
                    ad = d
                else:
                    t = 5.0 * absdiff + 1e-12
                    ad = noise_rate * (t if t < d else d) + noise_keep * absdiff
                old = window_push(&rec, x)
                e = alpha * rec.srt[rec.n // 2] + beta * ema  # base.ema_step
                if cnt + 1 > warmup:
                    if not nb:
                        ref = cur_sum / cur_n if cur_n else INFINITY
                    rise = e - ref if isfinite(ref) else 0.0
                    need = threshold * (0.886 * ad) * ema_sd
                    if floor > need:
                        need = floor
                    if rise <= need:
                        over = 0
                        reset = True  # update sets _flagged to 0
                        # Divergence._learn
                        cur_sum += e
                        cur_n += 1
                        if cur_n >= block:
                            if nb == ref_blocks:  # appended, then the oldest dropped
                                memmove(blocks, blocks + 1, (nb - 1) * sizeof(double))
                                nb -= 1
                            blocks[nb] = cur_sum / cur_n
                            nb += 1
                            ref = _py_min_of(blocks, nb)
                            cur_sum, cur_n = 0.0, 0
                    elif over + 1 < patience:
                        over += 1  # rising, not yet for long enough: no signal
                    else:
                        window_unpush(&rec, x, old)
                        break  # flagged
                cnt += 1
                prev, absdiff, ema = x, ad, e
                i += 1
        det._n, det._ema, det._prev, det._absdiff = cnt, ema, prev, absdiff
        det._recent = [rec.ring[(rec.head + j) % rec.cap] for j in range(rec.n)]
        det._blocks = [blocks[j] for j in range(nb)]
        det._cur_sum, det._cur_n, det._over = cur_sum, cur_n, over
        if reset:
            det._flagged = 0
    finally:
        free(rec.ring)
    return i
