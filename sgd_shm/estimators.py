"""scikit-learn-style estimators trained with Hogwild SGD.

``HogwildClassifier`` (binary, and multiclass one-vs-rest in a single pass: each
sample updates all class rows at once) and ``HogwildRegressor`` follow
``sklearn.linear_model.SGDClassifier`` / ``SGDRegressor``: the same losses,
penalties, learning-rate schedules, defaults and stopping rule (stop when the
epoch's loss has not improved by ``tol`` for ``n_iter_no_change`` epochs), with
``n_workers`` threads updating the weights without locks.

Example::

    from sklearn.datasets import load_digits
    from sgd_shm import HogwildClassifier
    X, y = load_digits(return_X_y=True)
    clf = HogwildClassifier(loss="log_loss", n_workers=2, random_state=0).fit(X / 16, y)
    clf.score(X / 16, y), clf.predict_proba(X[:2] / 16)
"""
from __future__ import annotations

import numbers
import os
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from sgd_shm import _kernels as K
from sgd_shm._procs import check_start_method
from sgd_shm.hogwild import DivergenceError, HogwildSGD, Problem, auto_hot_features

__all__ = ["HogwildClassifier", "HogwildRegressor"]

_PENALTIES = ("l2", "l1", "elasticnet", None)
_BACKENDS = ("threads", "processes")


def resolve_workers(n_workers):
    """``n_workers`` as a count: an int >= 1, or -1 for every CPU of this machine (as
    scikit-learn's ``n_jobs=-1``)."""
    if isinstance(n_workers, numbers.Integral) and not isinstance(n_workers, bool) \
            and n_workers == -1:
        return os.cpu_count() or 1
    _check_param("n_workers", n_workers, int, 1)
    return int(n_workers)


def _check_param(name, value, kind, lo=None, hi=None, lo_open=False):
    if kind is int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    else:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not ok:
        raise TypeError(f"{name} must be {'an int' if kind is int else 'a number'}, "
                        f"got {type(value).__name__} {value!r}")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}, got {value}")


