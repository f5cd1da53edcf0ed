"""MultiCounter benchmarks: increments/s vs workers, and read() error.

Competitors: ``multicounter`` (4 counters per worker, nogil ``increment_many``),
``one-atomic`` (MultiCounter(1): every increment is a fetch_add on one line),
``python-lock`` (an int behind a threading.Lock), and ``multicounter`` across processes
sharing one segment. read() error is measured while two threads increment: each read
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
        one = MultiCounter(1, seed=args.seed)
        shared = MultiCounter(4 * T, shared=True, seed=args.seed)
        lock, box = threading.Lock(), [0]

        def py_inc():
            for _ in range(py_iters):
                with lock:
                    box[0] += 1
        series = {k: Series(k, {"workers": T, "iters_per_worker": n})
                  for k, n in (("multicounter", iters), ("one-atomic", iters),
                               ("python-lock", py_iters), ("multicounter-processes", iters))}
        for rep in range(args.reps + 1):
            r = {
                "multicounter": iters * T / _threads(lambda: mc.increment_many(iters), T),
                "one-atomic": iters * T / _threads(lambda: one.increment_many(iters), T),
                "python-lock": py_iters * T / _threads(py_inc, T),
                "multicounter-processes": iters * T / _processes(shared, T, iters),
            }
            if rep:
                for k, v in r.items():
                    series[k].rates.append(v)
            bar.update()
        total = (args.reps + 1) * iters * T
        assert mc.exact() == total and one.exact() == total and shared.exact() == total, \
            "an increment was lost"
        for c in (mc, one, shared):
            c.close()
        rows += [s.summary() for s in series.values()]
    bar.close()

    errs = []
    for m in (4, 16, 64, 256):
        c = MultiCounter(m, seed=args.seed)
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
        errs.append({"n_counters": m, "mean": float(e.mean()), "p99": float(np.percentile(e, 99)),
                     "max": float(e.max()), "bound_per_counter": c.error_bound() / m,
                     "reads": int(e.size), "increments": int(c.exact())})
        c.close()
    return rows, errs
