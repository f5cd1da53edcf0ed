"""Parameter store: the closed-form check (k pushes of g move the weights by
exactly k·lr·g and the versions by k) on threads and processes, deferral on a
held shard, a dead holder's lock taken over, nothing leaked."""
import os
import pickle
import signal
import threading

import multiprocess as mp
import numpy as np
import pytest

from sgd_shm.ps import ParameterStore, WaitPolicy
from sgd_shm.ps.store import LINE
from tests.workers import ps_hold_lock_and_die, ps_push_fixed

LR = 0.25                                    # a power of two: every sum below is exact


def expected(n, k):
    return -k * LR * np.arange(1, n + 1, dtype=np.float64)


def test_closed_form_one_worker(no_shm_leak):
    with ParameterStore(100, n_shards=7, n_workers=1) as s:
        ps_push_fixed(s, 40, LR, 0)
        np.testing.assert_array_equal(s.pull()[0], expected(100, 40))
        assert s.version == 40 and (s.shard_versions() == 40).all()
        slot = s.slot(0)
        assert slot["pushes"] == 40 and slot["pulled_version"] == 39
        assert slot["staleness_sum"] == 0
        assert s._check()


def test_closed_form_threads(no_shm_leak):
    T, k = 4, 500
    with ParameterStore(64, n_shards=4, n_workers=T) as s:
        ths = [threading.Thread(target=ps_push_fixed, args=(s, k, LR, t)) for t in range(T)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        np.testing.assert_array_equal(s.pull()[0], expected(64, T * k))   # no update lost
        assert s.version == T * k and (s.shard_versions() == T * k).all()
        assert sum(s.slot(t)["pushes"] for t in range(T)) == T * k
        assert s._check()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_closed_form_processes(method, no_shm_leak):
    P, k = 3, 300
    s = ParameterStore(50, n_shards=5, n_workers=P)
    with mp.get_context(method).Pool(P) as pool:
        assert pool.starmap(ps_push_fixed, [(s, k, LR, w) for w in range(P)]) == [k] * P
    np.testing.assert_array_equal(s.pull()[0], expected(50, P * k))
    assert s.version == P * k and (s.shard_versions() == P * k).all()
    assert s._check()
    s.close()


def test_held_shard_is_deferred_then_applied():
    s = ParameterStore(8, n_shards=2, n_workers=1)
    s._lock_shard_for_test(1)                          # a live holder (this process)
    res = s.push(np.ones(8), 0, lr=1.0, worker=0, wait=WaitPolicy(spins=10, yields=2))
    assert res.applied == [0] and res.deferred == [1]
    assert s.version == 0 and s.shard_versions().tolist() == [1, 0]
    assert s.slot(0)["deferred"] == 1
    np.testing.assert_array_equal(s.weights, [-1] * 4 + [0] * 4)
    s._locks[LINE_OF(1)] = 0                           # the holder lets go
    s.push_deferred(res)
    assert res.deferred == [] and res.applied == [0, 1]
    assert s.version == 1 and s.shard_versions().tolist() == [1, 1]
    np.testing.assert_array_equal(s.weights, [-1] * 8)
    s.close()


def LINE_OF(shard):
    from sgd_shm.ps.store import LINE
    return shard * LINE


def _kill_while_holding(store, shard):
    """A forked process takes shard's lock and is SIGKILLed holding it."""
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=ps_hold_lock_and_die, args=(store, shard, ready))
    p.start()
    assert ready.wait(30)
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)


def test_dead_holder_does_not_block(no_shm_leak):
    s = ParameterStore(12, n_shards=3, n_workers=1)
    _kill_while_holding(s, 2)
    res = s.push(np.ones(12), 0, lr=1.0, worker=0, wait=WaitPolicy(spins=10, yields=2))
    assert res.deferred == [] and s.version == 1   # the dead pid's lock was taken over
    np.testing.assert_array_equal(s.weights, -np.ones(12))
    assert s._check()
    s.close()


def test_staleness_recorded():
    s = ParameterStore(4, n_shards=1, n_workers=2)
    _, v0 = s.pull(worker=0)
    for _ in range(3):
        _, v = s.pull(worker=1)
        s.push(np.ones(4), v, lr=1.0, worker=1)
    res = s.push(np.ones(4), v0, lr=1.0, worker=0)
    assert res.staleness == 3 and s.slot(0)["staleness_sum"] == 3
    s.close()


def test_pickle_attach_and_bad_input():
    s = ParameterStore(6, n_shards=2, n_workers=2, init=np.arange(6.0))
    t = pickle.loads(pickle.dumps(s))
    np.testing.assert_array_equal(t.pull()[0], np.arange(6.0))
    t.close()
    with pytest.raises(ValueError, match="shape"):
        s.push(np.ones(5), 0, lr=0.1)
    with pytest.raises(ValueError, match="NaN"):
        s.push(np.full(6, np.nan), 0, lr=0.1)
    with pytest.raises(ValueError, match="lr: must be a finite number"):
        s.push(np.ones(6), 0, lr=float("inf"))
    with pytest.raises(ValueError, match="worker"):
        s.pull(worker=2)
    with pytest.raises(ValueError, match="version"):
        s.push(np.ones(6), -1, lr=0.1)
    with pytest.raises(TypeError, match="WaitPolicy"):
        s.push(np.ones(6), 0, lr=0.1, wait="spin")
    with pytest.raises(ValueError, match="n_shards"):
        ParameterStore(3, n_shards=4)
    with ParameterStore(3, n_workers=1, shared=False) as small:     # default: one per weight
        assert small.n_shards == 3
    with ParameterStore(30, n_workers=1, shared=False) as big:
        assert big.n_shards == 8
    with pytest.raises(ValueError, match="init"):
        ParameterStore(3, n_shards=1, init=[1.0, np.inf, 0])
    with pytest.raises(ValueError, match="spins"):
        WaitPolicy(spins=-1)
    private = ParameterStore(3, n_shards=1, shared=False)
    with pytest.raises(TypeError, match="shared=True"):
        pickle.dumps(private)
    private.close()
    s.close()
    with pytest.raises(RuntimeError, match="closed"):
        s.pull()


