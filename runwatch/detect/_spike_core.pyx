# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Spike's state and per-point step, and the OLMo 2 spike score's, compiled.

``SpikeCore`` is the whole of a ``Spike`` detector but the parameters and the Signal: the
learned baseline (the last ``window`` accepted values), its median and noise scale, the
spike in progress and the series' spike score. ``ScoreCore`` is the spike score alone,
behind ``SpikeScore``. Live watching calls ``update`` a point at a time, replay
``update_many`` over whole series; both run the same C step.
"""

import numpy as np

from libc.math cimport fabs, isfinite, log, sqrt
from libc.stdlib cimport free, malloc
from libc.string cimport memmove

from runwatch._pyfloat cimport lower_bound, upper_bound


# ---------------------------------------------------------------- the spike score
cdef struct Score:
    double* ring       # the last ``window`` values, the oldest at ``pos`` once full
    Py_ssize_t window, k, pos, since
    double sigmas, total, sumsq
    long long n, n_spikes


cdef double _sum(const double* a, Py_ssize_t n, bint squares) noexcept nogil:
    """Compensated (Neumaier) sum of ``a[:n]`` or of their squares: the rebuilt running
    sums carry no rounding drift from the points before."""
    cdef double s = 0.0, c = 0.0, x, t
    cdef Py_ssize_t i
    for i in range(n):
        x = a[i] * a[i] if squares else a[i]
        t = s + x
        c += (s - t) + x if fabs(s) >= fabs(x) else (x - t) + s
        s = t
    return s + c


cdef bint _score_step(Score* s, double v) noexcept nogil:
    """Count the finite value ``v``; True if it is more than ``sigmas`` standard
    deviations from the mean of the window before it."""
    cdef double mean, var, old
    cdef bint spike = False
    s.n += 1
    if fabs(v) > 1e100:
        # Its square would overflow the running sums: a spike, kept out of the window.
        s.n_spikes += 1
        return True
    if s.k >= 2:
        mean = s.total / s.k
        var = s.sumsq / s.k - mean * mean
        spike = var > 0 and fabs(v - mean) > s.sigmas * sqrt(var)
    s.n_spikes += spike
    if s.k < s.window:
        s.ring[s.k] = v
        s.k += 1
    else:
        old = s.ring[s.pos]
        s.ring[s.pos] = v
        s.pos = s.pos + 1 if s.pos + 1 < s.window else 0
        s.total -= old
        s.sumsq -= old * old
    s.total += v
    s.sumsq += v * v
    s.since += 1
    if s.since >= s.window:
        # Rebuilt every ``window`` points: float drift cannot build up over a long run.
        s.since = 0
        s.total = _sum(s.ring, s.k, False)
        s.sumsq = _sum(s.ring, s.k, True)
    return spike


cdef int _score_init(Score* s, Py_ssize_t window, double sigmas) except -1:
    s.ring = <double*>malloc(window * sizeof(double))
    if s.ring == NULL:
        raise MemoryError()
    s.window, s.sigmas = window, sigmas
    s.k = s.pos = s.since = 0
    s.total = s.sumsq = 0.0
    s.n = s.n_spikes = 0
    return 0


cdef tuple _score_state(const Score* s):
    return ([s.ring[i] for i in range(s.k)], s.pos, s.since, s.total, s.sumsq, s.n, s.n_spikes)


cdef void _score_restore(Score* s, tuple state):
    cdef Py_ssize_t i
    ring, s.pos, s.since, s.total, s.sumsq, s.n, s.n_spikes = state
    s.k = len(ring)
    for i in range(s.k):
        s.ring[i] = ring[i]


cdef class ScoreCore:
    """The spike score's state and step: ``SpikeScore``'s, whose parameters it takes."""

    cdef Score s

    def __cinit__(self, Py_ssize_t window, double sigmas):
        _score_init(&self.s, window, sigmas)

    def __dealloc__(self):
        free(self.s.ring)

    def __reduce__(self):
        return ScoreCore, (self.s.window, self.s.sigmas), _score_state(&self.s)

    def __setstate__(self, tuple state):
        _score_restore(&self.s, state)

    @property
    def n(self) -> int:
        """Finite values counted so far."""
        return self.s.n

    @property
    def n_spikes(self) -> int:
        """Values counted as spikes so far."""
        return self.s.n_spikes

    def update(self, double value) -> bool:
        """Count one value (non-finite ones are skipped); True if it is a spike."""
        return isfinite(value) and _score_step(&self.s, value)

    def update_many(self, values) -> int:
        """``update`` over ``values`` in order; return how many were spikes."""
        cdef const double[::1] v = np.ascontiguousarray(values, dtype=np.float64)
        cdef Py_ssize_t i
        cdef long long spikes = 0
        with nogil:
            for i in range(v.shape[0]):
                if isfinite(v[i]):
                    spikes += _score_step(&self.s, v[i])
        return spikes


# ---------------------------------------------------------------- the spike detector
cdef inline void _insert(double* a, Py_ssize_t n, double v) noexcept nogil:
    """Insert ``v`` into the sorted ``a[:n]`` (room for one more) after its equals."""
    cdef Py_ssize_t j = upper_bound(a, n, v)
    memmove(a + j + 1, a + j, (n - j) * sizeof(double))
    a[j] = v


cdef inline void _replace(double* a, Py_ssize_t n, double old, double v) noexcept nogil:
    """In the sorted ``a[:n]``, put ``v`` after its equals in place of the first value equal
    to ``old``: what ``sorted`` makes of a window whose oldest value ``old`` leaves as
    ``v`` comes (equal values stay in arrival order)."""
    cdef Py_ssize_t i = lower_bound(a, n, old), j = upper_bound(a, n, v)
    if j > i:
        memmove(a + i, a + i + 1, (j - i - 1) * sizeof(double))
        a[j - 1] = v
    else:
        memmove(a + j + 1, a + j, (i - j) * sizeof(double))
        a[j] = v


cdef class SpikeCore:
    """A ``Spike`` detector's state and per-point step (``Spike`` is its public face).

    ``update`` and ``update_many`` return, for each flagged point, the record
    ``(center, scale, z, run, adapted, peak_dev, peak_value, log)``: the baseline median
    and noise scale the point was judged against, its z-score, the spike's length so far,
    whether the detector has just accepted a new level, the spike's largest deviation and
    the value there, and whether it works in log space. Parameters as ``Spike`` takes
    them (validated there); ``log_only`` is its ``space == "log"``, ``linear`` its
    ``space == "linear"``. With ``detrend`` the baseline is the higher of the median and the
    median carried along the median first difference of the learned values to the point
    judged, so a steady climb or descent (a counter, a temperature schedule) is not a spike. ``rel_noise`` floors the
    noise scale at that share of the baseline's size: a series constant to the last byte
    is not flagged for a change of a few bytes.
    """

    cdef double threshold, cont, min_delta, rel_noise
    cdef Py_ssize_t window, cw, min_points, adapt_after
    cdef bint log_only, in_log, detrend
    cdef double* buf              # the learned values (the last ``window``), a ring: the
    cdef Py_ssize_t head, nbuf    # oldest at ``head``
    cdef double* centre           # the last ``cw`` of them, sorted
    cdef double* diffs            # their absolute first differences, sorted
    cdef double* slopes           # their signed first differences, sorted (``detrend``)
    cdef Py_ssize_t since
    cdef double scale, peak_dev, peak_value
    cdef Py_ssize_t run, spikes
    cdef Score score
    # The flagged point's record, filled by _step.
    cdef double f_center, f_scale, f_z
    cdef Py_ssize_t f_run
    cdef bint f_adapted

    def __cinit__(self, double threshold, double continue_threshold, Py_ssize_t window,
                  Py_ssize_t center_window, Py_ssize_t min_points, double min_delta,
                  Py_ssize_t adapt_after, bint log_only, bint linear, Py_ssize_t score_window,
                  bint detrend=False, double rel_noise=0.0):
        self.threshold, self.cont, self.min_delta = threshold, continue_threshold, min_delta
        self.window, self.cw, self.min_points = window, center_window, min_points
        self.adapt_after, self.log_only, self.in_log = adapt_after, log_only, not linear
        self.detrend, self.rel_noise = detrend, rel_noise
        self.buf = <double*>malloc(window * sizeof(double))
        self.centre = <double*>malloc(center_window * sizeof(double))
        self.diffs = <double*>malloc(window * sizeof(double))
        self.slopes = <double*>malloc(window * sizeof(double))
        if not (self.buf and self.centre and self.diffs and self.slopes):
            raise MemoryError()
        self._clear()
        _score_init(&self.score, score_window, 7.0)

    def __dealloc__(self):
        free(self.buf)
        free(self.centre)
        free(self.diffs)
        free(self.slopes)
        free(self.score.ring)

    def __reduce__(self):
        params = (self.threshold, self.cont, self.window, self.cw, self.min_points,
                  self.min_delta, self.adapt_after, self.log_only, False, self.score.window,
                  self.detrend, self.rel_noise)
        state = (self.in_log, self.baseline, self.scale, self.since, self.run, self.peak_dev,
                 self.peak_value, self.spikes, _score_state(&self.score))
        return SpikeCore, params, state

    def __setstate__(self, tuple state):
        baseline, score = state[1], state[8]
        self.in_log = state[0]
        self._clear()
        for x in baseline:
            self._push(x)
        (self.scale, self.since, self.run, self.peak_dev, self.peak_value,
         self.spikes) = state[2:8]
        _score_restore(&self.score, score)

    @property
    def baseline(self) -> list:
        """The learned values the next point is judged against, the oldest first."""
        return [self.buf[(self.head + i) % self.window] for i in range(self.nbuf)]

    @property
    def in_spike(self) -> bool:
        return self.run > 0

    @property
    def n_spikes(self) -> int:
        return self.spikes

    @property
    def log_space(self) -> bool:
        return self.in_log

    @property
    def spike_score(self) -> float:
        return self.score.n_spikes / <double>self.score.n if self.score.n else 0.0

    @property
    def score_window(self) -> list:
        """The values in the spike score's rolling window."""
        return [self.score.ring[i] for i in range(self.score.k)]

    cdef void _clear(self) noexcept nogil:
        self.head = self.nbuf = 0

    cdef inline double _at(self, Py_ssize_t i) noexcept nogil:
        """The ``i``-th learned value, the oldest first."""
        i += self.head
        return self.buf[i - self.window if i >= self.window else i]

    cdef void _push(self, double x) noexcept nogil:
        """Append ``x`` to the baseline, dropping its oldest value once full."""
        cdef Py_ssize_t n = self.nbuf, k = self.head + n
        cdef double d
        if n:
            d = x - self._at(n - 1)
            if n == self.window:
                _replace(self.diffs, n - 1, fabs(self._at(1) - self._at(0)), fabs(d))
                if self.detrend:
                    _replace(self.slopes, n - 1, self._at(1) - self._at(0), d)
            else:
                _insert(self.diffs, n - 1, fabs(d))
                if self.detrend:
                    _insert(self.slopes, n - 1, d)
        if n >= self.cw:
            _replace(self.centre, self.cw, self._at(n - self.cw), x)
        else:
            _insert(self.centre, n, x)
        if n == self.window:
            self.head = self.head + 1 if self.head + 1 < self.window else 0
        else:
            self.nbuf += 1
        self.buf[k - self.window if k >= self.window else k] = x

    cdef double _robust_scale(self) noexcept nogil:
        """The noise scale of the baseline: a MAD of its first differences (Gaussian sigma)."""
        cdef Py_ssize_t n = self.nbuf, j
        cdef double scale
        if n < 3:
            return 0.0
        scale = 1.0484 * self.diffs[(n - 1) // 2]
        if scale == 0.0:
            # A quantised series: its noise is at least half its smallest nonzero step.
            j = upper_bound(self.diffs, n - 1, 0.0)
            scale = 0.5 * self.diffs[j] if j < n - 1 else 0.0
        return scale

    cdef void _learn(self, double x) noexcept nogil:
        self._push(x)
        self.since += 1
        if self.since >= 8 or self.nbuf <= self.min_points:
            self.since = 0
            self.scale = self._robust_scale()

    cdef bint _step(self, double value) noexcept nogil:
        """One point: True if it is flagged (its record in the ``f_`` fields)."""
        cdef double x, center, scale, dev, z
        cdef Py_ssize_t h
        if not isfinite(value):
            return False
        _score_step(&self.score, value)
        if self.in_log and value <= 0:
            if self.log_only:
                return False  # a log-space detector cannot judge a non-positive value
            # A series that can be <= 0 (an RL loss) is judged in linear space from now on.
            self.in_log = False
            self._clear()
            self.run = 0
        x = log(value) if self.in_log else value
        if self.nbuf < self.min_points:
            self._learn(x)
            return False
        h = self.cw // 2  # judged once ``min_points`` >= ``cw`` values are learned
        if self.cw % 2:
            center = self.centre[h]
        else:
            center = 0.5 * (self.centre[h - 1] + self.centre[h])
        if self.detrend and self.nbuf > 1:
            # The median sits (cw + 1) / 2 learned points back: carried to this point along
            # the trend, it is the baseline when that is the higher one. A point must be
            # out of both (no trend; the trend goes on): a schedule's bend is neither.
            carried = center + 0.5 * (self.cw + 1) * self.slopes[(self.nbuf - 1) // 2]
            if carried > center:
                center = carried
        scale = self.scale if self.scale > 1e-12 else 1e-12
        if scale < self.rel_noise * fabs(center):
            scale = self.rel_noise * fabs(center)
        dev = x - center
        z = dev / scale
        if z < (self.cont if self.run else self.threshold) or dev < self.min_delta:
            self.run = 0
            self._learn(x)
            return False
        if not self.run:
            self.spikes += 1
            self.peak_dev, self.peak_value = dev, value
        self.run += 1
        if dev > self.peak_dev:
            self.peak_dev, self.peak_value = dev, value
        self.f_center, self.f_scale, self.f_z, self.f_run = center, scale, z, self.run
        self.f_adapted = self.run >= self.adapt_after
        if self.f_adapted:
            # Accept the new level: the shift is real, stop shouting about it.
            self.run = 0
            self._clear()
            self._learn(x)
        return True

    cdef tuple _record(self):
        return (self.f_center, self.f_scale, self.f_z, self.f_run, self.f_adapted,
                self.peak_dev, self.peak_value, self.in_log)

    def update(self, step, double value):
        """Judge one point (``step`` is not used); its record if flagged, else None."""
        return self._record() if self._step(value) else None

    def update_many(self, steps, values) -> list:
        """``update`` over a whole series; ``(index, record)`` of the flagged points."""
        cdef const double[::1] v = np.ascontiguousarray(values, dtype=np.float64)
        cdef Py_ssize_t i = 0, n = v.shape[0]
        cdef list out = []
        while i < n:
            with nogil:
                while i < n and not self._step(v[i]):
                    i += 1
            if i < n:
                out.append((i, self._record()))
                i += 1
        return out
