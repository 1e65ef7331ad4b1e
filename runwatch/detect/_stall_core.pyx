# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
# distutils: extra_compile_args = -O2 -ffp-contract=off -fno-fast-math
"""Stall's state and per-point step, compiled.

``StallCore`` is the whole of a ``Stall`` detector but the parameters' validation and the
Signal: the running sums of the two windows, the noise scale, the log-spaced bins (learned
ones and every point's), the two tests' counters and their own scatter. Live watching
calls ``update`` a point at a time, replay ``update_many`` over whole series; both run the
same C step (``_step``).

Divisors: window sizes, bin counts and the octave halves are >= 1 where they divide
(``cdivision`` is safe).
"""

import numpy as np

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsDouble
from libc.limits cimport LLONG_MAX
from libc.math cimport INFINITY, NAN, ceil, fabs, floor, isfinite, log, sqrt
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memset

from runwatch._pyfloat cimport py_max, py_min, stable_sort

cdef double LN2 = log(2.0)
cdef double KCAP = <double> (1 << 22)  # a bin index beyond this: an infinite ln(S1)
cdef Py_ssize_t NOISE = 128  # values the noise scale is taken over
cdef Py_ssize_t RESID = 64  # samples of the window test's own scatter
cdef Py_ssize_t LRESID = 16  # samples of the octave test's own scatter
cdef Py_ssize_t MIN_RESID = 8  # of those, needed before the octave test may flag
cdef double CLIP = 4.0  # noise sigmas above the last completed bin's mean: the cap


cdef object _doubles(object seq):
    """``seq`` as a float64 array, converted once. A list of Python floats and ints
    (what replay gives) is read directly: numpy's conversion of a list would cost as much
    as the detector's whole step."""
    if type(seq) is not list:
        return np.ascontiguousarray(seq, dtype=np.float64)
    cdef Py_ssize_t i, n = PyList_GET_SIZE(seq)
    arr = np.empty(n, dtype=np.float64)
    cdef double[::1] out = arr
    cdef object o
    for i in range(n):
        o = <object> PyList_GET_ITEM(seq, i)
        if type(o) is float:
            out[i] = PyFloat_AS_DOUBLE(o)
        elif type(o) is int:
            out[i] = PyLong_AsDouble(o)
        else:
            out[i] = o
    return arr


# ---------------------------------------------------------------- small buffers
cdef struct Ring:
    double* v          # the last ``cap`` values, the oldest at ``head``
    Py_ssize_t cap, head, n


cdef int _ring_init(Ring* r, Py_ssize_t cap) except -1:
    r.v = <double*> malloc(cap * sizeof(double))
    if r.v == NULL:
        raise MemoryError()
    r.cap = cap
    r.head = r.n = 0
    return 0


cdef inline void _push(Ring* r, double x) noexcept nogil:
    cdef Py_ssize_t i
    if r.n < r.cap:
        i = r.head + r.n
        r.v[i - r.cap if i >= r.cap else i] = x
        r.n += 1
    else:
        r.v[r.head] = x
        r.head = r.head + 1 if r.head + 1 < r.cap else 0


cdef inline double _back(const Ring* r, Py_ssize_t j) noexcept nogil:
    """The ``j``-th value from the newest (0: the newest)."""
    cdef Py_ssize_t i = r.head + r.n - 1 - j
    return r.v[i - r.cap if i >= r.cap else i]


cdef void _ordered(const Ring* r, double* out) noexcept nogil:
    """The values, the oldest first."""
    cdef Py_ssize_t first = r.cap - r.head if r.cap - r.head < r.n else r.n
    memcpy(out, r.v + r.head, first * sizeof(double))
    memcpy(out + first, r.v, (r.n - first) * sizeof(double))


cdef bytes _ring_bytes(const Ring* r):
    cdef bytes b = PyBytes_FromStringAndSize(NULL, r.n * sizeof(double))
    _ordered(r, <double*> PyBytes_AS_STRING(b))
    return b


