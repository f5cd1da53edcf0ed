# (package-qualified so that the runtime import of the base type is relaxed._base)
# The common lifecycle of every structure that lives in a Segment (see _base.pyx).
from libc.stdint cimport uint8_t, int64_t

cdef class ShmStructure:
    cdef object _seg            # relaxed.shm.Segment
    cdef uint8_t[::1] _mv       # keeps the mapping exported while the structure is open
    cdef char *_base            # start of the mapping (the header); NULL once closed
    cdef int64_t _active        # bulk calls running without the GIL: close() refuses
    cdef object __weakref__

    cdef _map(self, seg)
    cdef _reseed(self)
    cdef _on_close(self)
    cdef tuple _reduce_args(self)

    cdef inline int _check_open(self) except -1:
        if self._base == NULL:
            raise RuntimeError(f"this {type(self).__name__} is closed; create a new one "
                               "or attach again")
        return 0
