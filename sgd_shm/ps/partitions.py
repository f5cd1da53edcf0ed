"""Data partitions and their minibatch queues, in shared memory.

The rows are shuffled (seeded) and cut into one partition per worker, each into
minibatches of ``batch_size`` rows. Partition p's minibatches wait in a
:class:`relaxed.MultiQueue` of their own, keyed epoch * n_batches + a random position,
so they come out roughly an epoch at a time in a fresh order. Whoever finds a queue
empty refills it with the partition's next epoch, claimed by a compare-and-swap on the
partition's epoch counter, so each epoch is enqueued once. Every minibatch of every
epoch is therefore applied at most once, and exactly once unless the run stops before
it is reached; :meth:`Partitions.check` verifies it at the end. A worker that is
SIGKILLed loses the minibatch it was computing and, if it dies between claiming a
refill and enqueueing it, what it had not yet enqueued of that epoch (counted as
``lost``).

A run with a work budget (``train(..., epochs=E)``: E * (total minibatches)
applications) hands out one *ticket* per minibatch application: a worker claims a
ticket (an atomic fetch-and-add on a shared counter) after its policy's gate opens and
before it takes a minibatch, keeps it across a dropped push (the minibatch is redone)
and spends it when it applies one. Once the tickets are gone a worker idles until the
run stops, so exactly the budget is applied unless the run stops first or a worker is
killed holding a ticket.

Intended races: the stop flag and the partitions' lags are plain words read without
ordering (a worker sees a change on a later step); two workers may both find a queue
empty, and only one wins the CAS on its epoch counter.
"""
from __future__ import annotations

import numpy as np

from relaxed import MultiQueue
from sgd_shm.core.atomics import cas_py, fetch_add_py
from sgd_shm.core.batches import Batches
from sgd_shm.core.launcher import shared_arrays
from sgd_shm.core.status import written_off_lag
from sgd_shm.ps.store import LINE


