# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Stall's batch path, compiled: ``Stall.update_many`` over a whole series in one loop.

Every loss series runs through Stall, and its per-point work (a log, a median of 5, a
noise scale every 32 points, two window means, two bins, the two tests) is a few dozen
float operations: in Python, or in numpy on short stretches, it cost ~1.4 us a point.
Here the state comes in from the detector's attributes, every point goes through the
same operations in the same order as ``Stall._update`` (Python's ``max``/``min``
tie-breaking, order statistics of the same values, sums left to right), and the state
goes back; the flagged points are returned for Python to build their signals.
``tests/detect/test_batch.py`` checks signals and state bit for bit.

Divisors: window sizes, bin counts and the octave halves are >= 1 where they divide
(``cdivision`` is safe).
"""

from libc.math cimport fabs, floor, ceil, isfinite, log, sqrt, INFINITY
from libc.limits cimport LLONG_MAX, LLONG_MIN
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy
from cpython.long cimport PyLong_AsLongLongAndOverflow

from runwatch._pyfloat cimport py_max, py_min, stable_sort

cdef double LN2 = log(2.0)
cdef long long KCAP = 1 << 22  # bins beyond this (an absurd LR ratio): the Python loop


cdef struct Bins:
    double* s           # per bin index k: sums of ln(step), of x, and the count (3 a bin)
    char* has           # 0 absent, 1 as it came in, 2 changed here
    long long* order    # bins made here (since the last clear), in the order made
    Py_ssize_t n_order
    Py_ssize_t K
    bint cleared


cdef inline long long _key(double x) noexcept nogil:
    """An integer that orders as ``x`` does (NaN-free; -0.0 just below 0.0), and back:
    the map is its own inverse."""
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
    front; return where the rest starts. Without branches on the data (masks, not
    jumps): the windows are noise, and a mispredicted jump a key cost more than the
    rest of the loop."""
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
    """``sorted(v[:n])[k]`` of NaN-free values (``a``: room for ``n`` keys): the value of
    an order statistic does not depend on how it is found, up to the sign of a zero.
    Ties with the pivot are set apart, so a window of equal values (a quantised loss)
    takes one pass."""
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


