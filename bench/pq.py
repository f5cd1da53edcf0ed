"""Priority-queue throughput in the hold model, threads and processes.

Hold model (as in the MultiQueue papers): prefill ``--prefill`` keys uniform in
[0, 2^32); each worker then repeats *pop, then push key + U[0, 2^32)* with the
same value. One pop and one push count as two operations. Every competitor
implements the same protocol: ``build(T)`` returns a structure with the prefill,
``work(struct, worker, iters, incs)`` runs the loop for one worker.

Competitors (threads): the MultiQueue's nogil hold loop (``mq-nogil``, 2 queues per
thread, as the C++ MultiQueue is run), the same with one queue (``mq1-nogil``, the
cost of a single lock) and with ``stickiness`` (``mq-sticky``, ``--stickiness``,
default 8), the MultiQueue's bulk API from Python (``mq-bulk``:
``pop_many``/``push_many`` of 256), its Python-level ``pop``/``push`` (``mq-python``),
``heapq`` behind a ``threading.Lock`` (``heapq+lock``) and ``queue.PriorityQueue``.
Processes: ``mq-nogil`` and ``mq-python`` on a shared MultiQueue, and a
``multiprocessing`` Manager-served ``queue.PriorityQueue`` (``manager-pq``).

``--cxx-mq PATH`` adds ``cxx-mq``: the C++ MultiQueue of Williams, Sanders and
Dementiev (ESA 2021) running the same hold loop in an external binary built from
``bench/cxx/mq_hold.cpp`` (build lines at its top), one process per measurement,
interleaved with the kit's competitors, and ``cxx-mq-sticky``: the same library's
StickRandom policy at ``mq-sticky``'s stickiness (the kit's sticky policy is the same
one). It draws its own prefill of the same size and distribution. The default bench
runs without it.
"""
from __future__ import annotations

import heapq
import json
import queue
import subprocess
import threading
import time
from multiprocess.managers import BaseManager

import multiprocess as mp
import numpy as np

from relaxed import MultiQueue

INC = (1 << 32) - 1
KEY_RANGE = 1 << 32
BULK = 256


# -- competitor protocol ---------------------------------------------------------
class Competitor:
    name = ""
    python_level = False        # True: iterations are scaled down (--py-iters)
    kinds = ("threads",)

    def __init__(self, prefill_keys):
        self.prefill = prefill_keys

    def build(self, workers):
        raise NotImplementedError

    def work(self, s, worker, iters, incs):
        raise NotImplementedError

    def close(self, s):
        pass


class MQNogil(Competitor):
    name = "mq-nogil"
    kinds = ("threads", "processes")
    queues_per_worker = 2
    one_queue = False
    stickiness = 1
    rank_error = True           # pq-threads also logs a run of it and reports its rank error

    def n_queues(self, workers):
        return 1 if self.one_queue else self.queues_per_worker * workers

    def build(self, workers, shared=False):
        mq = MultiQueue(2 * len(self.prefill), n_queues=self.n_queues(workers), shared=shared,
                        seed=workers, stickiness=self.stickiness)
        mq.push_many(self.prefill, np.arange(len(self.prefill)))
        return mq

    def work(self, mq, worker, iters, incs):
        mq._hold(iters, INC)

    def close(self, mq):
        mq._check()
        mq.close()


class MQ1Nogil(MQNogil):
    name = "mq1-nogil"
    kinds = ("threads",)
    one_queue = True


class MQSticky(MQNogil):
    """The same hold loop with ``stickiness`` (``--stickiness``): a thread keeps one
    random pair of queues for that many operations."""
    name = "mq-sticky"
    kinds = ("threads",)
    stickiness = 8


