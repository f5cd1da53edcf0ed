"""``train``: any :class:`sgd_shm.models.Model` (by default the linear
:class:`sgd_shm.models.Linear`) trained by workers on a parameter server.

The parts, each a module with one job: :mod:`~sgd_shm.ps.config` (validated
arguments), :mod:`~sgd_shm.ps.partitions` (rows, minibatches and their queues),
:mod:`~sgd_shm.core.policies` (BSP, ASP, SSP, SaPS, or a user's policy object),
:mod:`~sgd_shm.ps.worker` (the worker loop), :mod:`~sgd_shm.ps.coordinator`
(sampling, detection, faults, checkpoints, stop), :mod:`~sgd_shm.ps.checkpoint`,
the transports (:mod:`~sgd_shm.ps.transport`: :mod:`~sgd_shm.ps.shm_backend`,
:mod:`~sgd_shm.ps.ray_backend`, :mod:`~sgd_shm.ps.threads_backend`, over one
:mod:`~sgd_shm.ps.server` state),
and :mod:`~sgd_shm.ps.plots`. This module wires them together and returns a
:class:`TrainResult` that carries the trained model.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from sgd_shm.core.batches import Batches
from sgd_shm.core.model import blas_limited, initial_weights
from sgd_shm.core.progress import seconds_bar
from sgd_shm.core.results import Evaluator, Result
from sgd_shm.core.schedules import for_run
from sgd_shm.core.status import MESSAGE_FIELDS
from sgd_shm.core.validation import (check_eval_set, check_shards, model_data, model_dtype,
                                     n_columns)
from sgd_shm.models.linear import model_or_linear
from sgd_shm.ps.checkpoint import load_checkpoint
from sgd_shm.ps.config import make_config
from sgd_shm.ps.coordinator import Coordinator
from sgd_shm.ps.worker import Job, warm

__all__ = ["train", "TrainResult"]


@dataclass(repr=False)
class TrainResult(Result):
    """What :func:`train` returns: the trained model and the run's record (the fields
    every trainer's result has are described in :mod:`sgd_shm.core.results`).

    Model: ``model`` (the :class:`sgd_shm.models.Model` trained: the default
    ``Linear`` or the ``model=`` given), ``coef_`` (its final flat weights, of the
    model's ``dtype``),
    ``classes_`` (class index i is ``classes_[i]``; for the linear model the second is
    the positive class), ``decision_function(X)``, ``predict(X)``, ``score(X, y)``,
    ``predict_proba(X)`` where the model has probabilities.

    Record: history: dicts (seconds, step, loss), one per sample, ``step`` the global
    version (pushes applied in full); ``val_loss`` / ``val_score`` on ``eval_set``; detections:
    (seconds, worker), the first time each worker was flagged; events: (seconds,
    worker, flagged) every flag change; workers: per-worker slot dicts (pushes,
    dropped, stolen, spells, staleness_sum, slowdown, ...); staleness_hist: per
    worker, push staleness counts in log2 bins (bin 0: 0; bin i: [2**(i-1), 2**i));
    batches: per-partition epochs and the exactly-once check of minibatches; killed:
    workers that died; checkpoints: (seconds, path) written; resumed_from: the
    checkpoint's seconds and version, when resumed; backend: "shm", "ray" or "threads"; nodes:
    where each worker ran (the host name, or the Ray node id); compress: the
    compressor (its repr) or None; epochs: the work budget or None; bytes_sent and
    bytes_dense: what the pushes sent, and what they would have sent dense (equal
    without a compressor); traffic: on Ray with node-local memory, per node its
    ``node`` id, ``workers``, ``syncs`` and the ``bytes_up`` / ``bytes_down`` it
    exchanged with the global servers (None on other transports).

    ``partition`` is "blocks" or None.

    ``trace`` (``train(trace=True)``): a :class:`sgd_shm.core.traces.PSTrace`, every
    push's minibatch, the versions it read and was applied at, its scale and the
    brackets of its calls, and the coordinator's counter reads and status writes;
    ``sgd_shm.sim.simulate(..., replay=result.trace)`` replays it. None otherwise.

    Message loss (``drop=``, and every RPS run): drop: the probability p, or None
    for reliable links; messages: {"drop", "seed" (the loss coins' seed, see
    :class:`sgd_shm.core.status.Losses`), "per_worker" and "per_shard": dicts of
    up_sent / up_lost (worker -> server messages, of them lost) and down_sent /
    down_lost (server -> worker answers, of them lost)}; the per-worker counts are
    also in ``workers``. Under RPS ``updates`` counts rounds.
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
    coef_: np.ndarray | None = field(default=None, repr=False)
    classes_: np.ndarray | None = None
    backend: str = "shm"
    nodes: list = field(default_factory=list)
    compress: str | None = None
    epochs: int | None = None
    drop: float | None = None
    messages: dict | None = None
    model: object = None
    partition: str | None = None
    val_loss: float | None = None
    val_score: float | None = None
    traffic: list | None = None
    trace: object = None

    _repr_fields = ("policy", "final_loss", "val_score", "updates", "seconds")
    _derived = ("updates", "mean_staleness", "bytes_sent", "bytes_dense", "observed_drop")

    @property
    def observed_drop(self) -> float | None:
        """The fraction of messages lost, both directions together (None without
        message loss)."""
        if self.messages is None:
            return None
        tot = self.messages["total"]
        return (tot["up_lost"] + tot["down_lost"]) / max(1, tot["up_sent"] + tot["down_sent"])

    @property
    def bytes_sent(self) -> int:
        """Bytes the workers' pushes sent, all workers: the weights' bytes for a dense
        push (``compress=None``; 8 per weight in float64, 4 in float32), the message's
        size for a compressed one."""
        return sum(w.get("bytes_sent", 0) for w in self.workers)

    @property
    def bytes_dense(self) -> int:
        """Bytes the same pushes would have sent dense: the weights' bytes per push
        (``n_params`` times 8 in float64, 4 in float32)."""
        return sum(w.get("bytes_dense", 0) for w in self.workers)

    @property
    def updates(self) -> int:
        """Pushes applied in full (the global version at the end)."""
        return self.history[-1]["step"] if self.history else 0

    @property
    def mean_staleness(self) -> float:
        """Mean staleness of all pushes, applied or dropped."""
        pushes = sum(w["pushes"] + w["dropped"] for w in self.workers)
        return sum(w["staleness_sum"] for w in self.workers) / max(pushes, 1)


def _resume_point(cfg, d):
    if cfg.resume is None:
        return None
    ckpt = load_checkpoint(cfg.resume)
    if ckpt["weights"].shape != (d,):
        raise ValueError(f"resume: the checkpoint has {ckpt['weights'].shape[0]} weights but "
                         f"this run's model has {d}; resume with the model and the data (as "
                         "many features) it was trained on")
    if cfg.policy.replicated:
        # rounds go on from the checkpoint's version for every worker, whatever policy or
        # number of workers wrote it (a worker counts its rounds in its pushes: unequal or
        # missing counts left the round barrier waiting forever)
        n = cfg.n_workers
        same = len(ckpt["epochs"]) == n
        ckpt = {**ckpt, "pushes": np.full(n, ckpt["version"], np.int64),
                "epochs": ckpt["epochs"] if same else np.zeros(n, np.int64)}
    return ckpt


def _n_shards(cfg, d, ckpt):
    """Shards of the run: a checkpoint's (a resumed run keeps its shard versions; an
    n_shards that differs is refused, not ignored), else :func:`check_shards` of
    n_shards."""
    if ckpt is not None:
        have = len(ckpt["shard_versions"])
        if cfg.n_shards is not None and check_shards(cfg.n_shards, d) != have:
            raise ValueError(f"n_shards: the checkpoint was written with {have} shards, whose "
                             f"versions a resumed run keeps; pass n_shards={have} or None")
        return have
    return check_shards(cfg.n_shards, d)


def _backend(cfg, d, batches, rng, ckpt, budget, init=None):
    shards = _n_shards(cfg, d, ckpt)
    kw = {"budget": None if cfg.policy.replicated else budget,
          "replicas": cfg.policy.replicated, "lossy": cfg.lossy, "init": init,
          "clock": cfg.clock, "dtype": model_dtype(cfg.model)}
    if cfg.trace:
        kw["trace"] = cfg.trace
    if cfg.backend == "ray":
        return _ray_backend(cfg, d, shards, batches, rng, ckpt, budget, kw)
    if cfg.backend == "threads":
        from sgd_shm.ps.threads_backend import ThreadsBackend
        return ThreadsBackend(d, shards, cfg.n_workers, batches, rng, ckpt, **kw)
    from sgd_shm.ps.shm_backend import ShmBackend
    return ShmBackend(d, shards, cfg.n_workers, batches, rng, ckpt,
                      start_method=cfg.start_method, **kw)


def _ray_backend(cfg, d, shards, batches, rng, ckpt, budget, kw):
    """The Ray transport: node-local shared memory (:mod:`~sgd_shm.ps.ray_local`), or
    for model averaging and lossy links, whose servers take each worker's messages,
    workers talking to the servers' actors (:mod:`~sgd_shm.ps.ray_backend`). Without
    a caller's session the run holds its own: it connects (starting Ray only when
    none runs) and ends with the run."""
    from sgd_shm.ps.ray_session import RaySession, require_ray
    require_ray()
    owned = cfg.session is None
    session = RaySession(cfg.address) if owned else cfg.session
    try:
        if cfg.policy.replicated or cfg.lossy:
            from sgd_shm.ps.ray_backend import RayBackend
            return RayBackend(d, shards, cfg.n_workers, batches, rng, ckpt, session=session,
                              owned=owned, **kw)
        from sgd_shm.ps.ray_local import NodeLocalBackend
        return NodeLocalBackend(d, shards, cfg.n_workers, batches, rng, ckpt, budget, init=
                                kw["init"], session=session, owned=owned, clock=kw["clock"],
                                dtype=kw["dtype"])
    except BaseException:
        if owned:
            session.close()
        raise


def _budget(cfg, batches):
    """The work budget of ``epochs=`` (:meth:`Batches.budget`), or None."""
    if cfg.epochs is None:
        return None
    return batches.budget(cfg.epochs, cfg.policy.replicated)


class _BudgetCoordinator(Coordinator):
    """The coordinator of a run with a work budget (``epochs=``): it also stops once
    the budget is spent."""

    def sample(self, now, cfg, bar):
        done = super().sample(now, cfg, bar)
        return done or self.backend.budget_done(len(self.killed))


class _RoundsCoordinator(Coordinator):
    """The coordinator of a replicated run with a budget of rounds: it also stops once
    every server has completed them (the global version counts rounds)."""

    def sample(self, now, cfg, bar):
        done = super().sample(now, cfg, bar)
        return done or self.backend.version() >= self.last_round


def _progress_bar(cfg, label):
    return seconds_bar(cfg.max_seconds, label) if cfg.progress else None


def train(X, y, *, n_workers=4, policy="saps", staleness=None, window=None,
          detect_factor=None, slowdown=None, transient=None, max_seconds=None, epochs=None,
          target_loss=None, loss=None, lr=0.5, alpha=None, batch_size=64, n_shards=None,
          sample_every=0.02, faults=None, checkpoint=None, checkpoint_every=5.0, resume=None,
          wait=None, backend="shm", address=None, start_method="fork", seed=0, progress=None,
          compress=None, drop=None, model=None, partition=None, eval_set=None,
          callbacks=None, session=None, clock="exact", trace=False) -> TrainResult:
    """Train a model (by default the linear model of ``loss`` and ``alpha``) with
    ``n_workers`` workers on a parameter server under ``policy``; every rule is in the
    modules named above.

    Parameters (all keyword; defaults in brackets)
    ----------------------------------------------
    X, y : CSR/dense matrix and labels (two classes for the linear model).
    n_workers [4] : worker processes (``backend="shm"``), Ray actors or threads; -1: one
        per CPU.
    policy ["saps"] : "bsp", "asp", "ssp", "saps", "rps", or a
        :class:`sgd_shm.ps.Policy` instance (e.g. ``SSP(staleness=2)`` or a user's
        subclass).
    staleness [n_workers] : s for "ssp" and the bound for "saps".
    window [None: 0.5], detect_factor [None: 2.0] : SaPS detection; the window should
        span several steps of the slowest worker. These three are ignored, with a
        warning, by a named policy that does not use them, and refused beside a policy
        object (which carries its own).
    slowdown [None] : stretch of each worker's step (pull, gradient, push): a sequence of
        n_workers factors >= 1, a dict {worker: factor}, or a profile: "straggler"
        (worker 0 is 4x slower), "hetero" (worker k at 4 ** (1 - k / (n_workers - 1))),
        "none".
    transient [None] : (spells per second, factor, seconds): random slow spells (a
        Poisson process) during which a worker's compute time is stretched by
        ``factor``; counted in the slots.
    epochs [None], max_seconds [None], target_loss [None] : when to stop. Epochs are
        the default rule: with neither ``epochs`` nor ``max_seconds``, 5 epochs (see
        ``epochs`` below); ``max_seconds`` stops after this long (this call), and
        ``target_loss`` once the training loss (on up to 4096 rows) is <= it; given
        together, whichever comes first.
    loss [None: "log_loss"] : "log_loss", "hinge", "modified_huber" or "squared_error"
        (the default :class:`sgd_shm.models.Linear`).
    lr [0.5], alpha [None: 1e-4], batch_size [64] : the step (applied to each push,
        one worker's gradient: smaller than eager-SGD's 2.0, which applies to the mean
        of every rank's; it suits the default linear model: pass a smaller one for a
        network): a number, or a schedule of the version a push's worker pulled
        (:class:`sgd_shm.ps.StepDecay`, :class:`sgd_shm.ps.Cosine`, any callable ``t
        -> step``; RPS: of the round; :mod:`sgd_shm.core.schedules`); L2 of the linear
        model, rows per minibatch.
    n_shards [None: 8, or the model's weights where fewer], sample_every [0.02] : weight
        shards (at most one per weight); the coordinator's period.
    faults [None] : {worker: seconds}: kill that worker (SIGKILL, or ``ray.kill``)
        that long into the run; reported in ``.killed``; BSP/SSP stop waiting for
        it; under SaPS its queued minibatches are stolen.
    checkpoint [None], checkpoint_every [5.0] : write a checkpoint there every so
        many seconds and at the end (atomically). resume [None] : continue from one
        (same number of features; either backend): weights, versions, pushes and
        epochs are restored and the clock goes on from its seconds.
    wait [WaitPolicy()] : how a push waits on a held shard lock (shared memory).
    backend ["shm"] : "shm" (processes on this box), "ray" (actors; optional
        extra) or "threads" (threads of this process over private memory, for tests
        and debugging; see :mod:`sgd_shm.ps.transport`). address [None] : a Ray
        cluster to join (a ConnectionError naming it within 30 s when none answers);
        None uses the running Ray instance, or starts a local one for this run and
        stops it after. session [None] : a :class:`sgd_shm.ps.RaySession` that keeps
        Ray and the idle actors between runs, and sets each worker actor's CPUs
        (``worker_cpus``); on Ray, each node's workers share a replica in shared
        memory (:mod:`sgd_shm.ps.ray_local`).
    start_method ["fork"] : how backend "shm" starts its worker processes: "fork"
        (fastest: they inherit the store and the data) or "forkserver" / "spawn"
        (for a parent that runs threads, which Python 3.12+ warns about forking, or
        a platform without a safe fork; the data is copied once into shared memory
        and each worker takes about a second to start, before the clock starts).
    seed [0], progress [stderr is a terminal] : seed (an int >= 0, or None for fresh
        entropy); a progress bar (True or False).
    compress [None] : gradient compression (:mod:`sgd_shm.compress`): a compressor
        object or its spec ("topk:0.001", "randomk:0.01", "threshold:0.001",
        "qsgd:4", "dense"); None pushes dense gradients (the plain path). Each
        worker keeps its own error-feedback memory: it pushes
        ``msg = memory.step(g)``; a sparse message updates (locks, bumps) only the
        shards its indices hit, any other message is decoded and pushed densely. A
        push the policy scales is applied with its values times the scale; a push
        the policy drops leaves the memory untouched (its minibatch is redone, so
        the residual neither loses earlier mass nor gains the dropped gradient).
        ``bytes_sent`` / ``bytes_dense`` of the result count the messages' bytes
        against the weights' bytes per push (equal when compress is None).
    drop [None] : message loss: every message between a worker and a shard's
        server (both directions) is lost independently with this probability in
        [0, 1), with coins seeded from ``seed`` (:class:`sgd_shm.core.status.Losses`);
        policy "asp" (a lost push is not applied on that shard; a lost answer to a
        pull leaves the worker's block as last received) or "rps". Counted in
        ``.messages``. Needs n_shards <= the number of features.
    policy "rps" : the Robust Parameter Server of Yu et al. (ICML 2019): every
        worker keeps a replica, takes a local step and averages its blocks through
        the n_shards servers each round (:class:`sgd_shm.core.policies.RPS`); with
        ``epochs=E`` it runs E times the largest partition's minibatches rounds.
    epochs [None: 5 when max_seconds is None] : a work budget, to compare runs at
        equal work (and the default stopping rule): the run stops
        once ``epochs * n_batches`` minibatches have been applied in total
        (n_batches: the minibatches of all partitions together, i.e. one pass over
        the data), whichever partitions they came from (under ASP a fast worker's
        partition may be visited more often than a slow one's; SaPS steals). Each
        application takes a ticket (claimed after the policy's gate opens, kept
        across a dropped push), so exactly that many are applied unless the run
        stops first (``max_seconds``, ``target_loss``, which still apply) or a
        worker is killed holding a ticket (then the run ends once every ticket is
        claimed and at most one per killed worker is missing).
    model [None] : a :class:`sgd_shm.models.Model` (e.g. ``MLP(n_features,
        (64,), n_classes)``) to train instead of the linear model: the store holds
        its flat weights, drawn by ``model.init`` from the run's seed; each worker's
        gradient is ``model.loss_grad`` of its minibatch (y: any labels, as many
        classes as ``model.n_outputs``); the loss and L2 are the model's, so
        ``loss`` and ``alpha`` must be left out. Every policy, ``compress``,
        ``drop``, the budget and every backend apply. Every buffer of the run (the
        store's weights, the workers' pulled copies and gradients, the messages, the
        error-feedback memory, checkpoints, ``coef_``) is of the model's ``dtype``
        (float32 for a :class:`sgd_shm.torch.TorchModel`, float64 for the kit's
        models; anything else is a TypeError naming ``model.dtype``).
    partition [None] : with a model, "blocks": block variable partitioning
        (Kungurtsev et al., arXiv:1905.11845): ``model.blocks(n_workers)`` gives
        each worker its own coordinate blocks; each step it pulls all the weights,
        draws one of its blocks uniformly, computes that block's gradient only and
        pushes just that block (the shards it does not reach see nothing). Not with
        ``compress``, ``drop`` or RPS.
    eval_set [None] : (X_val, y_val): held-out data; every history record adds
        ``val_loss`` and ``val_score`` (accuracy) on up to 4096 of its rows, and the
        result's ``val_loss`` / ``val_score`` are the final model's on all of it.
    callbacks [None] : a callable, or a sequence of them, called with each history
        record (a dict: seconds, step, loss) as the coordinator samples it; a callback
        that returns True stops the run (as ``target_loss`` does).
    clock ["exact"] : the store's global version: "exact" (one atomic word that every
        push adds to) or "multicounter" (a relaxed :class:`relaxed.MultiCounter`,
        4 counters per worker: pushes spread over them, pulls and staleness read an
        estimate within its ``error_bound()``; checkpoints, the final version and
        RPS's rounds are exact). See docs/parameter-server.md, "Clocks".
    trace [False] : record every push (True; an int: at most that many per worker, the
        default 32,768) in preallocated rows of shared memory, for an exact replay in
        the simulator; the result's ``trace``. Backends "shm" and "threads" (Ray: a
        ValueError), the exact clock, not RPS.
    """
    args = {k: v for k, v in locals().items() if k not in ("X", "y", "loss", "alpha",
                                                          "eval_set")}
    args["model"] = model_or_linear(model, loss, alpha, n_columns(X))
    cfg = make_config(**args)
    rng = np.random.default_rng(cfg.seed)
    prob = _problem(cfg, X, y, rng, eval_set)
    d = prob["d"]
    ckpt = _resume_point(cfg, d)
    batches = Batches.draw(prob["n"], cfg.n_workers, cfg.batch_size, rng)
    budget = _budget(cfg, batches)
    start = 0 if ckpt is None else int(ckpt["version"])    # versions (rounds) from here
    cfg = replace(cfg, lr=for_run(cfg.lr, start, None if budget is None else start + budget,
                                  slack=cfg.n_workers))
    blocks = None if cfg.partition is None else cfg.model.blocks(cfg.n_workers)
    init = None if ckpt is not None else initial_weights(cfg.model, rng)
    backend = _backend(cfg, d, batches, rng, ckpt, budget, init)
    try:
        job = Job(cfg.model, prob["data"], d, batches, cfg.policy, cfg.lr, cfg.factors,
                  cfg.transient, cfg.compress, budget, cfg.drop, blocks=blocks)
        with blas_limited(cfg.model):
            return _run(cfg, job, backend, prob["evaluate"], rng, ckpt, prob["classes"], d)
    finally:
        backend.close()


def _problem(cfg, X, y, rng, eval_set):
    """The data (``model.prepare``) and the :class:`~sgd_shm.core.results.Evaluator`
    of a run: the model's loss (with its L2) on up to 4096 training rows, and the
    held-out loss and accuracy where ``eval_set`` is given."""
    model = cfg.model
    X, yi, classes = model_data(X, y, model, cfg.n_workers)
    evals = check_eval_set(eval_set, model, classes)
    eval_rows = np.sort(rng.choice(X.shape[0], min(4096, X.shape[0]), replace=False))
    return {"d": model.n_params, "n": X.shape[0], "classes": classes,
            "data": model.prepare(X, yi), "evaluate": Evaluator(model, X, yi, eval_rows, evals)}


def _loss_seed(cfg, rng):
    """The seed of the loss coins: the run's seed when it is an int >= 0 (so the
    coins can be replayed from it), else a draw of the run's generator."""
    s = cfg.seed
    if isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0:
        return int(s)
    return int(rng.integers(0, 2**63 - 1))


def _messages(cfg, job, counts):
    """The result's ``messages`` dict from the (workers, shards, 4) counts."""
    if counts is None:
        return None

    def rows(a):
        return [{f: int(v) for f, v in zip(MESSAGE_FIELDS, r)} for r in a]
    return {"drop": cfg.drop, "seed": job.loss_seed, "per_worker": rows(counts.sum(axis=1)),
            "per_shard": rows(counts.sum(axis=0)),
            "total": rows(counts.sum(axis=(0, 1))[None])[0]}


def _run(cfg, job, backend, evaluate, rng, ckpt, classes, d):
    # compile the kernels once, before the workers start and before the clock
    evaluate(np.zeros(d, job.dtype))
    warm(job)
    meta = {"policy": cfg.policy.name, "n_workers": cfg.n_workers,
            "n_samples": int(job.model.n_rows(job.data)), "n_features": int(d),
            "loss": getattr(cfg.model, "loss_name", type(cfg.model).__name__),
            "clock": cfg.clock}
    kind = (Coordinator if job.budget is None else
            _RoundsCoordinator if cfg.policy.replicated else _BudgetCoordinator)
    coord = kind(backend, cfg.policy, evaluate, cfg.n_workers,
                 t_off=ckpt["seconds"] if ckpt is not None else 0.0)
    if job.budget is not None and cfg.policy.replicated:
        coord.last_round = backend.version() + job.budget
    seeds = rng.integers(0, 2**63 - 1, cfg.n_workers)
    job.loss_seed = _loss_seed(cfg, rng)
    bar = _progress_bar(cfg, cfg.policy.name)
    try:
        backend.start(job, seeds, cfg.lr, cfg.wait)
        t0 = time.perf_counter()
        coord.run(cfg, meta, t0, bar)
    finally:
        backend.stop()
        if bar is not None:
            bar.close()
    now = time.perf_counter() - t0
    if cfg.checkpoint is not None:
        coord.checkpoint(cfg.checkpoint, now, meta)
    w, v = backend.pull()
    workers, hist, batches = backend.report()
    trace = None
    if cfg.trace:
        trace = backend.trace(t0, cfg.policy.name,
                              [h["seconds"] - coord.t_off for h in coord.history])
    messages = _messages(cfg, job, backend.messages())
    for k, sl in enumerate(workers):
        sl["slowdown"] = float(cfg.factors[k])
        if messages is not None:
            sl.update(messages["per_worker"][k])
    last = evaluate(w, final=True)
    final = last["loss"]
    coord.history.append({"seconds": coord.t_off + now, "step": v, **last})
    resumed = None if ckpt is None else {"seconds": ckpt["seconds"], "version": ckpt["version"],
                                        "path": cfg.resume}
    return TrainResult(cfg.policy.name, coord.history, coord.detections, workers, final,
                       coord.history[-1]["seconds"], coord.t_target, coord.killed,
                       coord.events, hist, batches, coord.written, resumed, w.copy(),
                       classes, backend.name, list(backend.nodes),
                       None if cfg.compress is None else repr(cfg.compress), cfg.epochs,
                       cfg.drop, messages, cfg.model, cfg.partition,
                       traffic=backend.traffic() if hasattr(backend, "traffic") else None,
                       val_loss=last.get("val_loss"), val_score=last.get("val_score"),
                       trace=trace)
