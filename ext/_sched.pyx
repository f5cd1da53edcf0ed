# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, embedsignature=True
"""Relaxed priority schedulers and the nogil greedy MIS / matching engines: the
scheduler engine below, and the prefix engine (no queue; its own section at the
end of this file) that greedy_mis and greedy_matching use by default.

Alistarh, Brown, Kopinsky, Nadiradze, "Relaxed Schedulers Can Efficiently
Parallelize Iterative Algorithms" (PODC 2018). A scheduler holds tasks (int64
ids) with int64 priorities, smaller first. Three kinds share one C layout:

* MultiQueue: ``n_queues`` sequential queues, each a sorted *run* of the
  initial tasks (a cursor, so a pop from it costs no heap operation) beside a
  binary heap for tasks pushed later, guarded by a test-and-test-and-set lock
  in its own cache line with its top priority cached. A pop compares the cached
  tops of two distinct random queues and takes the better one (Rihani, Sanders,
  Dementiev 2015); a pop that reports empty has scanned every queue.
* k-relaxed: one lock; a *window* holds the k highest-priority tasks and a pop
  returns one of them, uniformly at random or adversarially (the
  lowest-priority of the k), except that the highest-priority task is served
  after at most k - 1 pops have passed it over. k = 1 is the exact scheduler.

The engine (``_Run.work``) is the iterative framework of the paper for greedy
maximal independent set (tasks = vertices) and greedy maximal matching (tasks =
edges). A popped task whose higher-priority neighbours are not all decided is
*wasted* and pushed back; otherwise it is decided exactly as the sequential
greedy algorithm decides it. When a task joins the set, its undecided
neighbours are marked out at once (the paper's removal), and a popped task that
is already decided is *skipped*. States only go from undecided to in or out,
each by one writer value, so the answer is the sequential greedy answer for
every scheduler and thread count (proof in relaxed/greedy.py).

Intended races: the per-task state words are read and written with
relaxed/acquire/release atomics and no lock. Two threads may both mark one
vertex out (the same value). A thread may read a neighbour as undecided just
before another thread decides it; that only wastes the iteration (the task is
pushed back). A thread never overwrites *in*: only a lower-priority neighbour
of an *in* task is marked out, and such a task can never go in itself.
"""
from libc.stdint cimport uint64_t, int64_t, uint32_t, int32_t, uint8_t, INT64_MAX
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memset
from _common cimport *

import numpy as np

cdef extern from "stdlib.h" nogil:
    int posix_memalign(void **memptr, size_t alignment, size_t size)

ctypedef struct Task:
    int64_t key
    int64_t val

ctypedef struct SQueue:
    int32_t lock
    int32_t _pad
    int64_t top           # cached smallest key, INT64_MAX when empty
    Task *run             # this queue's sorted run (a slice of Sched.runs)
    int64_t run_pos
    int64_t run_end
    Task *heap            # binary min-heap of pushed tasks
    int64_t hsize
    int64_t hcap
    Task *window          # k-relaxed only: the k smallest tasks, unordered
    int64_t wsize
    int64_t min_key       # k-relaxed only: the smallest key, and how many pops
    int64_t min_age       #   have passed it over (the fairness rule)

cdef enum:
    KIND_MULTIQUEUE = 0
    KIND_KRELAXED = 1
    MODE_UNIFORM = 0
    MODE_ADVERSARIAL = 1
    # per-thread statistics slots
    ST_POPS = 0
    ST_DECIDED = 1
    ST_SKIPPED = 2
    ST_WASTED = 3
    ST_EMPTY = 4
    ST_IN = 5
    N_STATS = 8

ctypedef struct Sched:
    int kind
    int mode
    int64_t nq
    int64_t k
    int64_t stride        # bytes between queues (a cache line or more)
    char *queues
    Task *runs
    int64_t n_runs
    int32_t failed        # a heap allocation failed inside nogil code


cdef inline SQueue* Q(Sched *s, int64_t i) noexcept nogil:
    return <SQueue*>(s.queues + i * s.stride)


cdef inline void lock_q(SQueue *q) noexcept nogil:
    cdef int spins = 0
    while True:
        if rlx_load_relaxed_i32(&q.lock) == 0 and rlx_cas_acquire_i32(&q.lock, 0, 1):
            return
        rlx_cpu_relax()
        spins += 1
        if spins > 1024:
            rlx_yield()
            spins = 0


cdef inline bint try_lock_q(SQueue *q) noexcept nogil:
    return rlx_load_relaxed_i32(&q.lock) == 0 and rlx_cas_acquire_i32(&q.lock, 0, 1)


cdef inline void unlock_q(SQueue *q) noexcept nogil:
    rlx_store_release_i32(&q.lock, 0)


# ---- binary heap of Task ordered by key -----------------------------------

cdef inline int heap_push(SQueue *q, Task t) noexcept nogil:
    cdef int64_t i, p, cap
    cdef Task *h
    if q.hsize == q.hcap:
        cap = q.hcap * 2 if q.hcap else 64
        h = <Task*>realloc(q.heap, cap * sizeof(Task))
        if h == NULL:
            return -1
        q.heap = h
        q.hcap = cap
    h = q.heap
    i = q.hsize
    q.hsize += 1
    while i > 0:
        p = (i - 1) >> 1
        if h[p].key <= t.key:
            break
        h[i] = h[p]
        i = p
    h[i] = t
    return 0


cdef inline Task heap_pop(SQueue *q) noexcept nogil:
    cdef Task *h = q.heap
    cdef Task top = h[0]
    cdef Task last
    cdef int64_t n, i, c
    q.hsize -= 1
    n = q.hsize
    if n > 0:
        last = h[n]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            if c + 1 < n and h[c + 1].key < h[c].key:
                c += 1
            if h[c].key >= last.key:
                break
            h[i] = h[c]
            i = c
        h[i] = last
    return top


cdef inline int64_t rest_top(SQueue *q) noexcept nogil:
    """Smallest key in the run and heap (not the window)."""
    cdef int64_t t = INT64_MAX
    if q.run_pos < q.run_end:
        t = q.run[q.run_pos].key
    if q.hsize > 0 and q.heap[0].key < t:
        t = q.heap[0].key
    return t


cdef inline bint take_rest(SQueue *q, Task *out) noexcept nogil:
    """Remove the smallest task of the run and heap; False when both are empty."""
    cdef bint has_run = q.run_pos < q.run_end
    if q.hsize > 0 and (not has_run or q.heap[0].key < q.run[q.run_pos].key):
        out[0] = heap_pop(q)
        return True
    if has_run:
        out[0] = q.run[q.run_pos]
        q.run_pos += 1
        return True
    return False


# ---- MultiQueue -------------------------------------------------------------

cdef inline int64_t mq_take_locked(SQueue *q, Task *out, int64_t want) noexcept nogil:
    """Up to ``want`` smallest tasks of a locked queue; refreshes its cached top."""
    cdef int64_t got = 0
    while got < want and take_rest(q, out + got):
        got += 1
    rlx_store_relaxed_i64(&q.top, rest_top(q))
    return got


