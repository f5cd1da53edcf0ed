"""A short tour of the kit's structures: ``python -m relaxed``.

1. Two producer and two consumer *processes* share one MultiQueue in shared
   memory; every value pushed is popped exactly once.
2. Relaxation quality: rank error of pops with n queues against the theory
   5/6·n − 1 + 1/(6n) for two choices.
3. The nogil hold loop on 1 and 2 Python threads (ops/s).
4. Two processes increment one MultiCounter; exact() is exact, read() is close.
5. Greedy MIS on a random graph: the prefix engine, a MultiQueue and a k-relaxed scheduler, on
   1 and 2 threads: always the sequential greedy set; the wasted iterations.
6. A TL2 bank shared by 2 processes: transfers with audits; the total holds.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import multiprocess as mp
import numpy as np

from relaxed import TL2, MultiCounter, MultiQueue, greedy_mis, sequential_greedy_mis
from relaxed.graphs import erdos_renyi


def _produce(mq, first, n, seed):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 1 << 40, n).tolist()
    for i, k in enumerate(keys):
        mq.push(k, first + i)


def _consume(mq, done, out):
    got = []
    while True:
        finished = done.is_set()        # read first: every push ended before the pop
        r = mq.try_pop()
        if r is not None:
            got.append(r[1])
        elif finished:                  # a full scan after every push found it empty
            break
    out.put(np.asarray(got, dtype=np.int64))


def _rank_errors(mq, n, rng):
    """Mean rank error of n pop/push pairs (hold model), replayed exactly."""
    from relaxed.quality import rank_errors_sequential
    init = rng.integers(0, 1 << 40, n)
    mq.push_many(init, np.arange(n))
    popped = np.empty(n, dtype=np.int64)
    pushed = np.empty(n, dtype=np.int64)
    incs = rng.integers(0, 1 << 40, n).tolist()
    for i in range(n):
        k, v = mq.pop()
        popped[i] = k
        pushed[i] = k + incs[i]
        mq.push(int(pushed[i]), v)
    return rank_errors_sequential(init, popped, pushed)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m relaxed", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=100_000, help="values per producer (default 100000)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.items < 1:
        ap.error("--items must be >= 1")
    if args.seed < 0:
        ap.error(f"--seed must be an int >= 0, got {args.seed}")
    rng = np.random.default_rng(args.seed)
    ctx = mp.get_context("fork")
    print(f"relaxed demo  (python {sys.version.split()[0]}, {os.cpu_count()} CPUs, seed {args.seed})")
    _tour_exactly_once(ctx, args.items, args.seed)
    _tour_rank_error(rng, args.seed)
    _tour_hold(rng, args.seed)
    _tour_counter(ctx, args.seed)
    _tour_mis(max(1000, 10 * args.items), args.seed)
    _tour_bank(ctx, args.seed)
    return 0


def _tour_exactly_once(ctx, n, seed):
    print("\n1. MultiQueue shared by 2 producer + 2 consumer processes")
    t0 = time.perf_counter()
    with MultiQueue(2 * n, n_queues=8, shared=True, seed=seed) as mq:
        done, out = ctx.Event(), ctx.Queue()
        prods = [ctx.Process(target=_produce, args=(mq, i * n, n, seed + i)) for i in range(2)]
        cons = [ctx.Process(target=_consume, args=(mq, done, out)) for _ in range(2)]
        for p in prods + cons:
            p.start()
        for p in prods:
            p.join()
        done.set()
        got = np.sort(np.concatenate([out.get() for _ in cons]))
        for p in cons:
            p.join()
        ok = np.array_equal(got, np.arange(2 * n))
        dt = time.perf_counter() - t0
        print(f"   pushed {2 * n:,}, popped {len(got):,}, exactly once: {ok}  "
              f"({4 * n / dt / 1e6:.2f} M Python-level ops/s over 4 processes, {dt:.2f} s)")


def _tour_rank_error(rng, seed):
    print("\n2. Rank error of pops (1 thread, 50k pop/push pairs after a 50k prefill)")
    print("   queues   mean rank error   theory 5/6·n−1+1/(6n)")
    for q in (1, 4, 8, 16):
        with MultiQueue(100_001, n_queues=q, seed=seed) as mq:
            err = _rank_errors(mq, 50_000, rng)
        th = 5 / 6 * q - 1 + 1 / (6 * q)
        print(f"   {q:6d}   {err.mean():15.2f}   {th:10.2f}")


def _tour_hold(rng, seed):
    print("\n3. Hold model (pop, push a larger key), nogil loop, 1M prefill, 8 queues")
    with MultiQueue(2_000_000, n_queues=8, seed=seed) as mq:
        mq.push_many(rng.integers(0, 1 << 32, 1_000_000), np.arange(1_000_000))
        mq._hold(200_000, 1 << 31)
        for threads in (1, 2):
            iters = 1_000_000
            ts = [threading.Thread(target=mq._hold, args=(iters, 1 << 31)) for _ in range(threads)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            dt = time.perf_counter() - t0
            print(f"   {threads} thread(s): {2 * iters * threads / dt / 1e6:6.2f} M ops/s")
        mq._check()


def _tour_counter(ctx, seed):
    print("\n4. MultiCounter: 2 processes x 1M increments")
    with MultiCounter(16, shared=True, seed=seed) as c:
        ps = [ctx.Process(target=c.increment_many, args=(1_000_000,)) for _ in range(2)]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        reads = [c.read() for _ in range(1000)]
        err = max(abs(r - c.exact()) for r in reads)
        print(f"   exact() = {c.exact():,}; worst |read() - exact()| over 1000 reads = {err} "
              f"(documented bound {c.error_bound()})")


def _tour_mis(n, seed):
    print(f"\n5. Greedy MIS, Erdős–Rényi graph n = {n:,}, m = {5 * n:,}, random priorities")
    g = erdos_renyi(n, 5 * n, seed=seed)
    want = sequential_greedy_mis(g, seed=seed)
    for label, opts in (("prefix engine (the default)", {}),
                        ("MultiQueue, 8 queues", {"scheduler": "multiqueue", "n_queues": 8}),
                        ("k-relaxed, k = 16, adversarial",
                         {"scheduler": "k-relaxed", "k": 16, "mode": "adversarial"})):
        for threads in (1, 2):
            res = greedy_mis(g, seed=seed, n_threads=threads, **opts)
            print(f"   {label:32s} {threads} thread(s): |MIS| = {int(res.mask.sum()):,}, "
                  f"equals sequential greedy: {bool((res.mask == want).all())}, "
                  f"wasted iterations: {res.stats.wasted}")


def _tour_bank(ctx, seed):
    print("\n6. TL2 bank, 64 accounts of 1000, 2 processes x 50k transfers with audits")
    with TL2(64, shared=True, seed=seed) as stm:
        stm.atomically(lambda tx: [tx.write(i, 1000) for i in range(64)])
        with ctx.Pool(2) as pool:
            res = pool.starmap(_bank, [(stm, 50_000, seed + i) for i in range(2)])
        print(f"   total after: {int(stm.snapshot().sum()):,} (64,000 before); audits that "
              f"saw another total: {sum(r['violations'] for r in res)} of "
              f"{sum(r['audits'] for r in res):,}; aborts: {sum(r['aborts'] for r in res):,}")
        stm._check()


def _bank(stm, n, seed):
    return stm._bank(n, audit_every=100, seed=seed)


if __name__ == "__main__":
    raise SystemExit(main())
