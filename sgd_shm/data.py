"""Data for the SGD side of the kit: LIBSVM files and generated problems.

* :func:`load_svmlight` reads LIBSVM/svmlight text files into CSR (scikit-learn's
  parser, with the checks this kit needs).
* :func:`make_ratings` draws a Netflix-shaped ratings problem for matrix factorization.
* :func:`make_rcv1_like` draws a large sparse binary problem shaped like RCV1
  (Lewis et al. 2004): Zipf-like feature popularity, about 0.15% density,
  nonnegative tf-idf-like values, rows of unit L2 norm, labels from a hidden
  linear model with noise. 200k × 50k (about 15M nonzeros) takes a few seconds.

Example::

    from sgd_shm.data import make_rcv1_like
    X, y = make_rcv1_like(200_000, 50_000, random_state=0)   # X: CSR float64, y in {-1, +1}
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sgd_shm.core.validation import check_int

__all__ = ["make_rcv1_like", "make_ratings", "load_svmlight"]


def make_rcv1_like(n_samples=200_000, n_features=50_000, *, density=0.0015, zipf=1.1,
                   noise=0.1, random_state=None):
    """A sparse binary classification problem shaped like RCV1.

    Parameters
    ----------
    n_samples, n_features : size of X.
    density : mean fraction of nonzeros per row (RCV1: about 0.0016).
    zipf : exponent s of feature popularity, p(feature j) ∝ 1 / (j + 10)^s.
    noise : fraction of labels flipped at random.
    random_state : seed.

    Returns
    -------
    X : scipy.sparse.csr_matrix (float64, sorted int32 indices, rows of unit norm)
    y : ndarray of ±1.0
    """
    check_int("n_samples", n_samples)
    check_int("n_features", n_features)
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density}")
    if not 0 <= noise < 0.5:
        raise ValueError(f"noise must be in [0, 0.5), got {noise}")
    rng = np.random.default_rng(random_state)
    mean_nnz = max(1.0, density * n_features)
    lengths = np.maximum(1, rng.poisson(mean_nnz, n_samples))
    indptr = np.zeros(n_samples + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    total = int(indptr[-1])
    # Zipf-like popularity over a random relabelling of the features
    weights = 1.0 / (np.arange(n_features) + 10.0) ** zipf
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    perm = rng.permutation(n_features)
    idx = perm[np.minimum(np.searchsorted(cdf, rng.random(total)), n_features - 1)]
    # idf-like values: rare features weigh more
    idf = np.log(1.0 / (weights / weights.sum()))
    data = idf[np.argsort(perm)][idx] * rng.exponential(1.0, total)
    X = sp.csr_matrix((data, idx.astype(np.int32), indptr), shape=(n_samples, n_features))
    X.sum_duplicates()                               # repeated features in a row add up
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    X = sp.diags(1.0 / np.maximum(norms, 1e-300)) @ X
    X = sp.csr_matrix(X)
    X.sort_indices()
    w = rng.normal(size=n_features) * (rng.random(n_features) < 0.3)
    margin = X @ w
    y = np.where(margin > np.median(margin), 1.0, -1.0)
    flip = rng.random(n_samples) < noise
    y[flip] = -y[flip]
    return X, y


def load_svmlight(path, n_features=None, *, dtype=np.float64):
    """Read a LIBSVM/svmlight file; returns (X as CSR, y). Raises a clear error for a
    missing file or malformed content."""
    from sklearn.datasets import load_svmlight_file
    try:
        X, y = load_svmlight_file(str(path), n_features=n_features, dtype=dtype)
    except FileNotFoundError:
        raise FileNotFoundError(f"no LIBSVM file at {str(path)!r}") from None
    except ValueError as e:
        raise ValueError(f"{str(path)!r} is not a valid LIBSVM/svmlight file: {e}") from None
    if not np.isfinite(X.data).all() or not np.isfinite(y).all():
        raise ValueError(f"{str(path)!r} contains NaN or infinite values")
    return sp.csr_matrix(X), y


def make_ratings(n_users=10_000, n_items=2_000, n_ratings=500_000, *, rank=10, noise=0.5,
                 zipf=0.8, random_state=None):
    """A Netflix-shaped ratings problem: (user, item) pairs with Zipf-like popularity of
    users and items, ratings from a hidden rank-``rank`` biased model plus Gaussian
    noise, clipped to [1, 5]. Pairs are unique.

    Returns
    -------
    X : int64 array of shape (m, 2), columns (user id, item id), m <= n_ratings
    y : float64 ratings
    """
    for name, v in (("n_users", n_users), ("n_items", n_items), ("n_ratings", n_ratings),
                    ("rank", rank)):
        check_int(name, v)
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    rng = np.random.default_rng(random_state)

    def popular(n, size):
        w = 1.0 / (np.arange(n) + 5.0) ** zipf
        cdf = np.cumsum(w)
        cdf /= cdf[-1]
        return rng.permutation(n)[np.minimum(np.searchsorted(cdf, rng.random(size)), n - 1)]
    draw = int(n_ratings * 1.2) + 16
    u = popular(n_users, draw).astype(np.int64)
    i = popular(n_items, draw).astype(np.int64)
    key = u * n_items + i
    # unique pairs by sort + adjacent difference (np.unique is slow on big int64 arrays)
    order = np.argsort(key, kind="stable")
    keep = np.ones(order.size, dtype=bool)
    keep[1:] = np.diff(key[order]) != 0
    sel = np.sort(order[keep])[:n_ratings]
    u, i = u[sel], i[sel]
    P = rng.normal(0, 1 / np.sqrt(rank), (n_users, rank))
    Q = rng.normal(0, 1 / np.sqrt(rank), (n_items, rank))
    bu = rng.normal(0, 0.3, n_users)
    bi = rng.normal(0, 0.5, n_items)
    y = 3.6 + bu[u] + bi[i] + np.einsum("ij,ij->i", P[u], Q[i]) + rng.normal(0, noise, u.size)
    return np.column_stack([u, i]), np.clip(y, 1.0, 5.0)
