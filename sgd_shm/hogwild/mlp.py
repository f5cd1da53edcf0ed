"""A multi-layer perceptron trained by Hogwild SGD, with optional block partitioning.

``HogwildMLPClassifier`` follows scikit-learn's ``MLPClassifier`` with
``solver="sgd"`` (ReLU hidden layers, softmax output, Glorot initialisation, the
same minibatches, learning-rate schedules, momentum and stopping rule) and adds
``n_workers`` workers that update one flat weight vector without locks (Hogwild!,
Niu et al. 2011): threads running a nogil Numba epoch on one array, or processes
on weights in shared memory. Each worker computes minibatch gradients of the
model (``sgd_shm.models.MLP``) at weights it reads without locks, and writes its
steps with plain stores.

``partition="blocks"`` is the block variable partitioning of Kungurtsev, Egan,
Chatterjee, Alistarh, "Asynchronous optimization methods for efficient training
of deep neural networks with guarantees" (arXiv:1905.11845): before training,
each layer's coefficient rows are split into contiguous blocks, one per worker
(``MLP.blocks``), so each worker alone owns a set of coordinate blocks; at every
iteration it reads the shared weights without locks, draws one of its blocks
uniformly, computes the minibatch gradient of that block only (the backward pass
stops at the block's layer) and updates the block, with momentum kept per block.
An iteration then moves one layer of the network, not all of them: it is
cheaper, and an epoch moves each weight less often.

Example::

    from sklearn.datasets import load_digits
    from sgd_shm import HogwildMLPClassifier
    X, y = load_digits(return_X_y=True)
    clf = HogwildMLPClassifier((64,), learning_rate_init=0.05, max_iter=50, n_workers=2,
                               random_state=0).fit(X / 16, y)
    clf.score(X / 16, y), clf.predict_proba(X[:2] / 16)
"""
from __future__ import annotations

import contextlib
import logging
import warnings

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from sgd_shm.models import _mlp
from sgd_shm.core.atomics import LINE_WORDS, read_only_fields
from sgd_shm.core.launcher import check_start_method
from sgd_shm.core.validation import (check_bool, check_choice, check_int, check_momentum,
                                     check_number, check_verbose, eval_pair, resolve_workers)
from sgd_shm.hogwild._history import EpochHistory, score_note
from sgd_shm.hogwild._log import epoch_level, verbose_logging
from sgd_shm.hogwild.engine import DivergenceError, run_workers
from sgd_shm.models import MLP, one_blas_thread, scratch
from sgd_shm.models.mlp import hidden_sizes

__all__ = ["HogwildMLPClassifier", "HogwildTrainer"]

_log = logging.getLogger(__name__)

_LEARNING_RATES = ("constant", "invscaling", "adaptive")
_BACKENDS = ("threads", "processes")
_PARTITIONS = (None, "blocks")
_NO_TRACE = np.empty(0, np.int64)
_NO_BLOCKS = np.empty(0, np.int64)


_CHILD = {"limited": False, "scratch": {}}


def _mlp_step(wid, v, static, lo, hi, lr, mu, nesterov):
    """A worker process's share of an epoch (``core.launcher.SharedWorkers`` step)."""
    net, data, batch, blocks, owned = static
    # arrived writeable from shared memory: read-only, as in the parent (one compile)
    net, data = read_only_fields(net), read_only_fields(data)
    if not _CHILD["limited"]:               # a spawned child: its own BLAS, limited once
        one_blas_thread()
        _CHILD["limited"] = True
    key = (wid, batch, tuple(net.sizes))
    scr = _CHILD["scratch"].get(key)
    if scr is None:
        scr = _CHILD["scratch"][key] = scratch(net, batch)
    out = np.zeros(_mlp.N_OUT)
    V = v["V"][0 if owned[wid].shape[0] else wid]
    _mlp.run_worker(net, data, v["w"], V, _mlp.Share(v["order"], lo, hi, batch),
                    _mlp.Blocks(blocks, owned[wid], v["rng"][wid], _NO_TRACE),
                    _mlp.Step(float(lr), float(mu), bool(nesterov)), scr, out)
    return out


