"""sgd_shm.ps: the multi-process parameter server's building blocks.

    ParameterStore   sharded weights, per-shard versions and locks, a global version
                     and per-worker slots in one shared-memory segment (pull / push)
    WaitPolicy       spin, yield, then defer a push on a locked shard
    PushResult       what a push applied and what it deferred
    train            BSP / ASP / SSP / SaPS training with worker processes, minibatch
                     stealing through MultiQueues, checkpoints and resume
    load_checkpoint  read a checkpoint written by train
    plot_losses      loss against time and updates, staleness histograms, detections

``python -m sgd_shm`` (the kit's main job) runs all four policies on an embedded
default with worker 0 slowed 4x.
"""
from sgd_shm.ps.store import ParameterStore, PushResult, WaitPolicy
from sgd_shm.ps.train import TrainResult, load_checkpoint, plot_losses, train

__all__ = ["ParameterStore", "PushResult", "WaitPolicy", "train", "TrainResult",
           "load_checkpoint", "plot_losses"]
