"""scikit-learn-style estimators trained with Hogwild SGD.

``HogwildClassifier`` (binary, and multiclass one-vs-rest in a single pass: each
sample updates all class rows at once) and ``HogwildRegressor`` follow
``sklearn.linear_model.SGDClassifier`` / ``SGDRegressor``: the same losses,
penalties, learning-rate schedules and defaults, and a stopping rule of the same form
(stop when the epoch's loss plus penalty has not improved by ``tol`` for
``n_iter_no_change`` epochs; its objective differs, see :meth:`_objective`), with
``n_workers`` threads updating the weights without locks.

Example::

    from sklearn.datasets import load_digits
    from sgd_shm import HogwildClassifier
    X, y = load_digits(return_X_y=True)
    clf = HogwildClassifier(loss="log_loss", n_workers=2, random_state=0).fit(X / 16, y)
    clf.score(X / 16, y), clf.predict_proba(X[:2] / 16)
"""
from __future__ import annotations

import logging
import numbers
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, is_classifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import ShuffleSplit, StratifiedShuffleSplit
from sklearn.utils import check_random_state, compute_class_weight
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from sgd_shm.hogwild import _kernels as K
from sgd_shm.core.launcher import check_start_method
from sgd_shm.core.validation import (check_bool, check_choice, check_int, check_momentum,
                                     check_number, check_verbose, eval_pair, resolve_workers)
from sgd_shm.hogwild import DivergenceError, HogwildSGD, Problem, auto_hot_features
from sgd_shm.hogwild._history import EpochHistory, score_note
from sgd_shm.hogwild._log import epoch_level, verbose_logging

_log = logging.getLogger(__name__)

__all__ = ["HogwildClassifier", "HogwildRegressor"]

