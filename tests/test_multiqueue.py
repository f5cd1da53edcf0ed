"""MultiQueue: a ladder from smoke tests to many-producer many-consumer conservation,
each against an oracle from naive.py."""
import contextlib
import os
import pickle
import signal
import threading
import time

import multiprocess as mp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import workers
from conftest import scaled
from naive import NaivePQ, rank_errors
from test_crash import killed_in_child
from relaxed import MultiQueue, QueueFull
from relaxed._base import CACHE_LINE


# -- smoke, empty, len -------------------------------------------------------
def test_smoke_push_pop_len():
    with MultiQueue(100, n_queues=4, seed=0) as mq:
        assert len(mq) == 0 and not mq
        mq.push(3, 30)
        mq.push(-1, 10)
        assert len(mq) == 2 and mq
        got = sorted([mq.pop(), mq.pop()])
        assert got == [(-1, 10), (3, 30)]
        assert mq.try_pop() is None
        with pytest.raises(IndexError, match="empty"):
            mq.pop()
        mq._check()


@pytest.mark.parametrize("n_queues", [1, 3])
def test_single_queue_is_exact_and_tiny_queues_conserve(n_queues):
    rng = np.random.default_rng(1)
    mq = MultiQueue(3 * n_queues, n_queues=n_queues, seed=1)
    ref = NaivePQ()
    for step in range(3000):
        if len(ref) < 3 * n_queues and (len(ref) == 0 or rng.random() < 0.5):
            k, v = int(rng.integers(-5, 5)), step
            mq.push(k, v)
            ref.push(k, v)
        else:
            k, v = mq.pop()
            if n_queues == 1:
                assert k == ref._items[0][0]
            ref._items.remove((k, v))
        assert len(mq) == len(ref)
    mq._check()
    mq.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("push"), st.integers(-2**63, 2**63 - 1)),
                          st.just(("pop", 0))), max_size=60))
def test_one_queue_matches_naive_pq(ops):
    mq = MultiQueue(64, n_queues=1, seed=0)
    ref = NaivePQ()
    for i, (op, key) in enumerate(ops):
        if op == "push":
            mq.push(key, i)
            ref.push(key, i)
        elif len(ref):
            assert mq.pop()[0] == ref.pop()[0]
        else:
            assert mq.try_pop() is None
    mq._check()
    mq.close()


@pytest.mark.parametrize("size", [5000, 40000])
def test_deep_heap_with_ties_pops_in_order(size):
    """One queue whose heap is several levels of full 8-child nodes and whose keys
    repeat a lot (the sift-down's choice among equal children): every pop is the naive
    queue's smallest key, and the heap stays a heap through the refills. (40,000: a
    heap past SMALL_HEAP, whose sift-downs select among the upper levels' children
    without branches and among the deeper ones with them.)"""
    rng = np.random.default_rng(7)
    cap = size + 1000
    mq = MultiQueue(cap, n_queues=1, seed=0)
    ref = NaivePQ()
    for i, k in enumerate(rng.integers(0, 50, size).tolist()):
        mq.push(k, i)
        ref.push(k, i)
    for step in range(20000):
        if rng.random() < 0.5 and len(ref) < cap:
            k = int(rng.integers(0, 50))
            mq.push(k, step)
            ref.push(k, step)
        elif len(ref):
            assert mq.pop()[0] == ref.pop()[0]
        if step % 2000 == 0:
            mq._check()
    while len(ref):
        assert mq.pop()[0] == ref.pop()[0]
    mq._check()
    mq.close()


def test_float_keys_order_negative_inf_and_zero():
    keys = [3.5, -0.0, 0.0, -1e300, float("inf"), float("-inf"), 2.0, -2.5, 1e-300]
    mq = MultiQueue(20, n_queues=1, key_dtype="float64", seed=0)
    for i, k in enumerate(keys):
        mq.push(k, i)
    out = [mq.pop()[0] for _ in keys]
    assert out == sorted(keys)
    assert isinstance(out[0], float)
    mq.push_many(np.array([2.0, 1.0]), np.array([0, 1]))
    k, v = mq.pop_many(5)
    assert k.dtype == np.float64 and k.tolist() == [1.0, 2.0]
    mq.close()


def test_extreme_int_keys():
    mq = MultiQueue(10, n_queues=2, seed=0)
    for k in (2**63 - 1, -2**63, 0):
        mq.push(k, k % 7)
    assert len(mq) == 3
    assert sorted(mq.pop()[0] for _ in range(3)) == [-2**63, 0, 2**63 - 1]
    assert mq.try_pop() is None
    mq.close()


