"""Greedy MIS and matching under relaxed schedulers equal the sequential greedy
answer of an independent pure-Python implementation (tests/naive.py)."""
import bisect
import heapq
import pickle

import numpy as np
import pytest
import scipy.sparse as sp

import relaxed
from relaxed import ExactScheduler, KRelaxedScheduler, MultiQueueScheduler
from relaxed import greedy as greedy_mod
from relaxed.greedy import check_matching, check_mis
from tests.naive import NaivePQ, canonical_edges, greedy_matching_naive, greedy_mis_naive

SCHEDULERS = [
    ("prefix", {}),
    ("prefix", {"chunk": 1}),
    ("prefix", {"chunk": 5}),
    ("exact", {}),
    ("multiqueue", {"n_queues": 1}),
    ("multiqueue", {}),
    ("multiqueue", {"n_queues": 16}),
    ("k-relaxed", {"k": 1}),
    ("k-relaxed", {"k": 8}),
    ("k-relaxed", {"k": 32, "mode": "adversarial"}),
]
IDS = [f"{s}{o}" for s, o in SCHEDULERS]


def random_edges(n, m, seed):
    rng = np.random.default_rng(seed)
    u = rng.integers(0, n, m)
    v = rng.integers(0, n, m)
    return [(int(a), int(b)) for a, b in zip(u, v) if a != b]


CASES = [(30, 60, 0), (200, 800, 1), (1000, 3000, 2), (2000, 20000, 3), (500, 0, 4)]


@pytest.fixture(scope="module", params=CASES, ids=[f"n{c[0]}m{c[1]}" for c in CASES])
def case(request):
    n, m, seed = request.param
    edges = random_edges(n, m, seed)
    canon = canonical_edges(edges)
    rng = np.random.default_rng(seed + 100)
    vprio = rng.permutation(n)
    eprio = rng.permutation(len(canon))
    mis = np.array(greedy_mis_naive(n, edges, vprio))
    mate = np.array(greedy_matching_naive(n, canon, eprio))
    arr = np.array(edges, dtype=np.int64).reshape(-1, 2)
    return dict(n=n, edges=arr, canon=canon, vprio=vprio, eprio=eprio, mis=mis, mate=mate)


