# cython: language_level=3, boundscheck=False, wraparound=False
"""A ring of records in memory the training process shares with runwatch's process.

``run.log`` writes its numbers here, in C, and no thread of the training process ever
touches them again: runwatch's process reads the ring on its own clock. That takes the
forward thread's pickling, and the GIL it held, off the training loop
(``bench/README-hook-cadence.md``, "Sixth session"). One writer (the GIL orders its callers),
one reader; the layout is in ``docs/architecture.md``.

A call the ring cannot take as plain numbers (a tensor value, a non-str key, a new context,
an event) keeps the old path: the queue and the forward thread's pipe. Its place is kept by a
numbered mark in the ring, which goes with it, so the reader takes it exactly where it was
logged.
"""

from cpython.bool cimport PyBool_Check
from cpython.dict cimport PyDict_GetItem, PyDict_Next
from cpython.exc cimport PyErr_Clear, PyErr_Occurred
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.long cimport (
    PyLong_AsDouble,
    PyLong_AsLong,
    PyLong_AsLongLongAndOverflow,
    PyLong_CheckExact,
)
from cpython.ref cimport PyObject
from cpython.unicode cimport PyUnicode_CheckExact
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

cdef extern from *:
    """
    static inline uint64_t ring_load(const uint64_t *p) {
        return __atomic_load_n(p, __ATOMIC_ACQUIRE);
    }
    static inline void ring_store(uint64_t *p, uint64_t v) {
        __atomic_store_n(p, v, __ATOMIC_RELEASE);
    }
    """
    uint64_t ring_load(const uint64_t *p) noexcept nogil
    void ring_store(uint64_t *p, uint64_t v) noexcept nogil

cdef Py_ssize_t _HEADER = 4096  # the first page: the positions, each on its own cache line
HEADER_BYTES = _HEADER
cdef Py_ssize_t _HEAD = 0      # bytes written, ever (the writer's)
cdef Py_ssize_t _TAIL = 64     # bytes read, ever (the reader's)
cdef Py_ssize_t _KEPT = 128    # bytes whose points are stored, ever (the reader's)

cdef uint32_t POINTS = 1   # u32 size, u32 kind, i64 step, f64 time, n x (u32 key, u32 0, f64)
cdef uint32_t KEY = 2      # u32 size, u32 kind, u32 id, u32 length, the name's UTF-8
cdef uint32_t MARK = 3     # u32 size, u32 kind, u64 number
cdef uint32_t PAD = 4      # u32 size, u32 kind: the rest of the ring up to its end is empty
cdef Py_ssize_t MAX_KEYS = 1 << 20
cdef Py_ssize_t MAX_VALUES = 4096
cdef enum:
    KEY_CACHE = 16  # the first names of the last calls, by identity: most loops log the same


cdef inline uint64_t _aligned(uint64_t n) noexcept nogil:
    return (n + 7) & ~(<uint64_t>7)


cdef class _Mapped:
    """The shared bytes: the header's positions and the data area after it."""

    def __init__(self, mapping):
        cdef unsigned char[::1] view = mapping
        if view.shape[0] <= _HEADER + 64:
            raise ValueError(f"a ring of {view.shape[0]} bytes is too small")
        self._view = view
        self._base = &view[0]
        self._data = self._base + _HEADER
        self._size = (<uint64_t>(view.shape[0] - _HEADER)) & ~(<uint64_t>7)

    cdef uint64_t *_at(self, Py_ssize_t offset) noexcept:
        return <uint64_t *>(self._base + offset)

    @property
    def head(self):
        """Bytes written so far."""
        return ring_load(self._at(_HEAD))

    @property
    def tail(self):
        """Bytes read so far."""
        return ring_load(self._at(_TAIL))

    @property
    def kept(self):
        """Bytes whose points and marked items are all stored."""
        return ring_load(self._at(_KEPT))