cdef int64_t mq_pop_many(Sched *s, uint64_t *rng, Task *out, int64_t want) noexcept nogil:
    """Up to ``want`` tasks from one queue under one lock; ``want`` > 1 is a
    deletion buffer (Williams, Sanders, Dementiev 2021). The queue is the one
    with the better cached top of two distinct random queues; the tasks come
    out in priority order. 0 means every queue was seen empty."""
    cdef uint32_t i, j
    cdef int64_t ti, tj, a, got
    cdef int empties = 0
    cdef SQueue *q
    if s.nq == 1:
        q = Q(s, 0)
        if rlx_load_relaxed_i64(&q.top) == INT64_MAX:
            return 0
        lock_q(q)
        got = mq_take_locked(q, out, want)
        unlock_q(q)
        return got
    while empties < 4:
        rlx_rand_pair(rng, <uint32_t>s.nq, &i, &j)
        ti = rlx_load_relaxed_i64(&Q(s, i).top)
        tj = rlx_load_relaxed_i64(&Q(s, j).top)
        if tj < ti:
            i = j
            ti = tj
        if ti == INT64_MAX:
            empties += 1
            continue
        q = Q(s, i)
        if try_lock_q(q):
            got = mq_take_locked(q, out, want)
            unlock_q(q)
            if got:
                return got
    # Both picks looked empty several times: scan every queue before saying so.
    for a in range(s.nq):
        q = Q(s, a)
        if rlx_load_relaxed_i64(&q.top) != INT64_MAX:
            lock_q(q)
            got = mq_take_locked(q, out, want)
            unlock_q(q)
            if got:
                return got
    return 0


cdef inline bint mq_pop(Sched *s, uint64_t *rng, Task *out) noexcept nogil:
    return mq_pop_many(s, rng, out, 1) != 0


cdef int mq_push(Sched *s, uint64_t *rng, Task t) noexcept nogil:
    cdef SQueue *q
    cdef int rc
    while True:
        q = Q(s, rlx_rand_below(rng, <uint32_t>s.nq) if s.nq > 1 else 0)
        if s.nq == 1:
            lock_q(q)
        elif not try_lock_q(q):
            continue
        rc = heap_push(q, t)
        if rc == 0 and t.key < q.top:
            rlx_store_relaxed_i64(&q.top, t.key)
        unlock_q(q)
        return rc


# ---- k-relaxed (one lock, a window of the k smallest) -----------------------

cdef inline void kr_refill(Sched *s, SQueue *q) noexcept nogil:
    cdef Task t
    while q.wsize < s.k and take_rest(q, &t):
        q.window[q.wsize] = t
        q.wsize += 1
    rlx_store_relaxed_i64(&q.top, 0 if q.wsize else INT64_MAX)


cdef bint kr_pop(Sched *s, uint64_t *rng, Task *out) noexcept nogil:
    # Rank rule: return one of the k smallest. Fairness rule (the paper's
    # k-relaxed model): the smallest task is returned after at most k - 1 other
    # pops, so an adversary cannot starve it (without it, an adversarial
    # scheduler could livelock the greedy algorithms on a blocked task).
    cdef SQueue *q = Q(s, 0)
    cdef int64_t idx, a, imin = 0, imax = 0
    if rlx_load_relaxed_i64(&q.top) == INT64_MAX:
        return False
    lock_q(q)
    if q.wsize == 0:
        unlock_q(q)
        return False
    for a in range(1, q.wsize):
        if q.window[a].key < q.window[imin].key:
            imin = a
        if q.window[a].key > q.window[imax].key:
            imax = a
    if q.window[imin].key != q.min_key:
        q.min_key = q.window[imin].key
        q.min_age = 0
    if q.min_age >= s.k - 1:
        idx = imin
    elif s.mode == MODE_ADVERSARIAL:
        idx = imax
    else:
        idx = rlx_rand_below(rng, <uint32_t>q.wsize)
    if idx == imin:
        q.min_key = INT64_MAX
        q.min_age = 0
    else:
        q.min_age += 1
    out[0] = q.window[idx]
    q.wsize -= 1
    q.window[idx] = q.window[q.wsize]
    kr_refill(s, q)
    unlock_q(q)
    return True


cdef int kr_push(Sched *s, Task t) noexcept nogil:
    # Invariant: every window key <= every run/heap key, and the window is full
    # whenever the run or the heap holds anything.
    cdef SQueue *q = Q(s, 0)
    cdef int64_t idx, a
    cdef int rc = 0
    lock_q(q)
    if q.wsize < s.k:
        q.window[q.wsize] = t
        q.wsize += 1
    else:
        idx = 0
        for a in range(1, q.wsize):
            if q.window[a].key > q.window[idx].key:
                idx = a
        if t.key < q.window[idx].key:
            rc = heap_push(q, q.window[idx])
            if rc == 0:
                q.window[idx] = t
        else:
            rc = heap_push(q, t)
    rlx_store_relaxed_i64(&q.top, 0)
    unlock_q(q)
    return rc


cdef inline bint sched_pop(Sched *s, uint64_t *rng, Task *out) noexcept nogil:
    if s.kind == KIND_MULTIQUEUE:
        return mq_pop(s, rng, out)
    return kr_pop(s, rng, out)


cdef inline int64_t sched_pop_many(Sched *s, uint64_t *rng, Task *out, int64_t want) noexcept nogil:
    if s.kind == KIND_MULTIQUEUE:
        return mq_pop_many(s, rng, out, want)
    return 1 if kr_pop(s, rng, out) else 0


cdef inline int sched_push(Sched *s, uint64_t *rng, Task t) noexcept nogil:
    if s.kind == KIND_MULTIQUEUE:
        return mq_push(s, rng, t)
    return kr_push(s, t)


cdef void sched_free(Sched *s) noexcept nogil:
    cdef int64_t i
    cdef SQueue *q
    if s.queues != NULL:
        for i in range(s.nq):
            q = Q(s, i)
            free(q.heap)
            free(q.window)
        free(s.queues)
        s.queues = NULL
    free(s.runs)
    s.runs = NULL


