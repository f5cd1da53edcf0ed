"""``simulate``: a run of the parameter server or of eager-SGD's collectives at any
number of workers, in virtual time, on this one box.

The parts are the kit's own: the policy objects of :mod:`sgd_shm.core.policies`, the
collectives' rules (:mod:`sgd_shm.collectives.base`), the compressors and their
error feedback (:mod:`sgd_shm.compress`), the models (:mod:`sgd_shm.models`), the
loss coins of :class:`sgd_shm.core.status.Losses` and the trainers' evaluation
(:class:`sgd_shm.core.results.Evaluator`). Only time is modelled: how long each
worker's step takes (:class:`~sgd_shm.sim.cluster.Cluster`) and each message
(:class:`~sgd_shm.sim.cluster.Network`). Gradients are computed on the real data at
the weights each worker would have read and applied in virtual-time order, so the
loss and the held-out accuracy of a simulated run are real.

Example::

    from sgd_shm.data import make_rcv1_like
    from sgd_shm.sim import Cluster, Network, simulate
    X, y = make_rcv1_like(20_000, 2_000, density=0.02, random_state=0)
    r = simulate(X, y, n_workers=128, policy="saps", epochs=5,
                 cluster=Cluster(1e-3, classes=[(0.75, 1.0), (0.25, 4.0)]),
                 network=Network.gbps(10))
    r.seconds, r.final_loss, r.detections      # virtual seconds, the loss, who was flagged
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from sgd_shm.collectives.base import AVERAGE, KINDS, LATE
from sgd_shm.core.batches import Batches, eager_rounds
from sgd_shm.core.model import blas_limited, initial_weights
from sgd_shm.core.results import Evaluator, Result
from sgd_shm.core.traces import EagerTrace, PSTrace
from sgd_shm.core.policies import make_policy
from sgd_shm.core.schedules import Schedule, for_run, make_schedule
from sgd_shm.core.validation import (check_callbacks, check_choice, check_drop, check_eval_set,
                                     check_faults, check_int, check_momentum, check_number,
                                     check_positive, check_shards, model_data, n_columns,
                                     resolve_workers, stopping_rule, warn_caller)
from sgd_shm.models.linear import model_or_linear
from sgd_shm.sim.cluster import Cluster, Network, StepTimes

__all__ = ["simulate", "SimResult"]

#: rows of the fixed sample the training loss is evaluated on (as the trainers)
EVAL_ROWS = 4096
#: history records a run aims at when ``sample_every`` is not given
RECORDS = 100


@dataclass(repr=False)
class SimResult(Result):
    """What :func:`simulate` returns: the trained model and the run's record, in
    virtual seconds (the fields every trainer's result has are described in
    :mod:`sgd_shm.core.results`).

    ``kind``: "ps" or "collective"; ``name``: the policy's or the collective's name.
    ``history``: records (seconds, step, loss[, val_loss, val_score]); a step is the
    global version (ps) or the round (collective). ``seconds``: the virtual time of
    the run; ``wall_seconds``: how long the simulation itself took.

    Parameter server: ``workers`` (per worker: pushes, dropped, stolen,
    staleness_sum, spells, slowdown, bytes_sent, bytes_dense, and the message counts
    with ``drop``), ``staleness_hist`` (log2 bins, as the store's), ``detections``
    and ``events`` (SaPS's flags), ``killed``, ``log``: every applied push, in order,
    as lists under the names of :data:`sgd_shm.sim._ps.LOG_FIELDS` (seconds, worker,
    partition, batch, pulled version, version it was applied at, scale);
    ``batches``: the :class:`sgd_shm.core.batches.Batches` (``batches.rows_of(p,
    j)``: the rows of a logged push's minibatch).

    Collective: ``rounds``, ``participation``, ``late``, ``skipped`` (per rank),
    ``mean_contributors``, ``log``: per round its seconds (result ready), round and
    contributors, and under ``skips`` the (rank, round) of every gradient a rank
    skipped because its round had closed. Both: ``bytes_sent`` (what made it into the model) and
    ``bytes_dense`` (8 bytes per weight per gradient computed)."""
    kind: str
    name: str
    history: list
    final_loss: float
    seconds: float
    n_workers: int
    time_to_target: float | None = None
    wall_seconds: float = 0.0
    workers: list = field(default_factory=list)
    staleness_hist: list = field(default_factory=list)
    detections: list = field(default_factory=list)
    events: list = field(default_factory=list)
    killed: list = field(default_factory=list)
    log: dict = field(default_factory=dict)
    rounds: int = 0
    participation: list = field(default_factory=list)
    late: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    mean_contributors: float = 0.0
    bytes_sent: int = 0
    bytes_dense: int = 0
    compress: str | None = None
    drop: float | None = None
    cluster: str = ""
    network: str = ""
    coef_: np.ndarray | None = field(default=None, repr=False)
    classes_: np.ndarray | None = None
    model: object = None
    val_loss: float | None = None
    val_score: float | None = None
    batches: object = field(default=None, repr=False)
    replay: dict | None = field(default=None, repr=False)

    _repr_fields = ("name", "n_workers", "final_loss", "val_score", "seconds")
    _derived = ("updates", "mean_staleness")

    @property
    def updates(self) -> int:
        """The last record's step: pushes applied in full (ps), rounds (collective)."""
        return self.history[-1]["step"] if self.history else 0

    @property
    def mean_staleness(self) -> float:
        """Mean staleness of the pushes, applied or dropped (0 for a collective)."""
        pushes = sum(w["pushes"] + w["dropped"] for w in self.workers)
        return sum(w["staleness_sum"] for w in self.workers) / max(pushes, 1)


@dataclass
class _Problem:
    model: object
    data: object
    d: int
    init: np.ndarray
    evaluate: Evaluator
    classes: np.ndarray
    n_rows: int
    batches: object = None
    worker_seeds: object = None


@dataclass
class _Config:
    n_workers: int
    policy: object
    collective: str | None
    lr: Schedule                        # of the version pulled (ps) or the round
    batch_size: int
    n_shards: int | None       # None until the problem is known (check_shards)
    epochs: float | None
    max_seconds: float
    target_loss: float | None
    cluster: Cluster
    network: Network
    compress: object
    drop: float | None
    seed: int
    late: str
    average: str
    depth: int
    faults: dict
    sample_every: float | None = None
    budget: int | None = None
    step_times: StepTimes | None = None
    loss_seed: int = 0
    callbacks: tuple = ()
    replay: object = None
    momentum: float = 0.0               # heavy ball on a collective's rounds


def simulate(X, y, *, n_workers, policy=None, collective=None, epochs=None, cluster=None,
             network=None, compress=None, drop=None, model=None, seed=0, eval_set=None,
             lr=None, batch_size=64, n_shards=None, staleness=None, window=None,
             detect_factor=None, late="carry", average="size", depth=8, sample_every=None,
             max_seconds=None, target_loss=None, faults=None, loss=None,
             alpha=None, callbacks=None, replay=None, momentum=0.0) -> SimResult:
    """Simulate training ``model`` (by default the linear model of ``loss`` and
    ``alpha``) on (X, y) with ``n_workers`` workers, in virtual time.

    Parameters (all keyword; defaults in brackets)
    ----------------------------------------------
    n_workers : workers (parameter server) or ranks (collective): 1 and up.
    policy [None], collective [None] : at most one: a parameter-server policy (a name
        of ``ps.train``, "bsp", "asp", "ssp", "saps", "rps", or a
        :class:`sgd_shm.ps.Policy` object, a user's subclass included) or a collective
        ("sync", "solo", "majority"); neither: the parameter server with ASP.
    epochs [None], max_seconds [None], target_loss [None] : when to stop, as the
        trainers (epochs: the work budget, default 5 when max_seconds is None;
        max_seconds in virtual seconds; target_loss on the training-loss sample).
    cluster [Cluster()], network [Network()] : the compute-time and network models
        (:mod:`sgd_shm.sim.cluster`; the default network is free and instant).
    compress [None] : a compressor or its spec, with error feedback per worker.
    drop [None] : message-loss probability (parameter server, "asp" or "rps").
    model [None], loss [None], alpha [None] : as the trainers.
    seed [0] : an int >= 0: partitions, minibatch orders, step-time draws, loss coins.
    eval_set [None] : (X_val, y_val): held-out loss and accuracy in every record.
    lr [0.5 ps, 2.0 collective], batch_size [64], n_shards [None] : as the trainers (a
        schedule, as the trainers': of the version a push pulled, or of the round).
    staleness [None], window [None: 4 steps of the slowest worker], detect_factor
        [None: 2.0] : for "ssp" / "saps" (the window in virtual seconds); ignored, with a
        warning, where the run does not use them.
    late ["carry"], average ["size"], depth [8] : the collectives' rules.
    momentum [0.0] : heavy-ball momentum of a collective's rounds, as the eager
        trainer's (v = momentum * v - lr(r) * mean, w += v); the parameter server's
        pushes take none.
    sample_every [None: about 100 records per run] : virtual seconds between records.
    faults [None] : {worker: virtual seconds}: the worker dies then (parameter server).
    callbacks [None] : a callable, or a sequence of them, called with each history
        record; one that returns True stops the run (as the trainers' callbacks).
    replay [None] : the ``trace`` of a traced real run, replayed exactly
        (:mod:`sgd_shm.sim.replay`): ``ps.train(..., trace=True).trace`` (pass the
        run's policy, its settings and ``n_workers``; the pushes' events happen in an
        order the real run could have had, and the simulator decides them; the
        result's ``replay`` holds its decisions) or ``eager.train(..., trace=True).trace``
        (pass its collective, late, average, seed); or a
        :class:`sgd_shm.sim.trace.Trace` of :class:`~sgd_shm.sim.trace.Recorder`: the
        steps and samples happen at the real run's times instead of the cluster's and
        network's (policies whose gate does not close: ASP, SaPS or one's own).
    """
    t_wall = time.perf_counter()
    model = model_or_linear(model, loss, alpha, n_columns(X))
    cfg = _config(n_workers, policy, collective, epochs, cluster, network, compress, drop,
                  seed, lr, batch_size, n_shards, staleness, window, detect_factor, late,
                  average, depth, sample_every, max_seconds, target_loss, faults)
    cfg.callbacks = check_callbacks(callbacks)
    cfg.momentum = _momentum(momentum, cfg.collective)
    cfg.replay = _replay(replay, cfg)
    prob = _problem(X, y, model, cfg, eval_set)
    cfg.lr = for_run(cfg.lr, 0, cfg.budget if cfg.epochs is not None else None,
                     slack=cfg.n_workers)
    with blas_limited(model):
        if cfg.collective is None:
            out = _run_ps(prob, cfg)
        else:
            out = _run_collective(prob, cfg)
    out.wall_seconds = time.perf_counter() - t_wall
    return out


# ---- settings ----------------------------------------------------------------------------
def _config(n_workers, policy, collective, epochs, cluster, network, compress, drop, seed,
            lr, batch_size, n_shards, staleness, window, detect_factor, late, average, depth,
            sample_every, max_seconds, target_loss, faults):
    n_workers = resolve_workers(n_workers)
    if policy is not None and collective is not None:
        raise ValueError(f"policy, collective: give one of them (a parameter-server policy or "
                         f"a collective), got policy={policy!r} and collective={collective!r}")
    if collective is not None:
        check_choice("collective", collective, KINDS)
    cluster = Cluster() if cluster is None else cluster
    network = Network() if network is None else network
    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster: expected a sgd_shm.sim.Cluster, got {type(cluster).__name__}")
    if not isinstance(network, Network):
        raise TypeError(f"network: expected a sgd_shm.sim.Network, got {type(network).__name__}")
    cluster.check_workers(n_workers)
    epochs, max_seconds = stopping_rule(epochs, max_seconds, check_positive)
    seed = _seed(seed)
    cfg = _Config(
        n_workers=n_workers, policy=None, collective=collective,
        lr=_step(lr, collective),
        batch_size=check_int("batch_size", batch_size),
        n_shards=None if n_shards is None else check_int("n_shards", n_shards),
        epochs=epochs, max_seconds=max_seconds,
        target_loss=None if target_loss is None else check_number("target_loss", target_loss),
        cluster=cluster, network=network, compress=_compressor(compress), drop=None, seed=seed,
        late=check_choice("late", late, LATE), average=check_choice("average", average, AVERAGE),
        depth=check_int("depth", depth), faults=_faults(faults, n_workers, collective),
        sample_every=None if sample_every is None else check_positive("sample_every",
                                                                      sample_every),
        loss_seed=seed)
    cfg.step_times = StepTimes(cluster, n_workers, seed)
    if collective is None:
        pol = policy if policy is not None else "asp"
        if window is None and pol == "saps":
            window = 4 * _slowest_step(cfg)           # the simulator's default: its own scale
        cfg.policy = make_policy(pol, staleness=staleness, window=window,
                                 detect_factor=detect_factor).bind(n_workers)
        cfg.drop = check_drop(drop, cfg.policy, cfg.compress)
        _no_collective_settings(pol, cfg)
    else:
        _no_server_settings(collective, drop, staleness, window, detect_factor)
        if n_shards is not None:
            warn_caller(f"n_shards: the parameter server's shards, which collective="
                        f"{collective!r} does not use, so n_shards={n_shards!r} is ignored")
    return cfg


def _no_collective_settings(policy, cfg):
    """A parameter-server run warns of the collectives' settings it ignores (given
    other than their defaults), as a collective's run warns of the server's."""
    for name, default in (("late", "carry"), ("average", "size"), ("depth", 8)):
        v = getattr(cfg, name)
        if v != default:
            warn_caller(f"{name}: a setting of the eager collectives, which policy={policy!r} "
                        f"does not use, so {name}={v!r} is ignored")


def _no_server_settings(collective, drop, staleness, window, detect_factor):
    """A collective's run refuses message loss (its rounds lose none) and warns of the
    parameter server's settings, which it ignores (as ps.train warns of a policy's)."""
    if drop is not None:
        raise ValueError("drop: message loss is simulated for the parameter server ('asp' or "
                         "'rps'); a collective's rounds do not lose messages; leave drop=None")
    for name, v, owners in (("staleness", staleness, "'ssp' and 'saps'"),
                            ("window", window, "'saps'"), ("detect_factor", detect_factor,
                                                           "'saps'")):
        if v is not None:
            warn_caller(f"{name}: a setting of the parameter server's {owners}, which "
                        f"collective={collective!r} does not use, so {name}={v!r} is ignored")


def _replay(replay, cfg):
    if replay is None:
        return None
    from sgd_shm.sim.trace import Trace
    if isinstance(replay, PSTrace):
        return _exact_replay(replay, cfg)
    if isinstance(replay, EagerTrace):
        return _eager_replay(replay, cfg)
    if not isinstance(replay, Trace):
        raise TypeError(f"replay: expected the trace of a traced run (ps.train(..., "
                        f"trace=True).trace) or a sgd_shm.sim.trace.Trace "
                        f"(Recorder.trace(result)), got {type(replay).__name__}")
    if cfg.collective is not None or cfg.policy.replicated:
        raise ValueError("replay: a trace replays a gradient-pushing parameter-server run; "
                         "leave collective= and policy='rps' out")
    if replay.n_workers != cfg.n_workers:
        raise ValueError(f"replay: the trace holds {replay.n_workers} workers, the run has "
                         f"n_workers={cfg.n_workers}")
    return replay


def _exact_replay(trace, cfg):
    """A traced parameter-server run (:class:`sgd_shm.core.traces.PSTrace`) to replay
    exactly (:mod:`sgd_shm.sim.replay`)."""
    if cfg.collective is not None or cfg.policy.replicated:
        raise ValueError("replay: the trace of a parameter-server run replays a "
                         "gradient-pushing policy; leave collective= and policy='rps' out")
    if trace.n_workers != cfg.n_workers:
        raise ValueError(f"replay: the trace holds {trace.n_workers} workers, the run has "
                         f"n_workers={cfg.n_workers}")
    if cfg.compress is not None or cfg.drop is not None or cfg.faults:
        raise ValueError("replay: an exact replay runs the traced pushes dense, on reliable "
                         "links, without faults; leave compress=, drop= and faults= out")
    if trace.truncated:
        raise ValueError("replay: the trace was truncated (a worker decided more pushes than "
                         "its rows); record again with a larger trace=")
    return trace


def _eager_replay(trace, cfg):
    """A traced eager-SGD run (:class:`sgd_shm.core.traces.EagerTrace`) to replay
    exactly: the same collective, rules, seed and ranks."""
    want = {"collective": trace.collective, "late": trace.late, "average": trace.average,
            "seed": trace.seed, "n_workers": trace.n_workers, "momentum": trace.momentum}
    for name, v in want.items():
        if getattr(cfg, name) != v:
            raise ValueError(f"replay: the trace was recorded with {name}={v!r}, the run has "
                             f"{name}={getattr(cfg, name)!r}; pass {name}={v!r}")
    if cfg.compress is not None:
        raise ValueError("replay: an exact replay runs the traced rounds dense; leave "
                         "compress= out")
    return trace


def _step(lr, collective):
    """The step as a schedule (a number becomes a constant one): of the version a push
    pulled for the parameter server, of the round for a collective."""
    return make_schedule((0.5 if collective is None else 2.0) if lr is None else lr)


def _momentum(momentum, collective):
    m = check_momentum(momentum)
    if m and collective is None:
        raise ValueError(f"momentum: the parameter server applies each push as it comes "
                         f"(ps.train has no momentum), got momentum={m}; give a "
                         "collective= or leave momentum out")
    return m


def _seed(seed):
    if seed is None:
        return int(np.random.SeedSequence().generate_state(1)[0])
    return check_int("seed", seed, lo=0)


def _compressor(compress):
    if compress is None:
        return None
    from sgd_shm.compress import make_compressor
    return make_compressor(compress)


def _faults(faults, n_workers, collective):
    if not faults:
        return {}
    if collective is not None:
        raise ValueError("faults: simulated for the parameter server; leave faults=None "
                         "with a collective")
    return check_faults(faults, n_workers)


def _slowest_step(cfg):
    """Virtual seconds of the slowest worker's step at factor 1 of the transient
    spells, without its delay: compute and a dense pull and push."""
    c = cfg.cluster
    base = c.step_s * float(cfg.step_times.factors.max())
    if c.trace is not None:
        base = max(float(np.mean(t)) for t in c.trace)
    return base + 2 * cfg.network.message(0)


# ---- the problem ---------------------------------------------------------------------------
def _problem(X, y, model, cfg, eval_set):
    """The data, the evaluator and the partitions, drawn from the seed in the order
    ``ps.train`` draws them (the loss sample's rows, then the partitions, the initial
    weights, the queues' seeds and the workers' seeds), so that a simulated run and a
    real run of the same seed share their partitions."""
    X, yi, classes = model_data(X, y, model, cfg.n_workers)
    evals = check_eval_set(eval_set, model, classes)
    rng = np.random.default_rng(cfg.seed)
    n = X.shape[0]
    rows = np.sort(rng.choice(n, min(EVAL_ROWS, n), replace=False))
    prob = _Problem(model, model.prepare(X, yi), model.n_params, None,
                    Evaluator(model, X, yi, rows, evals), classes, n)
    if cfg.collective is None:
        cfg.n_shards = check_shards(cfg.n_shards, model.n_params)
        prob.batches = Batches.draw(n, cfg.n_workers, cfg.batch_size, rng)
        prob.init = initial_weights(model, rng)
        [int(rng.integers(2**31)) for _ in range(cfg.n_workers)]      # the queues' seeds
        prob.worker_seeds = rng.integers(0, 2**63 - 1, cfg.n_workers)
        if cfg.epochs is not None:
            cfg.budget = prob.batches.budget(cfg.epochs, cfg.policy.replicated)
    else:
        prob.init = initial_weights(model, np.random.default_rng(cfg.seed))
        cfg.budget = (eager_rounds(cfg.epochs, n, cfg.n_workers, cfg.batch_size)
                      if cfg.epochs is not None else 2**62)
    if cfg.sample_every is None:
        cfg.sample_every = _estimate(cfg, prob) / RECORDS
    return prob


def _estimate(cfg, prob):
    """A rough virtual duration of the run, for the default sampling period: the
    budget's steps spread over the workers at their mean step time, or the rounds at
    the slowest rank's."""
    c, net = cfg.cluster, cfg.network
    mean = c.step_s * float(np.mean(cfg.step_times.factors))
    if c.trace is not None:
        mean = float(np.mean([np.mean(t) for t in c.trace]))
    if c.delay is not None:
        mean += c.delay[1]
    if not math.isfinite(cfg.max_seconds) and cfg.budget is None:
        return 1.0
    if cfg.collective is None:
        step = mean + 2 * net.message(8 * prob.d)
        if cfg.budget is None:
            return cfg.max_seconds
        per = cfg.budget if cfg.policy.replicated else cfg.budget / cfg.n_workers
        est = per * step
    else:
        imb = c.imbalance[1] if c.imbalance else 0.0
        step = mean * float(np.max(cfg.step_times.factors)) / max(
            float(np.mean(cfg.step_times.factors)), 1e-300) + imb
        step += net.allreduce(8 * (prob.d + 1), cfg.n_workers)
        est = min(cfg.budget, 10**9) * step
    est = min(est, cfg.max_seconds) if math.isfinite(cfg.max_seconds) else est
    return max(est, 1e-9)


# ---- running and the result ------------------------------------------------------------------
def _run_ps(prob, cfg):
    from sgd_shm.sim._ps import LOG_FIELDS, PSSim, RPSSim
    if isinstance(cfg.replay, PSTrace):
        from sgd_shm.sim.replay import PSReplay
        kind = PSReplay
    else:
        kind = RPSSim if cfg.policy.replicated else PSSim
    sim = kind(prob, cfg).run()
    last = prob.evaluate(sim.w, final=True)
    sim.history.append({"seconds": sim.stop_t, "step": sim.state.version, **last})
    log = {f: [e[i] for e in sim.log] for i, f in enumerate(LOG_FIELDS)}
    workers = sim.workers()
    return SimResult(
        kind="ps", name=cfg.policy.name, history=sim.history, final_loss=last["loss"],
        seconds=sim.stop_t, n_workers=cfg.n_workers, time_to_target=sim.t_target,
        workers=workers, staleness_hist=sim.hist.tolist(), detections=sim.detections,
        events=sim.events, killed=sim.killed, log=log,
        bytes_sent=sum(w["bytes_sent"] for w in workers),
        bytes_dense=sum(w["bytes_dense"] for w in workers),
        compress=None if cfg.compress is None else repr(cfg.compress), drop=cfg.drop,
        cluster=repr(cfg.cluster), network=repr(cfg.network), coef_=sim.w.copy(),
        classes_=prob.classes, model=prob.model, val_loss=last.get("val_loss"),
        val_score=last.get("val_score"), batches=prob.batches,
        replay=sim.record_replay() if hasattr(sim, "record_replay") else None)


def _run_collective(prob, cfg):
    from sgd_shm.sim._eager import ROUND_FIELDS, EagerSim
    kind = EagerSim
    if cfg.replay is not None:
        from sgd_shm.sim.replay import eager_replay_class
        kind = eager_replay_class()
    sim = kind(prob, cfg).run()
    rounds = sim.n_rounds()
    last = prob.evaluate(sim.w, final=True)
    sim.history.append({"seconds": sim.seconds, "step": rounds, **last})
    log = {f: [e[i] for e in sim.log] for i, f in enumerate(ROUND_FIELDS)}
    log["skips"] = sim.skips
    return SimResult(
        kind="collective", name=cfg.collective, history=sim.history, final_loss=last["loss"],
        seconds=sim.seconds, n_workers=cfg.n_workers, time_to_target=sim.t_target,
        log=log, rounds=rounds, participation=sim.participation(),
        late=sim.late.tolist(), skipped=sim.skipped.tolist(),
        mean_contributors=float(np.mean([len(c) for c in log["contributors"]] or [0])),
        bytes_sent=sim.bytes_sent, bytes_dense=sim.bytes_dense,
        compress=None if cfg.compress is None else repr(cfg.compress),
        cluster=repr(cfg.cluster), network=repr(cfg.network), coef_=sim.w.copy(),
        classes_=prob.classes, model=prob.model, val_loss=last.get("val_loss"),
        val_score=last.get("val_score"),
        replay=sim.record_replay() if hasattr(sim, "record_replay") else None)
