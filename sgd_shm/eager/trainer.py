"""``train``: data-parallel SGD of a model (by default the linear
:class:`sgd_shm.models.Linear`) over an allreduce, a solo allreduce or a
majority allreduce (eager-SGD), on shared memory or MPI.

Every rank holds a replica of the weights and its own share of the rows. A step of
rank k is: take a minibatch of its rows, compute the model's gradient (``model.grad``),
combine it with the other ranks' through the round's collective (``op="mean"``),
and apply ``w -= lr(r) * mean`` at round r (``lr``: a number or a step-size schedule
of :mod:`sgd_shm.core.schedules`, the same for every rank). Every rank applies every
round's result in the same order, so the replicas stay identical (checked at the end).
A rank that is behind (the round it would start has already closed) skips the
gradient: it would be late anyway, so it only applies the results it missed.

Stopping is agreed through the data: every contribution carries one extra element,
a vote to stop (time is up, or rank 0 saw the target loss), and every rank stops
after the first round whose result carries a vote; ``epochs`` fixes the number of
rounds in advance.

Load imbalance as in eager-SGD: each round, a draw from a seed that all ranks share
picks ``k`` ranks that sleep ``seconds`` before computing (``imbalance=(k,
seconds)``); ``delay`` adds a random per-step delay of each rank's own (exponential,
or heavy-tailed Pareto).
"""
from __future__ import annotations

import math
import numbers
import sys
import time
from dataclasses import dataclass, field, replace

import numpy as np

from sgd_shm.collectives.base import AVERAGE, KINDS, LATE, check_timeout
from sgd_shm.compress import add_packed, pack, packed_size
from sgd_shm.core.batches import eager_rounds
from sgd_shm.core.errors import DivergenceError
from sgd_shm.core.imbalance import delay_of, draw_delay, imbalance_of, sleepers
from sgd_shm.core.model import Model, blas_limited, initial_weights
from sgd_shm.core.progress import seconds_bar
from sgd_shm.core.results import Evaluator, Result
from sgd_shm.core.schedules import Schedule, for_run, make_schedule
from sgd_shm.core.traces import ROUND_FLOATS, ROUND_INTS, EagerTrace
from sgd_shm.models.linear import model_or_linear
from sgd_shm.core.validation import (_is_int, check_bool, check_callbacks, check_choice,
                                     check_int, check_eval_set, check_momentum, check_number,
                                     check_positive, model_data, model_dtype, n_columns,
                                     resolve_workers, stopping_rule)

__all__ = ["train", "EagerResult", "EagerTrace", "sleepers", "BACKENDS"]

BACKENDS = ("shm", "mpi")
#: rows the training loss is evaluated on during the run (a fixed sample)
EVAL_ROWS = 4096
#: with ``sample_every=None``: rank 0's period between records, stretched where a record
#: costs more (a network's forward passes) so that records take at most this share of
#: its time (the other ranks wait on rank 0 in every collective)
SAMPLE_EVERY, SAMPLE_SHARE = 0.05, 0.1


@dataclass(repr=False)
class EagerResult(Result):
    """What :func:`train` returns: the trained model and the run's record (the fields
    every trainer's result has are described in :mod:`sgd_shm.core.results`).

    Model: ``model``, ``coef_`` (its flat weights), ``classes_``,
    ``decision_function``, ``predict``, ``score``, ``predict_proba`` where the model
    has probabilities. Record: ``history`` (dicts with seconds, step, loss; rank 0's
    samples, a step is a round), ``final_loss``, ``val_loss`` / ``val_score`` (on
    ``eval_set``), ``time_to_target`` (seconds, None if not reached),
    ``rounds``, ``seconds`` (the longest rank's: a rank that stops on its own clock
    ends the run for all), ``participation`` (per rank, the fraction of rounds its
    gradient was in), ``late`` (per rank, rounds it arrived late for), ``skipped``
    (per rank, rounds it skipped because it was behind), ``mean_contributors`` (per
    round), ``replicas_equal`` (every rank ended with the same weights). Bytes, summed
    over the ranks: ``bytes_sent`` (the gradients, or compressed messages, that made
    their round), ``bytes_dense`` (the weights' bytes per gradient computed, 8 per
    weight in float64 and 4 in float32: what dense gradients would be),
    ``bytes_moved`` (the buffers the collectives combined, per rank and round; with
    compression, the payloads each rank put into the gathers). ``coef_`` and every
    buffer of the run (replicas, gradients, the collectives' buffers, messages,
    error-feedback memory) are of the model's ``dtype``.
    ``trace`` (``train(trace=True)``): an :class:`EagerTrace` of every rank's rounds
    (for ``sgd_shm.sim.simulate(..., replay=result.trace)``), else None.
    """
    collective: str
    history: list
    final_loss: float
    seconds: float
    rounds: int
    time_to_target: float | None = None
    participation: list = field(default_factory=list)
    late: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    mean_contributors: float = 0.0
    replicas_equal: bool = True
    coef_: np.ndarray | None = field(default=None, repr=False)
    classes_: np.ndarray | None = None
    backend: str = "shm"
    n_workers: int = 1
    late_policy: str = "carry"
    average: str = "size"
    compress: str | None = None
    bytes_sent: int = 0
    bytes_dense: int = 0
    bytes_moved: int = 0
    model: object = None
    momentum: float = 0.0
    val_loss: float | None = None
    val_score: float | None = None
    trace: object = None

    _repr_fields = ("collective", "final_loss", "val_score", "rounds", "seconds")


