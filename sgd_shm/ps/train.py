"""Training with a multi-process parameter server: BSP, ASP, SSP and SaPS.

Worker processes (``multiprocess``, fork) loop: wait if the policy says so, take
the next minibatch, ``pull`` the weights, compute the minibatch gradient with
the Hogwild loss kernels (``sgd_shm._kernels``: log, hinge, modified Huber or
squared loss, plus L2), sleep to emulate a slower machine, ``push``. The parent
process is the coordinator: every ``sample_every`` seconds it evaluates the
training loss (on up to 4096 rows), reads the workers' slots, detects
stragglers, writes checkpoints and decides when to stop.

Data. The rows are shuffled (seeded) and cut into one partition per worker,
each into minibatches of ``batch_size`` rows. Partition p's minibatches wait in
a :class:`relaxed.MultiQueue` of their own, keyed epoch * n_batches + a random
position, so they come out roughly an epoch at a time in a fresh order. A worker
takes minibatches from its own partition's queue; whoever finds a queue empty
refills it with the partition's next epoch (claimed by a compare-and-swap on the
partition's epoch counter, so each epoch is enqueued once). Every minibatch of
every epoch is therefore applied at most once, and exactly once unless the run
stops before it is reached; ``result.batches`` checks this. A worker that is
SIGKILLed loses the minibatch it was computing, and, if it dies between claiming
a refill and enqueueing it, what it had not yet enqueued of that epoch (those
are counted as ``lost``; training goes on with the next epoch).

Policies (``s`` = ``staleness``):

* ``asp``: fully asynchronous; every gradient is applied.
* ``bsp``: bulk synchronous: a worker starts its c-th step only when every live
  worker has pushed c times (SSP with s = 0).
* ``ssp``: stale synchronous parallel (Ho et al. 2013): a worker starts step c
  only when every live worker has pushed at least c - s times.
* ``saps``: straggler-aware (after the SaPS paper, 2019); never makes a fast
  worker wait. The rule, exactly:

  - Detection reads the version counters. A push's staleness is the global
    version at push minus the version its worker pulled. Every sample the
    coordinator takes each worker's mean staleness over its pushes (applied or
    dropped) of the last ``window`` seconds (from the slot's cumulative
    staleness, push and drop counters; a worker with no push in the window
    counts as infinitely stale). After a first full window, worker w is flagged while its mean exceeds
    ``detect_factor`` times the median of the other live workers' means and
    exceeds n_workers; it is unflagged when that stops. ``.detections`` lists
    the first time each worker was flagged, ``.events`` every flag and unflag.
  - Bound: a push with staleness tau above ``s`` is down-weighted by s / tau;
    from a flagged worker it is dropped instead, the worker re-pulls, and its
    minibatch goes back to its queue.
  - Stealing: when worker q is flagged (or dies), its partition's deficit is
    written off: lag_q = (smallest epoch counter of the other unflagged live
    partitions) - q's epoch counter, at that moment. A worker that is not
    flagged first takes minibatches from the queue of a flagged (or dead)
    worker q whose partition is not ahead of its own (q's epoch + lag_q <= its
    own), refilling that queue when it is empty and strictly behind; only then
    from its own. So a straggler's unstarted minibatches are processed by
    fast workers and its data keeps pace from the detection on. (Making up
    the deficit from before the detection would be a burst of one partition's
    gradients, which biases the model: measured here as a visible loss bump.)

Straggler emulation: ``slowdown`` (per-worker factors or a profile) stretches a
worker's compute time by sleeping (factor - 1) times it; ``transient`` adds
random slow spells. ``faults`` SIGKILLs workers at given times.

Checkpoints: with ``checkpoint=path`` the coordinator writes the weights, shard
and global versions, per-worker pushes, partition epochs and elapsed seconds
every ``checkpoint_every`` seconds and at the end, atomically (a temporary file
in the same folder, fsync, ``os.replace``): a reader sees the old checkpoint or
the new one, never a torn one. ``train(..., resume=path)`` continues from one.
"""
from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field

import multiprocess as mp
import numba as nb
import numpy as np
import scipy.sparse as sp

from relaxed import MultiQueue
from sgd_shm import _kernels as K
from sgd_shm._procs import shared_arrays
from sgd_shm.ps.store import LINE, ParameterStore, WaitPolicy, _cas_py, fetch_add_py

POLICIES = ("bsp", "asp", "ssp", "saps")
LOSSES = {"log_loss": K.LOG, "hinge": K.HINGE, "modified_huber": K.MODIFIED_HUBER,
          "squared_error": K.SQUARED}
