"""sgd_shm.ps: a parameter server with straggler-aware policies, on shared memory, Ray or
threads (the transports of sgd_shm.ps.transport, over one sgd_shm.ps.server state).

    train            train a linear model, or any sgd_shm.models.Model (model=, with
                     partition="blocks"), with worker processes (shm) or Ray actors
    TrainResult      the trained model (coef_, predict, score) and the run's record
    ParameterServerClassifier   the same as a scikit-learn classifier
    Policy           the asynchronous policy and the base class of every policy;
    BSP, SSP, SaPS   its synchronous, stale-synchronous and straggler-aware variants
    RPS              model averaging over unreliable links (train(policy="rps",
                     drop=p, n_shards=S): the Robust Parameter Server, Yu et al. 2019)
    ParameterStore   sharded weights, per-shard versions and locks, a global version
                     and per-worker slots in one shared-memory segment (pull / push)
    WaitPolicy       spin, yield, then defer a push on a locked shard
    Schedule, StepDecay, Cosine   step-size schedules (train(lr=...)): the step of a
                     push at the version its worker pulled
    PushResult       what a push applied and what it deferred
    load_checkpoint  read a checkpoint written by train (either backend)
    plot_losses, curves_of   loss against time and updates, staleness, detections

The parts: config, partitions, policies, worker, coordinator, checkpoint, plots, server
(the server's state every transport uses), and the transports (transport: the Link
protocol; shm_backend, ray_backend, threads_backend; Ray is imported only for
backend="ray").
``python -m sgd_shm`` (the kit's main job) runs all four policies on an embedded
default with worker 0 slowed 4x.
"""
from sgd_shm.ps.checkpoint import load_checkpoint, save_checkpoint
from sgd_shm.ps.plots import curves_of, plot_losses
from sgd_shm.core.policies import ASP, BSP, POLICIES, RPS, SSP, Policy, SaPS
from sgd_shm.core.schedules import Cosine, Schedule, StepDecay
from sgd_shm.ps.store import ParameterStore, PushResult, WaitPolicy
from sgd_shm.ps.ray_session import RaySession
from sgd_shm.ps.trainer import TrainResult, train


def __getattr__(name):
    """ParameterServerClassifier on first use: it imports scikit-learn, which the
    workers (processes, Ray actors) that import this package never need."""
    if name != "ParameterServerClassifier":
        raise AttributeError(f"module 'sgd_shm.ps' has no attribute {name!r}")
    from sgd_shm.ps.estimator import ParameterServerClassifier
    globals()[name] = ParameterServerClassifier
    return ParameterServerClassifier


__all__ = ["train", "TrainResult", "ParameterServerClassifier", "Policy", "ASP", "BSP",
           "SSP", "SaPS", "RPS", "POLICIES", "RaySession", "Schedule", "StepDecay", "Cosine",
           "ParameterStore", "PushResult", "WaitPolicy", "load_checkpoint",
           "save_checkpoint", "plot_losses", "curves_of"]
