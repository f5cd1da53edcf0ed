# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, embedsignature=True
"""MultiQueue: a relaxed concurrent priority queue (compiled core).

Algorithm: Rihani, Sanders, Dementiev, "MultiQueues: Simple Relaxed Concurrent
Priority Queues" (SPAA 2015); engineering after Williams, Sanders, Dementiev,
"Engineering MultiQueues: Fast Relaxed Concurrent Priority Queues" (ESA 2021).

n sequential queues, each an 8-ary min-heap with a 16-item insertion buffer and
a 16-item deletion buffer (as in the ESA 2021 MultiQueue). The deletion buffer
holds the queue's smallest items in ascending order: a pop takes its first item
and reaches into the heap only when it runs empty (a refill: flush the insertion
buffer, move the 16 smallest heap items over); a push goes to the insertion
buffer (flushed into the heap when full) unless its key is below the deletion
buffer's largest, then into the deletion buffer. So most operations touch the
guard's line and one buffer line instead of a path through the heap, and fewer
lines move between cores. Each queue has a guard in its own cache line: a
test-and-test-and-set try-lock whose word holds the owner's pid, the cached top
key (the deletion buffer's first) and one counts word that packs the heap size,
the insertion count and the deletion buffer's window. A small journal of the
step in flight follows in a line pair of its own, which only the lock's holder
touches: a refill's 16 sift-downs write it, not the line other threads read.
Push locks a random queue whose lock is free; pop reads the cached tops of two
distinct random queues and pops from the smaller. With
stickiness s (the StickRandom policy of the ESA 2021 MultiQueue) a handle keeps
one random pair for s operations, popping the smaller top of the two and pushing
to either, then draws a new pair. A pop that reports "empty" has
visited every queue and found each one empty (by its counts word, or under its
lock).

Intended races (why each is safe):
* ``top`` and ``cnt`` are read without the lock (relaxed loads) to choose a
  queue or skip an empty one. They are only hints: the choice is re-checked under
  the lock, and a stale read costs quality, never correctness. At quiescence
  (after a join, which orders memory) they are exact.
* The lock word is read before the CAS (test-and-test-and-set) to keep the line
  shared while it is held; the CAS has acquire and the unlock release ordering,
  which is all the heap and buffer contents need. There is no prefetch of a
  queue's buffer before its lock is won: without write intent it fetches the
  line shared and the store that follows pays a second transfer, and a lost
  race would take the line from the holder.
* The journal (``op``, ``op_cnt``, ``hole``, ``pending``) is written by the
  holder only; a release fence after each journal store orders it before the next
  element store, so a process that takes over the lock of a dead holder can finish
  the step (see ``recover``). Every change of membership is one store of ``cnt``.

Keys are int64 or float64, mapped order-preservingly to uint64; values int64.
"""
from libc.stdint cimport uint64_t, int64_t, uint32_t, int32_t, uint8_t
from libc.math cimport isnan
cimport cython
from cpython.exc cimport PyErr_CheckSignals
from cpython.number cimport PyIndex_Check

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
    OP_DINS = 1        # journal: an insertion into the deletion buffer is in flight
    OP_SIFT_UP = 2     # journal: a heap sift-up (an insertion buffer flush) is in flight
    OP_SIFT_DOWN = 3   # journal: a heap sift-down (a deletion buffer refill) is in flight
    OP_DINS_DOWN = 4   # journal: as OP_DINS, growing the deletion window downwards
    OP_REFILL = 5      # journal: no step in flight, but the counts are rcnt, not cnt (a
                       # buffer flush or refill publishes its steps there; see settle)
    KEY_INT64 = 0
    KEY_FLOAT64 = 1
    HEAP_ARITY = 8
    HEAD_OFFSET = 48   # element 1 of every heap starts a 64-byte line
    BUF = 16           # elements in each insertion and each deletion buffer
    BUF_BYTES = 2 * BUF * 16
    HOT_CHILDREN = 4096  # sift-down: children below this slot (64 KiB) are chosen without
    SMALL_HEAP = 16384   # branches, as are all of a heap this small (256 KiB); see min_child8

cdef uint64_t EMPTY_TOP = 0xFFFFFFFFFFFFFFFFULL

ctypedef struct Elem:
    uint64_t key
    int64_t value

ctypedef struct Guard:
    # the guard's line: what other threads read without the lock
    int32_t lock       # 0 = free, else the holder's pid
    int32_t _pad0
    uint64_t top       # cached smallest key, EMPTY_TOP when empty (a hint)
    uint64_t cnt       # packed counts (heap size, insertion count, deletion window):
                       # the one word whose store commits a change of membership
    char _gap[104]     # the journal starts at byte 128, a line pair of its own: only
                       # the holder writes it, so its stores move no line another core reads
    int32_t op         # journal: OP_NONE or the multi-store step in flight
    int32_t _pad1
    int64_t hole       # journal: the free slot of the step in flight
    uint64_t op_cnt    # journal: the counts the step in flight commits
    uint64_t rcnt      # journal: the counts while op is OP_REFILL
    Elem pending       # journal: the element being placed

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
    uint32_t pair_i         # the handle's current pair of queues: pops take the
    uint32_t pair_j         # smaller top of the two, pushes go to one of them
    int64_t stickiness
    int64_t left            # operations left on the pair before a new one is drawn
    int64_t *log            # optional operation log: rows of (tick, op, key, value)
    int64_t log_len
    int64_t log_cap