@dataclass(frozen=True)
class _Config:
    n_workers: int
    collective: str
    late: str
    average: str
    imbalance: tuple | None
    delay: tuple | None
    max_seconds: float
    target_loss: float | None
    max_rounds: int | None
    lr: Schedule                # the step at round r: lr(r)
    batch_size: int
    sample_every: float | None
    depth: int
    timeout: float | None
    seed: int
    backend: str
    progress: bool
    compress: object = None
    momentum: float = 0.0
    model: Model = None         # the model trained (sgd_shm.models.Linear by default)
    callbacks: tuple = ()       # called with each of rank 0's history records; True stops
    trace: bool = False         # record every rank's rounds (EagerTrace)


def train(X, y, *, n_workers=4, collective="sync", late="carry", average="size",
          imbalance=None, delay=None, max_seconds=None, target_loss=None, epochs=None,
          loss=None, lr=2.0, alpha=None, batch_size=64, sample_every=None,
          depth=8, timeout=None, seed=0, backend="shm", comm=None,
          compress=None, progress=None, model=None, momentum=0.0, eval_set=None,
          callbacks=None, trace=False) -> EagerResult:
    """Train a model (by default the linear model of ``loss`` and ``alpha``) by
    data-parallel SGD whose gradients are combined by ``collective``.

    Parameters (all keyword; defaults in brackets)
    ----------------------------------------------
    X, y : CSR/dense matrix and labels (two classes for the linear model; every rank
        passes the same data; rank k trains on rows k, k + P, k + 2P, ...).
    n_workers [4] : ranks: forked processes (``backend="shm"``), -1: one per CPU;
        under MPI, the size of ``comm`` (n_workers must match it, or be None).
    collective ["sync"] : "sync" (allreduce), "solo" or "majority".
    late ["carry"], average ["size"] : what a late gradient does ("drop" as fflib2,
        or "carry" into the rank's next contribution that is in time: a rank that is
        late for a streak of rounds sends the streak's sum at once, which momentum
        amplifies; prefer "drop" for solo with momentum) and the divisor of the mean
        ("size": the number of ranks, as fflib2; "contributors").
    imbalance [None] : (k, seconds): each round, k ranks drawn from the shared seed
        sleep that long before their gradient (the eager-SGD paper's model).
    delay [None] : ("exponential", mean seconds) or ("pareto", mean seconds, shape
        > 1): a random delay of each rank's own before each gradient.
    max_seconds [None], target_loss [None], epochs [None] : stop after this long,
        once rank 0 sees the training loss (on up to 4096 rows) <= target_loss, or
        after this many passes over the data (rounds = epochs * rows / (P * batch)),
        whichever comes first. Epochs are the default rule: with neither epochs nor
        max_seconds, 5 epochs.
    loss [None: "log_loss"], lr [2.0], alpha [None: 1e-4], batch_size [64] : the
        default linear model's loss and L2 (a ``model`` brings its own: leave them
        out), the step (applied to the mean of the round's gradients, so it can be
        larger than the parameter server's 0.5, which applies to each worker's push;
        both suit the default linear model: pass a smaller one for a network):
        a number, or a schedule of round r (``Cosine(2.0)``: over the run's rounds,
        ``StepDecay``, any callable ``r -> step``: :mod:`sgd_shm.core.schedules`),
        rows per rank per step.
    sample_every [None] : seconds between rank 0's loss samples (rank 0 computes them
        between its rounds, so sampling costs it training time: a longer period than
        the parameter server's 0.02, whose coordinator samples beside the workers).
        None: 0.05, or longer where a record costs more than a tenth of that (a
        network's forward passes), so that records take at most a tenth of rank 0's
        time.
    depth [8] : rounds a rank may fall behind before the others wait for it.
    timeout [None] : seconds a collective may wait (None: no limit; a dead rank is
        still reported).
    seed [0] : an int >= 0 (every rank derives the same draws from it, so no fresh
        entropy); backend ["shm"] : "shm" or "mpi" (run under mpiexec; optional
        extra); comm [None] : the MPI communicator (default COMM_WORLD).
    compress [None] : a compressor (any :class:`sgd_shm.compress.Compressor`:
        ``TopK(ratio=0.001)``, RandomK, ThresholdTopK, QSGD, one of your own; or a
        spec such as "topk:0.001") applied to each rank's gradient, with its error
        feedback; the messages travel by the collective's allgather (their sizes may
        differ between ranks and rounds). ``late="carry"`` puts a message that missed
        its round back into the rank's memory.
    progress [stderr is a terminal] : a progress bar (rank 0), True or False.
    model [None] : a :class:`sgd_shm.models.Model` (e.g. ``MLP(n_features, (64,),
        n_classes)``) instead of the linear model: every replica starts at
        ``model.init(np.random.default_rng(seed))``, a rank's gradient is
        ``model.grad`` of its minibatch, y may hold any ``model.n_outputs`` classes.
        Every buffer of the run is of the model's ``dtype`` (float32 for a
        :class:`sgd_shm.torch.TorchModel`: the replicas, the gradients, the
        collectives' buffers and messages; anything but float32 or float64 is a
        TypeError naming ``model.dtype``).
    momentum [0.0] : heavy-ball momentum in [0, 1) on the combined gradient: every
        replica keeps v = momentum * v - lr(r) * mean and moves by v (0: w -= lr(r) *
        mean; the step inside the velocity, so a falling step damps it at once).
    eval_set [None] : (X_val, y_val): held-out data; every history record adds
        ``val_loss`` and ``val_score`` (accuracy) on up to 4096 of its rows, and the
        result's ``val_loss`` / ``val_score`` are the final model's on all of it.
    callbacks [None] : a callable, or a sequence of them, called on rank 0 with each
        history record (seconds, step, loss); one that returns True stops the run
        (every rank stops after the round that carries rank 0's vote).
    trace [False] : record every rank's rounds (whether it skipped, the brackets of its
        look at the lag and of its round, the round's contributors) in preallocated
        arrays: the result's ``trace``, an :class:`EagerTrace` that
        ``sgd_shm.sim.simulate(..., replay=result.trace)`` replays exactly. Shared
        memory only (MPI ranks may run on hosts whose clocks differ: a ValueError),
        at most 62 ranks.
    """
    model = model_or_linear(model, loss, alpha, n_columns(X))
    cfg, max_epochs = _config(n_workers, collective, late, average, imbalance, delay,
                              max_seconds, target_loss, epochs, lr, batch_size,
                              sample_every, depth, timeout, seed, backend, comm, progress,
                              compress)
    cfg = replace(cfg, momentum=check_momentum(momentum), model=_model(model),
                  callbacks=check_callbacks(callbacks),
                  trace=_trace(trace, cfg.backend, cfg.n_workers))
    d, dtype = cfg.model.n_params, model_dtype(cfg.model)
    k = 0 if cfg.compress is None else message_capacity(cfg.compress, d)
    _check_gather(cfg, d, k, dtype)
    X, ys, classes = model_data(X, y, cfg.model, cfg.n_workers)
    evals = check_eval_set(eval_set, cfg.model, classes)
    if max_epochs is not None:
        cfg = replace(cfg, max_rounds=eager_rounds(max_epochs, X.shape[0], cfg.n_workers,
                                                   cfg.batch_size))
    cfg = replace(cfg, lr=for_run(cfg.lr, 0, cfg.max_rounds))
    rng = np.random.default_rng(cfg.seed)
    eval_rows = np.sort(rng.choice(X.shape[0], min(EVAL_ROWS, X.shape[0]), replace=False))
    job = _Job(cfg, d, Evaluator(cfg.model, X, ys, eval_rows, evals), k,
               cfg.model.prepare(X, ys), dtype)
    _warm_up(job)
    if cfg.backend == "mpi":
        outs = _run_mpi(job, comm)
    else:
        outs = _run_shm(job)
    return _result(cfg, outs, job, classes)


