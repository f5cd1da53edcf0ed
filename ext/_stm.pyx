# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, embedsignature=True
"""TL2 software transactional memory over int64 words (compiled core).

Dice, Shalev, Shavit, "Transactional Locking II" (DISC 2006): every word maps
to a versioned write-lock *stripe*; a transaction samples the clock at begin
(rv), reads optimistically (a stripe must be unlocked and no newer than rv),
buffers its writes, and at commit locks the stripes it writes, advances the
clock to get wv, re-validates its reads and writes back, releasing each stripe
with version wv.

Clocks. ``global``: one shared counter; wv = fetch_add + 1 (TL2's GV1).
``multicounter``: a MultiCounter (Alistarh et al., SPAA 2018) of m counters in
their own cache lines; a commit increments the smaller of two random counters
(so writers do not all hit one line) and then takes wv = the sum of the
counters; a begin takes rv = the sum. Safety rule: *wv exceeds every rv that
was read before the commit's increment*. Proof: counters only grow, so a sum
read by a scan lies between the true totals at the scan's start and end. A
reader whose scan ended before the writer's increment has rv <= X (the total
just before it), while the writer's scan starts after its increment (a full
fence separates them; on x86 the locked add already is one), so
wv >= X + 1 > rv. Hence rv >= wv implies the reader's scan ended after the
increment, which follows the writer's lock acquisition: the reader sees the
stripe locked or the new version, exactly TL2's argument. Per stripe, versions
grow (a writer locks after the previous writer's scan, so its wv is larger).
Two commits may share a wv; TL2 is safe with that (as with its GV4 variant).
The price: a begin reads m lines instead of one (m is small: 2 per thread).

Dead holders. A lock word holds the owner's *slot*; each process-thread
transacting owns a slot in the segment with its pid and a journal: the stripes
it locked with their old versions (each logged before its CAS), then, once
validated, wv and the redo log of its writes. A waiter that finds the owner's
process dead repairs the slot: a commit that had not finished validating is
rolled back (old versions restored), one that had is rolled forward (writes
redone, stripes released at wv). The repair is idempotent; a repairer that
dies is itself repaired by the next waiter.

Waiting on a held lock follows a ``relaxed.conflict`` requestor-aborts policy:
wait up to the policy's delay (drawn per conflict), then abort and retry.

Intended races: reads of data words are optimistic (a torn combination is
detected by the lock word read before and after, and by the version check);
a waiter polls a lock word without holding anything.
"""
from libc.stdint cimport uint64_t, int64_t, uint32_t, int32_t, uint8_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memset
from libc.math cimport INFINITY
from _common cimport *
from relaxed._conflict cimport (draw_delay_nogil, POL_ABORT_NOW, POL_WAIT_FOREVER,
                                POL_DETERMINISTIC, POL_RANDOMIZED, POL_EXP_BACKOFF)
from relaxed._base cimport ShmStructure

import os
import threading
import numpy as np

from relaxed import shm as _shm
from relaxed._multiqueue import MAX_ITEMS, _check_int, _make_seed

cdef enum:
    KIND_TL2 = 3
    CLOCK_GLOBAL = 0
    CLOCK_MC = 1
    ST_IDLE = 0
    ST_LOCKING = 1
    ST_WRITING = 2
    # tx results
    TX_OK = 0
    TX_ABORT = 1
    TX_FULL = 2
    TX_NOMEM = 3

ctypedef struct Header:
    ShmHead head               # magic ... handle_counter (ext/_common.pxd)
    int64_t n_words
    int64_t n_stripes
    int64_t clock_kind
    int64_t n_counters
    int64_t max_writes
    int64_t n_slots
    int64_t clock_off
    int64_t stripes_off
    int64_t words_off
    int64_t slots_off
    int64_t slot_size
    int64_t seed
    int64_t policy_kind
    double policy_B
    double policy_extra

ctypedef struct Slot:                 # followed by the lock log and the redo log
    int32_t pid                       # owner process, 0 when free
    int32_t state
    int32_t repairer                  # pid repairing this slot, 0 when none
    int32_t _pad
    int64_t wv
    int64_t n_locked
    int64_t n_writes

cdef int64_t HEADER_BYTES = 256
cdef int64_t SLOT_HEAD = 64

ctypedef struct Mem:
    Header *hdr
    char *clock                       # global counter or the m counters
    int64_t stride
    int64_t *stripes
    int64_t *words
    char *slots
    int64_t n_words
    int64_t n_stripes
    int64_t max_writes
    int64_t n_slots


cdef inline Slot* slot_at(Mem *m, int64_t j) noexcept nogil:
    return <Slot*>(m.slots + j * m.hdr.slot_size)

cdef inline int64_t* lock_log(Mem *m, int64_t j) noexcept nogil:
    """pairs (stripe, old version), max_writes of them"""
    return <int64_t*>(m.slots + j * m.hdr.slot_size + SLOT_HEAD)

cdef inline int64_t* redo_log(Mem *m, int64_t j) noexcept nogil:
    """pairs (word, value), max_writes of them"""
    return <int64_t*>(m.slots + j * m.hdr.slot_size + SLOT_HEAD + 16 * m.max_writes)

cdef inline int64_t stripe_of(Mem *m, int64_t i) noexcept nogil:
    return i % m.n_stripes

cdef inline int64_t lockval(int64_t slot) noexcept nogil:
    return (slot << 1) | 1