class _BaseHogwild(BaseEstimator):
    _losses: tuple = ()

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def _check_sample_weight(self, sample_weight, n):
        if sample_weight is None:
            return None
        sw = np.asarray(sample_weight, dtype=np.float64)
        if sw.shape != (n,) or not np.isfinite(sw).all() or (sw < 0).any():
            raise ValueError(f"sample_weight must be finite, >= 0 and of shape ({n},)")
        if sw.sum() <= 0:
            raise ValueError("sample_weight sums to zero: there is nothing to fit; give some "
                             "samples a positive weight")
        return sw

    def _validate_params(self):
        if self.loss not in self._losses:
            raise ValueError(f"loss must be one of {self._losses}, got {self.loss!r}")
        if self.penalty not in _PENALTIES:
            raise ValueError(f"penalty must be one of {_PENALTIES}, got {self.penalty!r}")
        _check_param("alpha", self.alpha, float, 0.0)
        _check_param("l1_ratio", self.l1_ratio, float, 0.0, 1.0)
        _check_param("max_iter", self.max_iter, int, 1)
        if self.tol is not None:
            _check_param("tol", self.tol, float)
        _check_param("n_iter_no_change", self.n_iter_no_change, int, 1)
        if self.learning_rate not in K.LEARNING_RATES:
            raise ValueError(f"learning_rate must be one of {tuple(K.LEARNING_RATES)}, "
                             f"got {self.learning_rate!r}")
        _check_param("eta0", self.eta0, float, 0.0)
        if self.learning_rate != "optimal" and self.eta0 <= 0:
            raise ValueError(f"eta0 must be > 0 with learning_rate={self.learning_rate!r}, "
                             f"got {self.eta0}; set eta0 (e.g. 0.01) or use 'optimal'")
        if self.learning_rate == "optimal" and self.alpha <= 0:
            raise ValueError("alpha must be > 0 with learning_rate='optimal' (it sets the step "
                             "size); use a positive alpha or another learning_rate")
        _check_param("power_t", self.power_t, float)
        _check_param("momentum", self.momentum, float, 0.0)
        if self.momentum >= 1.0:
            raise ValueError(f"momentum must be < 1, got {self.momentum}; 0.9 is usual")
        resolve_workers(self.n_workers)
        if not (isinstance(self.hot_features, str) and self.hot_features == "auto"):
            if isinstance(self.hot_features, str):
                raise ValueError(f"hot_features must be 'auto' or an int >= 0, got "
                                 f"{self.hot_features!r}")
            _check_param("hot_features", self.hot_features, int, 0)
        if self.backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS}, got {self.backend!r}")
        check_start_method(self.start_method)        # checked with either backend

    def _hot_features(self, epochs, X):
        """hot_features where the workers buffer them (several workers, L2 or no
        penalty, no momentum), else 0: the hot-first layout would go unused. "auto":
        see ``hogwild.auto_hot_features``."""
        if resolve_workers(self.n_workers) > 1 and self.momentum == 0 and self._penalty_split()[1] == 0:
            if self.hot_features == "auto":
                return auto_hot_features(X, epochs)
            return self.hot_features
        return 0

    def _penalty_split(self):
        if self.penalty is None:
            return 0.0, 0.0
        l1 = {"l2": 0.0, "l1": 1.0, "elasticnet": self.l1_ratio}[self.penalty]
        return float(self.alpha), l1

    def _new_state(self, n_features, n_outputs, sparse, rng_seed):
        _, l1 = self._penalty_split()
        # penalty=None: no penalty, but 'optimal' still takes its step sizes from alpha
        return HogwildSGD(n_features, n_outputs, loss=self.loss, alpha=float(self.alpha),
                          l1_ratio=l1, learning_rate=self.learning_rate, eta0=float(self.eta0),
                          power_t=float(self.power_t), fit_intercept=self.fit_intercept,
                          intercept_decay=0.01 if sparse else 1.0, n_workers=resolve_workers(self.n_workers),
                          backend=self.backend, start_method=self.start_method,
                          instrument=self.instrument,
                          penalty_scale=0.0 if self.penalty is None else 1.0,
                          momentum=float(self.momentum), seed=rng_seed)

    def _objective(self, mean_loss):
        """Mean loss plus the penalty of the current weights (the stopping rule's
        objective, as in scikit-learn >= 1.7)."""
        st = self._state
        a2, a1 = st.fp[K.F_ALPHA2], st.fp[K.F_ALPHA1]
        pen = 0.0
        if a2 > 0:
            pen += 0.5 * a2 * float(np.sum(st.W * st.W))
        if a1 > 0:
            pen += a1 * float(np.abs(st.W).sum())
        return mean_loss + pen

    _FITTED = ("coef_", "intercept_", "staleness_", "classes_", "loss_curve_", "n_iter_",
               "hot_features_", "_state", "n_features_in_")

    def _forget(self):
        """Back to unfitted: after a failed or diverged fit no half-trained state stays."""
        for name in self._FITTED:
            if name in self.__dict__:
                delattr(self, name)

    def _train(self, prob, reset, n_outputs, sparse, max_iter, stop_early):
        """Epochs on ``prob`` from a fresh state (reset) or the current one; publishes
        intercept_, staleness_ and hot_features_ (features the workers buffered in this
        call, 0 for none) and returns the weight matrix (n_outputs, n_features)."""
        if reset or not hasattr(self, "_state"):
            seed = check_random_state(self.random_state).randint(2**31 - 1)
            self._state = self._new_state(prob.n_features, n_outputs, sparse, int(seed))
            self.loss_curve_ = []
            self.n_iter_ = 0
        converged = self._run_epochs(prob, max_iter, stop_early)
        if stop_early and not converged:
            warnings.warn(f"Maximum number of iterations ({self.max_iter}) reached before "
                          "convergence; consider increasing max_iter", ConvergenceWarning)
        self.intercept_ = self._state.b.copy()
        self.hot_features_ = int(prob.hot_feat.shape[0])
        if self.instrument:
            self.staleness_ = self._state.staleness.copy()
        return self._state.W

    def _fit(self, reset, *args):
        """fit/partial_fit: start from scratch when ``reset``; a divergence leaves the
        estimator unfitted rather than half-trained."""
        if reset:
            self._forget()
        try:
            return self._fit_inner(reset, *args)
        except DivergenceError:
            self._forget()
            raise

    def _run_epochs(self, prob, max_iter, stop_early):
        clipped_before = self._state.clipped
        self._state.start_method = self.start_method     # set_params between partial_fits
        try:
            with self._state.session(prob):      # processes: workers + shared memory
                return self._epochs(prob, max_iter, stop_early)
        finally:
            clipped = self._state.clipped - clipped_before
            if clipped:
                warnings.warn(f"the loss derivative was clipped to +-{K.MAX_DLOSS:g} {clipped} "
                              "times: the step size is far too large for this data; scale the "
                              "features (e.g. StandardScaler) or lower eta0", RuntimeWarning)

    def _epochs(self, prob, max_iter, stop_early):
        best = np.inf
        stall = 0
        self.loss_curve_ = getattr(self, "loss_curve_", [])
        for it in range(max_iter):
            mean_loss = self._state.epoch(prob)
            self.loss_curve_.append(mean_loss)
            self.n_iter_ = getattr(self, "n_iter_", 0) + 1
            if self.verbose:
                print(f"-- epoch {self.n_iter_}: mean loss {mean_loss:.6f}, "
                      f"t = {self._state.t:.0f}")
            if stop_early and self.tol is not None:
                obj = self._objective(mean_loss)
                stall = stall + 1 if obj > best - self.tol else 0
                best = min(best, obj)
                if stall >= self.n_iter_no_change:
                    return True
        return not stop_early or self.tol is None

    def _prepare_X(self, X, reset):
        return validate_data(self, X, accept_sparse="csr", dtype=np.float64, order="C",
                             reset=reset)

    def _decision(self, X):
        check_is_fitted(self, "coef_")
        X = self._prepare_X(X, reset=False)
        return np.asarray(X @ self.coef_.T) + self.intercept_

    @property
    def t_(self):
        return self._state.t + 1.0