# ---- argument checks -----------------------------------------------------------------
def _config(n_workers, collective, late, average, imbalance, delay, max_seconds,
            target_loss, epochs, lr, batch_size, sample_every, depth, timeout,
            seed, backend, comm, progress, compress):
    check_choice("backend", backend, BACKENDS)
    if comm is not None and backend != "mpi":
        raise ValueError("comm: an MPI communicator needs backend='mpi'")
    if backend == "mpi":
        n_workers = _mpi_size(n_workers, comm)
    else:
        n_workers = resolve_workers(n_workers)
    for name, v, opts in (("collective", collective, KINDS), ("late", late, LATE),
                          ("average", average, AVERAGE)):
        check_choice(name, v, opts)
    epochs, max_seconds = stopping_rule(epochs, max_seconds, check_positive)
    cfg = _Config(n_workers=n_workers, collective=collective, late=late, average=average,
                  imbalance=imbalance_of(imbalance, n_workers), delay=delay_of(delay),
                  max_seconds=max_seconds,
                  target_loss=None if target_loss is None else check_number("target_loss",
                                                                             target_loss),
                  max_rounds=None, lr=make_schedule(lr),
                  batch_size=check_int("batch_size", batch_size),
                  sample_every=(None if sample_every is None
                                else check_positive("sample_every", sample_every)),
                  depth=check_int("depth", depth), timeout=check_timeout("timeout", timeout),
                  seed=check_int("seed", seed, lo=0), backend=backend,
                  progress=sys.stderr.isatty() if progress is None else check_bool(
                      "progress", progress),
                  compress=_compressor(compress))
    return cfg, epochs