# ---- clock ----------------------------------------------------------------------

cdef inline int64_t clock_read(Mem *m) noexcept nogil:
    cdef int64_t s = 0, i
    if m.hdr.clock_kind == CLOCK_GLOBAL:
        return rlx_load_acquire_i64(<int64_t*>m.clock)
    for i in range(m.hdr.n_counters):
        s += rlx_load_acquire_i64(<int64_t*>(m.clock + i * m.stride))
    return s

cdef inline int64_t clock_advance(Mem *m, uint64_t *rng) noexcept nogil:
    if m.hdr.clock_kind == CLOCK_GLOBAL:
        return rlx_fetch_add_acqrel_i64(<int64_t*>m.clock, 1) + 1
    rlx_mc_increment(m.clock, m.stride, m.hdr.n_counters, rng)
    rlx_full_fence()                  # the scan starts after the increment is visible
    return clock_read(m)


# ---- repair of a slot whose owner died ------------------------------------------

cdef void repair_slot(Mem *m, int64_t j) noexcept nogil:
    """Roll back (LOCKING) or forward (WRITING) the commit of slot j, release its
    stripes and free the slot. Idempotent; callers hold slot.repairer."""
    cdef Slot *sl = slot_at(m, j)
    cdef int64_t *ll = lock_log(m, j)
    cdef int64_t *rl = redo_log(m, j)
    cdef int64_t k, n, mine = lockval(j)
    cdef int64_t *lk
    n = sl.n_locked
    if n < m.max_writes:
        n += 1                        # the entry logged before a CAS that may have won
    if sl.state == ST_WRITING:
        for k in range(sl.n_writes):
            rlx_store_relaxed_i64(&m.words[rl[2 * k]], rl[2 * k + 1])
        rlx_release_fence()
        for k in range(n):
            lk = &m.stripes[ll[2 * k]]
            if rlx_load_acquire_i64(lk) == mine:
                rlx_store_release_i64(lk, sl.wv << 1)
    else:
        for k in range(n):
            lk = &m.stripes[ll[2 * k]]
            if rlx_load_acquire_i64(lk) == mine:
                rlx_store_release_i64(lk, ll[2 * k + 1] << 1)
    sl.n_locked = 0
    sl.n_writes = 0
    rlx_store_release_i32(&sl.state, ST_IDLE)
    rlx_store_release_i32(&sl.pid, 0)


cdef bint try_repair(Mem *m, int64_t j) noexcept nogil:
    """Repair slot j if its owner is dead; True when it was (or is now) free."""
    cdef Slot *sl = slot_at(m, j)
    cdef int32_t owner = rlx_load_acquire_i32(&sl.pid)
    cdef int32_t rep
    if owner == 0:
        return True
    if rlx_pid_alive(owner):
        return False
    rep = rlx_load_acquire_i32(&sl.repairer)
    if rep != 0 and rlx_pid_alive(rep):
        return False                  # someone else is repairing it
    if not rlx_cas_acquire_i32(&sl.repairer, rep, rlx_getpid()):
        return False
    if rlx_load_acquire_i32(&sl.pid) == owner:
        repair_slot(m, j)
    rlx_store_release_i32(&sl.repairer, 0)
    return True


cdef int64_t acquire_slot(Mem *m, uint64_t *rng) noexcept nogil:
    cdef int64_t j, start, k
    cdef int32_t me = rlx_getpid()
    start = rlx_rand_below(rng, <uint32_t>m.n_slots)
    for k in range(2 * m.n_slots):
        j = (start + k) % m.n_slots
        if k >= m.n_slots:
            try_repair(m, j)
        if (rlx_load_relaxed_i32(&slot_at(m, j).pid) == 0 and
                rlx_load_relaxed_i32(&slot_at(m, j).repairer) == 0 and
                rlx_cas_acquire_i32(&slot_at(m, j).pid, 0, me)):
            slot_at(m, j).n_locked = 0
            slot_at(m, j).n_writes = 0
            rlx_store_release_i32(&slot_at(m, j).state, ST_IDLE)
            return j
    return -1


# ---- waiting on a held stripe ------------------------------------------------------

cdef int wait_stripe(Mem *m, int64_t s, int64_t seen, int kind, double B, double extra,
                     uint64_t *rng, int64_t *waits) noexcept nogil:
    """0: the stripe changed (retry); 1: give up (abort)."""
    cdef double u = (rlx_rand(rng) >> 11) * (1.0 / 9007199254740992.0)
    cdef double d = draw_delay_nogil(kind, B, extra, u)     # seconds (ext/relaxed/_conflict.pxd)
    cdef int64_t t0 = 0, now, spins = 0, next_probe, b_ns, last_check
    cdef int64_t holder = seen >> 1
    waits[0] += 1
    if d > 0:
        t0 = rlx_now_ns()
        last_check = t0
        b_ns = <int64_t>(B * 1e9 / ((1 << <int>extra) - 1)) if kind == POL_EXP_BACKOFF and extra >= 1 else 0
        next_probe = t0 + b_ns
        while True:
            if kind != POL_EXP_BACKOFF or rlx_now_ns() >= next_probe:
                if rlx_load_acquire_i64(&m.stripes[s]) != seen:
                    return 0
                if kind == POL_EXP_BACKOFF:
                    b_ns *= 2
                    next_probe += b_ns
            spins += 1
            if spins & 63 == 0:
                now = rlx_now_ns()
                if d != INFINITY and now - t0 >= <int64_t>(d * 1e9):
                    break
                if now - last_check > 1000000:          # every ms: is the holder alive?
                    last_check = now
                    if try_repair(m, holder):
                        return 0
                if spins & 1023 == 0:
                    rlx_yield()
            rlx_cpu_relax()
    if rlx_load_acquire_i64(&m.stripes[s]) != seen:
        return 0
    # Giving up: now and then (1 in 16, or after a long wait) check that the
    # holder is alive, so a dead one is repaired without paying a /proc read on
    # every short conflict.
    if (d >= 1e-3 or (rlx_rand(rng) & 15) == 0) and try_repair(m, holder):
        if rlx_load_acquire_i64(&m.stripes[s]) != seen:
            return 0
    return 1


