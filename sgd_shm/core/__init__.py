"""sgd_shm.core: what every trainer of the kit shares, and imports; it imports none of
them (the import graph is trainers -> core).

    model        the Model contract every trainer trains through; one_blas_thread
    results      Result: the family of trainer results (history records, final_loss,
                 time_to_target, held-out score, to_dict, predictions through the model)
    validation   the argument and data checks (one rule per kind of argument)
    errors       DivergenceError (a FloatingPointError), ParameterError (a TypeError)
    launcher     worker processes on shared memory (start methods, shipments, reaping)
    atomics      Numba intrinsics: atomics, fences, prefetches, the cache-line constant
    progress     the trainers' progress bar (seconds against the time limit, if any)
    schedules    step-size schedules of the parameter server (StepDecay, Cosine)
"""
from sgd_shm.core.errors import DivergenceError, ParameterError
from sgd_shm.core.model import Model, one_blas_thread

__all__ = ["Model", "one_blas_thread", "DivergenceError", "ParameterError"]