def _trace(trace, backend, n_workers):
    if not isinstance(trace, (bool, np.bool_)):
        raise TypeError(f"trace: expected True or False, got {trace!r}")
    if trace and backend != "shm":
        raise ValueError("trace: the brackets of the ranks' calls are comparable on one box; "
                         "MPI ranks may run on hosts whose clocks differ; use backend='shm'")
    if trace and n_workers > 62:
        raise ValueError(f"trace: records each round's contributors as a bit mask of at most "
                         f"62 ranks, got n_workers={n_workers}")
    return bool(trace)


class _RoundRecord:
    """One rank's traced rounds: preallocated arrays, doubled when full."""

    def __init__(self, capacity=4096):
        self.ints = np.zeros((capacity, len(ROUND_INTS)), np.int64)
        self.floats = np.zeros((capacity, len(ROUND_FLOATS)))
        self.n = 0

    def put(self, ints, floats):
        if self.n == self.ints.shape[0]:
            self.ints = np.concatenate([self.ints, np.zeros_like(self.ints)])
            self.floats = np.concatenate([self.floats, np.zeros_like(self.floats)])
        self.ints[self.n] = ints
        self.floats[self.n] = floats
        self.n += 1

    def columns(self, t0):
        out = {c: self.ints[:self.n, i].copy() for i, c in enumerate(ROUND_INTS)}
        out.update({c: self.floats[:self.n, i] - t0 for i, c in enumerate(ROUND_FLOATS)})
        return out


def _model(model):
    if not isinstance(model, Model):
        raise TypeError(f"model: expected a sgd_shm.models.Model (e.g. MLP(n_features, "
                        f"(64,), n_outputs)), got {type(model).__name__}; leave model=None "
                        "for the linear model")
    model_dtype(model)                        # float32 or float64: every buffer's type
    return model


#: elements a float32 payload of a shared-memory gather stays below (the row's count
#: travels as a float32 there, see :mod:`sgd_shm.collectives.shm`)
SHM_F32_GATHER = 2 ** 24


