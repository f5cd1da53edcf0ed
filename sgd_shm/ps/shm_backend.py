"""The shared-memory transport: worker processes on one box, the server's state
(:class:`sgd_shm.ps.server.ServerState`: the store and the partitions) in shared
memory.

:class:`ShmLink` is what a worker's loop talks to (the verbs of
:class:`sgd_shm.ps.transport.Link`, by direct loads, stores and atomics on the
state); :class:`ShmBackend` is what the coordinator drives (start, watch and kill the
workers, read their slots, flag them, snapshot, stop and report).

Model averaging (RPS) and message loss add a :class:`Mailbox` segment: the servers'
inboxes (a worker's blocks of round r, stamped r + 1 where they arrived, in one of two
buffers by the round's parity) and per-worker message counts. The servers are not
processes: after a round's barrier each worker computes each server's average from
the inboxes (the same bits in every worker) and the first one publishes it to the
store. Intended races: a worker writes its blocks, then their stamps, then bumps its
push counter atomically; a reader passes the barrier only after reading every live
worker's counter, so it sees the blocks whose stamps it sees (x86 keeps stores in
order and loads in order). A buffer is rewritten two rounds later, after every
worker has passed the next barrier and so finished reading it.

Start methods (``train(start_method=...)``): under "fork" (the default, fastest) the
workers inherit the link (store, partitions, mailbox) and the job (the data). Under
"spawn" and "forkserver" they get both in a :class:`sgd_shm.core.launcher.Shipment`: the
store and the queues re-attach by name, the partitions' and the mailbox's arrays are
re-created as views of their segments, and the data (X, labels, the minibatches'
rows) is copied once into a segment of its own. Either way :meth:`ShmBackend.start`
returns once every worker runs its loop (or died), so ``max_seconds`` and ``faults``
count from there, not from a spawned interpreter's start-up (about a second).
A worker ends when the coordinator is gone: a forked or spawned worker sees its
parent change; a forkserver worker's parent is the fork server, which outlives the
coordinator while any of its children lives, so it watches a *lifeline* instead, the
read end of a pipe whose only write end the coordinator holds (readable: EOF).
"""
from __future__ import annotations

import os
import select
import signal
import socket
import time

import multiprocess as mp
import numpy as np

from sgd_shm.core.atomics import cas_py, store_release_py
from sgd_shm.core.launcher import Shipment, check_start_method, exit_now, shared_arrays
from sgd_shm.core.policies import SHM_POLL_S, server_average
from sgd_shm.core.status import MESSAGE_FIELDS
from sgd_shm.core.schedules import make_schedule
from sgd_shm.core.traces import PSTrace
from sgd_shm.ps.partitions import Partitions
from sgd_shm.ps.server import ServerState
from sgd_shm.ps.store import LINE, ParameterStore, WaitPolicy
from sgd_shm.ps.worker import EXIT_DIVERGED, Diverged, TraceBuffer, run_worker, warm


def warm_up(compressor=None, n_features=4, dtype=np.float64):
    """Compile (or load from Numba's cache) every kernel the workers call, in this
    process, before the workers start: otherwise each worker compiles them itself
    on its first push, and the first policy of a cold cache starts late (forked
    workers inherit the compiled kernels, spawned ones load them from the cache this
    fills). With a compressor, also its kernels and the sparse push's. ``dtype``: the
    weights' float type (the kernels are compiled for it)."""
    with ParameterStore(4, n_shards=2, n_workers=1, shared=False, dtype=dtype) as scratch:
        w, v = scratch.pull(worker=0)
        zeros = np.zeros(4, scratch.dtype)
        res = scratch.push(zeros, v, lr=0.0, worker=0)
        scratch.push_deferred(res)
        scratch.push(zeros, v, lr=0.0, worker=0, shards=[1])
        scratch.deposited(0, 0)
        scratch.publish(0, zeros[:2], 1)
        scratch.record(0, compute_ns=0, status=0)
        scratch.snapshot()
        if compressor is not None:
            for dt in (np.int32, np.int64):
                scratch.push_sparse(np.array([1, 3], dt), zeros[:2], v, lr=0.0)
            mem = compressor.memory(n_features, scratch.dtype)
            mem.step(np.random.default_rng(0).standard_normal(n_features).astype(
                scratch.dtype))
    word = np.zeros(1, np.int64)
    cas_py(word, 0, 1)
    store_release_py(word, 0)


