"""The parameter server in virtual time: the real policy objects, real gradients.

Worker k's step is the real worker loop's (:mod:`sgd_shm.ps.worker`), each part an
event at a virtual time:

1. ``ready``: the policy's gate (``policy.may_step(k, my_pushes, state)``); closed,
   the worker waits until a push or a status change opens it; open, it claims a
   ticket of the work budget (none left: it idles) and takes a minibatch from the
   policy's ``sources`` then its own partition (the queues are keyed as the real
   ones: epoch * n_batches + a random position, refilled one epoch at a time);
2. ``pull`` (one latency later): the server reads the weights and the global
   version; the gradient of the minibatch is computed there, at those weights (the
   weights do not change for this worker until it pushes, so computing it at the
   pull is computing it after the answer arrives); the answer reaches the worker
   after the servers' shared link and the worker's link have carried it;
3. ``send`` (after the step's compute time): with a policy that uses staleness the
   worker reads the version now, tau = version - pulled, and asks
   ``policy.push_scale(tau, flagged)``: ``None`` drops the push (the minibatch goes
   back to its queue, the ticket is kept, the worker starts again at once); else the
   gradient goes through the worker's compressor channel (error feedback), and the
   message (its bytes) travels to the servers;
4. ``apply`` (when the servers' link has taken the message): ``w -= lr * scale *
   g`` (only the shards whose message got through, with ``drop``), the global
   version + 1, the worker's counters; the worker is ready again.

The coordinator samples every ``sample_every`` virtual seconds: a history record
(the same :class:`~sgd_shm.core.results.Evaluator` as the trainers), then
``policy.on_sample(view)`` with a view of the same counters (SaPS flags there; a
flag writes the partition's deficit off with the real rule,
:func:`sgd_shm.core.status.written_off_lag`). Events at equal times run in the
order they were scheduled, so a run is deterministic given its seed.

Gates are asked again after every state change. For the gates of
:class:`~sgd_shm.core.policies.Policy` and :class:`~sgd_shm.core.policies.SSP` (BSP,
SSP, SaPS, which do not override them), whose answer depends on the worker only
through its push count and opens for smaller counts first, the waiting workers are
asked in ascending order of their counts until one is refused, and one answer per
count and state is reused; any other policy's gate is asked for every waiting worker
after every change.
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from sgd_shm.core.policies import SSP, Policy, server_average
from sgd_shm.core.status import (DEAD, FLAGGED, HIST_BINS, RUNNING, Losses,
                                 written_off_lag)

READY, PULL, SEND, APPLY, SAMPLE, KILL = range(6)
_KNOWN_GATES = (Policy.may_step, SSP.may_step)


def _gated(policy) -> bool:
    """Whether the policy has a gate that can close (its may_step is not the base
    class's always-open one): BSP and SSP, not ASP, SaPS or RPS."""
    return type(policy).may_step is not Policy.may_step
#: the fields of the push log (one entry per applied push, in virtual-time order)
LOG_FIELDS = ("seconds", "worker", "partition", "batch", "pulled", "version", "scale")


class SimState:
    """The run's state as the policies read it (:class:`sgd_shm.ps.transport.RunState`),
    in virtual time: the version, every worker's pushes and status, every
    partition's epoch and lag. The readers are the lists' own item getters (a gate
    or a source rule reads them n times per step; at 1,024 workers a Python method
    per read would dominate the run)."""

    stopped = False
    alive = True

    def __init__(self, n):
        self.version = 0
        self.pushes_ = [0] * n
        self.status_ = [RUNNING] * n
        self.epochs_ = [0] * n
        self.lags_ = [0] * n
        self.pushes = self.pushes_.__getitem__
        self.status = self.status_.__getitem__
        self.epoch = self.epochs_.__getitem__
        self.lag = self.lags_.__getitem__


class SimSampleView:
    """What ``policy.on_sample`` sees (as :class:`sgd_shm.ps.coordinator.SampleView`):
    ``now``, ``flagged`` and ``killed`` (the run's own set and list), the counters and
    flagging."""

    def __init__(self, now, sim):
        self.now, self._sim = now, sim
        self.flagged, self.killed = sim.flagged, sim.killed

    def staleness_sum(self, k):
        return int(self._sim.stale_sum[k])

    def pushes_tried(self, k):
        return int(self._sim.state.pushes_[k] + self._sim.dropped[k])

    def flag(self, k):
        self._sim.flag(k, self.now)

    def unflag(self, k):
        self._sim.unflag(k, self.now)


class _Queues:
    """The partitions' minibatch queues: heaps keyed epoch * n_batches + a random
    position (refilled one epoch at a time by the taker, in an order drawn from its
    generator), as :class:`sgd_shm.ps.partitions.Partitions`."""

    def __init__(self, batches, rngs, state):
        self.nb = [int(x) for x in batches.n_batches]
        self.heaps = [[] for _ in self.nb]
        self.state = state

    def take(self, sources, rng):
        for q, limit in sources:
            while True:
                h = self.heaps[q]
                if h:
                    key, j = heapq.heappop(h)
                    return q, key, j
                e = self.state.epochs_[q]
                if limit is not None and e >= limit:
                    break
                n = self.nb[q]
                self.state.epochs_[q] = e + 1
                perm = rng.permutation(n)
                for i in range(n):
                    heapq.heappush(h, ((e + 1) * n + int(perm[i]), i))
        raise ValueError(f"sources: {sources!r} gave no minibatch; the last source must "
                         "have no refill limit (None)")

    def requeue(self, p, key, j):
        heapq.heappush(self.heaps[p], (key, j))


class PSSim:
    """One simulated parameter-server run (see the module notes). ``prob``: the
    prepared problem (:class:`sgd_shm.sim.simulate._Problem`); ``cfg``: the
    validated settings."""

    def __init__(self, prob, cfg):
        self.prob, self.cfg = prob, cfg
        n = self.n = cfg.n_workers
        self.model, self.data, self.d = prob.model, prob.data, prob.d
        self.policy = cfg.policy
        self.state = SimState(n)
        self.batches = prob.batches
        self.rngs = [np.random.default_rng(int(s)) for s in prob.worker_seeds]
        self.queues = _Queues(self.batches, self.rngs, self.state)
        self.times = cfg.step_times
        self.net = cfg.network
        S = self.S = cfg.n_shards
        self.bounds = np.linspace(0, self.d, S + 1).astype(np.int64)
        self.w = prob.init.copy()
        self.budget = cfg.budget
        self.stale_sum = np.zeros(n, np.int64)
        self.dropped = np.zeros(n, np.int64)
        self.stolen = np.zeros(n, np.int64)
        self.bytes_sent = np.zeros(n, np.int64)
        self.hist = np.zeros((n, HIST_BINS), np.int64)
        self.flagged, self.killed = set(), []
        self.events, self.detections = [], []
        self.history = []
        self.tickets = 0
        self.lost = 0                              # tickets held by killed workers
        self.applied = 0
        self.held = [False] * n                    # holding a ticket
        self.task = [None] * n                     # (p, key, j, pulled version, grad)
        self.grads = [None] * n
        self.blocked = {}                          # worker -> its push count
        self.heap, self.seq = [], 0
        self.stamp = 0                             # state changes so far (gate memo)
        self.memo = {}
        self.known_gate = type(self.policy).may_step in _KNOWN_GATES
        # a gated policy's step costs cluster.gate_s more, before its push (see
        # Cluster); ASP's none
        self.gate_s = cfg.cluster.gate_s if _gated(self.policy) else 0.0
        self.in_free = self.out_free = -math.inf      # the servers' links free since
        self.cores = cfg.cluster.cores                     # shared cores: each server's
        if self.cores is not None:                         # next free time, and speed
            n = math.ceil(self.cores)
            self.busy, self.core_speed = [0.0] * n, self.cores / n
        self.replay = cfg.replay                           # a real run's timeline, or None
        self.steps = [0] * n                               # steps done, per worker
        self.log = []
        self.t_target = None
        self.stop_t = None
        self.channels = self._channels()
        self.losses = None
        if cfg.drop is not None:
            self.losses = [Losses(cfg.drop, cfg.loss_seed, k, S) for k in range(n)]
            self.views = [self.w.copy() for _ in range(n)]
            self.up = [None] * n
            self.msgs = np.zeros((n, S, 4), np.int64)

    def _channels(self):
        if self.cfg.compress is None:
            return None
        from sgd_shm.compress import Channel
        return [Channel(self.cfg.compress, self.d, stream=k) for k in range(self.n)]

    # ---- events ------------------------------------------------------------------------
    def at(self, t, kind, k):
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, k))

    def run(self):
        cfg, tr = self.cfg, self.replay
        for k in range(self.n):
            if tr is None:
                self.at(cfg.cluster.start_s, READY, k)   # after the run's start-up
            elif np.isfinite(tr.first[k]):
                self.at(float(tr.first[k]), READY, k)
        for k, t in cfg.faults.items():
            self.at(float(t), KILL, k)
        self.record(0.0)
        if tr is None:
            self.at(cfg.sample_every, SAMPLE, -1)
        else:                                          # the real run's samples
            for t in tr.samples:
                self.at(float(t), SAMPLE, -1)
        handlers = (self.ready, self.pull, self.send, self.apply, self.sample, self.kill)
        heap = self.heap
        while heap and self.stop_t is None:
            t, _, kind, k = heapq.heappop(heap)
            if k >= 0 and self.state.status_[k] == DEAD:
                continue
            handlers[kind](t, k)
        if self.stop_t is None:                   # every worker idles or waits
            self.stop_t = max(self.last_t(), 0.0)
        return self

    def last_t(self):
        return self.log[-1][0] if self.log else 0.0

    def changed(self, t):
        """The state changed: gates may open."""
        self.stamp += 1
        if self.blocked:
            self.wake(t)

    def gate(self, k, my_pushes):
        if not self.known_gate:
            return self.policy.may_step(k, my_pushes, self.state)
        key = (self.stamp, my_pushes)
        got = self.memo.get(key)
        if got is None:
            if len(self.memo) > 4096:
                self.memo.clear()
            got = self.memo[key] = bool(self.policy.may_step(k, my_pushes, self.state))
        return got

    def wake(self, t):
        order = sorted(self.blocked.items(), key=lambda kv: (kv[1], kv[0]))
        late = self.cfg.cluster.wake_s                 # until the worker notices
        for k, c in order:
            if self.gate(k, c):
                del self.blocked[k]
                self.begin(t + late, k)
            elif self.known_gate:
                return

    def ready(self, t, k):
        if not self.gate(k, self.state.pushes_[k]):
            self.blocked[k] = self.state.pushes_[k]
            return
        self.begin(t, k)

    def begin(self, t, k):
        """The gate is open: claim a ticket, take a minibatch, send the pull."""
        if self.budget is not None and not self.held[k]:
            if self.tickets >= self.budget:
                return                               # no ticket left: idle
            self.tickets += 1
            self.held[k] = True
        sources = list(self.policy.sources(k, self.state))
        sources.append((k, None))
        p, key, j = self.queues.take(sources, self.rngs[k])
        self.task[k] = [p, key, j, 0]
        if self.replay is not None:                   # the real step's time to its pull
            self.at(t + float(self.replay.lead[k][self.steps[k]]), PULL, k)
            return
        self.at(t + self.net.latency, PULL, k)

    def pull(self, t, k):
        st = self.state
        w = self.w
        if self.losses is not None:
            up, down = self.losses[k].draw()
            self.up[k] = up
            view = self.views[k]
            b = self.bounds
            for s in np.flatnonzero(down):
                view[b[s]:b[s + 1]] = w[b[s]:b[s + 1]]
            self.msgs[k] += self.losses[k].counts(up, down)
            w = view
        self.task[k][3] = st.version
        g = self.grads[k]
        if g is None:
            g = self.grads[k] = np.empty(self.d)
        p, _, j, _ = self.task[k]
        self.model.grad(w, self.data, self.batches.rows_of(p, j), g)
        if not np.isfinite(g[0]) or not np.isfinite(g).all():
            from sgd_shm.core.errors import DivergenceError
            raise DivergenceError(f"training diverged: worker {k}'s gradient is NaN or inf "
                                  f"after {st.version} updates; lower lr (now {self.cfg.lr})")
        nbytes = 8 * self.d
        net = self.net
        depart = max(t, self.out_free) + nbytes / (self.S * net.bandwidth)
        self.out_free = depart
        t_recv = max(depart, t + nbytes / net.bandwidth) + net.latency
        if self.replay is not None:                   # the real step's time to its push
            i = self.steps[k]
            self.at(t + float(self.replay.pre[k][i]), SEND, k)
            return
        extra = 0.0 if self.channels is None else self.cfg.cluster.compress_s
        dur = self.times.of(k, t_recv) + extra
        if self.cores is not None:
            dur *= self.stretch(k, t_recv, dur)
        # a gated policy's charge ends the step: it delays the push (and with it the
        # round), not the step's claim on a core
        self.at(t_recv + dur + self.gate_s, SEND, k)

    def stretch(self, k, t, dur):
        """The stretch of a step whose computing is ready at t on shared cores: the
        cores are ceil(cores) servers, each cores / ceil(cores) as fast, taking the
        workers' computing first come, first served and to completion (a step's
        computing, well under a millisecond, is far shorter than an operating system's
        time slice). The step computes ``c = dur / factor_k`` of it (the rest is a
        slowed worker's sleep, which the trainers' emulation makes a multiple of the
        time its computing took, waiting for a core included): the stretch is the time
        from t to the end of its computing over c."""
        c = dur / self.times.factors[k]
        free = heapq.heappop(self.busy)
        end = max(t, free) + c / self.core_speed
        heapq.heappush(self.busy, end)
        return (end - t) / c

    def send(self, t, k):
        st = self.state
        p, key, j, v = self.task[k]
        scale = 1.0
        if self.policy.uses_staleness:
            tau = st.version - v
            scale = self.policy.push_scale(tau, st.status_[k] == FLAGGED)
            if scale is None:                        # dropped: re-queue, start again
                self.stale_sum[k] += tau
                self.dropped[k] += 1
                self.queues.requeue(p, key, j)
                self.next_step(t, k)
                return
        self.task[k].append(scale)
        g = self.grads[k]
        if self.channels is not None:
            msg = self.channels[k].message(g)
            self.task[k].append(msg)
            nbytes = int(msg.nbytes)
        else:
            nbytes = 8 * self.d
        if self.losses is not None and not self.up[k].any():
            self.after_push(t, k, p, j, counted=False)   # lost to every shard
            return
        self.bytes_sent[k] += nbytes
        if self.replay is not None:                   # the real push's end
            self.at(t + float(self.replay.lag[k][self.steps[k]]), APPLY, k)
            return
        net = self.net
        done = max(t + net.latency, self.in_free) + nbytes / (self.S * net.bandwidth)
        done = max(done, t + net.latency + nbytes / net.bandwidth)
        self.in_free = done
        self.at(done, APPLY, k)

    def apply(self, t, k):
        st = self.state
        task = self.task[k]
        p, key, j, v, scale = task[:5]
        step = self.cfg.lr(v) * scale                 # the schedule at the version pulled
        w = self.w
        if self.channels is not None:
            msg = task[5]
            idx, vals = msg.indices, msg.values
            if msg.scale != 1.0:
                vals = vals * msg.scale
            if self.losses is not None and not self.up[k].all():
                keep = np.isin(np.searchsorted(self.bounds, idx, side="right") - 1,
                               np.flatnonzero(self.up[k]))
                idx, vals = idx[keep], vals[keep]
            w[idx] -= step * vals
            self.channels[k].delivered(msg)
        elif self.losses is not None and not self.up[k].all():
            b, g = self.bounds, self.grads[k]
            for s in np.flatnonzero(self.up[k]):
                w[b[s]:b[s + 1]] -= step * g[b[s]:b[s + 1]]
        else:
            w -= step * self.grads[k]
        tau = st.version - v
        self.stale_sum[k] += tau
        self.hist[k, min(max(tau, 0).bit_length(), HIST_BINS - 1)] += 1
        self.log.append((t, k, p, j, v, st.version, scale))
        st.version += 1
        st.pushes_[k] += 1
        self.after_push(t, k, p, j, counted=True)

    def after_push(self, t, k, p, j, counted):
        """A push is done (applied, or lost on the way to every shard): the ticket is
        spent, the minibatch counts as applied, the worker starts again."""
        self.held[k] = False
        self.applied += 1
        if p != k:
            self.stolen[k] += 1
        if self.budget is not None and self.applied >= self.budget - self.lost:
            self.stop_t = t
            return
        if counted:
            self.changed(t)
        self.next_step(t, k)

    def next_step(self, t, k):
        """Worker k starts its next step: at once, or, replaying a trace, after the
        real step's time from its push to the next start (none recorded: it stops)."""
        if self.replay is None:
            self.at(t, READY, k)
            return
        i = self.steps[k]
        self.steps[k] += 1
        post = self.replay.post[k]
        if i < len(post) and self.steps[k] < len(self.replay.pre[k]):
            self.at(t + float(post[i]), READY, k)

    # ---- the coordinator ---------------------------------------------------------------
    def record(self, t):
        rec = {"seconds": t, "step": self.state.version, **self.prob.evaluate(self.w)}
        self.history.append(rec)
        if not np.isfinite(rec["loss"]):
            from sgd_shm.core.errors import DivergenceError
            raise DivergenceError(f"training diverged: the loss is {rec['loss']} after "
                                  f"{self.state.version} updates; lower lr (now {self.cfg.lr})")
        return rec

    def sample(self, t, _):
        cfg = self.cfg
        rec = self.record(t)
        self.policy.on_sample(SimSampleView(t, self))
        stop = any([bool(cb(dict(rec))) for cb in cfg.callbacks])     # every one is called
        if cfg.target_loss is not None and rec["loss"] <= cfg.target_loss:
            self.t_target = t
            self.stop_t = t
            return
        if stop:
            self.stop_t = t
            return
        if t >= cfg.max_seconds or len(self.killed) == self.n:
            self.stop_t = t
            return
        if not self.heap:
            self.stop_t = t                            # nothing left to happen
            return
        if self.replay is None:
            self.at(t + cfg.sample_every, SAMPLE, -1)

    def unflagged_live(self):
        return [q for q in range(self.n) if q not in self.flagged and q not in self.killed]

    def write_off(self, q):
        lag = written_off_lag(self.state.epochs_, q, self.unflagged_live())
        if lag is not None:
            self.state.lags_[q] = lag

    def flag(self, k, now):
        self.flagged.add(k)
        self.write_off(k)
        self.state.status_[k] = FLAGGED
        self.events.append((now, k, True))
        if all(w != k for _, w in self.detections):
            self.detections.append((now, k))
        self.changed(now)

    def unflag(self, k, now):
        self.flagged.discard(k)
        self.state.status_[k] = RUNNING
        self.events.append((now, k, False))
        self.changed(now)

    def kill(self, t, k):
        """Worker k dies: what it held (a ticket, a minibatch) is lost."""
        self.killed.append(k)
        self.lost += int(self.held[k])
        self.flagged.discard(k)
        self.state.status_[k] = DEAD
        self.blocked.pop(k, None)
        self.write_off(k)
        self.changed(t)

    # ---- the result's parts ------------------------------------------------------------
    def workers(self):
        out = []
        for k in range(self.n):
            pushes = self.state.pushes_[k]
            out.append({"pushes": int(pushes), "dropped": int(self.dropped[k]),
                        "stolen": int(self.stolen[k]), "staleness_sum": int(self.stale_sum[k]),
                        "spells": int(self.times.spells[k]),
                        "slowdown": float(self.times.factors[k]),
                        "bytes_sent": int(self.bytes_sent[k]),
                        "bytes_dense": int(8 * self.d * pushes)})
            if self.losses is not None:
                out[-1].update(zip(("up_sent", "up_lost", "down_sent", "down_lost"),
                                   (int(x) for x in self.msgs[k].sum(axis=0))))
        return out