def test_bulk_roundtrip_and_pop_many_stops_when_empty():
    rng = np.random.default_rng(2)
    keys = rng.integers(0, 1000, 5000)
    vals = np.arange(5000)
    mq = MultiQueue(5000, n_queues=8, seed=2)
    mq.push_many(keys, vals)
    assert len(mq) == 5000
    k, v = mq.pop_many(6000)
    assert len(k) == len(v) == 5000
    assert sorted(v.tolist()) == list(range(5000))
    assert np.array_equal(np.sort(k), np.sort(keys))
    assert np.array_equal(keys[v], k)  # pairs stay together
    k, v = mq.pop_many(10)
    assert len(k) == 0 and k.dtype == np.int64
    mq._check()
    mq.close()


def test_full_queue_raises_and_keeps_items():
    mq = MultiQueue(10, n_queues=3, seed=0)    # 3 queues of 4: capacity 10 always fits
    assert mq.capacity == 12                   # rounded up to a multiple of n_queues
    for i in range(10):
        mq.push(i, i)
    mq.push(10, 10)
    mq.push(11, 11)
    with pytest.raises(QueueFull, match="full"):
        mq.push(12, 12)
    assert len(mq) == 12
    mq2 = MultiQueue(4, n_queues=1, seed=0)
    with pytest.raises(QueueFull) as ei:
        mq2.push_many(np.arange(6), np.arange(6))
    assert ei.value.n_pushed == 4 and len(mq2) == 4
    assert sorted(mq2.pop_many(10)[1].tolist()) == [0, 1, 2, 3]
    mq._check()
    mq.close()
    mq2.close()


def test_stickiness_conserves():
    mq = MultiQueue(20000, n_queues=8, seed=3, stickiness=16)
    mq.push_many(np.arange(20000)[::-1], np.arange(20000))
    out = [mq.pop()[1] for _ in range(20000)]
    assert sorted(out) == list(range(20000))
    mq._check()
    mq.close()


def _totals(mq):
    out = []
    for q in range(mq.n_queues):
        d = mq._dump(q)
        ds, de = d["deletion_window"]
        out.append(d["heap_size"] + d["insertion_count"] + de - ds)
    return np.array(out)


def test_a_sticky_handle_keeps_one_pair_for_its_operations():
    """stickiness=s (the StickRandom policy): a handle draws a random pair of queues
    and spends s operations on it, pops from the smaller top of the two, pushes to
    either; then it draws a new pair. Blocks of s operations, mixed pops and pushes,
    each touch at most two queues, and the pairs change between blocks."""
    s = 10
    mq = MultiQueue(8000, n_queues=8, seed=4, stickiness=s)
    mq.push_many(np.arange(4000), np.arange(4000))   # (a bulk call has its own handle)
    for _ in range(s):                         # the first s operations: the first pair
        mq.push(1, 1)
    pairs = []
    rng = np.random.default_rng(0)
    for block in range(30):
        before = _totals(mq)
        pushes = pops = 0
        for op in rng.integers(0, 2, s):
            if op:
                mq.push(int(rng.integers(0, 10_000)), block)
                pushes += 1
            else:
                mq.pop()
                pops += 1
        delta = _totals(mq) - before
        touched = frozenset(np.flatnonzero(delta).tolist())
        assert len(touched) <= 2, (block, delta)
        assert delta.sum() == pushes - pops
        pairs.append(touched)
    assert len({p for p in pairs if len(p) == 2}) >= 5, "the pairs must change between blocks"
    mq._check()
    mq.close()


def test_without_stickiness_pushes_spread_over_every_queue():
    mq = MultiQueue(8000, n_queues=8, seed=5)
    for i in range(1600):
        mq.push(i, i)
    t = _totals(mq)
    assert t.sum() == 1600 and t.min() >= 140 and t.max() <= 260, t
    mq.close()


