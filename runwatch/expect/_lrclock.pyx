# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""``LRClock.add`` over a whole logged LR series, compiled (batch replay's LR feed).

Written operation for operation as ``LRClock.add`` in ``lrclock.py``, which stays the
definition (``tests/expect/test_lrclock.py`` checks the two agree bit for bit): Python's
``x ** k`` is ``pow``, its ``int * float`` converts the int first, ``k * (k + 1) / 2`` is
an exact integer divided once.
"""

import numpy as np

from libc.math cimport isfinite, pow
from libc.stdint cimport int64_t

# Past this gap ``k * (k + 1)`` no longer fits in 64 bits: Python's integers do it.
cdef int64_t _EXACT_GAP = 3_000_000_000


def advance(last, const int64_t[::1] steps, const double[::1] lrs, const double[::1] g,
            double decay):
    """Feed (``steps``, ``lrs``) after the clock's state ``last`` (None: no LR yet), as
    ``LRClock.add`` point by point would, skipping non-finite LRs (the Monitor never feeds
    them). ``g``: the decay sums g(k), k = 0..len(g) - 1 (a longer gap takes the last).

    Returns (made, states): the index of the input point that made each new state (an
    int64 array) and the states, one row each: (step, lr, S1, S2, momentum), floats.
    """
    cdef Py_ssize_t n = steps.shape[0], i, count = 0
    cdef Py_ssize_t top = g.shape[0] - 1
    made_arr = np.empty(n, dtype=np.int64)
    out_arr = np.empty((n, 5), dtype=np.float64)
    cdef int64_t[::1] made = made_arr
    cdef double[:, ::1] out = out_arr
    cdef bint have = last is not None
    cdef int64_t prev = 0, step, k
    cdef double eta = 0.0, s1 = 0.0, s2 = 0.0, m = 0.0, lr, d, dd, gk, lam_k, tri
    cdef double keep = 1.0 - decay
    if have:
        prev, eta, s1, s2, m = last
    for i in range(n):
        lr = lrs[i]
        if not isfinite(lr):
            continue
        step = steps[i]
        if not have:
            # Before the first logged step the LR is held at its first value (np.interp).
            eta, s1, s2, m = lr, lr * <double>((step if step > 0 else 0) + 1), 0.0, 0.0
            have = True
        else:
            k = step - prev
            if k <= 0:
                continue  # a repeated step keeps the LR first logged for it
            d = (lr - eta) / <double>k  # the LR's change per step over the gap
            dd = 0.0 if 0.0 < d else d  # only decreases feed the annealing momentum
            gk = g[k if k < top else top]
            lam_k = pow(decay, <double>k)
            if k < _EXACT_GAP:
                tri = <double>(k * (k + 1)) / 2.0
            else:
                tri = (<object>k) * ((<object>k) + 1) / 2
            s1 = s1 + <double>k * eta + d * tri
            s2 = s2 + m * gk - dd / keep * (<double>k - gk)
            m = lam_k * m - dd * (1.0 - lam_k) / keep
            eta = lr
        prev = step
        made[count] = i
        out[count, 0] = <double>step
        out[count, 1] = eta
        out[count, 2] = s1
        out[count, 3] = s2
        out[count, 4] = m
        count += 1
    return made_arr[:count], out_arr[:count]
