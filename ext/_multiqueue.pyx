# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, embedsignature=True
"""MultiQueue: a relaxed concurrent priority queue (compiled core).

Algorithm: Rihani, Sanders, Dementiev, "MultiQueues: Simple Relaxed Concurrent
Priority Queues" (SPAA 2015); engineering after Williams, Sanders, Dementiev,
"Engineering MultiQueues: Fast Relaxed Concurrent Priority Queues" (ESA 2021).

n sequential 4-ary min-heaps. Each heap has a guard in its own cache line:
a test-and-test-and-set try-lock whose word holds the owner's pid, the cached
top key, the size, and a small journal of the operation in flight. Push locks
a random queue whose lock is free; pop reads the cached tops of two distinct
random queues and pops from the smaller; stickiness reuses the same queues for
several operations. A pop that reports "empty" has visited every queue and
found each one empty (by its size word, or under its lock).

Intended races (why each is safe):
* ``top`` and ``size`` are read without the lock (relaxed loads) to choose a
  queue or skip an empty one. They are only hints: the choice is re-checked under
  the lock, and a stale read costs quality, never correctness. At quiescence
  (after a join, which orders memory) they are exact.
* The lock word is read before the CAS (test-and-test-and-set) to keep the line
  shared while it is held; the CAS has acquire and the unlock release ordering,
  which is all the heap contents need.
* The journal (``op``, ``op_size``, ``hole``, ``pending``) is written by the
  holder only; a release fence after each journal store orders it before the next
  heap write, so a process that takes over the lock of a dead holder can put the
  heap back together (see ``_recover``).

Keys are int64 or float64, mapped order-preservingly to uint64; values int64.
"""
from libc.stdint cimport uint64_t, int64_t, uint32_t, int32_t, uint8_t
from libc.math cimport isnan
cimport cython
from cpython.exc cimport PyErr_CheckSignals

from _common cimport *
from relaxed._base cimport ShmStructure

import os
import numpy as np

from relaxed import shm as _shm

# ---------------------------------------------------------------------------
# layout
# ---------------------------------------------------------------------------
cdef enum:
    KIND_MQ = 1
    OP_NONE = 0
    OP_PUSH = 1
    OP_POP = 2
    OP_SIFT = 3
    KEY_INT64 = 0
    KEY_FLOAT64 = 1
    HEAP_ARITY = 4
    HEAD_OFFSET = 48   # element 1 of every heap starts a 64-byte line

cdef uint64_t EMPTY_TOP = 0xFFFFFFFFFFFFFFFFULL

ctypedef struct Elem:
    uint64_t key
    int64_t value

ctypedef struct Guard:
    int32_t lock       # 0 = free, else the holder's pid
    int32_t op         # journal: OP_NONE / OP_PUSH / OP_POP / OP_SIFT in flight
    uint64_t top       # cached key of the heap top, EMPTY_TOP when empty (a hint)
    int64_t size       # element count; written under the lock, read relaxed
    int64_t op_size    # journal: size when the op in flight began
    int64_t hole       # journal: current hole of the sift in flight
    int64_t _pad
    Elem pending       # journal: the element being placed
    Elem popped        # journal: the element a pop in flight is taking out

ctypedef struct Header:         # at offset 0
    ShmHead head               # magic ... handle_counter (ext/_common.pxd)
    int64_t n_queues
    int64_t cap_per_queue
    int64_t capacity
    int64_t key_kind
    int64_t seed
    int64_t guard_stride
    int64_t heap_stride
    int64_t guards_offset
    int64_t heaps_offset

ctypedef struct Core:
    char *guards
    char *heaps
    int64_t n
    int64_t cap
    int64_t guard_stride
    int64_t heap_stride

ctypedef struct Handle:
    uint64_t rng
    int32_t pid
    uint32_t pop_i
    uint32_t pop_j
    uint32_t push_q
    int64_t stickiness
    int64_t pop_left
    int64_t push_left
    int64_t *log            # optional operation log: rows of (tick, op, key, value)
    int64_t log_len
    int64_t log_cap

cdef int64_t HEADER_BYTES = 256

cdef inline int64_t _round_up(int64_t x, int64_t a) nogil:
    return (x + a - 1) // a * a


# ---------------------------------------------------------------------------
# core: locks, heaps, journal
# ---------------------------------------------------------------------------
cdef inline Guard* G(const Core *c, int64_t q) noexcept nogil:
    return <Guard*>(c.guards + q * c.guard_stride)

cdef inline Elem* H(const Core *c, int64_t q) noexcept nogil:
    return <Elem*>(c.heaps + q * c.heap_stride + HEAD_OFFSET)

cdef inline bint try_lock(Guard *g, int32_t pid) noexcept nogil:
    if rlx_load_relaxed_i32(&g.lock) != 0:
        return False
    return rlx_cas_acquire_i32(&g.lock, 0, pid)

cdef inline void unlock(Guard *g) noexcept nogil:
    rlx_store_release_i32(&g.lock, 0)

cdef inline void CP() noexcept nogil:
    rlx_crash_point()          # a test may kill the process here (see relaxed_atomic.h)