class HogwildClassifier(ClassifierMixin, _BaseHogwild):
    """Linear classifier trained by Hogwild SGD (``SGDClassifier``'s parameters).

    Parameters
    ----------
    loss : "hinge" (linear SVM), "log_loss" (logistic regression, gives predict_proba),
        "modified_huber" (also gives predict_proba).
    penalty : "l2", "l1", "elasticnet" or None; alpha: its strength; l1_ratio for elasticnet.
    max_iter, tol, n_iter_no_change : epochs, and the stopping rule on the epoch's mean loss.
    learning_rate : "optimal" (1/(alpha·(t0+t))), "constant" (eta0), "invscaling" (eta0/t^power_t).
    momentum : heavy-ball momentum in [0, 1) on the coordinates each sample touches, with one
        velocity shared by the workers without locks (asynchronous momentum); 0 is plain SGD.
    n_workers : workers updating the shared weights without locks (Hogwild); 1 (default)
        is a serial fit that a fixed ``random_state`` reproduces exactly; -1 uses every
        CPU. Parallelism is opt-in, as scikit-learn's ``n_jobs``: with several workers
        the interleaving of their updates, and so the last bits of the fit, vary from
        run to run.
    backend : "threads" (Python threads running nogil Numba kernels on one array) or
        "processes" (``multiprocess`` workers on weights in shared memory, released
        after every fit, also when a worker fails).
    start_method : how the "processes" backend starts its workers (ignored by
        "threads"): "fork" (default, fastest: the workers inherit the data), or
        "forkserver" / "spawn", for a parent that runs threads (forking one can
        deadlock the child, and Python 3.12+ warns about it) or a platform without
        a safe fork (Python 3.14 defaults to forkserver on Linux, macOS to spawn).
        Those copy the data once into shared memory per fit (or partial_fit call)
        and take about a second per worker to start.
    hot_features : "auto" (default), 0, or an int H > 0. With H > 0, on sparse data, each
        worker steps the weights of the H most frequent features in a private copy and
        publishes its steps about every K·H/4 of its samples (K: outputs), where the
        others pick them up: those cache lines stop moving between the cores on every
        sample, and no step on them is lost to a concurrent write (plain Hogwild loses
        a small share of its steps on the most frequent features that way). The others
        see a worker's steps on them that many samples late. Costs a copy of the data
        per fit (a pass over its nonzeros), which the faster epochs earn back over longer
        fits only. Used with several workers, penalty "l2" or None and no momentum.
        0: plain Hogwild, every weight shared on every step. "auto": 4096
        (``sgd_shm.hogwild.AUTO_HOT_FEATURES``) in a ``fit`` with max_iter >= 10 on sparse
        data with at least 1M nonzeros and 16384 features, else 0 (small problems gain
        nothing, and the delayed view of the hot weights costs accuracy in the first,
        large steps; shorter fits do not earn back the copy); 0 in ``partial_fit``.
    instrument : record per-update staleness (updates applied by other workers between
        a worker's read of the weights and its write, the delay tau) in ``staleness_``,
        a histogram (index = tau; the last bin counts tau >= 63). Costs one contended
        atomic per update. With hot features buffered, a worker reads the hot weights
        from its copy, which may miss up to one publication interval of the others'
        steps more than tau says.
    random_state : seeds the shuffling.
    """
    _losses = ("hinge", "log_loss", "modified_huber")

    def __init__(self, loss="hinge", *, penalty="l2", alpha=1e-4, l1_ratio=0.15,
                 fit_intercept=True, max_iter=1000, tol=1e-3, n_iter_no_change=5,
                 learning_rate="optimal", eta0=0.0, power_t=0.5, momentum=0.0, n_workers=1,
                 backend="threads", start_method="fork", hot_features="auto",
                 instrument=False, random_state=None, verbose=0):
        self.loss = loss
        self.penalty = penalty
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.power_t = power_t
        self.momentum = momentum
        self.n_workers = n_workers
        self.backend = backend
        self.start_method = start_method
        self.hot_features = hot_features
        self.instrument = instrument
        self.random_state = random_state
        self.verbose = verbose

    def _targets(self, y):
        if len(self.classes_) == 2:
            return np.where(y == self.classes_[1], 1.0, -1.0)[:, None]
        return np.where(y[:, None] == self.classes_[None, :], 1.0, -1.0)

    def _fit_inner(self, reset, X, y, sample_weight, classes, max_iter, stop_early):
        self._validate_params()
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64, order="C",
                             reset=reset)
        check_classification_targets(y)
        if (not reset and classes is not None and hasattr(self, "classes_")
                and not np.array_equal(np.unique(np.asarray(classes)), self.classes_)):
            raise ValueError(f"classes={list(classes)!r} differs from the classes of the first "
                             f"partial_fit call {self.classes_.tolist()!r}; call fit to start over")
        if reset or not hasattr(self, "classes_"):
            cls = np.unique(y) if classes is None else np.unique(np.asarray(classes))
            if len(cls) < 2:
                raise ValueError(f"HogwildClassifier needs samples of at least 2 classes; y "
                                 f"has 1 class ({cls.tolist()})")
            self.classes_ = cls
        if not np.isin(y, self.classes_).all():
            raise ValueError(f"y holds labels not in classes_ {self.classes_.tolist()}")
        sample_weight = self._check_sample_weight(sample_weight, X.shape[0])
        prob = Problem.from_xy(X, self._targets(y), sample_weight,
                               self._hot_features(max_iter, X))
        n_out = 1 if len(self.classes_) == 2 else len(self.classes_)
        self.coef_ = self._train(prob, reset, n_out, sp.issparse(X), max_iter, stop_early).copy()
        return self

    def fit(self, X, y, sample_weight=None):
        """Train from scratch for up to max_iter epochs (stopping rule: tol)."""
        return self._fit(True, X, y, sample_weight, None, self.max_iter, True)

    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """One epoch over (X, y), continuing from the current weights. ``classes`` is
        required on the first call."""
        first = not hasattr(self, "classes_")
        if first and classes is None:
            raise ValueError("classes must be passed on the first call to partial_fit")
        return self._fit(first, X, y, sample_weight, classes, 1, False)

    def decision_function(self, X):
        d = self._decision(X)
        return d.ravel() if d.shape[1] == 1 else d

    def predict(self, X):
        d = self.decision_function(X)
        if d.ndim == 1:
            return self.classes_[(d > 0).astype(int)]
        return self.classes_[d.argmax(axis=1)]

    def _has_proba(self):
        return self.loss in ("log_loss", "modified_huber")

    @available_if(_has_proba)
    def predict_proba(self, X):
        """Class probabilities (loss='log_loss' or 'modified_huber'; one-vs-rest
        probabilities are normalised to sum to one)."""
        d = self._decision(X)
        if self.loss == "log_loss":
            p = 1.0 / (1.0 + np.exp(-np.clip(d, -500, 500)))
        else:
            p = (np.clip(d, -1.0, 1.0) + 1.0) / 2.0
        if p.shape[1] == 1:
            return np.hstack([1.0 - p, p])
        s = p.sum(axis=1, keepdims=True)
        uniform = s[:, 0] == 0
        p[uniform] = 1.0
        s[uniform] = p.shape[1]
        return p / s

    @available_if(_has_proba)
    def predict_log_proba(self, X):
        return np.log(self.predict_proba(X))