def _check_stats(st, n_tasks, n_chosen, threads):
    """The engine's counters: every task decided or skipped exactly once, every pop
    accounted for (decided, skipped or wasted), per-thread counts adding up."""
    assert st.decided + st.skipped == n_tasks
    assert st.iterations == st.decided + st.skipped + st.wasted
    assert st.extra_iterations == st.wasted
    assert sum(p["pops"] for p in st.per_thread) == st.iterations
    assert len(st.per_thread) == threads
    assert sum(p["in_set"] for p in st.per_thread) == n_chosen


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("sched,opts", SCHEDULERS, ids=IDS)
def test_mis_equals_sequential_greedy(case, sched, opts, threads):
    g = relaxed.as_graph(case["edges"], n=case["n"])
    for seed in (0, 1):
        res = relaxed.greedy_mis(g, case["vprio"], scheduler=sched, n_threads=threads,
                                 seed=seed, **opts)
        np.testing.assert_array_equal(res.mask, case["mis"])
        check_mis(g, res.mask)
        _check_stats(res.stats, case["n"], case["mis"].sum(), threads)


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("sched,opts", SCHEDULERS, ids=IDS)
def test_matching_equals_sequential_greedy(case, sched, opts, threads):
    g = relaxed.as_graph(case["edges"], n=case["n"])
    assert [tuple(e) for e in g.edges.tolist()] == case["canon"]
    for seed in (0, 1):
        res = relaxed.greedy_matching(g, case["eprio"], scheduler=sched, n_threads=threads,
                                      seed=seed, **opts)
        np.testing.assert_array_equal(res.mate, case["mate"])
        check_matching(g, res.mate)
        _check_stats(res.stats, len(case["canon"]), (case["mate"] >= 0).sum() // 2, threads)


def test_exact_scheduler_on_one_thread_wastes_nothing(case):
    g = relaxed.as_graph(case["edges"], n=case["n"])
    st = relaxed.greedy_mis(g, case["vprio"], scheduler="exact").stats
    assert st.wasted == 0 and st.iterations == case["n"]
    st = relaxed.greedy_matching(g, case["eprio"], scheduler="exact").stats
    assert st.wasted == 0 and st.iterations == len(case["canon"])


def test_relaxed_schedulers_do_waste_work():
    g = relaxed.graphs.erdos_renyi(20_000, 100_000, seed=5)
    st = relaxed.greedy_mis(g, seed=1, scheduler="k-relaxed", k=64, mode="adversarial").stats
    assert st.wasted > 0
    st = relaxed.greedy_mis(g, seed=1, scheduler="multiqueue", n_queues=16).stats
    assert st.wasted > 0


def test_seeded_priorities_match_sequential_baseline():
    g = relaxed.graphs.erdos_renyi(5000, 20_000, seed=2)
    mask = relaxed.sequential_greedy_mis(g, seed=11)
    np.testing.assert_array_equal(relaxed.greedy_mis(g, seed=11, n_threads=2).mask, mask)
    mate = relaxed.sequential_greedy_matching(g, seed=11)
    np.testing.assert_array_equal(relaxed.greedy_matching(g, seed=11, n_threads=2).mate, mate)
    # and the Numba baselines agree with the naive oracle
    e = g.edges.tolist()
    pr = np.random.default_rng(3).permutation(g.n)
    assert relaxed.sequential_greedy_mis(g, pr).tolist() == greedy_mis_naive(g.n, e, pr)
    pe = np.random.default_rng(4).permutation(g.m)
    assert (relaxed.sequential_greedy_matching(g, pe).tolist()
            == greedy_matching_naive(g.n, [tuple(x) for x in e], pe))


def test_priorities_any_distinct_numbers():
    edges = random_edges(300, 1500, 9)
    g = relaxed.as_graph(np.array(edges), n=300)
    rng = np.random.default_rng(0)
    p = rng.random(300) * 1e6 - 5e5                     # distinct floats, negative too
    assert relaxed.greedy_mis(g, p).mask.tolist() == greedy_mis_naive(300, edges, p)
    pi = (rng.permutation(300) * 7 - 1000).astype(np.int64)
    assert relaxed.greedy_mis(g, pi, n_threads=2).mask.tolist() == greedy_mis_naive(300, edges, pi)


def test_inputs_scipy_and_networkx_give_the_same_set():
    edges = random_edges(400, 2000, 12)
    canon = canonical_edges(edges)
    a = np.array(canon)
    A = sp.coo_matrix((np.ones(len(a)), (a[:, 0], a[:, 1])), shape=(400, 400))
    A = (A + A.T).tocsr()
    pr = np.random.default_rng(1).permutation(400)
    want = greedy_mis_naive(400, edges, pr)
    assert relaxed.greedy_mis(A, pr).mask.tolist() == want
    nx = pytest.importorskip("networkx")
    G = nx.Graph()
    G.add_nodes_from(range(400))
    G.add_edges_from(canon)
    assert relaxed.greedy_mis(G, pr, n_threads=2).mask.tolist() == want


class HeapScheduler:
    """A user-defined scheduler: only push/pop/len (the protocol)."""

    def __init__(self):
        self.h = []

    def push(self, task, priority):
        heapq.heappush(self.h, (priority, task))

    def pop(self):
        if not self.h:
            return None
        p, t = heapq.heappop(self.h)
        return t, p

    def __len__(self):
        return len(self.h)


def test_python_protocol_scheduler(case):
    g = relaxed.as_graph(case["edges"], n=case["n"])
    res = relaxed.greedy_mis(g, case["vprio"], scheduler=HeapScheduler())
    np.testing.assert_array_equal(res.mask, case["mis"])
    assert res.stats.wasted == 0
    res = relaxed.greedy_matching(g, case["eprio"], scheduler=HeapScheduler())
    np.testing.assert_array_equal(res.mate, case["mate"])
    # a compiled scheduler object goes through the Python loop's semantics too
    res = relaxed.greedy_mis(g, case["vprio"], scheduler=MultiQueueScheduler(8, seed=3),
                             n_threads=2)
    np.testing.assert_array_equal(res.mask, case["mis"])


class _Faulty(HeapScheduler):
    """A user scheduler with one fault: its pop() returns what ``fault`` makes of the
    item a heap would return (once, at the third pop)."""

    def __init__(self, fault):
        super().__init__()
        self.fault, self.pops = fault, 0

    def pop(self):
        item = super().pop()
        self.pops += 1
        if item is not None and self.pops == 3:
            item = self.fault(self, item)
        return item


def _again(s, item):
    s.push(item[0], item[1])                    # keeps a copy: the task comes back twice
    return item


@pytest.mark.parametrize("fault, match", [
    (_again, r"returned task \d+, which it does not hold \(never pushed, or returned twice"),
    (lambda s, item: (item[0], item[1] + 1), r"with priority \d+, not the priority it was "
                                             "pushed with"),
    (lambda s, item: (10**6, item[1]), r"returned task 1000000, which it does not hold"),
    (lambda s, item: (-1, item[1]), r"returned task -1, which it does not hold"),
    (lambda s, item: ("a", item[1]), r"must return None or a \(task, priority\) pair of ints, "
                                     r"got \('a'"),
    (lambda s, item: item[0], r"must return None or a \(task, priority\) pair"),
])
def test_python_scheduler_faults_are_named(fault, match):
    """A user scheduler that duplicates a task, changes its priority or returns no task
    is named (a duplicate was reported as "-1 tasks never served", a wrong priority
    gave a wrong set, task -1 decided the last vertex)."""
    g = relaxed.graphs.erdos_renyi(40, 80, seed=1)
    for run in (relaxed.greedy_mis, relaxed.greedy_matching):
        with pytest.raises(RuntimeError, match=r"scheduler _Faulty: pop\(\) .*" + match):
            run(g, seed=2, scheduler=_Faulty(fault))


class PyAdversarial:
    """k-relaxed, adversarial, in Python: pop the k-th best task present, but
    the best one after at most k - 1 pops have passed it over (fairness)."""

    def __init__(self, k):
        self.k, self.items = k, []
        self.min_key, self.age = None, 0

    def push(self, task, priority):
        bisect.insort(self.items, (priority, task))

    def pop(self):
        if not self.items:
            return None
        if self.items[0][0] != self.min_key:
            self.min_key, self.age = self.items[0][0], 0
        i = 0 if self.age >= self.k - 1 else min(self.k, len(self.items)) - 1
        if i == 0:
            self.min_key, self.age = None, 0
        else:
            self.age += 1
        p, t = self.items.pop(i)
        return t, p

    def __len__(self):
        return len(self.items)


def test_python_loop_and_engine_agree_on_waste():
    """The adversarial k-relaxed scheduler is deterministic, so the Python
    framework loop and the compiled engine must waste exactly as much."""
    g = relaxed.graphs.erdos_renyi(3000, 15_000, seed=4)
    a = relaxed.greedy_mis(g, seed=2, scheduler=PyAdversarial(4))
    b = relaxed.greedy_mis(g, seed=2, scheduler="k-relaxed", k=4, mode="adversarial")
    np.testing.assert_array_equal(a.mask, b.mask)
    assert a.stats.wasted == b.stats.wasted > 0
    assert a.stats.skipped == b.stats.skipped


# ---- the schedulers themselves --------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: ExactScheduler(seed=0),
                                  lambda: MultiQueueScheduler(8, seed=0),
                                  lambda: KRelaxedScheduler(5, seed=0),
                                  lambda: KRelaxedScheduler(5, mode="adversarial", seed=0)])