# -- bad input -------------------------------------------------------------
@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(capacity=0), ValueError, "capacity must be >= 1"),
    (dict(capacity=-5), ValueError, "capacity"),
    (dict(capacity=1.5), TypeError, "capacity must be an int"),
    (dict(capacity=True), TypeError, "capacity"),
    (dict(capacity=2**62), ValueError, r"capacity must be <= 2\*\*56"),   # (OverflowError)
    (dict(capacity=10, n_queues=0), ValueError, "n_queues"),
    (dict(capacity=10, stickiness=0), ValueError, "stickiness"),
    (dict(capacity=10, key_dtype="int32"), ValueError, "key_dtype"),
    (dict(capacity=10, key_dtype=None), ValueError, "key_dtype"),      # (was float64)
    (dict(capacity=10, key_dtype=[1]), ValueError, "key_dtype"),
    (dict(capacity=10, shared="yes"), TypeError, "shared"),
    (dict(capacity=10, seed="x"), TypeError, "seed"),
])
def test_bad_constructor_arguments(kwargs, exc, match):
    cap = kwargs.pop("capacity")
    with pytest.raises(exc, match=match):
        MultiQueue(cap, **kwargs)


def test_bad_push_and_bulk_arguments():
    mq = MultiQueue(10, n_queues=2, seed=0)
    with pytest.raises(TypeError, match="key must be an integer"):
        mq.push(1.5, 0)
    with pytest.raises(TypeError, match="key must be an int"):
        mq.push("a", 0)
    with pytest.raises(ValueError, match="int64 range"):
        mq.push(2**70, 0)
    with pytest.raises(TypeError, match="value must be an int"):
        mq.push(1, "v")
    with pytest.raises(ValueError, match="int64 range"):
        mq.push(1, 2**64)
    from decimal import Decimal
    for bad in (np.float32(2.7), Decimal("9.99"), True):     # (truncated to 2, 9 before)
        with pytest.raises(TypeError, match="key must be an integer"):
            mq.push(bad, 0)
    for bad in (2.9, np.float64(7.8), False):
        with pytest.raises(TypeError, match="value must be an int"):
            mq.push(1, bad)
    assert len(mq) == 0
    mq.push(np.int32(4), np.int16(3))                          # numpy integers are ints
    assert mq.pop() == (4, 3)
    with pytest.raises(TypeError, match="keys must hold integers"):
        mq.push_many(np.array([1.5]), np.array([1]))
    with pytest.raises(ValueError, match="same length"):
        mq.push_many(np.array([1, 2]), np.array([1]))
    with pytest.raises(ValueError, match="1-D"):
        mq.push_many(np.zeros((2, 2), dtype=np.int64), np.zeros(4, dtype=np.int64))
    with pytest.raises(TypeError, match="values must hold integers"):
        mq.push_many(np.array([1]), np.array(["x"]))
    with pytest.raises(ValueError, match="n must be >= 0"):
        mq.pop_many(-1)
    for huge in (2**62, 2**63):                # (numpy's "array is too big", OverflowError)
        with pytest.raises(ValueError, match=r"n must be <= 2\*\*56"):
            mq.pop_many(huge)
    assert len(mq) == 0
    f = MultiQueue(10, key_dtype="float64")
    with pytest.raises(ValueError, match="NaN"):
        f.push(float("nan"), 0)
    with pytest.raises(ValueError, match="NaN"):
        f.push_many(np.array([1.0, np.nan]), np.array([0, 1]))
    assert len(f) == 0
    mq.close()
    f.close()


def test_use_after_close_and_private_pickle():
    mq = MultiQueue(10)
    with pytest.raises(TypeError, match="shared=True"):
        pickle.dumps(mq)
    mq.close()
    mq.close()  # idempotent
    for call in (lambda: mq.push(1, 1), mq.try_pop, mq.pop, lambda: len(mq),
                 lambda: mq.push_many([1], [1]), lambda: mq.pop_many(1), mq._check):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    assert "closed" in repr(mq)


def test_close_refused_while_bulk_call_runs():
    mq = MultiQueue(2_000_000, n_queues=4, seed=0)
    mq.push_many(np.arange(1_000_000), np.arange(1_000_000))
    started = threading.Event()

    def run():
        started.set()
        mq._hold(20_000_000)
    t = threading.Thread(target=run)
    t.start()
    started.wait()
    time.sleep(0.05)
    try:
        if t.is_alive():
            with pytest.raises(RuntimeError, match="running in other threads"):
                mq.close()
    finally:
        t.join()
    mq.close()
    assert mq.closed


# -- quality -----------------------------------------------------------------
def theory_rank_error(n):
    return 5 / 6 * n - 1 + 1 / (6 * n)


