# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The expected-curve fits' bounded Levenberg-Marquardt solver, compiled.

Every expected-curve refit (CurveDeviation, live and in replay) and every forecast runs
this loop: a few dozen iterations on a dozen or two binned points, where per-call
overhead outweighs the arithmetic; ``scipy.optimize.least_squares`` on the same problems
is much slower and fits no better overall (``bench/README-fit-solver.md``). It keeps the
floats of the Python solver it replaced (the same sums in the same order, ``pow`` for
``**``, Python's ``max``/``min`` tie-breaking), which the real-run golden file pins.

Two models, both under scipy's soft-L1 loss ρ(r²) = 2f²(√(1 + r²/f²) − 1), with
analytic Jacobians (see ``solve``):
- the power law in the step, r_i = w_i·(E + A·(x_i + s0)^-α − y_i), p = (E, A, α, s0);
- the LR-area law (``zs`` given: the annealing areas), r_i = w_i·(E + A·x_i^-α − C·z_i −
  y_i), p = (E, A, α, C), where x is the forward area S1.
"""

from libc.math cimport INFINITY, fabs, isfinite, log, pow, sqrt
from libc.stdlib cimport free, malloc

from runwatch._pyfloat cimport py_max, py_min


cdef struct Problem:
    const double* xs   # scaled steps, >= 0
    const double* ys   # values
    const double* sws  # square roots of the weights, NULL: every weight 1
    const double* zs   # annealing areas (the LR-area law), NULL: the power law
    Py_ssize_t n
    double f2          # the soft-L1 scale, squared


cdef double _residuals(Problem* pb, const double* p, double* r, double* base,
                       double* pw) noexcept nogil:
    """The weighted residuals at p = (E, A, α, s0), each point's (x + s0) and its power
    (the Jacobian reuses them); returns the soft-L1 cost f²·Σ(√(1 + r²/f²) − 1)."""
    cdef double e = p[0], a = p[1], neg = -p[2], s0 = p[3], f2 = pb.f2
    cdef double total = 0.0, q, ri
    cdef Py_ssize_t i
    for i in range(pb.n):
        # > 0: x >= 0 and s0 >= 1e-6 for the power law; S1 > 0 for the area law
        base[i] = pb.xs[i] if pb.zs != NULL else pb.xs[i] + s0
        q = pow(base[i], neg)
        pw[i] = q
        ri = e + a * q
        if pb.zs != NULL:
            ri = ri - p[3] * pb.zs[i]
        ri = ri - pb.ys[i]
        if pb.sws != NULL:
            ri = pb.sws[i] * ri
        r[i] = ri
    for i in range(pb.n):
        total += sqrt(1.0 + r[i] * r[i] / f2) - 1.0
    return f2 * total


cdef void _normal_equations(Problem* pb, const double* p, const double* r,
                            const double* base, const double* pw, double* g,
                            double* h) noexcept nogil:
    """Gradient Jᵀ·ρ'·r and Gauss-Newton Hessian Jᵀ·diag(ρ' + 2r²ρ'')·J (row-major 4×4)
    of the soft-L1 cost; for soft-L1, ρ' = (1 + r²/f²)^-1/2 and ρ' + 2r²ρ'' = (1 +
    r²/f²)^-3/2. A unit weight multiplies by 1.0, which changes no float."""
    cdef double neg_a = -p[1], alpha = p[2], f2 = pb.f2
    cdef double g0 = 0.0, g1 = 0.0, g2 = 0.0, g3 = 0.0
    cdef double h00 = 0.0, h01 = 0.0, h02 = 0.0, h03 = 0.0, h11 = 0.0
    cdef double h12 = 0.0, h13 = 0.0, h22 = 0.0, h23 = 0.0, h33 = 0.0
    cdef double j0, j1, j2, j3, t, b, ri, u, su, gw, hw, w0, w1, w2, w3
    cdef Py_ssize_t i
    for i in range(pb.n):
        j0 = 1.0 if pb.sws == NULL else pb.sws[i]
        ri = r[i]
        b = base[i]
        j1 = j0 * pw[i]  # the Jacobian's row: d r / d (E, A, alpha, s0)
        t = neg_a * j1
        j2 = t * log(b)
        j3 = -j0 * pb.zs[i] if pb.zs != NULL else t * alpha / b
        u = 1.0 + ri * ri / f2
        su = sqrt(u)
        gw = ri / su
        g0 += j0 * gw
        g1 += j1 * gw
        g2 += j2 * gw
        g3 += j3 * gw
        hw = 1.0 / (u * su)
        w0 = hw * j0
        w1 = hw * j1
        w2 = hw * j2
        w3 = hw * j3
        h00 += w0 * j0
        h01 += w0 * j1
        h02 += w0 * j2
        h03 += w0 * j3
        h11 += w1 * j1
        h12 += w1 * j2
        h13 += w1 * j3
        h22 += w2 * j2
        h23 += w2 * j3
        h33 += w3 * j3
    g[0] = g0
    g[1] = g1
    g[2] = g2
    g[3] = g3
    h[0] = h00
    h[1] = h01
    h[2] = h02
    h[3] = h03
    h[4] = h01
    h[5] = h11
    h[6] = h12
    h[7] = h13
    h[8] = h02
    h[9] = h12
    h[10] = h22
    h[11] = h23
    h[12] = h03
    h[13] = h13
    h[14] = h23
    h[15] = h33


cdef bint _damped_solve(const double* m, const double* dh, double lam, const double* v,
                        int n, double* x) noexcept nogil:
    """x = (m + lam·diag(dh))⁻¹·v for the n×n (row-major, stride 4) symmetric ``m``, by
    Cholesky; False if the damped matrix is not (numerically) positive definite, and the
    caller then damps more."""
    cdef double low[4][4]
    cdef double d[4][4]
    cdef double t
    cdef int i, j, k
    for i in range(n):
        for j in range(n):
            d[i][j] = m[4 * i + j]
        d[i][i] += lam * dh[i]
    for i in range(n):
        for j in range(i + 1):
            t = d[i][j]
            for k in range(j):
                t -= low[i][k] * low[j][k]
            if i != j:
                low[i][j] = t / low[j][j]
            elif t > 0.0:
                low[i][i] = sqrt(t)
            else:
                return False
    for i in range(n):  # low·z = v
        x[i] = v[i]
        for k in range(i):
            x[i] -= low[i][k] * x[k]
        x[i] /= low[i][i]
    for i in range(n - 1, -1, -1):  # lowᵀ·x = z
        for k in range(i + 1, n):
            x[i] -= low[k][i] * x[k]
        x[i] /= low[i][i]
    return True


cdef double _predicted_gain(const double* g, const double* h, const double* d,
                            int n) noexcept nogil:
    """The fall of the cost the quadratic model predicts for step d: -(g·d + ½·dᵀ·h·d),
    each sum added in order from 0."""
    cdef double quad = 0.0, inner, lin = 0.0
    cdef int k, m
    for k in range(n):
        inner = 0.0
        for m in range(n):
            inner += h[4 * k + m] * d[m]
        quad += d[k] * inner
    for k in range(n):
        lin += g[k] * d[k]
    return -(lin + 0.5 * quad)


cdef double _cube(double x) noexcept nogil:
    """Python's ``x ** 3`` for a float: pow of |x|, negated for a negative x."""
    return -pow(-x, 3.0) if x < 0.0 else pow(x, 3.0)