cdef inline void jset(int64_t *p, int64_t v) noexcept nogil:
    # journal store: after every earlier heap write, before every later one
    rlx_release_fence()
    p[0] = v
    rlx_release_fence()
    CP()

cdef inline void jbegin(Guard *g, int32_t op) noexcept nogil:
    # the journal's fields were written before this; the op makes them valid
    rlx_release_fence()
    g.op = op
    rlx_release_fence()
    CP()

cdef void sift_down_journaled(Guard *g, Elem *h, int64_t n, int64_t i) noexcept nogil:
    """Sift h[i] down in a heap of n elements; crash-safe through the journal
    (OP_SIFT: the array minus the hole, plus ``pending``, is the multiset)."""
    cdef int64_t c, m, e
    cdef Elem x = h[i]
    g.pending = x
    CP()
    g.hole = i
    CP()
    jbegin(g, OP_SIFT)
    while True:
        c = HEAP_ARITY * i + 1
        if c >= n:
            break
        m = c
        e = c + HEAP_ARITY
        if e > n:
            e = n
        c += 1
        while c < e:
            if h[c].key < h[m].key:
                m = c
            c += 1
        if h[m].key >= x.key:
            break
        h[i] = h[m]
        CP()
        jset(&g.hole, m)
        i = m
    h[i] = x
    CP()
    jbegin(g, OP_NONE)

cdef void heapify_journaled(Guard *g, Elem *h, int64_t n) noexcept nogil:
    cdef int64_t start
    if n < 2:
        return
    start = (n - 2) // HEAP_ARITY
    while start >= 0:
        sift_down_journaled(g, h, n, start)
        start -= 1

cdef void recover(Core *c, int64_t q) noexcept nogil:
    """Repair queue q after taking over the lock of a dead holder (lock held).

    Idempotent, so that a recoverer that dies half-way leaves a state the next
    one repairs the same way: first the multiset is restored from the journal
    (writes that are safe to repeat), then size is committed and op cleared,
    and only then is the heap order rebuilt by journaled sifts."""
    cdef Guard *g = G(c, q)
    cdef Elem *h = H(c, q)
    cdef int64_t size = g.size
    cdef int32_t op = g.op
    if op == OP_PUSH:
        if size != g.op_size + 1:          # not committed: complete it
            h[g.hole] = g.pending
            CP()
            size = g.op_size + 1
    elif op == OP_POP:
        if size != g.op_size - 1:          # not committed: roll the pop back
            h[g.hole] = g.pending          # where the moved last element belongs ...
            CP()
            h[g.op_size - 1] = g.popped    # ... and the top goes back in at the end
            CP()
            size = g.op_size
    elif op == OP_SIFT:
        h[g.hole] = g.pending
        CP()
    if size < 0:
        size = 0
    if size > c.cap:
        size = c.cap
    rlx_release_fence()
    rlx_store_relaxed_i64(&g.size, size)
    CP()
    jbegin(g, OP_NONE)
    heapify_journaled(g, h, size)
    rlx_store_relaxed_u64(&g.top, h[0].key if size > 0 else EMPTY_TOP)

cdef int lock_spin(Core *c, int64_t q, int32_t pid, int64_t max_yields) noexcept nogil:
    """Blocking acquire with a budget: 1 = acquired, 0 = gave up after max_yields
    yields (the caller checks for signals and retries). A lock whose holder is
    dead (or a zombie) is taken over and its queue repaired."""
    cdef Guard *g = G(c, q)
    cdef int64_t spins = 0, yields = 0
    cdef int32_t owner
    while not try_lock(g, pid):
        spins += 1
        if spins < 2000:
            rlx_cpu_relax()
            continue
        rlx_yield()
        yields += 1
        if yields % 256 == 0:
            owner = rlx_load_relaxed_i32(&g.lock)
            if owner != 0 and owner != pid and not rlx_pid_alive(owner):
                if rlx_cas_acquire_i32(&g.lock, owner, pid):
                    recover(c, q)
                    return 1
        if yields >= max_yields:
            return 0
    return 1

cdef inline void log_op(Handle *hd, int64_t op, Elem e) noexcept nogil:
    cdef int64_t *row
    if hd.log != NULL and hd.log_len < hd.log_cap:
        row = hd.log + 4 * hd.log_len
        row[0] = <int64_t>rlx_ticks()
        row[1] = op
        row[2] = <int64_t>e.key
        row[3] = e.value
        hd.log_len += 1

cdef inline void heap_push(Core *c, Guard *g, Elem *h, Elem e) noexcept nogil:
    cdef int64_t s = g.size
    cdef int64_t i = s, p
    g.pending = e
    CP()
    g.op_size = s
    CP()
    g.hole = s
    CP()
    jbegin(g, OP_PUSH)
    while i > 0:
        p = (i - 1) >> 2
        if h[p].key <= e.key:
            break
        h[i] = h[p]
        CP()
        jset(&g.hole, p)
        i = p
    h[i] = e
    CP()
    rlx_release_fence()
    rlx_store_relaxed_i64(&g.size, s + 1)       # commit point
    CP()
    jbegin(g, OP_NONE)
    rlx_store_relaxed_u64(&g.top, h[0].key)