# ---- transactions -------------------------------------------------------------------

ctypedef struct Tx:
    Mem *m
    int64_t slot
    int64_t rv
    int64_t *rset
    int64_t nr
    int64_t rcap
    int64_t *widx
    int64_t *wval
    int64_t nw
    uint64_t rng
    int pkind
    double pB
    double pextra
    int64_t commits
    int64_t aborts
    int64_t waits


cdef inline void tx_begin(Tx *t) noexcept nogil:
    t.nr = 0
    t.nw = 0
    t.rv = clock_read(t.m)


cdef inline int tx_read(Tx *t, int64_t i, int64_t *out) noexcept nogil:
    cdef int64_t k, s, l1, l2, v
    cdef int64_t *grown
    for k in range(t.nw - 1, -1, -1):
        if t.widx[k] == i:
            out[0] = t.wval[k]
            return TX_OK
    s = stripe_of(t.m, i)
    while True:
        l1 = rlx_load_acquire_i64(&t.m.stripes[s])
        if l1 & 1:
            if wait_stripe(t.m, s, l1, t.pkind, t.pB, t.pextra, &t.rng, &t.waits):
                return TX_ABORT
            continue
        v = rlx_load_acquire_i64(&t.m.words[i])
        l2 = rlx_load_acquire_i64(&t.m.stripes[s])
        if l1 != l2:
            continue
        if (l1 >> 1) > t.rv:
            return TX_ABORT
        break
    if t.nr == t.rcap:
        grown = <int64_t*>realloc(t.rset, 2 * t.rcap * sizeof(int64_t))
        if grown == NULL:
            return TX_NOMEM
        t.rset = grown
        t.rcap *= 2
    t.rset[t.nr] = s
    t.nr += 1
    out[0] = v
    return TX_OK


cdef inline int tx_write(Tx *t, int64_t i, int64_t v) noexcept nogil:
    cdef int64_t k
    for k in range(t.nw - 1, -1, -1):
        if t.widx[k] == i:
            t.wval[k] = v
            return TX_OK
    if t.nw == t.m.max_writes:
        return TX_FULL
    t.widx[t.nw] = i
    t.wval[t.nw] = v
    t.nw += 1
    return TX_OK


cdef void sort_writes(Tx *t) noexcept nogil:
    """Insertion sort of the write set by stripe (write sets are small)."""
    cdef int64_t k, q, wi, wv, s
    for k in range(1, t.nw):
        wi = t.widx[k]
        wv = t.wval[k]
        s = stripe_of(t.m, wi)
        q = k - 1
        while q >= 0 and stripe_of(t.m, t.widx[q]) > s:
            t.widx[q + 1] = t.widx[q]
            t.wval[q + 1] = t.wval[q]
            q -= 1
        t.widx[q + 1] = wi
        t.wval[q + 1] = wv


cdef void release_locked(Tx *t, Slot *sl, int64_t *ll) noexcept nogil:
    cdef int64_t k
    for k in range(sl.n_locked):
        rlx_store_release_i64(&t.m.stripes[ll[2 * k]], ll[2 * k + 1] << 1)
    sl.n_locked = 0
    rlx_store_release_i32(&sl.state, ST_IDLE)


cdef int tx_commit(Tx *t) noexcept nogil:
    cdef Mem *m = t.m
    cdef Slot *sl
    cdef int64_t *ll
    cdef int64_t *rl
    cdef int64_t k, q, s, l, wv, mine
    cdef bint ok
    if t.nw == 0:
        t.commits += 1
        return TX_OK                  # read-only: every read was validated against rv
    sl = slot_at(m, t.slot)
    ll = lock_log(m, t.slot)
    rl = redo_log(m, t.slot)
    mine = lockval(t.slot)
    sort_writes(t)                    # lock in stripe order: no deadlock, even
    sl.n_locked = 0                   # under the wait-forever policy
    rlx_store_release_i32(&sl.state, ST_LOCKING)
    for k in range(t.nw):
        s = stripe_of(m, t.widx[k])
        if sl.n_locked and ll[2 * (sl.n_locked - 1)] == s:
            continue                  # two words of one stripe
        while True:
            l = rlx_load_acquire_i64(&m.stripes[s])
            if l & 1:
                if wait_stripe(m, s, l, t.pkind, t.pB, t.pextra, &t.rng, &t.waits):
                    release_locked(t, sl, ll)
                    t.aborts += 1
                    return TX_ABORT
                continue
            ll[2 * sl.n_locked] = s            # logged before the CAS (see repair_slot)
            ll[2 * sl.n_locked + 1] = l >> 1
            rlx_release_fence()
            if rlx_cas_acqrel_i64(&m.stripes[s], l, mine):
                sl.n_locked += 1
                break
    wv = clock_advance(m, &t.rng)
    ok = True
    for k in range(t.nr):
        s = t.rset[k]
        l = rlx_load_acquire_i64(&m.stripes[s])
        if l == mine:
            for q in range(sl.n_locked):
                if ll[2 * q] == s:
                    l = ll[2 * q + 1] << 1
                    break
        if (l & 1) or (l >> 1) > t.rv:
            ok = False
            break
    if not ok:
        release_locked(t, sl, ll)
        t.aborts += 1
        return TX_ABORT
    for k in range(t.nw):
        rl[2 * k] = t.widx[k]
        rl[2 * k + 1] = t.wval[k]
    sl.n_writes = t.nw
    sl.wv = wv
    rlx_release_fence()
    rlx_store_release_i32(&sl.state, ST_WRITING)
    for k in range(t.nw):
        rlx_store_relaxed_i64(&m.words[t.widx[k]], t.wval[k])
    rlx_release_fence()
    for k in range(sl.n_locked):
        rlx_store_release_i64(&m.stripes[ll[2 * k]], wv << 1)
    sl.n_locked = 0
    rlx_store_release_i32(&sl.state, ST_IDLE)
    t.commits += 1
    return TX_OK