class Partitions:
    """Partitions(batches, seeds, budget=None, *, shared=True)

    Partitions, their minibatch queues and the shared counters behind them.

    Shared (one segment, inherited by fork): the stop flag; per-partition epoch
    counters and lags (written-off deficits, set by the coordinator), each in its own
    line; per worker, how many times it applied each minibatch (written by that worker
    only). ``seeds``: a generator (one queue seed drawn per partition) or the seeds
    themselves; ``shared=False`` keeps everything in private memory (threads of one
    process, or a Ray actor that hosts the partitions)."""

    def __init__(self, batches: Batches, seeds, budget=None, *, shared=True):
        n_workers = len(batches.part_lo)
        if isinstance(seeds, np.random.Generator):
            seeds = [int(seeds.integers(2**31)) for _ in range(n_workers)]
        if len(seeds) != n_workers:
            raise ValueError(f"seeds: expected {n_workers} queue seeds (one per partition), "
                             f"got {len(seeds)}")
        self.nb = batches.n_batches
        self.boff = np.concatenate([[0], np.cumsum(self.nb)])
        self.n_workers = n_workers
        total = int(self.boff[-1])
        # the run's stop flag is a word, not a multiprocessing Event, whose internal
        # lock a worker SIGKILLed inside is_set() would leave held, deadlocking the others
        self._seg, v = shared_arrays({"stop": ((1,), np.int64),
                                      "epochs": ((LINE * n_workers,), np.int64),
                                      "lag": ((LINE * n_workers,), np.int64),
                                      "tickets": ((LINE,), np.int64),
                                      "taken": ((n_workers, total), np.int64)},
                                     shared=shared)
        self.stop, self.epochs, self.lag_words, self.taken = (v["stop"], v["epochs"],
                                                              v["lag"], v["taken"])
        self.tickets = v["tickets"]              # [0]: claimed (may overshoot the budget)
        self.budget = None if budget is None else int(budget)
        self.queues = []
        try:
            for p in range(n_workers):
                # at most one epoch per concurrent refiller can be in a queue (see take)
                self.queues.append(MultiQueue(n_workers * int(self.nb[p]), n_queues=2,
                                              shared=bool(shared), seed=int(seeds[p])))
        except BaseException:
            self.close()
            raise
        self.epoch0 = np.zeros(n_workers, np.int64)

    # ---- read by the workers and the coordinator -----------------------------------------
    def epoch(self, p) -> int:
        return int(self.epochs[p * LINE])

    def lag(self, p) -> int:
        return int(self.lag_words[p * LINE])

    def all_epochs(self) -> np.ndarray:
        return self.epochs[::LINE].copy()

    # ---- coordinator ---------------------------------------------------------------------
    def write_off(self, q, unflagged_live):
        """q was flagged or died: set lag_q to the smallest epoch of the other
        partitions whose workers are live and unflagged, minus q's (see
        :class:`sgd_shm.core.policies.SaPS`)."""
        lag = written_off_lag(self.all_epochs(), q, unflagged_live)
        if lag is not None:
            self.lag_words[q * LINE] = lag

    def set_lag(self, q, lag):
        """Set partition q's lag (computed elsewhere by :func:`written_off_lag`, from
        every partition's epoch: the Ray transport's nodes hold some partitions each)."""
        self.lag_words[int(q) * LINE] = int(lag)

    def restore_epochs(self, epochs):
        self.epochs[::LINE] = epochs
        self.epoch0 = np.asarray(epochs, np.int64).copy()

    # ---- workers -------------------------------------------------------------------------
    def take(self, p, rng, refill_limit=None):
        """A (key, batch) from partition p's queue; when it is empty and the
        partition's epoch e is below ``refill_limit`` (``None``: always), claim and
        enqueue epoch e + 1. The epoch is read before the pop, so a claim (CAS
        e -> e + 1) only succeeds if no one refilled since: at most one epoch per
        concurrent refiller is ever in the queue."""
        while True:
            it, e = self.pop(p, refill_limit)
            if e is None:
                return it
            self.refill(p, e, rng)

    def pop(self, p, refill_limit=None):
        """One look at partition p's queue: ((key, batch), None) when it had one;
        (None, e) when it was empty at epoch e and may be refilled (e below
        ``refill_limit``); (None, None) when it was empty and may not. The epoch is
        read before the pop (see :meth:`take`)."""
        e = int(self.epochs[p * LINE])
        it = self.queues[p].try_pop()
        if it is not None:
            return it, None
        if refill_limit is not None and e >= refill_limit:
            return None, None
        return None, e

    def refill(self, p, e, order) -> bool:
        """Claim epoch e + 1 of partition p (CAS e -> e + 1) and enqueue it in a fresh
        order: ``order`` is a generator (a permutation is drawn only once the claim
        succeeded) or the permutation itself. False: someone refilled first."""
        if not cas_py(self.epochs[p * LINE:p * LINE + 1], e, e + 1):
            return False
        n = int(self.nb[p])
        perm = order.permutation(n) if isinstance(order, np.random.Generator) \
            else np.asarray(order, np.int64)
        self.queues[p].push_many((e + 1) * n + perm, np.arange(n))
        return True

    def requeue(self, p, key, j):
        self.queues[p].push(key, j)

    def claim(self) -> bool:
        """Claim a ticket of the work budget: True while one is left (always True
        without a budget)."""
        if self.budget is None:
            return True
        return fetch_add_py(self.tickets, 0, 1) < self.budget

    def applied_total(self) -> int:
        """Minibatches applied in this run, all partitions and workers together."""
        return int(self.taken.sum())

    def applied(self, k, p, j):
        """Worker k applied minibatch j of partition p (written by worker k only)."""
        self.taken[k, self.boff[p] + j] += 1

    # ---- at the end ----------------------------------------------------------------------
    def check(self):
        """The exactly-once check at quiescence: every minibatch was applied once per
        epoch enqueued, less those still queued. Returns per-partition epochs,
        applied minibatches, stolen ones, and ``lost``: (partition, batch)
        applications missing (0 unless a worker was killed).
        Raises AssertionError if any minibatch was applied too often."""
        queued = []
        for p in range(self.n_workers):
            keys, vals = self.queues[p].pop_many(self.queues[p].capacity)
            queued.append(np.bincount(vals, minlength=int(self.nb[p])))
        return tally(self.taken, queued, self.all_epochs(), self.epoch0, self.nb, self.boff)

    def close(self):
        for q in self.queues:
            q.close()
        self.queues = []
        for a in ("stop", "epochs", "lag_words", "taken", "tickets"):
            self.__dict__.pop(a, None)
        if getattr(self, "_seg", None) is not None:
            self._seg.close()
            self._seg = None


def tally(taken, queued, epochs, epoch0, nb, boff):
    """The exactly-once accounting of any transport: ``taken[k, b]`` applications of
    minibatch b by worker k, ``queued[p]`` per-batch counts still in partition p's
    queue, ``epochs[p]`` partition p's epoch counter now and ``epoch0[p]`` at the start
    of this run (a resumed run starts where its checkpoint was)."""
    n = len(nb)
    applied = np.asarray(taken).sum(axis=0)
    lost = 0
    for p in range(n):
        e = int(epochs[p]) - int(epoch0[p])
        got = applied[boff[p]:boff[p + 1]] + queued[p]
        if (got > e).any():
            j = int(np.flatnonzero(got > e)[0])
            raise AssertionError(f"partition {p} batch {j} applied or queued {got[j]} "
                                 f"times in {e} epochs")
        lost += int((e - got).sum())
    part_of = np.repeat(np.arange(n), nb)
    taken = np.asarray(taken)
    return {"epochs": [int(x) for x in epochs],
            "applied": [int(applied[boff[p]:boff[p + 1]].sum()) for p in range(n)],
            "stolen_by_worker": [int(taken[w][part_of != w].sum()) for w in range(n)],
            "queued_at_end": [int(np.sum(q)) for q in queued], "lost": lost}