cdef inline Elem heap_pop(Core *c, Guard *g, Elem *h) noexcept nogil:
    cdef int64_t s = g.size
    cdef Elem out = h[0]
    cdef int64_t n = s - 1, i = 0, ch, m
    cdef uint64_t k0, k1, k2, k3, km
    cdef Elem last
    if n == 0:
        rlx_store_relaxed_i64(&g.size, 0)        # one store: nothing to journal
        CP()
        rlx_store_relaxed_u64(&g.top, EMPTY_TOP)
        return out
    last = h[n]
    g.pending = last
    CP()
    g.popped = out
    CP()
    g.op_size = s
    CP()
    g.hole = 0
    CP()
    jbegin(g, OP_POP)
    while True:
        ch = 4 * i + 1
        if ch + 3 < n:
            # full group of four children in one 64-byte line
            k0 = h[ch].key
            k1 = h[ch + 1].key
            k2 = h[ch + 2].key
            k3 = h[ch + 3].key
            if k1 < k0:
                k0 = k1
                m = ch + 1
            else:
                m = ch
            if k3 < k2:
                k2 = k3
                ch = ch + 3
            else:
                ch = ch + 2
            if k2 < k0:
                k0 = k2
                m = ch
            km = k0
        elif ch < n:
            m = ch
            km = h[ch].key
            ch += 1
            while ch < n:
                if h[ch].key < km:
                    km = h[ch].key
                    m = ch
                ch += 1
        else:
            break
        if km >= last.key:
            break
        h[i] = h[m]
        CP()
        jset(&g.hole, m)
        i = m
    h[i] = last
    CP()
    rlx_release_fence()
    rlx_store_relaxed_i64(&g.size, n)           # commit point
    CP()
    jbegin(g, OP_NONE)
    rlx_store_relaxed_u64(&g.top, h[0].key)
    return out

# ---------------------------------------------------------------------------
# core: the MultiQueue operations
# ---------------------------------------------------------------------------
cdef enum:
    R_EMPTY_OR_FULL = 0
    R_OK = 1
    R_BUSY = 2          # gave up waiting on a held lock: check signals, call again
    WAIT_YIELDS = 4096  # yields before a waiting call returns R_BUSY

cdef int64_t mq_len(const Core *c) noexcept nogil:
    cdef int64_t q, s = 0
    for q in range(c.n):
        s += rlx_load_relaxed_i64(&G(c, q).size)
    return s

cdef int mq_push(Core *c, Handle *hd, Elem e) noexcept nogil:
    """R_OK = pushed, R_EMPTY_OR_FULL = every queue was full, R_BUSY = retry."""
    cdef int64_t n = c.n, q, k, start, attempt
    cdef Guard *g
    for attempt in range(8):
        if hd.push_left <= 0:
            hd.push_q = rlx_rand_below(&hd.rng, <uint32_t>n)
            hd.push_left = hd.stickiness
        q = hd.push_q
        g = G(c, q)
        if try_lock(g, hd.pid):
            if g.size < c.cap:
                heap_push(c, g, H(c, q), e)
                log_op(hd, 1, e)
                unlock(g)
                hd.push_left -= 1
                return R_OK
            unlock(g)
        hd.push_left = 0
    # slow path: visit every queue, waiting for its lock. Seeing each queue full
    # at a different moment does not mean the whole is full (pops and pushes of
    # others move items between queues meanwhile), so "full" needs the total
    # to be at capacity; otherwise the pass is repeated.
    for attempt in range(64):
        start = rlx_rand_below(&hd.rng, <uint32_t>n)
        for k in range(n):
            q = (start + k) % n
            g = G(c, q)
            if rlx_load_relaxed_i64(&g.size) >= c.cap:
                continue
            if not lock_spin(c, q, hd.pid, WAIT_YIELDS):
                return R_BUSY
            if g.size < c.cap:
                heap_push(c, g, H(c, q), e)
                log_op(hd, 1, e)
                unlock(g)
                return R_OK
            unlock(g)
        if mq_len(c) >= n * c.cap:
            return R_EMPTY_OR_FULL
        rlx_yield()
    return R_EMPTY_OR_FULL

