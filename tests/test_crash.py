"""Crash consistency of the MultiQueue's lock journal, exhaustively.

A process is killed (SIGKILL) after every single store of a push or a pop, while it
holds the queue's lock; a survivor takes the lock over and repairs the heap. Then
the survivor itself is killed after every store of that repair, and a third
process repairs again (a double fault). Every time, the queue must be a valid heap
holding exactly the right multiset: a push in flight is completed, a pop in flight
is rolled back unless it had committed (then the dead process had the element); an
operation that died before its journal entry was complete never happened.
"""
import collections
import os
import signal

import numpy as np
import pytest

from relaxed import MultiQueue
from relaxed import _multiqueue
from relaxed.shm import Segment


def killed_in_child(fn):
    pid = os.fork()
    if pid == 0:
        try:
            fn()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def drain(mq):
    k, v = mq.pop_many(10_000)
    return collections.Counter(zip(k.tolist(), v.tolist()))


def assert_allowed(mq, orig, op, new_item, where):
    mq._check()
    got = drain(mq)
    if op == "push":
        # died before the journal named the push: it never happened; after: completed
        want = orig + collections.Counter([new_item])
        assert got in (orig, want), f"{where}: push half done: got {got - want} extra, " \
                                    f"{want - got} missing"
    else:
        if got == orig:
            return                      # rolled back
        missing = orig - got
        assert not (got - orig) and sum(missing.values()) == 1, \
            f"{where}: extra {got - orig}, missing {missing}"
        ((k, _), _), = missing.items()
        assert k == min(key for key, _ in orig), f"{where}: lost a non-minimal item {missing}"


@pytest.mark.parametrize("op", ["push", "pop"])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 13, 21, 40])
def test_kill_after_every_store_then_kill_the_recoverer(op, n):
    rng = np.random.default_rng(n)
    items = [(int(k), i) for i, k in enumerate(rng.integers(0, 20, n))]   # duplicate keys
    new_item = (int(rng.integers(-5, 25)), 999)
    orig = collections.Counter(items)
    double = n in (3, 13, 40)
    with MultiQueue(64, n_queues=1, shared=True, seed=0) as mq:
        for k, v in items:
            mq.push(k, v)
        seg = Segment.attach(mq.name)
        snap0 = bytes(seg.buf)

        def operation():
            _multiqueue._crash_after(k1)
            if op == "push":
                mq.push(*new_item)
            else:
                mq.pop()
        k1 = 0
        while True:
            seg.buf[:] = snap0
            if not killed_in_child(operation):
                break                       # k1 is past the last crash point
            snap1 = bytes(seg.buf)
            assert mq.recover_dead_locks() == 1
            assert_allowed(mq, orig, op, new_item, f"killed at store {k1}")
            if double:
                k2 = 0
                while True:
                    seg.buf[:] = snap1

                    def recovery():
                        _multiqueue._crash_after(k2)
                        mq.recover_dead_locks()
                    if not killed_in_child(recovery):
                        break
                    assert mq.recover_dead_locks() == 1
                    assert_allowed(mq, orig, op, new_item,
                                   f"killed at store {k1}, recoverer killed at store {k2}")
                    k2 += 1
                assert k2 > 0
            k1 += 1
        assert k1 > 0, "no crash point was reached"
        seg.buf[:] = snap0
        seg.close()
