# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, embedsignature=True
"""MultiCounter: a relaxed scalable counter (compiled core).

Alistarh, Brown, Kopinsky, Li, Nadiradze, "Distributionally Linearizable Data
Structures" (SPAA 2018). m counters, each in its own cache line. ``increment``
reads two random counters and atomically adds one to the smaller (the
two-choice process of balls into bins), so the counters stay within a small
gap of their mean; ``read`` returns m times one random counter, an estimate of
the total that touches one line; ``exact`` sums all counters.

With ``stickiness`` s > 1 a handle keeps the counter it chose for s increments
before it chooses again (the StickRandom policy of the MultiQueue, Williams,
Sanders and Dementiev, ESA 2021): each increment is still one atomic add of 1,
but the choice, two loads of lines that other cores keep writing, is paid once
per s increments, so on a few cores each thread mostly adds to a line it already
holds. The price is a wider gap: run by run it is the two-choice process with
balls of weight s, so the read error scales with s (see
:meth:`MultiCounter.error_bound`). A handle that finds another adding to its
counter (its fetch_add does not return its own last value plus one) ends its run
and chooses again, so two handles do not share one line for a whole run.

Intended races: the two loads that pick the smaller counter are relaxed and may
be stale; so may the sticky handle's notice of a partner (it sees the other's add
only at its own next add). The increment itself is an atomic fetch_add, so no
increment is ever lost (exact() is exact at quiescence). A stale choice only
widens the gap.
"""
from libc.stdint cimport uint64_t, int64_t, uint32_t, int32_t, uint8_t
from libc.math cimport log2, ceil
from _common cimport *
from relaxed._base cimport ShmStructure

import os
import numpy as np

from relaxed import shm as _shm
from relaxed._multiqueue import _check_int, _make_seed

cdef enum:
    KIND_MC = 2

ctypedef struct Header:
    ShmHead head               # magic ... handle_counter (ext/_common.pxd)
    int64_t n_counters
    int64_t stride
    int64_t counters_offset
    int64_t seed
    int64_t stickiness

cdef int64_t HEADER_BYTES = 256

cdef inline int64_t* C(char *base, int64_t stride, int64_t i) noexcept nogil:
    return <int64_t*>(base + i * stride)

cdef inline void mc_increment(char *base, int64_t stride, int64_t m, uint64_t *rng) noexcept nogil:
    rlx_mc_increment(base, stride, m, rng)


def _attach(name):
    return MultiCounter.attach(name)


