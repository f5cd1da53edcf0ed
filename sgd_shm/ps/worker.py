"""The worker loop of the parameter server, the same on every transport.

A worker repeats one step: wait while its policy's gate says so, take the next
minibatch (from the partitions its policy names, then its own), ``pull`` the weights,
compute the minibatch gradient, sleep to emulate a slower machine (``factor - 1``
times the pull and the computation), and ``push`` the
gradient with the weight its policy gives the push's staleness (or drop it and
re-queue the minibatch).

With a compressor (``train(..., compress=...)``), each worker keeps its own
:class:`~sgd_shm.compress.Channel` (GRACE's communicator role, holding the worker's
error-feedback memory; made in the worker's process): a gradient that is pushed goes
through ``msg = channel.message(g)`` (the gradient plus the residual of earlier steps
is compressed, and what the message leaves out stays in the residual); the message is
pushed sparsely (its values times its decoding scale, only to the shards its indices
hit), and the worker's slot counts the message's bytes. The policy decides before the
memory is touched: a push it scales is applied with ``scale`` times the message's
values (the (1 - scale) part is the policy's damping, not kept), and a push it drops
leaves the memory as it was (the dropped gradient is not folded into the residual,
since its minibatch is redone; the residual of the earlier steps is kept whole): the
same as ``memory.step(g)`` followed by ``memory.keep(msg)`` and taking ``g`` back
out, so error feedback conserves the mass of every applied
minibatch and counts no minibatch twice.

The gradient is the model's (``job.model``, a :class:`sgd_shm.models.Model`: the
default linear model, or ``train(..., model=...)``): ``model.grad`` of the minibatch
at the pulled weights; with
``partition="blocks"`` (block variable partitioning, Kungurtsev et al.,
arXiv:1905.11845) worker k draws one of its own blocks (``job.blocks``, from
``model.blocks``) uniformly each step, computes that block's gradient only and pushes
just that range (``push_sparse`` of its indices: only the shards it reaches are locked
and bumped), so no two workers ever write the same weight; its minibatches come from
a data partition drawn uniformly each step (any worker may pop any partition's queue,
exactly once as ever), so each block is trained on all the rows.

With a work budget (``train(..., epochs=E)``), a worker claims a ticket after its
gate opens and before taking a minibatch, keeps it across a dropped push, and spends
it on the push; with no ticket left it idles until the run stops (see
:mod:`sgd_shm.ps.partitions`).

With message loss (``train(..., drop=p)``, policy ASP), every step is a round trip
of messages between the worker and each shard's server, each lost independently with
probability p (coins from :class:`Losses`): the pull's answer of shard j may be lost,
and the worker then computes with its block j as last received; the push's message
to shard j may be lost, and shard j then never sees that gradient (a push lost to
every shard is not applied at all; its minibatch counts as done, since the worker
cannot know). The worker is not told what was lost, so nothing is re-sent and error
feedback (with ``compress=``) keeps no memory of it.

A replicated policy (``policy="rps"``, :class:`sgd_shm.core.policies.RPS`) runs
:func:`run_rounds` instead: every worker keeps a full replica and each step is a
round of model averaging through the servers (the paper's rule, with the same
losses).

It talks to the server only through a *link*: the five verbs of
:class:`sgd_shm.ps.transport.Link` (``state``, ``exchange``, ``take``, ``report``,
``average_round``), which every transport implements
(:class:`sgd_shm.ps.shm_backend.ShmLink` over shared memory, its threads variant
:class:`sgd_shm.ps.threads_backend.ThreadLink`, :class:`sgd_shm.ps.ray_backend.RayLink`)
over the same server state (:class:`sgd_shm.ps.server.ServerState`). A step costs one
``state`` (and one more for the staleness of a push), one ``take``, one pulling
``exchange``, one pushing ``exchange`` and one ``report``.

With ``train(..., trace=True)`` the link carries a :class:`TraceBuffer` and every
worker writes one row per push it decided (applied or dropped) into its own
preallocated rows: :data:`TRACE_INTS` (the minibatch, the versions it read and the
version its push was applied at) and :data:`TRACE_FLOATS` (``time.perf_counter()``
before and after each call that read or changed the run's shared state, and the
scale). Each bracket holds the instant of its atomic operation, which is what a replay
needs to put the run's events back in their order (:mod:`sgd_shm.sim.replay`). Without
a trace the loop pays one test of ``None`` per step.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from sgd_shm.compress import Channel
from sgd_shm.core.launcher import shared_arrays
from sgd_shm.core.validation import model_dtype
from sgd_shm.core.status import FLAGGED, Losses
from sgd_shm.core.traces import TRACE_FLOATS, TRACE_INTS
from sgd_shm.core.traces import PSTrace  # noqa: F401 (its old path, still exported)
from sgd_shm.ps.transport import Push

#: a worker's exit code when its gradient is NaN or inf (the coordinator reports it)
EXIT_DIVERGED = 3


class Diverged(Exception):
    """A worker's gradient is NaN or inf."""