PROFILES = ("none", "straggler", "hetero")
FLAGGED = 1
DEAD = 2
EXIT_DIVERGED = 3                # a worker's exit code when its gradient is NaN/inf
CHECKPOINT_FORMAT = 1


@dataclass
class TrainResult:
    """What :func:`train` returns.

    history: dicts (seconds, version, loss), one per sample; detections: (seconds,
    worker), the first time each worker was flagged; events: (seconds, worker,
    flagged) every flag change; workers: per-worker slot dicts (pushes, dropped,
    stolen, spells, staleness_sum, slowdown, ...); staleness_hist: per worker,
    push staleness counts in log2 bins (bin 0: 0; bin i: [2**(i-1), 2**i));
    batches: per-partition epochs and the exactly-once check of minibatches;
    killed: workers that died; checkpoints: (seconds, path) written;
    resumed_from: the checkpoint's seconds and version, when resumed.
    """
    policy: str
    history: list
    detections: list
    workers: list
    final_loss: float
    seconds: float
    time_to_target: float | None = None
    killed: list = field(default_factory=list)
    events: list = field(default_factory=list)
    staleness_hist: list = field(default_factory=list)
    batches: dict = field(default_factory=dict)
    checkpoints: list = field(default_factory=list)
    resumed_from: dict | None = None

    @property
    def updates(self) -> int:
        return self.history[-1]["version"] if self.history else 0

    def time_to(self, target) -> float | None:
        """Seconds of the first sample whose loss is <= target (None: not reached)."""
        return next((h["seconds"] for h in self.history if h["loss"] <= target), None)

    @property
    def mean_staleness(self) -> float:
        """Mean staleness of all pushes, applied or dropped."""
        pushes = sum(w["pushes"] + w["dropped"] for w in self.workers)
        return sum(w["staleness_sum"] for w in self.workers) / max(pushes, 1)


# ---- gradient and loss kernels (the Hogwild kernels' loss derivatives) ----------------
@nb.njit(cache=True, nogil=True, inline="always")
def _row_dot(indptr, indices, data, Xd, r, w):
    """x_r . w for a CSR row (indptr has entries) or a row of the dense Xd."""
    p = 0.0
    if indptr.size > 0:
        for jj in range(indptr[r], indptr[r + 1]):
            p += data[jj] * w[indices[jj]]
    else:
        for j in range(w.size):
            p += Xd[r, j] * w[j]
    return p


@nb.njit(cache=True, nogil=True)
def _batch_grad(loss, indptr, indices, data, Xd, ys, rows, w, alpha, g):
    """g = mean over rows of dloss(x.w, y) x + alpha w. CSR when indptr has
    entries, else the dense Xd."""
    for i in range(w.size):
        g[i] = alpha * w[i]
    inv = 1.0 / rows.size
    sparse = indptr.size > 0
    for r in rows:
        p = _row_dot(indptr, indices, data, Xd, r, w)
        d = min(max(K._dloss(loss, p, ys[r]), -K.MAX_DLOSS), K.MAX_DLOSS) * inv
        if sparse:
            for jj in range(indptr[r], indptr[r + 1]):
                g[indices[jj]] += d * data[jj]
        else:
            for j in range(w.size):
                g[j] += d * Xd[r, j]


@nb.njit(cache=True, nogil=True)
def _mean_loss(loss, indptr, indices, data, Xd, ys, w, alpha):
    n = ys.size
    tot = 0.0
    for r in range(n):
        tot += K._loss(loss, _row_dot(indptr, indices, data, Xd, r, w), ys[r])
    return tot / n + 0.5 * alpha * (w @ w)


def _parts(X):
    """(indptr, indices, data, Xd) for the kernels: CSR arrays or the dense matrix."""
    if sp.issparse(X):
        e = np.empty((0, 0))
        return (X.indptr.astype(np.int64), X.indices.astype(np.int64),
                X.data.astype(np.float64), e)
    z = np.empty(0, np.int64)
    return z, z, np.empty(0), X