class Mailbox:
    """The servers' inboxes of model averaging and the message counts, in one shared
    segment: ``box[r % 2][k]``: worker k's replica as sent in round r (only the blocks
    that arrived are written), ``stamps[r % 2][k, j] = r + 1`` where its block j
    arrived; ``counts[k, j]``: worker k's messages with server j (columns
    :data:`sgd_shm.core.status.MESSAGE_FIELDS`), written by worker k only. ``dtype``:
    the weights' float type (the replicas')."""

    def __init__(self, n_params, n_shards, n_workers, replicas, shared=True,
                 dtype=np.float64):
        shape = (2, n_workers, n_params) if replicas else (0,)
        self._seg, v = shared_arrays({
            "box": (shape, dtype),
            "stamps": ((2, n_workers, n_shards) if replicas else (0,), np.int64),
            "counts": ((n_workers, n_shards, len(MESSAGE_FIELDS)), np.int64)}, shared=shared)
        self.box, self.stamps, self.counts = v["box"], v["stamps"], v["counts"]

    def close(self):
        for a in ("box", "stamps", "counts"):
            self.__dict__.pop(a, None)
        if self._seg is not None:
            self._seg.close()
            self._seg = None


class _LiveState:
    """The run's state as a worker reads it on shared memory: live loads, no copy
    (see :class:`sgd_shm.ps.transport.RunState`)."""

    def __init__(self, link):
        self._link = link
        self._store, self._parts = link.server.store, link.server.parts

    @property
    def stopped(self):
        return bool(self._parts.stop[0])

    @property
    def alive(self):
        return self._link.coordinator_alive()

    @property
    def version(self):
        return self._store.version

    def pushes(self, j):
        return self._store.counter(j, "pushes")

    def status(self, j):
        return self._store.counter(j, "status")

    def epoch(self, p):
        return self._parts.epoch(p)

    def lag(self, p):
        return self._parts.lag(p)


class ShmLink:
    """A worker's link on shared memory (:class:`sgd_shm.ps.transport.Link`): every
    verb is a call of the :class:`ServerState` mapped into this process."""

    poll_s = SHM_POLL_S              # a look at the gate is a few loads
    trace = None                     # train(trace=True): the workers' TraceBuffer

    def __init__(self, server, lr, wait, parent, mail=None):
        self.server, self.wait, self.parent = server, wait, parent
        self.lr = make_schedule(lr)                  # a number or a schedule of t
        self.store = server.store
        self.mail = mail
        self.lifeline = None             # forkserver: see the module notes
        self._state = None

    @property
    def bounds(self):
        return self.store.bounds

    def coordinator_alive(self):
        if self.lifeline is not None:    # EOF (readable) once the coordinator is gone
            return not select.select([self.lifeline], [], [], 0)[0]
        return os.getppid() == self.parent

    # ---- the verbs -------------------------------------------------------------------------
    def state(self, k):
        if self._state is None:
            self._state = _LiveState(self)
        return self._state

    def exchange(self, k, push=None, pull=True):
        """The verb (see :class:`sgd_shm.ps.transport.Link`); with ``pull=False`` it
        returns the push's :class:`~sgd_shm.ps.store.PushResult` (its ``version``: the
        global version once it was counted), None without a push."""
        res = None
        if push is not None:
            st, wait = self.store, self.wait
            lr = self.lr(push.version)               # the schedule at the version pulled
            if push.sparse:
                res = st.push_sparse(push.indices, push.values, push.version, lr=lr,
                                     worker=k, scale=push.scale, wait=wait, nbytes=push.nbytes)
            else:
                res = st.push(push.grad, push.version, lr=lr, worker=k, scale=push.scale,
                              wait=wait, nbytes=push.nbytes, shards=push.shards)
            while res.deferred:                      # finish it even when stopping
                st.push_deferred(res, wait=wait)
        return self.store.pull(worker=k) if pull else res

    def take(self, k, sources, rng, claim):
        return self.server.take(k, sources, claim, rng)

    def report(self, k, counts=None, *, applied=None, requeue=None, messages=None):
        self.server.report(k, counts, applied, requeue, messages)

    def average_round(self, k, r, x, up, down, barrier):
        """Deposit in the mailbox, the barrier, then each server's average (published
        to the store by its first reader)."""
        box, stamps, b = self.mail.box[r % 2], self.mail.stamps[r % 2], self.bounds
        for j in np.flatnonzero(up):
            box[k, b[j]:b[j + 1]] = x[b[j]:b[j + 1]]
            stamps[k, j] = r + 1                     # after the block (see the module notes)
        self.server.round_sent(k, x.nbytes)          # the worker sent every block
        if not barrier():
            return None
        answered = np.zeros(len(b) - 1, bool)
        for j in range(len(b) - 1):
            who = np.flatnonzero(stamps[:, j] == r + 1)
            answered[j] = who.size > 0
            if not (down[j] and who.size) and self.store.shard_version(j) > r:
                continue                             # nothing to take, already published
            avg = server_average([box[i, b[j]:b[j + 1]] for i in who])
            self.store.publish(j, avg, r + 1)
            if down[j] and avg is not None:
                x[b[j]:b[j + 1]] = avg
        return answered

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_state"] = None
        return d