cdef class Scheduler:
    """Base of the compiled schedulers: the small protocol the algorithms use.

    ``push(task, priority)``, ``pop() -> (task, priority) | None``, ``len()``,
    ``load(priorities, tasks)`` (bulk, in any order; replaces the contents) and
    ``clear()``. Tasks and priorities are int64; a smaller priority is served
    first (relaxed for MultiQueue and k-relaxed schedulers). Python-level calls
    are for studies and tests; the algorithms run the same C code without the
    GIL. Use one of :class:`ExactScheduler`, :class:`MultiQueueScheduler`,
    :class:`KRelaxedScheduler`.
    """
    cdef Sched s
    cdef uint64_t rng
    cdef readonly int64_t seed
    cdef readonly int64_t batch
    cdef object _busy

    def __cinit__(self):
        memset(&self.s, 0, sizeof(Sched))
        self._busy = False
        self.batch = 1

    cdef _setup(self, int kind, int mode, int64_t nq, int64_t k, seed):
        cdef int64_t i
        cdef void *mem = NULL
        cdef SQueue *q
        if seed is None:
            seed = int.from_bytes(np.random.default_rng().bytes(7), "little")
        elif isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed: must be None or an int in [0, 2**63), got {seed!r}")
        elif not 0 <= seed < 2**63:
            raise ValueError(f"seed: must be None or an int in [0, 2**63), got {seed!r}")
        self.seed = int(seed)
        self.rng = rlx_mix64(<uint64_t>self.seed)
        self.s.kind = kind
        self.s.mode = mode
        self.s.nq = nq
        self.s.k = k
        self.s.stride = ((sizeof(SQueue) + rlx_cache_line() - 1) // rlx_cache_line()) * rlx_cache_line()
        if posix_memalign(&mem, rlx_cache_line(), self.s.stride * nq) != 0:
            raise MemoryError("cannot allocate the scheduler's queues")
        memset(mem, 0, self.s.stride * nq)
        self.s.queues = <char*>mem
        for i in range(nq):
            q = Q(&self.s, i)
            q.top = INT64_MAX
            q.min_key = INT64_MAX
            q.run = NULL
        if kind == KIND_KRELAXED:
            q = Q(&self.s, 0)
            q.window = <Task*>malloc(k * sizeof(Task))
            if q.window == NULL:
                raise MemoryError(f"cannot allocate a window of k={k} tasks")

    def __dealloc__(self):
        sched_free(&self.s)

    cdef _check_idle(self):
        if self._busy:
            raise RuntimeError("scheduler: an algorithm is running on it; "
                               "wait for it to finish before calling push/pop/load")

    def push(self, task, priority):
        """Insert ``task`` (int) with ``priority`` (int, smaller first)."""
        self._check_idle()
        cdef Task t
        t.val = _as_i64(task, "task")
        t.key = _as_i64(priority, "priority")
        if t.key == INT64_MAX:
            raise ValueError(f"priority: {INT64_MAX} (INT64_MAX) is reserved to mean "
                             "'empty'; use a smaller priority")
        if sched_push(&self.s, &self.rng, t) != 0:
            raise MemoryError("scheduler: out of memory growing a heap")

    def pop(self):
        """Remove and return ``(task, priority)`` of a high-priority task, or
        None when the scheduler is empty."""
        self._check_idle()
        cdef Task t
        if sched_pop(&self.s, &self.rng, &t):
            return (t.val, t.key)
        return None

    def __len__(self):
        cdef int64_t i, total = 0
        cdef SQueue *q
        for i in range(self.s.nq):
            q = Q(&self.s, i)
            total += q.run_end - q.run_pos + q.hsize + q.wsize
        return int(total)

    def clear(self):
        """Remove every task."""
        self._check_idle()
        cdef int64_t i
        cdef SQueue *q
        for i in range(self.s.nq):
            q = Q(&self.s, i)
            q.run = NULL
            q.run_pos = q.run_end = 0
            q.hsize = 0
            q.wsize = 0
            q.top = INT64_MAX
            q.min_key = INT64_MAX
        free(self.s.runs)
        self.s.runs = NULL
        self.s.n_runs = 0

    def load(self, priorities, tasks):
        """Replace the contents by ``tasks`` with ``priorities`` (int64 arrays
        of one length, any order). The tasks become sorted runs: one per queue
        of a MultiQueue (each task goes to a uniformly random queue, as a
        MultiQueue push would place it), so a pop from them needs no heap work.
        """
        self._check_idle()
        keys = _int64_array(priorities, "priorities")
        vals = _int64_array(tasks, "tasks")
        if keys.ndim != 1 or vals.shape != keys.shape:
            raise ValueError(f"load: priorities and tasks must be 1-D arrays of one length, "
                             f"got shapes {np.shape(priorities)} and {np.shape(tasks)}")
        if keys.size and keys.max() == INT64_MAX:
            raise ValueError("load: priority INT64_MAX is reserved to mean 'empty'")
        if keys.size > 1 and not np.all(keys[1:] >= keys[:-1]):
            order = np.argsort(keys, kind="stable")
            keys = keys[order]
            vals = vals[order]
        self._load_sorted(keys, vals)

    cdef _load_sorted(self, const int64_t[::1] keys, const int64_t[::1] vals):
        cdef int64_t n = keys.shape[0]
        self._load(&keys[0] if n else NULL, &vals[0] if n else NULL, NULL, n)

    def _load_order(self, const int32_t[::1] order):
        """Fast path of load for the algorithms: task order[r] has priority r."""
        self._check_idle()
        cdef int64_t n = order.shape[0]
        self._load(NULL, NULL, &order[0] if n else NULL, n)

    cdef _load(self, const int64_t *keys, const int64_t *vals, const int32_t *order, int64_t n):
        cdef int64_t i, nq = self.s.nq
        cdef int64_t *counts
        cdef int32_t *qid
        cdef Task *runs
        cdef SQueue *q
        self.clear()
        runs = <Task*>malloc((n if n else 1) * sizeof(Task))
        counts = <int64_t*>malloc((nq + 1) * sizeof(int64_t))
        qid = <int32_t*>malloc((n if n else 1) * sizeof(int32_t))
        if runs == NULL or counts == NULL or qid == NULL:
            free(runs); free(counts); free(qid)
            raise MemoryError(f"scheduler: cannot allocate runs for {n} tasks")
        with nogil:
            memset(counts, 0, (nq + 1) * sizeof(int64_t))
            if self.s.kind == KIND_MULTIQUEUE and nq > 1:
                for i in range(n):
                    qid[i] = <int32_t>rlx_rand_below(&self.rng, <uint32_t>nq)
                    counts[qid[i] + 1] += 1
            else:
                for i in range(n):
                    qid[i] = 0
                counts[1] = n
            for i in range(nq):
                counts[i + 1] += counts[i]
            for i in range(nq):
                q = Q(&self.s, i)
                q.run = runs + counts[i]
                q.run_pos = 0
                q.run_end = counts[i + 1] - counts[i]
            for i in range(n):         # stable: each run stays sorted
                if order != NULL:
                    runs[counts[qid[i]]].key = i
                    runs[counts[qid[i]]].val = order[i]
                else:
                    runs[counts[qid[i]]].key = keys[i]
                    runs[counts[qid[i]]].val = vals[i]
                counts[qid[i]] += 1
            for i in range(nq):
                q = Q(&self.s, i)
                rlx_store_relaxed_i64(&q.top, rest_top(q))
            if self.s.kind == KIND_KRELAXED:
                kr_refill(&self.s, Q(&self.s, 0))
        free(counts)
        free(qid)
        self.s.runs = runs
        self.s.n_runs = n


cdef int64_t _as_i64(x, name) except? -1:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(x).__name__} ({x!r})")
    if not (-(1 << 63) <= int(x) < (1 << 63)):
        raise ValueError(f"{name}: {x} does not fit in int64")
    return int(x)


def _check_count(x, name, lo, hi=None):
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(x).__name__} ({x!r})")
    if x < lo or (hi is not None and x > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}: must be {rng}, got {x}")
    return int(x)


cdef class ExactScheduler(Scheduler):
    """ExactScheduler(*, seed=None)

    A strict priority queue (one lock): pops always return the highest-priority
    task present. With several threads, tasks in flight can still be wasted.
    """
    def __init__(self, *, seed=None):
        self._setup(KIND_KRELAXED, MODE_UNIFORM, 1, 1, seed)

    def __repr__(self):
        return f"ExactScheduler(size={len(self)})"

    @property
    def name(self):
        return "exact"