class HogwildRegressor(RegressorMixin, _BaseHogwild):
    """Linear regressor trained by Hogwild SGD (``SGDRegressor``'s parameters and
    defaults: squared error, invscaling learning rate with eta0 = 0.01)."""
    _losses = ("squared_error",)

    def __init__(self, loss="squared_error", *, penalty="l2", alpha=1e-4, l1_ratio=0.15,
                 fit_intercept=True, max_iter=1000, tol=1e-3, n_iter_no_change=5,
                 learning_rate="invscaling", eta0=0.01, power_t=0.25, momentum=0.0, n_workers=1,
                 backend="threads", start_method="fork", hot_features="auto",
                 instrument=False, random_state=None, verbose=0):
        self.loss = loss
        self.penalty = penalty
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.power_t = power_t
        self.momentum = momentum
        self.n_workers = n_workers
        self.backend = backend
        self.start_method = start_method
        self.hot_features = hot_features
        self.instrument = instrument
        self.random_state = random_state
        self.verbose = verbose

    def _fit_inner(self, reset, X, y, sample_weight, max_iter, stop_early):
        self._validate_params()
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64, order="C",
                             y_numeric=True, reset=reset)
        sample_weight = self._check_sample_weight(sample_weight, X.shape[0])
        prob = Problem.from_xy(X, np.asarray(y, dtype=np.float64).reshape(-1, 1), sample_weight,
                               self._hot_features(max_iter, X))
        self.coef_ = self._train(prob, reset, 1, sp.issparse(X), max_iter, stop_early)[0].copy()
        return self

    def fit(self, X, y, sample_weight=None):
        return self._fit(True, X, y, sample_weight, self.max_iter, True)

    def partial_fit(self, X, y, sample_weight=None):
        return self._fit(not hasattr(self, "_state"), X, y, sample_weight, 1, False)

    def _decision(self, X):
        check_is_fitted(self, "coef_")
        X = self._prepare_X(X, reset=False)
        return np.asarray(X @ self.coef_).ravel() + self.intercept_[0]

    def predict(self, X):
        return self._decision(X)