cdef int mq_pop(Core *c, Handle *hd, Elem *out) noexcept nogil:
    """R_OK = popped into out, R_EMPTY_OR_FULL = a full scan found every queue
    empty, R_BUSY = retry."""
    cdef int64_t n = c.n, q, k, start, attempt
    cdef uint32_t i, j
    cdef uint64_t ti, tj
    cdef Guard *g
    cdef Guard *gi
    cdef Guard *gj
    if n > 1:
        for attempt in range(8):
            if hd.pop_left <= 0:
                rlx_rand_pair(&hd.rng, <uint32_t>n, &i, &j)
                hd.pop_i = i
                hd.pop_j = j
                hd.pop_left = hd.stickiness
            gi = G(c, hd.pop_i)
            gj = G(c, hd.pop_j)
            ti = rlx_load_relaxed_u64(&gi.top)
            tj = rlx_load_relaxed_u64(&gj.top)
            if tj < ti or (tj == ti and rlx_load_relaxed_i64(&gi.size) == 0):
                q = hd.pop_j
                g = gj
            else:
                q = hd.pop_i
                g = gi
            if rlx_load_relaxed_i64(&g.size) == 0:
                hd.pop_left = 0
                break                      # both looked empty: scan
            if try_lock(g, hd.pid):
                if g.size > 0:
                    out[0] = heap_pop(c, g, H(c, q))
                    log_op(hd, 2, out[0])
                    unlock(g)
                    hd.pop_left -= 1
                    return R_OK
                unlock(g)
            hd.pop_left = 0
    # scan: one pass over every queue; empty only if each was seen empty
    start = rlx_rand_below(&hd.rng, <uint32_t>n)
    for k in range(n):
        q = (start + k) % n
        g = G(c, q)
        if rlx_load_relaxed_i64(&g.size) == 0:
            continue
        if not lock_spin(c, q, hd.pid, WAIT_YIELDS):
            return R_BUSY
        if g.size > 0:
            out[0] = heap_pop(c, g, H(c, q))
            log_op(hd, 2, out[0])
            unlock(g)
            return R_OK
        unlock(g)
    return R_EMPTY_OR_FULL

cdef int check_signals() except -1 with gil:
    # called from nogil loops while waiting: raises e.g. KeyboardInterrupt
    return PyErr_CheckSignals()

# ---------------------------------------------------------------------------
# Python API
# ---------------------------------------------------------------------------
class QueueFull(OverflowError):
    """Every queue of a MultiQueue was full. ``n_pushed`` says how many items of
    a bulk call went in before that (they stay in the queue)."""

    def __init__(self, msg, n_pushed=0):
        super().__init__(msg)
        self.n_pushed = n_pushed


cdef dict _KEY_KINDS = {"int64": KEY_INT64, "float64": KEY_FLOAT64}


def _crash_after(k):
    """Tests only: SIGKILL this process at the k-th crash point from now (k >= 0);
    k = -1 disarms. Crash points follow every store of a heap operation or of a
    recovery."""
    rlx_crash_arm(k)


def _attach(name, stickiness):
    return MultiQueue.attach(name, stickiness=stickiness)