def _check_gather(cfg, d, k, dtype):
    """A float32 model's compressed messages on shared memory: the largest payload
    (the vote and a packed message of ``k`` entries) must stay below
    :data:`SHM_F32_GATHER` elements."""
    if cfg.compress is None or cfg.backend != "shm" or dtype != np.float32:
        return
    n = exchange_size(cfg, d, k, dtype)
    if n >= SHM_F32_GATHER:
        raise ValueError(f"compress: {cfg.compress!r} sends up to {k} entries on this float32 "
                         f"model's {d} weights, a payload of {n} float32 elements; the "
                         f"shared-memory gather takes float32 payloads below 2**24 elements; "
                         "use a sparser compressor (e.g. TopK(ratio=0.01)) or backend='mpi'")


def _compressor(compress):
    if compress is None:
        return None
    from sgd_shm.compress import make_compressor
    return make_compressor(compress)


def _mpi_size(n_workers, comm):
    try:
        import mpi4py  # noqa: F401  (its absence gets the install line below)
    except ImportError:
        raise ImportError("backend='mpi' needs mpi4py and an MPI library: pip install "
                          "'relaxed-sgd-kit[mpi]' (mpi4py + mpich), then run under mpiexec") \
            from None
    from sgd_shm.collectives.mpi import intracomm
    size = intracomm(comm).Get_size()
    if n_workers is not None and (not _is_int(n_workers) or n_workers != size):
        raise ValueError(f"n_workers: under MPI the ranks are the communicator's {size} "
                         f"processes, got n_workers={n_workers!r}; pass n_workers=None or "
                         f"run mpiexec -n {n_workers}")
    return size


# ---- one rank --------------------------------------------------------------------------
@dataclass
class _Job:
    cfg: _Config
    d: int                     # the length of the weight vector
    evaluation: object         # a core.results.Evaluator: the loss sample, held-out data
    k: int = 0                 # entries of a compressed message (0: dense)
    data: object = None        # the model's prepared training data
    dtype: object = np.float64   # every buffer's float type (the model's)

    def init(self):
        """The replicas' first weights: ``model.init`` from the seed (the linear
        model's are zeros), in the run's float type (a copy)."""
        return initial_weights(self.cfg.model, np.random.default_rng(self.cfg.seed),
                               self.dtype)

    def gradient(self, rows, w, g):
        """The model's minibatch gradient at ``w`` into ``g``."""
        self.cfg.model.grad(w, self.data, rows, g)

    def loss(self, w):
        """The training loss on the fixed sample."""
        return self.evaluation.loss(w)

    def record(self, w, final=False):
        """A history record's measures: the training loss and, with held-out data,
        ``val_loss`` and ``val_score``."""
        return self.evaluation(w, final)

    @property
    def comm_args(self):
        """(buffer length, communicator keywords): with compression the late policy
        lives in the error-feedback memory, so the communicator drops."""
        cfg = self.cfg
        late = cfg.late if cfg.compress is None else "drop"
        return exchange_size(cfg, self.d, self.k, self.dtype), dict(
            dtype=self.dtype, late=late, average=cfg.average, depth=cfg.depth, seed=cfg.seed,
            timeout=cfg.timeout)


def _warm_up(job):
    """Compile (or load from Numba's cache) the kernels before the ranks start, so
    that no rank compiles on its first step (at the run's first weights, so that a
    model's init that breaks the contract fails here, not in every rank)."""
    w = job.init()
    n = job.cfg.model.n_rows(job.data)
    job.gradient(np.arange(min(2, n), dtype=np.int64), w, np.empty(job.d, job.dtype))
    job.loss(w)