cdef int64_t HEADER_BYTES = 256

cdef inline int64_t _round_up(int64_t x, int64_t a) nogil:
    return (x + a - 1) // a * a

# counts word: heap size (bits 0-39), insertion buffer count (40-47), deletion window
# [ds, de) (48-55, 56-63); the deletion buffer holds its items ascending in D[ds:de]
cdef inline int64_t C_HS(uint64_t c) noexcept nogil:
    return <int64_t>(c & 0xFFFFFFFFFFULL)

cdef inline int64_t C_NI(uint64_t c) noexcept nogil:
    return <int64_t>((c >> 40) & 0xFF)

cdef inline int64_t C_DS(uint64_t c) noexcept nogil:
    return <int64_t>((c >> 48) & 0xFF)

cdef inline int64_t C_DE(uint64_t c) noexcept nogil:
    return <int64_t>(c >> 56)

cdef inline uint64_t MK(int64_t hs, int64_t ni, int64_t ds, int64_t de) noexcept nogil:
    return (<uint64_t>hs) | (<uint64_t>ni << 40) | (<uint64_t>ds << 48) | (<uint64_t>de << 56)

cdef inline int64_t C_TOTAL(uint64_t c) noexcept nogil:
    return C_HS(c) + C_NI(c) + C_DE(c) - C_DS(c)


# ---------------------------------------------------------------------------
# core: locks, buffers, heaps, journal
# ---------------------------------------------------------------------------
cdef inline Guard* G(const Core *c, int64_t q) noexcept nogil:
    return <Guard*>(c.guards + q * c.guard_stride)

cdef inline Elem* D(const Core *c, int64_t q) noexcept nogil:
    # deletion buffer, then insertion buffer, at the end of the guard's region
    return <Elem*>(c.guards + (q + 1) * c.guard_stride - BUF_BYTES)

cdef inline Elem* I(const Core *c, int64_t q) noexcept nogil:
    return D(c, q) + BUF

cdef inline Elem* H(const Core *c, int64_t q) noexcept nogil:
    return <Elem*>(c.heaps + q * c.heap_stride + HEAD_OFFSET)

cdef inline int64_t qsize(Guard *g) noexcept nogil:
    # relaxed read: a hint while others run, exact at quiescence
    return C_TOTAL(rlx_load_relaxed_u64(&g.cnt))

cdef inline bint try_lock(Guard *g, int32_t pid) noexcept nogil:
    if rlx_load_relaxed_i32(&g.lock) != 0:
        return False
    return rlx_cas_acquire_i32(&g.lock, 0, pid)

cdef inline void unlock(Guard *g) noexcept nogil:
    rlx_store_release_i32(&g.lock, 0)

cdef inline void CP() noexcept nogil:
    rlx_crash_point()          # a test may kill the process here (see relaxed_atomic.h)

cdef inline void jset(int64_t *p, int64_t v) noexcept nogil:
    # journal store: after every earlier write, before every later one
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

cdef inline void commit(Guard *g, uint64_t cnt) noexcept nogil:
    # every element store before it is in place; one store changes the membership
    rlx_release_fence()
    rlx_store_relaxed_u64(&g.cnt, cnt)
    CP()

cdef inline void journal(Guard *g, int32_t op, Elem x, int64_t hole, uint64_t op_cnt) noexcept nogil:
    """Open a multi-store step: from here the queue's multiset is the arrays under
    ``op_cnt`` with slot ``hole`` (of the heap or the deletion buffer) replaced by x.
    Each step below moves the hole (jset) and keeps that true, so a recoverer
    finishes the step from wherever it stopped (roll forward)."""
    g.pending = x
    CP()
    g.hole = hole
    CP()
    g.op_cnt = op_cnt
    CP()
    jbegin(g, op)

# A buffer flush or a refill is a run of up to 32 steps. Committing each one to the
# guard's cnt would make each a store to the line that other threads' pops read for
# the top; each such store after one of those reads moves the line back (a transfer
# between cores), and the run stretches. So a run publishes its steps in the journal
# instead: a step's counts go to rcnt under OP_REFILL (the queue's counts while that
# op is set), and settle() stores the run's final counts to cnt once. The total
# count, all that a lock-free reader takes from cnt, is the same before and after.
cdef inline void publish(Guard *g, uint64_t cnt, bint defer) noexcept nogil:
    # a change of membership in one store (op is OP_NONE or OP_REFILL between steps;
    # at a step's end it is the step's, and the op store that follows is the change)
    if not defer:
        commit(g, cnt)
        return
    jset(<int64_t*>&g.rcnt, <int64_t>cnt)             # under OP_REFILL this is the change
    if g.op != OP_REFILL:
        jbegin(g, OP_REFILL)