@pytest.mark.parametrize("n_queues", [1, 4, 8, 16])
def test_rank_error_single_thread_close_to_theory(n_queues):
    """Prefill 100k random keys, then 100k pop/push pairs (hold model), one thread."""
    rng = np.random.default_rng(n_queues)
    n = scaled(100_000)
    init = rng.integers(0, 1 << 40, n)
    mq = MultiQueue(n + 1, n_queues=n_queues, seed=n_queues)
    mq.push_many(init, np.arange(n))
    incs = rng.integers(0, 1 << 40, n).tolist()
    ops = []
    for i in range(n):
        k, v = mq.pop()
        ops.append(("pop", k))
        k2 = k + incs[i]
        mq.push(k2, v)
        ops.append(("push", k2))
    mq._check()
    mq.close()
    err = np.array(rank_errors(init.tolist(), ops))
    mean = err.mean()
    if n_queues == 1:
        assert err.max() == 0, f"one queue must be exact, max rank error {err.max()}"
    else:
        th = theory_rank_error(n_queues)
        assert th / 2 <= mean <= 2 * th, (
            f"mean rank error {mean:.2f} with {n_queues} queues is not within a factor 2 "
            f"of the theory 5/6·n − 1 + 1/(6n) = {th:.2f}")


# -- exactly-once across threads (bulk calls) -------------------------------
def test_threads_bulk_exactly_once():
    n = scaled(200_000)
    mq = MultiQueue(2 * n, n_queues=8, seed=5)
    done = threading.Event()

    class Q(list):
        def put(self, x):
            self.append(x)
    outs = Q()
    prods = [threading.Thread(target=workers.produce, args=(mq, i * n, n, i, True))
             for i in range(2)]
    cons = [threading.Thread(target=workers.consume, args=(mq, done, outs, True))
            for _ in range(2)]
    for t in prods + cons:
        t.start()
    for t in prods:
        t.join()
    done.set()
    for t in cons:
        t.join()
    got = np.sort(np.concatenate(outs))
    assert len(got) == 2 * n, f"popped {len(got)} items, pushed {2 * n}"
    assert np.array_equal(got, np.arange(2 * n)), "popped multiset differs from pushed"
    assert len(mq) == 0
    mq._check()
    mq.close()


# -- exactly-once across processes ------------------------------------------
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_processes_exactly_once(method, no_shm_leak):
    """2 producer and 2 consumer processes share one MultiQueue, 200k unique values
    per producer, Python-level push/try_pop: popped multiset == pushed multiset."""
    n = scaled(200_000) if method == "fork" else scaled(50_000)
    ctx = mp.get_context(method)
    with MultiQueue(2 * n, n_queues=8, shared=True, seed=6) as mq:
        done = ctx.Event()
        outq = ctx.Queue()
        prods = [ctx.Process(target=workers.produce, args=(mq, i * n, n, 10 + i))
                 for i in range(2)]
        cons = [ctx.Process(target=workers.consume, args=(mq, done, outq)) for _ in range(2)]
        for p in prods + cons:
            p.start()
        for p in prods:
            p.join()
            assert p.exitcode == 0
        done.set()
        outs = [outq.get(timeout=300) for _ in cons]
        for p in cons:
            p.join()
            assert p.exitcode == 0
        got = np.sort(np.concatenate(outs))
        assert len(got) == 2 * n, f"popped {len(got)} items, pushed {2 * n}"
        assert np.array_equal(got, np.arange(2 * n)), "popped multiset differs from pushed"
        mq._check()


def test_pickle_attaches_to_same_queue():
    with MultiQueue(100, n_queues=2, shared=True, seed=0) as mq:
        mq.push(1, 2)
        other = pickle.loads(pickle.dumps(mq))
        assert other.name == mq.name and len(other) == 1
        other.push(0, 5)
        assert mq.pop() == (0, 5)
        other.close()
        assert len(mq) == 1


# -- a dead lock holder -------------------------------------------------------
@pytest.mark.parametrize("op, steps", [(2, 0), (2, 1), (2, 3), (1, 0), (1, 2), (1, 50)])
def test_holder_killed_mid_operation_is_recovered(op, steps, no_shm_leak):
    """A process dies holding a queue's lock in the middle of a sift: the survivors
    do not deadlock, and the queue is repaired: an uncommitted pop is rolled back,
    an uncommitted push is completed."""
    rng = np.random.default_rng(steps)
    keys = rng.integers(0, 10_000, 500)
    with MultiQueue(1000, n_queues=1, shared=True, seed=0) as mq:
        mq.push_many(keys, np.arange(500))
        p = mp.get_context("fork").Process(target=workers.partial_then_die,
                                           args=(mq, 0, op, steps, -1, 999))
        p.start()
        p.join()
        assert p.exitcode == -signal.SIGKILL
        k, v = mq.pop_many(2000)      # waits on the dead holder's lock, then repairs
        expect = sorted(keys.tolist() + ([-1] if op == 1 else []))
        assert k.tolist() == expect
        mq._check()


