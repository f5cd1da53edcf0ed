"""The linear models of the parameter server and eager-SGD: L2-regularised linear
losses on one weight vector (no intercept), as a :class:`~sgd_shm.core.model.Model`.

``Linear(n_features, loss, alpha)``: the mean over a minibatch of
``loss(x . w, y)`` plus ``alpha / 2 * ||w||^2``, with y in {-1, +1} (class index 1 is
the positive class) and the losses of :mod:`sgd_shm.models._losses` (log loss, hinge,
modified Huber, squared error; the derivative clipped as scikit-learn clips it). The
minibatch gradient is one nogil Numba call over CSR rows or dense rows. Hogwild's
estimators train the same losses with their own kernels (lazy L2 scaling, hot
coordinates: :mod:`sgd_shm.hogwild`).

Example::

    import numpy as np
    from sgd_shm.models import Linear
    model = Linear(X.shape[1], loss="log_loss", alpha=1e-4)
    data = model.prepare(X, y)                    # y: 0 / 1 class indices
    w, g = model.init(None), np.empty(model.n_params)
    for step in range(100):
        model.grad(w, data, np.arange(step % 10 * 32, step % 10 * 32 + 32), g)
        w -= 0.5 * g
    model.predict(w, X)                           # class indices
"""
from __future__ import annotations

import threading
from typing import NamedTuple

import numba as nb
import numpy as np
import scipy.sparse as sp

from sgd_shm.core.model import Model
from sgd_shm.core.validation import check_choice, check_int, check_number
from sgd_shm.models._losses import LOSSES, MAX_DLOSS, dloss
from sgd_shm.models._losses import loss as loss_of

__all__ = ["Linear", "LinearData", "model_or_linear", "batch_grad", "mean_loss", "matrix_parts"]


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
        d = min(max(dloss(loss, p, ys[r]), -MAX_DLOSS), MAX_DLOSS) * inv
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
        tot += loss_of(loss, _row_dot(indptr, indices, data, Xd, r, w), ys[r])
    return tot / n + 0.5 * alpha * (w @ w)


def matrix_parts(X):
    """(indptr, indices, data, Xd) for the kernels: CSR arrays or the dense matrix."""
    if sp.issparse(X):
        e = np.empty((0, 0))
        return (X.indptr.astype(np.int64), X.indices.astype(np.int64),
                X.data.astype(np.float64), e)
    z = np.empty(0, np.int64)
    return z, z, np.empty(0), X


@nb.njit(cache=True, nogil=True)
def rows_loss(loss, indptr, indices, data, Xd, ys, rows, w, alpha):
    """The mean loss of ``rows`` plus the L2 term."""
    tot = 0.0
    for r in rows:
        tot += loss_of(loss, _row_dot(indptr, indices, data, Xd, r, w), ys[r])
    return tot / rows.size + 0.5 * alpha * (w @ w)


class LinearData(NamedTuple):
    """A data set laid out for the kernels: the CSR arrays (``Xd`` empty) or the dense
    matrix ``Xd`` (the CSR arrays empty), and the labels in {-1, +1}."""
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    Xd: np.ndarray
    y: np.ndarray

    @property
    def parts(self):
        return self.indptr, self.indices, self.data, self.Xd