cdef class MultiCounter(ShmStructure):
    """MultiCounter(n_counters=64, *, shared=False, seed=None, stickiness=1)

    A relaxed counter: increments scale across threads and processes because
    they spread over ``n_counters`` cache lines; ``read()`` is an unbiased
    estimate whose error stays within :meth:`error_bound` (whose docstring
    gives its rationale); ``exact()`` is exact when no increment is in flight.
    ``stickiness`` s >= 1: a handle (each ``increment_many`` call) keeps the
    counter it chose for s increments (see the module notes); 1 chooses anew
    every increment, the textbook MultiCounter.

    Example
    -------
    >>> from relaxed import MultiCounter
    >>> with MultiCounter(16, seed=0) as c:
    ...     c.increment_many(1000)
    ...     c.exact()
    1000
    """
    cdef Header *hdr
    cdef char *base
    cdef int64_t stride
    cdef readonly int64_t n_counters
    cdef readonly int64_t stickiness
    cdef uint64_t rng
    cdef int64_t cur, left, last    # increment()'s sticky choice: counter, increments due,
                                    # and the value its last add returned (-1: none yet)

    def __cinit__(self):
        self.hdr = NULL

    def __init__(self, n_counters=64, *, shared=False, seed=None, stickiness=1):
        n_counters = _check_int("n_counters", n_counters, 1,
                                "use at least 1 counter (4 per thread is usual)")
        if n_counters > 1 << 24:
            raise ValueError(f"n_counters must be at most {1 << 24}, got {n_counters}")
        stickiness = _check_int("stickiness", stickiness, 1,
                                "use 1 (choose every increment) or more, e.g. 64")
        if stickiness > 1 << 20:
            raise ValueError(f"stickiness must be at most {1 << 20}, got {stickiness}; the "
                             "read error grows with it (see error_bound)")
        if not isinstance(shared, bool):
            raise TypeError(f"shared must be a bool, got {type(shared).__name__}")
        seed = _make_seed(seed)
        stride = rlx_cache_line()
        total = HEADER_BYTES + n_counters * stride
        seg = _shm.Segment.create(total, shared=shared)
        try:
            _shm.write_header(seg.buf, KIND_MC, total)
            self._map(seg)
            self.hdr.n_counters = n_counters
            self.hdr.stride = stride
            self.hdr.counters_offset = HEADER_BYTES
            self.hdr.seed = <int64_t>seed
            self.hdr.stickiness = stickiness
            self._setup()
        except BaseException:
            self.close() if self._seg is not None else seg.close()
            raise

    @classmethod
    def attach(cls, name):
        """Attach to the shared MultiCounter called ``name``."""
        seg = _shm.Segment.attach(name)
        cdef MultiCounter self = cls.__new__(cls)
        try:
            _shm.check_header(seg.buf, KIND_MC, name)
            self._map(seg)
            if (self.hdr.n_counters < 1 or self.hdr.stride < 8 or self.hdr.stickiness < 1 or
                    self.hdr.counters_offset + self.hdr.n_counters * self.hdr.stride != seg.size):
                raise ValueError(f"segment {name!r} has an inconsistent MultiCounter header")
            self._setup()
        except BaseException:
            self.close() if self._seg is not None else seg.close()
            raise
        return self

    cdef _map(self, seg):
        ShmStructure._map(self, seg)
        self.hdr = <Header*>self._base

    cdef _on_close(self):
        self.hdr = NULL
        self.base = NULL

    cdef tuple _reduce_args(self):
        return (_attach, (self._seg.name,))

    cdef _setup(self):
        self.base = (<char*>self.hdr) + self.hdr.counters_offset
        self.stride = self.hdr.stride
        self.n_counters = self.hdr.n_counters
        self.stickiness = self.hdr.stickiness
        self._reseed()

    cdef _reseed(self):
        if self.hdr == NULL:       # closed (the after-fork hook may still see it)
            return
        self.rng = handle_stream(&self.hdr.head, self.hdr.seed)
        self.left = 0               # a forked child chooses its own counter
        self.last = -1

    def increment(self):
        """Add one to the smaller of two random counters (with stickiness s, to the
        counter this handle chose, for s increments)."""
        self._check_open()
        if self.stickiness == 1:
            mc_increment(self.base, self.stride, self.n_counters, &self.rng)
        else:
            rlx_mc_add_sticky(self.base, self.stride, self.n_counters, &self.rng,
                              self.stickiness, &self.cur, &self.left, &self.last, 1)

    def increment_many(self, k):
        """``k`` increments without the GIL (a private RNG stream and, with
        stickiness, a private sticky choice per call: threads may share a handle)."""
        self._check_open()
        cdef int64_t n = _check_int("k", k, 0, "use a count >= 0")
        cdef int64_t i
        cdef uint64_t rng = rlx_mix64(rlx_rand(&self.rng))
        self._check_open()           # (the argument's __index__ could have closed it)
        cdef char *base = self.base
        cdef int64_t stride = self.stride, m = self.n_counters, stick = self.stickiness
        cdef int64_t cur = 0, left = 0, last = -1
        self._active += 1            # no Python code runs from here to the decrement
        try:
            with nogil:
                if stick == 1:
                    for i in range(n):
                        mc_increment(base, stride, m, &rng)
                else:
                    rlx_mc_add_sticky(base, stride, m, &rng, stick, &cur, &left, &last, n)
        finally:
            self._active -= 1

    def read(self):
        """Relaxed estimate of the total: n_counters × one random counter."""
        self._check_open()
        cdef uint32_t i = rlx_rand_below(&self.rng, <uint32_t>self.n_counters)
        return self.n_counters * rlx_load_relaxed_i64(C(self.base, self.stride, i))

    def error_bound(self):
        """The documented relaxation bound on ``|read() - exact()|``:
        ``m * (2*log2(m) + 8) * s`` for m counters and stickiness s (0 for m = 1).

        Two-choice increments keep every counter within O(log m) of the mean
        (Berenbrink, Czumaj, Steger, Vöcking 2006 sequentially: the max is within
        log2 log m + O(1) above; Alistarh et al. 2018: O(log m) in expectation
        under concurrency). Those results bound the gap only up to constants; the
        formula's constants (2 per log2 m, 8 per counter) are chosen to leave a wide
        safety margin over the deviations that concurrent increments show in the
        tests, so the bound is an engineering bound, not a theorem. With
        stickiness s a handle's run of s increments lands on one counter, chosen as
        the smaller of two: run by run (exactly so when one handle increments) it
        is the two-choice process with balls of weight s, whose gaps are the
        unit-weight gaps times s; hence the factor s.
        """
        cdef int64_t m = self.n_counters
        if m == 1:
            return 0
        return int(m * (2 * log2(<double>m) + 8) * self.stickiness)

    def exact(self):
        """Sum of all counters; exact when no increment is in flight."""
        self._check_open()
        cdef int64_t i, s = 0
        for i in range(self.n_counters):
            s += rlx_load_relaxed_i64(C(self.base, self.stride, i))
        return s

    def counters(self):
        """A copy of the m counters (a numpy int64 array), for diagnostics."""
        self._check_open()
        out = np.empty(self.n_counters, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef int64_t i
        for i in range(self.n_counters):
            o[i] = rlx_load_relaxed_i64(C(self.base, self.stride, i))
        return out

    def _read_errors(self, n_reads):
        """Benchmark helper: the error of ``n_reads`` relaxed reads, taken without
        the GIL while others may be incrementing. Each read r is bracketed by two
        exact sums e1 <= e2 (counters only grow, so the true total at the read lies
        in [e1, e2]); the error is how far r falls outside that interval."""
        cdef int64_t n = _check_int("n_reads", n_reads, 0, "use a count >= 0")
        out = np.empty(n, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef int64_t r, i, e1, e2, v, m
        cdef uint64_t rng
        cdef char *base
        cdef int64_t stride
        self._check_open()
        self._active += 1            # no Python code runs from here to the decrement
        try:
            m = self.n_counters
            rng = rlx_mix64(rlx_rand(&self.rng))
            base = self.base
            stride = self.stride
            with nogil:
                for r in range(n):
                    e1 = 0
                    for i in range(m):
                        e1 += rlx_load_relaxed_i64(C(base, stride, i))
                    v = m * rlx_load_relaxed_i64(C(base, stride, rlx_rand_below(&rng, <uint32_t>m)))
                    e2 = 0
                    for i in range(m):
                        e2 += rlx_load_relaxed_i64(C(base, stride, i))
                    o[r] = v - e1 if v < e1 else (v - e2 if v > e2 else 0)
        finally:
            self._active -= 1
        return out

    def _check(self):
        """Assert the invariants: every counter is >= 0."""
        self._check_open()
        c = self.counters()
        if (c < 0).any():
            raise AssertionError(f"MultiCounter has negative counters: {c.tolist()}")
        return True

    def __repr__(self):
        if self.hdr == NULL:
            return "<MultiCounter closed>"
        return (f"<MultiCounter n_counters={self.n_counters} stickiness={self.stickiness} "
                f"exact={self.exact()} shared={self.shared} name={self.name!r}>")