def test_scheduler_conserves_tasks(make):
    s = make()
    rng = np.random.default_rng(1)
    keys = rng.integers(-1000, 1000, 500)
    s.load(keys, np.arange(500))
    out = []
    for i in range(300):                      # mixed pushes and pops
        if i % 3 == 0:
            s.push(500 + i, int(rng.integers(-2000, 2000)))
        out.append(s.pop())
    assert len(s) == 500 + 100 - 300
    while (x := s.pop()) is not None:
        out.append(x)
    assert s.pop() is None and len(s) == 0
    assert sorted(t for t, _ in out) == list(range(500)) + [500 + i for i in range(0, 300, 3)]


def test_seeds_are_checked_by_name():
    """A seed that is not None or an int >= 0 is refused naming seed (numpy's words
    before, or a silent truncation of 1.5 in the compiled schedulers)."""
    from relaxed.graphs import erdos_renyi
    g = erdos_renyi(50, 100, seed=1)
    for bad, err in ((-1, ValueError), (1.5, TypeError), (True, TypeError), ("3", TypeError),
                     (np.random.default_rng(0), TypeError)):
        for fn in (relaxed.greedy_mis, relaxed.greedy_matching,
                   relaxed.sequential_greedy_mis, relaxed.sequential_greedy_matching):
            with pytest.raises(err, match="seed: must be None or an int >= 0"):
                fn(g, seed=bad)
    for make in (ExactScheduler, lambda **kw: MultiQueueScheduler(4, **kw),
                 lambda **kw: KRelaxedScheduler(4, **kw)):
        for bad, err in ((1.5, TypeError), ("7", TypeError), (2**64, ValueError),
                         (-1, ValueError)):
            with pytest.raises(err, match=r"seed: must be None or an int in \[0, 2\*\*63\)"):
                make(seed=bad)
    assert (relaxed.greedy_mis(g, seed=np.int64(5)).mask
            == relaxed.sequential_greedy_mis(g, seed=5)).all()


