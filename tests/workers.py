"""Functions run in worker processes by the concurrency tests (importable by name,
so they work with both the fork and the spawn start methods)."""
import os
import signal
import time

import numpy as np


def produce(mq, first_value, n, seed, bulk=False):
    rng = np.random.default_rng(seed)
    keys = rng.integers(-(1 << 40), 1 << 40, n)
    values = np.arange(first_value, first_value + n, dtype=np.int64)
    if bulk:
        for s in range(0, n, 4096):
            mq.push_many(keys[s:s + 4096], values[s:s + 4096])
    else:
        for k, v in zip(keys.tolist(), values.tolist()):
            mq.push(k, v)
    return n


def consume(mq, done, out_queue, bulk=False):
    got = []
    while True:
        if bulk:
            _, vals = mq.pop_many(512)
            if len(vals):
                got.append(vals)
                continue
        else:
            r = mq.try_pop()
            if r is not None:
                got.append(r[1])
                continue
        # empty after a full scan: finished only if the producers are done and it is
        # still empty when checked again after seeing that
        if done.is_set():
            r = mq.try_pop()
            if r is None:
                break
            got.append(r[1])
    arr = (np.concatenate(got) if bulk and got else np.asarray(got, dtype=np.int64))
    out_queue.put(arr.astype(np.int64))


def increment(counter, k, bulk=True):
    if bulk:
        counter.increment_many(k)
    else:
        for _ in range(k):
            counter.increment()


def hold_forever(mq, ready):
    ready.set()
    while True:
        mq._hold(10_000, 1 << 30)


def partial_then_die(mq, q, op, steps, key=0, value=0):
    mq._debug_partial(q, op, steps, key, value)
    os.kill(os.getpid(), signal.SIGKILL)


def attach_and_exit(name, kind):
    import relaxed
    obj = getattr(relaxed, kind).attach(name)
    n = len(obj) if kind == "MultiQueue" else obj.exact()
    return n


def attach_and_sleep(obj, ready):
    ready.set()
    time.sleep(60)


def hold_lock_and_sleep(mq, ready):
    mq._debug_partial(0, 1, 0, 5, 5)      # takes the lock, starts a push, stops
    ready.set()
    time.sleep(120)


def hold_queue_lock_and_sleep(mq, q, ready):
    mq._debug_partial(q, 1, 0, 1 << 40, 0)   # a key above every item: the lock, no write
    ready.set()
    time.sleep(120)


def bank(stm, n_tx, seed, audit_every=0, crash_after=-1, crash_in="writing"):
    """Random TL2 transfers in a worker process; returns the driver's counts."""
    return stm._bank(n_tx, audit_every=audit_every, seed=seed, crash_after=crash_after,
                     crash_in=crash_in)


def bank_py(stm, n_tx, seed):
    """Python-level transfers through atomically(); returns commits."""
    rng = np.random.default_rng(seed)
    n = stm.n_words
    for _ in range(n_tx):
        a, b = rng.choice(n, 2, replace=False)
        x = int(rng.integers(1, 10))

        def transfer(tx, a=int(a), b=int(b), x=x):
            tx.write(a, tx.read(a) - x)
            tx.write(b, tx.read(b) + x)
        stm.atomically(transfer)
    return stm.stats()["commits"]


def ps_push_fixed(store, k, lr, worker):
    """k pushes of the gradient g[i] = i + 1 (exact in float64 with lr a power of 2)."""
    g = np.arange(1, store.n_params + 1, dtype=np.float64)
    deferred = []
    for _ in range(k):
        _, v = store.pull(worker=worker)
        res = store.push(g, v, lr=lr, worker=worker)
        if res.deferred:
            deferred.append(res)
    for res in deferred:
        while res.deferred:
            store.push_deferred(res)
    return k


def ps_hold_lock_and_die(store, shard, ready):
    store._lock_shard_for_test(shard)
    ready.set()
    time.sleep(60)
