"""eager-SGD's collectives in virtual time: sync, solo and majority allreduce with the
kit's semantics (:mod:`sgd_shm.collectives.base`), real gradients.

Rank k's round r is the eager trainer's step (:mod:`sgd_shm.eager.trainer`):

1. ``start``: if round r has already closed (the rank is behind: ``lag() > 0``) it
   skips the gradient and contributes nothing new; else it sleeps (the cluster's
   imbalance, drawn by :func:`sgd_shm.core.imbalance.sleepers` from the run's seed, and
   delay) and computes the gradient of its next minibatch at the replica's weights
   (every replica applies every round's result in the same order, so rank k's replica
   at round r is the model after rounds 0..r-1);
2. ``post`` (after the step's time): back-pressure first (round r - depth must have
   been consumed by every rank, as the shared segment's slot recycling); then, if the
   round is closed, the rank is late: with ``late="carry"`` its contribution (the
   gradient plus what it already carried) is added to its next one, with "drop" it
   is lost; else it arrives, and the round closes as its kind says: ``sync`` when
   every rank has arrived, ``solo`` at the first arrival, ``majority`` at the arrival
   of the round's initiator (:func:`sgd_shm.collectives.base.initiator`, the same
   draw from the same seed);
3. at the close, the contributors are fixed: their contributions are summed in rank
   order, divided by the number of ranks (``average="size"``) or of contributors,
   and applied with ``w -= lr * mean``; the result is ready after the collective's
   time (:meth:`sgd_shm.sim.Network.allreduce`, or ``allgather`` for compressed
   messages, which travel by a gather as in the trainer); every rank that has posted
   takes it then, a late rank as soon as it posts.

With a compressor every rank keeps its :class:`~sgd_shm.compress.Channel` (error
feedback); a message that misses its round goes back into the memory with
``late="carry"``, as the trainer's gather exchange does.
"""
from __future__ import annotations

import heapq

import numpy as np

from sgd_shm.collectives.base import initiator
from sgd_shm.compress import packed_size
from sgd_shm.core.imbalance import sleepers

START, POST, DONE, KILL = range(4)
#: the fields of the round log (one entry per round, in order)
ROUND_FIELDS = ("seconds", "round", "contributors")


