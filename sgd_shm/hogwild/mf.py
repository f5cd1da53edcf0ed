"""Matrix factorization (Netflix-style ratings) trained by Hogwild SGD.

``MatrixFactorization`` learns r̂(u, i) = mu + b_u + b_i + p_u · q_i from observed
ratings (Funk 2006; Koren, Bell, Volinsky 2009) with ``n_workers`` threads updating
the factor matrices without locks (Hogwild!, Niu et al. 2011). It follows the
scikit-learn estimator API with X holding (user id, item id) pairs.

Example::

    from sgd_shm import MatrixFactorization
    from sgd_shm.data import make_ratings
    X, y = make_ratings(10_000, 2_000, 500_000, random_state=0)
    mf = MatrixFactorization(n_factors=20, n_workers=2, random_state=0).fit(X, y)
    mf.predict(X[:5]), mf.rmse(X, y)
"""
from __future__ import annotations

import contextlib
import logging
import os

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from sgd_shm.hogwild import _mf
from sgd_shm.core.atomics import LINE_WORDS
from sgd_shm.core.launcher import check_start_method
from sgd_shm.core.validation import (check_bool, check_choice, check_int, check_number,
                                     check_verbose, eval_pair, resolve_workers)
from sgd_shm.hogwild._history import EpochHistory, score_note
from sgd_shm.hogwild._log import epoch_level, verbose_logging
from sgd_shm.hogwild.engine import DivergenceError, run_workers

__all__ = ["MatrixFactorization"]

_log = logging.getLogger(__name__)


def _check_pairs(X, name="X"):
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] != 2:
        raise ValueError(f"{name} must have shape (n_ratings, 2) holding (user id, item id) "
                         f"pairs, got shape {X.shape}")
    if X.dtype.kind == "f":
        if not np.isfinite(X).all() or (X != np.round(X)).any():
            raise ValueError(f"{name} must hold integer ids; found non-integer values")
    elif X.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer ids, got dtype {X.dtype}")
    if X.dtype.kind in "uf" and X.size and X.max() >= 2**63:     # (wrapped negative before)
        raise ValueError(f"{name} holds ids of 2**63 or more ({X.max()}); renumber the ids "
                         "0, 1, 2, ... (np.unique(ids, return_inverse=True) does)")
    X = X.astype(np.int64)
    if X.size and X.min() < 0:
        raise ValueError(f"{name} holds negative ids ({X.min()}); ids must be >= 0")
    return X


def _check_tables(n_users, n_items, n_factors):
    """Ids index the rows of the factor tables: refuse ids whose tables cannot fit in this
    machine's memory (a sparse id space, such as raw user ids, asks for that) with the fix,
    instead of numpy's MemoryError deep in the fit."""
    need = (n_users + n_items) * (n_factors + 1) * 8
    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):      # not POSIX: let numpy decide
        return
    if need > have:
        raise ValueError(f"X: ids index the factor tables, and the largest user id "
                         f"{n_users - 1} and item id {n_items - 1} need {need / 2**30:.1f} GiB "
                         f"of tables, more than this machine's {have / 2**30:.1f} GiB; renumber "
                         "the ids 0, 1, 2, ... (np.unique(ids, return_inverse=True) does)")


