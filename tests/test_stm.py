"""TL2 STM: the bank invariant across threads and processes, a holder SIGKILLed
mid-commit, both clocks, every requestor-aborts conflict policy, bad input."""
import pickle
import signal
import threading

import multiprocess as mp
import pytest

from relaxed import TL2, TransactionAborted, conflict
from tests.conftest import scaled
from tests.workers import bank, bank_py

CLOCKS = ["global", "multicounter"]
POLICIES = ["randomized", "deterministic", "backoff", "abort", "wait"]


def funded(n, clock="global", per=1000, **kw):
    stm = TL2(n, clock=clock, **kw)
    stm.atomically(lambda tx: [tx.write(i, per) for i in range(n)])
    return stm


def test_single_thread_semantics():
    with TL2(8, seed=0) as stm:
        assert stm.snapshot().tolist() == [0] * 8
        assert stm.atomically(lambda tx: tx.read(3)) == 0

        def body(tx):
            tx.write(2, 7)
            assert tx.read(2) == 7                   # reads see the transaction's writes
            tx.write(2, tx.read(2) + 1)
            return "done"
        assert stm.atomically(body) == "done"
        assert stm.peek(2) == 8
        with stm.transaction() as tx:
            tx.write(0, -5)
        assert stm.snapshot().tolist() == [-5, 0, 8, 0, 0, 0, 0, 0]
        with pytest.raises(ZeroDivisionError):        # an exception rolls back
            with stm.transaction() as tx:
                tx.write(1, 99)
                1 / 0
        assert stm.peek(1) == 0
        assert stm._check()