class EagerSim:
    """One simulated eager-SGD run (see the module notes)."""

    def __init__(self, prob, cfg):
        self.prob, self.cfg = prob, cfg
        P = self.P = cfg.n_workers
        self.model, self.data, self.d = prob.model, prob.data, prob.d
        self.w = prob.init.copy()
        self.times = cfg.step_times
        self.net = cfg.network
        n_rows = self.model.n_rows(self.data)
        self.rows = [np.arange(k, n_rows, P, dtype=np.int64) for k in range(P)]
        self.rngs = [np.random.default_rng([cfg.seed, k, 0x5EED]) for k in range(P)]
        self.order = [self.rngs[k].permutation(self.rows[k]) for k in range(P)]
        self.pos = [0] * P
        self.rounds = cfg.budget
        self.round0 = 0                      # the first round's id (a replay's: the trace's)
        self.v = np.zeros(self.d) if cfg.momentum else None     # heavy ball, as the trainer's
        self.next = [0] * P
        self.closed_upto = 0
        self.arrived = {}                    # round -> {rank: contribution}
        self.ready = {}                      # round -> time its result is ready
        self.consumed = {}                   # round -> ranks that took its result
        self.bp = {}                         # round -> ranks waiting to post past it
        self.pending = [None] * P            # rank -> (round, gradient or message)
        self.carry = [None] * P
        self.late = np.zeros(P, np.int64)
        self.skipped = np.zeros(P, np.int64)
        self.contrib = np.zeros(P, np.int64)
        self.bytes_sent = self.bytes_dense = self.bytes_moved = 0
        self.channels = None
        if cfg.compress is not None:
            from sgd_shm.compress import Channel
            self.channels = [Channel(cfg.compress, self.d, stream=k,
                                     keep_lost=cfg.late == "carry") for k in range(P)]
        self.heap, self.seq = [], 0
        self.history, self.log = [], []
        self.skips = []                      # (rank, round) of every skipped gradient
        self.next_sample = 0.0
        self.end = [0.0] * P
        self.t_target = None
        self.stop_round = None

    def at(self, t, kind, k):
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, k))

    def minibatch(self, k):
        b = self.cfg.batch_size
        if self.pos[k] + b > self.order[k].size:
            self.order[k], self.pos[k] = self.rngs[k].permutation(self.rows[k]), 0
        out = self.order[k][self.pos[k]:self.pos[k] + b]
        self.pos[k] += b
        return out

    def run(self):
        self.record(0.0, 0)
        for k in range(self.P):
            self.at(self.cfg.cluster.start_s, START, k)   # after the run's start-up
        handlers = (self.start, self.post, self.done)
        while self.heap:
            t, _, kind, k = heapq.heappop(self.heap)
            handlers[kind](t, k)
        return self

    # ---- a rank's round ----------------------------------------------------------------
    def last_round(self):
        """One past the id of the run's last round (ids start at ``round0``)."""
        return self.rounds if self.stop_round is None else min(self.rounds, self.stop_round)

    def n_rounds(self):
        """Rounds the run closed (a replay's ids start at its trace's first round)."""
        return max(self.last_round() - self.round0, 0)

    def start(self, t, k):
        r = self.next[k]
        if r >= self.last_round():
            self.end[k] = t
            return
        cfg = self.cfg
        if self.closed_upto > r:                       # behind: catch up only
            self.skipped[k] += 1
            self.skips.append((k, r))
            self.pending[k] = (r, None)
            self.at(t, POST, k)
            return
        pause = 0.0
        imb = cfg.cluster.imbalance
        if imb is not None and imb[0] > 0:
            if k in sleepers(cfg.seed, r, self.P, imb[0]):
                pause += imb[1]
        g = np.empty(self.d)
        self.model.grad(self.w, self.data, self.minibatch(k), g)
        if not np.isfinite(g).all():
            from sgd_shm.core.errors import DivergenceError
            raise DivergenceError(f"training diverged at round {r}; lower lr (got {cfg.lr})")
        self.bytes_dense += 8 * self.d
        self.pending[k] = (r, g)
        if self.channels is not None:
            pause += cfg.cluster.compress_s
        self.at(t + pause + self.times.of(k, t), POST, k)

    def contribution(self, k, g):
        """What rank k hands to its round: dense, its gradient (zeros when it skipped)
        plus what it carries; compressed, its channel's message (None when skipped)."""
        if self.channels is not None:
            return None if g is None else self.channels[k].message(g)
        c = np.zeros(self.d) if g is None else g
        if self.carry[k] is not None:
            c = c + self.carry[k]
            self.carry[k] = None
        return c

    def post(self, t, k):
        r, g = self.pending[k]
        if r >= self.cfg.depth and self.consumed.get(r - self.cfg.depth, 0) < self.P:
            self.bp.setdefault(r - self.cfg.depth, []).append(k)
            return                                     # back-pressure: wait for the slot
        c = self.contribution(k, g)
        if self.channels is None:
            self.bytes_moved += 8 * (self.d + 1)
        else:
            self.bytes_moved += 8 * (1 + (0 if c is None else packed_size(c.indices.size,
                                                                          self.d)))
        if r < self.closed_upto:                       # late
            self.late[k] += 1
            self.keep_late(k, c)
            self.at(max(t, self.ready[r]), DONE, k)
            return
        self.arrive(t, k, r, c)

    def arrive(self, t, k, r, c):
        """Rank k's contribution c reaches open round r; the round closes at the
        arrival its kind waits for (sync: the last; solo: the first; majority: the
        initiator's, drawn as the collectives draw it)."""
        arr = self.arrived.setdefault(r, {})
        arr[k] = c
        kind = self.cfg.collective
        if (kind == "solo" or (kind == "sync" and len(arr) == self.P)
                or (kind == "majority" and k == initiator(self.cfg.seed, r, self.P))):
            self.close(t, r)

    def keep_late(self, k, c):
        if c is None:
            return
        if self.channels is not None:
            self.channels[k].delivered(c, applied=False)
        elif self.cfg.late == "carry":
            self.carry[k] = c if self.carry[k] is None else self.carry[k] + c

    def close(self, t, r):
        """Round r closes at t: its contributors are fixed, the update applied."""
        arr = self.arrived.pop(r)
        ranks = sorted(arr)
        cfg = self.cfg
        total = np.zeros(self.d)
        payload = 0
        for k in ranks:
            c = arr[k]
            if c is None:
                continue
            if self.channels is not None:
                c.add_to(total)
                self.channels[k].delivered(c, applied=True)
                self.bytes_sent += int(c.nbytes)
                payload += int(c.nbytes)
            else:
                total += c
                if self.pending[k][1] is not None:
                    self.bytes_sent += 8 * self.d
        total /= self.P if cfg.average == "size" else len(ranks)
        lr = cfg.lr(r - self.round0)                   # the run's (r - round0)-th round
        if self.v is None:
            self.w -= lr * total
        else:                                          # the trainer's operations, in order
            self.v *= cfg.momentum
            self.v -= lr * total
            self.w += self.v
        for k in ranks:
            self.contrib[k] += 1
        self.closed_upto = r + 1
        if self.channels is None:
            cost = self.net.allreduce(8 * (self.d + 1), self.P)
        else:
            cost = self.net.allgather(payload + 8 * len(ranks), self.P)
        ready = self.ready[r] = t + cost
        self.log.append((ready, r, tuple(ranks)))
        for k in ranks:
            self.at(ready, DONE, k)
        if ready >= self.next_sample or r + 1 >= self.last_round():
            rec = self.record(ready, r + 1 - self.round0)
            stop = any([bool(cb(dict(rec))) for cb in cfg.callbacks])
            if (cfg.target_loss is not None and self.t_target is None
                    and rec["loss"] <= cfg.target_loss):
                self.t_target = ready
                stop = True
            if stop and self.stop_round is None:
                self.stop_round = r + 1
        if ready >= cfg.max_seconds and self.stop_round is None:
            self.stop_round = r + 1

    def done(self, t, k):
        r = self.pending[k][0]
        self.pending[k] = None
        n = self.consumed[r] = self.consumed.get(r, 0) + 1
        if n == self.P:                                # the slot is free again
            self.ready.pop(r, None)
            for q in self.bp.pop(r, ()):
                self.at(t, POST, q)
        self.next[k] = r + 1
        self.at(t, START, k)

    # ---- the record --------------------------------------------------------------------
    def record(self, t, step):
        rec = {"seconds": t, "step": step, **self.prob.evaluate(self.w)}
        self.history.append(rec)
        self.next_sample = t + self.cfg.sample_every
        if not np.isfinite(rec["loss"]):
            from sgd_shm.core.errors import DivergenceError
            raise DivergenceError(f"training diverged: the loss is {rec['loss']} after "
                                  f"{step} rounds; lower lr (got {self.cfg.lr})")
        return rec

    @property
    def seconds(self):
        return max(self.end) if self.end else 0.0

    def participation(self):
        rounds = max(self.n_rounds(), 1)
        return [float(c) / rounds for c in self.contrib]
