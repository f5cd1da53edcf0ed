"""The in-process transport (``train(..., backend="threads")``): the workers are
threads of the calling process, the server's state
(:class:`sgd_shm.ps.server.ServerState`) lives in private memory, nothing is shared
with another process and nothing is left in /dev/shm. For tests and debugging: a
breakpoint or a traceback in a worker is in this process, and the run is the shared
memory transport's code path (:class:`ThreadLink` is :class:`ShmLink` on private
memory), with the interpreter's lock serializing the Python parts of the workers
(the store's kernels release it).

A worker cannot be killed from outside a thread, so :meth:`ThreadsBackend.kill` marks
it dead and its next verb raises :class:`WorkerKilled` in it: it dies between two
verbs, as a SIGKILLed process may (what it held, a ticket or a minibatch, is lost;
the backend reports it as "killed"). A push is never cut in the middle, so no shard
lock is left held.
"""
from __future__ import annotations

import threading
import traceback

import numpy as np

from sgd_shm.ps.shm_backend import LocalState, ShmLink, warm_up
from sgd_shm.ps.worker import Diverged, run_worker


class WorkerKilled(Exception):
    """Raised in a worker thread at its next verb after :meth:`ThreadsBackend.kill`."""


class ThreadLink(ShmLink):
    """:class:`ShmLink` for a worker thread: the coordinator is this process (always
    alive while the run lasts), and a worker marked dead dies at its next verb."""

    poll_s = 0.0005                  # a look at the gate also hands the GIL over

    def __init__(self, server, lr, wait, dead, mail=None):
        super().__init__(server, lr, wait, parent=None, mail=mail)
        self.dead = dead

    def coordinator_alive(self):
        return True

    def _check(self, k):
        if self.dead[k]:
            raise WorkerKilled(f"worker {k} was killed")

    def state(self, k):
        self._check(k)
        return super().state(k)

    def exchange(self, k, push=None, pull=True):
        self._check(k)
        return super().exchange(k, push, pull)

    def take(self, k, sources, rng, claim):
        self._check(k)
        return super().take(k, sources, rng, claim)

    def report(self, k, counts=None, *, applied=None, requeue=None, messages=None):
        self._check(k)
        super().report(k, counts, applied=applied, requeue=requeue, messages=messages)

    def average_round(self, k, r, x, up, down, barrier):
        self._check(k)
        return super().average_round(k, r, x, up, down, barrier)


class ThreadsBackend(LocalState):
    """Coordinator side of the threads transport."""

    name = "threads"
    shared = False

    def __init__(self, n_params, n_shards, n_workers, batches, rng, ckpt=None, budget=None,
                 replicas=False, lossy=False, init=None, clock="exact", trace=0,
                 dtype=np.float64):
        super().__init__(n_params, n_shards, n_workers, batches, rng, ckpt, budget,
                         replicas, lossy, init, clock, trace, dtype)
        self.threads, self.outcome, self.dead = [], {}, [False] * n_workers
        self._seen = set()
        self.nodes = [f"thread-{k}" for k in range(n_workers)]

    def _main(self, link, job, k, seed):
        try:
            run_worker(link, job, k, seed)
            how = "stopped"
        except WorkerKilled:
            how = "killed"
        except Diverged:
            how = "diverged"
        except BaseException:                         # reported by the coordinator
            how = f"failed: {traceback.format_exc()}"
        self.outcome[k] = how

    def start(self, job, seeds, lr, wait):
        warm_up(job.compressor, job.n_params, job.dtype)
        link = ThreadLink(self.server, lr, wait, self.dead, self.mail)
        link.trace = self.tracebuf
        self.threads = [threading.Thread(target=self._main, name=f"ps-worker-{k}",
                                         args=(link, job, k, int(seeds[k])), daemon=True)
                        for k in range(self.n_workers)]
        for t in self.threads:
            t.start()

    def kill(self, k):
        alive = self.threads[k].is_alive() and not self.dead[k]
        self.dead[k] = True
        return alive

    def poll(self):
        """{worker: "killed" | "diverged" | "failed: ..."} for workers that ended
        since the last poll (not those that stopped with the run)."""
        out = {}
        for k in list(self.outcome):
            if k not in self._seen:
                self._seen.add(k)
                if self.outcome[k] != "stopped":
                    out[k] = self.outcome[k]
        return out

    def stop(self):
        if self.server is not None:
            self.server.stop()
        for t in self.threads:
            t.join(30)
        stuck = [t.name for t in self.threads if t.is_alive()]
        if stuck:
            raise RuntimeError(f"worker threads {stuck} did not stop within 30 s of the "
                               "stop flag; a thread cannot be killed, so the run's state "
                               "is left to them")