cdef class RingWriter(_Mapped):
    """The training process's end: ``run.log``'s numbers, and the marks of queued items.

    ``append`` puts an item on the forward thread's queue; ``on_full(item)`` counts one the
    ring had no room to mark (the reader has stopped reading: dropped, as a full queue does).
    """

    def __init__(self, mapping, append, on_full):
        _Mapped.__init__(self, mapping)
        self._head = ring_load(self._at(_HEAD))
        self._kept = ring_load(self._at(_KEPT))
        self.limit = self._size // 2
        self._closed = False
        self._keys = {}
        self._names = []
        self.marks = 0
        self._append = append
        self._on_full = on_full

    def key_names(self):
        """The names by key number, for a reader that starts mid-ring."""
        return list(self._names)

    cdef unsigned char *_claim(self, uint64_t size, uint64_t limit) noexcept:
        """Room for a record of ``size`` bytes at the head, or NULL when more than ``limit``
        bytes would then be unread. A record never wraps: the end is padded first."""
        cdef uint64_t offset = self._head % self._size
        cdef uint64_t skip = 0
        if self._closed:
            return NULL
        if offset + size > self._size:
            skip = self._size - offset
        if self._head + skip + size - self._kept > limit:
            # the reader's cache line, read only when the last value read says it is full
            self._kept = ring_load(self._at(_KEPT))
            if self._head + skip + size - self._kept > limit:
                return NULL
        if skip:
            (<uint32_t *>(self._data + offset))[0] = <uint32_t>skip
            (<uint32_t *>(self._data + offset))[1] = PAD
            self._head += skip
            offset = 0
        return self._data + offset

    cdef void _publish(self, uint64_t size) noexcept:
        self._head += size
        ring_store(self._at(_HEAD), self._head)

    cdef int _define(self, str name) except -1:
        """Give ``name`` the next key number and write it to the ring. -1 no room."""
        cdef bytes encoded = name.encode("utf-8", "surrogatepass")
        cdef uint64_t size = _aligned(16 + len(encoded))
        cdef unsigned char *record
        if len(self._keys) >= MAX_KEYS:
            return -1
        record = self._claim(size, self.limit)
        if record == NULL:
            return -1
        number = len(self._keys)
        (<uint32_t *>record)[0] = <uint32_t>size
        (<uint32_t *>record)[1] = KEY
        (<uint32_t *>record)[2] = <uint32_t>number
        (<uint32_t *>record)[3] = <uint32_t>len(encoded)
        memcpy(record + 16, <char *>encoded, len(encoded))
        self._publish(size)
        self._keys[name] = number
        self._names.append(name)
        return number

    cdef bint put_points(self, object step, double time, dict data) except -1:
        """Write one ``run.log`` call; False (nothing written) unless every key is a str,
        every value an int, float or bool, the step an int, and the ring has room. One
        pass over the dict; a call with a name not seen before defines it and goes again."""
        cdef Py_ssize_t n = len(data)
        cdef Py_ssize_t pos = 0
        cdef PyObject *key
        cdef PyObject *value
        cdef PyObject *number
        cdef uint64_t size = 24 + 16 * <uint64_t>n
        cdef unsigned char *record
        cdef unsigned char *slot
        cdef double x
        cdef int64_t at
        cdef int overflow = 0
        cdef Py_ssize_t i = 0
        cdef uint32_t id
        if not PyLong_CheckExact(step) or n > MAX_VALUES:
            return False
        at = PyLong_AsLongLongAndOverflow(step, &overflow)
        if overflow:
            return False
        record = self._claim(size, self.limit)
        if record == NULL:
            return False
        slot = record + 24
        while PyDict_Next(data, &pos, &key, &value):
            if not PyUnicode_CheckExact(<object>key):
                return False
            if i < KEY_CACHE and self._cached[i] == key:
                id = self._cached_ids[i]
            else:
                number = PyDict_GetItem(self._keys, <object>key)
                if number == NULL:
                    return self._define_all(data) and self.put_points(step, time, data)
                id = <uint32_t>PyLong_AsLong(<object>number)
                if i < KEY_CACHE and <PyObject *>self._names[id] == key:  # alive while we are
                    self._cached[i] = key
                    self._cached_ids[i] = id
            if PyFloat_CheckExact(<object>value):
                x = PyFloat_AS_DOUBLE(<object>value)
            elif PyLong_CheckExact(<object>value) or PyBool_Check(<object>value):
                x = PyLong_AsDouble(<object>value)
                if x == -1.0 and PyErr_Occurred():
                    PyErr_Clear()  # too large for a float: the writer refuses it, by kind
                    return False
            else:
                return False
            (<uint32_t *>slot)[0] = id
            (<uint32_t *>slot)[1] = 0
            memcpy(slot + 8, &x, 8)
            slot += 16
            i += 1
        (<uint32_t *>record)[0] = <uint32_t>size
        (<uint32_t *>record)[1] = POINTS
        memcpy(record + 8, &at, 8)
        memcpy(record + 16, &time, 8)
        self._publish(size)
        return True

    cdef bint _define_all(self, dict data) except -1:
        """Define each of ``data``'s names not seen before; False if one is not a str or
        the ring has no room. Each is published at once: the call may still fail later."""
        for key in data:
            if type(key) is not str:
                return False
            if PyDict_GetItem(self._keys, key) == NULL and self._define(<str>key) < 0:
                return False
        return True

    cpdef uint64_t mark(self):
        """Write the next mark; its number, or 0 when the ring has no room for it. Once
        closed, a number never read: the item goes on to be counted where it is sent."""
        if self._closed:
            return 0xFFFFFFFFFFFFFFFF
        cdef unsigned char *record = self._claim(16, self._size)
        if record == NULL:
            return 0
        self.marks += 1
        (<uint32_t *>record)[0] = 16
        (<uint32_t *>record)[1] = MARK
        (<uint64_t *>(record + 8))[0] = self.marks
        self._publish(16)
        return self.marks

    def close(self, after_step=None):
        """No one reads the ring any more: from now on calls take the queue. Returns the
        points written since the last stored position (``kept``) at steps after
        ``after_step`` (None: all), which are lost."""
        cdef uint64_t at = ring_load(self._at(_KEPT))
        cdef long long points = 0
        cdef int64_t step
        cdef unsigned char *record
        self._closed = True
        while at < self._head:
            record = self._data + at % self._size
            if (<uint32_t *>record)[1] == POINTS:  # a padding record may end the mapping
                memcpy(&step, record + 8, 8)
                if after_step is None or step > after_step:
                    points += ((<uint32_t *>record)[0] - 24) // 16
            at += (<uint32_t *>record)[0]
        return points

    def put_item(self, item):
        """Write a followed source's ``(step, time, {name: value})`` item (``Run.follow``)
        as a ``run.log`` call is written, so it outlives runwatch's process as those do.
        False, nothing written, when it is not that or the ring has no room."""
        if type(item) is not tuple or len(item) != 3:
            return False
        step, time, data = item
        if not PyFloat_CheckExact(time) or type(data) is not dict:
            return False
        return self.put_points(step, PyFloat_AS_DOUBLE(time), data)

    def put_marked(self, item):
        """Queue ``(mark, item)`` for the forward thread, the item's place marked in the
        ring."""
        cdef uint64_t mark = self.mark()
        if mark == 0:
            self._on_full(item)
        else:
            self._append((mark, item))