def test_staleness_histogram_bins():
    """Bin 0 counts staleness 0; bin i counts [2**(i-1), 2**i); the sum over
    workers is the total. Oracle: the bins computed here by hand."""
    from sgd_shm.ps.store import staleness_bin
    assert [staleness_bin(t) for t in (0, 1, 2, 3, 4, 7, 8, -1, 2**40)] == \
        [0, 1, 2, 2, 3, 3, 4, 0, 31]
    with ParameterStore(8, n_shards=2, n_workers=2) as s:
        g = np.ones(8)
        _, v0 = s.pull(worker=0)
        for _ in range(5):                      # worker 1 pushes 5 fresh updates
            _, v = s.pull(worker=1)
            s.push(g, v, lr=LR, worker=1)
        s.push(g, v0, lr=LR, worker=0)          # staleness 5 -> bin 3
        assert s.staleness_histogram(1)[0] == 5 and s.staleness_histogram(1).sum() == 5
        h0 = s.staleness_histogram(0)
        assert h0[3] == 1 and h0.sum() == 1
        assert (s.staleness_histogram() == h0 + s.staleness_histogram(1)).all()
        assert s.slot(0)["applied_weight"] == 1.0


def test_snapshot_and_restore(no_shm_leak):
    """snapshot under concurrent pushes is consistent shard by shard (every
    shard's copy equals its version's closed form); restore puts a snapshot
    back, and a SIGKILLed lock holder does not block snapshot."""
    n, T, k = 64, 2, 300
    with ParameterStore(n, n_shards=4, n_workers=T) as s:
        ths = [threading.Thread(target=ps_push_fixed, args=(s, k, LR, t)) for t in range(T)]
        for th in ths:
            th.start()
        snaps = [s.snapshot() for _ in range(20)]
        for th in ths:
            th.join()
        for w, vers, v in snaps:
            assert (vers >= v).all()
            for sh in range(4):
                lo, hi = s.bounds[sh], s.bounds[sh + 1]
                np.testing.assert_array_equal(w[lo:hi], expected(n, vers[sh])[lo:hi])
        w, vers, v = snaps[len(snaps) // 2]
        s.restore(w, vers, v)
        assert s.version == v and (s.shard_versions() == vers).all()
        np.testing.assert_array_equal(s.pull()[0], w)
        with pytest.raises(ValueError, match="version"):
            s.restore(w, vers, int(vers.min()) + 1)
        with pytest.raises(ValueError, match="weights"):
            s.restore(w[:-1], vers, v)
        with pytest.raises(ValueError, match="shard_versions"):
            s.restore(w, vers[:2], v)
        _kill_while_holding(s, 2)
        w2, vers2, _ = s.snapshot()                 # takes over the dead holder's lock
        assert (vers2 == vers).all() and s._check()
        _kill_while_holding(s, 1)
        s._lock_shard_for_test(3)                    # a live holder (this process) stays
        assert s.release_dead_locks() == 1
        assert s._locks[::LINE].tolist() == [0, 0, 0, os.getpid()]


def test_wait_policy_from_ski_rental_conflict_policies():
    """A relaxed.conflict policy decides how long a push yields on a held shard before
    deferring it: "abort" and a finite deterministic delay defer, "wait" waits until
    the holder lets go (here a thread that releases after 30 ms)."""
    from sgd_shm.core.atomics import store_release_py
    from sgd_shm.ps.store import LINE
    g = np.ones(8)
    with ParameterStore(8, n_shards=2, n_workers=1) as s:
        s._lock_shard_for_test(1)
        for pol in ("abort", WaitPolicy(conflict="deterministic", B=1e-3).conflict):
            res = s.push(g, 0, lr=LR, wait=WaitPolicy(spins=10, conflict=pol))
            assert res.applied == [0] and res.deferred == [1], pol
            s.push_deferred(res, wait=WaitPolicy(spins=10, conflict="abort"))
            assert res.deferred == [1]
        lock = s._locks[LINE:LINE + 1]
        t = threading.Timer(0.03, store_release_py, args=(lock, 0))
        t.start()
        res = s.push(g, 0, lr=LR, wait=WaitPolicy(spins=10, conflict="wait"))
        t.join()
        assert res.deferred == [] and res.applied == [0, 1]
    with pytest.raises(ValueError, match="requestor-wins"):
        WaitPolicy(conflict="rw-deterministic")
    with pytest.raises(TypeError, match="conflict"):
        WaitPolicy(conflict=2.0)
    assert WaitPolicy(conflict="randomized", B=1e-4).budget() <= 1e-4
    assert WaitPolicy().budget() is None
