# cython: language_level=3, embedsignature=True
"""The lifecycle every shared structure of the kit has in common.

A structure maps a :class:`relaxed.shm.Segment` (``_map``), pickles as a handle
that re-attaches by name (``__reduce__`` → its module's ``_attach``), is a
context manager, refuses ``close()`` while one of its bulk calls runs without the
GIL in another thread, and gets fresh per-handle randomness in a forked child
(``_reseed``, called by an after-fork hook for every open structure).
"""
import os
import weakref

from _common cimport rlx_cache_line

#: bytes per cache line as this build pads shared words (``RELAXED_CACHE_LINE`` at
#: build time, default 128: two 64-byte lines, which the adjacent-line prefetcher
#: of x86 cores fetches together)
CACHE_LINE = rlx_cache_line()

_live = weakref.WeakSet()


def _after_fork_in_child():
    for obj in list(_live):
        (<ShmStructure>obj)._active = 0      # threads do not survive a fork
        (<ShmStructure>obj)._reseed()


os.register_at_fork(after_in_child=_after_fork_in_child)


cdef class ShmStructure:
    """Base of the kit's shared structures (not used directly)."""

    def __cinit__(self):
        self._base = NULL
        self._active = 0

    cdef _map(self, seg):
        self._seg = seg
        self._mv = seg.buf.cast("B")
        self._base = <char*>&self._mv[0]
        _live.add(self)

    cdef _reseed(self):
        pass

    cdef _on_close(self):
        pass

    cdef tuple _reduce_args(self):
        raise NotImplementedError

    @property
    def name(self):
        """Shared-memory name to attach to (None when ``shared=False``)."""
        return self._seg.name if self._seg is not None else None

    @property
    def shared(self):
        return self._seg is not None and self._seg.name is not None

    @property
    def closed(self):
        return self._base == NULL

    def close(self):
        """Unmap this handle; the owner also removes the shared segment. Idempotent."""
        if self._base == NULL:
            if self._seg is not None:        # a failed constructor: just unmap
                self._mv = None
                seg, self._seg = self._seg, None
                seg.close()
            return
        if self._active:
            raise RuntimeError(f"close() called while {self._active} call(s) are running in "
                               "other threads (bulk calls, transactions); finish them and "
                               "join those threads first")
        _live.discard(self)
        self._on_close()
        self._base = NULL
        self._mv = None
        seg, self._seg = self._seg, None
        seg.close()

    def __enter__(self):
        self._check_open()
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        self._check_open()
        if self._seg.name is None:
            raise TypeError(f"a {type(self).__name__} with shared=False lives in private memory "
                            "and cannot be sent to another process; create it with shared=True")
        return self._reduce_args()
