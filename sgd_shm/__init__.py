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

Subpackages: ``sgd_shm.ps`` (parameter server on shared memory or Ray),
``sgd_shm.collectives`` (allreduce, solo and majority allreduce on shared memory or MPI),
``sgd_shm.eager`` (data-parallel SGD over those collectives), ``sgd_shm.compress``
(gradient compressors with error feedback), ``sgd_shm.data``.

Example::

    from sgd_shm import HogwildClassifier
    clf = HogwildClassifier(loss="log_loss", n_workers=2, random_state=0).fit(X, y)
"""
from relaxed import __version__
from sgd_shm.estimators import HogwildClassifier, HogwildRegressor
from sgd_shm.hogwild import DivergenceError
from sgd_shm.mf import MatrixFactorization
from sgd_shm.mlp import HogwildMLPClassifier

__all__ = ["__version__", "HogwildClassifier", "HogwildRegressor", "MatrixFactorization", "DivergenceError",
           "HogwildMLPClassifier"]