cdef void _ring_load(Ring* r, bytes b):
    cdef Py_ssize_t n = len(b) // sizeof(double)
    cdef Py_ssize_t skip = n - r.cap if n > r.cap else 0
    memcpy(r.v, PyBytes_AS_STRING(b) + skip * sizeof(double), (n - skip) * sizeof(double))
    r.head = 0
    r.n = n - skip


# ---------------------------------------------------------------- log-spaced bins
cdef struct Bins:
    double* s          # per bin index k: sums of ln(step), of x, and the count (3 a bin)
    char* has          # the bin exists
    Py_ssize_t cap     # indices with room
    Py_ssize_t count   # bins that exist


cdef int _bins_grow(Bins* b, Py_ssize_t k) except -1:
    """Room for bin ``k`` (new room zeroed: no bin there)."""
    cdef Py_ssize_t cap = 2 * b.cap if 2 * b.cap > k + 1 else k + 1
    cdef double* s = <double*> realloc(b.s, 3 * cap * sizeof(double))
    if s == NULL:
        raise MemoryError()
    b.s = s
    cdef char* has = <char*> realloc(b.has, cap)
    if has == NULL:
        raise MemoryError()
    b.has = has
    memset(b.s + 3 * b.cap, 0, 3 * (cap - b.cap) * sizeof(double))
    memset(b.has + b.cap, 0, cap - b.cap)
    b.cap = cap
    return 0


cdef void _bins_clear(Bins* b) noexcept nogil:
    if b.cap:
        memset(b.s, 0, 3 * b.cap * sizeof(double))
        memset(b.has, 0, b.cap)
    b.count = 0


cdef inline int _bins_add(Bins* b, Py_ssize_t k, double ls, double x) except -1:
    """A point into bin ``k``."""
    if k >= b.cap:
        _bins_grow(b, k)
    cdef double* s = b.s + 3 * k
    if b.has[k]:
        s[0] += ls
        s[1] += x
        s[2] += 1.0
    else:
        s[0] = ls
        s[1] = x
        s[2] = 1.0
        b.has[k] = 1
        b.count += 1
    return 0


cdef void _bins_sum(const Bins* b, Py_ssize_t lo, Py_ssize_t hi, double* out) noexcept nogil:
    """Sums of bins ``lo`` .. ``hi - 1``."""
    cdef double ls = 0.0, x = 0.0, n = 0.0
    cdef Py_ssize_t j
    if lo < 0:
        lo = 0
    if hi > b.cap:
        hi = b.cap
    for j in range(lo, hi):
        if b.has[j]:
            ls += b.s[3 * j]
            x += b.s[3 * j + 1]
            n += b.s[3 * j + 2]
    out[0] = ls
    out[1] = x
    out[2] = n


cdef tuple _bins_state(const Bins* b):
    cdef Py_ssize_t hi = b.cap
    while hi > 0 and not b.has[hi - 1]:
        hi -= 1
    return (
        PyBytes_FromStringAndSize(<char*> b.s, 3 * hi * sizeof(double)),
        PyBytes_FromStringAndSize(b.has, hi),
    )


cdef int _bins_load(Bins* b, tuple state) except -1:
    cdef bytes s = state[0], has = state[1]
    cdef Py_ssize_t hi = len(has), j
    _bins_clear(b)
    if hi == 0:
        return 0
    if hi > b.cap:
        _bins_grow(b, hi - 1)
    memcpy(b.s, PyBytes_AS_STRING(s), 3 * hi * sizeof(double))
    memcpy(b.has, PyBytes_AS_STRING(has), hi)
    for j in range(hi):
        b.count += b.has[j] != 0
    return 0


# ---------------------------------------------------------------- order statistics
cdef inline long long _key(double x) noexcept nogil:
    """An integer that orders as ``x`` does (NaN-free), and back: its own inverse."""
    cdef long long i
    memcpy(&i, &x, 8)
    return i ^ ((i >> 63) & LLONG_MAX)