_PENALTIES = ("l2", "l1", "elasticnet", None)
_BACKENDS = ("threads", "processes")
#: the input types fit and predict keep (float32 is read without a float64 copy)
_DTYPES = [np.float64, np.float32]


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
        """Every hyper-parameter, by core.validation's rules (the argument's name, the
        rule and the value in each message)."""
        check_choice("loss", self.loss, self._losses)
        check_choice("penalty", self.penalty, _PENALTIES)
        check_number("alpha", self.alpha, lo=0)
        check_number("l1_ratio", self.l1_ratio, lo=0, hi=1)
        check_int("max_iter", self.max_iter, lo=1)
        if self.tol is not None:
            check_number("tol", self.tol)
        check_int("n_iter_no_change", self.n_iter_no_change, lo=1)
        check_choice("learning_rate", self.learning_rate, tuple(K.LEARNING_RATES))
        check_number("eta0", self.eta0, lo=0)
        if self.learning_rate != "optimal" and self.eta0 <= 0:
            raise ValueError(f"eta0: must be > 0 with learning_rate={self.learning_rate!r}, "
                             f"got {self.eta0}; set eta0 (e.g. 0.01) or use 'optimal'")
        if self.learning_rate == "optimal" and self.alpha <= 0:
            raise ValueError("alpha: must be > 0 with learning_rate='optimal' (it sets the "
                             "step size); use a positive alpha or another learning_rate")
        check_number("power_t", self.power_t)
        check_momentum(self.momentum)
        resolve_workers(self.n_workers)
        if not (isinstance(self.hot_features, str) and self.hot_features == "auto"):
            if isinstance(self.hot_features, str):
                raise ValueError(f"hot_features: must be 'auto' or an int >= 0, got "
                                 f"{self.hot_features!r}")
            check_int("hot_features", self.hot_features, lo=0)
        check_choice("backend", self.backend, _BACKENDS)
        check_start_method(self.start_method)        # checked with either backend
        check_bool("fit_intercept", self.fit_intercept)     # ("no" fitted one before)
        check_bool("instrument", self.instrument)
        check_verbose(self.verbose)
        self._validate_parity_params()

    def _validate_parity_params(self):
        """shuffle, warm_start, early_stopping (booleans), validation_fraction, average."""
        for name in ("shuffle", "warm_start", "early_stopping"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be True or False, got {type(value).__name__} "
                                f"{value!r}")
        # (messages in the "name must be" form that tests/test_estimator_parity.py pins)
        vf = self.validation_fraction
        if isinstance(vf, bool) or not isinstance(vf, numbers.Real):
            raise TypeError(f"validation_fraction must be a number, got {type(vf).__name__} "
                            f"{vf!r}")
        if not vf > 0:
            raise ValueError(f"validation_fraction must be > 0, got {vf}; 0.1 holds out a "
                             "tenth of the samples")
        if self.validation_fraction >= 1.0:
            raise ValueError(f"validation_fraction must be in (0, 1), got "
                             f"{self.validation_fraction}; 0.1 holds out a tenth of the samples")
        self._average_start()

    def _average_start(self):
        """``average`` as the 1-based sample count from which the weights are averaged
        (0: no averaging): False -> 0, True -> 1, an int a >= 1 -> a."""
        a = self.average
        if isinstance(a, (bool, np.bool_)):
            return int(a)
        if not isinstance(a, numbers.Integral) or a < 1:
            raise ValueError(f"average must be False, True or an int >= 1 (average from that "
                             f"many samples seen on), got {type(a).__name__} {a!r}; use False "
                             "for no averaging")
        return int(a)

    def _hot_features(self, epochs, X, n_outputs):
        """hot_features where the workers buffer them (several workers, L2 or no
        penalty, no momentum, no averaging), else 0: the hot-first layout would go
        unused. "auto": see ``hogwild.auto_hot_features``."""
        nw = resolve_workers(self.n_workers)
        if nw > 1 and self.momentum == 0 \
                and self._penalty_split()[1] == 0 and not self._average_start():
            if self.hot_features == "auto":
                return auto_hot_features(X, epochs, n_outputs, nw)
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
                          momentum=float(self.momentum), seed=rng_seed,
                          shuffle=bool(self.shuffle), average=self._average_start())

    def _objective(self, mean_loss):
        """Mean loss plus the penalty of the current weights (the stopping rule's
        objective). scikit-learn (>= 1.7) adds each step's penalty at that step's weights
        and leaves sample weights out of the loss; a norm per step is what lock-free
        workers cannot keep, so the penalty here is the end-of-epoch weights'."""
        st = self._state
        a2, a1 = st.fp[K.F_ALPHA2], st.fp[K.F_ALPHA1]
        pen = 0.0
        if a2 > 0:
            pen += 0.5 * a2 * float(np.sum(st.W * st.W))
        if a1 > 0:
            pen += a1 * float(np.abs(st.W).sum())
        return mean_loss + pen

    _FITTED = ("coef_", "intercept_", "staleness_", "classes_", "loss_curve_", "n_iter_",
               "hot_features_", "_state", "n_features_in_", "validation_scores_", "history_",
               "_state_params")

    #: the parameters a training state is built with (its loss, penalty, schedule kind,
    #: buffers, workers): partial_fit continues that state, so a change is refused
    _STATE_PARAMS = ("loss", "penalty", "alpha", "l1_ratio", "fit_intercept", "learning_rate",
                     "momentum", "n_workers", "backend", "shuffle", "average", "instrument")

    def _continue_state(self):
        """Before a partial_fit continues the state: eta0 and power_t (the schedule's
        numbers) take their current values, as a manual step-size schedule needs; a
        change of a parameter the state was built with raises (it would be ignored)."""
        for name, old in getattr(self, "_state_params", {}).items():
            new = getattr(self, name)
            if new != old:
                raise ValueError(
                    f"{name}: set to {new!r} after the state was built with {old!r}; "
                    "partial_fit continues that state, so the new value would be ignored. "
                    "Call fit to start over with it (eta0 and power_t may change between "
                    "partial_fit calls)")
        self._state.fp[K.F_ETA0] = float(self.eta0)
        self._state.fp[K.F_POWER_T] = float(self.power_t)

    def _forget(self):
        """Back to unfitted: after a failed or diverged fit no half-trained state stays."""
        for name in self._FITTED:
            if name in self.__dict__:
                delattr(self, name)

    def _train(self, prob, reset, n_outputs, sparse, max_iter, stop_early, init=None,
               scorer=None, held_out=None):
        """Epochs on ``prob`` from a fresh state (reset; from the weights ``init`` =
        (W, b) when given) or the current one, the stopping rule on ``scorer()`` (the
        validation score) when given, ``history_`` with ``held_out()`` (the score on
        ``eval_set``) when given; publishes intercept_, staleness_ and hot_features_
        (features the workers buffered in this call, 0 for none) and returns the weight
        matrix (n_outputs, n_features): the averaged one once averaging has begun."""
        if reset or not hasattr(self, "_state"):
            seed = check_random_state(self.random_state).randint(2**31 - 1)
            self._state = self._new_state(prob.n_features, n_outputs, sparse, int(seed))
            if init is not None:
                self._state.W[...], self._state.b[...] = init
            self._state_params = {name: getattr(self, name) for name in self._STATE_PARAMS}
            self.loss_curve_ = []
            self.n_iter_ = 0
            self.history_ = []
        else:
            self._continue_state()
        self._history = EpochHistory(held_out, self.history_)
        converged = self._run_epochs(prob, max_iter, stop_early, scorer)
        if stop_early and not converged:
            warnings.warn(f"Maximum number of iterations ({self.max_iter}) reached before "
                          "convergence; consider increasing max_iter", ConvergenceWarning)
        W, b = self._state.averaged()
        self.intercept_ = b.copy()
        self.hot_features_ = int(prob.hot_feat.shape[0])
        if self.instrument:
            self.staleness_ = self._state.staleness.copy()
        return W

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

    def _run_epochs(self, prob, max_iter, stop_early, scorer=None):
        clipped_before = self._state.clipped
        self._state.start_method = self.start_method     # set_params between partial_fits
        try:
            # the session: (processes) the workers and the shared memory
            with self._state.session(prob), verbose_logging(_log, self.verbose):
                return self._epochs(prob, max_iter, stop_early, scorer)
        finally:
            clipped = self._state.clipped - clipped_before
            if clipped:
                warnings.warn(f"the loss derivative was clipped to +-{K.MAX_DLOSS:g} {clipped} "
                              "times: the step size is far too large for this data; scale the "
                              "features (e.g. StandardScaler) or lower eta0", RuntimeWarning)

    def _epochs(self, prob, max_iter, stop_early, scorer=None):
        """Up to max_iter epochs; with stop_early, stop when the objective (mean loss
        plus penalty) has not fallen by tol, or with a ``scorer`` (early_stopping) the
        validation score has not risen by tol, for n_iter_no_change epochs in a row
        (scikit-learn's rules). Returns whether the rule stopped it (or there is none)."""
        best = -np.inf if scorer is not None else np.inf
        stall = 0
        self.loss_curve_ = getattr(self, "loss_curve_", [])
        for it in range(max_iter):
            mean_loss = self._state.epoch(prob)
            self.loss_curve_.append(mean_loss)
            self.n_iter_ = getattr(self, "n_iter_", 0) + 1
            score = None
            if scorer is not None:
                score = scorer()
                self.validation_scores_.append(score)
            rec = self._history.add(self.n_iter_, mean_loss)
            _log.log(epoch_level(self.verbose), "-- epoch %d: mean loss %.6f, t = %.0f%s%s",
                     self.n_iter_, mean_loss, self._state.t,
                     "" if score is None else f", validation score {score:.6f}",
                     score_note(rec))
            if stop_early and self.tol is not None:
                if scorer is not None:
                    stall = stall + 1 if score < best + self.tol else 0
                    best = max(best, score)
                else:
                    obj = self._objective(mean_loss)
                    stall = stall + 1 if obj > best - self.tol else 0
                    best = min(best, obj)
                if stall >= self.n_iter_no_change:
                    return True
        return not stop_early or self.tol is None

    def _warm_init(self, coef_init, intercept_init):
        """(coef_init, intercept_init) for fit: with warm_start and a fitted model, the
        fitted coef_ / intercept_ where none is given (as SGDClassifier)."""
        if self.warm_start and hasattr(self, "coef_"):
            if coef_init is None:
                coef_init = self.coef_.copy()
            if intercept_init is None:
                intercept_init = self.intercept_.copy()
        return coef_init, intercept_init

    @staticmethod
    def _initial_weights(init, n_out, d):
        """The starting (W, b) of shapes (n_out, d), (n_out,) from (coef_init,
        intercept_init), zeros where None; None when both are None."""
        if init is None or (init[0] is None and init[1] is None):
            return None
        W, b = np.zeros((n_out, d)), np.zeros(n_out)
        for name, value, out, shape in (("coef_init", init[0], W, (n_out, d)),
                                        ("intercept_init", init[1], b, (n_out,))):
            if value is None:
                continue
            a = np.asarray(value, dtype=np.float64)
            one = a.ndim == 0 and out.size == 1          # a number for one intercept (sklearn)
            if not one and (a.size != out.size or a.ndim > out.ndim
                            or a.shape[-1:] != out.shape[-1:]):
                raise ValueError(f"{name} must have shape {shape} for this data (the "
                                 f"coef_ / intercept_ of a fit on data like it), got shape "
                                 f"{a.shape}; with warm_start=True, refit on data with the "
                                 "same features and classes or set warm_start=False")
            if not np.isfinite(a).all():
                raise ValueError(f"{name} holds NaN or inf; pass finite weights")
            out[...] = a.reshape(out.shape)
        return W, b

    def _validation_split(self, y, sample_weight):
        """(training rows, validation rows) for early_stopping: a held-out share
        validation_fraction of the samples, stratified by class for a classifier
        (StratifiedShuffleSplit / ShuffleSplit seeded with random_state, as
        SGDClassifier)."""
        split = StratifiedShuffleSplit if is_classifier(self) else ShuffleSplit
        cv = split(test_size=self.validation_fraction, random_state=self.random_state)
        try:
            train, val = next(cv.split(np.zeros((y.shape[0], 1)), y))
        except ValueError as e:
            raise ValueError(f"early_stopping: cannot hold out validation_fraction="
                             f"{self.validation_fraction} of {y.shape[0]} samples ({e}); "
                             "use more samples, another validation_fraction, or "
                             "early_stopping=False") from e
        if train.shape[0] == 0 or val.shape[0] == 0:
            raise ValueError(f"early_stopping: validation_fraction={self.validation_fraction} "
                             f"of {y.shape[0]} samples leaves an empty training or validation "
                             "set; use more samples, another validation_fraction, or "
                             "early_stopping=False")
        if sample_weight is not None and not (sample_weight[val] > 0).any():
            raise ValueError("early_stopping: every sample of the validation set has weight "
                             "0; use another random_state or early_stopping=False")
        return train, val

    def _early_stopping(self, prob, X, y, sample_weight):
        """(the problem to train on, the scorer of the held-out samples, or None):
        with early_stopping, the training rows of a validation split and a scorer that
        scores the published weights on the rest (accuracy or R^2, sample-weighted)."""
        self.validation_scores_ = []
        if not self.early_stopping:
            return prob, None
        train, val = self._validation_split(y, sample_weight)
        Xv, yv = X[val], y[val]
        swv = None if sample_weight is None else sample_weight[val]
        return prob.subset(train), lambda: self._score_weights(*self._state.averaged(),
                                                               Xv, yv, swv)

    def _held_out(self, eval_set):
        """The scorer of ``eval_set`` = (X_val, y_val) (None: None): the estimator's
        score measure (accuracy, R^2) of the current weights on it, checked first."""
        pair = eval_pair(eval_set)
        if pair is None:
            return None
        Xv = self._prepare_X(pair[0], reset=False)
        yv = np.asarray(pair[1])
        if yv.shape != (Xv.shape[0],):
            raise ValueError(f"eval_set: X_val has {Xv.shape[0]} rows but y_val has shape "
                             f"{yv.shape}; pass one label per held-out row")
        if is_classifier(self) and not np.isin(yv, self.classes_).all():
            raise ValueError("eval_set: y_val holds labels that are not among the training "
                             f"classes {self.classes_.tolist()[:5]}")
        if not is_classifier(self):              # (NaN scored nan; strings, numpy's words)
            yv = self._targets_of(yv)
        return lambda: self._score_weights(*self._state.averaged(), Xv, yv, None)

    @staticmethod
    def _targets_of(yv):
        """Held-out regression targets as float64, as training y is taken (bools and
        number objects convert; strings do not), and finite."""
        try:
            if yv.dtype.kind not in "biufO":
                raise TypeError
            yv = yv.astype(np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"eval_set: y_val must hold numbers (regression targets), got "
                            f"dtype {yv.dtype}") from None
        if not np.isfinite(yv).all():
            raise ValueError("eval_set: y_val holds NaN or inf; pass finite targets")
        return yv

    def _check_not_early_stopping(self):
        if self.early_stopping:
            raise ValueError("early_stopping must be False with partial_fit (it holds out "
                             "part of each fit's data; partial_fit runs one epoch): stop "
                             "on your own validation data instead")

    def _prepare_X(self, X, reset):
        return validate_data(self, X, accept_sparse="csr", dtype=_DTYPES, order="C",
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
        see a worker's steps on them that many samples late. H >= n_features buffers
        every weight and reads the rows as they are; a smaller H costs a copy of the
        data per fit (a pass over its nonzeros), which the faster epochs earn back over
        longer fits only. Used with several workers, penalty "l2" or None and no
        momentum. 0: plain Hogwild, every weight shared on every step. "auto" (see
        ``sgd_shm.hogwild.auto_hot_features``), on sparse data with at least 1M
        nonzeros: every feature where K·n_features <= 2^18 and the data has 64 nonzeros
        per feature and worker; else 4096 in a ``fit`` with max_iter >= 10 on data with
        16384 features; else 0 (small problems gain nothing, and the delayed view of the
        buffered weights costs accuracy in the first, large steps).
    instrument : record per-update staleness (updates applied by other workers between
        a worker's read of the weights and its write, the delay tau) in ``staleness_``,
        a histogram (index = tau; the last bin counts tau >= 63). Costs one contended
        atomic per update. With hot features buffered, a worker reads the hot weights
        from its copy, which may miss up to one publication interval of the others'
        steps more than tau says.
    random_state : seeds the shuffling (and early_stopping's split).
    verbose : show the loss of every epoch (logged at INFO on this module's logger, to
        stdout where logging is not configured; at DEBUG without verbose).
    shuffle : shuffle the samples every epoch (default True); False visits them in
        order (with several workers, worker w a w-th contiguous block), as SGDClassifier's
        shuffle=False: with one worker a fit then takes scikit-learn's path step by step.
    early_stopping, validation_fraction : with early_stopping=True, ``fit`` holds out
        validation_fraction (default 0.1) of the samples (stratified by class, seeded
        with random_state, as SGDClassifier) and stops when their accuracy has not risen
        by tol for n_iter_no_change epochs; the scores are in ``validation_scores_``.
        The held-out rows are read in place: only their copy for scoring is made.
    warm_start : ``fit`` starts from the fitted coef_ and intercept_ (the averaged ones
        with ``average``, as SGDClassifier) instead of zeros; the learning-rate schedule
        and the average start over. ``fit`` also takes ``coef_init`` and
        ``intercept_init``, which take precedence.
    average : False (default); True, or an int a >= 1: averaged SGD (ASGD, Polyak and
        Juditsky 1992) from the a-th sample seen on (True: a = 1), as SGDClassifier.
        coef_ and intercept_ are then the averages of the weights after every step
        since (the current weights until averaging has begun); training, partial_fit
        included, goes on from the current weights. The average is kept lazily: a step
        costs one more write per nonzero. Turns off ``hot_features``.
    class_weight : None (default), "balanced" (n_samples / (n_classes ·
        bincount(y)), from fit's y), or a dict {class: weight} (1 for a class left
        out), as SGDClassifier: a sample's step on the output of class c is scaled by
        c's weight when the sample is of class c, and (one-vs-rest) by 1 otherwise; a
        binary problem scales each sample's step by its class's weight. Multiplies
        ``sample_weight``. "balanced" is not available in partial_fit.

    float32 input (dense or CSR) is read as it is, without a float64 copy; the weights
    are float64.
    """
    _losses = ("hinge", "log_loss", "modified_huber")

    def __init__(self, loss="hinge", *, penalty="l2", alpha=1e-4, l1_ratio=0.15,
                 fit_intercept=True, max_iter=1000, tol=1e-3, n_iter_no_change=5,
                 shuffle=True, early_stopping=False, validation_fraction=0.1,
                 class_weight=None, warm_start=False, average=False,
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
        self.shuffle = shuffle
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.class_weight = class_weight
        self.warm_start = warm_start
        self.average = average
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

    def _class_weight_table(self, y, partial):
        """class_weight as the kernels' (K, 2) table (see ``hogwild.Problem``), or None."""
        cw = self.class_weight
        if cw is None:
            return None
        if isinstance(cw, str) and cw == "balanced":
            if partial:
                raise ValueError("class_weight='balanced' is not available in partial_fit "
                                 "(it needs all of y); pass class_weight=compute_class_weight("
                                 "'balanced', classes=classes, y=y_sample) as a dict")
        elif not isinstance(cw, dict):
            raise ValueError(f"class_weight must be None, 'balanced' or a dict {{class: "
                             f"weight}}, got {type(cw).__name__} {cw!r}")
        else:
            for k, v in cw.items():
                if isinstance(v, bool) or not isinstance(v, numbers.Real) \
                        or not np.isfinite(v) or v < 0:
                    raise ValueError(f"class_weight[{k!r}] must be a finite number >= 0, "
                                     f"got {v!r}")
        try:
            w = compute_class_weight(cw, classes=self.classes_, y=y)
        except ValueError as e:
            raise ValueError(f"class_weight: {e} (classes_ = {self.classes_.tolist()})") from e
        if len(self.classes_) == 2:
            return [[w[1], w[0]]]                  # the positive class is classes_[1]
        return np.column_stack([w, np.ones_like(w)])   # one-vs-rest: the rest weigh 1

    def _score_weights(self, W, b, X, y, sample_weight):
        """Accuracy of the weights (W, b) on (X, y) (early_stopping's score)."""
        d = np.asarray(X @ W.T) + b
        pred = self.classes_[(d[:, 0] > 0).astype(int) if d.shape[1] == 1 else d.argmax(1)]
        return float(np.average(pred == y, weights=sample_weight))

    def _fit_inner(self, reset, X, y, sample_weight, classes, max_iter, stop_early, init=None,
                   eval_set=None):
        self._validate_params()
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=_DTYPES, order="C",
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
        n_out = 1 if len(self.classes_) == 2 else len(self.classes_)
        init = self._initial_weights(init, n_out, X.shape[1])
        prob = Problem.from_xy(X, self._targets(y), sample_weight,
                               self._hot_features(max_iter, X, n_out),
                               class_weight=self._class_weight_table(y, not stop_early))
        prob, scorer = self._early_stopping(prob, X, y, sample_weight) if stop_early \
            else (prob, None)
        self.coef_ = self._train(prob, reset, n_out, sp.issparse(X), max_iter, stop_early,
                                 init, scorer, self._held_out(eval_set)).copy()
        return self

    def fit(self, X, y, sample_weight=None, *, coef_init=None, intercept_init=None,
            eval_set=None):
        """Train for up to max_iter epochs (stopping rule: tol), from zeros, or from
        ``coef_init`` (shape (n_classes, n_features), or (1, n_features) for two
        classes) and ``intercept_init`` where given, else with warm_start from the
        fitted coef_ and intercept_. ``eval_set=(X_val, y_val)``: held-out data whose
        accuracy after every epoch is recorded in ``history_`` (``val_score``)."""
        init = self._warm_init(coef_init, intercept_init)
        return self._fit(True, X, y, sample_weight, None, self.max_iter, True, init,
                         eval_set)

    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """One epoch over (X, y), continuing from the current weights. ``classes`` is
        required on the first call."""
        first = not hasattr(self, "classes_")
        if first and classes is None:
            raise ValueError("classes must be passed on the first call to partial_fit")
        self._check_not_early_stopping()
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
    defaults: squared error, invscaling learning rate with eta0 = 0.01). The other
    parameters are HogwildClassifier's (no class_weight), among them:

    shuffle : shuffle the samples every epoch (default True); False visits them in
        order (with several workers, worker w a w-th contiguous block), as SGDClassifier's
        shuffle=False: with one worker a fit then takes scikit-learn's path step by step.
    early_stopping, validation_fraction : with early_stopping=True, ``fit`` holds out
        validation_fraction (default 0.1) of the samples (a random share, seeded
        with random_state, as SGDClassifier) and stops when their R^2 has not risen
        by tol for n_iter_no_change epochs; the scores are in ``validation_scores_``.
        The held-out rows are read in place: only their copy for scoring is made.
    warm_start : ``fit`` starts from the fitted coef_ and intercept_ (the averaged ones
        with ``average``, as SGDClassifier) instead of zeros; the learning-rate schedule
        and the average start over. ``fit`` also takes ``coef_init`` and
        ``intercept_init``, which take precedence.
    average : False (default); True, or an int a >= 1: averaged SGD (ASGD, Polyak and
        Juditsky 1992) from the a-th sample seen on (True: a = 1), as SGDClassifier.
        coef_ and intercept_ are then the averages of the weights after every step
        since (the current weights until averaging has begun); training, partial_fit
        included, goes on from the current weights. The average is kept lazily: a step
        costs one more write per nonzero. Turns off ``hot_features``.
    """
    _losses = ("squared_error",)

    def __init__(self, loss="squared_error", *, penalty="l2", alpha=1e-4, l1_ratio=0.15,
                 fit_intercept=True, max_iter=1000, tol=1e-3, n_iter_no_change=5,
                 shuffle=True, early_stopping=False, validation_fraction=0.1,
                 warm_start=False, average=False,
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
        self.shuffle = shuffle
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.warm_start = warm_start
        self.average = average
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

    def _score_weights(self, W, b, X, y, sample_weight):
        """R^2 of the weights (W, b) on (X, y) (early_stopping's score; as
        sklearn.metrics.r2_score, 1 for a perfect fit of constant y, else 0 there)."""
        pred = np.asarray(X @ W[0]).ravel() + b[0]
        w = np.ones_like(y) if sample_weight is None else sample_weight
        ss_res = float(np.sum(w * (y - pred) ** 2))
        ss_tot = float(np.sum(w * (y - np.average(y, weights=w)) ** 2))
        if ss_tot == 0.0:
            return 1.0 if ss_res == 0.0 else 0.0
        return 1.0 - ss_res / ss_tot

    def _fit_inner(self, reset, X, y, sample_weight, max_iter, stop_early, init=None,
                   eval_set=None):
        self._validate_params()
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=_DTYPES, order="C",
                             y_numeric=True, reset=reset)
        y = np.asarray(y, dtype=np.float64)
        sample_weight = self._check_sample_weight(sample_weight, X.shape[0])
        init = self._initial_weights(init, 1, X.shape[1])
        prob = Problem.from_xy(X, y.reshape(-1, 1), sample_weight,
                               self._hot_features(max_iter, X, 1))
        prob, scorer = self._early_stopping(prob, X, y, sample_weight) if stop_early \
            else (prob, None)
        self.coef_ = self._train(prob, reset, 1, sp.issparse(X), max_iter, stop_early, init,
                                 scorer, self._held_out(eval_set))[0].copy()
        return self

    def fit(self, X, y, sample_weight=None, *, coef_init=None, intercept_init=None,
            eval_set=None):
        """Train for up to max_iter epochs (stopping rule: tol), from zeros, or from
        ``coef_init`` (n_features,) and ``intercept_init`` where given, else with
        warm_start from the fitted coef_ and intercept_. ``eval_set=(X_val, y_val)``:
        held-out data whose R^2 after every epoch is recorded in ``history_``
        (``val_score``)."""
        init = self._warm_init(coef_init, intercept_init)
        return self._fit(True, X, y, sample_weight, self.max_iter, True, init, eval_set)

    def partial_fit(self, X, y, sample_weight=None):
        """One epoch over (X, y), continuing from the current weights."""
        self._check_not_early_stopping()
        return self._fit(not hasattr(self, "_state"), X, y, sample_weight, 1, False)

    def _decision(self, X):
        check_is_fitted(self, "coef_")
        X = self._prepare_X(X, reset=False)
        return np.asarray(X @ self.coef_).ravel() + self.intercept_[0]

    def predict(self, X):
        return self._decision(X)