def test_sigkill_at_random_moment_no_deadlock_no_duplicates(no_shm_leak):
    n = 50_000
    with MultiQueue(n, n_queues=2, shared=True, seed=1) as mq:
        mq.push_many(np.arange(n), np.arange(n))
        ctx = mp.get_context("fork")
        for trial in range(3):
            ready = ctx.Event()
            p = ctx.Process(target=workers.hold_forever, args=(mq, ready), daemon=True)
            p.start()
            try:
                assert ready.wait(30)
                mq._hold(20_000)   # contend with it for a while
            finally:
                os.kill(p.pid, signal.SIGKILL)
                p.join()
            mq.recover_dead_locks()
            mq._check()
        k, v = mq.pop_many(2 * n)
        assert len(np.unique(v)) == len(v), "an element was duplicated"
        # the hold loop pops then pushes: a value popped by the killed process before
        # it pushed it back is legitimately lost (at most one per kill)
        assert n - 3 <= len(v) <= n
        mq._check()


# -- stampede: more workers than queues, maximal lock contention ---------------------
@pytest.mark.parametrize("n_queues, stickiness", [(1, 1), (2, 1), (2, 8), (8, 4)])
def test_stampede_threads_conserve_values(n_queues, stickiness):
    """8 threads run the nogil hold loop (pop, push the same value with a larger key)
    on a queue with fewer heaps than threads: every thread finishes (no starvation)
    and every value is still there exactly once."""
    n = 2000
    mq = MultiQueue(n + 8, n_queues=n_queues, seed=7, stickiness=stickiness)
    mq.push_many(np.random.default_rng(7).integers(0, 1 << 30, n), np.arange(n))
    results = []
    ts = [threading.Thread(target=lambda: results.append(mq._hold(scaled(50_000), 1 << 20)))
          for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(results) == 8 and all(r[0] == 0 for r in results), "a pop found it empty"
    mq._check()
    k, v = mq.pop_many(2 * n)
    assert sorted(v.tolist()) == list(range(n))
    mq.close()


def test_stampede_processes_conserve_values(no_shm_leak):
    n = 2000
    with MultiQueue(n + 4, n_queues=2, shared=True, seed=8) as mq:
        mq.push_many(np.arange(n), np.arange(n))
        ctx = mp.get_context("fork")
        ps = [ctx.Process(target=mq._hold, args=(scaled(100_000), 1 << 20)) for _ in range(3)]
        for p in ps:
            p.start()
        mq._hold(scaled(100_000), 1 << 20)
        for p in ps:
            p.join()
            assert p.exitcode == 0
        mq._check()
        assert sorted(mq.pop_many(2 * n)[1].tolist()) == list(range(n))


# -- insertion and deletion buffers ---------------------------------------------------
def counts(mq, q=0):
    d = mq._dump(q)
    return d["heap_size"], d["insertion_count"], len(d["deletion"])


def test_buffers_fill_flush_and_refill_in_order():
    """One queue (exact): the first 16 keys fill the deletion buffer, the next 16 the
    insertion buffer, the 33rd flushes it into the heap; a pop that empties the
    deletion buffer flushes the insertion buffer and refills from the heap."""
    with MultiQueue(100, n_queues=1, seed=0) as mq:
        for k in range(16):
            mq.push(k, k)
        assert counts(mq) == (0, 0, 16)
        for k in range(2000, 2016):
            mq.push(k, k)
        assert counts(mq) == (0, 16, 16)
        mq.push(3000, 3000)
        assert counts(mq) == (16, 1, 16)
        mq.push(1500, 1500)          # buffered behind the heap's 2000..2015
        assert counts(mq) == (16, 2, 16)
        mq._check()
        assert [mq.pop()[0] for _ in range(16)] == list(range(16))
        # the 16th pop emptied the deletion buffer: the refill saw the buffered 1500
        assert counts(mq) == (2, 0, 16)
        mq._check()
        assert mq.pop() == (1500, 1500)
        assert [mq.pop()[0] for _ in range(17)] == list(range(2000, 2016)) + [3000]
        assert mq.try_pop() is None and counts(mq) == (0, 0, 0)
        mq._check()


def test_delete_min_sees_a_key_pushed_below_the_buffers():
    """A key smaller than the deletion buffer's largest goes into it (a full buffer
    hands its largest to the insertion buffer): the next pop returns it; a deletion
    window that reached the top slot grows downwards."""
    with MultiQueue(100, n_queues=1, seed=0) as mq:
        mq.push_many(np.arange(10, 60), np.arange(10, 60))
        mq.push(5, -5)
        mq._check()
        assert mq.pop() == (5, -5)
        assert [mq.pop()[0] for _ in range(3)] == [10, 11, 12]
        mq.push(14, -14)             # window [3, 16): grows down to slot 2
        mq.push(12, -12)
        mq._check()
        assert [mq.pop() for _ in range(4)] == [(12, -12), (13, 13), (14, -14), (14, 14)]
        k, v = mq.pop_many(100)
        assert k.tolist() == list(range(15, 60))
        mq._check()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(-50, 50)), max_size=120))
