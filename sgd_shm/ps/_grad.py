"""Minibatch gradient and loss kernels of the parameter server (Numba, nogil), built
on the Hogwild kernels' loss derivatives."""
from __future__ import annotations

import numba as nb
import numpy as np
import scipy.sparse as sp

from sgd_shm import _kernels as K

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