@dataclass
class Job:
    """What every worker of a run needs besides its link: the model and its prepared
    data, the minibatches, the step, the policy (bound to the run) and the straggler
    emulation."""
    model: object                 # a sgd_shm.models.Model
    data: object                  # model.prepare(X, y): what model.grad reads
    n_params: int                 # the length of the weight vector
    batches: object               # partitions.Batches
    policy: object                # policies.Policy, bound
    lr: object                    # a sgd_shm.core.schedules.Schedule: the step at t
    factors: np.ndarray           # compute-time stretch per worker (>= 1)
    transient: tuple | None       # (spells per second, factor, seconds)
    compressor: object = None     # sgd_shm.compress compressor; None: dense pushes
    budget: int | None = None     # minibatch applications of the run (epochs=); RPS: rounds
    drop: float | None = None     # message loss probability; None: reliable links
    loss_seed: int = 0            # the run's seed of the loss coins (see Losses)
    blocks: tuple | None = None   # partition="blocks": (bounds, owners) of model.blocks

    @property
    def dtype(self) -> np.dtype:
        """The float type of every buffer of the run (the model's ``dtype``: float64,
        or float32 for a model that computes in it): the weights pulled, the gradient,
        the messages and the error-feedback memory."""
        return model_dtype(self.model)




class TraceBuffer:
    """Preallocated rows of every worker's traced pushes, in one shared segment (a
    private one for threads): worker k writes ``ints[k, i]`` and ``floats[k, i]`` of
    its i-th push (columns :data:`TRACE_INTS`, :data:`TRACE_FLOATS`) and counts it
    in ``count[k * 8]`` (its own cache line). A worker past ``capacity`` rows keeps
    counting without writing (the trace says it was truncated there)."""

    def __init__(self, n_workers, capacity, shared=True):
        self.capacity = int(capacity)
        self._seg, v = shared_arrays({
            "ints": ((n_workers, self.capacity, len(TRACE_INTS)), np.int64),
            "floats": ((n_workers, self.capacity, len(TRACE_FLOATS)), np.float64),
            "count": ((8 * n_workers,), np.int64)}, shared=shared)
        self.ints, self.floats, self.count = v["ints"], v["floats"], v["count"]
        self._views = None

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_views"] = None                   # memoryviews do not pickle; made again on use
        return d

    def put(self, k, ints, floats):
        """Worker k's next row (Python ints and floats): stores through flat
        memoryviews, a few times cheaper than numpy's row assignment."""
        if self._views is None:
            self._views = (memoryview(self.ints.reshape(-1)),
                           memoryview(self.floats.reshape(-1)), memoryview(self.count))
        mi, mf, mc = self._views
        i = mc[8 * k]
        if i < self.capacity:
            b = (k * self.capacity + i) * 8
            mi[b], mi[b + 1], mi[b + 2], mi[b + 3], mi[b + 4], mi[b + 5], mi[b + 6], \
                mi[b + 7] = ints
            b = (k * self.capacity + i) * 7
            mf[b], mf[b + 1], mf[b + 2], mf[b + 3], mf[b + 4], mf[b + 5], mf[b + 6] = floats
        mc[8 * k] = i + 1

    def rows(self, k, t0=0.0):
        """Worker k's rows as {column: array} (copies; times minus ``t0``), and the
        number of pushes it decided (more than the rows when truncated)."""
        n = int(self.count[8 * k])
        m = min(n, self.capacity)
        out = {c: self.ints[k, :m, i].copy() for i, c in enumerate(TRACE_INTS)}
        out.update({c: self.floats[k, :m, i] - (t0 if c != "scale" else 0.0)
                    for i, c in enumerate(TRACE_FLOATS)})
        return out, n

    def close(self):
        for a in ("ints", "floats", "count"):
            self.__dict__.pop(a, None)
        if self._seg is not None:
            self._seg.close()
            self._seg = None


def warm(job):
    """Compile (or load from Numba's cache) the gradient kernel of ``job`` in this
    process, on its first minibatch (at zero weights of the run's float type, into a
    scratch buffer)."""
    rows = job.batches.rows_of(0, 0)
    w = np.zeros(job.n_params, job.dtype)
    job.model.grad(w, job.data, rows, np.empty_like(w))