def test_buffered_single_queue_matches_naive_pq(ops):
    """Random pushes and pops around the buffer sizes on one queue: the pops are
    exactly those of a sorted-list priority queue and every invariant holds."""
    ref = NaivePQ()
    with MultiQueue(200, n_queues=1, seed=0) as mq:
        for i, (is_push, key) in enumerate(ops):
            if is_push or not len(ref):
                mq.push(key, i)
                ref.push(key, i)
            else:
                assert mq.pop()[0] == ref.pop()[0]
            mq._check()
        assert mq.pop_many(500)[0].tolist() == [ref.pop()[0] for _ in range(len(ref))]


def _segment_queue0(mq):
    """(segment, guard offset, deletion buffer offset) of queue 0 of a shared queue."""
    from relaxed.shm import Segment
    seg = Segment.attach(mq.name)
    stride, = np.frombuffer(seg.buf, np.int64, 1, 80)
    goff, = np.frombuffer(seg.buf, np.int64, 1, 96)
    return seg, int(goff), int(goff + stride - 512)


@pytest.mark.parametrize("damage", ["unsorted", "insertion-small", "heap-small", "top"])
def test_check_covers_the_buffers(damage, no_shm_leak):
    with MultiQueue(100, n_queues=1, shared=True, seed=0) as mq:
        mq.push_many(np.arange(0, 64, 2), np.arange(32))
        mq.push(100, 0)                  # 16 in the deletion buffer, 16 in the heap, 1 buffered
        mq._check()
        seg, goff, doff = _segment_queue0(mq)
        elems = np.frombuffer(seg.buf, np.uint64, 64, doff).reshape(32, 2)
        if damage == "unsorted":
            elems[[3, 4], 0] = elems[[4, 3], 0]
            msg = "not ascending"
        elif damage == "insertion-small":
            elems[16, 0] = elems[0, 0]
            msg = "insertion buffer item 0 is smaller"
        elif damage == "heap-small":
            heaps, = np.frombuffer(seg.buf, np.int64, 1, 104)
            np.frombuffer(seg.buf, np.uint64, 1, int(heaps) + 48)[0] = elems[0, 0]
            msg = "heap item is smaller"
        else:
            np.frombuffer(seg.buf, np.uint64, 1, goff + 8)[0] += 1
            msg = "cached top"
        del elems
        with pytest.raises(AssertionError, match=msg):
            mq._check()
        seg.close()


def _buffer_case(mq, case):
    """Fill one queue (16 in the deletion buffer, 16 in the heap, 8 buffered) and set
    up the step named by ``case``; returns (multiset held, op, pushed item)."""
    import collections
    mq.push_many(np.arange(0, 80, 2), np.arange(40))
    held = collections.Counter(zip(range(0, 80, 2), range(40)))
    assert counts(mq) == (16, 8, 16)
    if case == "window-down":                # deletion window [3, 16) at the top slot
        held -= collections.Counter([mq.pop() for _ in range(3)])
        return held, "push", (11, 999)
    if case == "refill":                     # the next pop empties the deletion buffer
        held -= collections.Counter([mq.pop() for _ in range(15)])
        mq.push(41, 998)
        return held + collections.Counter([(41, 998)]), "pop", None
    mq.push_many(np.arange(90, 98), np.zeros(8, np.int64))      # insertion buffer full
    assert counts(mq) == (16, 16, 16)
    return held + collections.Counter((k, 0) for k in range(90, 98)), "push", (-1, 999)