cdef inline void end_step(Guard *g, bint defer) noexcept nogil:
    # the step in flight is done: its counts become the queue's
    publish(g, g.op_cnt, defer)
    if not defer:
        jbegin(g, OP_NONE)

cdef inline void settle(Guard *g) noexcept nogil:
    # a deferred run is over: its counts go to the guard's cnt in one store
    if g.op == OP_REFILL:
        commit(g, g.rcnt)
        jbegin(g, OP_NONE)

cdef void finish_sift_up(Guard *g, Elem *h, bint defer) noexcept nogil:
    cdef int64_t i = g.hole, p
    cdef Elem x = g.pending
    while i > 0:
        p = (i - 1) // HEAP_ARITY
        if h[p].key <= x.key:
            break
        h[i] = h[p]
        CP()
        jset(&g.hole, p)
        i = p
    h[i] = x
    CP()
    end_step(g, defer)

# The sift-down picks the first smallest of a node's children in one of two ways
# (the same child either way). Where the children are likely cached (a slot below
# HOT_CHILDREN, or any slot of a heap of at most SMALL_HEAP items), min_child8
# selects without branches: the branch per child ("a new smallest?") follows
# random keys and is often mispredicted. Deeper in a large heap, min_child_scan
# branches: the predicted path lets the core start the next level's loads before
# this level's have arrived, which a select's data dependence forbids (Khuong and
# Morin, "Array layouts for comparison-based searching", ACM JEA 2017, on
# branch-free search in and out of cache).
cdef inline int64_t min_child8(const Elem *h, int64_t c, uint64_t *km) noexcept nogil:
    """The first smallest of the full node h[c:c + 8] (its key into km), by
    compare-and-select steps."""
    cdef int64_t m = c, t
    cdef uint64_t best = h[c].key, k
    cdef bint lt
    for t in range(1, HEAP_ARITY):
        k = h[c + t].key
        lt = k < best
        best = k if lt else best
        m = c + t if lt else m
    km[0] = best
    return m

cdef inline int64_t min_child_scan(const Elem *h, int64_t c, int64_t e,
                                   uint64_t *km) noexcept nogil:
    """The first smallest of h[c:e] (its key into km), by a branch per child."""
    cdef int64_t m = c
    cdef uint64_t best = h[c].key
    c += 1
    while c < e:
        if h[c].key < best:
            best = h[c].key
            m = c
        c += 1
    km[0] = best
    return m

cdef void finish_sift_down(Guard *g, Elem *h, bint defer) noexcept nogil:
    cdef int64_t n = C_HS(g.op_cnt), i = g.hole, c, m, e
    cdef uint64_t km
    cdef Elem x = g.pending
    while True:
        c = HEAP_ARITY * i + 1
        if c >= n:
            break
        e = c + HEAP_ARITY
        if e <= n and (c < HOT_CHILDREN or n <= SMALL_HEAP):
            m = min_child8(h, c, &km)
        else:
            m = min_child_scan(h, c, e if e < n else n, &km)
        if km >= x.key:
            break
        h[i] = h[m]
        CP()
        jset(&g.hole, m)
        i = m
    h[i] = x
    CP()
    end_step(g, defer)

cdef void finish_del_insert(Guard *g, Elem *d) noexcept nogil:
    """Finish placing ``pending`` into the ascending deletion buffer: larger items
    above the hole move up one slot until the hole reaches its place."""
    cdef int64_t i = g.hole, ds = C_DS(g.op_cnt)
    cdef Elem x = g.pending
    while i > ds and d[i - 1].key > x.key:
        d[i] = d[i - 1]
        CP()
        jset(&g.hole, i - 1)
        i -= 1
    d[i] = x
    CP()
    end_step(g, False)

cdef void finish_del_insert_down(Guard *g, Elem *d) noexcept nogil:
    """As finish_del_insert, for a window that grows down: smaller items below
    the hole move down one slot."""
    cdef int64_t i = g.hole, de = C_DE(g.op_cnt)
    cdef Elem x = g.pending
    while i + 1 < de and d[i + 1].key < x.key:
        d[i] = d[i + 1]
        CP()
        jset(&g.hole, i + 1)
        i += 1
    d[i] = x
    CP()
    end_step(g, False)