def _take(link, job, k, rng, state, claim=False):
    """(partition, key, batch): from the policy's sources first, then k's own; under
    block partitioning from a partition drawn uniformly instead of k's own, so that
    every block learns from all the data (worker k alone steps its blocks, and the
    data partitions are fixed: from its own partition only, block k would see only
    1/n of the rows). ``claim``: claim a ticket of the budget first (None: none
    left)."""
    sources = list(job.policy.sources(k, state))
    n = job.batches.part_lo.shape[0]
    sources.append((int(rng.integers(n)) if job.blocks is not None and n > 1 else k, None))
    return link.take(k, sources, rng, claim)


class _Spells:
    """Transient slow spells of one worker: a Poisson process of spells, each of
    ``length`` seconds during which compute time is stretched by ``factor``."""

    def __init__(self, transient, rng):
        self.spec, self.rng = transient, rng
        self.until, self.next = -1.0, math.inf
        if transient is not None:
            self.next = time.perf_counter() + rng.exponential(1.0 / transient[0])

    def factor(self, now):
        """The extra stretch at ``now``; the second value is True when a spell began."""
        began = False
        if now >= self.next:
            rate, _, length = self.spec
            self.until = now + length
            self.next = self.until + self.rng.exponential(1.0 / rate)
            began = True
        return (self.spec[1] if now < self.until else 1.0), began


def _wait_gate(link, job, k, my_pushes, state):
    """Sleep while the policy's gate is closed. False: stop (or the coordinator died).
    An open gate costs no further look at the stop flag (``state`` has just shown it
    unset)."""
    if job.policy.may_step(k, my_pushes, state):
        return True
    while True:
        if state.stopped or not state.alive:
            return False
        time.sleep(link.poll_s)
        state = link.state(k)
        if job.policy.may_step(k, my_pushes, state):
            return not state.stopped


def _gradient(job, p, j, w, g, block=None):
    """The model's minibatch gradient at ``w`` into ``g`` (of ``block`` only, a
    (lo, hi) range, when given)."""
    job.model.grad(w, job.data, job.batches.rows_of(p, j), g, block)
    return g


def _block(job, k, rng):
    """Under block partitioning (``job.blocks``), the (lo, hi) range of one of
    worker k's blocks drawn uniformly; else None (the whole vector)."""
    if job.blocks is None:
        return None
    bounds, owners = job.blocks
    b = owners[k][rng.integers(owners[k].shape[0])]
    return int(bounds[b]), int(bounds[b + 1])


def _idle(link, k):
    """No ticket left: wait for the stop flag (the coordinator ends the run)."""
    while True:
        st = link.state(k)
        if st.stopped or not st.alive:
            return
        time.sleep(max(link.poll_s, 0.001))


def push_message(bounds, msg, v, scale, shards=None) -> Push:
    """The sparse :class:`Push` of a compressor's message (a
    :class:`~sgd_shm.compress.SparseMessage`, which the memory has checked): its
    values times its decoding scale at its indices, counting the message's ``nbytes``
    as sent. ``shards``: the shards it reaches (``None``: all); only the indices
    that fall in them are kept."""
    idx, vals = msg.indices, msg.values
    if msg.scale != 1.0:
        vals = vals * msg.scale
    if shards is not None:
        keep = np.isin(np.searchsorted(bounds, idx, side="right") - 1, shards)
        idx, vals = idx[keep], vals[keep]
    return Push(v, scale, indices=idx, values=vals, nbytes=int(msg.nbytes))


def _stretch(job, k, spells, t_step, t0):
    """Emulate a slower machine after a step's work: sleep ``factor - 1`` times the
    time since ``t_step`` (the worker's factor times a slow spell's); returns k's
    counters of it (the time since ``t0``, the computation and the sleep, as
    ``compute_ns``; ``spells``: 1 when a slow spell began). The caller moves
    ``t_step`` back by its last push's time: a slower machine pushes slower too, and
    where pushes cost more than gradients (small models, a slow host) stretching the
    pull and the gradient alone would leave a worker slowed "4x" far less than 4x
    slower."""
    now = time.perf_counter()
    extra, began = spells.factor(now)
    factor = job.factors[k] * extra
    if factor > 1:
        time.sleep((factor - 1.0) * (now - t_step))
    counts = {"spells": 1} if began else {}
    counts["compute_ns"] = int(1e9 * (time.perf_counter() - t0))
    return counts