cdef class MultiQueue(ShmStructure):
    """MultiQueue(capacity, n_queues=8, *, shared=False, seed=None, key_dtype="int64", stickiness=1)

    A relaxed concurrent min-priority queue of (key, value) pairs.

    ``pop`` returns one of the smallest keys, not always the smallest: with n
    queues the expected rank error is about 5/6·n − 1 (two choices, Walzer and
    Williams 2025); with ``n_queues=1`` it is an exact priority queue.

    Parameters
    ----------
    capacity : int
        Number of items it must hold (> 0). It is rounded up to a multiple of
        n_queues (each heap holds capacity / n_queues, rounded up); the
        ``capacity`` attribute reports the rounded value, and a push beyond it
        raises QueueFull.
    n_queues : int
        Number of internal heaps (>= 1). More queues mean less contention and
        more relaxation; 2 to 4 per thread is usual.
    shared : bool
        Put the queue in named shared memory so other processes can use it
        (pass the object to them, or ``MultiQueue.attach(mq.name)``).
    seed : int or None
        Seed of this handle's random choices (per handle, never shared).
    key_dtype : "int64" or "float64"
        Key type. float64 keys are ordered numerically; NaN is refused.
    stickiness : int
        Reuse the same random queues for this many operations (>= 1); higher
        is faster under contention and less exact.

    Example
    -------
    >>> from relaxed import MultiQueue
    >>> with MultiQueue(1000, n_queues=4, seed=1) as mq:
    ...     mq.push(5, 50); mq.push(1, 10)
    ...     sorted([mq.pop(), mq.pop()])
    [(1, 10), (5, 50)]
    """
    cdef Core core
    cdef Handle h
    cdef Header *hdr
    cdef int key_kind
    cdef readonly int64_t capacity
    cdef readonly int64_t n_queues

    def __cinit__(self):
        self.hdr = NULL

    def __init__(self, capacity, n_queues=8, *, shared=False, seed=None,
                 key_dtype="int64", stickiness=1):
        capacity = _check_int("capacity", capacity, 1, "use a positive number of items")
        n_queues = _check_int("n_queues", n_queues, 1,
                              "use at least 1 queue (2-4 per thread is usual)")
        if n_queues > 1 << 20:
            raise ValueError(f"n_queues must be at most {1 << 20}, got {n_queues}")
        stickiness = _check_int("stickiness", stickiness, 1, "use 1 for no stickiness")
        if not isinstance(shared, bool):
            raise TypeError(f"shared must be a bool, got {type(shared).__name__}")
        if key_dtype not in _KEY_KINDS:
            kd = getattr(np.dtype(key_dtype), "name", key_dtype) if _is_dtype(key_dtype) else key_dtype
            if kd not in _KEY_KINDS:
                raise ValueError(f"key_dtype must be 'int64' or 'float64', got {key_dtype!r}")
            key_dtype = kd
        seed = _make_seed(seed)
        cap_per = (capacity + n_queues - 1) // n_queues
        guard_stride = _round_up(max(rlx_cache_line(), sizeof(Guard)), 64)
        heap_stride = _round_up(HEAD_OFFSET + 16 * cap_per, 64)
        guards_offset = HEADER_BYTES
        heaps_offset = _round_up(guards_offset + n_queues * guard_stride, 4096)
        total = heaps_offset + n_queues * heap_stride
        seg = _shm.Segment.create(total, shared=shared)
        try:
            _shm.write_header(seg.buf, KIND_MQ, total)
            self._map(seg)
            self.hdr.n_queues = n_queues
            self.hdr.cap_per_queue = cap_per
            self.hdr.capacity = capacity
            self.hdr.key_kind = _KEY_KINDS[key_dtype]
            self.hdr.seed = <int64_t>seed
            self.hdr.guard_stride = guard_stride
            self.hdr.heap_stride = heap_stride
            self.hdr.guards_offset = guards_offset
            self.hdr.heaps_offset = heaps_offset
            self._setup(stickiness)
            for q in range(n_queues):
                G(&self.core, q).top = EMPTY_TOP
        except BaseException:
            self.close() if self._seg is not None else seg.close()
            raise

    @classmethod
    def attach(cls, name, *, stickiness=1):
        """Attach to the shared MultiQueue called ``name`` (see :attr:`name`)."""
        stickiness = _check_int("stickiness", stickiness, 1, "use 1 for no stickiness")
        seg = _shm.Segment.attach(name)
        cdef MultiQueue self = cls.__new__(cls)
        try:
            _shm.check_header(seg.buf, KIND_MQ, name)
            self._map(seg)
            hd = self.hdr
            expect = hd.heaps_offset + hd.n_queues * hd.heap_stride
            if (hd.n_queues < 1 or hd.cap_per_queue < 1 or expect != seg.size
                    or hd.key_kind not in (0, 1) or hd.guard_stride < sizeof(Guard)
                    or hd.guards_offset < HEADER_BYTES
                    or hd.heaps_offset < hd.guards_offset + hd.n_queues * hd.guard_stride
                    or hd.heap_stride < HEAD_OFFSET + 16 * hd.cap_per_queue
                    or hd.heaps_offset % 64 or hd.heap_stride % 64):
                raise ValueError(f"segment {name!r} has an inconsistent MultiQueue header")
            self._setup(stickiness)
        except BaseException:
            self.close() if self._seg is not None else seg.close()
            raise
        return self

    cdef _map(self, seg):
        ShmStructure._map(self, seg)
        self.hdr = <Header*>self._base

    cdef _on_close(self):
        self.hdr = NULL
        self.core.guards = NULL
        self.core.heaps = NULL

    cdef tuple _reduce_args(self):
        return (_attach, (self._seg.name, self.h.stickiness))

    cdef _setup(self, int64_t stickiness):
        cdef char *base = <char*>self.hdr
        self.core.guards = base + self.hdr.guards_offset
        self.core.heaps = base + self.hdr.heaps_offset
        self.core.n = self.hdr.n_queues
        self.core.cap = self.hdr.cap_per_queue
        self.core.guard_stride = self.hdr.guard_stride
        self.core.heap_stride = self.hdr.heap_stride
        self.capacity = self.hdr.n_queues * self.hdr.cap_per_queue
        self.n_queues = self.hdr.n_queues
        self.key_kind = <int>self.hdr.key_kind
        self.h.stickiness = stickiness
        self.h.log = NULL
        self._reseed()

    cdef _reseed(self):
        if self.hdr == NULL:       # closed (the after-fork hook may still see it)
            return
        self.h.rng = handle_stream(&self.hdr.head, self.hdr.seed)
        self.h.pid = rlx_getpid()      # read here (creation, after fork), not on hot paths
        self.h.pop_left = 0
        self.h.push_left = 0

    cdef Handle _fork_handle(self):
        # a private handle for one bulk call: its own RNG stream, no shared state
        cdef Handle local = self.h
        local.rng = rlx_mix64(rlx_rand(&self.h.rng))
        local.pop_left = 0
        local.push_left = 0
        local.log = NULL
        return local

    # -- properties ---------------------------------------------------------
    @property
    def key_dtype(self):
        return "float64" if self.key_kind == KEY_FLOAT64 else "int64"

    @property
    def stickiness(self):
        return self.h.stickiness

    # -- single operations (GIL held: the handle is this object's) ------------
    cdef inline uint64_t _key_in(self, key) except? 0:
        cdef double d
        cdef int64_t k
        if self.key_kind == KEY_INT64:
            if isinstance(key, float):
                raise TypeError(f"key must be an integer for a key_dtype='int64' queue, got "
                                f"float {key!r}; create the queue with key_dtype='float64'")
            try:
                k = key
            except OverflowError:
                raise ValueError(f"key {key!r} is outside int64 range [-2**63, 2**63-1]") from None
            except TypeError:
                raise TypeError(f"key must be an int, got {type(key).__name__}") from None
            return rlx_key_from_i64(k)
        try:
            d = key
        except TypeError:
            raise TypeError(f"key must be a float, got {type(key).__name__}") from None
        if isnan(d):
            raise ValueError("key must not be NaN: NaN has no place in a priority order")
        return rlx_key_from_f64(d)

    cdef inline object _key_out(self, uint64_t u):
        if self.key_kind == KEY_INT64:
            return rlx_key_to_i64(u)
        return rlx_key_to_f64(u)

    cdef inline int _pop1(self, Elem *e) except -1:
        cdef int r = mq_pop(&self.core, &self.h, e)
        while r == R_BUSY:                 # waited long on a held lock: allow Ctrl-C
            PyErr_CheckSignals()
            r = mq_pop(&self.core, &self.h, e)
        return r

    def push(self, key, value):
        """Insert ``(key, value)``; raises QueueFull if every queue is full."""
        cdef Elem e
        cdef int64_t v
        self._check_open()
        e.key = self._key_in(key)
        try:
            v = value
        except (OverflowError, TypeError):
            raise _bad_value(value) from None
        e.value = v
        cdef int r = mq_push(&self.core, &self.h, e)
        while r == R_BUSY:                 # waited long on a held lock: allow Ctrl-C
            PyErr_CheckSignals()
            r = mq_push(&self.core, &self.h, e)
        if r == R_EMPTY_OR_FULL:
            raise QueueFull(f"MultiQueue is full ({self.capacity} items); create it "
                            "with a larger capacity or pop first")

    def try_pop(self):
        """Pop a small (key, value), or return None if a full scan found it empty."""
        cdef Elem e
        self._check_open()
        if self._pop1(&e):
            return (self._key_out(e.key), e.value)
        return None

    def pop(self):
        """Pop a small (key, value); raises IndexError if a full scan found it empty."""
        cdef Elem e
        self._check_open()
        if self._pop1(&e):
            return (self._key_out(e.key), e.value)
        raise IndexError("pop from an empty MultiQueue (a full scan found every queue empty)")

    def __len__(self):
        """Number of items (exact when no operation is in flight)."""
        self._check_open()
        return mq_len(&self.core)

    def __bool__(self):
        return self.hdr != NULL and mq_len(&self.core) > 0

    # -- bulk operations (GIL released for the whole loop) -------------------
    def push_many(self, keys, values):
        """Push every ``(keys[i], values[i])``; runs without the GIL.

        keys: 1-D array-like of integers (int64 queue) or floats (float64 queue);
        values: 1-D integer array-like of the same length. Raises QueueFull with
        ``n_pushed`` if the queue fills up part way (those items stay in).
        """
        self._check_open()
        self._active += 1          # from here on close() refuses: the memory stays mapped
        try:
            return self._push_many(keys, values)
        finally:
            self._active -= 1

    cdef _push_many(self, keys, values):
        k_arr, v_arr = self._bulk_args(keys, values)
        cdef int64_t n = k_arr.shape[0], i = 0
        cdef Handle hd = self._fork_handle()
        cdef Elem e
        cdef int r = R_OK
        cdef int key_kind = self.key_kind
        cdef const int64_t[::1] ki
        cdef const double[::1] kf
        cdef const int64_t[::1] vv = v_arr
        if key_kind == KEY_INT64:
            ki = k_arr
        else:
            kf = k_arr
        with nogil:
            while i < n:
                e.key = rlx_key_from_i64(ki[i]) if key_kind == KEY_INT64 else rlx_key_from_f64(kf[i])
                e.value = vv[i]
                r = mq_push(&self.core, &hd, e)
                if r == R_BUSY:
                    check_signals()
                    continue
                if r == R_EMPTY_OR_FULL:
                    break
                i += 1
        if i < n:
            raise QueueFull(f"MultiQueue is full ({self.capacity} items) after pushing {i} "
                            f"of {n}; those {i} stay in. Create it with a larger capacity.", i)

    def pop_many(self, n):
        """Pop up to ``n`` items without the GIL; returns ``(keys, values)`` arrays.

        Fewer than n come back only when a full scan found the queue empty.
        """
        self._check_open()
        self._active += 1
        try:
            return self._pop_many(n)
        finally:
            self._active -= 1

    cdef _pop_many(self, n):
        cdef int64_t m = _check_int("n", n, 0, "ask for zero or more items")
        keys = np.empty(m, dtype=np.float64 if self.key_kind == KEY_FLOAT64 else np.int64)
        vals = np.empty(m, dtype=np.int64)
        cdef int64_t[::1] vv = vals
        cdef int64_t[::1] ki
        cdef double[::1] kf
        cdef int key_kind = self.key_kind
        if key_kind == KEY_INT64:
            ki = keys
        else:
            kf = keys
        cdef Handle hd = self._fork_handle()
        cdef Elem e
        cdef int r
        cdef int64_t i = 0
        with nogil:
            while i < m:
                r = mq_pop(&self.core, &hd, &e)
                if r == R_BUSY:
                    check_signals()
                    continue
                if r == R_EMPTY_OR_FULL:
                    break
                if key_kind == KEY_INT64:
                    ki[i] = rlx_key_to_i64(e.key)
                else:
                    kf[i] = rlx_key_to_f64(e.key)
                vv[i] = e.value
                i += 1
        if i < m:
            return keys[:i].copy(), vals[:i].copy()
        return keys, vals

    cdef tuple _bulk_args(self, keys, values):
        if self.key_kind == KEY_INT64:
            k = _as_1d("keys", keys, np.int64, "integer")
        else:
            k = _as_1d("keys", keys, np.float64, "float")
            if k.shape[0] and np.isnan(k).any():
                raise ValueError("keys must not contain NaN: NaN has no place in a priority order")
        v = _as_1d("values", values, np.int64, "integer")
        if k.shape[0] != v.shape[0]:
            raise ValueError(f"keys and values must have the same length, got {k.shape[0]} "
                             f"and {v.shape[0]}")
        return k, v

    # -- benchmark kernel -----------------------------------------------------
    def _hold(self, n_iter, max_increment=1 << 20, log=None):
        """Benchmark kernel (hold model): n_iter times pop, then push key + U[0, max_increment)
        (saturating at the largest key) with the same value.

        Runs without the GIL with a private handle. ``log``: optional int64 array
        of shape (>= 2*n_iter, 4) that receives rows (tick, op, mapped key, value),
        op 1 = push, 2 = pop, each stamped while the queue's lock was held.
        A pop that finds the queue empty pushes a fresh key instead.
        Returns (pops that found the queue empty, log rows written); raises
        QueueFull if a push found every queue full. int64 keys only.
        """
        self._check_open()
        self._active += 1
        try:
            return self._hold_impl(n_iter, max_increment, log)
        finally:
            self._active -= 1

    cdef _hold_impl(self, n_iter, max_increment, log):
        if self.key_kind != KEY_INT64:
            raise ValueError("_hold runs on int64-key queues")
        cdef int64_t iters = _check_int("n_iter", n_iter, 0, "use a count >= 0")
        cdef int64_t inc64 = _check_int("max_increment", max_increment, 1, "use >= 1")
        if inc64 > 0xFFFFFFFF:
            raise ValueError(f"max_increment must be < 2**32, got {inc64}")
        cdef uint32_t inc = <uint32_t>inc64
        cdef Handle hd = self._fork_handle()
        cdef int64_t[:, ::1] lg
        if log is not None:
            if not isinstance(log, np.ndarray) or log.dtype != np.int64 or log.ndim != 2 \
                    or log.shape[1] != 4 or not log.flags.c_contiguous:
                raise TypeError("log must be a C-contiguous int64 array of shape (rows, 4)")
            lg = log
            if lg.shape[0] > 0:
                hd.log = &lg[0, 0]
            hd.log_cap = lg.shape[0]
            hd.log_len = 0
        cdef int64_t it = 0, empties = 0, full = 0
        cdef uint64_t d
        cdef Elem e
        cdef int r
        with nogil:
            while it < iters:
                r = mq_pop(&self.core, &hd, &e)
                if r == R_BUSY:
                    check_signals()
                    continue
                if r == R_OK:
                    d = rlx_rand_below(&hd.rng, inc)
                    # mapped keys are order-preserving: add there, saturating
                    e.key = e.key + d if e.key <= 0xFFFFFFFFFFFFFFFEULL - d else 0xFFFFFFFFFFFFFFFEULL
                else:
                    empties += 1
                    e.key = rlx_key_from_i64(<int64_t>rlx_rand_below(&hd.rng, inc))
                    e.value = it
                r = mq_push(&self.core, &hd, e)
                while r == R_BUSY:
                    check_signals()
                    r = mq_push(&self.core, &hd, e)
                if r == R_EMPTY_OR_FULL:
                    full += 1
                    break
                it += 1
        if full:
            raise QueueFull(f"_hold: a push found every queue full after {it} iterations "
                            "(pops that found it empty push fresh keys); use a larger capacity")
        return empties, hd.log_len

    # -- invariants, recovery, teardown ---------------------------------------
    def _check(self):
        """Assert every invariant (quiescent use only): each heap is a valid heap,
        each cached top equals its heap's top, sizes are within capacity, no lock is
        held and no operation is in flight. Raises AssertionError with a dump."""
        self._check_open()
        cdef int64_t q, i, s
        cdef Guard *g
        cdef Elem *h
        for q in range(self.core.n):
            g = G(&self.core, q)
            h = H(&self.core, q)
            s = g.size
            problems = []
            if s < 0 or s > self.core.cap:
                problems.append(f"size {s} outside [0, {self.core.cap}]")
            else:
                for i in range(1, s):
                    if h[(i - 1) >> 2].key > h[i].key:
                        problems.append(f"heap order broken at index {i}")
                        break
                want = h[0].key if s > 0 else EMPTY_TOP
                if g.top != want:
                    problems.append(f"cached top {g.top} != heap top {want}")
            if g.lock != 0:
                problems.append(f"lock held by pid {g.lock}")
            if g.op != OP_NONE:
                problems.append(f"operation {g.op} in flight")
            if problems:
                raise AssertionError(f"MultiQueue queue {q}: " + "; ".join(problems)
                                     + f"\nstate: {self._dump(q)}")
        return True

    def _dump(self, q):
        """The state of queue q (lock, journal, size, first items), for diagnostics."""
        self._check_open()
        q = _check_int("q", q, 0, "use a queue index")
        if q >= self.core.n:
            raise ValueError(f"q must be < n_queues = {self.core.n}, got {q}")
        cdef Guard *g = G(&self.core, q)
        cdef Elem *h = H(&self.core, q)
        cdef int64_t s = min(max(g.size, 0), self.core.cap)
        return {"queue": q, "lock": g.lock, "op": g.op, "size": g.size, "top": g.top,
                "hole": g.hole, "op_size": g.op_size,
                "head": [(h[i].key, h[i].value) for i in range(min(s, 16))]}

    def recover_dead_locks(self):
        """Take over and repair every queue whose lock holder process is dead.
        Returns how many were recovered. Pops and pushes also do this by
        themselves when they have to wait on such a lock."""
        self._check_open()
        cdef int64_t q, n = 0
        cdef int32_t owner
        cdef Guard *g
        for q in range(self.core.n):
            g = G(&self.core, q)
            owner = rlx_load_relaxed_i32(&g.lock)
            if owner != 0 and owner != self.h.pid and not rlx_pid_alive(owner):
                if rlx_cas_acquire_i32(&g.lock, owner, self.h.pid):
                    recover(&self.core, q)
                    unlock(g)
                    n += 1
        return n

    def _debug_partial(self, q, op, steps, key=0, value=0):
        """Test hook: run a push (op=1) or pop (op=2) on queue q for at most ``steps``
        sift steps and return leaving the lock held, as a holder killed mid-operation
        would. Used by the crash-recovery tests only."""
        self._check_open()
        cdef int64_t qq = _check_int("q", q, 0, "use a queue index")
        if qq >= self.core.n:
            raise ValueError("q out of range")
        cdef Guard *g = G(&self.core, qq)
        cdef Elem *h = H(&self.core, qq)
        cdef int64_t lim = steps, s, i, p, m, c, e2
        cdef Elem x
        lock_spin(&self.core, qq, self.h.pid, 1 << 62)
        s = g.size
        if op == 1:
            x.key = self._key_in(key)
            x.value = value
            g.pending = x; g.op_size = s; g.hole = s; jbegin(g, OP_PUSH)
            i = s
            while i > 0 and lim > 0:
                p = (i - 1) >> 2
                if h[p].key <= x.key:
                    break
                h[i] = h[p]; g.hole = p; i = p; lim -= 1
        elif op == 2 and s > 1:
            x = h[s - 1]
            g.pending = x; g.popped = h[0]; g.op_size = s; g.hole = 0; jbegin(g, OP_POP)
            i = 0
            while lim > 0:
                c = 4 * i + 1
                if c >= s - 1:
                    break
                m = c
                e2 = min(c + 4, s - 1)
                while c < e2:
                    if h[c].key < h[m].key:
                        m = c
                    c += 1
                if h[m].key >= x.key:
                    break
                h[i] = h[m]; g.hole = m; i = m; lim -= 1
        else:
            raise ValueError("op must be 1 (push) or 2 (pop on a queue with >= 2 items)")

    def __repr__(self):
        if self.hdr == NULL:
            return "<MultiQueue closed>"
        return (f"<MultiQueue n_queues={self.n_queues} capacity={self.capacity} "
                f"len={mq_len(&self.core)} key_dtype={self.key_dtype!r} "
                f"shared={self.shared} name={self.name!r}>")