# ---- Python API ------------------------------------------------------------------------

class TransactionAborted(Exception):
    """A transaction lost a conflict (or read a word newer than its start) and was
    rolled back; nothing it wrote is visible. ``atomically`` retries by itself."""


def _attach(name, policy):
    return TL2.attach(name, conflict=policy)


DEFAULT_B = 2e-6      # seconds: about the cost of re-running a short transaction


def _policy_native(conflict):
    """(kind, B, extra) of a requestor-aborts relaxed.conflict policy; a name gets
    B = DEFAULT_B (2 microseconds)."""
    from relaxed import conflict as C
    p = C.policy(conflict, B=DEFAULT_B) if isinstance(conflict, str) else conflict
    if not hasattr(p, "native"):
        raise TypeError(f"conflict: expected a policy name or a relaxed.conflict policy, "
                        f"got {type(conflict).__name__}")
    kind, B, extra = p.native()
    if kind not in (POL_ABORT_NOW, POL_WAIT_FOREVER, POL_DETERMINISTIC, POL_RANDOMIZED,
                    POL_EXP_BACKOFF):
        raise ValueError(f"conflict: {p.name} is a requestor-wins policy, but a TL2 stripe is "
                         "locked only while its holder commits, which cannot be aborted from "
                         "outside; use 'randomized', 'deterministic', 'backoff', 'abort' or 'wait'")
    return p, int(kind), float(B), float(extra)


cdef class TL2(ShmStructure)


cdef class _TxState:
    """A transaction context: a slot in the segment plus private read/write sets."""
    cdef Tx t
    cdef object owner
    cdef int32_t pid

    def __cinit__(self):
        memset(&self.t, 0, sizeof(Tx))
        self.t.slot = -1

    cdef int setup(self, TL2 stm) except -1:
        self.owner = stm
        self.t.m = &stm.m
        self.t.rng = rlx_mix64(rlx_rand(&stm.rng))
        self.t.pkind = stm.pkind
        self.t.pB = stm.pB
        self.t.pextra = stm.pextra
        self.t.rcap = 64
        self.t.rset = <int64_t*>malloc(64 * sizeof(int64_t))
        self.t.widx = <int64_t*>malloc(stm.m.max_writes * sizeof(int64_t))
        self.t.wval = <int64_t*>malloc(stm.m.max_writes * sizeof(int64_t))
        if self.t.rset == NULL or self.t.widx == NULL or self.t.wval == NULL:
            raise MemoryError("TL2: cannot allocate a transaction's read/write sets")
        self.t.slot = acquire_slot(&stm.m, &self.t.rng)
        if self.t.slot < 0:
            raise RuntimeError(f"TL2: all {stm.m.n_slots} transaction slots are in use; "
                               "create the TL2 with a larger n_slots")
        self.pid = rlx_getpid()
        return 0

    cdef void release(self) noexcept:
        cdef TL2 stm = self.owner
        if (self.t.slot >= 0 and stm is not None and stm._base != NULL
                and self.pid == rlx_getpid()):
            rlx_store_release_i32(&slot_at(&stm.m, self.t.slot).pid, 0)
        self.t.slot = -1

    def __dealloc__(self):
        self.release()
        free(self.t.rset)
        free(self.t.widx)
        free(self.t.wval)


