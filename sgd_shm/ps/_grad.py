"""Minibatch gradient and loss kernels of the parameter server (Numba, nogil), built
on the Hogwild kernels' loss derivatives, and the input checks of a run of a
:class:`sgd_shm.models.Model` (whose gradient is the model's own)."""
from __future__ import annotations

import numba as nb
import numpy as np
import scipy.sparse as sp

from sgd_shm import _kernels as K
from sgd_shm._linear import LinearModel

@nb.njit(cache=True, nogil=True, inline="always")
def _row_dot(indptr, indices, data, Xd, r, w):
    """x_r . w for a CSR row (indptr has entries) or a row of the dense Xd."""
    p = 0.0
    if indptr.size > 0:
        for jj in range(indptr[r], indptr[r + 1]):
            p += data[jj] * w[indices[jj]]
    else:
        for j in range(w.size):
            p += Xd[r, j] * w[j]
    return p


@nb.njit(cache=True, nogil=True)
def batch_grad(loss, indptr, indices, data, Xd, ys, rows, w, alpha, g):
    """g = mean over rows of dloss(x.w, y) x + alpha w. CSR when indptr has
    entries, else the dense Xd."""
    for i in range(w.size):
        g[i] = alpha * w[i]
    inv = 1.0 / rows.size
    sparse = indptr.size > 0
    for r in rows:
        p = _row_dot(indptr, indices, data, Xd, r, w)
        d = min(max(K._dloss(loss, p, ys[r]), -K.MAX_DLOSS), K.MAX_DLOSS) * inv
        if sparse:
            for jj in range(indptr[r], indptr[r + 1]):
                g[indices[jj]] += d * data[jj]
        else:
            for j in range(w.size):
                g[j] += d * Xd[r, j]


@nb.njit(cache=True, nogil=True)
def mean_loss(loss, indptr, indices, data, Xd, ys, w, alpha):
    n = ys.size
    tot = 0.0
    for r in range(n):
        tot += K._loss(loss, _row_dot(indptr, indices, data, Xd, r, w), ys[r])
    return tot / n + 0.5 * alpha * (w @ w)


def matrix_parts(X):
    """(indptr, indices, data, Xd) for the kernels: CSR arrays or the dense matrix."""
    if sp.issparse(X):
        e = np.empty((0, 0))
        return (X.indptr.astype(np.int64), X.indices.astype(np.int64),
                X.data.astype(np.float64), e)
    z = np.empty(0, np.int64)
    return z, z, np.empty(0), X


def model_data(X, y, model, n_workers):
    """(X as float64 CSR or C-contiguous dense, y as class indices 0..C-1, the C
    classes) for a run of ``model`` (a :class:`sgd_shm.models.Model`), checked: 2-D,
    finite, the model's n_features, as many classes as its n_outputs, as many labels
    as rows, a row per worker at least."""
    X = sp.csr_matrix(X, dtype=np.float64) if sp.issparse(X) else \
        np.ascontiguousarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X: expected a 2-D matrix, got {X.ndim} dimensions")
    if X.shape[1] != model.n_features:
        raise ValueError(f"model: built for n_features={model.n_features}, but X has "
                         f"{X.shape[1]} features; make the model with n_features=X.shape[1]")
    if not np.isfinite(X.data if sp.issparse(X) else X).all():
        raise ValueError("X: contains NaN or inf; clean or impute the data first")
    y = np.asarray(y)
    if y.shape != (X.shape[0],):
        raise ValueError(f"X has {X.shape[0]} rows but y has shape {y.shape}")
    classes, idx = np.unique(y, return_inverse=True)
    if classes.size != model.n_outputs:
        raise ValueError(f"model: has n_outputs={model.n_outputs} but y has {classes.size} "
                         f"classes; make the model with n_outputs={classes.size}")
    if X.shape[0] < n_workers:
        raise ValueError(f"n_workers: X has only {X.shape[0]} rows, fewer than the {n_workers} "
                         "workers (each needs a partition); use fewer workers")
    return X, idx.astype(np.int64).ravel(), classes


def model_X(X, model):
    """X for ``model``'s predictions: float64 CSR or dense, with its n_features."""
    X = sp.csr_matrix(X, dtype=np.float64) if sp.issparse(X) else np.asarray(X, np.float64)
    if X.ndim != 2 or X.shape[1] != model.n_features:
        raise ValueError(f"X: expected a 2-D matrix with {model.n_features} features, got "
                         f"shape {X.shape}")
    return X


class ModelResult(LinearModel):
    """The predictions of a trainer's result: the linear model's (``coef_``), or with
    a ``model`` (a :class:`sgd_shm.models.Model`) the model's on its flat weights
    ``coef_``, mapped to ``classes_`` (multiclass)."""

    model = None

    def decision_function(self, X) -> np.ndarray:
        """The linear model's X @ coef_, or the model's scores (n_samples, classes)."""
        if self.model is None:
            return super().decision_function(X)
        return self.model.decision_function(self.coef_, model_X(X, self.model))

    def predict_proba(self, X) -> np.ndarray:
        """A model's class probabilities (n_samples, classes) (``model=`` runs)."""
        if self.model is None:
            raise AttributeError("predict_proba: the linear model of a run without model= "
                                 "has no probabilities; use decision_function")
        return self.model.predict_proba(self.coef_, model_X(X, self.model))

    def predict(self, X) -> np.ndarray:
        """The predicted classes (of the model, with ``model=``)."""
        if self.model is None:
            return super().predict(X)
        return self.classes_[self.model.predict(self.coef_, model_X(X, self.model))]