cdef class MultiQueueScheduler(Scheduler):
    """MultiQueueScheduler(n_queues=8, *, batch=1, seed=None)

    A MultiQueue of ``n_queues`` locked sequential queues (sorted runs of the
    initial tasks plus binary heaps for pushed ones); a pop takes the better top
    of two distinct random queues. In the algorithms' engine, a thread takes up
    to ``batch`` tasks from the chosen queue under one lock (a deletion buffer,
    Williams, Sanders, Dementiev, "Engineering MultiQueues", 2021): fewer lock
    hand-offs and room to prefetch the tasks' data, for a little more
    relaxation. ``batch=1`` is the plain MultiQueue.

    >>> s = MultiQueueScheduler(4, seed=1)
    >>> s.load([3, 1, 2], [30, 10, 20])
    >>> sorted(s.pop()[0] for _ in range(3))
    [10, 20, 30]
    """
    def __init__(self, n_queues=8, *, batch=1, seed=None):
        n_queues = _check_count(n_queues, "n_queues", 1, 1 << 20)
        self.batch = _check_count(batch, "batch", 1, MAX_BATCH)
        self._setup(KIND_MULTIQUEUE, MODE_UNIFORM, n_queues, 0, seed)

    def __repr__(self):
        return (f"MultiQueueScheduler(n_queues={self.s.nq}, batch={self.batch}, "
                f"size={len(self)})")

    @property
    def n_queues(self):
        return int(self.s.nq)

    @property
    def name(self):
        return "multiqueue"


cdef class KRelaxedScheduler(Scheduler):
    """KRelaxedScheduler(k, *, mode="uniform", seed=None)

    Each pop returns one of the ``k`` highest-priority tasks present: uniformly
    at random (``mode="uniform"``) or the lowest-priority of them
    (``mode="adversarial"``); and the highest-priority task is returned after
    at most k - 1 other pops (fairness). These are the two conditions of a
    k-relaxed scheduler in Alistarh et al. (PODC 2018). k = 1 is exact.
    """
    def __init__(self, k, *, mode="uniform", seed=None):
        k = _check_count(k, "k", 1, 1 << 20)
        if mode not in ("uniform", "adversarial"):
            raise ValueError(f"mode: must be 'uniform' or 'adversarial', got {mode!r}")
        self._setup(KIND_KRELAXED, MODE_UNIFORM if mode == "uniform" else MODE_ADVERSARIAL,
                    1, k, seed)

    def __repr__(self):
        return f"KRelaxedScheduler(k={self.s.k}, mode={self.mode!r}, size={len(self)})"

    @property
    def k(self):
        return int(self.s.k)

    @property
    def mode(self):
        return "uniform" if self.s.mode == MODE_UNIFORM else "adversarial"

    @property
    def name(self):
        return "k-relaxed"


# ---- the engine ---------------------------------------------------------------
#
# One combined int32 word per task: its rank while undecided (>= 0), IN (-1)
# or OUT (-2). A neighbour test is then one load: IN means "I am out"; a rank
# below mine means "blocked". (A neighbour that is in always has a higher
# priority: it went in only after reading every higher-priority neighbour out.)

cdef enum:
    MAX_BATCH = 64
    EV_SKIP = 0
    EV_OUT = 1
    EV_IN = 2
    EV_BLOCKED = 3
    W_IN = -1
    W_OUT = -2

ctypedef struct Ctx:
    Sched *s
    int algo                 # 0 MIS, 1 matching
    int nthreads
    int64_t batch
    int64_t n_tasks
    const int64_t *indptr
    const int32_t *indices   # MIS: neighbours; matching: edge ids of the adjacency
    const int32_t *eu
    const int32_t *ev
    int32_t *word            # combined rank/state, one per task
    int64_t *mate
    int64_t *done            # per-thread finished counters, one cache line each
    int64_t dstride


cdef inline int mis_eval(Ctx *c, int64_t v, int64_t r) noexcept nogil:
    cdef int64_t a, lo, hi
    cdef int32_t w
    cdef bint blocked = False
    if rlx_load_relaxed_i32(&c.word[v]) < 0:
        return EV_SKIP
    lo = c.indptr[v]
    hi = c.indptr[v + 1]
    for a in range(lo, hi):
        w = rlx_load_acquire_i32(&c.word[c.indices[a]])
        if w == W_IN:
            rlx_store_release_i32(&c.word[v], W_OUT)
            return EV_OUT
        if 0 <= w < r:
            blocked = True
    if blocked:
        return EV_BLOCKED
    rlx_store_release_i32(&c.word[v], W_IN)
    for a in range(lo, hi):
        if rlx_load_relaxed_i32(&c.word[c.indices[a]]) >= 0:
            rlx_store_release_i32(&c.word[c.indices[a]], W_OUT)
    return EV_IN


cdef inline int scan_edges(Ctx *c, int64_t lo, int64_t hi, int64_t r) noexcept nogil:
    """0: every higher-priority edge is out; 1: one is undecided; 2: one is in.
    The edge itself holds its own rank r, which is not below r."""
    cdef int64_t a
    cdef int32_t w
    cdef int res = 0
    for a in range(lo, hi):
        w = rlx_load_acquire_i32(&c.word[c.indices[a]])
        if w == W_IN:
            return 2
        if 0 <= w < r:
            res = 1
    return res


cdef inline void mark_out(Ctx *c, int64_t lo, int64_t hi) noexcept nogil:
    cdef int64_t a
    for a in range(lo, hi):
        if rlx_load_relaxed_i32(&c.word[c.indices[a]]) >= 0:
            rlx_store_release_i32(&c.word[c.indices[a]], W_OUT)


cdef inline int matching_eval(Ctx *c, int64_t e, int64_t r) noexcept nogil:
    cdef int64_t u, v
    cdef int res, res2
    if rlx_load_relaxed_i32(&c.word[e]) < 0:
        return EV_SKIP
    u = c.eu[e]
    v = c.ev[e]
    # An endpoint already matched was matched by a higher-priority edge: an
    # edge g that is in had every higher-priority neighbour out, and this edge
    # is its neighbour and is not out, so g precedes it.
    if rlx_load_acquire_i64(&c.mate[u]) >= 0 or rlx_load_acquire_i64(&c.mate[v]) >= 0:
        rlx_store_release_i32(&c.word[e], W_OUT)
        return EV_OUT
    res = scan_edges(c, c.indptr[u], c.indptr[u + 1], r)
    if res != 2:
        res2 = scan_edges(c, c.indptr[v], c.indptr[v + 1], r)
        if res2 > res:
            res = res2
    if res == 2:
        rlx_store_release_i32(&c.word[e], W_OUT)
        return EV_OUT
    if res == 1:
        return EV_BLOCKED
    rlx_store_release_i32(&c.word[e], W_IN)
    rlx_store_release_i64(&c.mate[u], v)
    rlx_store_release_i64(&c.mate[v], u)
    mark_out(c, c.indptr[u], c.indptr[u + 1])
    mark_out(c, c.indptr[v], c.indptr[v + 1])
    return EV_IN


cdef inline bint all_done(Ctx *c) noexcept nogil:
    cdef int64_t total = 0
    cdef int t
    for t in range(c.nthreads):
        total += rlx_load_relaxed_i64(c.done + t * c.dstride)
    return total >= c.n_tasks


