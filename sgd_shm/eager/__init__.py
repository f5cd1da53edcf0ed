"""eager-SGD: data-parallel SGD over partial collectives (solo and majority allreduce),
beside synchronous allreduce, on shared memory or MPI.

    train        train a linear model, or any sgd_shm.models.Model (model=); returns
                 an EagerResult (model + record)
    EagerResult  coef_, predict, score; history, final_loss, time_to_target,
                 participation per rank
    sleepers     the ranks the shared-seed imbalance draw puts to sleep in a round
    Schedule, StepDecay, Cosine   step-size schedules (train(lr=...)): the step of
                 round r

``python -m sgd_shm eager`` compares sync, solo and majority on an embedded problem;
``mpiexec -n 4 python -m sgd_shm eager --backend mpi`` does it on MPI. See
docs/eager.md.
"""
from sgd_shm.core.schedules import Cosine, Schedule, StepDecay
from sgd_shm.eager.trainer import EagerResult, sleepers, train

__all__ = ["train", "EagerResult", "sleepers", "Schedule", "StepDecay", "Cosine"]