# ---------------------------------------------------------------------------
# validation helpers (the other compiled modules import them from relaxed._multiqueue)
# ---------------------------------------------------------------------------
def _check_int(name, value, lo, fix):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}; {fix}")
    return value

def _is_dtype(x):
    try:
        np.dtype(x)
        return True
    except TypeError:
        return False

def _make_seed(seed):
    if seed is None:
        return int.from_bytes(os.urandom(8), "little", signed=True)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    return s - (1 << 64) if s >= 1 << 63 else s

def _bad_value(value):
    if isinstance(value, (int, np.integer)):
        return ValueError(f"value {value!r} is outside int64 range [-2**63, 2**63-1]")
    return TypeError(f"value must be an int (values are int64), got {type(value).__name__}")

def _as_1d(name, x, dtype, kind):
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}; pass a flat array")
    if kind == "integer":
        if a.dtype.kind not in "iu" and not (a.size == 0 and a.dtype.kind == "f"):
            raise TypeError(f"{name} must hold integers, got dtype {a.dtype}; "
                            f"convert with np.asarray({name}, dtype=np.int64)")
        if a.dtype.kind == "u" and a.size and a.max() > np.iinfo(np.int64).max:
            raise ValueError(f"{name} holds values above the int64 maximum")
    else:
        if a.dtype.kind not in "iuf":
            raise TypeError(f"{name} must hold numbers, got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=dtype)