class MatrixFactorization(RegressorMixin, BaseEstimator):
    """Biased matrix factorization of a ratings matrix by Hogwild SGD.

    Parameters
    ----------
    n_factors : rank of the factorization.
    learning_rate : SGD step size (constant; times ``decay`` after every epoch).
    reg, reg_bias : L2 strength on the factors and on the biases (on the rows a step touches).
    fit_bias : learn user and item biases (else only mu + p_u · q_i).
    max_iter : epochs.
    decay : factor applied to the learning rate after each epoch (1.0 keeps it constant).
    init_std : standard deviation of the initial factors.
    n_workers : workers updating the factors without locks; 1 (default) reproduces a fit
        exactly for a fixed ``random_state``, -1 uses every CPU (parallelism is opt-in).
    backend : "threads" (nogil Numba kernels on one process's arrays) or "processes"
        (``multiprocess`` workers on factors in a shared-memory segment that lives
        for one fit or partial_fit call and is always released).
    start_method : how the "processes" backend starts its workers (ignored by
        "threads"): "fork" (default, fastest: the workers inherit the ratings), or
        "forkserver" / "spawn", for a parent that runs threads (forking one can
        deadlock the child; Python 3.12+ warns) or a platform without a safe fork
        (Python 3.14 defaults to forkserver on Linux, macOS to spawn). Those copy the
        ratings once into shared memory per call and take about a second per worker
        to start.
    random_state : seeds the initialisation and the shuffling.
    verbose : show the training RMSE of every epoch (logged at INFO on this module's
        logger, to stdout where logging is not configured; at DEBUG without verbose).
    """

    def __init__(self, n_factors=20, *, learning_rate=0.01, reg=0.02, reg_bias=0.02,
                 fit_bias=True, max_iter=20, decay=0.95, init_std=0.1, n_workers=1,
                 backend="threads", start_method="fork", random_state=None, verbose=0):
        self.n_factors = n_factors
        self.learning_rate = learning_rate
        self.reg = reg
        self.reg_bias = reg_bias
        self.fit_bias = fit_bias
        self.max_iter = max_iter
        self.decay = decay
        self.init_std = init_std
        self.n_workers = n_workers
        self.backend = backend
        self.start_method = start_method
        self.random_state = random_state
        self.verbose = verbose

    def _validate_params(self):
        check_int("n_factors", self.n_factors, lo=1)
        check_verbose(self.verbose)
        check_number("learning_rate", self.learning_rate, lo=0, lo_open=True)
        check_number("reg", self.reg, lo=0)
        check_number("reg_bias", self.reg_bias, lo=0)
        check_int("max_iter", self.max_iter, lo=1)
        check_number("decay", self.decay, lo=0, hi=1, lo_open=True)
        check_number("init_std", self.init_std, lo=0)
        check_bool("fit_bias", self.fit_bias)            # ("no" is truthy)
        resolve_workers(self.n_workers)
        check_choice("backend", self.backend, ("threads", "processes"))
        check_start_method(self.start_method)        # checked with either backend

    def _data(self, X, y, reset=True):
        # scikit-learn's checks first (sparse, complex, NaN/inf, empty input, y None: its
        # messages), then the (user id, item id) contract
        X, y = validate_data(self, X, y, reset=reset, dtype="numeric", y_numeric=True)
        X = _check_pairs(X)
        y = np.asarray(y, dtype=np.float64)
        if y.shape != (X.shape[0],):
            raise ValueError(f"y must have shape ({X.shape[0]},), got {y.shape}")
        if not np.isfinite(y).all():
            raise ValueError("y holds NaN or infinite ratings")
        if X.shape[0] == 0:
            raise ValueError("no ratings to fit (X is empty)")
        return X, y

    def fit(self, X, y, *, eval_set=None):
        """Fit on ratings y of the (user, item) pairs in X for max_iter epochs.
        ``eval_set=(X_val, y_val)``: held-out ratings whose RMSE after every epoch is
        recorded in ``history_`` (``val_rmse``)."""
        self._validate_params()
        X, y = self._data(X, y)
        pair = eval_pair(eval_set)
        if pair is not None:
            pair = self._data(*pair, reset=False)
        rng = check_random_state(self.random_state)
        n_users, n_items, k = int(X[:, 0].max()) + 1, int(X[:, 1].max()) + 1, self.n_factors
        _check_tables(n_users, n_items, k)
        self.n_users_, self.n_items_ = n_users, n_items
        init = np.random.default_rng(rng.randint(2**31 - 1))   # (ziggurat normals: cheaper)
        self.user_factors_ = init.normal(0, self.init_std, (self.n_users_, k))
        self.item_factors_ = init.normal(0, self.init_std, (self.n_items_, k))
        self.user_bias_ = np.zeros(self.n_users_)
        self.item_bias_ = np.zeros(self.n_items_)
        self.global_mean_ = float(y.mean())
        self.loss_curve_ = []
        self.n_iter_ = 0
        self._rng = np.random.default_rng(rng.randint(2**31 - 1))
        self._lr = self._lr_set = float(self.learning_rate)
        scorer = None if pair is None else (lambda: self.rmse(*pair))
        self._history = EpochHistory(scorer, key="val_rmse")
        self.history_ = self._history.records
        with self._session(X, y):
            for _ in range(self.max_iter):
                self._epoch(X, y)
        return self

    @contextlib.contextmanager
    def _session(self, X, y):
        """Workers for a run of epochs: with the processes backend, a pool of
        worker processes on shared factors, always released."""
        self._users = np.ascontiguousarray(X[:, 0])
        self._items = np.ascontiguousarray(X[:, 1])
        # a random split of the ratings between the workers for the session; each
        # worker reshuffles its part in place at the start of every epoch, in parallel,
        # so that the driver's serial time per epoch does not grow with the ratings
        self._order = self._rng.permutation(X.shape[0]).astype(np.int64, copy=False)
        nw = max(1, min(resolve_workers(self.n_workers), X.shape[0]))
        self._bounds = np.linspace(0, X.shape[0], nw + 1).astype(np.int64)   # the parts
        pool = self._pool = None
        try:
            if self.backend == "processes":
                from sgd_shm.hogwild._pool import MFPool
                pool = self._pool = MFPool(self, self._users, self._items, y, nw, self._order,
                                           self.start_method)
            with verbose_logging(_log, self.verbose):
                yield
        finally:
            self._pool = None
            del self._users, self._items, self._order, self._bounds
            if pool is not None:
                pool.close()

    def partial_fit(self, X, y):
        """One more epoch over (X, y); the first call initialises like fit with max_iter=1."""
        if not hasattr(self, "user_factors_"):
            saved = self.max_iter
            self.max_iter = 1
            try:
                return self.fit(X, y)
            finally:
                self.max_iter = saved
        self._validate_params()
        self._continue_state()
        X, y = self._data(X, y, reset=False)
        if X[:, 0].max() >= self.n_users_ or X[:, 1].max() >= self.n_items_:
            raise ValueError(f"partial_fit got ids beyond the fitted model ({self.n_users_} "
                             f"users, {self.n_items_} items); fit again on data with every id")
        self._history = EpochHistory(None, self.history_, key="val_rmse")
        with self._session(X, y):
            self._epoch(X, y)
        return self

    def _continue_state(self):
        """Before a partial_fit goes on: a learning_rate set since the last call becomes
        the current step (it was ignored: the decayed step of fit went on); n_factors,
        which shapes the tables, cannot change (refused, not ignored). reg, reg_bias,
        fit_bias, decay, n_workers and backend are read by every epoch anyway."""
        if self.n_factors != self.user_factors_.shape[1]:
            raise ValueError(f"n_factors: set to {self.n_factors!r} after the tables were "
                             f"built with {self.user_factors_.shape[1]}; partial_fit "
                             "continues them. Call fit to start over with it")
        lr = float(self.learning_rate)
        if lr != getattr(self, "_lr_set", lr):
            self._lr = self._lr_set = lr

    def _epoch(self, X, y):
        n = X.shape[0]
        order, bounds = self._order, self._bounds
        nw = bounds.shape[0] - 1
        seeds = self._rng.integers(0, 2**63 - 1, size=nw)
        # a row per worker, padded to whole cache lines
        outs = np.zeros((nw, -(-_mf.MN_OUT // LINE_WORDS) * LINE_WORDS))
        params = (self._lr, float(self.reg), float(self.reg_bias), self.global_mean_,
                  bool(self.fit_bias))
        if self._pool is not None:
            for w, out in enumerate(self._pool.run_epoch(bounds, seeds, *params)):
                outs[w, :_mf.MN_OUT] = out
        else:
            def work(w):
                _mf.shuffle_part(order, bounds[w], bounds[w + 1], seeds[w])
                _mf.mf_run(self.user_factors_, self.item_factors_, self.user_bias_,
                           self.item_bias_, self._users, self._items, y, order, bounds[w],
                           bounds[w + 1], *params, outs[w])
            run_workers(work, nw)
        if outs[:, _mf.MO_DIVERGED].any() or not np.isfinite(self.user_factors_).all():
            raise DivergenceError("matrix factorization diverged (a prediction became inf/NaN); "
                                  "lower learning_rate or raise reg")
        rmse = float(np.sqrt(outs[:, _mf.MO_LOSS].sum() / n))
        self.loss_curve_.append(rmse)
        self.n_iter_ += 1
        self._lr *= float(self.decay)
        rec = self._history.add(self.n_iter_, rmse)
        _log.log(epoch_level(self.verbose), "-- epoch %d: training RMSE %.4f (as visited)%s",
                 self.n_iter_, rmse, score_note(rec))

    def predict(self, X):
        """Predicted ratings of the (user, item) pairs in X; users or items not seen in
        fit get the global mean plus whatever biases are known (cold start)."""
        check_is_fitted(self, "user_factors_")
        X = _check_pairs(validate_data(self, X, reset=False, dtype="numeric"))
        u, i = X[:, 0], X[:, 1]
        ku, ki = u < self.n_users_, i < self.n_items_
        pred = np.full(X.shape[0], self.global_mean_)
        if self.fit_bias:
            pred[ku] += self.user_bias_[u[ku]]
            pred[ki] += self.item_bias_[i[ki]]
        both = ku & ki
        pred[both] += np.einsum("ij,ij->i", self.user_factors_[u[both]],
                                self.item_factors_[i[both]])
        return pred

    def rmse(self, X, y):
        """Root mean squared error of predict(X) against y (one finite rating per row
        of X: a y of another shape is refused, not broadcast)."""
        pred = self.predict(X)
        y = np.asarray(y, dtype=np.float64)
        if y.shape != pred.shape:
            raise ValueError(f"y must have shape {pred.shape}: one rating per row of X, got "
                             f"{y.shape}")
        if not np.isfinite(y).all():
            raise ValueError("y holds NaN or infinite ratings")
        return float(np.sqrt(np.mean((pred - y) ** 2)))
