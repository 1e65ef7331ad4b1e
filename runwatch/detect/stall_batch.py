"""Stall's batch path: ``Stall.update_many`` without ``update`` calls.

Kept apart from the detector because only batch replay needs it. What depends on the
values alone - logs, the running median and the clip, the noise scale, the running sums
of the window test, the octave bins of every point - is computed for the whole batch in
numpy. The two tests, whose state (reference slopes, the scatter of the statistic, the
learned bins) depends on what was flagged, then run over chunks: a chunk where nothing
is flagged (nearly all of them) is tested at once; any other goes point by point, in a
lean loop on the precomputed figures. Every figure is formed by
the same float operations in the same order as ``Stall.update`` forms it
(``tests/detect/test_batch.py`` checks signals and state bit for bit).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

import numpy as np

from runwatch.detect.base import Signal, robust_scales, running_medians, windows
from runwatch.detect.stall import _LN2, Stall, _scatter


def run(
    d: Stall,
    steps: Sequence[int],
    values: Sequence[float],
    idx: Sequence[int],
    s1: list[float] | None,
) -> list:
    """Feed finite points (all judged in the same space, all measured by step or all by
    summed LR ``s1``) to ``d``; return ``(index, signal)`` for the flagged, ``index``
    taken from ``idx``."""
    m = len(values)
    n0 = d._n
    xl = list(map(math.log, values)) if d._log else list(values)
    x = np.array(xl)
    if n0 == 0:
        d._x0 = xl[0]
        d._cum.append((0.0, 0.0))
    x0 = d._x0
    # The noise scale: redone after every point up to 128, then every 32 points.
    since, sig_now = d._since_noise, d._sigma
    early = max(0, min(m, 128 - n0))  # points while the count is still <= 128
    if early:
        since = 0
    redo = [*range(early), *range(early + 31 - since, m, 32)]
    since = (since + m - early) % 32
    nb0 = list(d._noise_buf)
    z = np.concatenate((np.array(nb0), x))
    scales = robust_scales(z, len(nb0) + np.array(redo, dtype=np.int64) + 1, 128)
    sig_after = np.empty(m)
    pos = np.zeros(m, dtype=np.int64)
    pos[redo] = 1
    which = np.cumsum(pos) - 1  # the last recomputation at or before each point
    table = np.array([sig_now, *scales])
    sig_after[:] = table[which + 1]
    sig_before = np.concatenate(([sig_now], sig_after[:-1]))
    # Clip to the running median of 5 +- 3 sigma (sigma as it was before the point).
    med = np.array(running_medians(list(d._last5), xl, 5))
    lim = 3.0 * sig_before
    xc = np.minimum(np.maximum(x, med - lim), med + lim)
    if d._by_lr:
        ls = np.array(list(map(d._lr_coord, s1)))  # sets the unit as update does
    else:
        st = np.array(steps, dtype=np.int64)
        ls = np.zeros(m)
        big = st > 1
        ls[big] = list(map(math.log, st[big].tolist()))
    cx = np.cumsum(np.concatenate(([d._cx], xc - x0)))[1:]
    cl = np.cumsum(np.concatenate(([d._cl], ls)))[1:]
    po = d.per_octave
    k = (po * ls / _LN2).astype(np.int64)
    cur = _all_bins(d, k, ls, xc, sig_after)
    # The window test's figures for every window size w (decided by the count alone).
    prior = list(d._cum)
    cum_x = np.concatenate((np.array([c[0] for c in prior]), cx))
    cum_l = np.concatenate((np.array([c[1] for c in prior]), cl))
    off = n0 + 1 - len(prior)  # the count of cum_x[0]
    n = n0 + 1 + np.arange(m)
    w = np.minimum(np.maximum((d.window_frac * n).astype(np.int64), d.min_window), d.max_window)
    ready = n >= 2 * w
    p2 = n - off
    p1 = np.where(ready, p2 - w, p2)
    p0 = np.where(ready, p2 - 2 * w, p2)
    mean_a = (cum_x[p1] - cum_x[p0]) / w
    mean_b = (cum_x[p2] - cum_x[p1]) / w
    ls_a = (cum_l[p1] - cum_l[p0]) / w
    ls_b = (cum_l[p2] - cum_l[p1]) / w
    ls_start = ls_a - (ls_b - ls_a) / 2.0
    dls = ls_b - ls_a
    gap = dls > 0.5 * _LN2
    zse = d.z * (sig_after * np.sqrt(2.0 / w))
    b = _Batch(d, n0, values, idx, xl, ls, k, sig_after, cur)
    b.window_test(w, ready, mean_a, mean_b, ls_start, dls, gap, zse)
    out = b.run()
    # The state update leaves after the last point.
    d._n = n0 + m
    d._cx, d._cl = float(cx[-1]), float(cl[-1])
    keep = d._cum.maxlen or m  # only the last maxlen pairs stay
    d._cum.extend(zip(cx[-keep:].tolist(), cl[-keep:].tolist(), strict=True))
    d._last5.extend(xl[-5:])
    d._noise_buf.extend(xl[-128:])
    d._sigma = float(sig_after[-1])
    d._since_noise = since
    return out


def _all_bins(
    d: Stall, k: np.ndarray, ls: np.ndarray, xc: np.ndarray, sig: np.ndarray
) -> list[np.ndarray]:
    """Add every point to the octave test's bins (capped as ``_LongTest.clip`` caps it);
    return each point's bin sums just after it was added."""
    lt, bins = d._long, d._all_bins
    cut = np.flatnonzero(np.diff(k)) + 1
    bounds = [0, *cut.tolist(), k.size]
    s0: list[np.ndarray] = []
    s1: list[np.ndarray] = []
    s2: list[np.ndarray] = []
    for a, b in itertools.pairwise(bounds):
        kk = int(k[a])
        if kk != lt.clip_k:
            lt.new_clip_bin(kk, bins)
        val = np.minimum(xc[a:b], lt.clip_base + lt.CLIP * sig[a:b])
        old = bins.get(kk)
        if old is None:
            c0 = np.cumsum(ls[a:b])
            c1 = np.cumsum(val)
            c2 = np.arange(1, b - a + 1, dtype=float)
        else:
            c0 = np.cumsum(np.concatenate(([old[0]], ls[a:b])))[1:]
            c1 = np.cumsum(np.concatenate(([old[1]], val)))[1:]
            c2 = old[2] + np.arange(1, b - a + 1, dtype=float)
        bins[kk] = [float(c0[-1]), float(c1[-1]), float(c2[-1])]
        s0.append(c0)
        s1.append(c1)
        s2.append(c2)
    return [np.concatenate(s) for s in (s0, s1, s2)]