@pytest.mark.parametrize("make", [ExactScheduler, lambda: MultiQueueScheduler(4, seed=0),
                                  lambda: KRelaxedScheduler(4, seed=0)])
def test_load_refuses_priorities_it_would_change(make):
    """load() takes integer arrays as push() takes ints: float priorities were truncated
    (NaN became INT64_MIN, served first) and uint64 past INT64_MAX wrapped negative."""
    s = make()
    with pytest.raises(TypeError, match="load: priorities must hold integers"):
        s.load([0.9, 0.1, float("nan")], [1, 2, 3])
    with pytest.raises(TypeError, match="load: tasks must hold integers"):
        s.load([1, 2], [1.5, 2.0])
    with pytest.raises(ValueError, match="past int64's largest"):
        s.load(np.array([2**63], np.uint64), [1])
    s.load(np.array([3, 1, 2], np.uint32), np.array([30, 10, 20], np.int16))
    assert sorted(s.pop() for _ in range(3)) == [(10, 1), (20, 2), (30, 3)]
    s.load([], [])
    assert s.pop() is None


@pytest.mark.parametrize("k,mode", [(1, "uniform"), (6, "uniform"), (6, "adversarial")])
def test_k_relaxed_pops_one_of_the_k_best(k, mode):
    s = KRelaxedScheduler(k, mode=mode, seed=4)
    oracle = NaivePQ()
    rng = np.random.default_rng(2)
    keys = rng.permutation(400)
    s.load(keys, keys + 10_000)
    for key in keys:
        oracle.push(int(key), int(key) + 10_000)
    ranks = []
    passed_over, last_min = 0, None
    for i in range(600):
        if i % 2 and i < 400:
            key = 400 + i
            s.push(key + 10_000, key)
            oracle.push(key, key + 10_000)
        item = s.pop()
        if item is None:
            break
        task, prio = item
        assert task == prio + 10_000
        keys_now = [kk for kk, _ in oracle._items]
        r = keys_now.index(prio)
        ranks.append(r)
        oracle._items.pop(r)
        assert r < k                                   # the rank rule
        if keys_now[0] != last_min:
            last_min, passed_over = keys_now[0], 0
        if r == 0:
            last_min, passed_over = None, 0
        else:
            passed_over += 1
        assert passed_over <= k - 1                    # the fairness rule
        if mode == "adversarial":
            assert r in (0, min(k, len(keys_now)) - 1)
    assert len(oracle) == 0
    if k > 1 and mode == "uniform":
        assert set(ranks) == set(range(k))             # every rank below k occurs
    if k > 1 and mode == "adversarial":
        assert set(ranks) <= {0, k - 1} | set(range(k))
        assert ranks.count(k - 1) > ranks.count(0) >= len(ranks) // (2 * k)


def test_multiqueue_scheduler_is_exact_with_one_queue():
    s = MultiQueueScheduler(1, seed=0)
    rng = np.random.default_rng(3)
    keys = rng.permutation(1000)
    s.load(keys, keys)
    assert [s.pop()[1] for _ in range(1000)] == list(range(1000))