@pytest.mark.parametrize("clock", CLOCKS)
@pytest.mark.parametrize("policy", POLICIES)
def test_bank_threads_nogil(clock, policy, no_shm_leak):
    n, T, per = 16, 4, 1000
    stm = funded(n, clock, per, conflict=conflict.policy(policy, B=2e-6) if policy != "wait"
                 else "wait", n_stripes=8)
    results = [None] * T

    def run(t):
        results[t] = stm._bank(scaled(20_000), audit_every=50, seed=t)
    ths = [threading.Thread(target=run, args=(t,)) for t in range(T)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    snap = stm.snapshot()
    assert snap.sum() == n * per                      # no update lost
    for r in results:
        assert r["violations"] == 0                   # every audit saw the same total
        assert r["total_seen"] == n * per
        assert r["commits"] == scaled(20_000)         # transfers + audits, each once
    assert stm._check()
    stm.close()


@pytest.mark.parametrize("clock", CLOCKS)
def test_bank_python_level_threads(clock):
    stm = funded(10, clock, 100)
    ths = [threading.Thread(target=bank_py, args=(stm, 300, s)) for s in range(3)]
    for th in ths:
        th.start()
    sums = [int(stm.snapshot().sum()) for _ in range(50)]
    for th in ths:
        th.join()
    assert set(sums) == {1000}
    assert stm.snapshot().sum() == 1000
    stm.close()


@pytest.mark.parametrize("clock", CLOCKS)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_bank_processes(clock, method, no_shm_leak):
    n, per = 32, 1000
    stm = funded(n, clock, per, shared=True)
    ctx = mp.get_context(method)
    with ctx.Pool(3) as pool:
        res = pool.starmap(bank, [(stm, scaled(20_000), s, 40) for s in range(3)])
    assert stm.snapshot().sum() == n * per
    assert all(r["violations"] == 0 and r["total_seen"] == n * per for r in res)
    assert stm._check()
    stm.close()


@pytest.mark.parametrize("clock", CLOCKS)
@pytest.mark.parametrize("crash_after", [0, 5, 123])
def test_holder_killed_mid_commit_is_repaired(clock, crash_after, no_shm_leak):
    """A process dies holding stripe locks with half its writes done: the
    survivors roll its commit forward from the redo log and carry on."""
    n, per = 8, 1000
    stm = funded(n, clock, per, shared=True, n_stripes=4)
    ctx = mp.get_context("fork")
    p = ctx.Process(target=bank, args=(stm, 10_000, 7, 0, crash_after))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    r = stm._bank(2_000, audit_every=10, seed=1)       # must not deadlock
    assert r["violations"] == 0 and r["total_seen"] == n * per
    assert stm.snapshot().sum() == n * per
    stm._repair_dead()
    assert stm._check()
    stm.close()


@pytest.mark.parametrize("phase", ["locking", "writing"])
def test_dead_holder_repaired_by_repair_dead(phase):
    """A holder that died while locking is rolled back (its stripe gets its old
    version back, nothing written); one that died writing is rolled forward."""
    stm = funded(4, per=10, shared=True)
    before = stm.snapshot()
    ctx = mp.get_context("fork")
    p = ctx.Process(target=bank, args=(stm, 100, 3, 0, 0, phase))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    assert stm._repair_dead() >= 1
    after = stm.snapshot()
    assert after.sum() == 40
    if phase == "locking":
        assert (after == before).all()
    else:
        assert (after != before).sum() == 2           # the transfer completed
    assert stm._check()
    stm.close()


def test_pickles_as_handle_and_attach():
    stm = funded(5, shared=True, per=3)
    other = pickle.loads(pickle.dumps(stm))
    assert other.snapshot().tolist() == [3] * 5
    other.atomically(lambda tx: tx.write(4, 9))
    assert stm.peek(4) == 9
    other.close()
    private = TL2(3)
    with pytest.raises(TypeError, match="shared=True"):
        pickle.dumps(private)
    private.close()
    stm.close()


def test_bad_input():
    with pytest.raises(ValueError, match="n_words"):
        TL2(0)
    with pytest.raises(TypeError, match="n_words"):
        TL2(2.5)
    with pytest.raises(ValueError, match="clock"):
        TL2(4, clock="lamport")
    with pytest.raises(ValueError, match="requestor-wins"):
        TL2(4, conflict="rw-randomized")
    with pytest.raises(TypeError, match="conflict"):
        TL2(4, conflict=3)
    with pytest.raises(ValueError, match="n_counters"):
        TL2(4, n_counters=4)
    with pytest.raises(ValueError, match=r"max_writes must be <= 2\*\*32"):
        TL2(4, max_writes=2**40)                          # (an OSError before)
    with pytest.raises(ValueError, match=r"n_words must be <= 2\*\*56"):
        TL2(2**62)                                        # (an OverflowError before)
    stm = TL2(4, max_writes=2)
    with pytest.raises(IndexError, match="out of range"):
        stm.atomically(lambda tx: tx.read(4))
    with pytest.raises(IndexError, match="out of range"):
        stm.atomically(lambda tx: tx.write(-1, 0))
    with pytest.raises(TypeError, match="int64"):
        stm.atomically(lambda tx: tx.write(0, 1.5))
    with pytest.raises(ValueError, match="max_writes"):
        stm.atomically(lambda tx: [tx.write(i, 1) for i in range(3)])
    leaked = []
    stm.atomically(lambda tx: leaked.append(tx))
    with pytest.raises(RuntimeError, match="transaction is over"):
        leaked[0].write(0, 1)                          # a write outside a transaction
    with pytest.raises(RuntimeError, match="nested"):
        stm.atomically(lambda tx: stm.atomically(lambda t2: t2.read(0)))
    with pytest.raises(TypeError, match="callable"):
        stm.atomically(5)
    assert stm.snapshot().tolist() == [0, 0, 0, 0]      # nothing leaked through
    assert stm._check()
    stm.close()
    with pytest.raises(RuntimeError, match="closed"):
        stm.snapshot()
    with pytest.raises(RuntimeError, match="closed"):
        stm.n_words                                      # (0 before)


def test_close_waits_for_transactions_in_other_threads():
    """close() refuses while another thread is inside a transaction or a snapshot (whose
    read loop runs without the GIL: unmapping under it crashed the process), and
    succeeds once that thread is done."""
    stm = TL2(4)
    inside, release = threading.Event(), threading.Event()

    def hold():
        with stm.transaction() as tx:
            tx.write(0, 7)
            inside.set()
            release.wait(10)
    t = threading.Thread(target=hold)
    t.start()
    assert inside.wait(10)
    with pytest.raises(RuntimeError, match=r"close\(\) called while 1 call\(s\) are running"):
        stm.close()
    release.set()
    t.join()
    assert stm.snapshot().tolist() == [7, 0, 0, 0]     # committed, and open still
    big = TL2(200_000)
    started, seen = threading.Event(), []

    def snapshots():                                   # until the handle is closed
        try:
            while True:
                seen.append(int(big.snapshot().sum()))
                started.set()
        except RuntimeError as e:
            seen.append(str(e))
    snaps = threading.Thread(target=snapshots)
    snaps.start()
    assert started.wait(10)
    while not big.closed:                              # a close races the snapshots
        try:
            big.close()
        except RuntimeError as e:
            assert "call(s) are running in other threads" in str(e)
    snaps.join()
    assert seen[0] == 0 and "closed" in seen[-1]
    assert stm._check()
    stm.close()


def test_aborts_raise_for_callers_who_retry():
    stm = TL2(2, conflict="abort")
    with pytest.raises(TransactionAborted):
        with stm.transaction() as tx:
            tx.read(0)
            other = threading.Thread(target=lambda: stm.atomically(lambda t: t.write(0, 1)))
            other.start()
            other.join()
            tx.write(1, tx.read(0) + 1)                # word 0 is newer than our start
    assert stm.snapshot().tolist() == [1, 0]           # the aborted write never landed
    assert stm.stats()["aborts"] == 1
    stm.close()


def intset_keys(words, universe):
    """Walk the list from the head; assert it is sorted and acyclic."""
    keys, cur = [], int(words[universe])
    while cur != -1:
        assert 0 <= cur < universe and (not keys or cur > keys[-1]), "list out of order"
        keys.append(cur)
        cur = int(words[cur])
    return keys


@pytest.mark.parametrize("clock", CLOCKS)
def test_intset_threads_conserve_membership(clock):
    U = 64
    stm = TL2(U + 1, clock=clock, conflict=conflict.policy("randomized", B=2e-6))
    stm.atomically(lambda tx: [tx.write(i, -1) for i in range(U + 1)])
    res = [None] * 3

    def run(t):
        res[t] = stm._intset(scaled(5_000), update_pct=40, seed=t)
    ths = [threading.Thread(target=run, args=(t,)) for t in range(3)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    keys = intset_keys(stm.snapshot(), U)
    assert len(keys) == sum(r["inserted"] - r["removed"] for r in res)
    assert all(r["commits"] == scaled(5_000) for r in res)
    assert stm._check()
    stm.close()
