"""MultiCounter benchmarks: increments/s vs workers, and read() error.

Competitors: ``multicounter`` (4 counters per worker, nogil ``increment_many``),
``multicounter-sticky`` (the same with ``stickiness=STICKINESS``: a handle keeps its
chosen counter for that many increments), ``one-atomic`` (MultiCounter(1): every
increment is a fetch_add on one line),
``python-lock`` (an int behind a threading.Lock), and both MultiCounters across
processes sharing one segment. read() error is measured while two threads increment
(for both MultiCounters): each read
is bracketed by two exact sums, and the error is its distance outside that interval
(so increments made while reading are not counted as error).
"""
from __future__ import annotations

import threading
import time

import multiprocess as mp
import numpy as np
from tqdm import tqdm

from bench.common import Series
from relaxed import MultiCounter

#: the sticky MultiCounter's stickiness: the choice (two loads of lines the other
#: cores write, then the chosen line's transfer) is paid once per this many increments;
#: at a few hundred it still costs about as much as the increments it serves
STICKINESS = 1024


def _threads(fn, T):
    barrier = threading.Barrier(T)
    times = [None] * T

    def body(w):
        barrier.wait()
        t0 = time.perf_counter()
        fn()
        times[w] = (t0, time.perf_counter())
    ts = [threading.Thread(target=body, args=(w,)) for w in range(T)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return max(t[1] for t in times) - min(t[0] for t in times)


def _proc_body(c, iters, barrier, out):
    barrier.wait()
    t0 = time.perf_counter()
    c.increment_many(iters)
    out.put((t0, time.perf_counter()))


def _processes(c, P, iters):
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(P), ctx.Queue()
    ps = [ctx.Process(target=_proc_body, args=(c, iters, barrier, out)) for _ in range(P)]
    for p in ps:
        p.start()
    times = [out.get(timeout=600) for _ in ps]
    for p in ps:
        p.join()
    return max(t[1] for t in times) - min(t[0] for t in times)


def run(args, workers_list):
    iters, py_iters = args.iters * 4, args.py_iters
    rows = []
    bar = tqdm(total=len(workers_list) * (args.reps + 1), desc="counter", leave=False)
    for T in workers_list:
        mc = MultiCounter(4 * T, seed=args.seed)
        sticky = MultiCounter(4 * T, seed=args.seed, stickiness=STICKINESS)
        one = MultiCounter(1, seed=args.seed)
        shared = MultiCounter(4 * T, shared=True, seed=args.seed)
        shared_sticky = MultiCounter(4 * T, shared=True, seed=args.seed, stickiness=STICKINESS)
        lock, box = threading.Lock(), [0]

        def py_inc():
            for _ in range(py_iters):
                with lock:
                    box[0] += 1
        series = {k: Series(k, {"workers": T, "iters_per_worker": n})
                  for k, n in (("multicounter", iters), ("multicounter-sticky", iters),
                               ("one-atomic", iters), ("python-lock", py_iters),
                               ("multicounter-processes", iters),
                               ("multicounter-sticky-processes", iters))}
        for rep in range(args.reps + 1):
            r = {
                "multicounter": iters * T / _threads(lambda: mc.increment_many(iters), T),
                "multicounter-sticky": iters * T / _threads(
                    lambda: sticky.increment_many(iters), T),
                "one-atomic": iters * T / _threads(lambda: one.increment_many(iters), T),
                "python-lock": py_iters * T / _threads(py_inc, T),
                "multicounter-processes": iters * T / _processes(shared, T, iters),
                "multicounter-sticky-processes": iters * T / _processes(shared_sticky, T,
                                                                        iters),
            }
            if rep:
                for k, v in r.items():
                    series[k].rates.append(v)
            bar.update()
        total = (args.reps + 1) * iters * T
        counters = (mc, sticky, one, shared, shared_sticky)
        assert all(c.exact() == total for c in counters), "an increment was lost"
        for c in counters:
            c.close()
        rows += [s.summary() for s in series.values()]
    bar.close()
    return rows, [read_error(m, s, args.seed) for s in (1, STICKINESS)
                  for m in (4, 16, 64, 256)]


def read_error(m, stickiness, seed):
    """|read() - exact| / m while two threads increment (see the module notes)."""
    c = MultiCounter(m, seed=seed, stickiness=stickiness)
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            c.increment_many(20_000)
    ts = [threading.Thread(target=hammer) for _ in range(2)]
    for t in ts:
        t.start()
    samples = [c._read_errors(200) for _ in range(200)]
    stop.set()
    for t in ts:
        t.join()
    e = np.abs(np.concatenate(samples)) / m
    out = {"n_counters": m, "stickiness": stickiness, "mean": float(e.mean()),
           "p99": float(np.percentile(e, 99)), "max": float(e.max()),
           "bound_per_counter": c.error_bound() / m, "reads": int(e.size),
           "increments": int(c.exact())}
    c.close()
    return out