class _Rank:
    """Rank ``comm.rank``'s replica, rows, clocks and record."""

    def __init__(self, comm, job):
        cfg = self.cfg = job.cfg
        self.comm, self.job = comm, job
        self.k, self.P = comm.rank, comm.size
        self.w = job.init()
        self.v = np.zeros(job.d, job.dtype) if cfg.momentum > 0 else None
        self.exchange = make_exchange(comm, job)
        self.rows = np.arange(self.k, cfg.model.n_rows(job.data), self.P, dtype=np.int64)
        self.rng = np.random.default_rng([cfg.seed, self.k, 0x5EED])
        self.order, self.pos = self.rng.permutation(self.rows), 0
        self.history, self.skipped = [], 0
        self.contributors = 0
        self.trace = _RoundRecord(min(cfg.max_rounds or 4096, 1 << 16)) if cfg.trace else None

    def minibatch(self):
        b = self.cfg.batch_size
        if self.pos + b > self.order.size:
            self.order, self.pos = self.rng.permutation(self.rows), 0
        out = self.order[self.pos:self.pos + b]
        self.pos += b
        return out

    def pause(self, r):
        cfg, s = self.cfg, 0.0
        if cfg.imbalance is not None and self.k in sleepers(cfg.seed, r, self.P, cfg.imbalance[0]):
            s += cfg.imbalance[1]
        if cfg.delay is not None:
            s += draw_delay(cfg.delay, self.rng)
        if s > 0:
            time.sleep(s)

    def loss(self):
        return self.job.loss(self.w)

    def record(self, seconds, step, final=False):
        """A history record of the replica now (rank 0 keeps the history)."""
        return {"seconds": seconds, "step": step, **self.job.record(self.w, final)}

    def step(self, r, t, vote):
        """Round r of the communicator, the run's t-th (from 0, the step's ``lr(t)``): a
        gradient (or nothing when behind), the collective, the update."""
        cfg, ex, tr = self.cfg, self.exchange, self.trace
        g = None
        t_lag = time.perf_counter() if tr is not None else 0.0
        behind = self.comm.lag() > 0
        t_lagged = time.perf_counter() if tr is not None else 0.0
        if behind:
            self.skipped += 1                    # its round has closed: catch up only
        else:
            self.pause(r)
            g = ex.gradient_buffer()
            self.job.gradient(self.minibatch(), self.w, g)
        t_post = time.perf_counter() if tr is not None else 0.0
        update, stop, res = ex.round(g, vote, cfg.collective)
        if tr is not None:
            mask = sum(1 << int(c) for c in res.contributors)
            tr.put((r, int(behind), int(res.contributed), mask),
                   (t_lag, t_lagged, t_post, time.perf_counter()))
        self.contributors += res.n_contributors
        lr = cfg.lr(t)
        if self.v is None:
            self.w -= lr * update
        else:                                    # heavy ball, the same on every replica
            self.v *= cfg.momentum
            self.v -= lr * update
            self.w += self.v
        if not math.isfinite(self.w[0]):
            raise DivergenceError(f"training diverged at round {t}; lower lr (got {cfg.lr}, "
                                  f"{lr} at this round)")
        return stop


def make_exchange(comm, job):
    """The rank's exchange: dense or compressed, in the communicator's float type
    (the model's)."""
    cfg = job.cfg
    if cfg.compress is None:
        return _DenseExchange(comm, job.d)
    return _GatherExchange(comm, job.d, cfg.compress, cfg.late, cfg.average)


def exchange_size(cfg, d, k, dtype=np.float64):
    """Elements of ``dtype`` in one rank's buffer: the gradient and the vote (a
    reduction), or the vote and the largest packed message of k entries (a gather)."""
    return d + 1 if cfg.compress is None else 1 + packed_size(k, d, dtype)


def message_capacity(comp, d):
    """The most entries of a message of ``comp`` on d weights (its ``max_entries``;
    d when it states no tighter bound), checking that it runs on d weights."""
    comp.check(d)
    bound = comp.max_entries(d)
    if isinstance(bound, bool) or not isinstance(bound, numbers.Integral) or bound < 0:
        raise ValueError(f"{type(comp).__name__}.max_entries({d}) must return an int >= 0 "
                         f"(the most entries of a message on {d} weights), got {bound!r}; "
                         "return a true bound, or leave max_entries out")
    return min(int(bound), d)


class _DenseExchange:
    """The gradient travels whole: the buffer is [gradient, vote] in the
    communicator's float type, reduced with the round's collective (op mean); the
    model writes its gradient straight into it."""

    def __init__(self, comm, d):
        self.comm, self.d = comm, d
        self.buf = np.zeros(d + 1, comm.dtype)
        self.item = self.buf.itemsize
        self.bytes_sent = self.bytes_dense = self.bytes_moved = 0

    def gradient_buffer(self):
        return self.buf[:self.d]

    def round(self, g, vote, kind):
        """(the mean gradient, whether any contributor voted to stop, the Round)."""
        if g is None:
            self.buf[:self.d] = 0.0
        else:
            self.bytes_dense += self.item * self.d
        self.buf[self.d] = 1.0 if vote else 0.0
        self.bytes_moved += self.buf.nbytes
        res = self.comm.start(self.buf, kind, "mean").wait()
        if g is not None and res.contributed:
            self.bytes_sent += self.item * self.d
        return self.buf[:self.d], self.buf[-1] > 0, res


