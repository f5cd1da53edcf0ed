"""The server's state of a parameter-server run, one implementation for every
transport: the :class:`~sgd_shm.ps.store.ParameterStore` (versions, per-worker slots
and staleness histograms, on shared memory also the weights and the shard locks), the
:class:`~sgd_shm.ps.partitions.Partitions` (minibatch queues, epochs, lags, tickets,
the exactly-once tally, the stop flag) and the message counts.

Shared memory puts it in segments that the worker processes map; the threads
transport keeps it in private memory shared by threads; the Ray transport's hub actor
holds it in private memory and answers the workers' verbs by calling these same
methods (the weights then live on the shard actors, and the hub's store counts the
pushes they applied, :meth:`ParameterStore.account`). See :mod:`sgd_shm.ps.transport`
for the verbs and what a transport must give.
"""
from __future__ import annotations

import numpy as np

from sgd_shm.core.status import DEAD
from sgd_shm.ps.partitions import Partitions
from sgd_shm.ps.store import ParameterStore
from sgd_shm.ps.transport import Refill, StateSnapshot

#: the counters ``report`` adds to: the store's driver counters and the compute time
REPORT_FIELDS = ("staleness_sum", "dropped", "stolen", "spells", "compute_ns")


class ServerState:
    """ServerState(store, parts, counts=None): the state behind a run's links (see the
    module notes). ``counts``: the (n_workers, n_shards, 4) message counts, or None
    without message loss."""

    def __init__(self, store: ParameterStore, parts: Partitions, counts=None):
        self.store, self.parts, self.counts = store, parts, counts

    @classmethod
    def private(cls, n_params, n_shards, n_workers, batches, seeds, budget=None,
                lossy=False, init=None, clock="exact", dtype=np.float64):
        """A state in private memory (the Ray hub's; ``seeds``: the queue seeds;
        ``dtype``: the weights' float type, which the bytes of a dense push count)."""
        store = ParameterStore(n_params, n_shards=n_shards, n_workers=n_workers,
                               shared=False, init=init, clock=clock, dtype=dtype)
        try:
            parts = Partitions(batches, seeds, budget, shared=False)
        except BaseException:
            store.close()
            raise
        counts = np.zeros((n_workers, n_shards, 4), np.int64) if lossy else None
        return cls(store, parts, counts)

    def resume(self, ckpt, weights=True):
        """Continue from a checkpoint: versions (and ``weights``: the weights too),
        and, when it has one slot per worker, the pushes and the epochs."""
        st = self.store
        slack = max(0, int(ckpt["version"]) - int(np.min(ckpt["shard_versions"])))
        w = ckpt["weights"] if weights else np.zeros(st.n_params, st.dtype)
        st.restore(w, ckpt["shard_versions"], ckpt["version"], slack=slack)
        if len(ckpt["pushes"]) == st.n_workers:
            st.set_pushes(ckpt["pushes"])
            self.parts.restore_epochs(ckpt["epochs"])

    # ---- the workers' verbs --------------------------------------------------------------
    def snapshot_state(self) -> StateSnapshot:
        """The run's state now, as a worker's ``state`` returns it."""
        st, parts = self.store, self.parts
        n = st.n_workers
        return StateSnapshot(bool(parts.stop[0]), st.version,
                             np.array([st.counter(j, "pushes") for j in range(n)]),
                             np.array([st.counter(j, "status") for j in range(n)]),
                             parts.all_epochs(),
                             np.array([parts.lag(p) for p in range(n)]))

    def take(self, k, sources, claim, rng=None, refill=None):
        """A minibatch (p, key, j) from the first of ``sources`` [(partition, refill
        limit)] that has one, after claiming a ticket when ``claim`` (None: none
        left). A queue found empty and below its limit is refilled (one epoch, by
        the first to claim it) in an order drawn from ``rng``; without ``rng`` the
        answer is a :class:`Refill` and the caller asks again with ``refill`` = (p,
        e, order) and ``claim=False``."""
        parts = self.parts
        if refill is not None:
            parts.refill(*refill)
        elif claim and not parts.claim():
            return None
        for q, limit in sources:
            while True:
                it, e = parts.pop(q, limit)
                if e is None:
                    break
                if rng is None:
                    return Refill(q, e, int(parts.nb[q]))
                parts.refill(q, e, rng)
            if it is not None:
                return q, it[0], it[1]
        raise ValueError(f"sources: {sources!r} gave no minibatch; the last source must "
                         "have no refill limit (None)")

    def report(self, k, counts=None, applied=None, requeue=None, messages=None):
        """Worker k's counters of a step (see :data:`REPORT_FIELDS`), its applied
        minibatch (p, j), a minibatch to put back (p, key, j), its message counts."""
        for f, n in (counts or {}).items():
            if f == "compute_ns":
                self.store.record(k, compute_ns=n)
            elif f in REPORT_FIELDS:
                self.store.add(k, f, n)
            else:
                raise ValueError(f"counts: {f!r} is not one of {REPORT_FIELDS}")
        if requeue is not None:
            self.parts.requeue(*requeue)
        if applied is not None:
            self.parts.applied(k, *applied)
        if messages is not None:
            self.counts[k] += messages

    def round_sent(self, k, nbytes, advance=False):
        """RPS: worker k sent its round (one push of staleness 0); ``advance``: the
        global version becomes the rounds every live worker has sent (where no
        worker publishes the servers' averages into the store, as on Ray)."""
        st = self.store
        st.deposited(k, nbytes)
        if advance:
            live = [j for j in range(st.n_workers) if st.counter(j, "status") != DEAD]
            if live:
                st.advance(min(st.counter(j, "pushes") for j in live))

    # ---- the coordinator's -----------------------------------------------------------------
    def stop(self):
        self.parts.stop[0] = 1

    def counters(self):
        """(staleness sums, pushes tried: applied + dropped) of every worker."""
        st = self.store
        ks = range(st.n_workers)
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

    def checkpoint_state(self):
        """(version, pushes, epochs) for a checkpoint."""
        return self.store.exact_version, self.store.all_pushes(), self.parts.all_epochs()

    def report_end(self):
        """At quiescence: per-worker slot dicts, staleness histograms, the
        exactly-once check of the minibatches (AssertionError if one was applied
        twice in an epoch)."""
        st = self.store
        workers = [st.slot(k) for k in range(st.n_workers)]
        hist = [st.staleness_histogram(k).tolist() for k in range(st.n_workers)]
        return workers, hist, self.parts.check()

    def messages(self):
        return None if self.counts is None else self.counts.copy()

    def close(self):
        self.store.close()
        self.parts.close()
