"""A scikit-learn classifier trained on the parameter server.

``ParameterServerClassifier(policy="saps", backend="shm", ...).fit(X, y)`` runs
:func:`sgd_shm.ps.train` and keeps its result: a binary linear classifier (no
intercept) with ``coef_``, ``classes_``, ``decision_function``, ``predict`` and
``score``, usable in pipelines and grid searches. The run's record is ``result_``.

Example::

    from sgd_shm.ps import ParameterServerClassifier
    clf = ParameterServerClassifier(n_workers=2, max_seconds=1.0, random_state=0)
    clf.fit(X_train, y_train).score(X_test, y_test)
"""
from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from sgd_shm.core.batches import Batches
from sgd_shm.ps.trainer import train

__all__ = ["ParameterServerClassifier"]


class ParameterServerClassifier(ClassifierMixin, BaseEstimator):
    """Binary linear classifier trained by :func:`sgd_shm.ps.train`; the parameters
    are ``train``'s (``random_state`` is its ``seed``). ``fit`` runs ``max_iter``
    epochs (passes over the data, the run's work budget), so a fit does not depend
    on the machine's load; with one worker and a fixed ``random_state`` two fits give
    the same model. ``max_seconds`` (None: no limit) and ``target_loss`` stop it
    earlier. ``start_method`` ("fork", "spawn", "forkserver") is how backend "shm"
    starts its workers (see :func:`sgd_shm.ps.train`)."""

    def __init__(self, *, loss="log_loss", policy="saps", n_workers=2, backend="shm",
                 address=None, max_iter=5, max_seconds=None, target_loss=None, lr=0.5,
                 alpha=1e-4, batch_size=64, staleness=None, n_shards=None, slowdown=None,
                 start_method="fork", random_state=None):
        self.loss = loss
        self.policy = policy
        self.n_workers = n_workers
        self.backend = backend
        self.address = address
        self.max_iter = max_iter
        self.max_seconds = max_seconds
        self.target_loss = target_loss
        self.lr = lr
        self.alpha = alpha
        self.batch_size = batch_size
        self.staleness = staleness
        self.n_shards = n_shards
        self.slowdown = slowdown
        self.start_method = start_method
        self.random_state = random_state

    def fit(self, X, y, *, eval_set=None):
        """Train (see the class notes). ``eval_set=(X_val, y_val)``: held-out data whose
        loss and accuracy every record of ``history_`` (the run's history) carries."""
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64)
        params = self.get_params()
        seed = params.pop("random_state")
        params["epochs"] = params.pop("max_iter")
        self.result_ = train(X, y, seed=seed, progress=False, eval_set=eval_set, **params)
        self.history_ = self.result_.history
        self.coef_ = self.result_.coef_[None, :]
        self.intercept_ = np.zeros(1)
        self.classes_ = self.result_.classes_
        # passes over the data made: fewer than max_iter where max_seconds or target_loss
        # stopped the run
        per_pass = Batches.per_pass(X.shape[0], len(self.result_.workers), self.batch_size)
        self.n_iter_ = int(sum(self.result_.batches["applied"]) // per_pass)
        return self

    def decision_function(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)
        return np.asarray(X @ self.coef_[0]).ravel()

    def predict(self, X):
        return np.where(self.decision_function(X) > 0, self.classes_[1], self.classes_[0])