class _GatherExchange:
    """The gradient travels compressed: the rank's :class:`~sgd_shm.compress.Channel`
    (its error-feedback memory) makes the message, the round's collective gathers
    every contributor's [vote, packed message], and each rank decodes them in rank
    order (so every replica applies the same bits). A message that misses its round
    goes back into the memory with ``late="carry"``; with "drop" it is lost. Every
    buffer (the memory, the payload, the gradient, the update) is of the
    communicator's float type."""

    def __init__(self, comm, d, compressor, late, average):
        from sgd_shm.compress import Channel
        dt = comm.dtype
        self.comm, self.d, self.P = comm, d, comm.size
        self.channel = Channel(compressor, d, stream=comm.rank, keep_lost=late == "carry",
                               dtype=dt)
        self.payload = np.zeros(comm.n, dt)
        self.g = np.zeros(d, dt)
        self.update = np.zeros(d, dt)
        self.item = self.payload.itemsize
        self.average = average
        self.bytes_dense = self.bytes_moved = 0

    @property
    def bytes_sent(self):
        return self.channel.bytes_sent

    def gradient_buffer(self):
        return self.g

    def round(self, g, vote, kind):
        """(the mean decoded update, whether any contributor voted to stop, the Round)."""
        msg, used = None, 1
        self.payload[0] = 1.0 if vote else 0.0
        if g is not None:
            msg = self.channel.message(g)
            if packed_size(msg.indices.size, self.d, self.payload.dtype) >= self.payload.size:
                comp = self.channel.memory.compressor
                raise ValueError(
                    f"compress: {comp!r} sent {msg.indices.size} entries, more than its "
                    f"max_entries({self.d}) = {comp.max_entries(self.d)} that the exchange "
                    "was sized for; make max_entries return a true bound (or leave it out)")
            used += pack(msg, self.payload[1:])
            self.bytes_dense += self.item * self.d
        self.bytes_moved += self.item * used
        res = self.comm.start_gather(self.payload[:used], kind).wait()
        if msg is not None:
            self.channel.delivered(msg, res.contributed)
        up = self.update
        up[:] = 0.0
        for part in res.parts:
            if part.size > 1:
                add_packed(part[1:], self.d, up)
        up /= self.P if self.average == "size" else max(res.n_contributors, 1)
        return up, any(part[0] > 0 for part in res.parts), res


def rank_main(comm, job):
    """One rank's whole run; returns its record (rank 0: with the history). A model's
    matrix products run on one BLAS thread per rank (the ranks share the cores)."""
    with blas_limited(job.cfg.model):
        return _rank_run(comm, job)


def _stops(cfg, record):
    """Whether a history record stops the run: the target loss reached, or a callback
    returning True (every callback is called with it)."""
    called = any([bool(cb(dict(record))) for cb in cfg.callbacks])
    return called or (cfg.target_loss is not None and record["loss"] <= cfg.target_loss)


def _rank_run(comm, job):
    me = _Rank(comm, job)
    cfg = job.cfg
    comm.allreduce(np.zeros(comm.n, comm.dtype))     # start together
    t0 = time.perf_counter()
    next_sample, target_hit, bar = 0.0, False, _bar(cfg, me.k)
    if me.k == 0:                   # the start's record: a target or a callback may stop
        me.history.append(me.record(0.0, 0))
        target_hit = _stops(cfg, me.history[-1])
        next_sample = _period(cfg, time.perf_counter() - t0)
    r = 0
    while True:
        now = time.perf_counter() - t0
        vote = now >= cfg.max_seconds or target_hit
        stop = me.step(comm.next_round, r, vote)
        r += 1
        stop = stop or (cfg.max_rounds is not None and r >= cfg.max_rounds)
        if me.k == 0 and (time.perf_counter() - t0 >= next_sample or stop):
            now = time.perf_counter() - t0
            record = me.record(now, r, final=stop)
            cost = time.perf_counter() - t0 - now
            cur = record["loss"]
            me.history.append(record)
            target_hit = _stops(cfg, record) or target_hit
            next_sample = now + _period(cfg, cost)
            if bar is not None:
                bar.n = round(min(now, cfg.max_seconds), 1)
                bar.set_postfix_str(f"round {r:,}  loss {cur:.4f}"
                                    + (f"  held-out acc {record['val_score']:.4f}"
                                       if "val_score" in record else ""), refresh=True)
        if stop:
            break
    seconds = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    st = comm.stats
    return {"rank": me.k, "w": me.w, "history": me.history, "rounds": r, "seconds": seconds,
            "contributed": st["contributed"] - 1, "late": st["late"], "skipped": me.skipped,
            "contributors": me.contributors, "bytes_sent": me.exchange.bytes_sent,
            "bytes_dense": me.exchange.bytes_dense, "bytes_moved": me.exchange.bytes_moved,
            "t0": t0, "trace": me.trace}


