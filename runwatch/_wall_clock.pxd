# cython: language_level=3
"""``time.time()`` for the compiled hot paths (``hook/_log_gate.pyx``,
``integrations/_hf_marks.pyx``): the same clock and the same nanoseconds-to-seconds
rounding, read without a Python call. Inline: each module compiles its own copy."""

from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec


cdef inline double wall_now() noexcept nogil:
    """``time.time()``: the same clock, the same nanoseconds-to-seconds rounding."""
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <double>(ts.tv_sec * 1000000000LL + ts.tv_nsec) / 1e9
