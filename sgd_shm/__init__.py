"""sgd_shm: lock-free shared-memory SGD built on the ``relaxed`` structures.

Estimators (scikit-learn API):

    HogwildClassifier   linear classifier (hinge / log_loss / modified_huber), binary and one-vs-rest
    HogwildRegressor    linear regressor (squared error)
    MatrixFactorization biased matrix factorization of a ratings matrix (Netflix-style)
    HogwildMLPClassifier multi-layer perceptron, optionally block-partitioned (models: sgd_shm.models)

Engine:

    hogwild.Problem     training data laid out for the kernels (CSR or dense)
    hogwild.HogwildSGD  weights + schedule; ``epoch()`` runs n_workers lock-free threads
    DivergenceError     raised instead of returning NaN weights
    WorkerError         a worker process of a fit raised or died

Subpackages: ``sgd_shm.ps`` (parameter server on shared memory or Ray),
``sgd_shm.collectives`` (allreduce, solo and majority allreduce on shared memory or MPI),
``sgd_shm.eager`` (data-parallel SGD over those collectives), ``sgd_shm.compress``
(gradient compressors with error feedback), ``sgd_shm.sim`` (the same policies,
collectives and compressors in virtual time at 16-1,024 workers: ``simulate``,
``Cluster``, ``Network``), ``sgd_shm.calibrate`` (the simulator's compute model fitted
to short real runs), ``sgd_shm.torch`` (optional, the ``torch`` extra: PyTorch models on
every trainer, Hogwild on an ``nn.Module``, DDP communication hooks), ``sgd_shm.data``.

Example::

    from sgd_shm import HogwildClassifier
    clf = HogwildClassifier(loss="log_loss", n_workers=2, random_state=0).fit(X, y)
"""
import importlib as _importlib
import logging as _logging

from relaxed import __version__

# a library configures no logging: the application decides what its loggers show
_logging.getLogger(__name__).addHandler(_logging.NullHandler())

#: the estimators, imported on first use (PEP 562): scikit-learn, which they build on,
#: takes about as long to import as the rest of the kit, and a worker process (spawned,
#: a Ray actor, an MPI rank) that imports only the engine never needs it
_LAZY = {"HogwildClassifier": "sgd_shm.hogwild.estimators",
         "HogwildRegressor": "sgd_shm.hogwild.estimators",
         "DivergenceError": "sgd_shm.core.errors", "WorkerError": "sgd_shm.core.errors",
         "MatrixFactorization": "sgd_shm.hogwild.mf",
         "HogwildMLPClassifier": "sgd_shm.hogwild.mlp"}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'sgd_shm' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["__version__", "HogwildClassifier", "HogwildRegressor", "MatrixFactorization", "DivergenceError",
           "WorkerError", "HogwildMLPClassifier"]