class Linear(Model):
    """A binary linear model without intercept: ``loss`` ("log_loss", "hinge",
    "modified_huber" or "squared_error") with L2 of strength ``alpha``. Weights
    start at zero. ``decision_function`` gives ``X @ w`` (the positive class's
    score, as scikit-learn's binary models); ``predict_proba`` exists for log loss
    (the logistic function) and modified Huber (scikit-learn's ``(clip(s) + 1) / 2``)
    only."""

    n_outputs = 2

    def __init__(self, n_features, loss="log_loss", alpha=1e-4):
        self.n_features = self.n_params = check_int("n_features", n_features)
        self.loss_name = check_choice("loss", loss, tuple(LOSSES))
        self.code = LOSSES[loss]
        self.alpha = check_number("alpha", alpha, lo=0)
        self.has_proba = loss in ("log_loss", "modified_huber")
        self._local = threading.local()

    def __repr__(self):
        return f"Linear(n_features={self.n_features}, loss={self.loss_name!r}, alpha={self.alpha})"

    def __getstate__(self):           # the per-thread scratch stays behind
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._local = threading.local()

    def init(self, rng):
        """Zeros (nothing is drawn from ``rng``)."""
        return np.zeros(self.n_params)

    def prepare(self, X, y=None):
        """X as the kernels read it (CSR or C-contiguous dense float64) and y (class
        indices 0 / 1, or None for zeros) as labels in {-1, +1}."""
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"X must be 2-D with {self.n_features} features, got shape "
                             f"{X.shape}")
        n = X.shape[0]
        y = np.zeros(n, np.int64) if y is None else np.asarray(y)
        if y.shape != (n,):
            raise ValueError(f"y must have shape ({n},), got {y.shape}")
        if n and (y.min() < 0 or y.max() > 1):
            raise ValueError(f"y must hold class indices 0 and 1, got [{y.min()}, {y.max()}]; "
                             "encode the labels first")
        X = sp.csr_matrix(X, dtype=np.float64) if sp.issparse(X) else \
            np.ascontiguousarray(X, dtype=np.float64)
        return LinearData(*matrix_parts(X), np.where(y == 1, 1.0, -1.0))

    def _full(self):
        buf = getattr(self._local, "g", None)
        if buf is None:
            buf = self._local.g = np.empty(self.n_params)
        return buf

    def grad(self, w, data, rows, grad, block=None):
        """The minibatch gradient into ``grad`` (with ``block=(lo, hi)``: only that
        range is written)."""
        if block is None:
            batch_grad(self.code, *data.parts, data.y, rows, w, self.alpha, grad)
            return
        full = self._full()
        batch_grad(self.code, *data.parts, data.y, rows, w, self.alpha, full)
        grad[block[0]:block[1]] = full[block[0]:block[1]]

    def loss_grad(self, w, data, rows, grad, block=None):
        self.grad(w, data, rows, grad, block)
        return float(rows_loss(self.code, *data.parts, data.y, rows, w, self.alpha))

    def loss(self, w, data):
        """The mean loss of every row of ``data`` plus the L2 term."""
        return float(mean_loss(self.code, *data.parts, data.y, w, self.alpha))

    def decision_function(self, w, X):
        """X @ w: the positive class's score, shape (n_samples,)."""
        return np.asarray(X @ w).ravel()

    def predict(self, w, X):
        """Class index 1 where the score is > 0, else 0."""
        return (self.decision_function(w, X) > 0).astype(np.int64)

    def predict_proba(self, w, X):
        """(n_samples, 2) probabilities: log loss's logistic function, or modified
        Huber's (clip(score, -1, 1) + 1) / 2. Other losses have none."""
        if not self.has_proba:
            raise AttributeError(f"predict_proba: loss={self.loss_name!r} gives no "
                                 "probabilities (log_loss and modified_huber do); use "
                                 "decision_function")
        s = self.decision_function(w, X)
        if self.loss_name == "log_loss":
            p = 1.0 / (1.0 + np.exp(-s))
        else:
            p = (np.clip(s, -1.0, 1.0) + 1.0) / 2.0
        return np.column_stack([1.0 - p, p])


def model_or_linear(model, loss, alpha, n_features):
    """The model of a run: ``model``, or the default :class:`sgd_shm.models.Linear`
    (``loss`` "log_loss" and ``alpha`` 1e-4 when None); a ``model`` brings its own
    loss and L2, so ``loss`` and ``alpha`` must then be None."""
    if model is not None:
        given = [n for n, v in (("loss", loss), ("alpha", alpha)) if v is not None]
        if given:
            raise ValueError(f"{given[0]}: a model= run takes its loss and L2 from the model "
                             f"(e.g. MLP(..., alpha=...)); leave {' and '.join(given)} out")
        return model
    return Linear(n_features, "log_loss" if loss is None else loss,
                  1e-4 if alpha is None else alpha)