cdef const double* _data(arr, Py_ssize_t n):
    """The data of a C-contiguous float64 array (None, or no points: NULL); the caller
    keeps the array alive while the pointer is in use."""
    cdef const double[::1] view
    if arr is None or n == 0:
        return NULL
    view = arr
    return &view[0]


cdef void _problem(Problem* pb, const double[::1] xs, const double[::1] ys, sws, zs,
                   double f2):
    """Fill ``pb`` with a fit's points (see ``solve`` for the arguments)."""
    pb.n = xs.shape[0]
    pb.xs = &xs[0] if pb.n else NULL
    pb.ys = &ys[0] if pb.n else NULL
    pb.sws = _data(sws, pb.n)
    pb.zs = _data(zs, pb.n)
    pb.f2 = f2


def cost_at(const double[::1] xs, const double[::1] ys, sws, p, double f2, zs=None) -> float:
    """The soft-L1 cost of the fit's points at parameters ``p`` (see ``solve``)."""
    cdef Problem pb
    cdef double pp[4]
    cdef Py_ssize_t n = xs.shape[0]
    cdef int k
    cdef double* buf = <double*> malloc(3 * max(n, 1) * sizeof(double))
    if buf == NULL:
        raise MemoryError()
    _problem(&pb, xs, ys, sws, zs, f2)
    for k in range(4):
        pp[k] = p[k]
    try:
        return _residuals(&pb, pp, buf, buf + n, buf + 2 * n)
    finally:
        free(buf)


