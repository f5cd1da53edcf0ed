"""Collectives without a server: allreduce and the partial collectives of eager-SGD
(solo and majority allreduce) over shared memory or MPI, one API.

* :class:`~sgd_shm.collectives.shm.ShmGroup`: processes on one box combine buffers
  through one shared segment (reduce-scatter, then every rank reads the result).
* :class:`~sgd_shm.collectives.mpi.MPICommunicator`: ranks under ``mpiexec`` (mpi4py),
  with a progress thread per rank, for one box or several. Needs the ``mpi`` extra;
  ``import sgd_shm.collectives`` works without it.

Both give :class:`~sgd_shm.collectives.base.Communicator` objects: ``allreduce``,
``solo_allreduce``, ``majority_allreduce`` (in place, returning a :class:`Round`),
``start`` / ``Request.test`` / ``Request.wait``, a late-gradient policy (``late=``
"drop" | "carry") and an averaging rule (``average=`` "size" | "contributors").
See docs/collectives.md.
"""
from sgd_shm.collectives.base import (AVERAGE, KINDS, LATE, OPS, CollectiveError,
                                      CollectiveTimeout, Communicator, RankFailure,
                                      Request, Round, initiator, mask_ranks)

__all__ = ["Communicator", "Round", "Request", "CollectiveError", "RankFailure",
           "CollectiveTimeout", "initiator", "mask_ranks", "KINDS", "LATE", "AVERAGE",
           "OPS", "ShmGroup", "MPICommunicator"]


def __getattr__(name):
    # the backends load on first use: MPICommunicator imports mpi4py
    if name == "ShmGroup":
        from sgd_shm.collectives.shm import ShmGroup
        return ShmGroup
    if name == "MPICommunicator":
        from sgd_shm.collectives.mpi import MPICommunicator
        return MPICommunicator
    raise AttributeError(f"module 'sgd_shm.collectives' has no attribute {name!r}")