@pytest.mark.parametrize("case", ["window-down", "refill", "evict-and-flush"])
def test_kill_at_every_store_of_a_buffer_step(case, no_shm_leak):
    """Buffer steps a fresh queue does not reach: a push into a deletion window at
    the top slot, a pop whose refill flushes the insertion buffer, a push that evicts
    into a full insertion buffer. Killed after every store, then repaired: the push
    is done or not, the pop lost at most the smallest item. The flushes and the
    refill publish their steps in the journal (op 5, OP_REFILL) and store the guard's
    counts once: some kills must land there."""
    import collections
    from relaxed import _multiqueue
    from relaxed.shm import Segment
    with MultiQueue(64, n_queues=1, shared=True, seed=0) as mq:
        held, op, item = _buffer_case(mq, case)
        seg = Segment.attach(mq.name)
        snap = bytes(seg.buf)
        k1 = 0
        ops_left = collections.Counter()
        while True:
            seg.buf[:] = snap

            def operation():
                _multiqueue._crash_after(k1)
                mq.push(*item) if op == "push" else mq.pop()
            if not killed_in_child(operation):
                break
            ops_left[mq._dump(0)["op"]] += 1
            assert mq.recover_dead_locks() == 1
            mq._check()
            got = collections.Counter(zip(*[a.tolist() for a in mq.pop_many(100)]))
            if op == "push":
                assert got in (held, held + collections.Counter([item])), f"store {k1}"
            else:
                missing = held - got
                assert not (got - held) and sum(missing.values()) <= 1, f"store {k1}"
                assert all(k == min(held)[0] for k, _ in missing), f"store {k1}: {missing}"
            k1 += 1
        assert k1 > 3, "the step made fewer stores than expected"
        if case != "window-down":
            assert ops_left[5] > 0, ops_left
        seg.buf[:] = snap
        seg.close()


# -- regressions from review ---------------------------------------------------------
class ClosesOnIndex(int):
    """An int whose conversion closes the queue: the bulk call must not use freed memory."""
    target = None

    def __index__(self):
        self.target.close()
        return int.__int__(self)

    __int__ = __index__


def test_close_during_argument_conversion_is_refused_not_a_crash():
    mq = MultiQueue(100, seed=0)
    mq.push_many(np.arange(10), np.arange(10))
    bad = ClosesOnIndex(5)
    bad.target = mq
    with pytest.raises(RuntimeError, match="running in other threads"):
        mq.pop_many(bad)

    class ClosingArray:
        def __array__(self, dtype=None, copy=None):
            mq.close()
            return np.arange(3)
    with pytest.raises(RuntimeError, match="running in other threads"):
        mq.push_many(ClosingArray(), np.arange(3))
    assert len(mq) == 10
    mq.close()
    with pytest.raises(RuntimeError, match="closed"):
        mq._dump(0)


def test_dump_checks_its_index():
    with MultiQueue(10, n_queues=2) as mq:
        assert mq._dump(1)["queue"] == 1
        with pytest.raises(ValueError, match="n_queues"):
            mq._dump(2)
        with pytest.raises(ValueError, match="q must be >= 0"):
            mq._dump(-1)


def test_read_only_arrays_are_accepted():
    k = np.arange(5)
    v = np.arange(5)
    k.flags.writeable = False
    v.flags.writeable = False
    with MultiQueue(10, n_queues=2) as mq:
        mq.push_many(k, v)
        assert len(mq) == 5


def test_fork_while_a_bulk_call_runs_in_another_thread():
    mq = MultiQueue(2_000_000, n_queues=4, shared=True, seed=0)
    mq.push_many(np.arange(1_000_000), np.arange(1_000_000))
    t = threading.Thread(target=mq._hold, args=(2_000_000,))
    t.start()
    time.sleep(0.02)
    ctx = mp.get_context("fork")
    p = ctx.Process(target=mq.close)          # the child has no running bulk call
    p.start()
    p.join()
    t.join()
    assert p.exitcode == 0
    mq.close()


class _Alarm(Exception):
    """Raised by SIGALRM while a test waits on a live holder's lock."""


