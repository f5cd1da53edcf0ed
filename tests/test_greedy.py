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
from relaxed.greedy import check_matching, check_mis
from tests.naive import NaivePQ, canonical_edges, greedy_matching_naive, greedy_mis_naive

SCHEDULERS = [
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
                                n_queues=8).stats.wasted for s in range(6)]
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