def _process_main(payload, k, seed, start_method, lifeline=None):
    """A worker process: (link, job, ready) inherited (fork) or unpickled from a
    :class:`Shipment`; it raises its ready word, waits for the coordinator's go (the
    word after the workers'), then runs the worker loop: no worker trains while
    another is still starting, so the first steps are not one worker's alone.
    ``lifeline``: forkserver only, a Connection that reaches EOF with the coordinator."""
    link, job, ready = payload
    if lifeline is not None:
        link.lifeline = lifeline
    if job.model.uses_blas:                  # its matrix products: one BLAS thread each
        from sgd_shm.models import one_blas_thread
        one_blas_thread()
    if start_method != "fork":               # load the kernels now, not in the first step
        warm_up(job.compressor, job.n_params, job.dtype)
        warm(job)
    ready[k * LINE] = 1
    while not ready[len(ready) - LINE]:
        if not link.coordinator_alive():
            return
        time.sleep(0.0005)
    try:
        run_worker(link, job, k, seed)
    except Diverged:
        os._exit(EXIT_DIVERGED)                      # the coordinator reports it
    if start_method != "fork":
        exit_now()                                   # skip a fresh interpreter's shutdown


class LocalState:
    """The server's state of a run on this box (shared memory, or private memory
    for threads): the :class:`ServerState` and, with RPS or message loss, the
    :class:`Mailbox`; and the coordinator's reads and writes of it (the
    :class:`sgd_shm.ps.transport.Backend` methods that are one call of the state).
    ``shared``: in shared-memory segments (worker processes) or private memory.
    ``dtype``: the weights' float type (the model's)."""

    shared = True

    def __init__(self, n_params, n_shards, n_workers, batches, rng, ckpt=None, budget=None,
                 replicas=False, lossy=False, init=None, clock="exact", trace=0,
                 dtype=np.float64):
        self.n_workers = n_workers
        self.server = self.mail = self.tracebuf = None
        self.reads, self.writes = None, None     # traced: the coordinator's counters, status
        store = parts = None
        try:
            if trace:
                self.tracebuf = TraceBuffer(n_workers, trace, shared=self.shared)
                self.reads, self.writes = [], []
            store = ParameterStore(n_params, n_shards=n_shards, n_workers=n_workers,
                                   init=init, shared=self.shared, clock=clock, dtype=dtype)
            parts = Partitions(batches, rng, budget, shared=self.shared)
            if replicas or lossy:
                self.mail = Mailbox(n_params, n_shards, n_workers, replicas,
                                    shared=self.shared, dtype=store.dtype)
            self.server = ServerState(store, parts,
                                      None if self.mail is None else self.mail.counts)
            if ckpt is not None:
                self.server.resume(ckpt)
        except BaseException:
            for part in (store, parts, self.mail, self.tracebuf):
                if part is not None:
                    part.close()
            self.server = self.mail = self.tracebuf = None
            raise

    @property
    def store(self):
        return None if self.server is None else self.server.store

    @property
    def parts(self):
        return None if self.server is None else self.server.parts

    # ---- the coordinator's reads and writes ------------------------------------------
    def pull(self):
        """(weights, exact version read before the copy): the coordinator's sample."""
        v = self.store.exact_version
        return self.store.pull()[0], v

    def version(self):
        return self.store.exact_version

    def counters(self):
        """(staleness sums, pushes tried: applied + dropped) of every worker (traced:
        recorded with the read's bracket)."""
        if self.reads is None:
            return self.server.counters()
        t = time.perf_counter()
        got = self.server.counters()
        self.reads.append((t, time.perf_counter(), got[0].copy(), got[1].copy()))
        return got

    def set_status(self, k, status):
        if self.writes is None:
            self.server.set_status(k, status)
            return
        t = time.perf_counter()
        self.server.set_status(k, status)
        self.writes.append((t, time.perf_counter(), int(k), int(status)))

    def trace(self, t0, policy, samples):
        """The run's :class:`~sgd_shm.core.traces.PSTrace` (times minus ``t0``, the
        workers' release), or None when not traced. Call before :meth:`close`."""
        buf = self.tracebuf
        if buf is None:
            return None
        steps, decided = zip(*(buf.rows(k, t0) for k in range(self.n_workers)))
        return PSTrace(self.n_workers, policy, list(steps),
                       [(a - t0, b - t0, s, n) for a, b, s, n in self.reads],
                       [(a - t0, b - t0, k, st) for a, b, k, st in self.writes],
                       list(samples), list(decided),
                       any(n > buf.capacity for n in decided))

    def budget_done(self, n_killed=0):
        """True once the work budget is spent (see :meth:`ServerState.budget_done`)."""
        return self.server.budget_done(n_killed)

    def write_off(self, q, unflagged_live):
        self.server.write_off(q, unflagged_live)

    def snapshot(self):
        """(weights, shard_versions, version, pushes, epochs) for a checkpoint."""
        w, vers, v = self.store.snapshot()
        return w, vers, v, self.store.all_pushes(), self.parts.all_epochs()

    def report(self):
        """At quiescence: per-worker slot dicts, staleness histograms, the
        exactly-once check of the minibatches. Checks the store's invariants."""
        self.store.release_dead_locks()                  # a worker killed inside a push
        self.store._check()
        return self.server.report_end()

    def messages(self):
        """(n_workers, n_shards, 4) message counts (columns
        :data:`sgd_shm.core.status.MESSAGE_FIELDS`), or None without message loss."""
        return self.server.messages()

    def close(self):
        """Unlink every segment of the run (after ``stop``)."""
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.mail is not None:
            self.mail.close()
            self.mail = None
        if self.tracebuf is not None:
            self.tracebuf.close()
            self.tracebuf = None


