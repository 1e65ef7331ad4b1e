# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Divergence's state and per-point step, compiled (the one definition of both).

``divergence.Divergence`` is the public face: it validates the parameters, builds this
core, and turns the flag records into Signals. Live watching (``update``) and batch
replay (``update_many``, see ``_valuecore.ValueCore``) run the same ``_step``.
"""

cimport cython
from libc.math cimport INFINITY, NAN, fabs, isfinite, log, sqrt
from libc.stdlib cimport free, malloc
from libc.string cimport memmove

from runwatch.detect._valuecore cimport FLAGGED, QUIET, Outcome, SortedWindow, ValueCore

from runwatch.detect.base import NOISE_KEEP, NOISE_RATE

cdef double noise_rate = NOISE_RATE, noise_keep = NOISE_KEEP  # the noise EMA not started: the first difference is it's weights


@cython.final
cdef class DivergenceCore(ValueCore):
    """Running median then EMA of the (log) value, against the lowest recent block mean.

    A flag record is ``(ref, rise, need, noise, smoothed, points, in_log)``: the reference,
    the smoothed value's rise above it and the rise needed, the EMA's noise sigma, the
    smoothed value, how many points in a row it has been rising, and whether it works in
    logs.

    The parameters are ``Divergence``'s, in its order, but for ``critical_ratio`` (the
    Signal's business); ``Divergence`` validates them.
    """

    cdef SortedWindow recent
    cdef double* blocks  # block means, oldest first
    cdef Py_ssize_t nb, ref_blocks, block, warmup, patience, adapt_after, span
    cdef double alpha, beta, ema_sd, threshold, min_rise
    cdef bint log_only, log_space
    cdef str space
    cdef Py_ssize_t n, cur_n, over, flagged, _divergences
    cdef double ema, prev, absdiff, cur_sum, best  # best: the lowest block mean (nb > 0)
    cdef double f_ref, f_rise, f_need, f_noise  # the last flagged point's record
    cdef Py_ssize_t f_over

    def __dealloc__(self) -> None:
        free(self.blocks)

    def __init__(
        self,
        Py_ssize_t span,
        double threshold,
        double min_rise,
        Py_ssize_t patience,
        Py_ssize_t warmup,
        Py_ssize_t median_window,
        Py_ssize_t block,
        Py_ssize_t ref_blocks,
        Py_ssize_t adapt_after,
        str space,
    ) -> None:
        free(self.blocks)
        self.blocks = <double*>malloc(ref_blocks * sizeof(double))
        if self.blocks == NULL:
            raise MemoryError()
        self.recent = SortedWindow(median_window)
        self.span, self.alpha = span, 2.0 / (span + 1.0)
        self.beta = 1.0 - self.alpha
        self.ema_sd = sqrt(self.alpha / (2.0 - self.alpha))
        self.threshold, self.min_rise = threshold, min_rise
        self.patience, self.warmup = patience, warmup
        self.block, self.ref_blocks, self.adapt_after = block, ref_blocks, adapt_after
        self.space, self.log_only, self.log_space = space, space == "log", space != "linear"
        self.n = self.nb = self.cur_n = self.over = self.flagged = self._divergences = 0
        self.ema = self.prev = self.absdiff = NAN
        self.cur_sum = 0.0
        self.best = INFINITY

    @property
    def divergences(self) -> int:
        """How many times a divergence was declared."""
        return self._divergences

    @property
    def smoothed(self) -> float:
        """The current smoothed value (log space if the core works in logs)."""
        return self.ema

    @property
    def in_log(self) -> bool:
        """Whether the core works in log space."""
        return self.log_space

    @property
    def block_means(self) -> tuple:
        """The block means the reference is the lowest of, oldest first."""
        return tuple([self.blocks[i] for i in range(self.nb)])

    cdef void _learn(self, double e) noexcept nogil:
        """Add the smoothed value ``e`` to the current block; a full block's mean joins
        the reference's blocks (the oldest dropped beyond ``ref_blocks``)."""
        cdef Py_ssize_t i
        self.cur_sum += e
        self.cur_n += 1
        if self.cur_n < self.block:
            return
        if self.nb == self.ref_blocks:
            memmove(self.blocks, self.blocks + 1, (self.nb - 1) * sizeof(double))
            self.nb -= 1
        self.blocks[self.nb] = self.cur_sum / self.cur_n
        self.nb += 1
        self.cur_sum, self.cur_n = 0.0, 0
        self.best = self.blocks[0]  # the first lowest, as Python's min
        for i in range(1, self.nb):
            if self.blocks[i] < self.best:
                self.best = self.blocks[i]

    cdef Outcome _step(self, double value) noexcept nogil:
        cdef double x, d, t, sigma, ref, rise, need, floor
        if not isfinite(value):
            return QUIET
        if self.log_space and value <= 0:
            if self.log_only:
                return QUIET
            self.log_space = False  # the values go negative: linear space from here
            self.n = self.nb = self.cur_n = self.over = 0
            self.cur_sum, self.absdiff = 0.0, NAN
        x = log(value) if self.log_space else value
        self.n += 1
        if self.n == 1:
            self.ema = self.prev = x
            return QUIET
        d = fabs(x - self.prev)
        self.prev = x
        if self.absdiff != self.absdiff:  # the noise EMA not started: the first difference is it
            self.absdiff = d
        else:
            t = 5.0 * self.absdiff + 1e-12
            self.absdiff = noise_rate * (t if t < d else d) + noise_keep * self.absdiff
        sigma = 0.886 * self.absdiff  # mean |diff| -> Gaussian sigma of one point
        self.recent.push(x)
        self.ema = self.alpha * self.recent.upper_median() + self.beta * self.ema
        if self.n <= self.warmup:
            return QUIET
        if self.nb:
            ref = self.best
        else:
            ref = self.cur_sum / self.cur_n if self.cur_n else INFINITY
        rise = self.ema - ref if isfinite(ref) else 0.0
        need = self.threshold * sigma * self.ema_sd
        floor = self.min_rise if self.log_space else 0.0
        if floor > need:
            need = floor
        if rise <= need:
            self.over = self.flagged = 0
            self._learn(self.ema)
            return QUIET
        self.over += 1
        if self.over < self.patience:
            return QUIET
        if self.over == self.patience:
            self._divergences += 1
        self.flagged += 1
        if self.flagged >= self.adapt_after:  # the reference restarts from here
            self.nb, self.cur_sum, self.cur_n, self.flagged = 0, self.ema, 1, 0
        self.f_ref, self.f_rise, self.f_need, self.f_over = ref, rise, need, self.over
        self.f_noise = sigma * self.ema_sd
        return FLAGGED

    cdef tuple _record(self):
        return (
            self.f_ref, self.f_rise, self.f_need, self.f_noise, self.ema, self.f_over,
            self.log_space,
        )

    def __reduce__(self):
        params = (
            self.span, self.threshold, self.min_rise, self.patience, self.warmup,
            self.recent.cap, self.block, self.ref_blocks, self.adapt_after, self.space,
        )
        return DivergenceCore, params, self.__getstate__()

    def __getstate__(self):
        return (
            self.log_space, self.n, self.ema, self.prev, self.recent.values(), self.absdiff,
            self.block_means, self.cur_sum, self.cur_n, self.over, self.flagged,
            self._divergences,
        )

    def __setstate__(self, state) -> None:
        (self.log_space, self.n, self.ema, self.prev, recent, self.absdiff, blocks,
         self.cur_sum, self.cur_n, self.over, self.flagged, self._divergences) = state
        self.recent.assign(recent)
        if len(blocks) > self.ref_blocks:
            raise ValueError(f"{len(blocks)} block means for ref_blocks={self.ref_blocks}")
        self.nb = 0
        for b in blocks:
            self.blocks[self.nb] = b
            self.nb += 1
        self.best = min(blocks) if blocks else INFINITY