def _receive(link, w, view, down):
    """The pull's answers that got through (``down[j]``) update the worker's view of
    the weights; a lost answer leaves its block as last received."""
    if down.all():
        view[:] = w
        return view
    b = link.bounds
    for j in np.flatnonzero(down):
        view[b[j]:b[j + 1]] = w[b[j]:b[j + 1]]
    return view


def _send(link, k, grad, v, scale, channel, shards, block=None):
    """One push of ``grad`` (through the compressor's channel when there is one) to
    ``shards`` (``None``: all); with a ``block`` (lo, hi), of that range only, sent as
    its values (the shards it does not reach see nothing). Returns what the link's
    push returned (on this box the store's :class:`~sgd_shm.ps.store.PushResult`)."""
    msg = None
    if block is not None:
        lo, hi = block
        push = Push(v, scale, indices=np.arange(lo, hi), values=grad[lo:hi],
                    nbytes=grad.itemsize * (hi - lo) + 16)
    elif channel is None:
        push = Push(v, scale, grad=grad, shards=shards)
    else:
        msg = channel.message(grad)
        push = push_message(link.bounds, msg, v, scale, shards)
    res = link.exchange(k, push, pull=False)
    if msg is not None:
        channel.delivered(msg)        # a push is applied (the server answers no loss)
    return res


def _start(link, job, k):
    """Worker k's compressor channel (its error-feedback memory; the worker draws from
    the stream (seed, k)), loss coins and view of the weights (a lossy run starts from
    the initial weights)."""
    channel = None if job.compressor is None else Channel(job.compressor, job.n_params,
                                                          stream=k, dtype=job.dtype)
    losses = view = None
    if job.drop is not None:
        losses = Losses(job.drop, job.loss_seed, k, len(link.bounds) - 1)
        view = link.exchange(k)[0].copy()
    return channel, losses, view


def run_worker(link, job, k, seed):
    """Worker k's loop until the stop flag is set or the coordinator dies. Raises
    :class:`Diverged` when a gradient is not finite. A replicated policy (RPS) runs
    :func:`run_rounds` instead."""
    if job.policy.replicated:
        return run_rounds(link, job, k, seed)
    rng = np.random.default_rng(seed)
    g = None
    spells = _Spells(job.transient, rng)
    policy = job.policy
    channel, losses, view = _start(link, job, k)
    budget = job.budget is not None
    tr = getattr(link, "trace", None)                # train(trace=True): a TraceBuffer
    ticket = False                                   # holding a ticket of the budget
    my_pushes = link.state(k).pushes(k)
    step = 0
    push_s = 0.0                                     # the last push's seconds
    while True:
        state = link.state(k)                        # one read of the run per step
        if state.stopped:
            return
        step += 1
        if step % 64 == 0 and not state.alive:
            return                                   # the coordinator died: do not linger
        if not _wait_gate(link, job, k, my_pushes, state):
            return
        got = _take(link, job, k, rng, state, claim=budget and not ticket)
        if got is None:                              # no ticket left
            _idle(link, k)
            return
        p, key, j = got
        ticket = True
        t_pull = time.perf_counter()
        t_step = t_pull - push_s                # a slower machine pulls (and pushed) slower
        w, v = link.exchange(k)
        pulled = (t_pull, time.perf_counter()) if tr is not None else None
        if losses is not None:
            up, down = losses.draw()
            w = _receive(link, w, view, down)
        if g is None:
            g = np.zeros(w.shape[0], w.dtype)           # the store's float type
        block = _block(job, k, rng)
        t0 = time.perf_counter()
        grad = _gradient(job, p, j, w, g, block)
        counts = _stretch(job, k, spells, t_step, t0)
        scale, decided = 1.0, None
        if policy.uses_staleness:
            scale, tau, decided = _decide(link, policy, k, v, tr is not None)
            if scale is None:                        # dropped: re-queue, pull again
                counts.update(staleness_sum=tau, dropped=1)   # detection sees it too
                t_rep = time.perf_counter() if tr is not None else 0.0
                link.report(k, counts, requeue=(p, key, j))
                if tr is not None:
                    _trace_push(tr, k, p, j, v, pulled, decided, None, math.nan,
                                (t_rep, time.perf_counter()))
                continue
        if not np.isfinite(grad if block is None else grad[block[0]:block[1]]).all():
            raise Diverged(f"worker {k}'s gradient is NaN or inf")
        shards = msgs = None
        if losses is not None:
            msgs = losses.counts(up, down)
            shards = None if up.all() else np.flatnonzero(up).tolist()
        t_push = time.perf_counter()
        res = None
        if shards != []:                             # [] : lost on the way to every shard
            res = _send(link, k, grad, v, scale, channel, shards, block)
            my_pushes += 1
        if tr is not None:
            _trace_push(tr, k, p, j, v, pulled, decided, res, scale,
                        (t_push, time.perf_counter()))
        if p != k:
            counts["stolen"] = 1
        link.report(k, counts, applied=(p, j), messages=msgs)
        push_s = time.perf_counter() - t_push
        ticket = False