def test_scheduler_validation():
    with pytest.raises(ValueError, match="n_queues"):
        MultiQueueScheduler(0)
    with pytest.raises(TypeError, match="n_queues"):
        MultiQueueScheduler(2.5)
    with pytest.raises(ValueError, match="k: must be"):
        KRelaxedScheduler(0)
    with pytest.raises(ValueError, match="mode"):
        KRelaxedScheduler(4, mode="worst")
    s = ExactScheduler()
    with pytest.raises(TypeError, match="task"):
        s.push("a", 1)
    with pytest.raises(ValueError, match="INT64_MAX"):
        s.push(1, 2**63 - 1)
    with pytest.raises(ValueError, match="one length"):
        s.load([1, 2], [1])


def test_greedy_validation():
    g = relaxed.as_graph(np.array([[0, 1], [1, 2]]), n=4)
    with pytest.raises(ValueError, match="length 4"):
        relaxed.greedy_mis(g, [0, 1, 2])
    with pytest.raises(ValueError, match="distinct"):
        relaxed.greedy_mis(g, [0, 1, 1, 2])
    with pytest.raises(ValueError, match="finite"):
        relaxed.greedy_mis(g, [0, 1, np.nan, 2])
    with pytest.raises(TypeError, match="dtype"):
        relaxed.greedy_mis(g, [True, False, True, False])
    with pytest.raises(ValueError, match="length 2"):
        relaxed.greedy_matching(g, [0, 1, 2])
    with pytest.raises(ValueError, match="scheduler"):
        relaxed.greedy_mis(g, scheduler="fifo")
    with pytest.raises(TypeError, match="unexpected"):
        relaxed.greedy_mis(g, scheduler="exact", k=3)
    with pytest.raises(TypeError, match="needs the option k"):
        relaxed.greedy_mis(g, scheduler="k-relaxed")
    with pytest.raises(ValueError, match="n_threads"):
        relaxed.greedy_mis(g, n_threads=0)
    with pytest.raises(TypeError, match="scheduler='multiqueue'"):
        relaxed.greedy_mis(g, n_queues=8)                  # an option of another scheduler
    with pytest.raises(ValueError, match="chunk: must be in"):
        relaxed.greedy_mis(g, chunk=0)
    with pytest.raises(TypeError, match="chunk: expected an int"):
        relaxed.greedy_matching(g, chunk=2.0)
    with pytest.raises(TypeError, match="unexpected"):
        relaxed.greedy_mis(g, scheduler="multiqueue", chunk=4)
    with pytest.raises(ValueError, match="one thread"):
        relaxed.greedy_mis(g, scheduler=HeapScheduler(), n_threads=2)
    with pytest.raises(TypeError, match="push"):
        relaxed.greedy_mis(g, scheduler=object())
    full = ExactScheduler()
    full.push(1, 1)
    with pytest.raises(ValueError, match="must be empty"):
        relaxed.greedy_mis(g, scheduler=full)
    # bad graphs: the graph module's errors reach the caller
    with pytest.raises(ValueError, match="symmetric"):
        relaxed.greedy_mis(sp.csr_matrix(np.array([[0, 1], [0, 0]])))
    with pytest.raises(ValueError, match="self loop"):
        relaxed.greedy_mis(np.array([[0, 1], [2, 2]]))
    with pytest.raises(ValueError, match="n=3"):
        relaxed.greedy_matching(relaxed.as_graph(np.array([[0, 1], [1, 5]]), n=3))


def test_checkers_catch_bad_answers():
    g = relaxed.as_graph(np.array([[0, 1], [1, 2], [2, 3]]), n=4)
    check_mis(g, [True, False, True, False])
    with pytest.raises(AssertionError, match="independent"):
        check_mis(g, [True, True, False, True])
    with pytest.raises(AssertionError, match="maximal"):
        check_mis(g, [True, False, False, False])
    check_matching(g, [1, 0, 3, 2])
    with pytest.raises(AssertionError, match="maximal"):
        check_matching(g, [-1, -1, -1, -1])
    with pytest.raises(AssertionError, match="symmetric"):
        check_matching(g, [1, 2, -1, -1])
    with pytest.raises(AssertionError, match="not an edge"):
        check_matching(g, [3, -1, -1, 0])
    with pytest.raises(AssertionError, match="names vertex 9, past the graph's 4"):
        check_matching(g, [9, -1, -1, -1])                 # (an IndexError before)
    with pytest.raises(TypeError, match="mate: expected integer partners"):
        check_matching(g, [1.0, 0.0, 3.0, 2.0])