@contextlib.contextmanager
def _live_holder(mq, target, *args):
    """A forked process that takes a lock of ``mq`` (``target(mq, *args, ready)``) and
    sleeps; meanwhile SIGALRM raises _Alarm. On exit: the timer off, the old handler
    back, the holder SIGKILLed (its lock then belongs to a dead process)."""
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=target, args=(mq, *args, ready), daemon=True)
    p.start()

    def on_alarm(signum, frame):
        raise _Alarm()
    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        assert ready.wait(30)
        yield p
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        os.kill(p.pid, signal.SIGKILL)
        p.join()


def test_signal_interrupts_a_wait_on_a_live_stuck_holder(no_shm_leak):
    """A live process holds the only queue's lock forever (stopped, in a debugger...):
    pop() keeps waiting but stays interruptible; once the holder dies it recovers."""
    with MultiQueue(10, n_queues=1, shared=True, seed=0) as mq:
        mq.push(1, 1)
        with _live_holder(mq, workers.hold_lock_and_sleep):
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            t0 = time.time()
            with pytest.raises(_Alarm):
                mq.pop()
            assert time.time() - t0 < 10
        assert mq.pop() == (1, 1)
        mq._check()


def test_pop_passes_by_a_held_queue_to_one_it_can_take(no_shm_leak):
    """A live process holds queue 0's lock (a long refill, a stopped holder): each pop
    takes queue 1's smallest item at its first call, without waiting for queue 0, even
    when queue 0's cached top is the smaller of the two (the choice fails, and the scan
    that follows passes the held lock by before it waits on any); queue 0's items are
    all there once the holder is gone."""
    with MultiQueue(64, n_queues=2, shared=True, seed=0) as mq:
        for k in range(1, 41):
            mq.push(k, k)
        q1 = mq._dump(1)                  # keys in the core's order-preserving uint64 form
        mine = sorted(k - (1 << 63) for k, _ in q1["deletion"] + q1["insertion"]
                      + q1["heap_head"])
        assert 0 < len(mine) == q1["heap_size"] + len(q1["deletion"]) + len(
            q1["insertion"]) < 40
        assert mq._dump(0)["top"] < q1["top"]      # so every two-choice try picks queue 0
        with _live_holder(mq, workers.hold_queue_lock_and_sleep, 0):
            signal.setitimer(signal.ITIMER_REAL, 10.0)      # a guard: a wait never ends
            got = [mq._pop_once() for _ in mine]
        assert "busy" not in got, got                    # a pop that waited and gave up
        assert [k for k, _ in got] == mine
        assert mq.recover_dead_locks() == 1
        mq._check()
        rest = sorted(mq.pop_many(64)[0].tolist())
        assert rest == sorted(set(range(1, 41)) - set(mine))


def test_native_handles_drive_the_compiled_core_from_c(no_shm_leak):
    """_native_handles hands out the core for C/C++ drivers (bench/cxx/kit_mq.hpp): its
    push and pop, called through their addresses on their handles (here with ctypes),
    move every item exactly once and keep the queue's invariants."""
    import ctypes

    class Elem(ctypes.Structure):
        _fields_ = [("key", ctypes.c_uint64), ("value", ctypes.c_int64)]
    with MultiQueue(4096, n_queues=4, seed=3) as mq:
        nat = mq._native_handles(3)
        base = nat["handles"].ctypes.data + nat["offset"]
        assert base % CACHE_LINE == 0 and nat["stride"] % CACHE_LINE == 0   # no shared line
        push = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, Elem)(nat["push"])
        pop = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.POINTER(Elem))(nat["pop"])
        hs = [base + k * nat["stride"] for k in range(3)]
        rng = np.random.default_rng(0)
        keys = rng.integers(0, 1 << 40, 1000)
        for i, k in enumerate(keys):          # keys mapped as the docstring says
            assert push(nat["core"], hs[i % 3], Elem(int(k) ^ (1 << 63), i)) == 1
        assert len(mq) == 1000
        mq._check()
        got, e = [], Elem()
        while pop(nat["core"], hs[len(got) % 3], ctypes.byref(e)) == 1:
            got.append((e.key ^ (1 << 63), e.value))
        assert sorted(v for _, v in got) == list(range(1000))
        assert all(keys[v] == k for k, v in got)
        assert len(mq) == 0
        mq._check()
        with pytest.raises(ValueError, match="n must be >= 1"):
            mq._native_handles(0)
    with MultiQueue(16, key_dtype="float64") as fq, pytest.raises(ValueError, match="int64"):
        fq._native_handles(1)
