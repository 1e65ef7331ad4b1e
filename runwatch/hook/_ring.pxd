from cpython.ref cimport PyObject
from libc.stdint cimport uint32_t, uint64_t


cdef class _Mapped:
    cdef object _view  # keeps the mapping's buffer exported while we hold pointers into it
    cdef unsigned char *_base
    cdef unsigned char *_data
    cdef uint64_t _size

    cdef uint64_t *_at(self, Py_ssize_t offset) noexcept


cdef class RingWriter(_Mapped):
    cdef uint64_t _head
    cdef uint64_t _kept  # the reader's kept position, as last read
    cdef dict _keys  # name: its number
    cdef list _names  # by number: the first str object seen for each name
    # The names of the last calls by position, each one of ``_names``'s objects, and their
    # numbers: a call with the same str objects in the same order skips the dict lookups.
    cdef PyObject *_cached[16]
    cdef uint32_t _cached_ids[16]
    cdef public uint64_t marks
    cdef public uint64_t limit  # unstored bytes past which calls take the queue
    cdef bint _closed
    cdef object _append
    cdef object _on_full

    cdef unsigned char *_claim(self, uint64_t size, uint64_t limit) noexcept
    cdef void _publish(self, uint64_t size) noexcept
    cdef int _define(self, str name) except -1
    cdef bint put_points(self, object step, double time, dict data) except -1
    cdef bint _define_all(self, dict data) except -1
    cpdef uint64_t mark(self)


cdef class RingReader(_Mapped):
    cdef uint64_t _tail
    cdef list _names