class ShmBackend(LocalState):
    """Coordinator side of the shared-memory transport."""

    name = "shm"

    def __init__(self, n_params, n_shards, n_workers, batches, rng, ckpt=None, budget=None,
                 replicas=False, lossy=False, start_method="fork", init=None, clock="exact",
                 trace=0, dtype=np.float64):
        self.start_method = check_start_method(start_method)
        self._shipment = self._ready_seg = self._lifeline = None   # lifeline: forkserver's
        self.procs = []
        try:
            # a word per worker, then the go word, each on a line of its own
            self._ready_seg, v = shared_arrays({"ready": ((LINE * (n_workers + 1),),
                                                          np.int64)})
            self.ready = v["ready"]
            super().__init__(n_params, n_shards, n_workers, batches, rng, ckpt, budget,
                             replicas, lossy, init, clock, trace, dtype)
        except BaseException:
            self.server = self.mail = self.tracebuf = None
            self.close()
            raise
        self._seen = set()
        self.nodes = [socket.gethostname()] * n_workers

    # ---- workers ---------------------------------------------------------------------
    def start(self, job, seeds, lr, wait: WaitPolicy, ready_timeout=120.0):
        """Start the workers with ``start_method`` and return once each one is ready
        (or has ended; at most ``ready_timeout`` seconds), after giving them the go."""
        warm_up(job.compressor, job.n_params, job.dtype)   # spawned workers: from the cache
        link = ShmLink(self.server, lr, wait, os.getpid(), self.mail)
        link.trace = self.tracebuf
        ctx = mp.get_context(self.start_method)
        payload = (link, job, self.ready)
        if self.start_method != "fork":
            payload = self._shipment = Shipment(payload, [self._ready_seg])
        ends = (None, None)
        if self.start_method == "forkserver":
            ends = ctx.Pipe(duplex=False)
            self._lifeline = ends[1]
        self.procs = [ctx.Process(target=_process_main, name=f"ps-worker-{k}",
                                  args=(payload, k, int(seeds[k]), self.start_method, ends[0]),
                                  daemon=True)
                      for k in range(self.n_workers)]
        for p in self.procs:
            p.start()
        if ends[0] is not None:
            ends[0].close()                  # the workers hold the read ends
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline and any(
                not self.ready[k * LINE] and p.exitcode is None
                for k, p in enumerate(self.procs)):
            time.sleep(0.002)
        self.ready[self.n_workers * LINE] = 1       # go: the clock starts now

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
        if self.server is not None:
            self.server.stop()
        for p in self.procs:
            if p.pid is None:
                continue
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()

    def close(self):
        """Unlink every segment of the run (after :meth:`stop`)."""
        super().close()
        if self._shipment is not None:
            self._shipment.close()
            self._shipment = None
        if self._lifeline is not None:
            self._lifeline.close()
            self._lifeline = None
        if self._ready_seg is not None:
            self.__dict__.pop("ready", None)
            self._ready_seg.close()
            self._ready_seg = None
