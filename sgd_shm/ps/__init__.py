"""sgd_shm.ps: the multi-process parameter server's building blocks.

    ParameterStore   sharded weights, per-shard versions and locks, a global version
                     and per-worker slots in one shared-memory segment (pull / push)
    WaitPolicy       spin, yield, then defer a push on a locked shard
    PushResult       what a push applied and what it deferred
    train            BSP / ASP / SSP / SaPS training with worker processes (first version)

The training driver with the BSP/ASP/SSP/SaPS policies builds on these (issue 5,
in progress).
"""
from sgd_shm.ps.store import ParameterStore, PushResult, WaitPolicy
from sgd_shm.ps.train import TrainResult, train

__all__ = ["ParameterStore", "PushResult", "WaitPolicy", "train", "TrainResult"]