class HogwildTrainer:
    """Hogwild SGD of an :class:`~sgd_shm.models.MLP` (or ``SoftmaxRegression``) on
    one flat weight vector ``w``, epoch by epoch.

    ``n_workers`` workers take contiguous parts of each epoch's order and step the
    shared ``w`` by minibatches of ``batch``; without ``partition`` each keeps its
    own velocity (``V[w]``), with ``partition="blocks"`` each steps only the blocks
    it owns (``model.blocks(n_workers)``), whose velocities are theirs alone.
    ``trace=True`` (threads) records the block of every minibatch in ``traces``.
    Use :meth:`session` around a run of :meth:`epoch` calls."""

    def __init__(self, model, w, *, n_workers=1, batch=200, momentum=0.0, nesterov=True,
                 partition=None, backend="threads", start_method="fork", seed=0, trace=False):
        check_choice("partition", partition, _PARTITIONS)
        check_choice("backend", backend, _BACKENDS)
        if w.shape != (model.n_params,) or w.dtype != np.float64:
            raise ValueError(f"w must be float64 of shape ({model.n_params},) (model.init), got "
                             f"{w.dtype} {w.shape}")
        self.model, self.w, self.batch = model, w, int(batch)
        self.n_workers, self.backend, self.start_method = int(n_workers), backend, start_method
        self.momentum, self.nesterov = float(momentum), bool(nesterov)
        nw = self.n_workers
        if partition == "blocks":
            self.blocks, self.owned = model.blocks(nw)
        else:
            self.blocks, self.owned = _NO_BLOCKS, [_NO_BLOCKS] * nw
        rows = 1 if partition == "blocks" else nw
        self.V = np.zeros((rows, model.n_params if self.momentum > 0 else 0))
        seeds = np.random.SeedSequence(seed).generate_state(nw, np.uint64)
        self.rng = np.zeros((nw, LINE_WORDS), np.uint64)      # a cache line per worker
        self.rng[:, 0] = seeds
        self.trace, self.traces = trace, []
        self._pool = None

    @contextlib.contextmanager
    def session(self, data):
        """BLAS on one thread; with the processes backend, worker processes on ``w``,
        ``V``, the order and the block streams in one shared segment, released on
        exit (the arrays are copied back)."""
        with one_blas_thread():
            if self.backend != "processes":
                self._scratch = [scratch(self.model.net, self.batch)
                                 for _ in range(self.n_workers)]
                try:
                    yield self
                finally:
                    del self._scratch
                return
            from sgd_shm.core.launcher import SharedWorkers
            n = data.y.shape[0]
            arrays = {"w": (self.w.shape, np.float64), "V": (self.V.shape, np.float64),
                      "rng": (self.rng.shape, np.uint64), "order": ((n,), np.int64)}
            static = (self.model.net, data, self.batch, self.blocks, self.owned)
            # every worker a process (no driver_works): _mlp_step limits BLAS to one
            # thread and keeps scratch buffers in the process that runs it
            pool = SharedWorkers(arrays, _mlp_step, static, self.start_method)
            try:
                pool.adopt(self, {"w": "w", "V": "V", "rng": "rng"})
                pool.start(self.n_workers)
                self._pool = pool
                yield self
            finally:
                self._pool = None
                pool.close()

    def epoch(self, data, order, lr):
        """One pass over ``order`` (int64 row indices) at learning rate ``lr``; returns
        the mean minibatch loss as visited (scikit-learn's ``loss_``). Raises
        DivergenceError on a non-finite loss."""
        nw = self.n_workers
        order = np.ascontiguousarray(order, dtype=np.int64)
        bounds = np.linspace(0, order.shape[0], nw + 1).astype(np.int64)
        step = _mlp.Step(float(lr), self.momentum, self.nesterov)
        outs = np.zeros((nw, LINE_WORDS))
        if self._pool is not None:
            self._pool.views["order"][...] = order
            res = self._pool.run(lambda k: (int(bounds[k]), int(bounds[k + 1]), step.lr,
                                            step.momentum, step.nesterov))
            for k, out in enumerate(res):
                outs[k, :_mlp.N_OUT] = out
        else:
            traces = [np.full(-(-(bounds[k + 1] - bounds[k]) // self.batch), -1, np.int64)
                      if self.trace else _NO_TRACE for k in range(nw)]

            def work(k):
                V = self.V[0 if self.owned[k].shape[0] else k]
                _mlp.run_worker(self.model.net, data, self.w, V,
                                _mlp.Share(order, int(bounds[k]), int(bounds[k + 1]), self.batch),
                                _mlp.Blocks(self.blocks, self.owned[k], self.rng[k], traces[k]),
                                step, self._scratch[k], outs[k])
            run_workers(work, nw)
            if self.trace:
                self.traces.append(traces)
        if outs[:, _mlp.O_DIVERGED].any() or not np.isfinite(self.w).all():
            raise DivergenceError("the MLP's loss became inf or NaN: the learning rate is too "
                                  "large for this data; lower learning_rate_init or scale the "
                                  "features (e.g. StandardScaler)")
        return float(outs[:, _mlp.O_LOSS].sum() / order.shape[0])


class HogwildMLPClassifier(ClassifierMixin, BaseEstimator):
    """A multi-layer perceptron classifier trained by Hogwild SGD (the parameters of
    ``MLPClassifier(solver="sgd", activation="relu")``).

    Parameters
    ----------
    hidden_layer_sizes : units of each hidden (ReLU) layer; () is multinomial
        logistic regression.
    alpha : L2 strength on the coefficient matrices (minibatch loss + alpha/(2B) ||W||^2).
    batch_size : rows per minibatch; "auto" is min(200, n_samples).
    learning_rate : "constant" (learning_rate_init), "invscaling" (learning_rate_init /
        (t+1)^power_t after each epoch, t: samples seen) or "adaptive" (divided by 5
        whenever the stopping rule fires, until below 1e-6).
    learning_rate_init, power_t : see learning_rate.
    max_iter, tol, n_iter_no_change : epochs, and scikit-learn's stopping rule: stop
        when the epoch's loss has not improved on the best by tol for more than
        n_iter_no_change epochs.
    shuffle : a fresh random order of the samples every epoch (else in order).
    momentum, nesterovs_momentum : heavy-ball momentum in [0, 1), Nesterov's variant
        by default, as ``MLPClassifier``. Each worker keeps its velocity: of all the
        weights, or with partition="blocks" of its own blocks.
    n_workers : workers updating the shared weights without locks; 1 (default) is a
        serial fit that a fixed random_state reproduces exactly; -1 uses every CPU.
    backend : "threads" (nogil Numba workers on one array) or "processes" (workers
        on weights in a shared-memory segment that lives for one fit and is always
        released).
    start_method : how the processes backend starts its workers: "fork" (default),
        "forkserver" or "spawn" (see ``HogwildClassifier``).
    partition : None (every worker steps every weight) or "blocks": each layer's rows
        split into one block per worker, which that worker alone updates; each
        minibatch updates one of the worker's blocks, drawn at random
        (arXiv:1905.11845). An epoch then moves each block about 1/n_layers as often.
    random_state : seeds the initialisation, the orders and the block draws.
    verbose : show the loss of every epoch (logged at INFO on this module's logger, to
        stdout where logging is not configured; at DEBUG without verbose).

    The output layer is a softmax over the classes, also for two classes (where
    ``MLPClassifier`` uses one logistic unit), so ``coefs_[-1]`` has n_classes columns.
    Matrix products run in BLAS on one thread per worker for the time of a fit.
    """

    def __init__(self, hidden_layer_sizes=(100,), *, alpha=0.0001, batch_size="auto",
                 learning_rate="constant", learning_rate_init=0.001, power_t=0.5, max_iter=200,
                 shuffle=True, random_state=None, tol=1e-4, verbose=False, momentum=0.9,
                 nesterovs_momentum=True, n_iter_no_change=10, n_workers=1, backend="threads",
                 start_method="fork", partition=None):
        self.hidden_layer_sizes = hidden_layer_sizes
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.learning_rate_init = learning_rate_init
        self.power_t = power_t
        self.max_iter = max_iter
        self.shuffle = shuffle
        self.random_state = random_state
        self.tol = tol
        self.verbose = verbose
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.n_iter_no_change = n_iter_no_change
        self.n_workers = n_workers
        self.backend = backend
        self.start_method = start_method
        self.partition = partition

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    # -- parameters -------------------------------------------------------------------------
    def _hidden(self):
        return hidden_sizes(self.hidden_layer_sizes)

    def _validate_params(self):
        self._hidden()
        check_number("alpha", self.alpha, lo=0)
        if not (isinstance(self.batch_size, str) and self.batch_size == "auto"):
            if isinstance(self.batch_size, str):
                raise ValueError(f"batch_size: must be 'auto' or an int >= 1, got "
                                 f"{self.batch_size!r}")
            check_int("batch_size", self.batch_size, lo=1)
        check_choice("learning_rate", self.learning_rate, _LEARNING_RATES)
        check_number("learning_rate_init", self.learning_rate_init, lo=0, lo_open=True)
        check_number("power_t", self.power_t)
        check_int("max_iter", self.max_iter, lo=1)
        check_number("tol", self.tol, lo=0)
        check_int("n_iter_no_change", self.n_iter_no_change, lo=1)
        check_momentum(self.momentum)
        resolve_workers(self.n_workers)
        check_choice("backend", self.backend, _BACKENDS)
        check_start_method(self.start_method)
        check_choice("partition", self.partition, _PARTITIONS)
        check_bool("shuffle", self.shuffle)
        check_bool("nesterovs_momentum", self.nesterovs_momentum)
        check_verbose(self.verbose)

    # -- fit --------------------------------------------------------------------------------
    def fit(self, X, y, *, eval_set=None):
        """Train on (X, y) for up to max_iter epochs (see the stopping rule).
        ``eval_set=(X_val, y_val)``: held-out data whose accuracy after every epoch is
        recorded in ``history_`` (``val_score``)."""
        self._validate_params()
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=(np.float64, np.float32),
                             order="C")
        check_classification_targets(y)
        self.classes_, y_idx = np.unique(y, return_inverse=True)
        if self.classes_.shape[0] < 2:
            raise ValueError(f"y has only 1 class ({self.classes_[0]!r}); a classifier needs "
                             "samples of at least 2 classes")
        nw = resolve_workers(self.n_workers)
        if X.shape[0] < nw:
            raise ValueError(f"n_workers={nw} but X has only {X.shape[0]} rows; every worker "
                             "needs one: use fewer workers")
        model = MLP(X.shape[1], self._hidden(), self.classes_.shape[0], float(self.alpha))
        seed = check_random_state(self.random_state).randint(2**31 - 1)
        rng = np.random.default_rng(seed)
        w = model.init(rng)
        data = model.prepare(X, y_idx)
        n = X.shape[0]
        batch = min(200, n) if self.batch_size == "auto" else int(min(self.batch_size, n))
        trainer = HogwildTrainer(model, w, n_workers=nw, batch=batch,
                                 momentum=float(self.momentum),
                                 nesterov=bool(self.nesterovs_momentum), partition=self.partition,
                                 backend=self.backend, start_method=self.start_method,
                                 seed=int(rng.integers(2**63 - 1)))
        for name in ("coefs_", "intercepts_", "n_iter_"):
            self.__dict__.pop(name, None)
        self.loss_curve_, self.t_, self.n_iter_ = [], 0, 0
        history = EpochHistory(self._held_out(eval_set, model, trainer))
        self.history_ = history.records
        with trainer.session(data), verbose_logging(_log, self.verbose):
            self._epochs(trainer, data, rng, n, history)
        self.coefs_, self.intercepts_ = (list(map(np.copy, a)) for a in model.unpack(trainer.w))
        self.n_layers_ = model.n_layers + 1
        self.n_outputs_ = model.n_outputs
        self.out_activation_ = "softmax"
        if trainer.blocks.shape[0]:
            self.blocks_, self.block_owners_ = trainer.blocks, trainer.owned
        return self

    def _epoch_order(self, rng, n):
        """The rows of the next epoch, in order: a fresh permutation (shuffle) or 0..n-1."""
        return rng.permutation(n).astype(np.int64) if self.shuffle else np.arange(n)

    def _held_out(self, eval_set, model, trainer):
        """The scorer of ``eval_set`` (None: None): accuracy of the current weights."""
        pair = eval_pair(eval_set)
        if pair is None:
            return None
        Xv = validate_data(self, pair[0], accept_sparse="csr",
                           dtype=(np.float64, np.float32), reset=False)
        yv = np.asarray(pair[1])
        if yv.shape != (Xv.shape[0],):
            raise ValueError(f"eval_set: X_val has {Xv.shape[0]} rows but y_val has shape "
                             f"{yv.shape}; pass one label per held-out row")
        if not np.isin(yv, self.classes_).all():
            raise ValueError("eval_set: y_val holds labels that are not among the training "
                             f"classes {self.classes_.tolist()[:5]}")
        return lambda: float(np.mean(self.classes_[model.predict(trainer.w, Xv)] == yv))

    def _epochs(self, trainer, data, rng, n, history):
        """scikit-learn's ``_fit_stochastic`` loop (without early_stopping)."""
        lr = float(self.learning_rate_init)
        self.best_loss_, stall = np.inf, 0
        for _ in range(self.max_iter):
            self.loss_ = trainer.epoch(data, self._epoch_order(rng, n), lr)
            self.n_iter_ += 1
            self.t_ += n
            self.loss_curve_.append(self.loss_)
            rec = history.add(self.n_iter_, self.loss_)
            _log.log(epoch_level(self.verbose), "Iteration %d, loss = %.8f%s", self.n_iter_,
                     self.loss_, score_note(rec))
            stall = stall + 1 if self.loss_ > self.best_loss_ - self.tol else 0
            self.best_loss_ = min(self.best_loss_, self.loss_)
            if self.learning_rate == "invscaling":
                lr = float(self.learning_rate_init) / (self.t_ + 1) ** float(self.power_t)
            if stall > self.n_iter_no_change:
                if self.learning_rate == "adaptive" and lr > 1e-6:
                    lr /= 5.0
                    stall = 0
                    continue
                _log.log(epoch_level(self.verbose), "Training loss did not improve more "
                         "than tol=%s for %d consecutive epochs. Stopping.", self.tol,
                         self.n_iter_no_change)
                return
        warnings.warn(f"Stochastic Optimizer: Maximum iterations ({self.max_iter}) reached "
                      "and the optimization hasn't converged yet.", ConvergenceWarning)

    # -- predict ----------------------------------------------------------------------------
    def _scores(self, X):
        check_is_fitted(self, "coefs_")
        X = validate_data(self, X, accept_sparse="csr", dtype=(np.float64, np.float32),
                          reset=False)
        a = X
        for l, (c, b) in enumerate(zip(self.coefs_, self.intercepts_)):
            a = np.asarray(a @ c, dtype=np.float64) + b
            if l < len(self.coefs_) - 1:
                np.maximum(a, 0.0, out=a)
        return a

    def predict_proba(self, X):
        """Class probabilities (n_samples, n_classes): the softmax output."""
        z = self._scores(X)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    def predict_log_proba(self, X):
        """Log of predict_proba, computed stably."""
        z = self._scores(X)
        z = z - z.max(axis=1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=1, keepdims=True))

    def predict(self, X):
        """The class of the highest probability."""
        scores = self._scores(X)          # (checks that the model is fitted first)
        return self.classes_[np.argmax(scores, axis=1)]