cdef void worker(Ctx *c, int tid, uint64_t rng, int64_t *st) noexcept nogil:
    cdef Task buf[MAX_BATCH]
    cdef int64_t nb, i, x, spins = 0
    cdef int64_t pops = 0, decided = 0, skipped = 0, wasted = 0, empty = 0, n_in = 0
    cdef int64_t *mydone = c.done + tid * c.dstride
    cdef int64_t finished = 0
    cdef int res
    cdef Sched *s = c.s
    while True:
        nb = sched_pop_many(s, &rng, buf, c.batch)
        if nb == 0:
            if all_done(c) or s.failed:
                break
            empty += 1
            spins += 1
            if spins > 64:
                rlx_yield()
                spins = 0
            else:
                rlx_cpu_relax()
            continue
        if nb > 1:
            for i in range(nb):
                x = buf[i].val
                rlx_prefetch(&c.word[x])
                if c.algo == 0:
                    rlx_prefetch(&c.indptr[x])
                else:
                    rlx_prefetch(&c.eu[x])
                    rlx_prefetch(&c.ev[x])
        for i in range(nb):
            pops += 1
            if c.algo == 0:
                res = mis_eval(c, buf[i].val, buf[i].key)
            else:
                res = matching_eval(c, buf[i].val, buf[i].key)
            if res == EV_BLOCKED:
                wasted += 1
                if sched_push(s, &rng, buf[i]) != 0:
                    s.failed = 1
                continue
            if res == EV_SKIP:
                skipped += 1
            else:
                decided += 1
                n_in += res == EV_IN
            finished += 1
        rlx_store_relaxed_i64(mydone, finished)
        if s.failed:
            break
    st[ST_POPS] = pops
    st[ST_DECIDED] = decided
    st[ST_SKIPPED] = skipped
    st[ST_WASTED] = wasted
    st[ST_EMPTY] = empty
    st[ST_IN] = n_in


STAT_NAMES = ("pops", "decided", "skipped", "wasted", "empty_pops", "in_set")


cdef class _Run:
    """One run of the engine over a scheduler. ``word`` is the combined
    rank/state array (int32, ranks on entry; -1 in, -2 out on exit). Threads
    call ``work(tid)``, which releases the GIL."""
    cdef Scheduler sched
    cdef Ctx c
    cdef object _keep
    cdef int64_t[:, ::1] stats
    cdef int64_t[::1] done
    cdef uint64_t seed

    def __init__(self, Scheduler sched, str algo, int nthreads, indptr, indices, word,
                 *, eu=None, ev=None, mate=None, seed=0):
        cdef const int64_t[::1] ip = indptr
        cdef const int32_t[::1] ix = indices
        cdef int32_t[::1] w = word
        cdef const int32_t[::1] a
        cdef const int32_t[::1] b
        cdef int64_t[::1] mt
        self.sched = sched
        self._keep = (indptr, indices, word, eu, ev, mate)
        memset(&self.c, 0, sizeof(Ctx))
        self.c.s = &sched.s
        self.c.algo = 0 if algo == "mis" else 1
        self.c.nthreads = nthreads
        self.c.batch = sched.batch if sched.s.kind == KIND_MULTIQUEUE else 1
        self.c.n_tasks = w.shape[0]
        self.c.indptr = &ip[0]
        self.c.indices = &ix[0] if ix.shape[0] else NULL
        self.c.word = &w[0] if w.shape[0] else NULL
        if self.c.algo == 1:
            a = eu
            b = ev
            mt = mate
            self.c.eu = &a[0]
            self.c.ev = &b[0]
            self.c.mate = &mt[0]
        self.stats = np.zeros((nthreads, N_STATS), dtype=np.int64)
        self.c.dstride = rlx_cache_line() // 8
        self.done = np.zeros(nthreads * self.c.dstride, dtype=np.int64)
        self.c.done = &self.done[0]
        self.seed = <uint64_t>seed

    def work(self, int tid):
        if not 0 <= tid < self.c.nthreads:
            raise ValueError(f"tid: must be in [0, {self.c.nthreads}), got {tid}")
        cdef uint64_t rng = rlx_mix64(self.seed ^ rlx_mix64(<uint64_t>(tid + 1)))
        cdef int64_t *st = &self.stats[tid, 0]
        with nogil:
            worker(&self.c, tid, rng, st)

    def set_busy(self, busy):
        self.sched._busy = bool(busy)

    @property
    def failed(self):
        return bool(self.sched.s.failed)

    def thread_stats(self):
        arr = np.asarray(self.stats)
        return [dict(zip(STAT_NAMES, map(int, row[:len(STAT_NAMES)]))) for row in arr]


# ---- the prefix engine --------------------------------------------------------
#
# No priority queue: tasks are served in rank order, a chunk of consecutive
# ranks at a time from one shared cursor. The idea is that of Blelloch,
# Fineman, Shun, "Greedy Sequential Maximal Independent Set and Matching are
# Parallel on Average" (SPAA 2012), and of the deterministic reservations of
# PBBS (Blelloch, Fineman, Gibbons, Shun, PPoPP 2012): work on a prefix of the
# order, decide what can be decided, keep the rest. Greedy in a random order has
# short dependence chains, so little is kept.
#
# Each thread publishes a lower bound of the ranks it holds undecided (its
# slot in PCtx.shared). While a thread holds nothing blocked and a rank lies
# below every other thread's bound, every smaller rank is decided, and the
# thread runs the sequential greedy step on it: on one thread always, on two
# threads for whichever thread is behind. A thread that is ahead decides what
# the states already settle (MIS: a neighbour in, or every higher-priority
# neighbour out; matching: an endpoint taken, which only a higher-priority edge
# can have done) and keeps the rest in a sorted pending list, which it tries
# again before its next chunk once another thread's bound has moved. A thread
# whose pending list is full takes no new chunk until it drains. Progress: the
# undecided task of smallest rank sits in a chunk being served or in a pending
# list that its thread retries, and whoever holds it can decide it.
#
# The bounds. A thread publishes the cursor before it takes a chunk (acq-rel
# fetch_add), the chunk's start once it has it, its smallest pending rank after
# each pass, and INT64_MAX when it holds nothing. A thread reads the others'
# bounds (acquire) after taking its chunk and again whenever the cached minimum
# stops it, so it sees, for each chunk taken before its own, a bound at or below
# it; a thread holding nothing takes only later chunks, which lie above every
# chunk already taken. Release stores of the bounds come after the states they
# cover, so a thread that reads a bound above r also sees every decision below r.
#
# Intended races: as in the relaxed engine above. MIS state bytes are read and
# written with relaxed/acquire/release atomics and no lock; two threads may both
# mark a vertex out; a stale read of "undecided" only keeps a task for later.
# Matching's taken flags are written only by the sequential step, which runs for
# one rank at a time in rank order across all threads (every smaller rank is
# decided), so no two threads ever write the same flag.

cdef enum:
    S_IN = 255               # MIS state bytes; 0..S_MAX_BUCKET mean undecided
    S_OUT = 254
    S_MAX_BUCKET = 253
    PF_DIST = 32             # prefetch distance in the rank order
    SLOT_CURSOR = 0          # slots of PCtx.shared, one cache line each
    SLOT_THREAD = 1          # + thread id: the thread's published lower bound