cdef inline double _unkey(long long i) noexcept nogil:
    cdef double x
    i = i ^ ((i >> 63) & LLONG_MAX)
    memcpy(&x, &i, 8)
    return x


cdef Py_ssize_t _partition(long long* a, Py_ssize_t lo, Py_ssize_t hi, long long pivot,
                           bint le) noexcept nogil:
    """Move the keys of ``a[lo:hi]`` below ``pivot`` (or equal to it, ``le``) to the
    front; return where the rest starts. Masks, not jumps: the values are noise, and a
    mispredicted jump a key would cost more than the rest of the loop."""
    cdef Py_ssize_t i, store = lo
    cdef long long t, u, mask
    for i in range(lo, hi):
        t = a[i]
        u = a[store]
        mask = -<long long> ((t <= pivot) if le else (t < pivot))
        a[i] = (u & mask) | (t & ~mask)
        a[store] = (t & mask) | (u & ~mask)
        store -= mask
    return store


cdef double _select(const double* v, Py_ssize_t n, Py_ssize_t k, long long* a) noexcept nogil:
    """``sorted(v[:n])[k]`` of NaN-free values (``a``: room for ``n`` keys). Ties with
    the pivot are set apart, so a window of equal values (a quantised loss) takes one
    pass."""
    cdef Py_ssize_t lo = 0, hi = n, lt, eq, i
    cdef long long pivot
    for i in range(n):
        a[i] = _key(v[i])
    while hi - lo > 1:
        pivot = a[lo + (hi - lo) // 2]
        lt = _partition(a, lo, hi, pivot, False)
        if k < lt:
            hi = lt
            continue
        eq = _partition(a, lt, hi, pivot, True)
        if k < eq:
            return _unkey(pivot)
        lo = eq
    return _unkey(a[k])


cdef double _scatter(const Ring* r, double* tmp, long long* keys) noexcept nogil:
    """1.4826 x the MAD of the ring's values about their (upper) median: a test's
    statistic's own scatter on unflagged stretches."""
    cdef Py_ssize_t i, n = r.n
    cdef double med
    _ordered(r, tmp)
    med = _select(tmp, n, n // 2, keys)
    for i in range(n):
        tmp[i] = fabs(tmp[i] - med)
    return 1.4826 * _select(tmp, n, n // 2, keys)


# ---------------------------------------------------------------- the detector
cdef class StallCore:
    """A ``Stall`` detector's state and per-point step (see ``runwatch.detect.stall``).

    ``update(step, value, s1)`` takes one point (``s1``: its summed LR, NaN while the run
    has no LR) and returns None, or a flag record ``(long, w, d_exp, d_obs, level_a,
    level_b, log)``: which test flagged (``long``: the octave test), the window (points;
    for the octave test its newer half's count), the expected and observed fall, the
    older and newer window's mean in the detector's units (ln(loss) while ``log``, else
    the loss), from which the Signal is built.
    """

    # Parameters.
    cdef double window_frac, ref_octaves, stall_frac, z, z_resid, min_fall, long_z_resid
    cdef Py_ssize_t min_window, max_window, patience, min_points, per_octave, adapt_after
    cdef double long_min_points
    cdef bint long_test
    # Where points are: log or linear space, steps or summed LR.
    cdef bint in_log, on_lr, has_unit
    cdef double unit                # S1 of the first point measured by LR: "step 1"
    # The window test.
    cdef long long n
    cdef double x0, cx, cl          # offset; running sums of clipped x - x0, of ln(step)
    cdef Ring cum_x, cum_l          # those sums after each of the last 2 max_window points
    cdef Ring last5, noise          # for the median of 5, and the noise scale
    cdef double sigma
    cdef Py_ssize_t since_noise
    cdef Bins bins                  # learned bins (unflagged points): the reference
    cdef Ring resid                 # the statistic's own scatter on unflagged stretches
    cdef double resid_scale
    cdef Py_ssize_t resid_age, slope_age
    cdef bint has_slope
    cdef double slope
    cdef Py_ssize_t over, flagged, n_stalls
    # The octave test.
    cdef Bins every                 # every point's bins, capped
    cdef Py_ssize_t lt_k, clip_k, sampled, lt_over
    cdef double clip_base
    cdef double a[3]                # completed bins of the octave's older half: ls, x, n
    cdef double b[3]                # and of its newer half
    cdef bint has_lslope
    cdef double lslope, lt_scale
    cdef Ring lresid
    # Scratch, and the last flag's figures.
    cdef double tmp[128]
    cdef long long keys[128]
    cdef bint f_long
    cdef Py_ssize_t f_w
    cdef double f_d_exp, f_d_obs, f_a, f_b

    def __cinit__(self, double window_frac, Py_ssize_t min_window, Py_ssize_t max_window,
                  double ref_octaves, double stall_frac, double z, double z_resid,
                  double min_fall, Py_ssize_t patience, Py_ssize_t min_points,
                  Py_ssize_t per_octave, Py_ssize_t adapt_after, bint long_test,
                  double long_z_resid, double long_min_points):
        self.window_frac = window_frac
        self.min_window = min_window
        self.max_window = max_window
        self.ref_octaves = ref_octaves
        self.stall_frac = stall_frac
        self.z = z
        self.z_resid = z_resid
        self.min_fall = min_fall
        self.patience = patience
        self.min_points = min_points
        self.per_octave = per_octave
        self.adapt_after = adapt_after
        self.long_test = long_test
        self.long_z_resid = long_z_resid
        self.long_min_points = long_min_points
        _ring_init(&self.cum_x, 2 * max_window + 1)
        _ring_init(&self.cum_l, 2 * max_window + 1)
        _ring_init(&self.last5, 5)
        _ring_init(&self.noise, NOISE)
        _ring_init(&self.resid, RESID)
        _ring_init(&self.lresid, LRESID)
        self.on_lr = self.has_unit = False
        self.unit = 0.0
        self._clear()

    def __dealloc__(self):
        free(self.cum_x.v)
        free(self.cum_l.v)
        free(self.last5.v)
        free(self.noise.v)
        free(self.resid.v)
        free(self.lresid.v)
        free(self.bins.s)
        free(self.bins.has)
        free(self.every.s)
        free(self.every.has)

    def __reduce__(self):
        params = (
            self.window_frac, self.min_window, self.max_window, self.ref_octaves,
            self.stall_frac, self.z, self.z_resid, self.min_fall, self.patience,
            self.min_points, self.per_octave, self.adapt_after, self.long_test,
            self.long_z_resid, self.long_min_points,
        )
        state = (
            self.in_log, self.on_lr, self.has_unit, self.unit,
            self.n, self.x0, self.cx, self.cl,
            _ring_bytes(&self.cum_x), _ring_bytes(&self.cum_l),
            _ring_bytes(&self.last5), _ring_bytes(&self.noise),
            self.sigma, self.since_noise, _bins_state(&self.bins),
            _ring_bytes(&self.resid), self.resid_scale, self.resid_age, self.slope_age,
            self.has_slope, self.slope, self.over, self.flagged, self.n_stalls,
            _bins_state(&self.every), self.lt_k, self.clip_k, self.sampled, self.lt_over,
            self.clip_base, (self.a[0], self.a[1], self.a[2]),
            (self.b[0], self.b[1], self.b[2]), self.has_lslope, self.lslope,
            self.lt_scale, _ring_bytes(&self.lresid),
        )
        return StallCore, params, state

    def __setstate__(self, tuple state):
        (
            self.in_log, self.on_lr, self.has_unit, self.unit,
            self.n, self.x0, self.cx, self.cl,
            cum_x, cum_l, last5, noise,
            self.sigma, self.since_noise, bins,
            resid, self.resid_scale, self.resid_age, self.slope_age,
            self.has_slope, self.slope, self.over, self.flagged, self.n_stalls,
            every, self.lt_k, self.clip_k, self.sampled, self.lt_over,
            self.clip_base, a, b, self.has_lslope, self.lslope,
            self.lt_scale, lresid,
        ) = state
        _ring_load(&self.cum_x, cum_x)
        _ring_load(&self.cum_l, cum_l)
        _ring_load(&self.last5, last5)
        _ring_load(&self.noise, noise)
        _ring_load(&self.resid, resid)
        _ring_load(&self.lresid, lresid)
        _bins_load(&self.bins, bins)
        _bins_load(&self.every, every)
        self.a[0], self.a[1], self.a[2] = a
        self.b[0], self.b[1], self.b[2] = b

    @property
    def stalls(self) -> int:
        """How many stalls were declared (since the detector last started afresh)."""
        return self.n_stalls

    @property
    def log_space(self) -> bool:
        """Whether the loss is judged in log space (False once a value was <= 0)."""
        return self.in_log

    @property
    def by_lr(self) -> bool:
        """Whether progress is measured in summed LR rather than in steps."""
        return self.on_lr

    @property
    def n_bins(self) -> tuple:
        """How many log-spaced bins are held: (learned, every point's)."""
        return self.bins.count, self.every.count

    cdef void _clear(self) noexcept nogil:
        """Start afresh (the LR arrived, or log space ended): all but where points are."""
        self.in_log = True
        self.n = 0
        self.x0 = NAN
        self.cx = self.cl = 0.0
        self.cum_x.head = self.cum_x.n = self.cum_l.head = self.cum_l.n = 0
        self.last5.head = self.last5.n = self.noise.head = self.noise.n = 0
        self.sigma = 0.0
        self.since_noise = 0
        _bins_clear(&self.bins)
        _bins_clear(&self.every)
        self.resid.head = self.resid.n = 0
        self.resid_scale = 0.0
        self.resid_age = self.slope_age = 0
        self.has_slope = False
        self.slope = 0.0
        self.over = self.flagged = self.n_stalls = 0
        self.lt_k = self.clip_k = self.sampled = -1
        self.lt_over = 0
        self.clip_base = INFINITY
        self.a[0] = self.a[1] = self.a[2] = 0.0
        self.b[0] = self.b[1] = self.b[2] = 0.0
        self.has_lslope = False
        self.lslope = 0.0
        self.lresid.head = self.lresid.n = 0
        self.lt_scale = 0.0

    cdef double _robust_scale(self) noexcept nogil:
        """The noise scale of the noise buffer: 1.0484 x the median absolute first
        difference (half the smallest nonzero one where that is 0: a quantised series)."""
        cdef Py_ssize_t i, n = self.noise.n
        cdef double* d = self.tmp
        cdef double scale, nonzero
        if n < 3:
            return 0.0
        _ordered(&self.noise, d)
        for i in range(n - 1):
            d[i] = fabs(d[i + 1] - d[i])
        scale = 1.0484 * _select(d, n - 1, (n - 1) // 2, self.keys)
        if scale == 0.0:
            nonzero = INFINITY
            for i in range(n - 1):
                if d[i] > 0.0 and d[i] < nonzero:
                    nonzero = d[i]
            scale = 0.5 * (nonzero if nonzero < INFINITY else 0.0)
        return scale

    cdef bint _slope(self, double ls_end, double* out) noexcept nogil:
        """Slope of x against ln(step) over the learned bins whose mean ln(step) lies in
        the ``ref_octaves`` octaves before ``ls_end``; False where there is none (under 4
        bins, or spanning under 0.4 of the range).

        Only the bins that can hold a mean in that range are visited (a bin's mean lies
        in its own ln(step) range; one bin of margin each side for rounding).
        """
        if not isfinite(ls_end):
            return False
        cdef Bins* bins = &self.bins
        cdef double lo = ls_end - self.ref_octaves * LN2
        cdef double sx = 0.0, sy = 0.0, sxx = 0.0, sxy = 0.0, first = 0.0, last = 0.0
        cdef double per = self.per_octave / LN2, c, y, den
        cdef long long m = 0
        cdef Py_ssize_t k
        cdef Py_ssize_t k0 = <Py_ssize_t> floor(lo * per) - 1
        cdef Py_ssize_t k1 = <Py_ssize_t> ceil(ls_end * per) + 2
        if k0 < 0:
            k0 = 0
        if k1 > bins.cap:
            k1 = bins.cap
        for k in range(k0, k1):
            if not bins.has[k]:
                continue
            c = bins.s[3 * k] / bins.s[3 * k + 2]
            if lo <= c < ls_end:
                y = bins.s[3 * k + 1] / bins.s[3 * k + 2]
                sx += c
                sy += y
                sxx += c * c
                sxy += c * y
                m += 1
                if m == 1 or c < first:
                    first = c
                if m == 1 or c > last:
                    last = c
        if m < 4 or last - first < 0.4 * self.ref_octaves * LN2:
            return False
        den = m * sxx - sx * sx
        if den <= 0:
            return False
        out[0] = (m * sxy - sx * sy) / den
        return True

    cdef bint _check(self) noexcept nogil:
        """The window test: over the last two windows of ``w`` points, has the loss
        fallen as far as the learned bins before them predict?"""
        cdef Py_ssize_t w = <Py_ssize_t> (self.window_frac * self.n)
        cdef double mean_a, mean_b, ls_a, ls_b, d_exp, d_obs, se, need
        if w < self.min_window:
            w = self.min_window
        if w > self.max_window:
            w = self.max_window
        if self.cum_x.n < 2 * w + 1:
            self.over = 0
            return False
        mean_a = (_back(&self.cum_x, w) - _back(&self.cum_x, 2 * w)) / w
        mean_b = (_back(&self.cum_x, 0) - _back(&self.cum_x, w)) / w
        ls_a = (_back(&self.cum_l, w) - _back(&self.cum_l, 2 * w)) / w
        ls_b = (_back(&self.cum_l, 0) - _back(&self.cum_l, w)) / w
        # The reference slope moves slowly: refreshed every 32 points (bounded cost),
        # from where the older window starts (ln step of its first point, roughly).
        self.slope_age -= 1
        if self.slope_age <= 0:
            self.has_slope = self._slope(ls_a - (ls_b - ls_a) / 2.0, &self.slope)
            self.slope_age = 32
        if not self.has_slope or self.slope >= 0:
            self.over = 0
            return False
        if ls_b - ls_a > 0.5 * LN2:
            # The windows straddle a huge step gap: no local extrapolation is possible.
            self.over = 0
            return False
        d_exp = -self.slope * (ls_b - ls_a)
        d_obs = mean_a - mean_b
        se = self.sigma * sqrt(2.0 / w)
        need = py_max(py_max(self.z * se, self.z_resid * self.resid_scale), self.min_fall)
        if not (d_exp > need and d_obs < self.stall_frac * d_exp):
            self.over = 0
            self.flagged = 0
            # How far the observed fall strays from the expected one on an unflagged
            # stretch: the statistic's own noise (autocorrelated noise, curvature).
            self.resid_age -= 1
            if self.resid_age <= 0:
                self.resid_age = w // 4 if w >= 4 else 1
                _push(&self.resid, d_obs - d_exp)
                if self.resid.n >= 8:
                    self.resid_scale = _scatter(&self.resid, self.tmp, self.keys)
            return False
        self.over += 1
        if self.over < self.patience:
            return False
        if self.over == self.patience:
            self.n_stalls += 1
        self.flagged += 1
        if self.flagged >= self.adapt_after:
            # Flagged for long: forget the reference and learn the curve afresh.
            _bins_clear(&self.bins)
            self.has_slope = False
            self.slope_age = 0
            self.over = self.flagged = 0
        self._found(False, w, d_exp, d_obs, mean_a, mean_b)
        return True

    cdef bint _check_long(self, Py_ssize_t k) noexcept nogil:
        """The octave test: over the last octave of steps, has the loss fallen as far as
        its progress before that octave predicts?

        The octave is split into its older and newer half (``per_octave // 2`` bins
        each, the newest bin ``k`` still filling); the window means come from every
        point's clipped value and the reference slope from the learned bins before the
        octave, so a plateau that began inside the octave cannot flatten its own
        reference.
        """
        cdef Py_ssize_t per = self.per_octave, half = self.per_octave // 2
        cdef double* cur
        cdef double na, nb, mean_a, mean_b, d_exp, d_obs, se, need
        if self.lt_k != k:
            self.lt_k = k
            _bins_sum(&self.every, k - per, k - half, self.a)
            _bins_sum(&self.every, k - half, k, self.b)
            self.has_lslope = self._slope(<double> (k - per) * LN2 / per, &self.lslope)
        cur = self.every.s + 3 * k
        na = self.a[2]
        nb = self.b[2] + cur[2]
        if not self.has_lslope or self.lslope >= 0 or py_min(na, nb) < self.min_window:
            self.lt_over = 0
            return False
        mean_a = self.a[1] / na
        mean_b = (self.b[1] + cur[1]) / nb
        d_exp = -self.lslope * ((self.b[0] + cur[0]) / nb - self.a[0] / na)
        d_obs = mean_a - mean_b
        se = self.sigma * sqrt(1.0 / na + 1.0 / nb)
        need = py_max(py_max(self.z * se, self.long_z_resid * self.lt_scale), self.min_fall)
        if self.lresid.n < MIN_RESID or not (d_exp > need and d_obs < self.stall_frac * d_exp):
            self.lt_over = 0
            if self.sampled != k:
                self.sampled = k
                _push(&self.lresid, d_obs - d_exp)
                if self.lresid.n >= 2:
                    self.lt_scale = _scatter(&self.lresid, self.tmp, self.keys)
            return False
        self.lt_over += 1
        if self.lt_over < self.patience:
            return False
        if self.lt_over == self.patience:
            self.n_stalls += 1
        self._found(True, <Py_ssize_t> nb, d_exp, d_obs, mean_a, mean_b)
        return True

    cdef inline void _found(self, bint is_long, Py_ssize_t w, double d_exp, double d_obs,
                            double mean_a, double mean_b) noexcept nogil:
        self.f_long = is_long
        self.f_w = w
        self.f_d_exp = d_exp
        self.f_d_obs = d_obs
        self.f_a = mean_a + self.x0
        self.f_b = mean_b + self.x0

    cdef int _step(self, double step, double value, double s1) except -1:
        """One point (``s1``: its summed LR, NaN: none yet); 1 if it is flagged (the
        figures are in the ``f_`` fields), else 0. Raises where a point cannot be placed
        (no LR for a detector measuring by it; an infinite ln(S1)), before any change."""
        cdef double x, ls, c, med, lim, xc, kf, unit
        cdef bint on_lr
        cdef double l5[5]
        cdef Py_ssize_t k, p, j
        cdef bint flag = False
        if not isfinite(value):
            return 0
        # Where the point is: ln(step), or ln of its summed LR in units of the first
        # point's. Placed before any change, so a point that cannot be placed changes
        # nothing.
        on_lr = self.on_lr or s1 == s1
        unit = self.unit if self.has_unit else s1
        if on_lr:
            if s1 != s1:
                raise ValueError("a Stall that measures progress by the LR needs each point's S1")
            ls = 0.0
            if self.has_unit or s1 > 0:
                c = s1 / unit
                ls = log(c) if c > 1 else 0.0
        else:
            ls = log(step) if step > 1 else 0.0
        kf = self.per_octave * ls / LN2
        if not kf < KCAP:
            raise OverflowError(f"the point's ln(S1) is {ls}: no bin holds it")
        k = <Py_ssize_t> kf
        if on_lr and not self.on_lr:
            # The LR arrived: from now on progress is measured by it, afresh.
            self._clear()
            self.on_lr = True
        if on_lr and not self.has_unit and s1 > 0:
            self.unit = s1
            self.has_unit = True
        if self.in_log and value <= 0:
            # A loss that can be <= 0 (an RL loss) is judged in linear space from now on.
            self._clear()
            self.in_log = False
        x = log(value) if self.in_log else value
        if self.n == 0:
            self.x0 = x
            _push(&self.cum_x, 0.0)
            _push(&self.cum_l, 0.0)
        self.n += 1
        # Clip to the running median of 5 +- 3 sigma: a spike barely moves a window mean.
        _push(&self.last5, x)
        p = self.last5.n
        _ordered(&self.last5, l5)
        stable_sort(l5, p)
        med = l5[p // 2]
        lim = 3.0 * self.sigma
        xc = py_min(py_max(x, med - lim), med + lim)
        self.cx += xc - self.x0
        self.cl += ls
        _push(&self.cum_x, self.cx)
        _push(&self.cum_l, self.cl)
        _push(&self.noise, x)
        self.since_noise += 1
        if self.since_noise >= 32 or self.n <= 128:
            self.since_noise = 0
            self.sigma = self._robust_scale()
        # The octave test's bins take every point, capped at the mean of the last bin
        # before this one + CLIP sigmas: the median of 5 does not stop a spike of tens of
        # points, this cap does (a falling curve never reaches it, a rising one is still
        # seen rising).
        if k != self.clip_k:
            self.clip_k = k
            self.clip_base = INFINITY
            j = (k if k < self.every.cap else self.every.cap) - 1
            while j >= 0:
                if self.every.has[j]:
                    self.clip_base = self.every.s[3 * j + 1] / self.every.s[3 * j + 2]
                    break
                j -= 1
        _bins_add(&self.every, k, ls, py_min(xc, self.clip_base + CLIP * self.sigma))
        if self.n >= self.min_points:
            flag = self._check()
        if not flag and self.long_test and self.n >= self.long_min_points:
            flag = self._check_long(k)
        if not flag:
            # Baseline protection: a flagged point is not learned.
            _bins_add(&self.bins, k, ls, x)
        return flag

    cdef tuple _record(self):
        return (self.f_long, self.f_w, self.f_d_exp, self.f_d_obs, self.f_a, self.f_b,
                self.in_log)

    def update(self, double step, double value, double s1=NAN):
        """Learn from one point (``s1``: its summed LR, NaN while the run has none);
        return its flag record, or None."""
        return self._record() if self._step(step, value, s1) else None

    def update_many(self, steps, values, s1=None, on_error=None) -> list:
        """``update`` over whole arrays in order (``s1``: each point's summed LR, NaN
        before the LR; None: no LR at all); return ``(index, record)`` for the flagged
        points. A point whose step raises goes to ``on_error(index)`` and counts as
        unflagged (without ``on_error`` the exception propagates)."""
        cdef const double[::1] st = _doubles(steps)
        cdef const double[::1] v = _doubles(values)
        cdef const double[::1] a
        cdef Py_ssize_t i = 0, n = v.shape[0]
        cdef bint lr = s1 is not None
        cdef list out = []
        if st.shape[0] != n:
            raise ValueError(f"steps and values differ in length: {st.shape[0]} != {n}")
        if lr:
            a = _doubles(s1)
            if a.shape[0] != n:
                raise ValueError(f"S1 and values differ in length: {a.shape[0]} != {n}")
        while True:
            # One try around the loop, not one a point: a raising point is rare.
            try:
                while i < n:
                    if self._step(st[i], v[i], a[i] if lr else NAN):
                        out.append((i, self._record()))
                    i += 1
                return out
            except Exception:
                if on_error is None:
                    raise
                on_error(i)
                i += 1
