"""MultiCounter: conservation across threads and processes, the read bound, bad input."""
import math
import pickle
import threading

import multiprocess as mp
import numpy as np
import pytest

import workers
from conftest import scaled
from naive import LockedCounter
from relaxed import MultiCounter


def test_smoke_and_sequential_exact():
    with MultiCounter(8, seed=0) as c:
        ref = LockedCounter()
        for _ in range(1000):
            c.increment()
            ref.increment()
        c.increment_many(5000)
        ref.increment(5000)
        assert c.exact() == ref.value() == 6000
        assert c.counters().sum() == 6000
        assert abs(c.read() - c.exact()) <= c.error_bound()
        c._check()


def test_single_counter_is_exact():
    c = MultiCounter(1, seed=0)
    c.increment_many(123)
    assert c.read() == c.exact() == 123 and c.error_bound() == 0
    c.close()


def test_error_bound_formula():
    for m in (2, 16, 1024):
        assert MultiCounter(m).error_bound() == int(m * (2 * math.log2(m) + 8))
        assert MultiCounter(m, stickiness=64).error_bound() == int(
            m * (2 * math.log2(m) + 8) * 64)


def test_sticky_increments_come_in_runs():
    """One handle with stickiness s adds to the counter it chose s times in a row, so
    after whole runs every counter holds a multiple of s; increment() keeps its run
    across calls."""
    with MultiCounter(8, seed=0, stickiness=16) as c:
        c.increment_many(16 * 100)
        assert c.exact() == 1600 and (c.counters() % 16 == 0).all()
        assert (c.counters() > 0).sum() > 1            # it did choose again
        before = c.counters()
        for _ in range(16):
            c.increment()
        grown = c.counters() - before
        assert sorted(grown.tolist())[-1] == 16 and grown.sum() == 16   # one run, one counter
        assert abs(c.read() - c.exact()) <= c.error_bound()


def test_sticky_handles_that_meet_on_a_counter_part_at_once(no_shm_leak):
    """Two handles on one segment, taking turns one increment at a time. Alone, a
    handle keeps its counter for s increments; when the other handle adds to the
    same counter in between, the handle's next add sees a value other than its last
    plus one and ends its run (it chooses again). So the handles never share a
    counter for long: the longest stretch of turns in which both add to one counter
    stays far below s. Without the check it would last until a run ran out (up to s)."""
    s = 200
    with MultiCounter(8, shared=True, seed=5, stickiness=s) as a:
        b = pickle.loads(pickle.dumps(a))                 # a second handle, same counters
        where, before = [], a.counters()
        for _ in range(4000):
            for h in (a, b):
                h.increment()
                now = a.counters()
                where.append(int(np.flatnonzero(now - before)[0]))
                before = now
        assert a.exact() == 8000 and b.exact() == 8000
        streak = longest = 0
        for t in range(1, len(where)):                    # consecutive turns, one counter
            streak = streak + 1 if where[t] == where[t - 1] else 0
            longest = max(longest, streak)
        assert longest <= 8, longest
        # and each handle, while alone on its counter, still adds in runs of s
        assert max(np.bincount(where[0::2], minlength=8)) >= s
        b.close()


@pytest.mark.parametrize("stickiness", [1, 64, 1024])
def test_threads_conserve_and_reads_stay_within_bound(stickiness):
    n = scaled(500_000)
    c = MultiCounter(16, seed=1, stickiness=stickiness)
    ts = [threading.Thread(target=c.increment_many, args=(n,)) for _ in range(2)]
    for t in ts:
        t.start()
    errs = []
    while any(t.is_alive() for t in ts):
        errs.append(np.abs(c._read_errors(100)).max())
    for t in ts:
        t.join()
    assert c.exact() == 2 * n
    worst = max(errs + [abs(c.read() - c.exact())])
    assert worst <= c.error_bound(), f"read error {worst} exceeds the bound {c.error_bound()}"
    c.close()


@pytest.mark.parametrize("method, stickiness", [("fork", 1), ("spawn", 1), ("fork", 64),
                                                ("fork", 1024)])
def test_two_processes_million_increments_each(method, stickiness, no_shm_leak):
    ctx = mp.get_context(method)
    with MultiCounter(16, shared=True, seed=2, stickiness=stickiness) as c:
        ps = [ctx.Process(target=workers.increment, args=(c, 1_000_000)) for _ in range(2)]
        for p in ps:
            p.start()
        errs = []
        while any(p.is_alive() for p in ps):
            errs.append(np.abs(c._read_errors(100)).max())
        for p in ps:
            p.join()
            assert p.exitcode == 0
        assert c.exact() == 2_000_000
        reads = [c.read() for _ in range(1000)]
        worst = max(errs + [abs(r - 2_000_000) for r in reads])
        assert worst <= c.error_bound(), (
            f"read error {worst} exceeds the documented bound {c.error_bound()}")
        c._check()


def test_python_level_increments_across_processes(no_shm_leak):
    ctx = mp.get_context("fork")
    with MultiCounter(4, shared=True, seed=3) as c:
        ps = [ctx.Process(target=workers.increment, args=(c, 20_000, False)) for _ in range(2)]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        assert c.exact() == 40_000


def test_bad_input_and_close():
    with pytest.raises(ValueError, match="n_counters must be >= 1"):
        MultiCounter(0)
    with pytest.raises(TypeError, match="n_counters must be an int"):
        MultiCounter(2.0)
    with pytest.raises(TypeError, match="shared"):
        MultiCounter(2, shared=1)
    with pytest.raises(ValueError, match="stickiness must be >= 1"):
        MultiCounter(2, stickiness=0)
    with pytest.raises(TypeError, match="stickiness must be an int"):
        MultiCounter(2, stickiness=2.0)
    with MultiCounter(4, shared=True, stickiness=8) as c:      # the attached handle's too
        assert pickle.loads(pickle.dumps(c)).stickiness == 8
    c = MultiCounter(2)
    with pytest.raises(ValueError, match="k must be >= 0"):
        c.increment_many(-1)
    with pytest.raises(TypeError, match="k must be an int"):
        c.increment_many(1.0)
    with pytest.raises(ValueError, match=r"k must be <= 2\*\*63-1.*int64"):
        c.increment_many(2**63)                           # (an OverflowError before)
    with pytest.raises(TypeError, match="shared=True"):
        pickle.dumps(c)
    c.close()
    for call in (c.increment, c.read, c.exact, lambda: c.increment_many(1)):
        with pytest.raises(RuntimeError, match="closed"):
            call()
