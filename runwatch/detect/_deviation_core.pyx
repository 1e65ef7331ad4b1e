# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""CurveDeviation's state and per-point step, compiled (the Python face is
``runwatch.detect.deviation.CurveDeviation``).

``CurveDeviationCore`` holds everything the detector learns point by point: the running
median of 5 and its EMA, the noise EMA, the expected value's EMA, the counters of points
above, below and stalled, the slope test's history ring and the log bins of the learned
points. A point's step is ``_begin`` (count and smooth it, start on the LR-aware law when
the LR first comes) then ``_finish`` (the law term, the band, the slope test, the bins);
``update`` (one point) and ``update_many`` (arrays) both run these two.

Refits stay in Python (the fits are numpy): when one is due, the core stops between the
two halves and says so (``update`` returns ``REFIT_DUE``, ``update_many`` returns the
point's index); the face refits from ``bins()``, hands the law over with ``set_law`` or
``drop_law`` and calls ``resume()`` to finish the point. If the refit raises, the point
stays half way (smoothed, not judged) and the next refit is due at the next point, as
when ``update`` raised there.

Flags come back as records, 6-tuples of plain numbers the face builds a ``Signal`` from:
``(ABOVE or BELOW, points in a row, smoothed, expected, half-width, fit step)`` or
``(STALLED, step then, smoothed, smoothed then, expected fall, observed fall)``.

Divisors: the fit's step is >= 1 and the ring's length (``stall_window``) >= 2 where they
divide (``cdivision`` is safe).
"""

cimport cython
from libc.math cimport NAN, fabs, isfinite, isinf, log, log2, pow, sqrt
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memset

import numpy as np

from runwatch._pyfloat cimport py_max, stable_sort

from runwatch.detect.base import NOISE_KEEP, NOISE_RATE
from runwatch.expect.binning import PER_OCTAVE
from runwatch.expect.lrlaw import AreaLaw

cdef double RATE = NOISE_RATE
cdef double KEEP = NOISE_KEEP
cdef double BINS_PER_OCTAVE = PER_OCTAVE

cdef enum:
    _ABOVE = 0
    _BELOW = 1
    _STALLED = 2

cdef enum:  # the law a point is judged by
    NO_LAW = 0
    POWER = 1  # PowerLaw in the step
    AREA = 2  # AreaLaw in the LR areas
    REFERENCE = 3  # a reference run's curve, its value at each point given

ABOVE, BELOW, STALLED = _ABOVE, _BELOW, _STALLED  # the kinds of flag records


REFIT_DUE = "refit due"  # what update returns when a refit must come first (a sentinel)


cdef struct Entry:  # one point of the slope test's history
    double step
    double ema  # the smoothed value then
    double s1  # the forward LR area then (NaN: no LR)
    double term  # the law's varying term at the point, valid while gen is the law's
    long long gen


cdef struct Bin:  # sums of the points learned in one log bin (n = 0: empty)
    double steps
    double value
    double n
    double s1
    double s2


cdef enum:
    BIN_FIELDS = 5  # doubles per Bin


@cython.final
cdef class CurveDeviationCore:
    """CurveDeviation's state and step; parameters as ``CurveDeviation`` validated them
    (``max_val_err`` and ``fit_from`` belong to the refit, in Python)."""

    # parameters
    cdef readonly long long span, patience, min_points, stall_window, adapt_after
    cdef readonly double band_sigmas, rel_margin, refit_growth, extrap_rel, learn_frac
    cdef readonly double stall_frac, stall_min, unseen_anneal
    cdef double alpha, beta, ema_sd, bs_sqrt2
    # the smoothing
    cdef long long n
    cdef double ema, prev, absdiff
    cdef double recent[5]
    cdef int nrec
    # judging
    cdef long long next_fit, over, under, flagged, stalled
    cdef double exp_ema, last_learned, fit_step, val_err, s2_seen
    cdef bint by_area, ref_mode
    cdef double ref_fit_step
    cdef object _law
    cdef int lawk
    cdef double E, A, neg_alpha, s0, C
    cdef long long gen  # changes whenever the law does (the ring's cached terms expire)
    # the slope test's history: a ring of stall_window entries, oldest at head
    cdef Entry* ring
    cdef Py_ssize_t head, hn
    # the learned points' log bins, by bin index
    cdef Bin* binv
    cdef Py_ssize_t bcap, bhi, nbins
    # a point half way, waiting for a refit
    cdef bint pending
    cdef double p_step, p_v, p_a1, p_a2, p_ref
    # the last flag
    cdef int r_kind
    cdef long long r_count
    cdef double r_a, r_b, r_c, r_d, r_e

    def __cinit__(self, *args, **kwargs):
        self.ring = NULL
        self.binv = NULL

    def __init__(
        self,
        long long span,
        double band_sigmas,
        double rel_margin,
        long long patience,
        long long min_points,
        double refit_growth,
        double extrap_rel,
        double learn_frac,
        long long stall_window,
        double stall_frac,
        double stall_min,
        long long adapt_after,
        double unseen_anneal,
    ):
        self.span = span
        self.band_sigmas = band_sigmas
        self.rel_margin = rel_margin
        self.patience = patience
        self.min_points = min_points
        self.refit_growth = refit_growth
        self.extrap_rel = extrap_rel
        self.learn_frac = learn_frac
        self.stall_window = stall_window
        self.stall_frac = stall_frac
        self.stall_min = stall_min
        self.adapt_after = adapt_after
        self.unseen_anneal = unseen_anneal
        self.alpha = 2.0 / (span + 1.0)
        self.beta = 1.0 - self.alpha
        self.ema_sd = sqrt(self.alpha / (2.0 - self.alpha))
        self.bs_sqrt2 = band_sigmas * sqrt(2.0)
        free(self.ring)
        free(self.binv)
        self.ring = <Entry*> malloc(stall_window * sizeof(Entry))
        self.bcap = 64
        self.binv = <Bin*> malloc(self.bcap * sizeof(Bin))
        if self.ring == NULL or self.binv == NULL:
            raise MemoryError()
        memset(self.binv, 0, self.bcap * sizeof(Bin))
        self.bhi = self.nbins = 0
        self.head = self.hn = 0
        self.n = 0
        self.ema = self.prev = self.absdiff = NAN
        self.nrec = 0
        self.next_fit = min_points
        self.over = self.under = self.flagged = self.stalled = 0
        self.exp_ema = NAN
        self.last_learned = 0.0
        self.fit_step = 0.0
        self.val_err = 0.0
        self.s2_seen = 0.0
        self.by_area = self.ref_mode = False
        self.ref_fit_step = 1.0
        self._law = None
        self.lawk = NO_LAW
        self.gen = 0
        self.pending = False

    def __dealloc__(self):
        free(self.ring)
        free(self.binv)

    # ------------------------------------------------------------------ the step
    cdef int _begin(self, double step, double v, double a1, double a2) except -1:
        """The point's first half: count and smooth it; on the first point with an LR,
        start afresh on the LR-aware law. Returns 1 when a refit is due before
        ``_finish``."""
        cdef double d, ad, t
        cdef double srt[5]
        cdef int i
        if not isfinite(step):
            raise ValueError(f"step {step} is not a finite number")
        self.n += 1
        if self.n == 1:
            self.ema = self.prev = v
            self.recent[0] = v
            self.nrec = 1
        else:
            d = fabs(v - self.prev)
            self.prev = v
            ad = self.absdiff
            if ad != ad:
                ad = d
            else:
                t = 5.0 * ad + 1e-12  # one jump barely moves the noise EMA
                ad = RATE * (t if t < d else d) + KEEP * ad
            self.absdiff = ad
            if self.nrec == 5:
                for i in range(4):
                    self.recent[i] = self.recent[i + 1]
                self.recent[4] = v
            else:
                self.recent[self.nrec] = v
                self.nrec += 1
            for i in range(self.nrec):
                srt[i] = self.recent[i]
            stable_sort(srt, self.nrec)
            self.ema = self.alpha * srt[self.nrec // 2] + self.beta * self.ema
        if self.ref_mode:
            self.fit_step = self.ref_fit_step
            return 0
        if (a1 == a1) != self.by_area:
            if self.by_area:
                raise ValueError("the LR areas of a point are missing after the LR came")
            self._start_by_area()
        return self.n >= self.next_fit

    cdef int _finish(self, double step, double v, double a1, double a2, double ref) except -1:
        """The point's second half, after ``_begin`` (and the refit it asked for): the
        expected value, the band, the slope test, the bins. Returns 1 when the point is
        flagged (the record is in ``r_*``)."""
        cdef int lawk
        cdef double e = self.ema, fwd, ee, sigma, half, then = 0.0
        cdef double s_then = 0.0, e_then = 0.0, d_exp, d_obs, need
        cdef bint new_anneal = False, test = False
        cdef Entry* old
        if self.ref_mode:
            lawk = REFERENCE if ref == ref else NO_LAW  # NaN: beyond the reference
            a1 = a2 = NAN
        else:
            lawk = self.lawk
            if lawk != NO_LAW and step > 2.0 * self.last_learned:
                # Too far beyond what the fit has seen (a huge step gap): refit first.
                self._drop_law()
                lawk = NO_LAW
        if lawk == NO_LAW:
            self.exp_ema = NAN
            self.over = self.under = self.flagged = 0
            self._learn(step, v, a1, a2)
            return 0
        if lawk == POWER:
            fwd = self.A * self._pow(py_max(step + self.s0, 1e-9))
            ee = fwd + self.E
        elif lawk == AREA:
            fwd = self.A * self._pow(py_max(a1, 1e-300))
            ee = (fwd - self.C * a2) + self.E
        else:
            fwd = ref
            ee = ref + 0.0  # the reference is all law, no constant
        if self.exp_ema == self.exp_ema:
            ee = self.alpha * ee + self.beta * self.exp_ema
        self.exp_ema = ee
        sigma = 0.886 * self.absdiff * self.ema_sd
        half = py_max(
            self.band_sigmas * sigma,
            (self.rel_margin + self.val_err
             + self.extrap_rel * log(py_max(step, self.fit_step) / self.fit_step)) * fabs(ee),
        )
        if lawk == AREA:
            # An anneal beyond any the fit has seen: its predicted drop is not trusted,
            # and a loss falling faster than expected meanwhile is no news.
            new_anneal = a2 > self.s2_seen
            half += self.unseen_anneal * self.C * py_max(a2 - self.s2_seen, 0.0)
        if e > ee + half:
            self.over += 1
            self.under = 0
            if self.over < self.patience:
                return 0
            self.flagged += 1
            self._flag(_ABOVE, self.over, e, ee, half, self.fit_step, 0.0)
            if self.flagged >= self.adapt_after and not self.ref_mode:
                self._start_afresh()
                self.over = self.flagged = 0
            return 1
        self.over = self.flagged = 0
        # The slope test: the fall of the smoothed value since the entry stall_window - 1
        # places back against the law's fall over the same steps (with the LR-aware law,
        # its forward-area term only: an anneal's extra drop is never required).
        if self.hn == self.stall_window:
            old = &self.ring[(self.head + 1) % self.stall_window]  # stall_window >= 2
            s_then = old.step
            e_then = old.ema
            if s_then < step:
                test = True
                if old.gen == self.gen:
                    then = old.term
                else:
                    if lawk == POWER:
                        then = self.A * self._pow(py_max(s_then + self.s0, 1e-9))
                    elif lawk == AREA:
                        then = self.A * self._pow(py_max(old.s1, 1e-300))
                    else:  # pragma: no cover - set_reference renews every entry's term
                        then = NAN
                    old.term = then
                    old.gen = self.gen
        self._push(step, e, a1, fwd)
        if test:
            d_exp = then - fwd
            d_obs = e_then - e
            need = py_max(self.bs_sqrt2 * sigma, self.stall_min * fabs(e))
            if d_exp > need and d_obs < self.stall_frac * d_exp:
                self.stalled += 1
                if self.stalled >= self.patience:
                    self._flag(_STALLED, 0, s_then, e, e_then, d_exp, d_obs)
                    return 1
            else:
                self.stalled = 0
        if e <= ee + self.learn_frac * half:
            self._learn(step, v, a1, a2)
        if e < ee - half and not new_anneal:
            self.under += 1
            if self.under >= self.patience:
                self._flag(_BELOW, self.under, e, ee, half, self.fit_step, 0.0)
                return 1
        else:
            self.under = 0
        return 0

    cdef inline double _pow(self, double x) except? -1.0:
        """``x ** -alpha`` of the law, raising where Python's float power would."""
        cdef double p = pow(x, self.neg_alpha)
        if isinf(p) and isfinite(x):
            raise OverflowError("the expected curve overflows at this point")
        return p

    cdef inline void _flag(
        self, int kind, long long count, double a, double b, double c, double d, double e
    ) noexcept:
        self.r_kind = kind
        self.r_count = count
        self.r_a = a
        self.r_b = b
        self.r_c = c
        self.r_d = d
        self.r_e = e

    cdef tuple _record(self):
        if self.r_kind == _STALLED:
            return (_STALLED, self.r_a, self.r_b, self.r_c, self.r_d, self.r_e)
        return (self.r_kind, self.r_count, self.r_a, self.r_b, self.r_c, self.r_d)

    cdef inline void _push(self, double step, double e, double a1, double term) noexcept:
        """Append to the history ring, dropping the oldest entry when it is full."""
        cdef Py_ssize_t k
        if self.hn < self.stall_window:
            k = (self.head + self.hn) % self.stall_window
            self.hn += 1
        else:
            k = self.head
            self.head = (self.head + 1) % self.stall_window
        self.ring[k].step = step
        self.ring[k].ema = e
        self.ring[k].s1 = a1
        self.ring[k].term = term
        self.ring[k].gen = self.gen

    cdef int _learn(self, double step, double v, double a1, double a2) except -1:
        """Add the point to its log bin (``runwatch.expect.LogBins``' bins:
        ``PER_OCTAVE`` per doubling of the step)."""
        cdef Py_ssize_t k = <Py_ssize_t> (BINS_PER_OCTAVE * log2(py_max(step, 0.0) + 1.0))
        cdef Py_ssize_t cap
        cdef Bin* b
        if k >= self.bcap:
            cap = max(2 * self.bcap, k + 1)
            b = <Bin*> realloc(self.binv, cap * sizeof(Bin))
            if b == NULL:
                raise MemoryError()
            memset(b + self.bcap, 0, (cap - self.bcap) * sizeof(Bin))
            self.binv = b
            self.bcap = cap
        b = &self.binv[k]
        if b.n == 0.0:
            b.steps = step
            b.value = v
            b.n = 1.0
            b.s1 = a1
            b.s2 = a2
            self.nbins += 1
            if k >= self.bhi:
                self.bhi = k + 1
        else:
            b.steps += step
            b.value += v
            b.n += 1.0
            b.s1 += a1
            b.s2 += a2
        if step > self.last_learned:
            self.last_learned = step
        return 0

    cdef void _drop_law(self) noexcept:
        self._law = None
        self.lawk = NO_LAW
        self.gen += 1

    cdef void _start_afresh(self) noexcept:
        """Forget the bins and the law: the next fit is ``min_points`` points away."""
        memset(self.binv, 0, self.bhi * sizeof(Bin))
        self.bhi = self.nbins = 0
        self._drop_law()
        self.next_fit = self.n + self.min_points

    cdef void _start_by_area(self) noexcept:
        """The LR has come: from here the bins keep each point's areas too."""
        self.by_area = True
        self._start_afresh()
        self.head = self.hn = 0

    # ------------------------------------------------------------------ Python's side
    def update(self, double step, double value, double s1=NAN, double s2=NAN, double ref=NAN):
        """One point: None, a flag record, or ``REFIT_DUE`` (refit, then ``resume()``).

        ``s1``, ``s2``: the point's LR areas (NaN: no LR); ``ref``: the reference curve
        at the step in reference mode (NaN: beyond it). A non-finite value is skipped.
        """
        self.pending = False
        if not isfinite(value):
            return None
        if self._begin(step, value, s1, s2):
            self._wait(step, value, s1, s2, ref)
            return REFIT_DUE
        if self._finish(step, value, s1, s2, ref):
            return self._record()
        return None

    def update_many(
        self,
        const double[::1] steps,
        const double[::1] values,
        const double[::1] s1=None,
        const double[::1] s2=None,
        const double[::1] refs=None,
        Py_ssize_t start=0,
    ):
        """``update`` over the points from ``start`` on, up to the first that needs a
        refit or raises. Returns ``(j, flags, error)``: ``flags`` the ``(index, record)``
        of the flagged points before ``j``; ``j`` = the number of points when all are done;
        otherwise point ``j`` waits for a refit (``error`` None: refit, then ``resume()``)
        or raised ``error`` (the point is left as ``update`` left it)."""
        cdef Py_ssize_t j = start, m = values.shape[0]
        cdef bint with_areas = s1 is not None, with_refs = refs is not None
        cdef double step, v, a1 = NAN, a2 = NAN, ref = NAN
        cdef list flags = []
        if steps.shape[0] != m or (with_areas and (s1.shape[0] != m or s2.shape[0] != m)):
            raise ValueError("update_many: arrays of different lengths")
        if with_refs and refs.shape[0] != m:
            raise ValueError("update_many: arrays of different lengths")
        self.pending = False
        try:
            while j < m:
                v = values[j]
                if not isfinite(v):
                    j += 1
                    continue
                step = steps[j]
                if with_areas:
                    a1 = s1[j]
                    a2 = s2[j]
                if with_refs:
                    ref = refs[j]
                if self._begin(step, v, a1, a2):
                    self._wait(step, v, a1, a2, ref)
                    return j, flags, None
                if self._finish(step, v, a1, a2, ref):
                    flags.append((j, self._record()))
                j += 1
        except Exception as exc:
            return j, flags, exc
        return j, flags, None

    cdef void _wait(self, double step, double v, double a1, double a2, double ref) noexcept:
        self.pending = True
        self.p_step = step
        self.p_v = v
        self.p_a1 = a1
        self.p_a2 = a2
        self.p_ref = ref

    def resume(self):
        """Finish the point that waited for a refit (the refit has set or dropped the
        law): None or its flag record."""
        if not self.pending:
            raise RuntimeError("no point is waiting for a refit")
        self.pending = False
        self.next_fit = <long long> (<double> self.n * self.refit_growth) + 1
        if self._finish(self.p_step, self.p_v, self.p_a1, self.p_a2, self.p_ref):
            return self._record()
        return None

    def bins(self):
        """Mean step, mean value and count per non-empty bin in step order, then (once
        the LR has come) the mean S1 and S2: ``LogBins.arrays()``'s arrays."""
        cdef Py_ssize_t k, i = 0
        extra = 2 if self.by_area else 0
        if self.nbins == 0:
            empty = np.empty(0)
            return (empty, empty, np.empty(0, dtype=int), *([empty] * extra))
        a = np.empty((self.nbins, BIN_FIELDS))
        cdef double[:, ::1] av = a
        for k in range(self.bhi):
            if self.binv[k].n > 0.0:
                memcpy(&av[i, 0], &self.binv[k], sizeof(Bin))
                i += 1
        n = a[:, 2]
        areas = (a[:, 3] / n, a[:, 4] / n) if extra else ()
        return (a[:, 0] / n, a[:, 1] / n, n.astype(int), *areas)

    def set_law(self, law, double val_err, double s2_seen, double fit_step):
        """Judge by ``law`` (a ``PowerLaw``, or an ``AreaLaw`` once the LR has come) from
        here, with its validation error, the largest S2 it saw and the step it was
        fitted at."""
        self._law = law
        self.gen += 1
        if isinstance(law, AreaLaw):
            self.lawk = AREA
            self.C = law.C
        else:
            self.lawk = POWER
            self.s0 = law.s0
        self.E = law.E
        self.A = law.A
        self.neg_alpha = -law.alpha
        self.val_err = val_err
        self.s2_seen = s2_seen
        self.fit_step = fit_step

    def drop_law(self):
        """Judge by no law until the next refit sets one."""
        self._drop_law()

    def set_reference(self, double fit_step, terms):
        """Reference mode: each point's expected value comes with it (``ref``), never a
        fit; ``terms``: the reference at ``history_steps()``."""
        cdef Py_ssize_t i
        cdef Entry* en
        if len(terms) != self.hn:
            raise ValueError("set_reference: one term per history entry")
        self.ref_mode = True
        self.ref_fit_step = fit_step
        self.gen += 1
        for i in range(self.hn):
            en = &self.ring[(self.head + i) % self.stall_window]
            en.term = terms[i]
            en.gen = self.gen

    def history_steps(self):
        """The steps of the slope test's history, oldest first."""
        return [self.ring[(self.head + i) % self.stall_window].step for i in range(self.hn)]

    @property
    def law(self):
        """The law points are judged by (None: none yet, or dropped)."""
        return self._law

    @property
    def n_bins(self):
        """How many log bins hold learned points."""
        return self.nbins

    # ------------------------------------------------------------------ pickling
    def __reduce__(self):
        params = (
            self.span, self.band_sigmas, self.rel_margin, self.patience, self.min_points,
            self.refit_growth, self.extrap_rel, self.learn_frac, self.stall_window,
            self.stall_frac, self.stall_min, self.adapt_after, self.unseen_anneal,
        )
        return (CurveDeviationCore, params, self.__getstate__())

    def __getstate__(self):
        cdef char* ring = <char*> self.ring
        cdef Py_ssize_t size = sizeof(Entry), k = self.head
        # The ring oldest first (its head moves only once it is full), the bins as they are.
        entries = ring[k * size : self.hn * size] + ring[: k * size]
        return (
            self.n, self.ema, self.prev, self.absdiff, [self.recent[i] for i in range(self.nrec)],
            self.next_fit, self.over, self.under, self.flagged, self.stalled,
            self.exp_ema, self.last_learned, self.fit_step, self.val_err, self.s2_seen,
            self.by_area, self.ref_mode, self.ref_fit_step, self._law, self.gen,
            entries, (<char*> self.binv)[: self.bhi * sizeof(Bin)], self.nbins,
        )

    def __setstate__(self, state):
        cdef Py_ssize_t i, nb
        cdef const char* src
        (
            self.n, self.ema, self.prev, self.absdiff, recent,
            self.next_fit, self.over, self.under, self.flagged, self.stalled,
            self.exp_ema, self.last_learned, self.fit_step, self.val_err, self.s2_seen,
            self.by_area, self.ref_mode, self.ref_fit_step, law, gen,
            entries, bins, self.nbins,
        ) = state
        self.nrec = len(recent)
        for i in range(self.nrec):
            self.recent[i] = recent[i]
        if law is None:
            self._drop_law()
        else:
            self.set_law(law, self.val_err, self.s2_seen, self.fit_step)
        self.gen = gen
        self.hn = len(entries) // sizeof(Entry)
        self.head = 0
        src = entries
        memcpy(self.ring, src, self.hn * sizeof(Entry))
        nb = len(bins) // sizeof(Bin)
        if nb > self.bcap:
            free(self.binv)
            self.binv = <Bin*> malloc(nb * sizeof(Bin))
            if self.binv == NULL:
                raise MemoryError()
            self.bcap = nb
        memset(self.binv, 0, self.bcap * sizeof(Bin))
        src = bins
        memcpy(self.binv, src, nb * sizeof(Bin))
        self.bhi = nb
        self.pending = False