def _period(cfg, cost):
    """Seconds from one of rank 0's records to the next, after one that took ``cost``
    seconds: ``sample_every``, or with None the default stretched to keep the records'
    share of rank 0's time at most SAMPLE_SHARE."""
    if cfg.sample_every is not None:
        return cfg.sample_every
    return max(SAMPLE_EVERY, cost * (1.0 - SAMPLE_SHARE) / SAMPLE_SHARE)


def _bar(cfg, k):
    return seconds_bar(cfg.max_seconds, cfg.collective) if cfg.progress and k == 0 else None


# ---- backends and the result -------------------------------------------------------------
def _run_shm(job):
    from sgd_shm.collectives.shm import ShmGroup
    cfg = job.cfg
    n, kw = job.comm_args
    from sgd_shm.collectives.base import CollectiveError
    with ShmGroup(cfg.n_workers, n, gather=cfg.compress is not None, **kw) as group:
        try:
            return group.run(rank_main, job)
        except CollectiveError as e:        # a rank's divergence: the trainers' one error
            if isinstance(e.__cause__, DivergenceError):
                raise DivergenceError(str(e.__cause__)) from e
            raise


def _run_mpi(job, comm):
    from sgd_shm.collectives.mpi import MPICommunicator, intracomm
    world = intracomm(comm)
    n, kw = job.comm_args
    with MPICommunicator(n, comm=world, **kw) as c:
        out = rank_main(c, job)
    outs = world.allgather(out)
    return outs


def _result(cfg, outs, job, classes):
    w = outs[0]["w"]
    equal = all(np.array_equal(o["w"], w) for o in outs)
    hist = outs[0]["history"]
    rounds = outs[0]["rounds"]
    final = hist[-1]["loss"]
    ttt = None
    if cfg.target_loss is not None:
        ttt = next((h["seconds"] for h in hist if h["loss"] <= cfg.target_loss), None)
    return EagerResult(
        collective=cfg.collective, history=hist, final_loss=final,
        seconds=max(o["seconds"] for o in outs), rounds=rounds, time_to_target=ttt,
        participation=[o["contributed"] / max(o["rounds"], 1) for o in outs],
        late=[o["late"] for o in outs], skipped=[o["skipped"] for o in outs],
        mean_contributors=outs[0]["contributors"] / max(rounds, 1), replicas_equal=equal,
        coef_=w.copy(), classes_=classes, backend=cfg.backend, n_workers=cfg.n_workers,
        late_policy=cfg.late, average=cfg.average,
        compress=None if cfg.compress is None else repr(cfg.compress),
        bytes_sent=sum(o["bytes_sent"] for o in outs),
        bytes_dense=sum(o["bytes_dense"] for o in outs),
        bytes_moved=sum(o["bytes_moved"] for o in outs), model=cfg.model,
        momentum=cfg.momentum, val_loss=hist[-1].get("val_loss"),
        val_score=hist[-1].get("val_score"), trace=_trace_of(cfg, outs))


def _trace_of(cfg, outs):
    """The run's :class:`EagerTrace` (times since rank 0's start), or None."""
    if not cfg.trace:
        return None
    t0 = outs[0]["t0"]
    return EagerTrace(cfg.n_workers, cfg.collective, cfg.late, cfg.average, cfg.seed,
                      [o["trace"].columns(t0) for o in outs], momentum=cfg.momentum)

