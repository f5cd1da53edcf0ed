"""The shared-memory transport: worker processes (fork) on one box, the store and the
partitions in shared memory.

:class:`ShmLink` is what a worker's loop talks to (the store verbs and the
partitions, by direct loads, stores and atomics); :class:`ShmBackend` is what the
coordinator drives (start, watch and kill the workers, read their slots, flag them,
snapshot, stop and report).
"""
from __future__ import annotations

import os
import signal
import socket

import multiprocess as mp
import numpy as np

from sgd_shm.ps.partitions import Partitions
from sgd_shm.ps.store import ParameterStore, WaitPolicy, _cas_py, store_release_py
from sgd_shm.ps.worker import EXIT_DIVERGED, Diverged, run_worker


def warm_up(compressor=None, n_features=4):
    """Compile (or load from Numba's cache) every kernel the workers call, in this
    process, before the workers are forked: otherwise each worker compiles them
    itself on its first push, and the first policy of a cold cache starts late.
    With a compressor, also its kernels and the sparse push's."""
    with ParameterStore(4, n_shards=2, n_workers=1, shared=False) as scratch:
        w, v = scratch.pull(worker=0)
        res = scratch.push(np.zeros(4), v, lr=0.0, worker=0)
        scratch.push_deferred(res)
        scratch.record(0, compute_ns=0, status=0)
        scratch.snapshot()
        if compressor is not None:
            for dt in (np.int32, np.int64):
                scratch.push_sparse(np.array([1, 3], dt), np.zeros(2), v, lr=0.0)
            mem = compressor.memory(n_features, np.float64)
            mem.step(np.random.default_rng(0).standard_normal(n_features))
    word = np.zeros(1, np.int64)
    _cas_py(word, 0, 1)
    store_release_py(word, 0)


class ShmLink:
    """A worker's view of the run on shared memory (see :mod:`sgd_shm.ps.worker`)."""

    poll_s = 0.0002                  # a look at the gate is a few loads

    def __init__(self, store, parts, lr, wait, parent):
        self.store, self.parts, self.lr, self.wait, self.parent = store, parts, lr, wait, parent

    def stopped(self):
        return bool(self.parts.stop[0])

    def coordinator_alive(self):
        return os.getppid() == self.parent

    def pull(self, k):
        return self.store.pull(worker=k)

    def push(self, k, g, v, scale, nbytes=None):
        res = self.store.push(g, v, lr=self.lr, worker=k, scale=scale, wait=self.wait,
                              nbytes=nbytes)
        while res.deferred:                          # finish it even when stopping
            self.store.push_deferred(res, wait=self.wait)

    def push_sparse(self, k, idx, vals, v, scale, nbytes):
        res = self.store.push_sparse(idx, vals, v, lr=self.lr, worker=k, scale=scale,
                                     wait=self.wait, nbytes=nbytes)
        while res.deferred:
            self.store.push_deferred(res, wait=self.wait)

    def claim(self):
        return self.parts.claim()

    def version(self):
        return self.store.version

    def pushes(self, j):
        return self.store.counter(j, "pushes")

    def status(self, j):
        return self.store.counter(j, "status")

    def add(self, k, field, n):
        if field == "compute_ns":
            self.store.record(k, compute_ns=n)
        else:
            self.store.add(k, field, n)

    def epoch(self, p):
        return self.parts.epoch(p)

    def lag(self, p):
        return self.parts.lag(p)

    def take(self, p, rng, limit):
        return self.parts.take(p, rng, limit)

    def requeue(self, p, key, j):
        self.parts.requeue(p, key, j)

    def applied(self, k, p, j):
        self.parts.applied(k, p, j)


def _process_main(link, job, k, seed):
    try:
        run_worker(link, job, k, seed)
    except Diverged:
        os._exit(EXIT_DIVERGED)                      # the coordinator reports it


