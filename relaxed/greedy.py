"""Greedy maximal independent set and maximal matching, in parallel, with exactly
the sequential greedy answer.

Two kinds of engine. The default, ``scheduler="prefix"``, walks the priority
order a chunk at a time on every thread: a thread runs the sequential step on
a rank once every smaller rank is decided, and a thread ahead of the others
decides what the states settle and keeps the rest (after Blelloch, Fineman,
Shun, "Greedy Sequential Maximal Independent Set and Matching are Parallel on
Average", SPAA 2012, and PBBS's deterministic reservations; the protocol and
its proof are in ext/_sched.pyx). The others pop tasks from a relaxed priority
scheduler, as follows.

Alistarh, Brown, Kopinsky, Nadiradze, "Relaxed Schedulers Can Efficiently
Parallelize Iterative Algorithms" (PODC 2018): run an iterative greedy
algorithm by popping tasks from a relaxed priority scheduler; a task whose
higher-priority neighbours are not all decided is *wasted* and pushed back.
The answer is exactly the sequential greedy answer for the same priorities,
and the expected number of wasted iterations depends on the relaxation k (a
polynomial in k), not on the size of the graph.

Example::

    import relaxed
    from relaxed.graphs import erdos_renyi
    g = erdos_renyi(100_000, 1_000_000, seed=1)
    res = relaxed.greedy_mis(g, seed=7, n_threads=2)            # prefix engine
    res.mask.sum(), res.stats.wasted
    ref = relaxed.greedy_mis(g, seed=7, scheduler="exact")
    assert (res.mask == ref.mask).all()

Priorities: ``priorities[v]`` is vertex v's rank, smaller first (any distinct
integers or finite floats; ``None`` draws a random permutation from ``seed``).
For matching, tasks are edges: ``priorities[e]`` ranks edge ``graph.edges[e]``
of ``relaxed.graphs.as_graph(graph)`` (edges (u, v) with u < v in
lexicographic order).

Why the answer is the sequential one (for MIS; matching is the same on the
line graph). Each vertex state goes once from undecided to *in* or *out*.
A popped undecided vertex v is decided *out* if a higher-priority neighbour is
in, *in* if every higher-priority neighbour is out, and pushed back otherwise.
When v goes in, its undecided neighbours are marked out (all of them have
lower priority: the higher ones are out). By induction on priority, every
decision agrees with the sequential greedy algorithm: a vertex goes in only
after reading the final state *out* of every higher-priority neighbour, and
marks only vertices that the sequential algorithm also excludes. No lock
protects the states: concurrent writers write the same value, and a stale read
of *undecided* only wastes an iteration.
"""
from __future__ import annotations

import operator
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from relaxed._sched import (ExactScheduler, KRelaxedScheduler, MultiQueueScheduler,
                            Scheduler, _PrefixRun, _Run, _all_set, _inverse, _mis_buckets,
                            _perm_scatter, _random_order, STAT_NAMES)
from relaxed.graphs import as_graph

__all__ = ["greedy_mis", "greedy_matching", "sequential_greedy_mis",
           "sequential_greedy_matching", "check_mis", "check_matching", "make_scheduler",
           "MISResult", "MatchingResult", "SchedulerStats"]

SCHEDULERS = ("prefix", "multiqueue", "exact", "k-relaxed")
DEFAULT_BATCH = 8
DEFAULT_CHUNK = 256                # prefix engine: consecutive ranks a thread takes at once
MAX_CHUNK = 1 << 16


@dataclass
class SchedulerStats:
    """What a run cost. ``iterations`` counts every pop; ``wasted`` the pops of
    tasks pushed back because a higher-priority neighbour was undecided;
    ``skipped`` the pops of tasks already decided out by a neighbour;
    ``extra_iterations`` = iterations - tasks = wasted."""
    scheduler: str
    n_threads: int
    tasks: int
    iterations: int
    wasted: int
    skipped: int
    decided: int
    empty_pops: int
    seconds: float
    per_thread: list = field(default_factory=list)

    @property
    def extra_iterations(self) -> int:
        return self.iterations - self.tasks

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("scheduler", "n_threads", "tasks", "iterations",
                                           "wasted", "skipped", "decided", "empty_pops",
                                           "seconds")}
        d["per_thread"] = [dict(p) for p in self.per_thread]
        return d