cdef class Transaction:
    """The handle ``fn(tx)`` receives: ``tx.read(i)`` and ``tx.write(i, value)`` are
    the only accesses to the words inside a transaction."""
    cdef TL2 stm
    cdef _TxState st
    cdef bint live

    def read(self, i):
        """The value of word ``i`` in this transaction's consistent view."""
        cdef int64_t out
        cdef int rc
        self._check()
        cdef int64_t idx = self.stm._index(i)
        rc = tx_read(&self.st.t, idx, &out)
        if rc == TX_ABORT:
            self.live = False
            self.st.t.aborts += 1
            raise TransactionAborted(f"read of word {idx} conflicted")
        if rc == TX_NOMEM:
            self.live = False
            raise MemoryError("TL2: read set too large")
        return out

    def write(self, i, value):
        """Buffer ``word[i] = value`` (int64); visible to others only at commit."""
        self._check()
        cdef int64_t idx = self.stm._index(i)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"value: expected an int (the words are int64), got "
                            f"{type(value).__name__} ({value!r})")
        if not -(1 << 63) <= int(value) < (1 << 63):
            raise ValueError(f"value: {value} does not fit in int64")
        if tx_write(&self.st.t, idx, int(value)) == TX_FULL:
            raise ValueError(f"transaction writes more than max_writes={self.stm.m.max_writes} "
                             "distinct words; create the TL2 with a larger max_writes")

    cdef _check(self):
        if not self.live:
            raise RuntimeError("this transaction is over (committed or aborted): read and "
                               "write only inside the function given to atomically() or "
                               "the with-block of transaction()")
        self.stm._check_open()
        if self.st.pid != rlx_getpid():
            raise RuntimeError("a transaction cannot continue in a forked child")


