"""The validated configuration of a parameter-server run.

:func:`make_config` checks every argument of :func:`sgd_shm.ps.train` and raises a
``ValueError`` or ``TypeError`` naming the argument, the rule and the fix; the rest of
the server trusts the :class:`TrainConfig` it returns.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import numpy as np

from sgd_shm.core.imbalance import PROFILES, factors_of, transient_of  # noqa: F401 (exported)
from sgd_shm.core.launcher import check_start_method
from sgd_shm.core.model import Model
from sgd_shm.core.validation import (check_bool, check_callbacks, check_drop, check_faults,
                                     check_int, check_number, check_positive, check_seed,
                                     model_dtype, resolve_workers, stopping_rule)
from sgd_shm.core.policies import Policy, make_policy
from sgd_shm.core.schedules import Schedule, make_schedule
from sgd_shm.ps.store import CLOCKS, WaitPolicy
from sgd_shm.ps.transport import TRANSPORTS

BACKENDS = TRANSPORTS                   # "shm", "ray", "threads"
PARTITIONS = (None, "blocks")


@dataclass(frozen=True)
class TrainConfig:
    n_workers: int
    policy: Policy
    factors: np.ndarray                 # compute-time stretch per worker
    max_seconds: float
    target_loss: float | None
    lr: Schedule                        # the step of a push at the version it pulled
    batch_size: int
    n_shards: int | None              # None: check_shards picks
    sample_every: float
    transient: tuple | None
    faults: dict = field(default_factory=dict)
    checkpoint: str | None = None
    checkpoint_every: float = 5.0
    resume: str | None = None
    wait: WaitPolicy = field(default_factory=WaitPolicy)
    seed: object = None
    progress: bool = False
    backend: str = "shm"
    address: str | None = None
    session: object = None              # a caller's ray_session.RaySession (backend "ray")
    compress: object = None             # a sgd_shm.compress compressor; None: dense
    epochs: int | None = None           # work budget: epochs * (total minibatches)
    drop: float | None = None           # message loss probability; None: reliable links
    start_method: str = "fork"          # how the shm backend starts its worker processes
    model: Model = None                 # the model trained (sgd_shm.models.Linear by default)
    partition: str | None = None        # "blocks": each worker pushes only its own blocks
    callbacks: tuple = ()               # called with each history record; True stops
    clock: str = "exact"                # the global version: "exact" or "multicounter"
    trace: int = 0                      # steps recorded per worker (0: no trace)

    @property
    def lossy(self) -> bool:
        """True when messages are emulated as lossy (``drop`` given, or RPS)."""
        return self.drop is not None


def _checkpoint_path(checkpoint):
    if checkpoint is None:
        return None
    path = os.fspath(checkpoint)
    if not path:                                  # (failed at the first write, after training)
        raise ValueError("checkpoint: an empty path; give a file path, e.g. 'run.ckpt'")
    if os.path.isdir(path):
        raise ValueError(f"checkpoint: {path!r} is a folder; give a file path in it, e.g. "
                         f"{os.path.join(path, 'run.ckpt')!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"checkpoint: folder {folder!r} does not exist; create it first")
    return path


def _compress(compress):
    """None (dense pushes, the plain path) or a compressor of :mod:`sgd_shm.compress`."""
    if compress is None:
        return None
    from sgd_shm.compress import make_compressor
    try:
        comp = make_compressor(compress)
    except (ValueError, TypeError) as e:
        if str(e).startswith("compress"):
            raise
        raise type(e)(f"compress: {e}") from None
    return comp


def _wait(wait):
    if wait is None:
        return WaitPolicy()
    if not isinstance(wait, WaitPolicy):
        raise TypeError(f"wait: expected a sgd_shm.ps.WaitPolicy, got {type(wait).__name__}")
    return wait


def make_config(*, n_workers, policy, slowdown, max_seconds, target_loss, lr, batch_size,
                staleness, n_shards, sample_every, window, detect_factor, transient, faults,
                checkpoint, checkpoint_every, resume, wait, seed, progress, backend, address,
                compress, epochs, drop, start_method, model, partition,
                callbacks, session=None, clock="exact", trace=False) -> TrainConfig:
    """A :class:`TrainConfig` from :func:`sgd_shm.ps.train`'s arguments (``model``
    already made: the trainer builds the default linear model from ``loss`` and
    ``alpha``)."""
    n_workers = resolve_workers(n_workers)
    pol = make_policy(policy, staleness=staleness, window=window, detect_factor=detect_factor)
    _model(model, partition, pol, compress, drop)
    if backend not in BACKENDS:
        raise ValueError(f"backend: must be one of {BACKENDS} (worker processes on shared "
                         f"memory, Ray actors, threads of this process), got {backend!r}")
    if address is not None and backend != "ray":
        raise ValueError(f"address: joins a Ray cluster, so it needs backend='ray' "
                         f"(got backend={backend!r})")
    _start_method(start_method, backend)
    _ray_args(backend, address, session, wait, pol, drop)
    epochs, max_seconds = stopping_rule(epochs, max_seconds, check_int)
    return TrainConfig(
        n_workers=n_workers, policy=pol.bind(n_workers),
        factors=factors_of(slowdown, n_workers),
        max_seconds=max_seconds,
        target_loss=None if target_loss is None else check_number("target_loss", target_loss),
        lr=make_schedule(lr), batch_size=check_int("batch_size", batch_size),
        n_shards=None if n_shards is None else check_int("n_shards", n_shards),
        sample_every=check_positive("sample_every", sample_every),
        transient=transient_of(transient), faults=check_faults(faults, n_workers),
        checkpoint=_checkpoint_path(checkpoint),
        checkpoint_every=check_positive("checkpoint_every", checkpoint_every),
        resume=None if resume is None else os.fspath(resume), wait=_wait(wait),
        seed=check_seed("seed", seed), progress=_progress(progress), backend=backend,
        address=address, session=session, compress=_compress(compress),
        epochs=epochs,
        drop=check_drop(drop, pol, compress), start_method=start_method, model=model,
        partition=partition, callbacks=check_callbacks(callbacks), clock=_clock(clock),
        trace=_trace(trace, backend, pol, clock))


#: steps recorded per worker by ``train(trace=True)`` (``trace=n`` sets another number)
TRACE_STEPS = 1 << 15


def _trace(trace, backend, pol, clock):
    """Steps to record per worker (0: none): True records :data:`TRACE_STEPS`, an int
    that many. A trace needs the pushes' order, so the exact clock on a transport whose
    store counts the pushes in this box's memory (shm, threads), and pushes (not RPS's
    rounds)."""
    if trace is None or trace is False:
        return 0
    if trace is True:
        n = TRACE_STEPS
    elif isinstance(trace, (int, np.integer)) and not isinstance(trace, bool) and trace > 0:
        n = int(trace)
    else:
        raise ValueError(f"trace: expected True, False or the number of steps to record per "
                         f"worker (an int > 0), got {trace!r}")
    if backend == "ray":
        raise ValueError("trace: a trace is recorded on backend 'shm' or 'threads'; on Ray "
                         "the store and the workers' clocks live on other processes and nodes, "
                         "whose pushes have no common order to record; use backend='shm'")
    if pol.replicated:
        raise ValueError(f"trace: policy {pol.name!r} averages replicas in rounds; a trace "
                         "records the pushes of a gradient-pushing policy (bsp, asp, ssp, saps)")
    if clock != "exact":
        raise ValueError('trace: records the version each push was applied at, which only '
                         'the exact clock orders; use clock="exact"')
    return n


def _clock(clock):
    """The store's global version clock: "exact" (one atomic word) or "multicounter"
    (relaxed, see :mod:`sgd_shm.ps.store`)."""
    if not isinstance(clock, str) or clock not in CLOCKS:
        raise ValueError(f'clock: must be "exact" or "multicounter", got {clock!r}')
    return clock


def _model(model, partition, pol, compress, drop):
    """Check ``model`` (a :class:`sgd_shm.models.Model`) and ``partition`` (None or
    "blocks": a model's blocks, one set per worker, pushed alone)."""
    if not isinstance(model, Model):
        raise TypeError(f"model: expected a sgd_shm.models.Model (e.g. MLP(n_features, "
                        f"(64,), n_outputs)), got {type(model).__name__}; leave model=None "
                        "for the linear model")
    model_dtype(model)                        # float32 or float64: every buffer's type
    if not any(partition is p or (isinstance(partition, str) and partition == p)
               for p in PARTITIONS):
        raise ValueError(f"partition: must be one of {PARTITIONS}, got {partition!r}")
    if partition is None:
        return
    for name, bad, why in (("compress", compress is not None, "a block is pushed whole"),
                           ("drop", drop is not None, "a block's push is not split by server"),
                           ("policy", pol.replicated, f"policy {pol.name!r} averages whole "
                            "replicas")):
        if bad:
            raise ValueError(f"{name}: not available with partition='blocks' ({why}); "
                             f"leave partition=None or drop the {name} option")


def _ray_args(backend, address, session, wait, pol, drop):
    """``session`` (a caller's RaySession) needs backend "ray" and carries its own
    address; ``wait`` is honoured on Ray only by the node-local stores, not by model
    averaging or lossy links (whose servers are actors: nothing waits on a lock)."""
    if session is not None:
        from sgd_shm.ps.ray_session import RaySession
        if not isinstance(session, RaySession):
            raise TypeError(f"session: expected a sgd_shm.ps.RaySession, got "
                            f"{type(session).__name__}")
        if backend != "ray" or address is not None:
            raise ValueError("session: a RaySession needs backend='ray' and no address= "
                             "(the session holds the connection; give the address to "
                             "RaySession(address=...))")
        if session.closed:
            raise ValueError("session: this RaySession is closed (its with-block ended, or "
                             "close() was called); make a new one, or run inside its with")
    if wait is not None and backend == "ray" and (pol.replicated or drop is not None):
        raise ValueError("wait: on Ray, policy 'rps' and drop= run their servers as actors "
                         "that apply one message at a time, so no push waits on a lock; "
                         "leave wait=None there (wait applies to the shm and threads "
                         "backends and to Ray's node-local stores)")


def _start_method(start_method, backend):
    """Check the start method: "fork", "spawn" or "forkserver" (see
    :mod:`sgd_shm.ps.shm_backend`); only the shm backend starts processes of its own."""
    check_start_method(start_method)
    if start_method != "fork" and backend != "shm":
        raise ValueError(f"start_method: {start_method!r} applies to backend='shm' (its "
                         f"worker processes); Ray starts its own actors (got "
                         f"backend={backend!r}); leave start_method='fork' with Ray")


def _progress(progress):
    if progress is None:
        return sys.stderr.isatty()
    return check_bool("progress", progress)