@dataclass
class MISResult:
    """``mask[v]`` is True for vertices in the independent set."""
    mask: np.ndarray
    stats: SchedulerStats

    @property
    def vertices(self) -> np.ndarray:
        return np.flatnonzero(self.mask)

    def __repr__(self):
        return (f"MISResult(size={int(self.mask.sum())} of {self.mask.size}, "
                f"scheduler={self.stats.scheduler!r}, wasted={self.stats.wasted})")


@dataclass
class MatchingResult:
    """``mate[v]`` is v's partner, -1 when v is unmatched."""
    mate: np.ndarray
    stats: SchedulerStats

    @property
    def pairs(self) -> np.ndarray:
        """Matched edges as an (k, 2) array with u < v."""
        u = np.flatnonzero(self.mate > np.arange(self.mate.size))
        return np.stack([u, self.mate[u]], axis=1)

    def __repr__(self):
        return (f"MatchingResult(edges={int((self.mate >= 0).sum()) // 2}, "
                f"scheduler={self.stats.scheduler!r}, wasted={self.stats.wasted})")


# ---- priorities ------------------------------------------------------------------

def _perm_order(p, n_threads=1):
    """order (int32) with order[p[v]] = v when ``p`` (int32 or int64) is a
    permutation of 0..n-1, else None. A scatter on n_threads threads and a scan
    for holes, no sort: n values in 0..n-1 that reach every slot are distinct."""
    order = np.full(p.shape[0], -1, np.int32)
    n_threads = max(1, min(n_threads, p.shape[0] // 100_000))
    cuts = np.linspace(0, p.shape[0], n_threads + 1).astype(np.int64)
    ok = [False] * n_threads

    def part(t):
        ok[t] = _perm_scatter(p, order, int(cuts[t]), int(cuts[t + 1]))
    threads = [threading.Thread(target=part, args=(t,)) for t in range(1, n_threads)]
    for th in threads:
        th.start()
    part(0)
    for th in threads:
        th.join()
    return order if all(ok) and _all_set(order) else None


def _ranks(priorities, size: int, what: str, rng, need_rank=True, n_threads=1):
    """(rank, order): rank[t] in 0..size-1, order[r] = task of rank r, int32.
    With need_rank=False, rank is None when it would cost a pass to make."""
    if priorities is None:
        order = _random_order(size, int(rng.integers(0, 1 << 63)))
        return (_inverse(order) if need_rank else None), order
    p = np.asarray(priorities)
    if p.dtype == bool or p.dtype.kind not in "iuf":
        raise TypeError(f"priorities: expected integers or floats, got dtype {p.dtype}")
    if p.ndim != 1 or p.shape[0] != size:
        raise ValueError(f"priorities: expected one value per {what} (a 1-D array of length "
                         f"{size}), got shape {p.shape}")
    if p.dtype.kind == "f" and not np.isfinite(p).all():
        bad = int(np.flatnonzero(~np.isfinite(p))[0])
        raise ValueError(f"priorities: must be finite; {what} {bad} has {p[bad]}")
    if p.dtype.kind in "iu" and size:
        q = np.ascontiguousarray(p if p.dtype in (np.int32, np.int64) else p.astype(np.int64))
        order = _perm_order(q, n_threads)
        if order is not None:                       # a permutation of 0..size-1
            return (np.ascontiguousarray(p, dtype=np.int32) if need_rank else None), order
    order = np.argsort(p, kind="stable")
    sp = p[order]
    dup = np.flatnonzero(sp[1:] == sp[:-1])
    if dup.size:
        i = int(dup[0])
        raise ValueError(f"priorities: must be distinct; {what}s {int(order[i])} and "
                         f"{int(order[i + 1])} share priority {sp[i]}. Break ties, e.g. "
                         "with scipy.stats.rankdata(p, method='ordinal') - 1")
    rank = np.empty(size, np.int32)
    rank[order] = np.arange(size, dtype=np.int32)
    return rank, order.astype(np.int32)


# ---- schedulers -------------------------------------------------------------------

class PrefixEngine:
    """The ``"prefix"`` engine's settings: no scheduler object, the tasks are
    served in rank order a chunk at a time (see
    ``ext/_sched.pyx``). ``chunk``: consecutive ranks a thread takes at once
    (None: the default, 256)."""
    name = "prefix"

    def __init__(self, chunk=None):
        if chunk is not None:
            if isinstance(chunk, (bool, np.bool_)) or not isinstance(chunk, (int, np.integer)):
                raise TypeError(f"chunk: expected an int, got {type(chunk).__name__}")
            if not 1 <= chunk <= MAX_CHUNK:
                raise ValueError(f"chunk: must be in [1, {MAX_CHUNK}], got {chunk}; the default "
                                 f"is {DEFAULT_CHUNK}")
            chunk = int(chunk)
        self.chunk = chunk

    def __len__(self):
        return 0

    def __repr__(self):
        return f"PrefixEngine(chunk={self.chunk})"


def make_scheduler(scheduler="multiqueue", *, n_threads=1, seed=None, **options):
    """A compiled scheduler from its name and options.

    ``"prefix"``: ``chunk`` (a :class:`PrefixEngine`: no queue, ranks served in
    order). ``"exact"``: no options. ``"multiqueue"``: ``n_queues`` (default
    ``max(4, 4 * n_threads)``) and ``batch`` (tasks a thread takes from one
    queue at once, default 8; 1 is the plain MultiQueue). ``"k-relaxed"``: ``k`` (required) and ``mode``
    (``"uniform"`` or ``"adversarial"``).
    """
    if not isinstance(scheduler, str):
        raise TypeError(f"scheduler: expected one of {SCHEDULERS} or a scheduler object, "
                        f"got {type(scheduler).__name__}")
    allowed = {"exact": set(), "multiqueue": {"n_queues", "batch"}, "k-relaxed": {"k", "mode"},
               "prefix": {"chunk"}}
    if scheduler not in allowed:
        raise ValueError(f"scheduler: must be one of {SCHEDULERS}, got {scheduler!r}")
    extra = set(options) - allowed[scheduler]
    if extra:
        owners = sorted(k for k, v in allowed.items() if v & extra)
        hint = f"; pass scheduler={owners[0]!r} to use them" if owners else ""
        raise TypeError(f"scheduler {scheduler!r} takes options {sorted(allowed[scheduler]) or 'none'}, "
                        f"got unexpected {sorted(extra)}{hint}")
    if scheduler == "prefix":
        return PrefixEngine(options.get("chunk"))
    if scheduler == "exact":
        return ExactScheduler(seed=seed)
    if scheduler == "multiqueue":
        return MultiQueueScheduler(options.get("n_queues", max(4, 4 * n_threads)),
                                   batch=options.get("batch", DEFAULT_BATCH), seed=seed)
    if "k" not in options:
        raise TypeError("scheduler 'k-relaxed' needs the option k, e.g. "
                        "greedy_mis(g, scheduler='k-relaxed', k=8)")
    return KRelaxedScheduler(options["k"], mode=options.get("mode", "uniform"), seed=seed)


def _check_threads(n_threads):
    if isinstance(n_threads, (bool, np.bool_)) or not isinstance(n_threads, (int, np.integer)):
        raise TypeError(f"n_threads: expected an int, got {type(n_threads).__name__}")
    if not 1 <= n_threads <= 1024:
        raise ValueError(f"n_threads: must be in [1, 1024], got {n_threads}")
    return int(n_threads)


def _seed_sequence(seed):
    """The SeedSequence of ``seed``: None (fresh entropy) or an int >= 0, the same seed
    giving the same priorities in the parallel and the sequential functions."""
    if seed is not None and (isinstance(seed, (bool, np.bool_))
                             or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise (ValueError if isinstance(seed, (int, np.integer))
               and not isinstance(seed, (bool, np.bool_)) else TypeError)(
            f"seed: must be None or an int >= 0 (the priorities are drawn from it, the "
            f"same in greedy_* and sequential_greedy_*), got {seed!r}")
    return np.random.SeedSequence(None if seed is None else int(seed))


def _prepare(scheduler, n_threads, seed, options):
    n_threads = _check_threads(n_threads)
    ss = _seed_sequence(seed)
    prio_ss, sched_ss, run_ss = ss.spawn(3)
    sched_seed = int(sched_ss.generate_state(1, np.uint64)[0] >> np.uint64(1))
    run_seed = int(run_ss.generate_state(1, np.uint64)[0] >> np.uint64(1))
    if isinstance(scheduler, str):
        sched = make_scheduler(scheduler, n_threads=n_threads, seed=sched_seed, **options)
    elif isinstance(scheduler, PrefixEngine):
        if options:
            raise TypeError(f"scheduler options {sorted(options)} only apply to a scheduler "
                            "given by name")
        sched = scheduler
    else:
        if options:
            raise TypeError(f"scheduler options {sorted(options)} only apply to a scheduler "
                            "given by name")
        if not (callable(getattr(scheduler, "push", None)) and callable(getattr(scheduler, "pop", None))):
            raise TypeError("scheduler: expected a name or an object with push(task, priority) "
                            f"and pop() methods, got {type(scheduler).__name__}")
        if len(scheduler):
            raise ValueError("scheduler: must be empty; it holds "
                             f"{len(scheduler)} tasks. Call clear() or make a new one")
        if not isinstance(scheduler, Scheduler) and n_threads != 1:
            raise ValueError("n_threads: a Python-level scheduler object runs on one thread; "
                             "pass n_threads=1 or a compiled scheduler")
        sched = scheduler
    return n_threads, sched, np.random.default_rng(prio_ss), run_seed


def _sched_name(sched):
    return getattr(sched, "name", type(sched).__name__)


def _execute(run, sched, n_threads, n_tasks, t0):
    """Run ``run.work(tid)`` on n_threads threads (the caller's thread is one
    of them) and gather the counters."""
    run.set_busy(True)
    try:
        if n_threads == 1:
            run.work(0)
        else:
            threads = [threading.Thread(target=run.work, args=(t,), name=f"greedy-{t}")
                       for t in range(1, n_threads)]
            for th in threads:
                th.start()
            try:
                run.work(0)
            finally:
                for th in threads:
                    th.join()
    finally:
        run.set_busy(False)
    seconds = time.perf_counter() - t0
    if run.failed:
        raise MemoryError("greedy: a scheduler heap could not grow (out of memory)")
    per = run.thread_stats()
    tot = {k: sum(p[k] for p in per) for k in STAT_NAMES}
    return SchedulerStats(_sched_name(sched), n_threads, n_tasks, tot["pops"], tot["wasted"],
                          tot["skipped"], tot["decided"], tot["empty_pops"], seconds, per)


def _empty_stats(sched, n_threads):
    return SchedulerStats(_sched_name(sched), n_threads, 0, 0, 0, 0, 0, 0, 0.0,
                          [dict.fromkeys(STAT_NAMES, 0) for _ in range(n_threads)])


def _python_loop(sched, n_tasks, order, process, t0):
    """The same framework over any object with push/pop (one thread, Python speed)."""
    if hasattr(sched, "load"):
        sched.load(np.arange(n_tasks, dtype=np.int64), order.astype(np.int64))
    else:
        for r in range(n_tasks):
            sched.push(int(order[r]), r)
    c = dict.fromkeys(STAT_NAMES, 0)
    held = np.ones(n_tasks, bool)          # pushed and not popped since: each task once
    while True:
        item = sched.pop()
        if item is None:
            break
        task, prio = _popped(sched, item, held, order)
        c["pops"] += 1
        verdict = process(task, prio)
        if verdict == "skip":
            c["skipped"] += 1
        elif verdict == "wasted":
            c["wasted"] += 1
            held[task] = True
            sched.push(task, prio)
        else:
            c["decided"] += 1
            c["in_set"] += verdict == "in"
    done = c["decided"] + c["skipped"]
    if done != n_tasks:
        raise RuntimeError(f"scheduler {_sched_name(sched)}: pop() returned None with "
                           f"{n_tasks - done} tasks never served; it lost tasks")
    return SchedulerStats(_sched_name(sched), 1, n_tasks, c["pops"], c["wasted"], c["skipped"],
                          c["decided"], 0, time.perf_counter() - t0, [c])


def _popped(sched, item, held, order):
    """(task, priority) of what a Python-level scheduler's pop() returned, checked: a
    pair of ints, a task it holds (not one it returned already: a duplicate would be
    decided twice), and the priority it was pushed with (a wrong one gives a wrong set)."""
    try:
        task, prio = (operator.index(x) for x in item)
    except (TypeError, ValueError):
        raise RuntimeError(f"scheduler {_sched_name(sched)}: pop() must return None or a "
                           f"(task, priority) pair of ints, got {item!r}") from None
    if not 0 <= task < held.size or not held[task]:
        raise RuntimeError(f"scheduler {_sched_name(sched)}: pop() returned task {task}, which "
                           "it does not hold (never pushed, or returned twice): a scheduler "
                           "returns each push once")
    if not 0 <= prio < held.size or order[prio] != task:
        raise RuntimeError(f"scheduler {_sched_name(sched)}: pop() returned task {task} with "
                           f"priority {prio}, not the priority it was pushed with")
    held[task] = False
    return task, prio


# ---- MIS ---------------------------------------------------------------------------

def greedy_mis(graph, priorities=None, *, scheduler="prefix", n_threads=1, seed=None,
               **scheduler_options) -> MISResult:
    """Greedy maximal independent set on ``n_threads`` threads: the prefix
    engine or a relaxed scheduler.

    Parameters
    ----------
    graph : Graph, scipy.sparse matrix, (k, 2) edge array, networkx graph or a path
        (see :func:`relaxed.graphs.as_graph`); undirected and simple.
    priorities : array of n distinct numbers, optional
        ``priorities[v]`` is v's rank, smaller first. Default: a random
        permutation drawn from ``seed``.
    scheduler : "prefix" | "multiqueue" | "exact" | "k-relaxed" | scheduler object
        ``"prefix"`` (the default, the fastest): no queue, ranks served in
        order a chunk at a time. The others pop tasks from a relaxed priority
        scheduler. Options go in ``scheduler_options``
        (``chunk``; ``n_queues``, ``batch``; ``k``, ``mode``). An object with
        ``push(task, priority)``/``pop()`` runs in Python.
    n_threads : int
        Threads, in nogil C code.
    seed : int, optional
        Seeds the priorities (when not given) and the schedulers' choices.
        The set itself never depends on the scheduler or the threads.

    Returns
    -------
    MISResult with ``.mask`` and ``.stats`` (:class:`SchedulerStats`).
    """
    g = as_graph(graph)
    n_threads, sched, prng, run_seed = _prepare(scheduler, n_threads, seed, scheduler_options)
    rank, order = _ranks(priorities, g.n, "vertex", prng, n_threads=n_threads)
    t0 = time.perf_counter()
    if isinstance(sched, PrefixEngine):
        return _prefix_mis(g, rank, order, sched, n_threads, t0)[0]
    if not isinstance(sched, Scheduler):
        state = np.zeros(g.n, np.uint8)
        stats = _python_loop(sched, g.n, order, _mis_step(g, rank, state), t0)
        return MISResult(state == 1, stats)
    word = rank.copy()                       # rank while undecided, -1 in, -2 out
    if g.n == 0:
        stats = _empty_stats(sched, n_threads)
    else:
        sched._load_order(order)
        run = _Run(sched, "mis", n_threads, g.indptr, g.indices, word, seed=run_seed)
        stats = _execute(run, sched, n_threads, g.n, t0)
    return MISResult(word == -1, stats)


def _prefix_mis(g, rank, order, engine, n_threads, t0):
    """(MISResult, run) of the prefix engine; the run's _check() asserts its invariants."""
    state, shift = _mis_buckets(rank)        # rank >> shift while undecided, 254 out, 255 in
    run = _PrefixRun("mis", n_threads, engine.chunk or DEFAULT_CHUNK, order, g.indptr, g.indices,
                     state, rank=rank, shift=shift)
    stats = _execute(run, engine, n_threads, g.n, t0)
    return MISResult(state == 255, stats), run


def _mis_step(g, rank, state):
    indptr, indices = g.indptr, g.indices

    def process(v, r):
        if state[v]:
            return "skip"
        nb = indices[indptr[v]:indptr[v + 1]]
        higher = state[nb[rank[nb] < r]]
        if (higher == 1).any():
            state[v] = 2
            return "out"
        if (higher == 0).any():
            return "wasted"
        state[v] = 1
        state[nb[state[nb] == 0]] = 2
        return "in"
    return process


# ---- matching ------------------------------------------------------------------------

def greedy_matching(graph, priorities=None, *, scheduler="prefix", n_threads=1, seed=None,
                    **scheduler_options) -> MatchingResult:
    """Greedy maximal matching on ``n_threads`` threads: the prefix engine or
    a relaxed scheduler.

    Tasks are edges; ``priorities[e]`` ranks edge ``as_graph(graph).edges[e]``
    (u < v, lexicographic), smaller first; default a random permutation from
    ``seed``. Other parameters as :func:`greedy_mis`. Returns a
    :class:`MatchingResult` with ``.mate`` (int64, -1 for unmatched) and
    ``.stats``; the matching equals the sequential greedy one that scans edges
    in priority order.
    """
    g = as_graph(graph)
    n_threads, sched, prng, run_seed = _prepare(scheduler, n_threads, seed, scheduler_options)
    prefix = isinstance(sched, PrefixEngine)
    rank, order = _ranks(priorities, g.m, "edge", prng, need_rank=not prefix, n_threads=n_threads)
    mate = np.full(g.n, -1, np.int64)
    t0 = time.perf_counter()
    if prefix:
        return _prefix_matching(g, order, mate, sched, n_threads, t0)[0]
    edges = g.edges
    eu = np.ascontiguousarray(edges[:, 0], dtype=np.int32)
    ev = np.ascontiguousarray(edges[:, 1], dtype=np.int32)
    if not isinstance(sched, Scheduler):
        estate = np.zeros(g.m, np.uint8)
        stats = _python_loop(sched, g.m, order, _matching_step(g, eu, ev, rank, estate, mate), t0)
    elif g.m == 0:
        stats = _empty_stats(sched, n_threads)
    else:
        sched._load_order(order)
        run = _Run(sched, "matching", n_threads, g.indptr, g.edge_ids, rank.copy(),
                   eu=eu, ev=ev, mate=mate, seed=run_seed)
        stats = _execute(run, sched, n_threads, g.m, t0)
    return MatchingResult(mate, stats)


def _prefix_matching(g, order, mate, engine, n_threads, t0):
    """(MatchingResult, run) of the prefix engine; ``mate`` is filled in."""
    taken = np.zeros(g.n, np.uint8)
    run = _PrefixRun("matching", n_threads, engine.chunk or DEFAULT_CHUNK, order, g.indptr,
                     g.indices, taken, ends=np.ascontiguousarray(g.edges, dtype=np.int32), mate=mate)
    stats = _execute(run, engine, n_threads, g.m, t0)
    return MatchingResult(mate, stats), run


def _matching_step(g, eu, ev, rank, estate, mate):
    indptr, eids = g.indptr, g.edge_ids

    def process(e, r):
        if estate[e]:
            return "skip"
        u, v = int(eu[e]), int(ev[e])
        if mate[u] >= 0 or mate[v] >= 0:
            estate[e] = 2
            return "out"
        adj = np.concatenate([eids[indptr[u]:indptr[u + 1]], eids[indptr[v]:indptr[v + 1]]])
        adj = adj[(adj != e) & (rank[adj] < r)]
        if (estate[adj] == 1).any():
            estate[e] = 2
            return "out"
        if (estate[adj] == 0).any():
            return "wasted"
        estate[e] = 1
        mate[u], mate[v] = v, u
        for w in (u, v):
            nb = eids[indptr[w]:indptr[w + 1]]
            estate[nb[estate[nb] == 0]] = 2
        return "in"
    return process


# ---- sequential baselines and checkers ----------------------------------------------

@njit(cache=True, nogil=True)
def _seq_mis(indptr, indices, order):
    n = order.shape[0]
    state = np.zeros(n, np.uint8)
    for i in range(n):
        v = order[i]
        if state[v] == 0:
            state[v] = 1
            for a in range(indptr[v], indptr[v + 1]):
                u = indices[a]
                if state[u] == 0:
                    state[u] = 2
    return state == 1


@njit(cache=True, nogil=True)
def _seq_matching(eu, ev, order, n):
    mate = np.full(n, -1, np.int64)
    for i in range(order.shape[0]):
        e = order[i]
        u = eu[e]
        v = ev[e]
        if mate[u] < 0 and mate[v] < 0:
            mate[u] = v
            mate[v] = u
    return mate


def sequential_greedy_mis(graph, priorities=None, *, seed=None) -> np.ndarray:
    """The sequential greedy MIS (Numba): visit vertices in priority order, take
    each one that has no neighbour taken. Returns the mask. With the same
    ``seed`` (or priorities) it equals :func:`greedy_mis`'s answer."""
    g = as_graph(graph)
    prio_ss = _seed_sequence(seed).spawn(3)[0]
    _, order = _ranks(priorities, g.n, "vertex", np.random.default_rng(prio_ss), need_rank=False)
    return _seq_mis(g.indptr, g.indices, order)


def sequential_greedy_matching(graph, priorities=None, *, seed=None) -> np.ndarray:
    """The sequential greedy matching (Numba): scan edges in priority order,
    take each whose endpoints are both free. Returns ``mate``."""
    g = as_graph(graph)
    prio_ss = _seed_sequence(seed).spawn(3)[0]
    _, order = _ranks(priorities, g.m, "edge", np.random.default_rng(prio_ss), need_rank=False)
    edges = g.edges
    return _seq_matching(np.ascontiguousarray(edges[:, 0]), np.ascontiguousarray(edges[:, 1]),
                         order, g.n)


def check_mis(graph, mask) -> None:
    """Raise AssertionError unless ``mask`` is an independent and maximal set."""
    g = as_graph(graph)
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != (g.n,):
        raise ValueError(f"mask: expected shape ({g.n},), got {mask.shape}")
    rows = np.repeat(np.arange(g.n), np.diff(g.indptr))
    both = mask[rows] & mask[g.indices]
    if both.any():
        k = int(np.flatnonzero(both)[0])
        raise AssertionError(f"not independent: edge ({rows[k]}, {g.indices[k]}) has both ends in")
    covered = mask.copy()
    covered[g.indices[mask[rows]]] = True
    if not covered.all():
        raise AssertionError(f"not maximal: vertex {int(np.flatnonzero(~covered)[0])} and all its "
                             "neighbours are out")


def check_matching(graph, mate) -> None:
    """Raise AssertionError unless ``mate`` is a valid maximal matching of graph."""
    g = as_graph(graph)
    mate = np.asarray(mate)
    if mate.shape != (g.n,):
        raise ValueError(f"mate: expected shape ({g.n},), got {mate.shape}")
    if mate.size and mate.dtype.kind not in "iu":
        raise TypeError(f"mate: expected integer partners (-1: unmatched), got dtype "
                        f"{mate.dtype}")
    if mate.size and mate.max() >= g.n:
        raise AssertionError(f"mate names vertex {int(mate.max())}, past the graph's "
                             f"{g.n} vertices")
    m = np.flatnonzero(mate >= 0)
    if (mate[mate[m]] != m).any():
        raise AssertionError("mate is not symmetric")
    if m.size:
        adj = g.to_scipy()
        if not np.all(np.asarray(adj[m, mate[m]]).ravel()):
            raise AssertionError("a matched pair is not an edge")
    e = g.edges
    free = (mate[e[:, 0]] < 0) & (mate[e[:, 1]] < 0)
    if free.any():
        k = int(np.flatnonzero(free)[0])
        raise AssertionError(f"not maximal: edge ({e[k, 0]}, {e[k, 1]}) has both ends free")