class ShmBackend:
    """Coordinator side of the shared-memory transport."""

    name = "shm"

    def __init__(self, n_params, n_shards, n_workers, batches, rng, ckpt=None, budget=None):
        self.n_workers = n_workers
        self.store = self.parts = None
        self.procs = []
        try:
            self.store = ParameterStore(n_params, n_shards=n_shards, n_workers=n_workers)
            self.parts = Partitions(batches, rng, budget)
            if ckpt is not None:                     # sparse pushes may leave shards behind
                slack = max(0, int(ckpt["version"]) - int(np.min(ckpt["shard_versions"])))
                self.store.restore(ckpt["weights"], ckpt["shard_versions"], ckpt["version"],
                                   slack=slack)
                if len(ckpt["pushes"]) == n_workers:
                    self.store.set_pushes(ckpt["pushes"])
                    self.parts.restore_epochs(ckpt["epochs"])
        except BaseException:
            self.close()
            raise
        self._seen = set()
        self.nodes = [socket.gethostname()] * n_workers

    # ---- workers ---------------------------------------------------------------------
    def start(self, job, seeds, lr, wait: WaitPolicy):
        warm_up(job.compressor, job.n_features)
        link = ShmLink(self.store, self.parts, lr, wait, os.getpid())
        ctx = mp.get_context("fork")
        self.procs = [ctx.Process(target=_process_main, name=f"ps-worker-{k}",
                                  args=(link, job, k, int(seeds[k])), daemon=True)
                      for k in range(self.n_workers)]
        for p in self.procs:
            p.start()

    def kill(self, k):
        if self.procs[k].is_alive():
            os.kill(self.procs[k].pid, signal.SIGKILL)
            return True
        return False

    def poll(self):
        """{worker: "killed" | "diverged" | "failed: ..."} for workers that ended
        since the last poll."""
        out = {}
        for k, p in enumerate(self.procs):
            if p.exitcode is not None and k not in self._seen:
                self._seen.add(k)
                out[k] = ("diverged" if p.exitcode == EXIT_DIVERGED else "killed"
                          if p.exitcode == -signal.SIGKILL else
                          f"failed (exit code {p.exitcode}); its traceback is above")
        return out

    def stop(self):
        if self.parts is not None:
            self.parts.stop[0] = 1
        for p in self.procs:
            if p.pid is None:
                continue
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()

    # ---- the coordinator's reads and writes ------------------------------------------
    def pull(self):
        return self.store.pull()

    def version(self):
        return self.store.version

    def counters(self):
        """(staleness sums, pushes tried: applied + dropped) of every worker."""
        st = self.store
        ks = range(self.n_workers)
        return (np.array([st.counter(k, "staleness_sum") for k in ks]),
                np.array([st.counter(k, "pushes") + st.counter(k, "dropped") for k in ks]))

    def set_status(self, k, status):
        self.store.record(k, status=status)

    def budget_done(self, n_killed=0):
        """True once the work budget is spent: every ticket applied, or every ticket
        claimed and at most one per killed worker missing (a killed worker may die
        holding one)."""
        parts = self.parts
        if parts.budget is None:
            return False
        applied = parts.applied_total()
        return applied >= parts.budget or (
            n_killed > 0 and int(parts.tickets[0]) >= parts.budget
            and applied >= parts.budget - n_killed)

    def write_off(self, q, unflagged_live):
        self.parts.write_off(q, unflagged_live)

    def snapshot(self):
        """(weights, shard_versions, version, pushes, epochs) for a checkpoint."""
        w, vers, v = self.store.snapshot()
        return w, vers, v, self.store.all_pushes(), self.parts.all_epochs()

    def report(self):
        """At quiescence: per-worker slot dicts, staleness histograms, the
        exactly-once check of the minibatches. Checks the store's invariants."""
        workers = [self.store.slot(k) for k in range(self.n_workers)]
        hist = [self.store.staleness_histogram(k).tolist() for k in range(self.n_workers)]
        batches = self.parts.check()
        self.store.release_dead_locks()                  # a worker killed inside a push
        self.store._check()
        return workers, hist, batches

    def close(self):
        if self.store is not None:
            self.store.close()
        if self.parts is not None:
            self.parts.close()
