"""What the trainers that return a plain linear model share: the input checks of a
binary problem and the model's methods (decision function, predict, score) on the
result object."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp


class LinearModel:
    """Methods of a result that carries ``coef_`` (no intercept), ``classes_`` and a
    ``history`` of dicts with ``seconds`` and ``loss``."""

    def time_to(self, target) -> float | None:
        """Seconds of the first sample whose loss is <= target (None: not reached)."""
        return next((h["seconds"] for h in self.history if h["loss"] <= target), None)

    def decision_function(self, X) -> np.ndarray:
        """X @ coef_ (the model has no intercept)."""
        X = sp.csr_matrix(X) if sp.issparse(X) else np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.coef_.shape[0]:
            raise ValueError(f"X: expected a 2-D matrix with {self.coef_.shape[0]} features, "
                             f"got shape {X.shape}")
        return np.asarray(X @ self.coef_).ravel()

    def predict(self, X) -> np.ndarray:
        """The second class where the decision function is > 0, else the first."""
        return np.where(self.decision_function(X) > 0, self.classes_[1], self.classes_[0])

    def score(self, X, y) -> float:
        """Accuracy of :meth:`predict` on (X, y)."""
        return float(np.mean(self.predict(X) == np.asarray(y)))


def binary_data(X, y, n_workers):
    """(X as float64 CSR or C-contiguous dense, y as +-1, the two classes), checked:
    2-D, finite, two classes, as many labels as rows, a row per worker at least."""
    X = sp.csr_matrix(X, dtype=np.float64) if sp.issparse(X) else \
        np.ascontiguousarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X: expected a 2-D matrix, got {X.ndim} dimensions")
    if not np.isfinite(X.data if sp.issparse(X) else X).all():
        raise ValueError("X: contains NaN or inf; clean or impute the data first")
    y = np.asarray(y)
    classes = np.unique(y)
    if classes.size != 2:
        raise ValueError(f"y: expected two classes, got {classes.size} ({classes[:5].tolist()})")
    ys = np.where(y == classes[1], 1.0, -1.0)
    if X.shape[0] != ys.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {ys.shape[0]}")
    if X.shape[0] < n_workers:
        raise ValueError(f"n_workers: X has only {X.shape[0]} rows, fewer than the {n_workers} "
                         "workers (each needs a partition); use fewer workers")
    return X, ys, classes
