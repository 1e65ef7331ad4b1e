# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The LR areas' recurrences, compiled: the one definition behind ``LRClock`` point by
point (live watching) and over whole series (batch replay), and the annealing momentum of
``lr_areas``.

A clock's state after an LR point is (step, lr, S1, S2, momentum). Between two logged
points the LR is linear and the recurrences of ``lr_areas`` are summed over the gap in
closed form (``Areas.add``); past the last point the LR is held flat (``Areas.flat``).
"""

import numpy as np

from libc.math cimport isfinite, pow
from libc.stdint cimport int64_t

# Past this gap k·(k + 1) no longer fits in 64 bits: Python's integers form it.
cdef int64_t _EXACT_GAP = 3_000_000_000


cdef struct State:
    int64_t step
    double eta  # the LR
    double s1
    double s2
    double m  # the annealing momentum


cdef class Areas:
    """The recurrences for the momentum ``decay`` (λ), with its decay sums g(k) = λ + λ²
    + ... + λ^k for k = 0..``max_gap``: a flat LR adds m·g(k) to S2 over k steps (a
    longer gap takes g(max_gap): the momentum has decayed to nothing by then).

    Parameters
    ----------
    decay : float
        λ, in (0, 1).
    max_gap : int
        The longest gap whose decay sum is formed exactly.
    """

    cdef readonly double decay
    cdef readonly Py_ssize_t max_gap
    cdef double[::1] g

    def __init__(self, double decay, Py_ssize_t max_gap):
        cdef Py_ssize_t k
        self.decay = decay
        self.max_gap = max_gap
        self.g = np.empty(max_gap + 1)
        for k in range(max_gap + 1):
            self.g[k] = decay * (1.0 - pow(decay, <double>k)) / (1.0 - decay)

    cdef double _g(self, int64_t k) noexcept:
        return self.g[k if k < self.max_gap else self.max_gap]

    cdef bint _add(self, State* st, bint have, int64_t step, double lr) except -1:
        """Move ``st`` (``have``: it holds a state; else this is the first LR point) to
        the state after the LR point (``step``, ``lr``); False, and ``st`` unchanged,
        when ``step`` is not after the state's (a repeated step keeps the LR first logged
        for it)."""
        cdef int64_t k
        cdef double d, dd, gk, lam_k, tri, keep = 1.0 - self.decay
        if not have:
            # Before the first logged step the LR is held at its first value (np.interp).
            st.step, st.eta, st.s2, st.m = step, lr, 0.0, 0.0
            st.s1 = lr * <double>((step if step > 0 else 0) + 1)
            return True
        k = step - st.step
        if k <= 0:
            return False
        d = (lr - st.eta) / <double>k  # the LR's change per step over the gap
        dd = 0.0 if 0.0 < d else d  # only decreases feed the annealing momentum
        gk = self._g(k)
        lam_k = pow(self.decay, <double>k)
        if k < _EXACT_GAP:
            tri = <double>(k * (k + 1)) / 2.0
        else:
            tri = (<object>k) * ((<object>k) + 1) / 2
        st.s1 = st.s1 + <double>k * st.eta + d * tri
        st.s2 = st.s2 + st.m * gk - dd / keep * (<double>k - gk)
        st.m = lam_k * st.m - dd * (1.0 - lam_k) / keep
        st.eta = lr
        st.step = step
        return True

    cdef void _flat(self, const State* st, int64_t step, double* s1, double* s2) noexcept:
        """S1 and S2 at ``step`` with the LR held flat since ``st``'s step."""
        cdef int64_t k = step - st.step
        if k < 0:
            k = 0
        s1[0] = st.s1 + st.eta * <double>k
        s2[0] = st.s2 + st.m * self._g(k)

    def add(self, last, int64_t step, double lr):
        """The state after the finite LR ``lr`` logged at ``step``, after the state
        ``last`` (None: the first LR point); None when ``step`` is not after ``last``'s."""
        cdef State st
        cdef bint have = last is not None
        if have:
            st.step, st.eta, st.s1, st.s2, st.m = last
        if not self._add(&st, have, step, lr):
            return None
        return (st.step, st.eta, st.s1, st.s2, st.m)

    def flat(self, state, int64_t step):
        """(S1, S2) at ``step`` with the LR held flat since ``state``."""
        cdef State st
        cdef double s1, s2
        st.step, st.eta, st.s1, st.s2, st.m = state
        self._flat(&st, step, &s1, &s2)
        return s1, s2

    def advance(self, last, const int64_t[::1] steps, const double[::1] lrs):
        """``add`` over a series after the state ``last`` (None: no LR yet), skipping
        non-finite LRs (the Monitor never feeds them).

        Returns (made, states): the index of the input point that made each new state (an
        int64 array) and the states, one row each: (step, lr, S1, S2, momentum), floats.
        """
        cdef Py_ssize_t n = steps.shape[0], i, count = 0
        made_arr = np.empty(n, dtype=np.int64)
        out_arr = np.empty((n, 5), dtype=np.float64)
        cdef int64_t[::1] made = made_arr
        cdef double[:, ::1] out = out_arr
        cdef State st
        cdef bint have = last is not None
        if have:
            st.step, st.eta, st.s1, st.s2, st.m = last
        for i in range(n):
            if not isfinite(lrs[i]) or not self._add(&st, have, steps[i], lrs[i]):
                continue
            have = True
            made[count] = i
            out[count, 0] = <double>st.step
            out[count, 1] = st.eta
            out[count, 2] = st.s1
            out[count, 3] = st.s2
            out[count, 4] = st.m
            count += 1
        return made_arr[:count], out_arr[:count]

    def flat_many(self, const double[:, ::1] states, const int64_t[::1] idx,
                  const int64_t[::1] steps):
        """``flat`` for each point: S1 and S2 at ``steps[j]`` from the state in row
        ``idx[j]`` of ``states`` (rows as ``advance`` makes them); NaN where ``idx[j]`` is
        negative (no LR yet)."""
        cdef Py_ssize_t n = idx.shape[0], j, i
        s1_arr = np.full(n, np.nan)
        s2_arr = np.full(n, np.nan)
        cdef double[::1] s1 = s1_arr
        cdef double[::1] s2 = s2_arr
        cdef State st
        for j in range(n):
            i = idx[j]
            if i < 0:
                continue
            st.step = <int64_t>states[i, 0]
            st.eta = states[i, 1]
            st.s1 = states[i, 2]
            st.s2 = states[i, 3]
            st.m = states[i, 4]
            self._flat(&st, steps[j], &s1[j], &s2[j])
        return s1_arr, s2_arr


def momentum(const double[::1] drop, double decay):
    """m_i = λ·m_(i-1) + drop_i from m_(-1) = 0 (``decay``: λ), the annealing momentum of
    ``lr_areas``: the floats of ``scipy.signal.lfilter([1.0], [1.0, -λ], drop)``, without
    importing scipy.signal."""
    cdef Py_ssize_t n = drop.shape[0], i
    out_arr = np.empty(n)
    cdef double[::1] out = out_arr
    cdef double m = 0.0
    for i in range(n):
        m = decay * m + drop[i]
        out[i] = m
    return out_arr