ctypedef struct PCtx:
    Ctx base                 # graph; mate (matching)
    int64_t chunk            # ranks a thread takes at once
    const int32_t *order     # order[r] is the task of rank r
    const int32_t *rank      # MIS: rank[v], read only to break a bucket tie
    uint8_t *state           # MIS: S_IN, S_OUT or the rank's bucket; matching: 1 = taken
    int shift                # MIS: bucket of rank r is r >> shift (at most S_MAX_BUCKET)
    const int32_t *ends      # matching: endpoints, ends[2e], ends[2e + 1]
    int64_t *shared
    int64_t stride           # int64s per cache line


cdef inline int64_t *pslot(PCtx *c, int64_t i) noexcept nogil:
    return c.shared + i * c.stride


cdef inline void count_eval(int res, int64_t *st) noexcept nogil:
    st[ST_POPS] += 1
    if res == EV_BLOCKED:
        st[ST_WASTED] += 1
    elif res == EV_SKIP:
        st[ST_SKIPPED] += 1
    else:
        st[ST_DECIDED] += 1
        st[ST_IN] += res == EV_IN


# -- MIS on one state byte per vertex: a quarter of the int32 words' footprint,
# so the random reads stay in cache as in the sequential loop. An undecided byte
# holds the bucket r >> shift of the vertex's rank; only a neighbour in the same
# bucket needs its full rank read.

cdef inline int mis_take(PCtx *c, int64_t v) noexcept nogil:
    """The sequential step (every higher-priority vertex is decided): still
    undecided means no neighbour is in, so v goes in."""
    cdef int64_t a
    cdef uint8_t *st8 = c.state
    if rlx_load_relaxed_u8(&st8[v]) >= S_OUT:
        return EV_SKIP
    rlx_store_release_u8(&st8[v], S_IN)
    for a in range(c.base.indptr[v], c.base.indptr[v + 1]):
        if rlx_load_relaxed_u8(&st8[c.base.indices[a]]) < S_OUT:
            rlx_store_release_u8(&st8[c.base.indices[a]], S_OUT)
    return EV_IN


cdef inline int mis_look(PCtx *c, int64_t v, int64_t r) noexcept nogil:
    """Ahead of the others: out if a neighbour is in, in if every
    higher-priority neighbour is out, blocked otherwise (the rule of mis_eval)."""
    cdef int64_t a, lo, hi, u
    cdef uint8_t w, mine = <uint8_t>(r >> c.shift)
    cdef bint blocked = False
    cdef uint8_t *st8 = c.state
    if rlx_load_relaxed_u8(&st8[v]) >= S_OUT:
        return EV_SKIP
    lo = c.base.indptr[v]
    hi = c.base.indptr[v + 1]
    for a in range(lo, hi):
        u = c.base.indices[a]
        w = rlx_load_acquire_u8(&st8[u])
        if w == S_IN:
            rlx_store_release_u8(&st8[v], S_OUT)
            return EV_OUT
        if w < mine or (w == mine and c.rank[u] < r):
            blocked = True
    if blocked:
        return EV_BLOCKED
    rlx_store_release_u8(&st8[v], S_IN)
    for a in range(lo, hi):
        u = c.base.indices[a]
        if rlx_load_relaxed_u8(&st8[u]) < S_OUT:
            rlx_store_release_u8(&st8[u], S_OUT)
    return EV_IN


# -- matching: one taken byte per vertex beside mate.

cdef inline int match_step(PCtx *c, int64_t r, bint seq) noexcept nogil:
    """Out if an endpoint is taken; otherwise in (sequential step) or blocked."""
    cdef int64_t e = c.order[r]
    cdef int32_t u = c.ends[2 * e], v = c.ends[2 * e + 1]
    if rlx_load_acquire_u8(&c.state[u]) or rlx_load_acquire_u8(&c.state[v]):
        return EV_OUT
    if not seq:
        return EV_BLOCKED
    c.base.mate[u] = v
    c.base.mate[v] = u
    rlx_store_release_u8(&c.state[u], 1)
    rlx_store_release_u8(&c.state[v], 1)
    return EV_IN


cdef inline int prefix_eval(PCtx *c, int64_t r, bint seq) noexcept nogil:
    if c.base.algo == 0:
        if seq:
            return mis_take(c, c.order[r])
        return mis_look(c, c.order[r], r)
    return match_step(c, r, seq)


cdef inline int64_t others_low(PCtx *c, int tid) noexcept nogil:
    cdef int64_t t, x, low = INT64_MAX
    for t in range(c.base.nthreads):
        if t != tid:
            x = rlx_load_acquire_i64(pslot(c, SLOT_THREAD + t))
            if x < low:
                low = x
    return low


cdef inline bint below(PCtx *c, int tid, int64_t r, int64_t *others) noexcept nogil:
    """Is every other thread's bound above r? Refreshes the cached minimum."""
    if r < others[0]:
        return True
    others[0] = others_low(c, tid)
    return r < others[0]