cdef class RingReader(_Mapped):
    """runwatch's end: reads records from ``start`` (bytes), with the key ``names`` a
    reader that starts mid-ring is given."""

    def __init__(self, mapping, start=None, names=None):
        _Mapped.__init__(self, mapping)
        self._tail = ring_load(self._at(_TAIL)) if start is None else start
        self._names = list(names or [])

    @property
    def position(self):
        """Bytes this reader has read."""
        return self._tail

    def read(self, uint64_t last_mark, uint64_t stop=0xFFFFFFFFFFFFFFFF, Py_ssize_t limit=65536):
        """Up to ``limit`` records from the last read, in order, up to byte ``stop`` at
        most. A point record is a ``run.log`` item ``(step, time, {name: value})``; a mark
        is its number, an int. Stops before a mark numbered above ``last_mark`` (its item
        has not come)."""
        cdef uint64_t head = min(ring_load(self._at(_HEAD)), stop)
        cdef list items = []
        cdef unsigned char *record
        cdef uint32_t size, kind, n, i
        cdef int64_t step
        cdef double time, x
        cdef uint64_t mark
        cdef dict values
        cdef list names = self._names
        while self._tail < head and len(items) < limit:
            record = self._data + self._tail % self._size
            size = (<uint32_t *>record)[0]
            kind = (<uint32_t *>record)[1]
            if kind == POINTS:
                memcpy(&step, record + 8, 8)
                memcpy(&time, record + 16, 8)
                n = (size - 24) // 16
                values = {}
                for i in range(n):
                    memcpy(&x, record + 32 + 16 * i, 8)
                    values[names[(<uint32_t *>(record + 24 + 16 * i))[0]]] = x
                items.append((step, time, values))
            elif kind == KEY:
                i = (<uint32_t *>record)[2]
                n = (<uint32_t *>record)[3]
                name = (<char *>record + 16)[:n].decode("utf-8", "surrogatepass")
                while len(names) <= i:
                    names.append(None)
                names[i] = name
            elif kind == MARK:
                mark = (<uint64_t *>(record + 8))[0]
                if mark > last_mark:
                    break
                items.append(mark)
            self._tail += size
        ring_store(self._at(_TAIL), self._tail)
        return items

    def keep(self, uint64_t position):
        """Everything before ``position`` is stored, with the items its marks stand for:
        the writer may write over it, and a reader started again begins there."""
        ring_store(self._at(_KEPT), position)
