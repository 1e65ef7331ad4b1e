# cython: language_level=3
"""The compiled half of ``RunwatchCallback``: its ``on_log``, the one call it makes per
logged step on the training thread.

HF calls it right after ``Trainer.log`` appends the step's entry to ``log_history``, on
caches made cold by the step's work. There, the same few lines as interpreted bytecode
cost about 1.5 µs more than in C (bench/README-integrations-hf.md). No transformers import.
"""

from runwatch._wall_clock cimport wall_now


cdef class LogMarker:
    """``on_log``: appends (HF's newest ``log_history`` entry, ``time.time()``) to
    ``marks``, which the writer's follow source reads (``hf._LogHistoryReader``)."""

    cdef object _append

    def __init__(self, marks):
        self._append = marks.append

    def __call__(self, args, state, control, **kwargs):
        history = state.log_history
        if history:
            self._append((history[-1], wall_now()))