cdef inline void prefetch_ahead(PCtx *c, int64_t r, int64_t hi) noexcept nogil:
    """A three-stage software pipeline over the ranks to come, so that the
    random reads of task r + PF_DIST / 4 are in cache when it is served: its
    state byte (MIS) or endpoints (matching) PF_DIST ahead; then, for an MIS
    vertex still undecided, its CSR offsets, and its neighbour list a quarter
    of the way. (Matching stops at the endpoints: the taken bytes sit in cache,
    and reading endpoints not yet arrived would stall.)"""
    cdef int64_t x, a
    if r + PF_DIST < hi:
        x = c.order[r + PF_DIST]
        if c.base.algo == 0:
            rlx_prefetch(&c.state[x])
        else:
            rlx_prefetch(&c.ends[2 * x])
    if c.base.algo == 0 and r + PF_DIST // 2 < hi:
        x = c.order[r + PF_DIST // 2]
        if rlx_load_relaxed_u8(&c.state[x]) < S_OUT:
            rlx_prefetch(&c.base.indptr[x])
    if c.base.algo == 0 and r + PF_DIST // 4 < hi:
        x = c.order[r + PF_DIST // 4]
        if rlx_load_relaxed_u8(&c.state[x]) < S_OUT:
            a = c.base.indptr[x]
            rlx_prefetch(&c.base.indices[a])
            rlx_prefetch(&c.base.indices[a + 16])


cdef int64_t serve(PCtx *c, int tid, int64_t lo, int64_t hi, int32_t *pend, int64_t npend,
                   int64_t *others, int64_t *st) noexcept nogil:
    """Serve ranks lo..hi-1 of a new chunk; kept ones are appended to pend."""
    cdef int64_t r
    cdef int res
    for r in range(lo, hi):
        prefetch_ahead(c, r, hi)
        res = prefix_eval(c, r, npend == 0 and below(c, tid, r, others))
        count_eval(res, st)
        if res == EV_BLOCKED:
            pend[npend] = <int32_t>r
            npend += 1
    return npend


cdef int64_t retry(PCtx *c, int tid, int32_t *pend, int64_t npend, int64_t *others,
                   int64_t *st) noexcept nogil:
    """Serve the pending ranks again, in order; returns how many stay kept.
    Matching stops at the first rank it cannot step: a look ahead only finds
    edges with a taken endpoint, which the sequential step skips as cheaply."""
    cdef int64_t k, kept = 0
    cdef int res
    cdef bint seq
    for k in range(npend):
        seq = kept == 0 and below(c, tid, pend[k], others)
        if not seq and c.base.algo == 1:
            if kept == 0 and k == 0:
                return npend
            while k < npend:
                pend[kept] = pend[k]
                kept += 1
                k += 1
            return kept
        res = prefix_eval(c, pend[k], seq)
        count_eval(res, st)
        if res == EV_BLOCKED:
            pend[kept] = pend[k]
            kept += 1
    return kept


cdef void prefix_worker(PCtx *c, int tid, int32_t *pend, int64_t cap, int64_t *st) noexcept nogil:
    # The pending list is served again only after another thread's bound has
    # moved since the last pass: until then its ranks stay blocked (a rank
    # whose blockers were all this thread's own was settled in that pass), and
    # a thread running ahead of a descheduled one would look at them over and
    # over. `seen` is the minimum bound at the last pass over all the pending
    # ranks (-2: some were kept since, unchecked against any bound).
    cdef int64_t n = c.base.n_tasks, lo, npend = 0, before, others = -1, seen = -2, now
    cdef int64_t *low = pslot(c, SLOT_THREAD + tid)
    cdef int64_t *cursor = pslot(c, SLOT_CURSOR)
    cdef bint exhausted = False, progress
    cdef int64_t spins
    while True:
        before = npend
        if npend:
            now = others_low(c, tid)
            if now != seen:
                seen = now
                others = now
                npend = retry(c, tid, pend, npend, &others, st)
        progress = npend < before
        rlx_store_release_i64(low, pend[0] if npend else INT64_MAX)
        if not exhausted and npend + c.chunk <= cap:
            if npend == 0:
                rlx_store_release_i64(low, rlx_load_relaxed_i64(cursor))
            lo = rlx_fetch_add_acqrel_i64(cursor, c.chunk)
            if lo >= n:
                exhausted = True
                rlx_store_release_i64(low, pend[0] if npend else INT64_MAX)
            else:
                if npend == 0:
                    rlx_store_release_i64(low, lo)
                others = others_low(c, tid)
                npend = serve(c, tid, lo, min(lo + c.chunk, n), pend, npend, &others, st)
                # the ranks just kept were never served against `seen`: the next
                # pass must retry them even if no bound moves (a bound that will
                # never move again: a finished thread's INT64_MAX, which `seen`
                # may hold from a pass that read another thread's bound while it
                # was between chunks)
                seen = -2
                progress = True
        if exhausted and npend == 0:
            rlx_store_release_i64(low, INT64_MAX)
            return
        if progress:
            continue
        # Everything held waits on other threads: sleep until a bound moves
        # from `seen`. A thread that waits has published its exact smallest
        # rank, so the holder of the smallest undecided rank always sees a
        # change (and MIS's look decides that rank at once).
        st[ST_EMPTY] += 1
        spins = 0
        while others_low(c, tid) == seen:
            spins += 1
            if spins > 64:
                rlx_yield()
            else:
                rlx_cpu_relax()


cdef class _PrefixRun:
    """One run of the prefix engine. ``order[r]`` is the task of rank r.
    MIS: ``rank`` (int32) and ``state`` (uint8, each rank's bucket on entry,
    see ``_mis_buckets``; 255 in, 254 out on exit). Matching: ``ends`` the
    (m, 2) int32 endpoints, ``mate`` int64 filled with -1 and ``state`` uint8
    zeros (1 = taken on exit). Threads call ``work(tid)``, which releases the
    GIL."""
    cdef PCtx c
    cdef object _keep
    cdef int64_t[:, ::1] stats
    cdef int64_t[::1] shared
    cdef int32_t[:, ::1] buf
    cdef int64_t cap
    cdef readonly int64_t chunk

    def __init__(self, str algo, int nthreads, int64_t chunk, order, indptr, indices, state, *,
                 rank=None, int shift=0, ends=None, mate=None):
        cdef const int32_t[::1] od = order
        cdef const int64_t[::1] ip = indptr
        cdef const int32_t[::1] ix = indices
        cdef uint8_t[::1] sb = state
        cdef const int32_t[::1] rk
        cdef const int32_t[:, ::1] en
        cdef int64_t[::1] mt
        cdef int i
        if nthreads < 1 or chunk < 1:
            raise ValueError(f"_PrefixRun: need nthreads >= 1 and chunk >= 1, got {nthreads}, {chunk}")
        self._keep = (order, indptr, indices, state, rank, ends, mate)
        memset(&self.c, 0, sizeof(PCtx))
        self.c.base.algo = 0 if algo == "mis" else 1
        self.c.base.nthreads = nthreads
        self.c.base.n_tasks = od.shape[0]
        self.c.base.indptr = &ip[0]
        self.c.base.indices = &ix[0] if ix.shape[0] else NULL
        self.c.order = &od[0] if od.shape[0] else NULL
        self.c.state = &sb[0] if sb.shape[0] else NULL
        self.chunk = chunk
        self.c.chunk = chunk
        if self.c.base.algo == 0:
            rk = rank
            if rk.shape[0] != od.shape[0] or sb.shape[0] != od.shape[0]:
                raise ValueError("_PrefixRun: rank, state and order differ in length")
            if od.shape[0] and ((od.shape[0] - 1) >> shift) > S_MAX_BUCKET:
                raise ValueError(f"_PrefixRun: shift {shift} leaves buckets above {S_MAX_BUCKET}")
            self.c.rank = &rk[0] if rk.shape[0] else NULL
            self.c.shift = shift
        else:
            en = ends
            mt = mate
            if en.shape[0] != od.shape[0] or en.shape[1] != 2 or sb.shape[0] != mt.shape[0]:
                raise ValueError("_PrefixRun: ends, order, mate and state do not fit together")
            self.c.ends = &en[0, 0] if en.shape[0] else NULL
            self.c.base.mate = &mt[0] if mt.shape[0] else NULL
        self.cap = 8 * chunk                    # pending ranks per thread
        self.buf = np.empty((nthreads, self.cap), dtype=np.int32)
        self.stats = np.zeros((nthreads, N_STATS), dtype=np.int64)
        self.c.stride = rlx_cache_line() // 8
        self.shared = np.zeros((SLOT_THREAD + nthreads) * self.c.stride, dtype=np.int64)
        self.c.shared = &self.shared[0]
        for i in range(nthreads):               # no thread holds a rank yet
            self.shared[(SLOT_THREAD + i) * self.c.stride] = INT64_MAX

    def work(self, int tid):
        if not 0 <= tid < self.c.base.nthreads:
            raise ValueError(f"tid: must be in [0, {self.c.base.nthreads}), got {tid}")
        cdef int64_t *st = &self.stats[tid, 0]
        if self.c.base.n_tasks == 0:
            return
        with nogil:
            prefix_worker(&self.c, tid, &self.buf[tid, 0], self.cap, st)

    def set_busy(self, busy):
        pass

    @property
    def failed(self):
        return False

    def thread_stats(self):
        arr = np.asarray(self.stats)
        return [dict(zip(STAT_NAMES, map(int, row[:len(STAT_NAMES)]))) for row in arr]

    def _check(self):
        """Assert the engine's invariants after a run: every MIS vertex decided;
        matching's taken flags equal mate >= 0; every thread's bound released
        and the cursor past the end. Raises AssertionError naming the offender."""
        cdef int64_t i, n = self.c.base.n_tasks
        if self.c.base.algo == 0:
            for i in range(n):
                if self.c.state[i] < S_OUT:
                    raise AssertionError(f"prefix engine: vertex {i} left undecided "
                                         f"(state {self.c.state[i]})")
        else:
            for i in range((<object>self._keep[6]).shape[0]):
                if (self.c.state[i] != 0) != (self.c.base.mate[i] >= 0):
                    raise AssertionError(f"prefix engine: vertex {i} has taken flag "
                                         f"{self.c.state[i]} but mate {self.c.base.mate[i]}")
        for i in range(self.c.base.nthreads):
            if self.shared[(SLOT_THREAD + i) * self.c.stride] != INT64_MAX:
                raise AssertionError(f"prefix engine: thread {i} still publishes a held rank")
        if n and self.shared[SLOT_CURSOR * self.c.stride] < n:
            raise AssertionError("prefix engine: the cursor stopped before the last rank")


ctypedef fused index_t:
    int32_t
    int64_t


cdef bint _scatter(const index_t *p, int32_t *order, int64_t lo, int64_t hi,
                   int64_t n) noexcept nogil:
    cdef int64_t v, x
    for v in range(lo, hi):
        x = p[v]
        if x < 0 or x >= n:
            return False
        rlx_store_relaxed_i32(&order[x], <int32_t>v)     # duplicates may race: any value
    return True


def _perm_scatter(const index_t[::1] p, int32_t[::1] order, int64_t lo, int64_t hi):
    """order[p[v]] = v for v in lo..hi-1 (nogil; threads take disjoint slices).
    False as soon as a value lies outside 0..n-1. Part of _perm_order."""
    cdef int64_t n = order.shape[0]
    cdef bint ok
    if p.shape[0] != n or not 0 <= lo <= hi <= n:
        raise ValueError("_perm_scatter: p, order and the slice do not fit together")
    with nogil:
        ok = _scatter(&p[0] if n else NULL, &order[0] if n else NULL, lo, hi, n)
    return bool(ok)


def _all_set(const int32_t[::1] order):
    """True when no entry of ``order`` is -1 (nogil). n values in 0..n-1 that
    reach every slot are a permutation, so this finishes _perm_order."""
    cdef int64_t i, n = order.shape[0]
    cdef bint ok = True
    with nogil:
        for i in range(n):
            if order[i] < 0:
                ok = False
                break
    return bool(ok)


def _mis_buckets(const int32_t[::1] rank):
    """(state, shift) for the MIS prefix engine: state[v] = rank[v] >> shift,
    uint8, with the smallest shift that keeps every bucket <= S_MAX_BUCKET."""
    cdef int64_t n = rank.shape[0], v
    cdef int shift = 0
    while n and ((n - 1) >> shift) > S_MAX_BUCKET:
        shift += 1
    state = np.empty(n, dtype=np.uint8)
    cdef uint8_t[::1] sb = state
    with nogil:
        for v in range(n):
            sb[v] = <uint8_t>(rank[v] >> shift)
    return state, shift


# ---- random priorities -------------------------------------------------------------
#
# A uniformly random permutation by scattering into buckets: every item goes to
# an independent uniformly random bucket (a counting pass, then a scatter pass
# that draws the same stream again), then each bucket is shuffled in place by
# Fisher-Yates. Concatenated uniformly shuffled buckets of i.i.d. uniform
# bucket choices are a uniform permutation (Sanders, "Random permutations on
# distributed, external and hierarchical memory", IPL 1998). With buckets of
# about 4096 items the scatter writes to a few thousand streams and each
# shuffle runs in the L1 cache, where a plain Fisher-Yates over tens of
# megabytes waits on memory at every step. Draws are wyrand with Lemire's
# reduction (bias below 2^-32 per draw).

cdef int _bucket_shuffle(int32_t *order, int64_t n, uint64_t seed) noexcept nogil:
    cdef int64_t i, j, k, lo, hi
    cdef uint32_t nb = <uint32_t>max(1, n >> 12), b
    cdef int64_t *pos = <int64_t*>malloc((nb + 1) * sizeof(int64_t))
    cdef uint64_t st
    cdef int32_t tmp
    if pos == NULL:
        return -1
    memset(pos, 0, (nb + 1) * sizeof(int64_t))
    st = rlx_mix64(seed)
    for i in range(n):
        pos[rlx_rand_below(&st, nb) + 1] += 1
    for b in range(nb):
        pos[b + 1] += pos[b]
    st = rlx_mix64(seed)                          # the same stream again: scatter
    for i in range(n):
        b = rlx_rand_below(&st, nb)
        order[pos[b]] = <int32_t>i
        pos[b] += 1
    st = rlx_mix64(seed ^ 0x5bd1e995)
    lo = 0
    for b in range(nb):                           # pos[b] is now the end of bucket b
        hi = pos[b]
        j = hi - 1
        while j > lo:
            k = lo + rlx_rand_below(&st, <uint32_t>(j - lo + 1))
            tmp = order[j]
            order[j] = order[k]
            order[k] = tmp
            j -= 1
        lo = hi
    free(pos)
    return 0


def _random_order(int64_t n, uint64_t seed):
    """A uniformly random permutation of 0..n-1 as int32, from ``seed`` (nogil)."""
    if not 0 <= n < (1 << 31):
        raise ValueError(f"_random_order: n must be in [0, 2**31), got {n}")
    order = np.empty(n, dtype=np.int32)
    cdef int32_t[::1] o = order
    cdef int rc = 0
    if n:
        with nogil:
            rc = _bucket_shuffle(&o[0], n, seed)
    if rc:
        raise MemoryError("_random_order: cannot allocate the bucket counters")
    return order


def _inverse(const int32_t[::1] order):
    """rank with rank[order[r]] = r, int32 (nogil); ``order`` must be a permutation."""
    cdef int64_t r, n = order.shape[0]
    rank = np.empty(n, dtype=np.int32)
    cdef int32_t[::1] rk = rank
    with nogil:
        for r in range(n):
            rk[order[r]] = <int32_t>r
    return rank


def _int64_array(x, name):
    """``x`` as a C-contiguous int64 array, refused (not cast) where that would change a
    value: floats (truncated, NaN to INT64_MIN) and uint64 values past INT64_MAX."""
    a = np.asarray(x)
    if a.size == 0:
        return np.zeros(a.shape, dtype=np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"load: {name} must hold integers (int64), got dtype {a.dtype}; "
                        f"round them yourself (e.g. np.rint(x).astype(np.int64))")
    if a.dtype.kind == "u" and a.max() > INT64_MAX:
        raise ValueError(f"load: {name} holds {a.max()}, past int64's largest {INT64_MAX}")
    return np.ascontiguousarray(a, dtype=np.int64)