cdef double _robust_scale(const double* v, Py_ssize_t n, double* tmp,
                          long long* keys) noexcept nogil:
    """``base.robust_scale`` of ``v[:n]`` (finite values, so no NaN difference)."""
    cdef Py_ssize_t i
    cdef double scale, nonzero
    if n < 3:
        return 0.0
    for i in range(n - 1):
        tmp[i] = fabs(v[i + 1] - v[i])
    scale = 1.0484 * _select(tmp, n - 1, (n - 1) // 2, keys)
    if scale == 0.0:
        nonzero = INFINITY
        for i in range(n - 1):
            if tmp[i] > 0.0 and tmp[i] < nonzero:
                nonzero = tmp[i]
        scale = 0.5 * (nonzero if nonzero < INFINITY else 0.0)
    return scale


cdef double _scatter(const double* v, Py_ssize_t n, double* tmp, long long* keys) except? -1.0:
    """``stall._scatter`` of ``v[:n]``: the median's sign of zero cannot change an
    ``abs(v - med)``; a non-finite value (where NaNs would meet Python's sort) goes to
    the Python function itself."""
    cdef Py_ssize_t i
    cdef double med
    for i in range(n):
        if not isfinite(v[i]):
            from runwatch.detect.stall import _scatter as py_scatter

            return py_scatter([v[j] for j in range(n)])
    med = _select(v, n, n // 2, keys)
    for i in range(n):
        tmp[i] = fabs(v[i] - med)
    return 1.4826 * _select(tmp, n, n // 2, keys)


cdef inline void _add(Bins* b, long long k, double ls, double x) noexcept nogil:
    """``stall._add``: a point into bin ``k``."""
    cdef double* s = b.s + 3 * k
    if b.has[k] == 0:
        s[0] = ls
        s[1] = x
        s[2] = 1.0
        b.order[b.n_order] = k
        b.n_order += 1
    else:
        s[0] += ls
        s[1] += x
        s[2] += 1.0
    b.has[k] = 2


cdef int _load_bins(Bins* b, dict bins, Py_ssize_t K) except -1:
    b.K = K
    b.n_order = 0
    b.cleared = False
    b.s = <double*> malloc(3 * K * sizeof(double))
    b.has = <char*> calloc(K, 1)
    b.order = <long long*> malloc(K * sizeof(long long))
    if b.s == NULL or b.has == NULL or b.order == NULL:
        raise MemoryError()
    cdef long long k
    for key, v in bins.items():
        k = key
        b.s[3 * k] = v[0]
        b.s[3 * k + 1] = v[1]
        b.s[3 * k + 2] = v[2]
        b.has[k] = 1
    return 0


cdef void _store_bins(Bins* b, dict bins):
    """Back into the dict as ``update`` leaves it: changed bins in place, new ones in the
    order they were made (after a clear, only those)."""
    cdef long long k
    cdef double* s
    cdef Py_ssize_t i
    if b.cleared:
        bins.clear()
    else:
        for key, v in bins.items():
            k = key
            if b.has[k] == 2:
                s = b.s + 3 * k
                v[0] = s[0]
                v[1] = s[1]
                v[2] = s[2]
    for i in range(b.n_order):
        k = b.order[i]
        s = b.s + 3 * k
        bins[k] = [s[0], s[1], s[2]]


cdef void _free_bins(Bins* b) noexcept:
    free(b.s)
    free(b.has)
    free(b.order)


cdef bint _slope(Bins* b, double ls_end, double ref_octaves, long long per_octave,
                 double* out) noexcept nogil:
    """``Stall._slope``; False where it returns None."""
    if not isfinite(ls_end):
        return False
    cdef double lo = ls_end - ref_octaves * LN2
    cdef double sx = 0.0, sy = 0.0, sxx = 0.0, sxy = 0.0, first = 0.0, last = 0.0
    cdef double per = per_octave / LN2, c, y, den
    cdef long long m = 0, k
    cdef long long k0 = <long long> floor(lo * per) - 1
    cdef long long k1 = <long long> ceil(ls_end * per) + 2
    if k0 < 0:
        k0 = 0
    if k1 > b.K:
        k1 = b.K
    for k in range(k0, k1):
        if not b.has[k]:
            continue
        c = b.s[3 * k] / b.s[3 * k + 2]
        if lo <= c < ls_end:
            y = b.s[3 * k + 1] / b.s[3 * k + 2]
            sx += c
            sy += y
            sxx += c * c
            sxy += c * y
            m += 1
            if m == 1 or c < first:
                first = c
            if m == 1 or c > last:
                last = c
    if m < 4 or last - first < 0.4 * ref_octaves * LN2:
        return False
    den = m * sxx - sx * sx
    if den <= 0:
        return False
    out[0] = (m * sxy - sx * sy) / den
    return True


cdef void _sum_bins(Bins* b, long long lo, long long hi, double* out) noexcept nogil:
    """``stall._sum_bins``: sums of bins lo..hi-1."""
    cdef double ls = 0.0, x = 0.0, n = 0.0
    cdef long long j
    for j in range(lo, hi):
        if 0 <= j < b.K and b.has[j]:
            ls += b.s[3 * j]
            x += b.s[3 * j + 1]
            n += b.s[3 * j + 2]
    out[0] = ls
    out[1] = x
    out[2] = n


cdef double* _doubles(Py_ssize_t n) except NULL:
    cdef double* p = <double*> malloc((n if n > 0 else 1) * sizeof(double))
    if p == NULL:
        raise MemoryError()
    return p


cdef Py_ssize_t _load_floats(double* dst, object src) except -1:
    cdef Py_ssize_t i = 0
    for v in src:
        dst[i] = v
        i += 1
    return i


def run(d, steps, values, const double[::1] s1, Py_ssize_t start):
    """``d._update`` over the points of ``steps``/``values`` from ``start`` on, up to the
    first that ``update`` starts afresh at (log space ends, or the first point with an
    LR: ``s1`` is each point's summed LR, NaN before the LR, None without a clock);
    non-finite values are skipped, as ``update`` skips them.

    Returns ``(stop, flags)``: the points before ``stop`` were fed, ``stop`` is that
    point (or the end), ``flags`` the flagged points as ``(index, long, mean_a, mean_b,
    d_exp, d_obs, w)`` (``long``: the octave test flagged). Returns None, with ``d``
    untouched, where ``update`` must run point by point: not a replay's batch
    (int steps in order and float values, what batch replay gives; a step beyond 64 bits), or
    a bin beyond the kernel's reach (an infinite ln(S1)).
    """
    cdef list st = steps if type(steps) is list else list(steps)
    cdef list vs = values if type(values) is list else list(values)
    cdef Py_ssize_t m = len(vs), j, n = 0, stop
    cdef long long step, prev = LLONG_MIN
    cdef int overflow = 0
    cdef bint log_space = d._log, by_lr = d._by_lr
    cdef bint has_unit = d._unit is not None
    cdef double unit = d._unit if has_unit else 0.0
    cdef long long per_octave = d.per_octave
    cdef double v, c, ls, kf
    if len(st) != m or (s1 is not None and s1.shape[0] != m) or (by_lr and s1 is None):
        return None
    for j in range(start, m):
        o = st[j]
        if type(o) is not int or type(vs[j]) is not float:
            return None
        step = PyLong_AsLongLongAndOverflow(o, &overflow)
        if overflow or step < prev:
            return None
        prev = step
    cdef double* xs = _doubles(m - start)
    cdef double* lss = NULL
    cdef long long* ks = NULL
    cdef Py_ssize_t* idx = NULL
    try:
        lss = _doubles(m - start)
        ks = <long long*> malloc((m - start + 1) * sizeof(long long))
        idx = <Py_ssize_t*> malloc((m - start + 1) * sizeof(Py_ssize_t))
        if ks == NULL or idx == NULL:
            raise MemoryError()
        # What depends on the point alone: x, ln(step) or ln(S1 / unit), the bin.
        stop = m
        for j in range(start, m):
            v = <double> vs[j]
            if not isfinite(v):
                continue
            if (log_space and v <= 0) or (not by_lr and s1 is not None and s1[j] == s1[j]):
                stop = j
                break
            xs[n] = log(v) if log_space else v
            if by_lr:
                v = s1[j]
                ls = 0.0
                if not has_unit and v > 0:
                    unit = v
                    has_unit = True
                if has_unit:
                    c = v / unit
                    ls = log(c) if c > 1 else 0.0
            else:
                step = st[j]
                ls = log(<double> step) if step > 1 else 0.0
            kf = per_octave * ls / LN2
            if not (kf < KCAP):
                return None
            lss[n] = ls
            ks[n] = <long long> kf
            idx[n] = j
            n += 1
        if not n:
            return stop, []
        flags = _run(d, n, xs, lss, ks, idx, has_unit, unit)
        return None if flags is None else (stop, flags)
    finally:
        free(xs)
        free(lss)
        free(ks)
        free(idx)


cdef list _run(d, Py_ssize_t m, double* xs, double* lss, long long* ks, Py_ssize_t* idx,
               bint has_unit, double unit):
    """The points' loop over the state taken from ``d`` and put back; None (``d``
    untouched) where a bin of the state is beyond the kernel's reach."""
    lt = d._long
    cum, last5, noise_buf, resid, lresid = d._cum, d._last5, d._noise_buf, d._resid, lt.resid
    # Parameters, as floats where Python mixes them with floats.
    cdef double window_frac = d.window_frac, ref_octaves = d.ref_octaves
    cdef double stall_frac = d.stall_frac, z = d.z, z_resid = d.z_resid
    cdef double min_fall = d.min_fall, long_z = d.long_z_resid, clip = lt.CLIP
    cdef long long min_window = d.min_window, max_window = d.max_window
    cdef long long patience = d.patience, min_points = d.min_points
    cdef long long per_octave = d.per_octave, adapt_after = d.adapt_after
    cdef long long long_min = d.long_min_points, min_resid = lt.MIN_RESID
    cdef bint long_test = d.long_test
    cdef double dmin_window = <double> min_window
    cdef Py_ssize_t half = per_octave // 2
    # State.
    cdef long long n = d._n
    cdef double x0 = d._x0, cx = d._cx, cl = d._cl, sigma = d._sigma
    cdef long long since = d._since_noise
    cdef double resid_scale = d._resid_scale
    cdef long long resid_age = d._resid_age, slope_age = d._slope_age
    cdef bint has_slope = d._slope_cache is not None
    cdef double slope = d._slope_cache if has_slope else 0.0
    cdef long long over = d._over, flagged = d._flagged, stalls = d._stalls
    cdef long long lt_k = lt.k, clip_k = lt.clip_k, lt_over = lt.over, sampled = lt.sampled
    cdef double clip_base = lt.clip_base, lt_scale = lt.resid_scale
    cdef bint has_lslope = lt.slope is not None
    cdef double lslope = lt.slope if has_lslope else 0.0
    cdef double a[3]
    cdef double b[3]
    a0, a1, a2 = lt.a
    b0, b1, b2 = lt.b
    a[0] = a0
    a[1] = a1
    a[2] = a2
    b[0] = b0
    b[1] = b1
    b[2] = b2
    cdef bint new_octave = False
    # Histories: what came in, then one entry a point (read back from their ends).
    cdef Py_ssize_t cum_max = cum.maxlen, l5_max = last5.maxlen, nb_max = noise_buf.maxlen
    cdef Py_ssize_t r_max = resid.maxlen, lr_max = lresid.maxlen
    cdef Py_ssize_t n_cum, n_l5, n_nb, n_r, n_lr, cum0, l50, nb0, r0, lr0
    cdef double* cumx = NULL
    cdef double* cuml = NULL
    cdef double* l5 = NULL
    cdef double* nb = NULL
    cdef double* rs = NULL
    cdef double* lrs = NULL
    cdef double* tmp = NULL
    cdef long long* keys = NULL
    cdef Bins bins, all_bins
    bins.s = all_bins.s = NULL
    bins.has = all_bins.has = NULL
    bins.order = all_bins.order = NULL
    cdef Py_ssize_t K = 0, j, i, w, p, kk
    cdef long long k
    cdef double x, ls, med, lim, xc, val, ma, mb, la, lb, d_exp, d_obs, se, need, na, nbn
    cdef double sl
    cdef double* cur
    cdef double l5w[5]
    cdef bint flag
    cdef list out = []
    for j in range(m):
        if ks[j] >= K:
            K = ks[j] + 1
    for key in [*d._bins, *d._all_bins]:
        if key < 0 or key >= KCAP:
            return None
        if key >= K:
            K = key + 1
    try:
        cumx = _doubles(len(cum) + m + 1)
        cuml = _doubles(len(cum) + m + 1)
        n_cum = 0
        for tx, tl in cum:
            cumx[n_cum] = tx
            cuml[n_cum] = tl
            n_cum += 1
        cum0 = n_cum
        l5 = _doubles(len(last5) + m)
        n_l5 = l50 = _load_floats(l5, last5)
        nb = _doubles(len(noise_buf) + m)
        n_nb = nb0 = _load_floats(nb, noise_buf)
        rs = _doubles(len(resid) + m)
        n_r = r0 = _load_floats(rs, resid)
        lrs = _doubles(len(lresid) + m)
        n_lr = lr0 = _load_floats(lrs, lresid)
        tmp = _doubles(nb_max + r_max + lr_max + 8)
        keys = <long long*> malloc((nb_max + r_max + lr_max + 8) * sizeof(long long))
        if keys == NULL:
            raise MemoryError()
        _load_bins(&bins, d._bins, K)
        _load_bins(&all_bins, d._all_bins, K)
        for j in range(m):
            x = xs[j]
            ls = lss[j]
            k = ks[j]
            if n == 0:
                x0 = x
                cumx[n_cum] = 0.0
                cuml[n_cum] = 0.0
                n_cum += 1
            n += 1
            # Clip to the running median of 5 +- 3 sigma.
            l5[n_l5] = x
            n_l5 += 1
            p = n_l5 if n_l5 < l5_max else l5_max
            for i in range(p):
                l5w[i] = l5[n_l5 - p + i]
            stable_sort(l5w, p)
            med = l5w[p // 2]
            lim = 3.0 * sigma
            xc = py_min(py_max(x, med - lim), med + lim)
            cx += xc - x0
            cl += ls
            cumx[n_cum] = cx
            cuml[n_cum] = cl
            n_cum += 1
            nb[n_nb] = x
            n_nb += 1
            since += 1
            if since >= 32 or n <= 128:
                since = 0
                p = n_nb if n_nb < nb_max else nb_max
                sigma = _robust_scale(nb + n_nb - p, p, tmp, keys)
            # The octave test's bins take every point, capped (``_LongTest.clip``).
            if k != clip_k:
                clip_k = k
                clip_base = INFINITY
                kk = (k if k < K else K) - 1
                while kk >= 0:
                    if all_bins.has[kk]:
                        clip_base = all_bins.s[3 * kk + 1] / all_bins.s[3 * kk + 2]
                        break
                    kk -= 1
            _add(&all_bins, k, ls, py_min(xc, clip_base + clip * sigma))
            flag = False
            if n >= min_points:  # ``Stall._check``
                w = <Py_ssize_t> (window_frac * n)
                if w < min_window:
                    w = min_window
                if w > max_window:
                    w = max_window
                if n_cum < 2 * w + 1:
                    over = 0
                else:
                    p = n_cum - 1
                    ma = (cumx[p - w] - cumx[p - 2 * w]) / w
                    mb = (cumx[p] - cumx[p - w]) / w
                    la = (cuml[p - w] - cuml[p - 2 * w]) / w
                    lb = (cuml[p] - cuml[p - w]) / w
                    slope_age -= 1
                    if slope_age <= 0:
                        has_slope = _slope(&bins, la - (lb - la) / 2.0, ref_octaves,
                                           per_octave, &slope)
                        slope_age = 32
                    if not has_slope or slope >= 0:
                        over = 0
                    elif lb - la > 0.5 * LN2:
                        over = 0  # a huge step gap: no local extrapolation
                    else:
                        d_exp = -slope * (lb - la)
                        d_obs = ma - mb
                        se = sigma * sqrt(2.0 / w)
                        need = py_max(py_max(z * se, z_resid * resid_scale), min_fall)
                        if not (d_exp > need and d_obs < stall_frac * d_exp):
                            over = 0
                            flagged = 0
                            resid_age -= 1
                            if resid_age <= 0:
                                resid_age = w // 4 if w >= 4 else 1
                                rs[n_r] = d_obs - d_exp
                                n_r += 1
                                p = n_r if n_r < r_max else r_max
                                if p >= 8:
                                    resid_scale = _scatter(rs + n_r - p, p, tmp, keys)
                        else:
                            over += 1
                            if over >= patience:
                                if over == patience:
                                    stalls += 1
                                flagged += 1
                                if flagged >= adapt_after:
                                    for i in range(K):
                                        bins.has[i] = 0
                                    bins.n_order = 0
                                    bins.cleared = True
                                    has_slope = False
                                    slope_age = 0
                                    over = flagged = 0
                                out.append((idx[j], False, ma, mb, d_exp, d_obs, w))
                                flag = True
            if not flag and long_test and n >= long_min:  # ``Stall._check_long``
                if lt_k != k:
                    lt_k = k
                    new_octave = True
                    _sum_bins(&all_bins, k - per_octave, k - half, a)
                    _sum_bins(&all_bins, k - half, k, b)
                    has_lslope = _slope(&bins, (k - per_octave) * LN2 / per_octave,
                                        ref_octaves, per_octave, &lslope)
                cur = all_bins.s + 3 * k
                na = a[2]
                nbn = b[2] + cur[2]
                if not has_lslope or lslope >= 0 or py_min(na, nbn) < dmin_window:
                    lt_over = 0
                else:
                    ma = a[1] / na
                    mb = (b[1] + cur[1]) / nbn
                    d_exp = -lslope * ((b[0] + cur[0]) / nbn - a[0] / na)
                    d_obs = ma - mb
                    se = sigma * sqrt(1.0 / na + 1.0 / nbn)
                    need = py_max(py_max(z * se, long_z * lt_scale), min_fall)
                    p = n_lr if n_lr < lr_max else lr_max
                    if p < min_resid or not (d_exp > need and d_obs < stall_frac * d_exp):
                        lt_over = 0
                        if sampled != k:
                            sampled = k
                            lrs[n_lr] = d_obs - d_exp
                            n_lr += 1
                            p = n_lr if n_lr < lr_max else lr_max
                            if p >= 2:
                                lt_scale = _scatter(lrs + n_lr - p, p, tmp, keys)
                    else:
                        lt_over += 1
                        if lt_over >= patience:
                            if lt_over == patience:
                                stalls += 1
                            out.append((idx[j], True, ma, mb, d_exp, d_obs, <long long> nbn))
                            flag = True
            if not flag:
                _add(&bins, k, ls, x)
        # The state, as ``update`` leaves it.
        d._n = n
        d._x0, d._cx, d._cl, d._sigma = x0, cx, cl, sigma
        d._since_noise = since
        if has_unit:
            d._unit = unit
        i = n_cum - cum_max if n_cum - cum_max > cum0 else cum0
        cum.extend([(cumx[p], cuml[p]) for p in range(i, n_cum)])
        last5.extend([l5[p] for p in range(max(n_l5 - l5_max, l50), n_l5)])
        noise_buf.extend([nb[p] for p in range(max(n_nb - nb_max, nb0), n_nb)])
        resid.extend([rs[p] for p in range(max(n_r - r_max, r0), n_r)])
        lresid.extend([lrs[p] for p in range(max(n_lr - lr_max, lr0), n_lr)])
        d._resid_scale, d._resid_age = resid_scale, resid_age
        d._slope_cache = slope if has_slope else None
        d._slope_age = slope_age
        d._over, d._flagged, d._stalls = over, flagged, stalls
        _store_bins(&bins, d._bins)
        _store_bins(&all_bins, d._all_bins)
        lt.k, lt.clip_k, lt.clip_base, lt.over, lt.sampled = lt_k, clip_k, clip_base, lt_over, sampled
        if new_octave:  # fresh tuples, as ``_sum_bins`` makes them
            lt.a = (a[0], a[1], a[2])
            lt.b = (b[0], b[1], b[2])
            lt.slope = lslope if has_lslope else None
        lt.resid_n = len(lresid)
        lt.resid_scale = lt_scale
        return out
    finally:
        free(cumx)
        free(cuml)
        free(l5)
        free(nb)
        free(rs)
        free(lrs)
        free(tmp)
        free(keys)
        _free_bins(&bins)
        _free_bins(&all_bins)