# ---- minibatch queues -------------------------------------------------------------------
class _Work:
    """Partitions, their minibatch queues and the shared counters behind them.

    Shared (one segment, inherited by fork): the stop flag; per-partition epoch
    counters and lags (written off deficits, set by the coordinator), each in its
    own line; per worker, how many times it applied each minibatch
    (written by that worker only)."""

    def __init__(self, n_rows, n_workers, batch_size, rng):
        perm = rng.permutation(n_rows)
        self.rows = perm
        bounds = np.linspace(0, n_rows, n_workers + 1).astype(np.int64)
        self.part_lo, self.part_hi = bounds[:-1], bounds[1:]
        self.bs = batch_size
        self.nb = np.maximum(1, -(-(self.part_hi - self.part_lo) // batch_size))
        self.boff = np.concatenate([[0], np.cumsum(self.nb)])
        self.n_workers = n_workers
        total = int(self.boff[-1])
        # the run's stop flag is a word, not a multiprocessing Event, whose internal
        # lock a worker SIGKILLed inside is_set() would leave held (measured: a deadlock)
        self._seg, v = shared_arrays({"stop": ((1,), np.int64),
                                      "epochs": ((LINE * n_workers,), np.int64),
                                      "lag": ((LINE * n_workers,), np.int64),
                                      "taken": ((n_workers, total), np.int64)})
        self.stop, self.epochs, self.lag, self.taken = (v["stop"], v["epochs"], v["lag"],
                                                        v["taken"])
        self.queues = []
        try:
            for p in range(n_workers):
                # at most one epoch per concurrent refiller can be in a queue (see refill)
                self.queues.append(MultiQueue(n_workers * int(self.nb[p]), n_queues=2,
                                              shared=True, seed=int(rng.integers(2**31))))
        except BaseException:
            self.close()
            raise
        self.epoch0 = np.zeros(n_workers, np.int64)

    def write_off(self, q, slots):
        """Coordinator: q was flagged or died; set lag_q (see the module notes)."""
        others = [int(self.epochs[p * LINE]) for p in range(self.n_workers)
                  if p != q and int(slots[p, 4]) == 0]
        if others:
            self.lag[q * LINE] = max(0, min(others) - int(self.epochs[q * LINE]))

    def restore_epochs(self, epochs):
        self.epochs[::LINE] = epochs
        self.epoch0 = np.asarray(epochs, np.int64).copy()

    def batch_rows(self, p, j):
        lo = int(self.part_lo[p]) + j * self.bs
        return self.rows[lo:min(lo + self.bs, int(self.part_hi[p]))]

    def pop(self, p, rng, may_refill):
        """A (key, batch) from partition p's queue; when it is empty and
        ``may_refill(epoch)`` allows, claim and enqueue the partition's next
        epoch. The epoch is read before the pop, so a claim (CAS e -> e + 1)
        only succeeds if no one refilled since: at most one epoch per
        concurrent refiller is ever in the queue."""
        ep = self.epochs[p * LINE:p * LINE + 1]
        while True:
            e = int(ep[0])
            it = self.queues[p].try_pop()
            if it is not None or not may_refill(e):
                return it
            if _cas_py(ep, e, e + 1):
                n = int(self.nb[p])
                self.queues[p].push_many((e + 1) * n + rng.permutation(n), np.arange(n))

    def check(self):
        """The exactly-once check at quiescence: every minibatch was applied once
        per epoch enqueued, less those still queued. Returns per-partition
        epochs, applied minibatches, stolen ones, and ``lost``: (partition,
        batch) applications missing (0 unless a worker was killed: see the
        module notes).
        Raises AssertionError if any minibatch was applied too often."""
        applied = self.taken.sum(axis=0)
        lost = 0
        queued = []
        for p in range(self.n_workers):
            keys, vals = self.queues[p].pop_many(self.queues[p].capacity)
            queued.append(len(vals))
            left = np.bincount(vals, minlength=int(self.nb[p]))
            e = int(self.epochs[p * LINE]) - int(self.epoch0[p])
            got = applied[self.boff[p]:self.boff[p + 1]] + left
            if (got > e).any():
                j = int(np.flatnonzero(got > e)[0])
                raise AssertionError(f"partition {p} batch {j} applied or queued {got[j]} "
                                     f"times in {e} epochs")
            lost += int((e - got).sum())
        part_of = np.repeat(np.arange(self.n_workers), self.nb)
        stolen = [int(self.taken[w][part_of != w].sum()) for w in range(self.n_workers)]
        return {"epochs": [int(x) for x in self.epochs[::LINE]],
                "applied": [int(applied[self.boff[p]:self.boff[p + 1]].sum())
                            for p in range(self.n_workers)],
                "stolen_by_worker": stolen, "queued_at_end": queued, "lost": lost}

    def close(self):
        for q in self.queues:
            q.close()
        self.queues = []
        for a in ("stop", "epochs", "lag", "taken"):
            self.__dict__.pop(a, None)
        if getattr(self, "_seg", None) is not None:
            self._seg.close()
            self._seg = None


# ---- the worker -------------------------------------------------------------------------
@dataclass
class _Job:
    X: tuple
    ys: np.ndarray
    work: _Work
    n_workers: int
    policy: str
    s: int
    lr: float
    alpha: float
    loss: int
    factors: np.ndarray
    transient: tuple | None
    fixed_grad: np.ndarray | None
    wait: WaitPolicy
    parent: int                   # the coordinator's pid: a worker exits if it dies


def _worker(store, job, k, seed):
    rng = np.random.default_rng(seed)
    n, work, slots = job.n_workers, job.work, store._slots
    indptr, indices, data, Xd = job.X
    g = np.empty(store.n_params)
    my_pushes = int(slots[k, 1])
    steal = job.policy == "saps"
    spell_until, next_spell = -1.0, math.inf
    if job.transient is not None:
        next_spell = time.perf_counter() + rng.exponential(1.0 / job.transient[0])
    own_ep = work.epochs[k * LINE:k * LINE + 1]
    stop = work.stop                      # a plain shared word: no lock a SIGKILL can strand
    step = 0
    while not stop[0]:
        step += 1
        if step % 64 == 0 and os.getppid() != job.parent:
            return                                   # the coordinator died: do not linger
        if job.policy in ("bsp", "ssp"):
            need = my_pushes - (0 if job.policy == "bsp" else job.s)
            while not stop[0] and min(
                    (int(slots[j, 1]) for j in range(n) if int(slots[j, 4]) != DEAD),
                    default=need) < need:
                if os.getppid() != job.parent:
                    return
                time.sleep(0.0002)
            if stop[0]:
                break
        it = None
        if steal and int(slots[k, 4]) != FLAGGED:
            for q in range(n):
                lag = int(work.lag[q * LINE])
                if q != k and int(slots[q, 4]) in (FLAGGED, DEAD) \
                        and int(work.epochs[q * LINE]) + lag <= int(own_ep[0]):
                    it = work.pop(q, rng, lambda e: e + lag < int(own_ep[0]))
                    if it is not None:
                        p = q
                        break
        if it is None:
            p, it = k, work.pop(k, rng, lambda e: True)
        key, j = it
        w, v = store.pull(worker=k)
        t0 = time.perf_counter()
        if job.fixed_grad is not None:
            g = job.fixed_grad
        else:
            _batch_grad(job.loss, indptr, indices, data, Xd, job.ys, work.batch_rows(p, j),
                        w, job.alpha, g)
        now = time.perf_counter()
        factor = job.factors[k]
        if now >= next_spell:                    # a transient slow spell begins
            rate, f_spell, length = job.transient
            spell_until = now + length
            next_spell = spell_until + rng.exponential(1.0 / rate)
            slots[k, 9] += 1
        if now < spell_until:
            factor *= job.transient[1]
        if factor > 1:
            time.sleep((factor - 1.0) * (now - t0))
        store.record(k, compute_ns=int(1e9 * (time.perf_counter() - t0)))
        scale = 1.0
        if job.policy == "saps":
            tau = store.version - v
            if tau > job.s:
                if int(slots[k, 4]) == FLAGGED:      # dropped: re-queue, re-pull
                    fetch_add_py(slots[k], 5, tau)   # detection sees its staleness too
                    fetch_add_py(slots[k], 7, 1)
                    work.queues[p].push(key, j)
                    continue
                scale = job.s / tau
        if not np.isfinite(g).all():
            os._exit(EXIT_DIVERGED)                 # the coordinator reports it
        res = store.push(g, v, lr=job.lr, worker=k, scale=scale, wait=job.wait)
        while res.deferred:                          # finish it even when stopping
            store.push_deferred(res, wait=job.wait)
        work.taken[k, work.boff[p] + j] += 1
        if p != k:
            slots[k, 8] += 1
        my_pushes += 1


# ---- checkpoints ------------------------------------------------------------------------
def save_checkpoint(path, *, weights, shard_versions, version, pushes, epochs, seconds,
                    meta):
    """Write a checkpoint atomically: a temporary file beside ``path`` is
    written and fsync'ed, then renamed over ``path`` (``os.replace``)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, weights=weights, shard_versions=shard_versions,
                     version=np.int64(version), pushes=np.asarray(pushes, np.int64),
                     epochs=np.asarray(epochs, np.int64), seconds=np.float64(seconds),
                     meta=np.array(json.dumps({"format": CHECKPOINT_FORMAT, **meta})))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:                                          # make the rename itself durable
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
    return path


def load_checkpoint(path) -> dict:
    """Read a checkpoint written by :func:`train`: a dict with weights,
    shard_versions, version, pushes, epochs, seconds and meta."""
    try:
        with np.load(os.fspath(path), allow_pickle=False) as z:
            d = {k: z[k] for k in z.files}
        meta = json.loads(str(d.pop("meta")))
    except FileNotFoundError:
        raise ValueError(f"resume: no checkpoint at {os.fspath(path)!r}") from None
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"resume: {os.fspath(path)!r} is not a readable checkpoint "
                         f"({e})") from None
    need = {"weights", "shard_versions", "version", "pushes", "epochs", "seconds"}
    if not need <= d.keys() or meta.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"resume: {os.fspath(path)!r} is not a checkpoint of format "
                         f"{CHECKPOINT_FORMAT} (has {sorted(d)})")
    d["version"], d["seconds"] = int(d["version"]), float(d["seconds"])
    d["meta"] = meta
    return d


# ---- input checks -----------------------------------------------------------------------
def _labels(y):
    y = np.asarray(y)
    classes = np.unique(y)
    if classes.size != 2:
        raise ValueError(f"y: expected two classes, got {classes.size} ({classes[:5].tolist()})")
    return np.where(y == classes[1], 1.0, -1.0)


def _factors(slowdown, n_workers):
    factors = np.ones(n_workers)
    if isinstance(slowdown, str):
        if slowdown not in PROFILES:
            raise ValueError(f"slowdown: profile must be one of {PROFILES}, got {slowdown!r}")
        if slowdown == "straggler":
            factors[0] = 4.0
        elif slowdown == "hetero" and n_workers > 1:
            factors = 4.0 ** (1.0 - np.arange(n_workers) / (n_workers - 1))
    elif isinstance(slowdown, dict):
        for k, f in slowdown.items():
            if not isinstance(k, (int, np.integer)) or not 0 <= k < n_workers:
                raise ValueError(f"slowdown: worker {k!r} is not in [0, {n_workers})")
            factors[k] = f
    elif slowdown is not None:
        factors = np.asarray(slowdown, dtype=float)
        if factors.shape != (n_workers,):
            raise ValueError(f"slowdown: expected {n_workers} factors, got shape "
                             f"{factors.shape}")
    if (factors < 1).any() or not np.isfinite(factors).all():
        raise ValueError("slowdown: factors must be finite and >= 1 (1 = full speed)")
    return factors


def _transient(transient):
    if transient is None:
        return None
    try:
        rate, factor, length = (float(x) for x in transient)
    except (TypeError, ValueError):
        raise ValueError("transient: expected (spells per second, factor, seconds), got "
                         f"{transient!r}") from None
    if not (rate > 0 and factor >= 1 and length > 0) or not all(
            map(np.isfinite, (rate, factor, length))):
        raise ValueError("transient: need spells per second > 0, factor >= 1 and seconds > 0, "
                         f"got {transient!r}")
    return rate, factor, length


def train(X, y, *, n_workers=4, policy="saps", slowdown=None, max_seconds=5.0,
          target_loss=None, loss="log_loss", lr=0.5, alpha=1e-4, batch_size=64,
          staleness=None, n_shards=8, sample_every=0.02, window=0.5, detect_factor=2.0,
          transient=None, faults=None, checkpoint=None, checkpoint_every=5.0, resume=None,
          wait=None, seed=None, progress=None, _fixed_gradient=None) -> TrainResult:
    """Train a linear model (L2-regularised ``loss``) with ``n_workers``
    processes on a shared ParameterStore under ``policy``; the module notes give
    every rule.

    Parameters
    ----------
    X, y : CSR/dense matrix and binary labels.
    policy : "bsp", "asp", "ssp" or "saps".
    slowdown : stretch of each worker's compute time: a sequence of n_workers
        factors >= 1, a dict {worker: factor}, or a profile: "straggler" (worker
        0 is 4x slower), "hetero" (worker k at 4 ** (1 - k / (n_workers - 1))),
        "none".
    transient : (spells per second, factor, seconds): each worker also enters
        random slow spells (a Poisson process) during which its compute time is
        stretched by ``factor``; spells are counted in the slots.
    max_seconds, target_loss : stop after this long (this call), or once the
        training loss (on up to 4096 rows) is <= target_loss.
    loss : "log_loss", "hinge", "modified_huber" or "squared_error".
    staleness : s for ssp and the bound for saps (default n_workers).
    window, detect_factor : SaPS detection (see the module notes); the window
        should span several steps of the slowest worker.
    faults : {worker: seconds}: SIGKILL that worker that long into the run. It
        is reported in ``.killed``; BSP/SSP stop waiting for it; a shard lock it
        held is taken over; under saps its queued minibatches are stolen.
    checkpoint, checkpoint_every : write a checkpoint there every so many
        seconds and at the end (atomically). resume : continue from one (same
        number of features): weights, versions, pushes and epochs are restored
        and the clock goes on from its seconds.
    wait : the :class:`WaitPolicy` of pushes on a held shard lock (spin, yield,
        defer; or a ski-rental conflict policy: ``WaitPolicy(conflict="randomized")``).
    progress : a progress bar on stderr (default: when stderr is a terminal).
    _fixed_gradient : tests: every worker pushes this vector instead of a
        gradient (the closed-form check).
    """
    if policy not in POLICIES:
        raise ValueError(f"policy: must be one of {POLICIES}, got {policy!r}")
    if loss not in LOSSES:
        raise ValueError(f"loss: must be one of {tuple(LOSSES)}, got {loss!r}")
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise ValueError(f"n_workers: must be an int >= 1, got {n_workers!r}")
    for name, v in (("batch_size", batch_size), ("n_shards", n_shards)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name}: must be an int >= 1, got {v!r}")
    X = sp.csr_matrix(X, dtype=np.float64) if sp.issparse(X) else \
        np.ascontiguousarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X: expected a 2-D matrix, got {X.ndim} dimensions")
    Xdata = X.data if sp.issparse(X) else X
    if not np.isfinite(Xdata).all():
        raise ValueError("X: contains NaN or inf; clean or impute the data first")
    ys = _labels(y)
    if X.shape[0] != ys.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {ys.shape[0]}")
    if X.shape[0] < n_workers:
        raise ValueError(f"n_workers: X has only {X.shape[0]} rows, fewer than the {n_workers} "
                         "workers (each needs a partition); use fewer workers")
    if checkpoint is not None:
        folder = os.path.dirname(os.path.abspath(os.fspath(checkpoint)))
        if not os.path.isdir(folder):
            raise ValueError(f"checkpoint: folder {folder!r} does not exist; create it first")
    factors = _factors(slowdown, n_workers)
    spells = _transient(transient)
    for name, v in (("max_seconds", max_seconds), ("lr", lr), ("sample_every", sample_every),
                    ("window", window), ("detect_factor", detect_factor),
                    ("checkpoint_every", checkpoint_every)):
        if isinstance(v, bool) or not (isinstance(v, (int, float)) and np.isfinite(v)
                                       and v > 0):
            raise ValueError(f"{name}: must be a finite number > 0, got {v!r}")
    if not (isinstance(alpha, (int, float)) and np.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha: must be a finite number >= 0, got {alpha!r}")
    faults = dict(faults or {})
    for k, t in faults.items():
        if not isinstance(k, (int, np.integer)) or not 0 <= k < n_workers or not t >= 0:
            raise ValueError(f"faults: expected {{worker in [0, {n_workers}): seconds >= 0}}, "
                             f"got {{{k!r}: {t!r}}}")
    if wait is None:
        wait = WaitPolicy()
    elif not isinstance(wait, WaitPolicy):
        raise TypeError(f"wait: expected a sgd_shm.ps.WaitPolicy, got {type(wait).__name__}")
    s = n_workers if staleness is None else int(staleness)
    if s < 0:
        raise ValueError(f"staleness: must be >= 0, got {staleness}")
    d = X.shape[1]
    fixed = None
    if _fixed_gradient is not None:
        fixed = np.ascontiguousarray(_fixed_gradient, dtype=np.float64)
        if fixed.shape != (d,):
            raise ValueError(f"_fixed_gradient: expected shape ({d},), got {fixed.shape}")
    ckpt = load_checkpoint(resume) if resume is not None else None
    if ckpt is not None and ckpt["weights"].shape != (d,):
        raise ValueError(f"resume: the checkpoint has {ckpt['weights'].shape[0]} weights but X "
                         f"has {d} features; resume with the data it was trained on")
    rng = np.random.default_rng(seed)
    eval_rows = np.sort(rng.choice(X.shape[0], min(4096, X.shape[0]), replace=False))
    Xe = _parts(X[eval_rows])
    ye = ys[eval_rows]
    lcode = LOSSES[loss]

    def evaluate(w):
        return float(_mean_loss(lcode, *Xe, ye, w, float(alpha)))

    shards = min(n_shards, d) if ckpt is None else len(ckpt["shard_versions"])
    work = store = None
    procs = []
    history, detections, events, killed, written = [], [], [], [], []
    samples = [[] for _ in range(n_workers)]       # (t, staleness sum, pushes)
    flagged = set()
    t_target = None
    t_off = ckpt["seconds"] if ckpt is not None else 0.0
    bar = None
    if progress is None:
        progress = sys.stderr.isatty()
    meta = {"policy": policy, "n_workers": n_workers, "n_samples": int(X.shape[0]),
            "n_features": int(d), "loss": loss}
    try:
        store = ParameterStore(d, n_shards=shards, n_workers=n_workers)
        work = _Work(X.shape[0], n_workers, int(batch_size), rng)
        if ckpt is not None:
            store.restore(ckpt["weights"], ckpt["shard_versions"], ckpt["version"])
            if len(ckpt["pushes"]) == n_workers:
                store._slots[:, 1] = ckpt["pushes"]
                work.restore_epochs(ckpt["epochs"])
        job = _Job(_parts(X), ys, work, n_workers, policy, s, float(lr), float(alpha), lcode,
                   factors, spells, fixed, wait, os.getpid())
        # compile the kernels once, before the fork and the clock
        evaluate(store.weights.copy())
        _batch_grad(lcode, *job.X, ys, work.batch_rows(0, 0), store.weights.copy(),
                    float(alpha), np.empty(d))

        def write_checkpoint(now):
            w, vers, v = store.snapshot()
            save_checkpoint(checkpoint, weights=w, shard_versions=vers, version=v,
                            pushes=store._slots[:, 1].copy(), epochs=work.epochs[::LINE].copy(),
                            seconds=t_off + now, meta={**meta, "loss_value": evaluate(w)})
            written.append((t_off + now, os.fspath(checkpoint)))

        ctx = mp.get_context("fork")
        seeds = rng.integers(0, 2**63 - 1, n_workers)
        procs = [ctx.Process(target=_worker, name=f"ps-worker-{k}",
                             args=(store, job, k, int(seeds[k])), daemon=True)
                 for k in range(n_workers)]
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=round(float(max_seconds), 1), desc=policy, unit="s",
                       bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s "
                                  "{postfix}", leave=False)
        try:
            for p in procs:
                p.start()
            t0 = time.perf_counter()
            last_ckpt = 0.0
            while True:
                time.sleep(sample_every)
                now = time.perf_counter() - t0
                w, v = store.pull()
                cur = evaluate(w)
                history.append({"seconds": t_off + now, "version": v, "loss": cur})
                if not np.isfinite(cur):
                    raise FloatingPointError(
                        f"training diverged: the loss is {cur} after {v} updates; lower lr "
                        f"(now {lr}) or raise alpha")
                if bar is not None:
                    bar.n = round(min(now, float(max_seconds)), 1)
                    bar.set_postfix_str(f"updates {v:,}  loss {cur:.4f}"
                                        + (f"  flagged {sorted(flagged)}" if flagged else ""))
                for k, t_kill in list(faults.items()):
                    if now >= t_kill and procs[k].is_alive():
                        os.kill(procs[k].pid, signal.SIGKILL)
                        del faults[k]
                for k, p in enumerate(procs):
                    if p.exitcode is not None and k not in killed:
                        if p.exitcode == EXIT_DIVERGED:
                            raise FloatingPointError(
                                f"training diverged: worker {k}'s gradient is NaN or inf "
                                f"after {store.version} updates; lower lr (now {lr}) or raise "
                                "alpha")
                        if p.exitcode != -signal.SIGKILL:
                            raise RuntimeError(f"parameter-server worker {k} failed (exit code "
                                               f"{p.exitcode}); its traceback is above")
                        killed.append(k)
                        store._slots[k, 4] = DEAD
                        flagged.discard(k)
                        work.write_off(k, store._slots)
                if policy == "saps":
                    _detect(store, work, samples, now, window, detect_factor, n_workers,
                            flagged, detections, events, killed, t_off)
                if checkpoint is not None and now - last_ckpt >= checkpoint_every:
                    write_checkpoint(now)
                    last_ckpt = now
                if target_loss is not None and cur <= target_loss and t_target is None:
                    t_target = t_off + now
                    break
                if now >= max_seconds or len(killed) == n_workers:
                    break
        finally:
            work.stop[0] = 1
            for p in procs:
                if p.pid is None:
                    continue
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join()
            if bar is not None:
                bar.close()
        now = time.perf_counter() - t0
        if checkpoint is not None:
            write_checkpoint(now)
        w, v = store.pull()
        workers = []
        for k in range(n_workers):
            sl = store.slot(k)
            sl["slowdown"] = float(factors[k])
            workers.append(sl)
        hist = [store.staleness_histogram(k).tolist() for k in range(n_workers)]
        final = evaluate(w)
        history.append({"seconds": t_off + now, "version": v, "loss": final})
        batches = work.check()
        store.release_dead_locks()                   # a worker killed inside a push
        store._check()
    finally:
        if store is not None:
            store.close()
        if work is not None:
            work.close()
    resumed = None if ckpt is None else {"seconds": ckpt["seconds"], "version": ckpt["version"],
                                        "path": os.fspath(resume)}
    return TrainResult(policy, history, detections, workers, final, history[-1]["seconds"],
                       t_target, killed, events, hist, batches, written, resumed)


def _detect(store, work, samples, now, window, factor, n_workers, flagged, detections, events,
            killed, t_off):
    """SaPS detection from version counters (see the module notes)."""
    for k in range(n_workers):
        samples[k].append((now, int(store._slots[k, 5]),
                           int(store._slots[k, 1]) + int(store._slots[k, 7])))
        while len(samples[k]) > 1 and samples[k][0][0] < now - window:
            samples[k].pop(0)
    if now < window:                       # a full window before any verdict
        return
    level = []
    for k in range(n_workers):
        (_, s0, p0), (_, s1, p1) = samples[k][0], samples[k][-1]
        # mean staleness of the pushes of the last window (a worker that pushed
        # nothing in it samples by at least what it would have seen)
        level.append((s1 - s0) / (p1 - p0) if p1 > p0 else float("inf"))
    for k in range(n_workers):
        if k in killed:
            continue
        others = [level[j] for j in range(n_workers) if j != k and j not in killed]
        if not others:
            continue
        slow = level[k] > factor * max(float(np.median(others)), 1.0) and level[k] > n_workers
        if slow and k not in flagged:
            flagged.add(k)
            work.write_off(k, store._slots)
            store._slots[k, 4] = FLAGGED
            events.append((t_off + now, k, True))
            if all(w != k for _, w in detections):
                detections.append((t_off + now, k))
        elif not slow and k in flagged:
            flagged.discard(k)
            store._slots[k, 4] = 0
            events.append((t_off + now, k, False))


# ---- plots ------------------------------------------------------------------------------
def _flag_intervals(events, end):
    """{worker: [(start, length), ...]} flagged intervals from flag events."""
    out, since = {}, {}
    for t, k, on in events:
        if on:
            since[k] = t
        elif k in since:
            out.setdefault(k, []).append((since[k], t - since.pop(k)))
    for k, t in since.items():
        out.setdefault(k, []).append((t, end - t))
    return out


def plot_losses(curves, target, path, title="", n_workers=None):
    """Four panels: training loss against seconds (SaPS detections dotted) and
    against updates, one line per policy; the staleness histogram of each
    policy's pushes; SaPS's detection timeline (which worker was flagged when).

    ``curves``: {policy: {"seconds": [...], "loss": [...], "updates": [...]
    (optional), "detections": [(seconds, worker)], "events": [(seconds, worker,
    flagged)] (optional), "staleness_hist": [counts per log2 bin] (optional)}}.
    Writes a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    (a_t, a_u), (a_h, a_d) = axes
    colors = {}
    for pol, c in curves.items():
        line, = a_t.plot(c["seconds"], c["loss"], label=pol)
        colors[pol] = line.get_color()
        for t, _ in c["detections"]:
            a_t.axvline(t, color=line.get_color(), ls=":", lw=1)
        if c.get("updates"):
            a_u.plot(c["updates"], c["loss"], label=pol, color=colors[pol])
        h = np.asarray(c.get("staleness_hist") or [], dtype=float)
        if h.sum() > 0:
            last = int(np.flatnonzero(h)[-1]) + 1
            a_h.step(np.arange(last), h[:last] / h.sum(), where="mid", label=pol,
                     color=colors[pol])
    for ax, xl in ((a_t, "seconds"), (a_u, "updates applied")):
        ax.axhline(target, color="grey", ls="--", lw=1, label="target")
        ax.set_xlabel(xl)
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    a_h.set_xlabel("push staleness τ, log2 bins (0: τ=0; i: 2^(i-1) ≤ τ < 2^i)")
    a_h.set_ylabel("fraction of pushes")
    a_h.grid(alpha=0.3)
    a_h.legend(fontsize=8)
    sa = curves.get("saps")
    a_d.set_title("SaPS: workers flagged as stragglers", fontsize=9)
    a_d.set_xlabel("seconds")
    a_d.set_ylabel("worker")
    if sa is not None:
        end = sa["seconds"][-1] if sa["seconds"] else 0.0
        ev = sa.get("events") or [(t, k, True) for t, k in sa["detections"]]
        spans = _flag_intervals(ev, end)
        nw = n_workers or (max(spans) + 1 if spans else 1)
        for k, iv in spans.items():
            a_d.broken_barh(iv, (k - 0.35, 0.7), color=colors.get("saps"))
        a_d.set_ylim(-0.6, nw - 0.4)
        a_d.set_yticks(range(nw))
        a_d.set_xlim(0, max(end, 1e-9))
    a_d.grid(alpha=0.3, axis="x")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def curves_of(results):
    """The ``plot_losses`` input for {policy: TrainResult}."""
    return {pol: {"seconds": [h["seconds"] for h in r.history],
                  "loss": [h["loss"] for h in r.history],
                  "updates": [h["version"] for h in r.history],
                  "detections": r.detections, "events": r.events,
                  "staleness_hist": np.sum(r.staleness_hist, axis=0).tolist()}
            for pol, r in results.items()}