class _Batch:
    """The two tests over one batch: quiet chunks at once, the others point by point."""

    CHUNK = 2048

    def __init__(self, d: Stall, n0, values, idx, xl, ls, k, sig, cur) -> None:
        self.d, self.n0, self.values, self.idx = d, n0, values, idx
        self.xl = xl
        self.k, self.sig = k, sig
        self.ls_l, self.k_l = ls.tolist(), k.tolist()
        self.cur = cur
        self.m = len(xl)
        n = n0 + 1 + np.arange(self.m)
        self.short = n >= d.min_points
        self.long = (n >= d.long_min_points) & d.long_test
        self.flushed = 0
        self.ls, self.x = ls, np.asarray(xl, dtype=float)
        self.pre_from: int | None = None  # where the running sums of _prefix start

    def window_test(self, w, ready, mean_a, mean_b, ls_start, dls, gap, zse) -> None:
        """The window test's figures of every point (decided by the values alone)."""
        self.win = (w, ready, mean_a, mean_b, ls_start, dls, gap, zse)
        self.w, self.ls_start, self.dls, self.gap, self.zse = w, ls_start, dls, gap, zse
        self.d_obs = mean_a - mean_b
        self.chk = self.short & ready

    def run(self) -> list:
        """Every point, chunk by chunk; ``(index, signal)`` for the flagged."""
        d = self.d
        out: list = []
        a = 0
        while a < self.m:
            e = min(self.m, a + self.CHUNK)
            if d._over or d._flagged or d._long.over or not self._quiet(a, e):
                self._flush(a)
                out += self._loop(a, e)
                self.flushed = e
                self.pre_from = None  # flagged points were not learned
            a = e
        self._flush(self.m)
        return out

    def _flush(self, upto: int) -> None:
        """Learn the points from ``flushed`` up to ``upto`` as ``_learn`` adds them: each
        bin touched gets its sums after the last of them, read from running sums of the
        points from ``pre_from`` on (``_prefix``; a few bins per call, not a loop over
        the points)."""
        lo = self.flushed
        if upto <= lo:
            return
        if self.pre_from is None:
            self._prefix(lo)
        bins, k_l, ends, off = self.d._bins, self.k_l, self.pre_ends, self.pre_from
        p0, p1, p2 = self.pre
        j = lo
        while j < upto:
            e = min(ends[bisect.bisect_right(ends, j)], upto)
            r = e - 1 - off
            bins[k_l[j]] = [float(p0[r]), float(p1[r]), float(p2[r])]
            j = e
        self.flushed = upto

    def _prefix(self, start: int) -> None:
        """Running sums of each bin from point ``start`` on, as ``_learn`` forms them if
        every point from there is learned (true up to the next chunk run point by point,
        which drops them): ``pre[i][j - start]`` is bin ``k[j]``'s sum ``i`` just after
        point ``j``; ``pre_ends`` the ends of the runs of points in one bin."""
        k, ls, x = self.k[start:], self.ls[start:], self.x[start:]
        cut = np.flatnonzero(np.diff(k)) + 1
        bounds = [0, *cut.tolist(), k.size]
        bins, now = self.d._bins, {}
        s0: list[np.ndarray] = []
        s1: list[np.ndarray] = []
        s2: list[np.ndarray] = []
        for a, b in itertools.pairwise(bounds):
            kk = self.k_l[start + a]
            old = now[kk] if kk in now else bins.get(kk)
            if old is None:
                c0 = np.cumsum(ls[a:b])
                c1 = np.cumsum(x[a:b])
                c2 = np.arange(1, b - a + 1, dtype=float)
            else:
                c0 = np.cumsum(np.concatenate(([old[0]], ls[a:b])))[1:]
                c1 = np.cumsum(np.concatenate(([old[1]], x[a:b])))[1:]
                c2 = old[2] + np.arange(1, b - a + 1, dtype=float)
            now[kk] = (c0[-1], c1[-1], c2[-1])
            s0.append(c0)
            s1.append(c1)
            s2.append(c2)
        self.pre = [np.concatenate(c) for c in (s0, s1, s2)]
        self.pre_ends = [start + b for b in bounds]
        self.pre_from = start

    def _quiet(self, a: int, e: int) -> bool:
        """Run points a..e-1 at once if none of them is flagged (then every point is
        learned); False, with the state as it was, if one would be."""
        d, lt = self.d, self.d._long
        keep = (
            {kk: list(v) for kk, v in d._bins.items()},
            list(d._resid),
            (d._slope_cache, d._slope_age, d._resid_scale, d._resid_age),
            (lt.k, lt.a, lt.b, lt.slope, lt.sampled, list(lt.resid), lt.resid_n, lt.resid_scale),
        )
        tested = a + np.flatnonzero(self.chk[a:e])
        redo = list(range(max(d._slope_age, 1) - 1, tested.size, 32))
        pts = a + np.flatnonzero(self.long[a:e])
        kk = self.k[pts]
        new = np.flatnonzero(np.diff(kk, prepend=lt.k) != 0)  # a new bin of the octave test
        # Reference slopes read the learned bins: redo them in point order, learning the
        # points before each (all are learned in a quiet chunk).
        events = sorted(
            [(int(tested[t]), 0) for t in redo] + [(int(pts[u]), 1) for u in new.tolist()]
        )
        slopes: list[float | None] = [d._slope_cache]
        octaves: list[tuple] = [(lt.a, lt.b, lt.slope)]
        for j, kind in events:
            self._flush(j)
            if kind == 0:
                slopes.append(d._slope(float(self.ls_start[j])))
            else:
                d._new_octave(self.k_l[j])
                octaves.append((lt.a, lt.b, lt.slope))
        if self._quiet_short(tested, redo, slopes) and self._quiet_long(pts, new, octaves):
            self._flush(e)
            return True
        bins, resid = d._bins, d._resid
        bins.clear()
        bins.update(keep[0])
        resid.clear()
        resid.extend(keep[1])
        d._slope_cache, d._slope_age, d._resid_scale, d._resid_age = keep[2]
        lt.k, lt.a, lt.b, lt.slope, lt.sampled, res, lt.resid_n, lt.resid_scale = keep[3]
        lt.resid.clear()
        lt.resid.extend(res)
        self.flushed = a
        return False

    def _quiet_short(self, tested: np.ndarray, redo: list[int], slopes: list) -> bool:
        """The window test at the ``tested`` points if nothing is flagged: the reference
        slope redone at the ``redo``-th of them, the statistic's scatter sampled every
        max(w // 4, 1) points that have a slope."""
        d = self.d
        t_n = tested.size
        if not t_n:
            return True
        d._slope_age = 32 - (t_n - 1 - redo[-1]) if redo else d._slope_age - t_n
        d._slope_cache = slopes[-1]
        which = np.searchsorted(np.array(redo, dtype=np.int64), np.arange(t_n), side="right")
        sl = np.array([math.nan if v is None else v for v in slopes])[which]
        ok = (sl < 0) & ~self.gap[tested]  # NaN (no slope) compares False
        el = tested[ok]
        if not el.size:
            return True
        d_exp = -sl[ok] * self.dls[el]
        d_obs = self.d_obs[el]
        w = self.w
        samples: list[int] = []
        w_el = w[el].tolist()
        u = max(d._resid_age, 1) - 1
        while u < el.size:
            samples.append(u)
            u += max(w_el[u] // 4, 1)
        d._resid_age = u - (el.size - 1) if samples else d._resid_age - el.size
        scales = [d._resid_scale, *_scatters(d, (d_obs[samples] - d_exp[samples]).tolist())]
        before = np.searchsorted(np.array(samples, dtype=np.int64), np.arange(el.size))
        rs = np.array(scales)[before]  # the scale a point is tested with: before its sample
        need = np.maximum(np.maximum(self.zse[el], d.z_resid * rs), d.min_fall)
        return not bool(np.any((d_exp > need) & (d_obs < d.stall_frac * d_exp)))

    def _quiet_long(self, pts: np.ndarray, new: np.ndarray, octaves: list[tuple]) -> bool:
        """The octave test at ``pts`` if nothing is flagged: the halves and the reference
        slope from ``octaves`` (the current one, then one per ``new`` bin), the scatter
        sampled at the first point of a bin that reaches the test."""
        d, lt = self.d, self.d._long
        if not pts.size:
            return True
        c0, c1, c2 = self.cur
        starts = sorted({0, *new.tolist()})
        which = {u: i + 1 for i, u in enumerate(new.tolist())}
        for s0, s1 in itertools.pairwise([*starts, pts.size]):
            (_, _, na), (b0, b1, b2), slope = octaves[which.get(s0, 0)]
            if slope is None or slope >= 0:
                continue
            js = pts[s0:s1]
            nb = b2 + c2[js]
            el = np.minimum(na, nb) >= d.min_window
            if not el.any():
                continue
            js, nb = js[el], nb[el]
            a0, a1 = octaves[which.get(s0, 0)][0][:2]
            mean_a = a1 / na
            mean_b = (b1 + c1[js]) / nb
            d_exp = -slope * ((b0 + c0[js]) / nb - a0 / na)
            d_obs = mean_a - mean_b
            se = self.sig[js] * np.sqrt(1.0 / na + 1.0 / nb)
            rs = np.full(js.size, lt.resid_scale)
            rn = np.full(js.size, lt.resid_n)
            k = self.k_l[int(js[0])]
            if lt.sampled != k:
                # The first point of the bin that reaches the test samples the scatter.
                need0 = max(d.z * float(se[0]), d.long_z_resid * lt.resid_scale, d.min_fall)
                de0, do0 = float(d_exp[0]), float(d_obs[0])
                if lt.resid_n >= lt.MIN_RESID and de0 > need0 and do0 < d.stall_frac * de0:
                    return False
                lt.sampled = k
                lt.add_resid(do0 - de0)
                rs[1:] = lt.resid_scale
                rn[1:] = lt.resid_n
            need = np.maximum(np.maximum(d.z * se, d.long_z_resid * rs), d.min_fall)
            hit = (rn >= lt.MIN_RESID) & (d_exp > need) & (d_obs < d.stall_frac * d_exp)
            if hit.any():
                return False
        return True

    def _loop(self, a: int, e: int) -> list:
        """Points a..e-1 one by one (a chunk where something is flagged)."""
        win = [v[a:e].tolist() for v in self.win]
        cur = [c[a:e].tolist() for c in self.cur]
        out = _loop_range(
            self.d, self.n0 + a, self.values[a:e], self.idx[a:e], self.xl[a:e],
            self.ls_l[a:e], self.k_l[a:e], self.sig[a:e].tolist(), cur, win,
        )  # fmt: skip
        return out


def _scatters(d: Stall, new: list[float]) -> list[float]:
    """Append ``new`` to the window test's samples of its statistic; return its scatter
    (``_scatter``, kept from 8 samples on) after each, the full windows of 64 sorted by
    numpy (the same order statistics of the same values)."""
    resid = d._resid
    seq = [*resid, *new]
    size = resid.maxlen or len(seq)
    out: list[float] = []
    first = len(resid) + 1  # samples held after the first of ``new``
    short = min(len(new), max(0, size - first + 1))  # appends before the window is full
    for i in range(short):
        n = first + i
        if n >= 8:
            d._resid_scale = _scatter(seq[:n])
        out.append(d._resid_scale)
    if short < len(new):
        ends = np.arange(first + short, len(seq) + 1)
        rows = np.sort(windows(np.array(seq), size)[ends - size], axis=1)
        h = size // 2
        dev = np.partition(np.abs(rows - rows[:, h : h + 1]), h, axis=1)[:, h]
        out += (1.4826 * dev).tolist()
        d._resid_scale = out[-1]
    resid.extend(new)
    return out


def _loop_range(d: Stall, n0, values, idx, xl, ls_l, k_l, sig_l, cur, win) -> list:
    """The two tests and the learning, point by point, on precomputed figures (``n0``:
    the count before the first of them)."""
    w_l, ready_l, ma_l, mb_l, lss_l, dls_l, gap_l, zse_l = win
    c0_l, c1_l, c2_l = cur
    out: list[tuple[int, Signal]] = []
    bins, lt = d._bins, d._long
    min_points, long_min = d.min_points, d.long_min_points
    long_test = d.long_test
    z, z_resid, long_z, min_fall = d.z, d.z_resid, d.long_z_resid, d.min_fall
    sf, patience, adapt_after = d.stall_frac, d.patience, d.adapt_after
    min_window = d.min_window
    min_resid = lt.MIN_RESID
    resid = d._resid
    over, flagged, stalls = d._over, d._flagged, d._stalls
    slope_cache, slope_age = d._slope_cache, d._slope_age
    resid_scale, resid_age = d._resid_scale, d._resid_age
    sqrt = math.sqrt
    for j in range(len(xl)):
        n = n0 + j + 1
        sig = None
        if n >= min_points:
            if not ready_l[j]:
                over = 0
            else:
                slope_age -= 1
                if slope_age <= 0:
                    slope_cache = d._slope(lss_l[j])
                    slope_age = 32
                slope = slope_cache
                if slope is None or slope >= 0 or gap_l[j]:
                    over = 0
                else:
                    d_exp = -slope * dls_l[j]
                    d_obs = ma_l[j] - mb_l[j]
                    need = max(zse_l[j], z_resid * resid_scale, min_fall)
                    if not (d_exp > need and d_obs < sf * d_exp):
                        over = 0
                        flagged = 0
                        resid_age -= 1
                        if resid_age <= 0:
                            resid_age = max(w_l[j] // 4, 1)
                            resid.append(d_obs - d_exp)
                            if len(resid) >= 8:
                                resid_scale = _scatter(resid)
                    else:
                        over += 1
                        if over >= patience:
                            if over == patience:
                                stalls += 1
                            flagged += 1
                            if flagged >= adapt_after:
                                bins.clear()
                                slope_cache, slope_age = None, 0
                                over = flagged = 0
                            w = w_l[j]
                            sig = d._signal(
                                values[j], ma_l[j], mb_l[j], d_exp, d_obs, w, f"the last {w} points"
                            )
        if sig is None and long_test and n >= long_min:
            kk = k_l[j]
            if lt.k != kk:
                d._new_octave(kk)
            na, nb = lt.a[2], lt.b[2] + c2_l[j]
            lslope = lt.slope
            if lslope is None or lslope >= 0 or min(na, nb) < min_window:
                lt.over = 0
            else:
                mean_a = lt.a[1] / na
                mean_b = (lt.b[1] + c1_l[j]) / nb
                d_exp = -lslope * ((lt.b[0] + c0_l[j]) / nb - lt.a[0] / na)
                d_obs = mean_a - mean_b
                se = sig_l[j] * sqrt(1.0 / na + 1.0 / nb)
                need = max(z * se, long_z * lt.resid_scale, min_fall)
                if lt.resid_n < min_resid or not (d_exp > need and d_obs < sf * d_exp):
                    lt.over = 0
                    if lt.sampled != kk:
                        lt.sampled = kk
                        lt.add_resid(d_obs - d_exp)
                else:
                    lt.over += 1
                    if lt.over >= patience:
                        if lt.over == patience:
                            stalls += 1
                        sig = d._signal(
                            values[j], mean_a, mean_b, d_exp, d_obs, int(nb), "the last octave"
                        )
        if sig is None:
            kb = k_l[j]
            b = bins.get(kb)
            if b is None:
                bins[kb] = [ls_l[j], xl[j], 1.0]
            else:
                b[0] += ls_l[j]
                b[1] += xl[j]
                b[2] += 1.0
        else:
            out.append((idx[j], sig))
    d._over, d._flagged, d._stalls = over, flagged, stalls
    d._slope_cache, d._slope_age = slope_cache, slope_age
    d._resid_scale, d._resid_age = resid_scale, resid_age
    return out
