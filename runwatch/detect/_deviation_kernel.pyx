# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""CurveDeviation's batch path, compiled: ``CurveDeviation.update_many`` point by point.

Every loss series runs through CurveDeviation, and a point's work (a median of 5, two
EMAs, the law at the step, the band, the slope test, a log bin) is a few dozen float
operations: in numpy on short stretches it cost ~1.2 us a point. Here each point goes
through the same operations in the same order as ``CurveDeviation._update`` (Python's
``max`` tie-breaking, a stable sort of the median's window, sums left to right, libm's
``pow``/``log``/``log2`` as Python's float ``**``, ``math.log``, ``math.log2`` call them),
with the state held in C between the points Python must run: a refit, the first point
with an LR, an "above" flag that starts afresh, and any point where ``**`` would not be
finite (Python raises on overflow). Flagged points are returned as events for Python to
build their signals. ``tests/detect/test_batch.py`` checks signals and state bit for bit.

Divisors: the fit's step is >= 1, the ring's length (``stall_window``) >= 2 and a
batch's length > 0 where they divide (``cdivision`` is safe).
"""

import math

from libc.math cimport fabs, isfinite, log, log2, pow, sqrt
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.stdlib cimport free, malloc

from runwatch._pyfloat cimport py_max, stable_sort

from runwatch.detect.base import NOISE_KEEP, NOISE_RATE
from runwatch.expect.powerlaw import PowerLaw

cdef double PY_NAN = math.nan  # the bits of math.nan, which update assigns
cdef double RATE = NOISE_RATE
cdef double KEEP = NOISE_KEEP
cdef long long LIM = (<long long> 1) << 53, LIM2 = (<long long> 1) << 62

cdef enum:
    _ABOVE = 0
    _BELOW = 1
    _STALLED = 2

ABOVE, BELOW, STALLED = _ABOVE, _BELOW, _STALLED  # the kinds of ``Run.events``


cdef class Run:
    """One ``update_many`` call's state in C. ``run(j)`` loads the detector's state,
    feeds points from ``j`` on and stores the state back; between calls Python runs the
    point ``run`` stopped at. The slope test's history is kept as a ring mirrored into
    ``d._hist`` (only what changed), with each entry's law term cached while the law
    stays the same object."""

    cdef object d
    cdef long long* st
    cdef double* x
    cdef const double[::1] s1
    cdef const double[::1] s2
    cdef bint with_areas
    cdef Py_ssize_t m
    cdef public list events
    cdef readonly bint ok
    # parameters
    cdef double alpha, beta, ema_sd, band_sigmas, bs_sqrt2, rel_margin, extrap_rel
    cdef double learn_frac, stall_frac, stall_min, unseen_anneal
    cdef long long patience, adapt_after, per_octave
    # state
    cdef long long n, next_fit, over, under, flagged, stalled
    cdef double ema, prev, absdiff, exp_ema, last_learned, fit_step, val_err, s2_seen
    cdef double rec[5]
    cdef int nrec
    cdef bint by_area, dropped
    cdef int lawk  # 0 no law, 1 PowerLaw, 2 AreaLaw
    cdef double E, A, a_exp, s0, C
    cdef object law
    # slope-test history ring: oldest at head
    cdef Py_ssize_t cap, hn, head, pending
    cdef long long* hs
    cdef double* he
    cdef double* hs1
    cdef double* hf
    cdef long long* hg
    cdef long long gen
    cdef list hist_list
    cdef object hist_last
    # the bin being added to
    cdef dict bins
    cdef object cur_list
    cdef long long cur_k, cur_steps
    cdef bint cur_new
    cdef int n_extra
    cdef double cur_v, cur_n, cur_e1, cur_e2

    def __cinit__(self, d, list steps, list values, s1, s2):
        """``ok`` is False (nothing done) unless the steps are ints within 2^53 and the
        values floats, as batch replay gives them (``s1``, ``s2``: each point's LR areas,
        NaN before the LR; None without)."""
        self.d = d
        self.events = []
        self.hist_list = None
        self.law = None
        self.gen = 0
        cdef Py_ssize_t m = len(values), j
        self.m = m
        self.cap = d.stall_window
        self.st = <long long*> malloc((m + 1) * sizeof(long long))
        self.x = <double*> malloc((m + 1) * sizeof(double))
        self.hs = <long long*> malloc(self.cap * sizeof(long long))
        self.hg = <long long*> malloc(self.cap * sizeof(long long))
        self.he = <double*> malloc(self.cap * sizeof(double))
        self.hs1 = <double*> malloc(self.cap * sizeof(double))
        self.hf = <double*> malloc(self.cap * sizeof(double))
        if not (self.st and self.x and self.hs and self.hg and self.he and self.hs1 and self.hf):
            raise MemoryError()
        self.ok = False
        self.with_areas = s1 is not None
        if self.with_areas:
            self.s1 = s1
            self.s2 = s2
            if self.s1.shape[0] != m or self.s2.shape[0] != m:
                return
        if len(steps) != m:
            return
        cdef long long step, big = 0
        cdef int overflow = 0
        for j in range(m):
            o = steps[j]
            v = values[j]
            if type(o) is not int or type(v) is not float:
                return
            step = PyLong_AsLongLongAndOverflow(o, &overflow)
            if overflow:
                return
            if step > big:
                big = step
            elif -step > big:
                big = -step
            self.st[j] = step
            self.x[j] = v
        # Steps are compared as doubles, and a bin's steps summed in 64 bits.
        if big >= LIM or (m and big >= LIM2 // m):
            return
        self.ok = True
        self.alpha = d._alpha
        self.beta = d._beta
        self.ema_sd = d._ema_sd
        self.band_sigmas = d.band_sigmas
        self.bs_sqrt2 = self.band_sigmas * sqrt(2.0)
        self.rel_margin = d.rel_margin
        self.extrap_rel = d.extrap_rel
        self.learn_frac = d.learn_frac
        self.stall_frac = d.stall_frac
        self.stall_min = d.stall_min
        self.unseen_anneal = d.unseen_anneal
        self.patience = d.patience
        self.adapt_after = d.adapt_after

    def __dealloc__(self):
        free(self.st)
        free(self.x)
        free(self.hs)
        free(self.hg)
        free(self.he)
        free(self.hs1)
        free(self.hf)

    cdef void _push(self, long long step, double e, double a1, double f, long long g) noexcept:
        """Append to the history ring (dropping the oldest when full), as ``_stall_check``
        appends to ``_hist``."""
        cdef Py_ssize_t k
        if self.hn < self.cap:
            k = (self.head + self.hn) % self.cap
            self.hn += 1
        else:
            k = self.head
            self.head = (self.head + 1) % self.cap
        self.hs[k] = step
        self.he[k] = e
        self.hs1[k] = a1
        self.hf[k] = f
        self.hg[k] = g

    cdef int _load(self) except -1:
        d = self.d
        self.n = d._n
        self.next_fit = d._next_fit
        self.over = d._over
        self.under = d._under
        self.flagged = d._flagged
        self.stalled = d._stalled
        self.ema = d._ema
        self.prev = d._prev
        self.absdiff = d._absdiff
        self.exp_ema = d._exp_ema
        self.last_learned = d._last_learned
        self.fit_step = d._fit_step
        self.val_err = d._val_err
        self.s2_seen = d._s2_seen
        self.by_area = d._by_area
        self.nrec = 0
        for v in d._recent:
            self.rec[self.nrec] = v
            self.nrec += 1
        law = d._law
        if law is not self.law:
            self.gen += 1  # the cached law terms were of another law
            self.law = law
        self.dropped = False
        self.lawk = 0
        if law is not None:
            self.lawk = 1 if law.__class__ is PowerLaw else 2
            self.E = law.E
            self.A = law.A
            self.a_exp = -law.alpha
            if self.lawk == 1:
                self.s0 = law.s0
            else:
                self.C = law.C
        cdef list lst = d._hist
        last = lst[len(lst) - 1] if lst else None
        if lst is not self.hist_list:
            self.hn = self.head = 0
            for h in lst:
                self._push(h[0], h[1], h[2], 0.0, -1)
            self.hist_list = lst
        elif last is not self.hist_last:
            self._push(last[0], last[1], last[2], 0.0, -1)  # update appended one entry
        self.hist_last = last
        self.pending = 0
        b = d._bins
        self.bins = b._bins
        self.per_octave = b.per_octave
        self.n_extra = b.extra
        self.cur_list = None
        self.cur_k = -1
        return 0

    cdef int _store(self) except -1:
        d = self.d
        self._flush()
        d._n = self.n
        d._over = self.over
        d._under = self.under
        d._flagged = self.flagged
        d._stalled = self.stalled
        d._ema = self.ema
        d._prev = self.prev
        d._absdiff = self.absdiff
        d._exp_ema = self.exp_ema
        d._last_learned = self.last_learned
        d._recent = [self.rec[i] for i in range(self.nrec)]
        if self.dropped:
            d._law = None
        cdef Py_ssize_t new = self.pending if self.pending < self.hn else self.hn
        cdef Py_ssize_t i, k
        if new:
            lst = self.hist_list
            fresh = []
            for i in range(self.hn - new, self.hn):
                k = (self.head + i) % self.cap
                a1 = self.hs1[k]
                fresh.append((self.hs[k], self.he[k], a1 if a1 == a1 else math.nan))
            if new == self.hn:
                lst[:] = fresh
            else:
                lst.extend(fresh)
                if len(lst) > self.cap:
                    del lst[: len(lst) - self.cap]
            self.hist_last = lst[len(lst) - 1]
            self.pending = 0
        return 0

    cdef int _flush(self) except -1:
        """The bin being added to, back into the dict (a new one is made here: bins are
        made in the order ``update`` makes them)."""
        if self.cur_k < 0:
            return 0
        if self.cur_new:
            b = [self.cur_steps, self.cur_v, self.cur_n]
            if self.n_extra:
                b += [self.cur_e1, self.cur_e2]
            self.bins[self.cur_k] = b
        else:
            b = self.cur_list
            b[0] = b[0] + self.cur_steps
            b[1] = self.cur_v
            b[2] = self.cur_n
            if self.n_extra:
                b[3] = self.cur_e1
                b[4] = self.cur_e2
        self.cur_k = -1
        self.cur_list = None
        return 0

    cdef int _learn(self, long long step, double v, double a1, double a2) except -1:
        """``CurveDeviation._learn``: ``LogBins.add`` into the current bin."""
        cdef long long k = <long long> (
            self.per_octave * log2(<double> (step if step > 0 else 0) + 1.0)
        )
        if k != self.cur_k:
            self._flush()
            self.cur_k = k
            b = self.bins.get(k)
            self.cur_new = b is None
            if self.cur_new:
                self.cur_steps = step
                self.cur_v = v
                self.cur_n = 1.0
                self.cur_e1 = a1
                self.cur_e2 = a2
            else:
                self.cur_list = b
                self.cur_steps = step
                self.cur_v = b[1]
                self.cur_v += v
                self.cur_n = b[2]
                self.cur_n += 1.0
                if self.n_extra:
                    self.cur_e1 = b[3]
                    self.cur_e1 += a1
                    self.cur_e2 = b[4]
                    self.cur_e2 += a2
        else:
            self.cur_steps += step
            self.cur_v += v
            self.cur_n += 1.0
            if self.n_extra:
                self.cur_e1 += a1
                self.cur_e2 += a2
        if <double> step > self.last_learned:
            self.last_learned = <double> step
        return 0

    def run(self, Py_ssize_t j):
        """Feed points ``j``, ``j + 1``, ... as ``update`` would, up to the first Python
        must run (returned; ``m``: all of them). Flags go to ``events`` as ``(j, ABOVE or
        BELOW, count, smoothed, expected, half-width)`` or ``(j, STALLED, smoothed,
        s_then, e_then, d_exp, d_obs)``."""
        self._load()
        try:
            return self._run(j)
        finally:
            self._store()

    cdef Py_ssize_t _run(self, Py_ssize_t j) except -1:
        cdef Py_ssize_t m = self.m, i, k, t
        cdef long long step, nn, o
        cdef double stepd, v, a1, a2, dd, ad, e, med, p, fwd, part, ee, sigma
        cdef double half, then, d_exp, d_obs, need
        cdef double srt[5]
        cdef bint has_ar, new_anneal, test
        cdef int lawk
        while j < m:
            step = self.st[j]
            stepd = <double> step
            v = self.x[j]
            if not isfinite(v):
                j += 1
                continue  # update skips it
            a1 = PY_NAN
            a2 = PY_NAN
            has_ar = False
            if self.with_areas:
                a1 = self.s1[j]
                a2 = self.s2[j]
                has_ar = a1 == a1
            if has_ar != self.by_area:
                return j  # the LR arrives (update starts afresh), or is missing: Python
            nn = self.n + 1
            if nn >= self.next_fit:
                return j  # a refit
            # _smooth, into locals: nothing is stored before the point is sure to finish
            if nn == 1:
                e = v
                ad = self.absdiff
            else:
                dd = fabs(v - self.prev)
                ad = self.absdiff
                if ad != ad:
                    ad = dd
                else:
                    p = 5.0 * ad + 1e-12
                    ad = RATE * (p if p < dd else dd) + KEEP * ad
                k = self.nrec - 4 if self.nrec == 5 else 0
                t = 0
                for i in range(k, self.nrec):
                    srt[t] = self.rec[i]
                    t += 1
                srt[t] = v
                t += 1
                stable_sort(srt, t)
                med = srt[t // 2]
                e = self.alpha * med + self.beta * self.ema
            lawk = self.lawk
            if lawk and stepd > 2.0 * self.last_learned:
                lawk = 0  # too far beyond what the fit has seen: the law is dropped
            if lawk == 0:
                self._smoothed(nn, v, e, ad)
                if self.lawk:
                    self.lawk = 0
                    self.dropped = True
                self.exp_ema = PY_NAN
                self.over = self.under = self.flagged = 0
                self._learn(step, v, a1, a2)
                j += 1
                continue
            if lawk == 1:
                p = pow(py_max(stepd + self.s0, 1e-9), self.a_exp)
                if not isfinite(p):
                    return j
                fwd = self.A * p
                part = fwd
            else:
                p = pow(py_max(a1, 1e-300), self.a_exp)
                if not isfinite(p):
                    return j
                fwd = self.A * p
                part = fwd - self.C * a2
            ee = part + self.E
            if self.exp_ema == self.exp_ema:
                ee = self.alpha * ee + self.beta * self.exp_ema
            sigma = 0.886 * ad * self.ema_sd
            half = py_max(
                self.band_sigmas * sigma,
                (self.rel_margin + self.val_err
                 + self.extrap_rel * log(py_max(stepd, self.fit_step) / self.fit_step))
                * fabs(ee),
            )
            new_anneal = False
            if lawk == 2:
                new_anneal = a2 > self.s2_seen
                half += self.unseen_anneal * self.C * py_max(a2 - self.s2_seen, 0.0)
            if e > ee + half:
                o = self.over + 1
                if o >= self.patience and self.flagged + 1 >= self.adapt_after:
                    return j  # update starts afresh there
                self._smoothed(nn, v, e, ad)
                self.exp_ema = ee
                self.over = o
                self.under = 0
                if o >= self.patience:
                    self.flagged += 1
                    self.events.append((j, _ABOVE, o, e, ee, half))
                j += 1
                continue
            # The slope test, against the entry stall_window - 1 places back.
            test = False
            if self.hn == self.cap:
                t = (self.head + 1) % self.cap  # stall_window >= 2
                if self.hs[t] < step:
                    test = True
                    if self.hg[t] == self.gen:
                        then = self.hf[t]
                    else:
                        if lawk == 1:
                            p = pow(py_max(<double> self.hs[t] + self.s0, 1e-9), self.a_exp)
                        else:
                            p = pow(py_max(self.hs1[t], 1e-300), self.a_exp)
                        if not isfinite(p):
                            return j
                        then = self.A * p
                        self.hf[t] = then
                        self.hg[t] = self.gen
            self._smoothed(nn, v, e, ad)
            self.exp_ema = ee
            self.over = self.flagged = 0
            self._push(step, e, a1 if has_ar else PY_NAN, fwd, self.gen)
            self.pending += 1
            if test:
                d_exp = then - fwd
                d_obs = self.he[t] - e
                need = py_max(self.bs_sqrt2 * sigma, self.stall_min * fabs(e))
                if d_exp > need and d_obs < self.stall_frac * d_exp:
                    self.stalled += 1
                    if self.stalled >= self.patience:
                        self.events.append(
                            (j, _STALLED, e, self.hs[t], self.he[t], d_exp, d_obs)
                        )
                        j += 1
                        continue
                else:
                    self.stalled = 0
            if e <= ee + self.learn_frac * half:
                self._learn(step, v, a1, a2)
            if e < ee - half and not new_anneal:
                self.under += 1
                if self.under >= self.patience:
                    self.events.append((j, _BELOW, self.under, e, ee, half))
            else:
                self.under = 0
            j += 1
        return j

    cdef inline void _smoothed(self, long long nn, double v, double e, double ad) noexcept:
        """Store ``_smooth``'s state after point ``v`` (``nn``: the count with it)."""
        self.n = nn
        self.ema = e
        self.absdiff = ad
        self.prev = v
        if nn == 1:
            self.rec[0] = v
            self.nrec = 1
        elif self.nrec < 5:
            self.rec[self.nrec] = v
            self.nrec += 1
        else:
            self.rec[0] = self.rec[1]
            self.rec[1] = self.rec[2]
            self.rec[2] = self.rec[3]
            self.rec[3] = self.rec[4]
            self.rec[4] = v