def solve(const double[::1] xs, const double[::1] ys, sws, p0, lo, hi, double f2,
          int max_iter=100, double ftol=1e-10, zs=None) -> tuple[list[float], float]:
    """Bounded Levenberg-Marquardt on the soft-L1 cost; returns (parameters, cost).

    ``xs``, ``ys``: the points (scaled steps, or forward areas for the area law);
    ``sws``: square roots of their weights, or None for weights of 1; ``zs``: the
    annealing areas of the LR-area law, None for the power law. The robust loss enters as
    in scipy (``_normal_equations``). A parameter on a bound whose gradient pushes it
    outward is held there for that step, and one whose bounds are equal is held for good;
    steps are clipped into the box [``lo``, ``hi``]. Only steps that lower the cost are
    taken, so the result is never worse than ``p0``; the damping follows Nielsen's update.
    Stops after ``max_iter`` steps, when a step gains less than ``ftol`` of the cost, or
    when no parameter moves.
    """
    cdef Problem pb
    cdef Py_ssize_t n = xs.shape[0]
    cdef double p[4]
    cdef double pn[4]
    cdef double plo[4]
    cdef double phi[4]
    cdef double g[4]
    cdef double h[16]
    cdef double gf[4]
    cdef double hf[16]
    cdef double dh[4]
    cdef double neg_g[4]
    cdef double d[4]
    cdef int free_k[4]
    cdef int nf, k, m, it
    cdef double cost, cn = INFINITY, lam = 1e-3, nu = 2.0, mx, floor, pred, rho, gain
    cdef bint small
    cdef double* tmp
    cdef double* buf = <double*> malloc(6 * max(n, 1) * sizeof(double))
    if buf == NULL:
        raise MemoryError()
    cdef double* r = buf
    cdef double* base = buf + n
    cdef double* pw = buf + 2 * n
    cdef double* rn = buf + 3 * n
    cdef double* base_n = buf + 4 * n
    cdef double* pw_n = buf + 5 * n
    _problem(&pb, xs, ys, sws, zs, f2)
    for k in range(4):
        p[k] = p0[k]
        plo[k] = lo[k]
        phi[k] = hi[k]
    try:
        cost = _residuals(&pb, p, r, base, pw)
        if not isfinite(cost):
            return [p[0], p[1], p[2], p[3]], INFINITY
        for it in range(max_iter):
            _normal_equations(&pb, p, r, base, pw, g, h)
            nf = 0
            for k in range(4):
                if plo[k] == phi[k]:
                    continue  # fixed: C of an area law fitted with no anneal in its data
                if not ((p[k] <= plo[k] and g[k] > 0) or (p[k] >= phi[k] and g[k] < 0)):
                    free_k[nf] = k
                    nf += 1
            if nf == 0:
                break
            for k in range(nf):
                gf[k] = g[free_k[k]]
                neg_g[k] = -gf[k]
                for m in range(nf):
                    hf[4 * k + m] = h[4 * free_k[k] + free_k[m]]
            mx = hf[0]
            for k in range(1, nf):
                mx = py_max(mx, hf[5 * k])
            floor = 1e-12 * py_max(mx, 1e-300)
            for k in range(nf):
                dh[k] = py_max(hf[5 * k], floor)
            while True:
                if _damped_solve(hf, dh, lam, neg_g, nf, d):
                    for k in range(4):
                        pn[k] = p[k]
                    for k in range(nf):
                        pn[free_k[k]] += d[k]
                    for k in range(4):
                        pn[k] = py_min(py_max(pn[k], plo[k]), phi[k])
                    cn = _residuals(&pb, pn, rn, base_n, pw_n)
                    if cn < cost:
                        # Nielsen's damping update: follow how well the model predicted
                        # the gain.
                        pred = _predicted_gain(gf, hf, d, nf)
                        rho = (cost - cn) / pred if pred > 0 else 0.0
                        lam *= py_max(1.0 / 3.0, 1.0 - _cube(2.0 * rho - 1.0))
                        nu = 2.0
                        break
                lam *= nu
                nu *= 2.0
                if lam > 1e12:
                    return [p[0], p[1], p[2], p[3]], cost  # a (bounded) minimum
            gain = cost - cn
            small = True
            for k in range(4):
                if not fabs(pn[k] - p[k]) <= 1e-10 * (fabs(pn[k]) + 1e-10):
                    small = False
                    break
            for k in range(4):
                p[k] = pn[k]
            cost = cn
            tmp = r
            r = rn
            rn = tmp
            tmp = base
            base = base_n
            base_n = tmp
            tmp = pw
            pw = pw_n
            pw_n = tmp
            if gain <= ftol * cost or small:
                break
        return [p[0], p[1], p[2], p[3]], cost
    finally:
        free(buf)