def test_empty_graphs():
    g = relaxed.as_graph(np.zeros((0, 2), np.int64), n=5)
    assert relaxed.greedy_mis(g, n_threads=2).mask.all()
    assert (relaxed.greedy_matching(g).mate == -1).all()


def test_wasted_work_does_not_grow_with_n():
    """PODC 2018: extra iterations depend on the relaxation, not on n. One
    thread, so the run is a sequential simulation of the MultiQueue (exact)."""
    means = {}
    for n in (10_000, 200_000):
        w = [relaxed.greedy_mis(relaxed.graphs.erdos_renyi(n, 5 * n, seed=s), seed=s,
                                scheduler="multiqueue", n_queues=8).stats.wasted
             for s in range(6)]
        means[n] = np.mean(w)
    assert 5 < means[10_000] < 100
    assert 0.5 < means[200_000] / means[10_000] < 2


def test_result_objects():
    g = relaxed.as_graph(np.array([[0, 1], [1, 2], [2, 3]]), n=4)
    r = relaxed.greedy_mis(g, [0, 1, 2, 3])
    assert r.vertices.tolist() == [0, 2]
    assert "MISResult" in repr(r) and r.stats.as_dict()["tasks"] == 4
    pickle.dumps(r.stats.as_dict())
    m = relaxed.greedy_matching(g, [0, 1, 2])
    assert m.pairs.tolist() == [[0, 1], [2, 3]]


# ---- the prefix engine -------------------------------------------------------------------

def _structured_graphs():
    """Graphs whose greedy answers have long dependence chains or heavy hubs."""
    n = 400
    path = np.stack([np.arange(n - 1), np.arange(1, n)], axis=1)
    star = np.stack([np.zeros(n - 1, np.int64), np.arange(1, n)], axis=1)
    clique = np.array([(i, j) for i in range(30) for j in range(i + 1, 30)])
    cliques = np.concatenate([clique + 30 * k for k in range(5)])
    side = 15
    idx = np.arange(side * side).reshape(side, side)
    grid = np.concatenate([np.stack([idx[:, :-1].ravel(), idx[:, 1:].ravel()], axis=1),
                           np.stack([idx[:-1, :].ravel(), idx[1:, :].ravel()], axis=1)])
    return {"path": (n, path), "star": (n, star), "cliques": (150, cliques),
            "grid": (side * side, grid)}


STRUCTURED = _structured_graphs()