cdef class TL2(ShmStructure):
    """TL2(n_words, *, clock="global", n_counters=None, shared=False,
    conflict="randomized", n_stripes=None, max_writes=1024, n_slots=64, seed=None)

    A transactional array of ``n_words`` int64 words (initially 0), for threads
    and, with ``shared=True``, processes (it pickles as a handle).

    ``clock="global"`` is TL2's version clock; ``"multicounter"`` uses relaxed
    MultiCounter timestamps (see the module notes for why that stays correct).
    ``conflict`` is how long to wait on a stripe another transaction is
    committing: a ``relaxed.conflict`` requestor-aborts policy or its name
    (``"randomized"``, ``"deterministic"``, ``"backoff"``, ``"abort"``,
    ``"wait"``), its ``B`` in seconds (2 microseconds when given by name).

    >>> from relaxed import TL2
    >>> with TL2(4) as stm:
    ...     stm.atomically(lambda tx: tx.write(0, tx.read(1) + 5))
    ...     stm.snapshot().tolist()
    [5, 0, 0, 0]
    """
    cdef Mem m
    cdef uint64_t rng
    cdef int pkind
    cdef double pB
    cdef double pextra
    cdef object _policy
    cdef object _local
    cdef readonly int64_t commits_py
    cdef readonly int64_t aborts_py

    def __cinit__(self):
        memset(&self.m, 0, sizeof(Mem))

    def __init__(self, n_words, *, clock="global", n_counters=None, shared=False,
                 conflict="randomized", n_stripes=None, max_writes=1024, n_slots=64,
                 seed=None):
        n_words = _check_int("n_words", n_words, 1, "use at least one word", MAX_ITEMS)
        if clock not in ("global", "multicounter"):
            raise ValueError(f"clock must be 'global' or 'multicounter', got {clock!r}")
        if n_counters is None:
            n_counters = 2 * (os.cpu_count() or 1) if clock == "multicounter" else 1
        n_counters = _check_int("n_counters", n_counters, 1, "use at least 1 counter")
        if clock == "global" and n_counters != 1:
            raise ValueError("n_counters applies to clock='multicounter' only")
        if n_counters > 4096:
            raise ValueError(f"n_counters must be at most 4096, got {n_counters}")
        n_stripes = _check_int("n_stripes", n_words if n_stripes is None else n_stripes, 1,
                               "use at least one stripe", MAX_ITEMS)
        max_writes = _check_int("max_writes", max_writes, 1, "use at least 1", 1 << 32)
        n_slots = _check_int("n_slots", n_slots, 1, "use at least 1 (one per thread)")
        if n_slots > 1 << 20:
            raise ValueError(f"n_slots must be <= 2**20 (a slot per thread in a "
                             f"transaction at once), got {n_slots}")
        if not isinstance(shared, bool):
            raise TypeError(f"shared must be a bool, got {type(shared).__name__}")
        self._policy, self.pkind, self.pB, self.pextra = _policy_native(conflict)
        seed = _make_seed(seed)
        line = rlx_cache_line()
        slot_size = ((SLOT_HEAD + 32 * max_writes + line - 1) // line) * line
        clock_off = HEADER_BYTES
        stripes_off = clock_off + n_counters * line
        words_off = stripes_off + ((8 * n_stripes + line - 1) // line) * line
        slots_off = words_off + ((8 * n_words + line - 1) // line) * line
        total = slots_off + n_slots * slot_size
        seg = _shm.Segment.create(total, shared=shared)
        cdef Header *h
        try:
            _shm.write_header(seg.buf, KIND_TL2, total)
            self._map(seg)
            h = <Header*>self._base
            h.n_words = n_words
            h.n_stripes = n_stripes
            h.clock_kind = CLOCK_GLOBAL if clock == "global" else CLOCK_MC
            h.n_counters = n_counters
            h.max_writes = max_writes
            h.n_slots = n_slots
            h.clock_off = clock_off
            h.stripes_off = stripes_off
            h.words_off = words_off
            h.slots_off = slots_off
            h.slot_size = slot_size
            h.seed = <int64_t>seed
            self._setup()
        except BaseException:
            self.close() if self._seg is not None else seg.close()
            raise

    @classmethod
    def attach(cls, name, *, conflict="randomized"):
        """Attach to the shared TL2 called ``name`` (the policy is per handle)."""
        seg = _shm.Segment.attach(name)
        cdef TL2 self = cls.__new__(cls)
        cdef Header *h
        try:
            _shm.check_header(seg.buf, KIND_TL2, name)
            self._map(seg)
            h = <Header*>self._base
            if h.slots_off + h.n_slots * h.slot_size != seg.size:
                raise ValueError(f"segment {name!r} has an inconsistent TL2 header")
            self._policy, self.pkind, self.pB, self.pextra = _policy_native(conflict)
            self._setup()
        except BaseException:
            self.close() if self._seg is not None else seg.close()
            raise
        return self

    cdef _setup(self):
        cdef Header *h = <Header*>self._base
        self.m.hdr = h
        self.m.clock = self._base + h.clock_off
        self.m.stride = rlx_cache_line()
        self.m.stripes = <int64_t*>(self._base + h.stripes_off)
        self.m.words = <int64_t*>(self._base + h.words_off)
        self.m.slots = self._base + h.slots_off
        self.m.n_words = h.n_words
        self.m.n_stripes = h.n_stripes
        self.m.max_writes = h.max_writes
        self.m.n_slots = h.n_slots
        self._reseed()

    cdef _reseed(self):
        if self._base == NULL:
            return
        self.rng = handle_stream(&(<Header*>self._base).head, (<Header*>self._base).seed)
        self._local = threading.local()          # slots of the parent are not ours

    cdef _on_close(self):
        self._local = None
        memset(&self.m, 0, sizeof(Mem))

    cdef tuple _reduce_args(self):
        return (_attach, (self._seg.name, self._policy))

    cdef int64_t _index(self, i) except -1:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"word index: expected an int, got {type(i).__name__} ({i!r})")
        if not 0 <= i < self.m.n_words:
            raise IndexError(f"word index {i} is out of range: this TL2 has "
                             f"{self.m.n_words} words (0..{self.m.n_words - 1})")
        return i

    cdef _TxState _state(self):
        st = getattr(self._local, "st", None)
        if st is None:
            st = _TxState()
            (<_TxState>st).setup(self)
            self._local.st = st
        return st

    cdef _TxState _driver_state(self, seed):
        """A private transaction context (its own slot) for a nogil driver call."""
        cdef _TxState st = _TxState()
        st.setup(self)
        if seed is not None:
            st.t.rng = rlx_mix64(<uint64_t>_make_seed(seed))
        return st

    @property
    def n_words(self):
        self._check_open()
        return int(self.m.n_words)

    @property
    def clock(self):
        self._check_open()
        return "global" if self.m.hdr.clock_kind == CLOCK_GLOBAL else "multicounter"

    @property
    def conflict(self):
        return self._policy

    def clock_value(self):
        """The clock's current value (the exact sum for a MultiCounter clock)."""
        self._check_open()
        return int(clock_read(&self.m))

    def transaction(self):
        """``with stm.transaction() as tx:`` runs the block as one transaction and
        commits at its end; raises :class:`TransactionAborted` (nothing written)
        when it loses a conflict. For callers who retry themselves."""
        self._check_open()
        return _TxBlock(self)

    def atomically(self, fn):
        """Run ``fn(tx)`` as a transaction, re-running it on abort until it commits;
        return its result. ``fn`` must touch the words only through ``tx`` and
        should have no other side effects (it may run several times)."""
        if not callable(fn):
            raise TypeError(f"atomically: expected a callable fn(tx), got {type(fn).__name__}")
        while True:
            blk = _TxBlock(self)
            tx = blk.__enter__()
            try:
                result = fn(tx)
            except TransactionAborted:
                blk.abort()
                continue
            except BaseException:
                blk.abort()
                raise
            try:
                blk.commit()
            except TransactionAborted:
                continue
            return result

    def snapshot(self):
        """A consistent copy of all words (a read-only transaction), as int64 array."""
        self._check_open()
        out = np.empty(self.m.n_words, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef _TxState st = self._state()
        cdef int64_t i, v
        cdef int rc
        self._enter(st)
        try:
            while True:
                with nogil:
                    tx_begin(&st.t)
                    rc = TX_OK
                    for i in range(self.m.n_words):
                        rc = tx_read(&st.t, i, &v)
                        if rc != TX_OK:
                            break
                        o[i] = v
                if rc == TX_OK:
                    st.t.commits += 1
                    return out
                if rc == TX_NOMEM:
                    raise MemoryError("TL2: read set too large")
                st.t.aborts += 1
        finally:
            self._leave(st)

    def peek(self, i):
        """Word ``i`` read outside any transaction (no consistency guarantee)."""
        self._check_open()
        return int(rlx_load_acquire_i64(&self.m.words[self._index(i)]))

    cdef _enter(self, _TxState st):
        if getattr(self._local, "busy", False):
            raise RuntimeError("nested transaction: this thread is already inside a "
                               "transaction of this TL2; compose the work into one "
                               "function instead of calling atomically() inside it")
        self._local.busy = True
        self._active += 1          # close() refuses while a transaction reads the words

    cdef _leave(self, _TxState st):
        self._local.busy = False
        if self._active > 0:       # (0 in a child forked inside a transaction)
            self._active -= 1

    def stats(self):
        """Commits, aborts and conflict waits of this thread's transactions through
        this handle."""
        st = getattr(self._local, "st", None)
        if st is None:
            return {"commits": 0, "aborts": 0, "waits": 0}
        return _counts(&(<_TxState>st).t)

    def _check(self):
        """Invariants at quiescence: no stripe locked, stripe versions not above the
        clock, no slot in the middle of a commit."""
        self._check_open()
        cdef int64_t s, l, c = clock_read(&self.m), j
        for s in range(self.m.n_stripes):
            l = self.m.stripes[s]
            if l & 1:
                raise AssertionError(f"stripe {s} is locked by slot {l >> 1} at quiescence")
            if (l >> 1) > c:
                raise AssertionError(f"stripe {s} has version {l >> 1} above the clock {c}")
        for j in range(self.m.n_slots):
            if slot_at(&self.m, j).state != ST_IDLE:
                raise AssertionError(f"slot {j} is mid-commit at quiescence")
        return True

    def _repair_dead(self):
        """Repair every slot whose owner process is dead; returns how many."""
        self._check_open()
        cdef int64_t j, n = 0
        for j in range(self.m.n_slots):
            if slot_at(&self.m, j).pid != 0 and try_repair(&self.m, j):
                n += 1
        return n

    # ---- nogil benchmark drivers -------------------------------------------------

    def _bank(self, n_tx, *, n_accounts=None, audit_every=0, max_amount=10, seed=None,
              crash_after=-1, crash_in="writing"):
        """Random transfers between accounts 0..n_accounts-1 without the GIL: each
        transaction moves up to ``max_amount`` from one account to another; every
        ``audit_every``-th transaction is a read-only sum of all accounts, and a
        sum other than the first one seen counts as a violation. Returns a dict
        (commits, aborts, waits, violations, audits, total_seen).
        ``crash_after`` (tests): SIGKILL this process inside the k-th commit:
        ``crash_in="writing"`` after the redo log and half the write-back (the
        repair rolls forward), ``"locking"`` with one stripe locked and nothing
        validated (the repair rolls back)."""
        if crash_in not in ("writing", "locking"):
            raise ValueError(f"crash_in must be 'writing' or 'locking', got {crash_in!r}")
        cdef bint die_locking = crash_in == "locking"
        self._check_open()
        cdef int64_t n = _check_int("n_tx", n_tx, 0, "use a count >= 0")
        cdef int64_t na = self.m.n_words if n_accounts is None else _check_int(
            "n_accounts", n_accounts, 2, "use at least 2 accounts")
        if na > self.m.n_words:
            raise ValueError(f"n_accounts={na} exceeds n_words={self.m.n_words}")
        cdef int64_t every = _check_int("audit_every", audit_every, 0, "use 0 for no audits")
        cdef int64_t amax = _check_int("max_amount", max_amount, 1, "use at least 1")
        if every and na > self.m.n_words:
            raise ValueError("audits read every account")
        cdef int64_t crash = crash_after
        cdef _TxState st = self._driver_state(seed)
        cdef int64_t k, a, b, x, va, vb, total, first = 0, violations = 0, audits = 0, i
        cdef bint have_first = False
        cdef int rc
        cdef Tx *t = &st.t
        self._active += 1
        try:
            with nogil:
                for k in range(n):
                    if every and k % every == every - 1:
                        while True:
                            tx_begin(t)
                            total = 0
                            rc = TX_OK
                            for i in range(na):
                                rc = tx_read(t, i, &va)
                                if rc != TX_OK:
                                    break
                                total += va
                            if rc == TX_OK:
                                t.commits += 1
                                break
                            t.aborts += 1
                            if rc == TX_NOMEM:
                                break
                        if rc != TX_OK:
                            break
                        audits += 1
                        if not have_first:
                            first = total
                            have_first = True
                        elif total != first:
                            violations += 1
                        continue
                    a = rlx_rand_below(&t.rng, <uint32_t>na)
                    b = rlx_rand_below(&t.rng, <uint32_t>(na - 1))
                    if b >= a:
                        b += 1
                    x = 1 + rlx_rand_below(&t.rng, <uint32_t>amax)
                    while True:
                        tx_begin(t)
                        rc = tx_read(t, a, &va)
                        if rc == TX_OK:
                            rc = tx_read(t, b, &vb)
                        if rc == TX_OK:
                            tx_write(t, a, va - x)
                            tx_write(t, b, vb + x)
                            if crash == 0:
                                rlx_crash_arm(0)
                            rc = commit_maybe_crash(t, crash == 0, die_locking)
                            crash -= 1
                        else:
                            t.aborts += 1
                        if rc == TX_OK:
                            break
                        if rc == TX_NOMEM:
                            break
        finally:
            self._active -= 1
            st.release()
        return _counts(t) | {"violations": int(violations), "audits": int(audits),
                             "total_seen": int(first) if have_first else None}

    def _intset(self, n_ops, *, universe=None, update_pct=20, seed=None):
        """Integer-set microbenchmark without the GIL: a sorted linked list of keys
        0..universe-1 in the words (word k is key k's successor, -1 for none, word
        ``universe`` is the head), with preallocated nodes so that no allocator is
        needed. Each operation is a transaction: ``update_pct`` percent inserts and
        removes (half each), the rest lookups; traversals give long read sets.
        Returns a dict (commits, aborts, waits, inserted, removed, found)."""
        self._check_open()
        cdef int64_t n = _check_int("n_ops", n_ops, 0, "use a count >= 0")
        cdef int64_t U = (self.m.n_words - 1) if universe is None else _check_int(
            "universe", universe, 1, "use at least one key")
        if U + 1 > self.m.n_words:
            raise ValueError(f"universe={U} needs n_words >= {U + 1}, this TL2 has "
                             f"{self.m.n_words}")
        cdef int64_t upd = _check_int("update_pct", update_pct, 0, "use 0..100")
        if upd > 100:
            raise ValueError(f"update_pct must be at most 100, got {upd}")
        cdef _TxState st = self._driver_state(seed)
        cdef Tx *t = &st.t
        cdef int64_t k, key, op, prev, cur, nxt, inserted = 0, removed = 0, found = 0
        cdef int rc, result
        self._active += 1
        try:
            with nogil:
                for k in range(n):
                    key = rlx_rand_below(&t.rng, <uint32_t>U)
                    op = rlx_rand_below(&t.rng, 200)
                    op = 1 if op < upd else (2 if op < 2 * upd else 0)   # 1 insert, 2 remove
                    while True:
                        tx_begin(t)
                        result = 0
                        prev = U
                        rc = tx_read(t, U, &cur)
                        while rc == TX_OK and cur != -1 and cur < key:
                            prev = cur
                            rc = tx_read(t, cur, &cur)
                        if rc == TX_OK:
                            if op == 1 and cur != key:
                                tx_write(t, key, cur)
                                tx_write(t, prev, key)
                                result = 1
                            elif op == 2 and cur == key:
                                rc = tx_read(t, key, &nxt)
                                if rc == TX_OK:
                                    tx_write(t, prev, nxt)
                                    tx_write(t, key, -1)
                                    result = 1
                            elif op == 0 and cur == key:
                                result = 1
                        if rc == TX_OK:
                            rc = tx_commit(t)
                        else:
                            t.aborts += 1
                        if rc == TX_OK:
                            if op == 1:
                                inserted += result
                            elif op == 2:
                                removed += result
                            else:
                                found += result
                            break
                        if rc == TX_NOMEM:
                            break
        finally:
            self._active -= 1
            st.release()
        return _counts(t) | {"inserted": int(inserted), "removed": int(removed),
                             "found": int(found)}

    def __repr__(self):
        if self._base == NULL:
            return "<TL2 closed>"
        return (f"<TL2 n_words={self.m.n_words} clock={self.clock!r} "
                f"conflict={getattr(self._policy, 'name', self._policy)!r} "
                f"shared={self.shared} name={self.name!r}>")


cdef dict _counts(Tx *t):
    return {"commits": int(t.commits), "aborts": int(t.aborts), "waits": int(t.waits)}


cdef int commit_maybe_crash(Tx *t, bint crash, bint locking) noexcept nogil:
    """tx_commit, but with ``crash`` kill the process mid-commit: between the redo
    log and the end of the write-back, or (``locking``) holding one stripe."""
    if not crash:
        return tx_commit(t)
    return _commit_and_die(t, locking)


cdef int _commit_and_die(Tx *t, bint locking) noexcept nogil:
    cdef Mem *m = t.m
    cdef Slot *sl = slot_at(m, t.slot)
    cdef int64_t *ll = lock_log(m, t.slot)
    cdef int64_t *rl = redo_log(m, t.slot)
    cdef int64_t k, s, l, mine = lockval(t.slot)
    sl.n_locked = 0
    rlx_store_release_i32(&sl.state, ST_LOCKING)
    for k in range(t.nw):
        s = stripe_of(m, t.widx[k])
        while True:
            l = rlx_load_acquire_i64(&m.stripes[s])
            if l & 1:
                rlx_cpu_relax()
                continue
            ll[2 * sl.n_locked] = s
            ll[2 * sl.n_locked + 1] = l >> 1
            rlx_release_fence()
            if rlx_cas_acqrel_i64(&m.stripes[s], l, mine):
                sl.n_locked += 1
                break
        if locking:
            rlx_crash_point()                               # armed: SIGKILL here
    sl.wv = clock_advance(m, &t.rng)
    for k in range(t.nw):
        rl[2 * k] = t.widx[k]
        rl[2 * k + 1] = t.wval[k]
    sl.n_writes = t.nw
    rlx_release_fence()
    rlx_store_release_i32(&sl.state, ST_WRITING)
    rlx_store_relaxed_i64(&m.words[t.widx[0]], t.wval[0])   # half of the write-back
    rlx_crash_point()                                       # armed: SIGKILL here
    return TX_ABORT


cdef class _TxBlock:
    cdef TL2 stm
    cdef _TxState st
    cdef Transaction tx
    cdef bint entered

    def __init__(self, TL2 stm):
        self.stm = stm

    def __enter__(self):
        self.stm._check_open()
        self.st = self.stm._state()
        self.stm._enter(self.st)
        self.entered = True
        tx_begin(&self.st.t)
        self.tx = Transaction.__new__(Transaction)
        self.tx.stm = self.stm
        self.tx.st = self.st
        self.tx.live = True
        return self.tx

    def abort(self):
        if self.tx is not None and self.tx.live:
            self.st.t.aborts += 1
        self._finish()

    def commit(self):
        cdef int rc
        if not self.tx.live:
            self._finish()
            raise TransactionAborted("the transaction was aborted")
        self.stm._check_open()
        with nogil:
            rc = tx_commit(&self.st.t)
        self._finish()
        if rc != TX_OK:
            raise TransactionAborted("commit-time validation failed or a stripe stayed locked")

    cdef _finish(self):
        if self.tx is not None:
            self.tx.live = False
        if self.entered:
            self.entered = False
            self.stm._leave(self.st)

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
            return False
        self.abort()
        return False