def _decide(link, policy, k, v, traced):
    """The staleness check of a push pulled at version ``v``: (the policy's scale or
    None to drop it, tau, and when ``traced`` (version read, flagged, its bracket))."""
    t = time.perf_counter() if traced else 0.0
    now = link.state(k)
    tau = now.version - v
    flagged = now.status(k) == FLAGGED
    decided = (v + tau, int(flagged), t, time.perf_counter()) if traced else None
    return policy.push_scale(tau, flagged), tau, decided


def _trace_push(tr, k, p, j, v, pulled, decided, res, scale, pushed):
    """Worker k's row of one decided push (see :data:`TRACE_INTS`): ``pulled``, the
    pull's bracket; ``decided``: (version read, flagged, bracket) of the staleness
    check, or None; ``res``: the store's push result (None: dropped or not sent);
    ``pushed``: the push's bracket (a dropped push, whose ``scale`` is nan: its
    report's)."""
    vd, fl, d0, d1 = (-1, -1, math.nan, math.nan) if decided is None else decided
    read = applied = -1
    if res is not None:
        read, applied = v + int(res.staleness), int(res.version)
    tr.put(k, (int(p), int(j), int(v), int(vd), fl, int(math.isnan(scale)), read, applied),
           (pulled[0], pulled[1], d0, d1, pushed[0], pushed[1], float(scale)))


def _wait_round(link, job, k, sent):
    """RPS's barrier: wait until every live worker has sent ``sent`` rounds (the
    policy's gate). An open barrier is passed even when the run is stopping, so a
    round every worker has sent is completed; False: stop (or the coordinator died)
    before it opened. The gate is asked again after the stop flag is seen: the
    coordinator stops once every worker has sent the last round, which may be after
    this worker's last look at the gate (on Ray a snapshot), and that round must
    still be collected."""
    while True:
        state = link.state(k)
        if job.policy.may_step(k, sent, state):
            return True
        if not state.alive:
            return False
        if state.stopped:                   # a fresh state now holds the others' rounds
            return job.policy.may_step(k, sent, link.state(k))
        time.sleep(link.poll_s)


def run_rounds(link, job, k, seed):
    """Worker k's rounds of model averaging under a replicated policy
    (:class:`sgd_shm.core.policies.RPS`, Yu et al., ICML 2019): a local SGD step on
    its replica with its own partition's next minibatch, its blocks sent to the
    servers, the round's barrier, the servers' averages taken where they arrive.
    The replica starts at the store's weights. With a budget (``epochs=``),
    ``job.budget`` is the number of rounds; then the worker idles until the run
    stops. Raises :class:`Diverged` when a gradient is not finite."""
    rng = np.random.default_rng(seed)
    spells = _Spells(job.transient, rng)
    losses = Losses(job.drop or 0.0, job.loss_seed, k, len(link.bounds) - 1)
    x = np.array(link.exchange(k)[0], dtype=job.dtype, copy=True)
    g = np.empty_like(x)
    state = link.state(k)
    sent = state.pushes(k)                           # rounds sent (a resumed run goes on)
    left = job.budget
    while not state.stopped:
        if sent % 64 == 0 and not state.alive:
            return
        if left is not None:
            if left == 0:
                _idle(link, k)
                return
            left -= 1
        p, key, j = _take(link, job, k, rng, state)
        t0 = time.perf_counter()
        grad = _gradient(job, p, j, x, g)
        counts = _stretch(job, k, spells, t0, t0)
        if not np.isfinite(grad).all():
            raise Diverged(f"worker {k}'s gradient is NaN or inf")
        x -= job.lr(sent) * grad                     # the local step, of round `sent`
        up, down = losses.draw()
        sent += 1
        answered = link.average_round(k, sent - 1, x, up, down,
                                      lambda: _wait_round(link, job, k, sent))
        if answered is None:
            link.report(k, counts, messages=losses.counts(up=up))
            return
        msgs = losses.counts(up=up) + losses.counts(down=down, answered=answered)
        link.report(k, counts, applied=(p, j), messages=msgs)
        state = link.state(k)
