"""Hogwild! SGD driver: n workers update one weight matrix without locks.

Niu, Recht, Ré, Wright, "Hogwild!: A Lock-Free Approach to Parallelizing
Stochastic Gradient Descent" (NIPS 2011). Each epoch shuffles the sample
*indices* (never the data: reading rows in shuffled order already dominates the
epoch), cuts the permutation into ``n_workers`` contiguous parts, and runs one
Numba kernel per part on a Python thread; the kernels release the GIL, so the
threads run in parallel on the same numpy arrays. Between epochs the driver
folds the exact L2 weight scale into the weights (see ``_kernels``).

Example::

    import numpy as np
    from sgd_shm.hogwild import Problem, HogwildSGD
    prob = Problem.from_xy(X, y_pm1[:, None])      # targets +-1 for a binary classifier
    sgd = HogwildSGD(prob.n_features, 1, loss="log_loss", alpha=1e-4, n_workers=2, seed=0)
    for epoch in range(5):
        mean_loss = sgd.epoch(prob)
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from sgd_shm import _kernels as K

__all__ = ["Problem", "HogwildSGD", "DivergenceError"]

_EMPTY_I = np.empty(0, dtype=np.int64)
_EMPTY_I32 = np.empty(0, dtype=np.int32)
_EMPTY_F = np.empty(0, dtype=np.float64)


class DivergenceError(FloatingPointError, ValueError):
    """SGD produced a non-finite prediction or a collapsing weight scale."""


@dataclass
class Problem:
    """Training data in the layout the kernels read: CSR (int64 indices) or a
    C-contiguous dense matrix, targets Y of shape (n, K), sample weights."""
    n_samples: int
    n_features: int
    Y: np.ndarray
    sw: np.ndarray
    X: np.ndarray            # (n, d) dense, or (0, d) when sparse
    indptr: np.ndarray       # (n + 1,) int64 when sparse, else empty
    indices: np.ndarray      # int32 column indices
    data: np.ndarray
    cols_all: np.ndarray     # arange(d) (int32) for dense rows

    @property
    def sparse(self) -> bool:
        return self.indptr.shape[0] > 0

    @classmethod
    def from_xy(cls, X, Y, sample_weight=None) -> "Problem":
        Y = np.ascontiguousarray(Y, dtype=np.float64)
        if Y.ndim != 2 or Y.shape[0] != X.shape[0]:
            raise ValueError(f"Y must have shape (n_samples, n_outputs), got {Y.shape}")
        n, d = X.shape
        sw = (np.ones(n) if sample_weight is None
              else np.ascontiguousarray(sample_weight, dtype=np.float64))
        if sp.issparse(X):
            X = sp.csr_matrix(X, dtype=np.float64)
            X.sum_duplicates()
            # int32 column indices: rows are read in shuffled order, so bytes per
            # nonzero matter more than anything else in the epoch
            return cls(n, d, Y, sw, np.empty((0, d)), X.indptr.astype(np.int64),
                       X.indices.astype(np.int32), np.ascontiguousarray(X.data), _EMPTY_I32)
        X = np.ascontiguousarray(X, dtype=np.float64)
        return cls(n, d, Y, sw, X, _EMPTY_I, _EMPTY_I32, _EMPTY_F,
                   np.arange(d, dtype=np.int32))


class HogwildSGD:
    """The state of one Hogwild run: weights, intercepts, L1 memory, schedule."""

    def __init__(self, n_features, n_outputs, *, loss="log_loss", alpha=1e-4, l1_ratio=0.0,
                 learning_rate="optimal", eta0=0.0, power_t=0.5, fit_intercept=True,
                 intercept_decay=1.0, n_workers=1, backend="threads", locked=False,
                 instrument=False, stale_bins=64, seed=None):
        if loss not in K.LOSSES:
            raise ValueError(f"loss must be one of {sorted(K.LOSSES)}, got {loss!r}")
        if learning_rate not in K.LEARNING_RATES:
            raise ValueError(f"learning_rate must be one of {sorted(K.LEARNING_RATES)}, "
                             f"got {learning_rate!r}")
        self.W = np.zeros((n_outputs, n_features))
        self.b = np.zeros(n_outputs)
        self.q = np.zeros((n_outputs, n_features)) if alpha * l1_ratio > 0 else np.zeros((0, 0))
        self.n_workers = int(n_workers)
        if backend not in ("threads", "processes"):
            raise ValueError(f"backend must be 'threads' or 'processes', got {backend!r}")
        self.backend = backend
        self._pool = None
        self.rng = np.random.default_rng(seed)
        self.ip = np.zeros(K.N_IPARAMS, dtype=np.int64)
        self.ip[K.I_LOSS] = K.LOSSES[loss]
        self.ip[K.I_LR] = K.LEARNING_RATES[learning_rate]
        self.ip[K.I_FIT_ICPT] = int(bool(fit_intercept))
        # locked=True: a spinlock around every sample's step (a baseline, not Hogwild)
        self.ip[K.I_LOCKED] = int(bool(locked))
        self.lock = np.zeros(16, dtype=np.int64)
        # instrument=True: per-update staleness histogram (see _kernels._run)
        self.ip[K.I_INSTRUMENT] = int(bool(instrument))
        self.clock = np.zeros(16, dtype=np.int64)
        self.staleness = np.zeros(int(stale_bins), dtype=np.int64)
        self.fp = np.zeros(K.N_FPARAMS)
        self.fp[K.F_ETA0] = eta0
        self.fp[K.F_ALPHA2] = alpha * (1.0 - l1_ratio)
        self.fp[K.F_ALPHA1] = alpha * l1_ratio
        self.fp[K.F_POWER_T] = power_t
        self.fp[K.F_T0] = K.optimal_t0(alpha, K.LOSSES[loss]) if learning_rate == "optimal" else 0.0
        self.fp[K.F_ICPT_DECAY] = intercept_decay
        self.fp[K.F_T_START] = 0.0
        self.fp[K.F_U0] = 0.0
        self.clipped = 0           # loss derivatives clipped to +-MAX_DLOSS so far

    @property
    def t(self) -> float:
        """Samples seen so far (the global step count)."""
        return float(self.fp[K.F_T_START])

    @contextlib.contextmanager
    def session(self, prob: Problem):
        """Context for a run of epochs on ``prob``: with the processes backend it starts
        the worker processes and the shared segment, and always releases both."""
        if self.backend != "processes" or self._pool is not None:
            yield self
            return
        from sgd_shm._procs import ProcessPool
        self._pool = ProcessPool(self, prob, max(1, min(self.n_workers, prob.n_samples)))
        self._pool_prob = prob
        try:
            yield self
        finally:
            pool, self._pool, self._pool_prob = self._pool, None, None
            pool.close()

    def epoch(self, prob: Problem) -> float:
        """One pass over the data by all workers; returns the mean (weighted) loss
        of the samples as they were visited."""
        n = prob.n_samples
        nw = max(1, min(self.n_workers, n))
        order = self.rng.permutation(n).astype(np.int64)
        bounds = np.linspace(0, n, nw + 1).astype(np.int64)
        outs = np.zeros((nw, K.N_OUT))
        fp = self.fp.copy()
        fp[K.F_NW] = nw
        scale_tab, eta_tab, cum_eta = K.epoch_tables(self.fp, self.ip, n)
        progress = np.zeros(16 * nw, dtype=np.int64)
        hists = np.zeros((nw, self.staleness.shape[0] + 16), dtype=np.int64)  # padded rows

        def work(w):
            K._run(self.W, self.b, self.q, prob.cols_all, prob.indptr, prob.indices, prob.data,
                   prob.X, prob.Y, prob.sw, order, bounds[w], bounds[w + 1], fp, self.ip,
                   outs[w], self.lock, progress, w, scale_tab, eta_tab, cum_eta, self.clock,
                   hists[w, :self.staleness.shape[0]])
        if self._pool is not None:
            if prob is not self._pool_prob:
                raise ValueError("epoch() got other data than its session(); open a new session")
            self._pool.run_epoch(order, np.linspace(0, n, len(self._pool.procs) + 1)
                                 .astype(np.int64), fp, outs, scale_tab, eta_tab, cum_eta,
                                 hists[:, :self.staleness.shape[0]])
        elif self.backend == "processes":
            with self.session(prob):
                return self.epoch(prob)
        elif nw == 1:
            work(0)
        else:
            threads = [threading.Thread(target=work, args=(w,)) for w in range(nw)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        if outs[:, K.O_DIVERGED].any():
            raise DivergenceError(
                "SGD diverged (a prediction became inf/NaN, or the L2 weight scale collapsed) "
                f"after {self.t + outs[:, K.O_STEPS].sum():.0f} samples; lower eta0 or alpha, "
                "scale the features (e.g. StandardScaler), or use learning_rate='optimal'")
        self.clipped += int(outs[:, K.O_CLIPS].sum())
        self.staleness += hists[:, :self.staleness.shape[0]].sum(axis=0)
        scale = float(scale_tab[n])
        if scale != 1.0:
            self.W *= scale
        self.fp[K.F_U0] += self.fp[K.F_ALPHA1] * cum_eta[n]
        self.fp[K.F_T_START] += n
        if not (np.isfinite(self.W).all() and np.isfinite(self.b).all()):
            raise DivergenceError("SGD diverged: the weights are no longer finite; lower eta0")
        return float(outs[:, K.O_LOSS].sum() / max(prob.sw.sum(), 1e-300))