class MQBulk(MQNogil):
    name = "mq-bulk"
    kinds = ("threads",)
    rank_error = False

    def work(self, mq, worker, iters, incs):
        inc = np.asarray(incs[:BULK], dtype=np.int64)
        for _ in range(iters // BULK):
            k, v = mq.pop_many(BULK)
            mq.push_many(k + inc[:len(k)], v)


class MQPython(MQNogil):
    name = "mq-python"
    python_level = True
    rank_error = False

    def work(self, mq, worker, iters, incs):
        pop, push = mq.pop, mq.push
        for d in incs:
            k, v = pop()
            push(k + d, v)


class HeapqLock(Competitor):
    name = "heapq+lock"
    python_level = True

    def build(self, workers):
        h = list(zip(self.prefill.tolist(), range(len(self.prefill))))
        heapq.heapify(h)
        return (h, threading.Lock())

    def work(self, s, worker, iters, incs):
        h, lock = s
        pop, push = heapq.heappop, heapq.heappush
        for d in incs:
            with lock:
                k, v = pop(h)
            with lock:
                push(h, (k + d, v))


class PriorityQueueComp(Competitor):
    name = "queue.PriorityQueue"
    python_level = True

    def build(self, workers):
        pq = queue.PriorityQueue()
        pq.queue = list(zip(self.prefill.tolist(), range(len(self.prefill))))
        heapq.heapify(pq.queue)
        return pq

    def work(self, pq, worker, iters, incs):
        get, put = pq.get_nowait, pq.put_nowait
        for d in incs:
            k, v = get()
            put((k + d, v))


class CxxMQ(Competitor):
    """An external hold-loop binary (bench/cxx/mq_hold.cpp); ``run`` replaces build/work."""
    name = "cxx-mq"
    external = True
    queues_per_worker = MQNogil.queues_per_worker
    path = None
    stickiness = 0              # 0: the library's default policy (no stickiness)

    def build(self, workers):
        return None

    def run(self, workers, iters, seed):
        cmd = [str(self.path), str(workers), str(len(self.prefill)), str(iters),
               str(self.queues_per_worker), str(seed), str(self.stickiness)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited with {out.returncode}: "
                               f"{out.stderr.strip()[-500:]}")
        try:
            return float(json.loads(out.stdout.strip().splitlines()[-1])["ops_per_s"])
        except (ValueError, KeyError, IndexError):
            raise RuntimeError(f"{' '.join(cmd)} printed no JSON line with ops_per_s: "
                               f"{out.stdout[-500:]!r}") from None


class CxxMQSticky(CxxMQ):
    """The C++ MultiQueue's StickRandom policy at the stickiness of ``mq-sticky``."""
    name = "cxx-mq-sticky"
    stickiness = MQSticky.stickiness


class _PQManager(BaseManager):
    pass


_PQManager.register("PriorityQueue", queue.PriorityQueue)


class ManagerPQ(Competitor):
    name = "manager-pq"
    kinds = ("processes",)
    python_level = True
    manager_prefill = 10_000   # filling 1M items through a proxy would take minutes

    def build(self, workers, shared=True):
        m = _PQManager()
        m.start()
        pq = m.PriorityQueue()
        for k in self.prefill[:self.manager_prefill].tolist():
            pq.put((k, 0))
        return (m, pq)

    def work(self, s, worker, iters, incs):
        _, pq = s
        for d in incs:
            k, v = pq.get()
            pq.put((k + d, v))

    def close(self, s):
        s[0].shutdown()


THREAD_COMPETITORS = [MQNogil, MQ1Nogil, MQSticky, MQBulk, MQPython, HeapqLock, PriorityQueueComp]
PROCESS_COMPETITORS = [MQNogil, MQPython, ManagerPQ]


# -- drivers -------------------------------------------------------------------------
def run_threads(comp, s, workers, iters, seed):
    incs = [np.random.default_rng(seed + w).integers(0, INC, iters).tolist() for w in range(workers)]
    barrier = threading.Barrier(workers + 1)
    times = [None] * workers

    def body(w):
        barrier.wait()
        t0 = time.perf_counter()
        comp.work(s, w, iters, incs[w])
        times[w] = (t0, time.perf_counter())
    ts = [threading.Thread(target=body, args=(w,)) for w in range(workers)]
    for t in ts:
        t.start()
    barrier.wait()
    for t in ts:
        t.join()
    start = min(t[0] for t in times)
    end = max(t[1] for t in times)
    return 2 * iters * workers / (end - start)


def _proc_body(comp, s, w, iters, seed, barrier, out):
    incs = np.random.default_rng(seed + w).integers(0, INC, iters).tolist()
    barrier.wait()
    t0 = time.perf_counter()       # CLOCK_MONOTONIC: comparable across processes
    comp.work(s, w, iters, incs)
    out.put((t0, time.perf_counter()))


def run_processes(comp, s, workers, iters, seed):
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(workers)
    out = ctx.Queue()
    ps = [ctx.Process(target=_proc_body, args=(comp, s, w, iters, seed, barrier, out))
          for w in range(workers)]
    for p in ps:
        p.start()
    times = [out.get(timeout=600) for _ in ps]
    for p in ps:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"{comp.name} worker exited with {p.exitcode}")
    start = min(t[0] for t in times)
    end = max(t[1] for t in times)
    return 2 * iters * workers / (end - start)
