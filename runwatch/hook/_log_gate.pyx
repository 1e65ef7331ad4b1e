# cython: language_level=3
"""The compiled half of the hook's hot paths: ``run.log``, and the drain thread's take of the
queue.

``run.log`` runs once per training step, after milliseconds of other work, so every call
starts on cold caches: each interpreted bytecode and each instance-dict lookup is a cache
miss (bench/README-hook-cadence.md). Here the call is one C function, its state fields of
one struct, the dict copied by ``PyDict_Copy`` and the clock read by ``clock_gettime`` as
``time.time()`` reads it. ``Run`` subclasses ``RunGate``; every path but the plain call
(a new context, a backlog, a closed run, bad input) goes back to ``Run``'s Python methods.
With runwatch's process beside this one, a plain call's numbers go to its ring instead of
the queue (``runwatch.hook._ring``).

The thread that drains the queue holds the GIL the training loop waits for;
``take_batch`` makes its per-item loop one C call (``hook/drain.py``).
"""

from cpython.dict cimport PyDict_Copy
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

from runwatch.hook._ring cimport RingWriter


cdef inline double wall_now() noexcept nogil:
    """``time.time()``: the same clock, the same nanoseconds-to-seconds rounding."""
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <double>(ts.tv_sec * 1000000000LL + ts.tv_nsec) / 1e9


cdef class Flow:
    """Counters shared by the training thread (``queued``) and the writer (``drained``)."""

    cdef public long long queued
    cdef public long long drained
    cdef public long long written

    def add_queued(self, long long n):
        """Count ``n`` points the writer took from a followed source (``Run.follow``) as
        queued: one C step, so no ``run.log`` increment on the other thread is lost."""
        self.queued += n

    def add_drained(self, list items):
        """Count the points of ``items`` taken off the queue as drained (:func:`points_in`).
        In C, as the forward thread does it for every item while the training loop may wait
        for the GIL."""
        cdef long long n = points_in(items)
        self.drained += n
        return n


cpdef long long points_in(list items):
    """The points ``items`` count for, as the run counts them queued: a ``run.log`` or
    collector call its dict's length, anything else one."""
    cdef long long n = 0
    for item in items:
        if type(item) is tuple and len(<tuple>item) >= 3 and type((<tuple>item)[2]) is dict:
            n += len(<dict>(<tuple>item)[2])
        else:
            n += 1
    return n


cdef class RunGate:
    """The fields ``run.log`` reads and writes on each call; ``Run`` sets them."""

    cdef public object _next_step
    cdef public bint _accepting
    cdef public object _put
    cdef public object _context_given
    cdef public Flow _flow
    cdef public long long _wake_at
    cdef public RingWriter _ring  # None: everything goes through ``_put``

    def __cinit__(self, *args, **kwargs):
        self._next_step = 0
        self._flow = Flow()

    def log(self, data, step=None, context=None):
        """Record metrics at ``step`` (default: the last step + 1), like ``wandb.log``.

        Returns at once; never raises. Values may be int, float, bool, NumPy scalars or
        one-element tensors; NaN and Inf are stored as they are. ``context`` (e.g.
        ``{"shard": "s17"}``) is merged into the run's step context from this step on, as
        ``Run.context`` does; passing the same dict every step costs one comparison.
        """
        cdef Py_ssize_t n
        try:
            if step is None:
                step = self._next_step
            self._next_step = step + 1
            n = len(data)
            if not self._accepting:
                self._drops.add(self._closed_reason, n)
                return
            if context is not None and (
                type(context) is not dict or context != self._context_given
            ):
                self._log_with_context(data, step, n, context)
                return
            if type(data) is not dict:  # any other Mapping is copied on the slow path
                self._refuse_call(data, step)
                return
            self._queue(step, data, n, True)
        except Exception:
            self._refuse_call(data, step)

    cdef _queue(self, step, dict data, Py_ssize_t n, bint copy):
        """Write ``data``'s numbers to the ring runwatch's process reads, if there is one
        and they are plain numbers; else put ``data`` (copied first unless the caller made
        it) on the writer's queue, if the bound lets its ``n`` points in."""
        cdef Flow flow
        cdef double now = wall_now()
        if self._ring is not None and self._ring.put_points(step, now, data):
            flow = self._flow
            flow.queued += n
            flow.drained += n
            return
        if self._count(n):
            self._put((step, now, PyDict_Copy(data) if copy else data))

    cdef bint _count(self, Py_ssize_t n) except -1:
        """Count ``n`` points as queued; past half the bound the slow path wakes the writer
        or drops them (counted). False when they were dropped: put nothing then."""
        cdef Flow flow = self._flow
        cdef long long queued = flow.queued + n
        if queued - flow.drained > self._wake_at and self._backlogged(queued, n):
            return False
        flow.queued = queued
        return True

    def _admit(self, Py_ssize_t n):
        """``_count`` for ``Run``'s slow paths: count a call's points before putting it,
        and only once its copy is made (a call that fails there must not stay pending)."""
        return self._count(n)


def take_batch(items, Py_ssize_t limit, stop, marker_type):
    """Up to ``limit`` items popped from the left of the deque ``items``, in order, ending
    at the first that is ``stop`` or a ``marker_type`` (then the batch's last item)."""
    cdef list batch = []
    popleft = items.popleft
    cdef Py_ssize_t i
    for i in range(min(limit, len(items))):
        item = popleft()
        batch.append(item)
        if item is stop or type(item) is marker_type:
            break
    return batch