cdef void heap_add(Guard *g, Elem *h, Elem x, uint64_t new_cnt, bint defer) noexcept nogil:
    """Move x (still counted in a buffer) into the heap; new_cnt counts it there
    and no longer in the buffer. A key that stays at the bottom needs one store of
    the counts; otherwise the sift-up is journaled. defer: publish (see settle)."""
    cdef int64_t s = C_HS(new_cnt) - 1
    h[s] = x
    CP()
    if s == 0 or h[(s - 1) // HEAP_ARITY].key <= x.key:
        publish(g, new_cnt, defer)
        return
    journal(g, OP_SIFT_UP, x, s, new_cnt)
    finish_sift_up(g, h, defer)

cdef uint64_t flush_deferred(Core *c, Guard *g, int64_t q, uint64_t k) noexcept nogil:
    """Move the insertion buffer into the heap, publishing each step (see settle);
    k: the queue's counts. Returns the counts after."""
    cdef Elem *ins = I(c, q)
    cdef Elem *h = H(c, q)
    cdef uint64_t nk
    while C_NI(k) > 0:
        nk = MK(C_HS(k) + 1, C_NI(k) - 1, C_DS(k), C_DE(k))
        heap_add(g, h, ins[C_NI(k) - 1], nk, True)
        k = nk
    return k

cdef void flush_insertions(Core *c, Guard *g, int64_t q) noexcept nogil:
    flush_deferred(c, g, q, g.cnt)
    settle(g)

cdef void refill(Core *c, Guard *g, int64_t q) noexcept nogil:
    """The deletion buffer is empty (ds = de = 0): flush the insertion buffer, then
    take up to BUF smallest items of the heap into the deletion buffer, in order;
    the whole run stores the guard's counts once (see settle)."""
    cdef Elem *h = H(c, q)
    cdef Elem *d = D(c, q)
    cdef uint64_t k = flush_deferred(c, g, q, g.cnt)
    cdef int64_t hs = C_HS(k), de = 0
    while de < BUF and hs > 0:
        d[de] = h[0]               # a copy outside the window: not counted yet
        CP()
        if hs == 1:
            publish(g, MK(0, 0, 0, de + 1), True)
        else:
            # the heap's last item fills the hole at the root; the journal's counts
            # move the root into the deletion buffer, and the sift follows
            journal(g, OP_SIFT_DOWN, h[hs - 1], 0, MK(hs - 1, 0, 0, de + 1))
            finish_sift_down(g, h, True)
        hs -= 1
        de += 1
    settle(g)

cdef inline void set_top(Core *c, Guard *g, int64_t q) noexcept nogil:
    cdef uint64_t k = g.cnt
    rlx_store_relaxed_u64(&g.top, D(c, q)[C_DS(k)].key if C_DE(k) > C_DS(k) else EMPTY_TOP)

cdef void recover(Core *c, int64_t q) noexcept nogil:
    """Repair queue q after taking over the lock of a dead holder (lock held).

    The journal names the one multi-store step that may be in flight; it is
    finished (rolled forward) with the same journaled stores, so a recoverer that
    dies half-way leaves a state the next one finishes the same way. Then a
    deletion buffer left empty by a pop that committed is refilled."""
    cdef Guard *g = G(c, q)
    cdef int32_t op = g.op
    cdef uint64_t k
    if op == OP_DINS:
        finish_del_insert(g, D(c, q))
    elif op == OP_DINS_DOWN:
        finish_del_insert_down(g, D(c, q))
    elif op == OP_SIFT_UP:
        finish_sift_up(g, H(c, q), False)
    elif op == OP_SIFT_DOWN:
        finish_sift_down(g, H(c, q), False)
    elif op == OP_REFILL:
        settle(g)                      # a run's last published counts
    jbegin(g, OP_NONE)                 # (again) clear the journal, whatever it held
    k = g.cnt
    if C_DE(k) == C_DS(k) and (C_HS(k) > 0 or C_NI(k) > 0):
        if C_DS(k) != 0:
            commit(g, MK(C_HS(k), C_NI(k), 0, 0))
        refill(c, g, q)
    set_top(c, g, q)

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

cdef int32_t del_insert_begin(Core *c, Guard *g, int64_t q, Elem e) noexcept nogil:
    """Open the journal of an insertion of e, smaller than the deletion buffer's
    largest item, into that buffer; a full buffer first hands its largest item to
    the insertion buffer. Returns the op (OP_DINS or OP_DINS_DOWN)."""
    cdef Elem *d = D(c, q)
    cdef uint64_t k = g.cnt
    cdef int64_t ds = C_DS(k), de = C_DE(k)
    if de - ds == BUF:
        if C_NI(k) == BUF:
            flush_insertions(c, g, q)
            k = g.cnt
        I(c, q)[C_NI(k)] = d[de - 1]   # a copy outside the count; the journal counts it
        CP()
        journal(g, OP_DINS, e, de - 1, MK(C_HS(k), C_NI(k) + 1, ds, de))
        return OP_DINS
    if de < BUF:
        journal(g, OP_DINS, e, de, MK(C_HS(k), C_NI(k), ds, de + 1))
        return OP_DINS
    # the window ends at the top slot: it grows downwards
    journal(g, OP_DINS_DOWN, e, ds - 1, MK(C_HS(k), C_NI(k), ds - 1, de))
    return OP_DINS_DOWN

cdef inline void del_insert(Core *c, Guard *g, int64_t q, Elem e) noexcept nogil:
    if del_insert_begin(c, g, q, e) == OP_DINS:
        finish_del_insert(g, D(c, q))
    else:
        finish_del_insert_down(g, D(c, q))

cdef inline void buffered_push(Core *c, Guard *g, int64_t q, Elem e) noexcept nogil:
    cdef uint64_t k = g.cnt
    cdef int64_t hs = C_HS(k), ni = C_NI(k), ds = C_DS(k), de = C_DE(k)
    cdef Elem *d = D(c, q)
    if de > ds and e.key < d[de - 1].key:
        del_insert(c, g, q, e)
        set_top(c, g, q)
        return
    if hs == 0 and ni == 0 and de < BUF:
        d[de] = e                      # not smaller than any item: appended in order
        CP()
        commit(g, MK(0, 0, ds, de + 1))
        if de == ds:
            set_top(c, g, q)
        return
    if ni == BUF:
        flush_insertions(c, g, q)
        ni = 0
        k = g.cnt
    I(c, q)[ni] = e
    CP()
    commit(g, MK(C_HS(k), ni + 1, ds, de))

cdef inline Elem buffered_pop(Core *c, Guard *g, int64_t q) noexcept nogil:
    cdef uint64_t k = g.cnt
    cdef int64_t hs = C_HS(k), ni = C_NI(k), ds = C_DS(k), de = C_DE(k)
    cdef Elem out = D(c, q)[ds]
    if ds + 1 < de:
        commit(g, MK(hs, ni, ds + 1, de))
    else:
        commit(g, MK(hs, ni, 0, 0))
        if hs > 0 or ni > 0:
            refill(c, g, q)
    set_top(c, g, q)
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
        s += qsize(G(c, q))
    return s

cdef inline void draw_pair(Core *c, Handle *hd) noexcept nogil:
    """A fresh pair of distinct random queues for the next ``stickiness`` operations."""
    cdef uint32_t i, j
    rlx_rand_pair(&hd.rng, <uint32_t>c.n, &i, &j)
    hd.pair_i = i
    hd.pair_j = j
    hd.left = hd.stickiness

cdef int mq_push(Core *c, Handle *hd, Elem e) noexcept nogil:
    """R_OK = pushed, R_EMPTY_OR_FULL = every queue was full, R_BUSY = retry."""
    cdef int64_t n = c.n, q, k, start, attempt
    cdef Guard *g
    for attempt in range(8):
        if n == 1:
            q = 0
        elif hd.left <= 0:
            draw_pair(c, hd)
            q = hd.pair_i              # uniform over the queues, like a random push
        else:
            q = hd.pair_i if rlx_rand(&hd.rng) >> 63 else hd.pair_j
        g = G(c, q)
        if try_lock(g, hd.pid):
            if C_TOTAL(g.cnt) < c.cap:
                buffered_push(c, g, q, e)
                log_op(hd, 1, e)
                unlock(g)
                hd.left -= 1
                return R_OK
            unlock(g)
        hd.left = 0
    # slow path: visit every queue, waiting for its lock. Seeing each queue full
    # at a different moment does not mean the whole is full (pops and pushes of
    # others move items between queues meanwhile), so "full" needs the total
    # to be at capacity; otherwise the pass is repeated.
    for attempt in range(64):
        start = rlx_rand_below(&hd.rng, <uint32_t>n)
        for k in range(n):
            q = (start + k) % n
            g = G(c, q)
            if qsize(g) >= c.cap:
                continue
            if not lock_spin(c, q, hd.pid, WAIT_YIELDS):
                return R_BUSY
            if C_TOTAL(g.cnt) < c.cap:
                buffered_push(c, g, q, e)
                log_op(hd, 1, e)
                unlock(g)
                return R_OK
            unlock(g)
        if mq_len(c) >= n * c.cap:
            return R_EMPTY_OR_FULL
        rlx_yield()
    return R_EMPTY_OR_FULL

cdef inline bint pop_unlock(Core *c, Guard *g, int64_t q, Handle *hd, Elem *out) noexcept nogil:
    """With queue q's lock held: pop its smallest item into out (1), or find its
    deletion buffer empty (0); then unlock."""
    if C_DE(g.cnt) > C_DS(g.cnt):
        out[0] = buffered_pop(c, g, q)
        log_op(hd, 2, out[0])
        unlock(g)
        return 1
    unlock(g)
    return 0

cdef int mq_pop(Core *c, Handle *hd, Elem *out) noexcept nogil:
    """R_OK = popped into out, R_EMPTY_OR_FULL = a full scan found every queue
    empty, R_BUSY = retry."""
    cdef int64_t n = c.n, q, t, start, attempt
    cdef uint64_t k
    cdef uint64_t ti, tj
    cdef Guard *g
    cdef Guard *gi
    cdef Guard *gj
    if n > 1:
        for attempt in range(8):
            if hd.left <= 0:
                draw_pair(c, hd)
            gi = G(c, hd.pair_i)
            gj = G(c, hd.pair_j)
            ti = rlx_load_relaxed_u64(&gi.top)
            tj = rlx_load_relaxed_u64(&gj.top)
            if tj < ti or (tj == ti and qsize(gi) == 0):
                q = hd.pair_j
                g = gj
            else:
                q = hd.pair_i
                g = gi
            k = rlx_load_relaxed_u64(&g.cnt)
            if C_TOTAL(k) == 0:
                hd.left = 0
                break                      # both looked empty: scan
            if try_lock(g, hd.pid) and pop_unlock(c, g, q, hd, out):
                hd.left -= 1
                return R_OK
            hd.left = 0
    # scan, first without waiting: the first queue (from a random one on) that has an
    # item and a free lock. A held lock is passed by: its holder may be refilling that
    # queue, and a waiter that spins on the guard's line makes each of the holder's
    # journal stores a transfer between cores, so the refill (and the wait) stretch.
    start = rlx_rand_below(&hd.rng, <uint32_t>n)
    for t in range(n):
        q = start + t if start + t < n else start + t - n
        g = G(c, q)
        if qsize(g) > 0 and try_lock(g, hd.pid) and pop_unlock(c, g, q, hd, out):
            return R_OK
    # then waiting for each lock in turn: "empty" only if each queue was seen empty
    for t in range(n):
        q = start + t if start + t < n else start + t - n
        g = G(c, q)
        if qsize(g) == 0:
            continue
        if not lock_spin(c, q, hd.pid, WAIT_YIELDS):
            return R_BUSY
        if pop_unlock(c, g, q, hd, out):
            return R_OK
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
        Operations a handle spends on one random pair of queues (pops take the
        smaller top of the two, pushes go to either) before drawing a new pair;
        >= 1. Higher is faster under contention and less exact; 1 (the default)
        draws a fresh pair for every pop and a random queue for every push.

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
        capacity = _check_int("capacity", capacity, 1, "use a positive number of items",
                              MAX_ITEMS)
        n_queues = _check_int("n_queues", n_queues, 1,
                              "use at least 1 queue (2-4 per thread is usual)")
        if n_queues > 1 << 20:
            raise ValueError(f"n_queues must be at most {1 << 20}, got {n_queues}")
        stickiness = _check_int("stickiness", stickiness, 1, "use 1 for no stickiness")
        if not isinstance(shared, bool):
            raise TypeError(f"shared must be a bool, got {type(shared).__name__}")
        if not isinstance(key_dtype, str) or key_dtype not in _KEY_KINDS:
            kd = getattr(np.dtype(key_dtype), "name", key_dtype) if _is_dtype(key_dtype) else key_dtype
            if not isinstance(kd, str) or kd not in _KEY_KINDS:
                raise ValueError(f"key_dtype must be 'int64' or 'float64', got {key_dtype!r}")
            key_dtype = kd
        seed = _make_seed(seed)
        cap_per = (capacity + n_queues - 1) // n_queues
        # the guard's line(s), then its deletion and insertion buffers
        guard_stride = _round_up(_round_up(max(rlx_cache_line(), sizeof(Guard)), 64) + BUF_BYTES,
                                 max(rlx_cache_line(), 64))
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
                    or hd.key_kind not in (0, 1) or hd.guard_stride < sizeof(Guard) + BUF_BYTES
                    or hd.guard_stride % 64
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
        self.h.left = 0

    cdef Handle _fork_handle(self):
        # a private handle for one bulk call: its own RNG stream, no shared state
        cdef Handle local = self.h
        local.rng = rlx_mix64(rlx_rand(&self.h.rng))
        local.left = 0
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
            if not PyIndex_Check(key) or isinstance(key, bool):
                # (a float, a Decimal or a numpy float has no exact int: Cython's
                # conversion would truncate it)
                raise TypeError(f"key must be an integer for a key_dtype='int64' queue, got "
                                f"{type(key).__name__} {key!r}; create the queue with "
                                "key_dtype='float64' for other numbers")
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
        if not PyIndex_Check(value) or isinstance(value, bool):
            raise _bad_value(value)            # (not truncated: 2.9 is no value)
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
        cdef int64_t m = _check_int("n", n, 0, "ask for zero or more items", MAX_ITEMS)
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

    # -- the compiled core for C and C++ drivers --------------------------------
    def _native_handles(self, n):
        """The compiled core for a C or C++ benchmark driver that runs this queue's
        operations on its own threads, without Python (``bench/cxx/kit_mq.hpp`` runs
        it in the C++ MultiQueue's own benchmark harness). Returns a dict:

        * ``core``: the address of this queue's ``Core``;
        * ``push`` / ``pop``: addresses of ``int push(Core*, Handle*, Elem)`` and
          ``int pop(Core*, Handle*, Elem*)`` (``Elem`` = {uint64 key, int64 value};
          keys mapped order-preservingly: an int64 key k is ``k ^ 2**63``); they return
          1 (done), 0 (every queue full / empty) or 2 (busy: call again);
        * ``handles``: a uint8 array holding ``n`` private handles (each its own RNG
          stream, as a bulk call's), the k-th at byte ``offset + k * stride`` of it
          (``stride``: a multiple of the padded cache line of ``rlx_cache_line``, so
        that handles share no line and no pair of lines that the adjacent-line
        prefetcher pulls together: every operation writes its handle).

        The queue and the array must outlive every call made through them; the
        driver must not touch them after ``close()``. int64 keys only."""
        self._check_open()
        if self.key_kind != KEY_INT64:
            raise ValueError("_native_handles: int64-key queues only")
        cdef int64_t count = _check_int("n", n, 1, "ask for at least one handle")
        cdef int64_t line = rlx_cache_line()
        cdef int64_t stride = _round_up(sizeof(Handle), line)
        buf = np.zeros(count * stride + line, dtype=np.uint8)
        cdef uint8_t[::1] b = buf
        cdef size_t addr = <size_t>&b[0]
        cdef int64_t offset = (line - <int64_t>(addr % line)) % line
        cdef Handle hd
        cdef int64_t k
        for k in range(count):
            hd = self._fork_handle()
            (<Handle*>(&b[offset + k * stride]))[0] = hd
        return {"core": <size_t>&self.core, "push": <size_t>&mq_push, "pop": <size_t>&mq_pop,
                "handles": buf, "offset": int(offset), "stride": int(stride)}

    # -- invariants, recovery, teardown ---------------------------------------
    def _check(self):
        """Assert every invariant (quiescent use only): per queue, the counts are in
        range and add up to at most its capacity, the heap is a valid heap, the
        deletion buffer is ascending and holds the smallest items (no heap or
        insertion-buffer item is smaller than its largest), an empty deletion buffer
        means an empty queue, the cached top is its smallest item, no lock is held
        and no operation is in flight. Raises AssertionError with a dump."""
        self._check_open()
        cdef int64_t q
        for q in range(self.core.n):
            problems = self._problems(q)
            if problems:
                raise AssertionError(f"MultiQueue queue {q}: " + "; ".join(problems)
                                     + f"\nstate: {self._dump(q)}")
        return True

    cdef list _problems(self, int64_t q):
        cdef Guard *g = G(&self.core, q)
        cdef Elem *h = H(&self.core, q)
        cdef Elem *d = D(&self.core, q)
        cdef Elem *ins = I(&self.core, q)
        cdef uint64_t k = g.cnt
        cdef int64_t hs = C_HS(k), ni = C_NI(k), ds = C_DS(k), de = C_DE(k), i
        problems = []
        if g.lock != 0:
            problems.append(f"lock held by pid {g.lock}")
        if g.op != OP_NONE:
            problems.append(f"operation {g.op} in flight")
        if hs > self.core.cap or ni > BUF or ds > de or de > BUF:
            problems.append(f"counts out of range: heap {hs}, insertion {ni}, "
                            f"deletion window [{ds}, {de})")
            return problems
        if C_TOTAL(k) > self.core.cap:
            problems.append(f"{C_TOTAL(k)} items over the capacity {self.core.cap}")
        for i in range(1, hs):
            if h[(i - 1) // HEAP_ARITY].key > h[i].key:
                problems.append(f"heap order broken at index {i}")
                break
        for i in range(ds + 1, de):
            if d[i - 1].key > d[i].key:
                problems.append(f"deletion buffer not ascending at slot {i}")
                break
        if de == ds:
            if hs or ni:
                problems.append("deletion buffer empty but the heap or insertion buffer is not")
            if ds:
                problems.append(f"empty deletion window not reset: [{ds}, {de})")
        else:
            if hs and h[0].key < d[de - 1].key:
                problems.append("a heap item is smaller than the deletion buffer's largest")
            for i in range(ni):
                if ins[i].key < d[de - 1].key:
                    problems.append(f"insertion buffer item {i} is smaller than the "
                                    "deletion buffer's largest")
                    break
        want = d[ds].key if de > ds else EMPTY_TOP
        if g.top != want:
            problems.append(f"cached top {g.top} != smallest key {want}")
        return problems

    def _pop_once(self):
        """Test hook: one call of the core's pop, without the retry that pop() makes
        when the core gave up waiting on a held lock: (key, value), "busy" (it waited
        WAIT_YIELDS yields on a lock and gave up) or "empty"."""
        cdef Elem e
        self._check_open()
        cdef int r = mq_pop(&self.core, &self.h, &e)
        if r == R_OK:
            return (self._key_out(e.key), e.value)
        return "busy" if r == R_BUSY else "empty"

    def _dump(self, q):
        """The state of queue q (lock, journal, counts, buffers, first heap items),
        for diagnostics."""
        self._check_open()
        q = _check_int("q", q, 0, "use a queue index")
        if q >= self.core.n:
            raise ValueError(f"q must be < n_queues = {self.core.n}, got {q}")
        cdef Guard *g = G(&self.core, q)
        cdef Elem *h = H(&self.core, q)
        cdef Elem *d = D(&self.core, q)
        cdef Elem *ins = I(&self.core, q)
        cdef uint64_t k = g.cnt
        cdef int64_t hs = min(C_HS(k), self.core.cap)
        return {"queue": q, "lock": g.lock, "op": g.op, "top": g.top,
                "heap_size": C_HS(k), "insertion_count": C_NI(k),
                "deletion_window": (C_DS(k), C_DE(k)), "hole": g.hole,
                "op_counts": (C_HS(g.op_cnt), C_NI(g.op_cnt), C_DS(g.op_cnt), C_DE(g.op_cnt)),
                "refill_counts": (C_HS(g.rcnt), C_NI(g.rcnt), C_DS(g.rcnt), C_DE(g.rcnt)),
                "deletion": [(d[i].key, d[i].value) for i in range(C_DS(k), min(C_DE(k), BUF))],
                "insertion": [(ins[i].key, ins[i].value) for i in range(min(C_NI(k), BUF))],
                "heap_head": [(h[i].key, h[i].value) for i in range(min(hs, 16))]}

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
        """Test hook: leave queue q's lock held in the middle of a multi-store step,
        as a holder killed there would, after at most ``steps`` moves. op=1: a push of
        (key, value) into the deletion buffer if key is smaller than its largest item
        (otherwise the push is a single store: the lock is taken, nothing written); op=2: a refill taking the heap's smallest item into the deletion
        buffer (the buffer is first moved back into the heap; needs >= 2 items in
        the heap afterwards). Used by the crash-recovery tests only."""
        self._check_open()
        cdef int64_t qq = _check_int("q", q, 0, "use a queue index")
        if qq >= self.core.n:
            raise ValueError("q out of range")
        cdef int64_t lim = _check_int("steps", steps, 0, "use a count >= 0")
        cdef Guard *g = G(&self.core, qq)
        cdef Elem *h = H(&self.core, qq)
        cdef Elem *d = D(&self.core, qq)
        cdef uint64_t k
        cdef int64_t i, n, c, m, e2, ds, de
        cdef Elem x
        lock_spin(&self.core, qq, self.h.pid, 1 << 62)
        k = g.cnt
        ds = C_DS(k)
        de = C_DE(k)
        if op == 1 and de > ds and self._key_in(key) < d[de - 1].key:
            x.key = self._key_in(key)
            x.value = value
            i = g.hole
            if del_insert_begin(&self.core, g, qq, x) == OP_DINS:
                i = g.hole
                while i > C_DS(g.op_cnt) and d[i - 1].key > x.key and lim > 0:
                    d[i] = d[i - 1]; g.hole = i - 1; i -= 1; lim -= 1
            else:
                i = g.hole
                while i + 1 < de and d[i + 1].key < x.key and lim > 0:
                    d[i] = d[i + 1]; g.hole = i + 1; i += 1; lim -= 1
        elif op == 2 and C_HS(k) + de - ds >= 3:
            flush_insertions(&self.core, g, qq)
            while C_DE(g.cnt) > C_DS(g.cnt):
                k = g.cnt
                heap_add(g, h, d[C_DE(k) - 1], MK(C_HS(k) + 1, C_NI(k), C_DS(k), C_DE(k) - 1),
                         False)
            commit(g, MK(C_HS(g.cnt), 0, 0, 0))
            n = C_HS(g.cnt)
            d[0] = h[0]
            journal(g, OP_SIFT_DOWN, h[n - 1], 0, MK(n - 1, 0, 0, 1))
            commit(g, g.op_cnt)
            x = g.pending
            i = 0
            while lim > 0:
                c = HEAP_ARITY * i + 1
                if c >= n - 1:
                    break
                m = c
                e2 = min(c + HEAP_ARITY, n - 1)
                while c < e2:
                    if h[c].key < h[m].key:
                        m = c
                    c += 1
                if h[m].key >= x.key:
                    break
                h[i] = h[m]; g.hole = m; i = m; lim -= 1
        elif op == 1:
            pass        # such a push is one store: a holder dies before it or after it
        else:
            unlock(g)
            raise ValueError("op must be 1 (push) or 2 (refill, >= 3 items)")

    def __repr__(self):
        if self.hdr == NULL:
            return "<MultiQueue closed>"
        return (f"<MultiQueue n_queues={self.n_queues} capacity={self.capacity} "
                f"len={mq_len(&self.core)} key_dtype={self.key_dtype!r} "
                f"shared={self.shared} name={self.name!r}>")

# ---------------------------------------------------------------------------
# validation helpers (the other compiled modules import them from relaxed._multiqueue)
# ---------------------------------------------------------------------------
INT64_MAX = (1 << 63) - 1
# sizes that become byte counts (16 bytes an item, 32 a write, 8 a word) stay far inside int64
MAX_ITEMS = 1 << 56

def _check_int(name, value, lo, fix, hi=INT64_MAX):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}; {fix}")
    if value > hi:
        if hi == INT64_MAX:
            raise ValueError(f"{name} must be <= 2**63-1, got {value}; it is stored as an int64")
        bound = f"2**{hi.bit_length() - 1}" if hi & (hi - 1) == 0 else str(hi)
        raise ValueError(f"{name} must be <= {bound}, got {value}; larger sizes cannot be mapped")
    return value

def _is_dtype(x):
    if x is None:                  # (np.dtype(None) is float64: no choice made is no dtype)
        return False
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
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return ValueError(f"value {value!r} is outside int64 range [-2**63, 2**63-1]")
    return TypeError(f"value must be an int (values are int64), got {type(value).__name__} "
                     f"{value!r}")

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