@pytest.mark.parametrize("name", sorted(STRUCTURED))
@pytest.mark.parametrize("order", ["ids", "reversed", "random"])
def test_prefix_structured_graphs(name, order):
    """Priorities equal to the ids make a path one dependence chain; every thread
    count and chunk size must still give the sequential answer, and the engine's
    invariants (every task decided, every thread's bound released) hold."""
    n, edges = STRUCTURED[name]
    g = relaxed.as_graph(edges, n=n)
    canon = [tuple(e) for e in g.edges.tolist()]
    rng = np.random.default_rng(len(name))
    vp = {"ids": np.arange(n), "reversed": np.arange(n)[::-1].copy(),
          "random": rng.permutation(n)}[order]
    ep = {"ids": np.arange(g.m), "reversed": np.arange(g.m)[::-1].copy(),
          "random": rng.permutation(g.m)}[order]
    want_mis = greedy_mis_naive(n, canon, vp)
    want_mate = greedy_matching_naive(n, canon, ep)
    rank, vorder = greedy_mod._ranks(vp, n, "vertex", None)
    _, eorder = greedy_mod._ranks(ep, g.m, "edge", None)
    for threads in (1, 2, 3, 8):
        for chunk in (1, 4, 64):
            engine = greedy_mod.PrefixEngine(chunk)
            res, run = greedy_mod._prefix_mis(g, rank, vorder, engine, threads, 0.0)
            assert res.mask.tolist() == want_mis, (threads, chunk)
            run._check()
            _check_stats(res.stats, n, sum(want_mis), threads)
            mate = np.full(n, -1, np.int64)
            res, run = greedy_mod._prefix_matching(g, eorder, mate, engine, threads, 0.0)
            assert res.mate.tolist() == want_mate, (threads, chunk)
            run._check()
            _check_stats(res.stats, g.m, sum(m >= 0 for m in want_mate) // 2, threads)


_PREFIX_REPEAT = """
import sys
import numpy as np
import relaxed
from relaxed import greedy as greedy_mod
from tests.naive import greedy_matching_naive, greedy_mis_naive
from tests.test_greedy import STRUCTURED
runs = int(sys.argv[1])
n, edges = STRUCTURED["cliques"]
g = relaxed.as_graph(edges, n=n)
canon = [tuple(e) for e in g.edges.tolist()]
vp, ep = np.arange(n)[::-1].copy(), np.arange(g.m)[::-1].copy()
want_mis, want_mate = greedy_mis_naive(n, canon, vp), greedy_matching_naive(n, canon, ep)
rank, vorder = greedy_mod._ranks(vp, n, "vertex", None)
_, eorder = greedy_mod._ranks(ep, g.m, "edge", None)
for k in range(runs):
    mate = np.full(n, -1, np.int64)
    res, _ = greedy_mod._prefix_matching(g, eorder, mate, greedy_mod.PrefixEngine(4), 2, 0.0)
    assert res.mate.tolist() == want_mate, k
    if k % 8 == 0:
        res, _ = greedy_mod._prefix_mis(g, rank, vorder, greedy_mod.PrefixEngine(1), 2, 0.0)
        assert res.mask.tolist() == want_mis, k
print("ok", runs)
"""


def test_prefix_engine_never_waits_on_a_finished_thread():
    """Thousands of two-thread runs on the structured cliques graph, priorities
    reversed, each equal to the sequential answer, in a child process with a time
    limit so that a hang fails instead of stalling the suite. A thread that read the
    other's bound while it was between chunks (no rank held) could remember that
    value, keep new ranks from its next chunk unchecked, and then, the other thread
    having finished for good, wait forever for that bound to move: this hung within
    2,000 runs."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", _PREFIX_REPEAT, "6000"], cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok 6000", out.stderr[-2000:]


@pytest.mark.parametrize("threads", [2, 4])
def test_prefix_random_graphs_many_seeds(threads):
    """Small chunks and several threads: the threads overtake each other all the
    time, so tasks are looked at ahead, kept and retried."""
    g = relaxed.graphs.erdos_renyi(3000, 15_000, seed=9)
    e = [tuple(x) for x in g.edges.tolist()]
    for seed in range(4):
        rng = np.random.default_rng(seed)
        vp, ep = rng.permutation(g.n), rng.permutation(g.m)
        for chunk in (1, 16):
            res = relaxed.greedy_mis(g, vp, n_threads=threads, chunk=chunk)
            assert res.mask.tolist() == greedy_mis_naive(g.n, e, vp)
            m = relaxed.greedy_matching(g, ep, n_threads=threads, chunk=chunk)
            assert m.mate.tolist() == greedy_matching_naive(g.n, e, ep)


def test_prefix_priority_types():
    """Permutations of any integer dtype take the scatter path; other numbers
    (negative, sparse, floats, strided views) are ranked by a sort: one answer."""
    edges = random_edges(500, 3000, 21)
    g = relaxed.as_graph(np.array(edges), n=500)
    canon = [tuple(e) for e in g.edges.tolist()]
    perm = np.random.default_rng(5).permutation(500)
    want = greedy_mis_naive(500, canon, perm)
    for p in (perm, perm.astype(np.int32), perm.astype(np.uint16), perm.astype(np.int16),
              perm * 3 - 7, perm.astype(np.float64) / 10, np.repeat(perm, 2)[::2]):
        for threads in (1, 2):
            assert relaxed.greedy_mis(g, p, n_threads=threads).mask.tolist() == want
    ep = np.random.default_rng(6).permutation(g.m)
    want = greedy_matching_naive(500, canon, ep)
    assert relaxed.greedy_matching(g, -ep.astype(np.float32) * -1, n_threads=2).mate.tolist() == want
    with pytest.raises(ValueError, match="distinct"):                  # ties
        relaxed.greedy_mis(g, np.concatenate([[0], np.arange(499)]))
    with pytest.raises(ValueError, match="distinct"):
        relaxed.greedy_matching(g, np.zeros(g.m), n_threads=2)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_perm_order_against_argsort(threads):
    """The permutation check (a scatter on several threads, then a scan for
    holes) accepts exactly the permutations and inverts them."""
    n = 250_000                                        # enough for 2 scatter threads
    rng = np.random.default_rng(threads)
    p = rng.permutation(n)
    for q in (p, p.astype(np.int32)):
        order = greedy_mod._perm_order(q, threads)
        np.testing.assert_array_equal(order, np.argsort(p))
        assert order.dtype == np.int32
    dup = p.copy()
    dup[7] = dup[n - 3]                                # a duplicate leaves a hole
    assert greedy_mod._perm_order(dup, threads) is None
    out = p.copy()
    out[n // 2] = n                                    # out of range
    assert greedy_mod._perm_order(out, threads) is None
    out[n // 2] = -1
    assert greedy_mod._perm_order(out.astype(np.int32), threads) is None
    assert greedy_mod._perm_order(np.zeros(0, np.int64), threads).shape == (0,)


def test_prefix_empty_and_tiny_graphs():
    for n in (0, 1, 5):
        g = relaxed.as_graph(np.zeros((0, 2), np.int64), n=n)
        for threads in (1, 3):
            r = relaxed.greedy_mis(g, n_threads=threads)
            assert r.mask.all() and r.mask.shape == (n,)
            assert r.stats.decided + r.stats.skipped == n
            m = relaxed.greedy_matching(g, n_threads=threads)
            assert (m.mate == -1).all() and m.stats.iterations == 0
    g = relaxed.as_graph(np.array([[0, 1]]), n=2)
    assert relaxed.greedy_mis(g, [1, 0], n_threads=2).mask.tolist() == [False, True]
    assert relaxed.greedy_matching(g, n_threads=2).mate.tolist() == [1, 0]


def test_prefix_run_checker_catches_broken_state():
    """_check() is an oracle for the engine's end state: it must fail on a state
    the engine could not have produced."""
    g = relaxed.graphs.erdos_renyi(300, 900, seed=3)
    rank, order = greedy_mod._ranks(None, g.n, "vertex", np.random.default_rng(0))
    res, run = greedy_mod._prefix_mis(g, rank, order, greedy_mod.PrefixEngine(), 2, 0.0)
    run._check()
    run2 = greedy_mod._PrefixRun("mis", 1, 8, order, g.indptr, g.indices,
                                 np.zeros(g.n, np.uint8), rank=rank, shift=1)
    with pytest.raises(AssertionError, match="undecided"):
        run2._check()                                  # never ran
    _, eorder = greedy_mod._ranks(None, g.m, "edge", np.random.default_rng(0))
    mate = np.full(g.n, -1, np.int64)
    res, run = greedy_mod._prefix_matching(g, eorder, mate, greedy_mod.PrefixEngine(3), 2, 0.0)
    run._check()
    check_matching(g, res.mate)
    mate[np.flatnonzero(mate >= 0)[0]] = -1            # corrupt the answer
    with pytest.raises(AssertionError, match="taken flag"):
        run._check()


def test_random_priorities_are_uniform_permutations():
    """Seeded priorities come from a bucket shuffle: always a permutation, the
    same for one seed, and uniform: over 6000 draws of n = 4 every one of the 24
    orders appears, each within 5 standard deviations of 250; across buckets
    (n = 3 * 4096: three buckets) an item lands in each third equally often."""
    for n in (0, 1, 7, 5000, 3 * 4096 + 5):
        o = greedy_mod._random_order(n, 11)
        assert o.dtype == np.int32 and np.array_equal(np.sort(o), np.arange(n))
        np.testing.assert_array_equal(o, greedy_mod._random_order(n, 11))
        np.testing.assert_array_equal(greedy_mod._inverse(o)[o], np.arange(n))
    counts = {}
    for s in range(6000):
        key = tuple(greedy_mod._random_order(4, s))
        counts[key] = counts.get(key, 0) + 1
    sd = np.sqrt(6000 / 24 * (1 - 1 / 24))
    assert len(counts) == 24 and all(abs(c - 250) < 5 * sd for c in counts.values()), counts
    n, draws = 3 * 4096, 600
    thirds = np.zeros(3)
    for s in range(draws):
        thirds[np.flatnonzero(greedy_mod._random_order(n, 10_000 + s) == 0)[0] * 3 // n] += 1
    sd = np.sqrt(draws / 3 * (2 / 3))
    assert np.all(np.abs(thirds - draws / 3) < 5 * sd), thirds
    with pytest.raises(ValueError, match="n must be"):
        greedy_mod._random_order(-1, 0)