class RPSSim(PSSim):
    """A replicated policy (RPS) in virtual time: rounds of model averaging through the
    servers, as :func:`sgd_shm.ps.worker.run_rounds` (Yu et al., ICML 2019). Every
    worker takes a local step on its replica (its own partition's next minibatch),
    sends block j to server j (lost with probability ``drop``, the real coins); the
    round's barrier is the policy's gate; server j averages the blocks it received
    (:func:`sgd_shm.core.policies.server_average`) and answers (each answer lost with
    probability ``drop``). A round ends when the last live worker's blocks have
    arrived; each worker starts its next round when the answers reach it."""

    def run(self):
        cfg, n = self.cfg, self.n
        self.losses = [Losses(cfg.drop or 0.0, cfg.loss_seed, k, self.S) for k in range(n)]
        self.msgs = np.zeros((n, self.S, 4), np.int64)
        self.xs = [self.w.copy() for _ in range(n)]
        start = np.full(n, cfg.cluster.start_s)        # after the run's start-up
        rounds = cfg.budget if cfg.budget is not None else math.inf
        next_sample = cfg.sample_every
        self.record(0.0)
        r, t_end = 0, 0.0
        while r < rounds:
            t_bar = self._round(r, start)
            if t_bar is None:                         # every worker died
                break
            t_end = t_bar
            r += 1
            if t_end >= next_sample:                  # a record after the round
                rec = self.record(t_end)
                next_sample = t_end + cfg.sample_every
                stop = any([bool(cb(dict(rec))) for cb in cfg.callbacks])
                if cfg.target_loss is not None and rec["loss"] <= cfg.target_loss:
                    self.t_target = t_end
                    break
                if stop:
                    break
            if t_end >= cfg.max_seconds:
                break
        self.applied = int(sum(self.state.pushes_))
        self.stop_t = t_end
        return self

    def _step_end(self, k, t):
        """When worker k's step begun at t ends (on shared cores: stretched by the
        cores' queue), or None when its fault comes first: it dies then, its
        minibatch lost and its blocks never sent, and the round's barrier waits for
        the live workers only (as the real run's)."""
        dur = self.times.of(k, t)
        if self.cores is not None:
            dur *= self.stretch(k, t, dur)
        fault = self.cfg.faults.get(k)
        if fault is not None and fault <= t + dur:
            self.killed.append(k)
            self.state.status_[k] = DEAD
            return None
        return t + dur

    def _round(self, r, start):
        """Round r of the live workers; returns when its barrier passed (None: no
        worker is left)."""
        cfg, S, b, net = self.cfg, self.S, self.bounds, self.net
        g = np.empty(self.d)
        arrive, ups, downs = {}, {}, {}
        live = []
        for k in range(self.n):
            if self.state.status_[k] == DEAD:
                continue
            p, key, j = self.queues.take([(k, None)], self.rngs[k])
            t_send = self._step_end(k, start[k])
            if t_send is None:
                continue
            live.append(k)
            self.model.grad(self.xs[k], self.data, self.batches.rows_of(p, j), g)
            self.xs[k] -= cfg.lr(r) * g
            ups[k], downs[k] = self.losses[k].draw()
            arrive[k] = t_send + net.latency + 8 * self.d / net.bandwidth
            self.state.pushes_[k] += 1
            self.log.append((t_send, k, p, j, r, r, 1.0))
        if not live:
            return None
        t_bar = max(max(arrive.values()), self.in_free) + 8 * self.d * len(live) / (
            S * net.bandwidth)
        self.in_free = t_bar
        for k in live:                                # the barrier: BSP's gate
            assert self.policy.may_step(k, self.state.pushes_[k], self.state)
        for s in range(S):
            got = [self.xs[k][b[s]:b[s + 1]] for k in live if ups[k][s]]
            avg = server_average(got)
            if avg is None:
                continue
            self.w[b[s]:b[s + 1]] = avg
            for k in live:
                if downs[k][s]:
                    self.xs[k][b[s]:b[s + 1]] = avg
        answered = np.any([ups[k] for k in live], axis=0)
        blk = 8 * self.d / S
        for k in live:
            self.msgs[k] += self.losses[k].counts(up=ups[k]) + self.losses[k].counts(
                down=downs[k], answered=answered)
            start[k] = t_bar + net.latency + blk * answered.sum() / net.bandwidth
        self.state.version += 1
        return t_bar
