"""Hogwild SGD of a PyTorch ``nn.Module``: ``n_workers`` threads or processes update one
flat float32 weight vector without locks (Hogwild!, Niu, Recht, Re, Wright, NIPS 2011).

The module's parameters are views of the vector (:class:`~sgd_shm.torch.TorchModel`);
with ``backend="processes"`` the vector lives in a shared-memory segment of the kit's
launcher (:class:`sgd_shm.core.launcher.SharedWorkers`) and every worker's replica of
the module has its parameters pointed at it, so no step copies weights: a worker reads
the vector as it is (other workers' steps land in it meanwhile), computes its
minibatch gradient by autograd into its own float32 buffer, and writes its step into
the vector with plain (racy, lock-free) stores. Each epoch the driver draws a
permutation of the samples; worker k takes the k-th contiguous part of it, in
minibatches of ``batch_size``. Each worker keeps its momentum buffer (torch's
heavy-ball form: v = momentum v + g, w -= lr v, as ``torch.optim.SGD``), so one worker
is exactly serial ``torch.optim.SGD`` over the same minibatches.

``partition="blocks"``: block variable partitioning (Kungurtsev, Egan, Chatterjee,
Alistarh, arXiv:1905.11845). The vector is cut into layer blocks (each submodule's
parameter tensors), dealt to the workers balanced by size
(:meth:`TorchModel.blocks`); each minibatch, a worker draws one of its own blocks
uniformly, computes the gradient of that block only (autograd stops at the block's
layer) and updates it: no two workers ever write the same weight.

This is the scheme of PyTorch's own ``mnist_hogwild`` example (``model.share_memory()``
and one optimizer per process) with the kit's machinery: the launcher reports a dead
worker instead of hanging and leaves nothing in /dev/shm, threads are an option, the
momentum buffers and the sample order are the fit's (seeded), and the workers can be
given disjoint blocks.

Example::

    from sgd_shm.data import load_digits_split
    from sgd_shm.torch import DigitsCNN, HogwildNetClassifier
    X, X_test, y, y_test = load_digits_split()
    clf = HogwildNetClassifier(DigitsCNN(seed=0), n_workers=2, backend="processes",
                               lr=0.05, momentum=0.9, max_epochs=10, random_state=0)
    clf.fit(X, y, eval_set=(X_test, y_test))
    clf.history_[-1]["val_score"], clf.score(X_test, y_test)
"""
from __future__ import annotations

import copy
import logging
import math
import threading
import time

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from sgd_shm.core.errors import DivergenceError
from sgd_shm.core.launcher import check_start_method, run_workers
from sgd_shm.core.schedules import for_run, make_schedule
from sgd_shm.core.validation import (
    check_choice,
    check_eval_set,
    check_int,
    check_momentum,
    check_verbose,
    model_data,
    model_X,
    resolve_workers,
)
from sgd_shm.torch.model import LOSSES, TorchModel, one_torch_thread

__all__ = ["HogwildNetClassifier", "NetHogwild"]

_log = logging.getLogger(__name__)

_BACKENDS = ("threads", "processes")
_PARTITIONS = (None, "blocks")
_GRADS = threading.local()      # each thread's (or process's) float32 gradient buffer


def epoch_order(seed, epoch, n):
    """The rows of epoch ``epoch`` (from 1) of a fit whose seed is ``seed``: a
    permutation drawn from ``default_rng([seed, epoch])``."""
    return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64)


def epoch_seeds(seed, epoch, n_workers):
    """The seeds of the workers' block draws in epoch ``epoch``."""
    return np.random.default_rng([seed, epoch, 1]).integers(0, 2**63 - 1, n_workers)


def _grad_buffer(n):
    g = getattr(_GRADS, "g", None)
    if g is None or g.shape[0] != n:
        g = _GRADS.g = np.zeros(n, np.float32)
    return g


def run_part(model, data, w, V, rows, batch, lr, mu, blocks, seed):
    """One worker's share of an epoch: minibatches of ``batch`` of ``rows`` (int64),
    each a step of the shared float32 weights ``w`` (V: this worker's momentum
    buffer, or None). ``blocks``: (bounds, owned) of the blocks this worker draws
    from (uniformly, from ``seed``), or None for all the weights. Returns (the sum of
    the minibatch losses times their sizes, steps taken; a non-finite loss ends the
    part early with that sum NaN)."""
    n = model.n_params
    g = _grad_buffer(n)
    wt, gt = torch.from_numpy(w), torch.from_numpy(g)
    vt = torch.from_numpy(V) if V is not None else None
    rng = np.random.default_rng(seed) if blocks is not None else None
    total, steps = 0.0, 0
    for s in range(0, rows.shape[0], batch):
        r = rows[s:s + batch]
        if blocks is None:
            lo, hi, block = 0, n, None
        else:
            bounds, owned = blocks
            b = owned[rng.integers(owned.shape[0])]
            lo, hi = int(bounds[b]), int(bounds[b + 1])
            block = (lo, hi)
        loss = model.loss_grad(w, data, r, g, block)
        steps += 1
        if not math.isfinite(loss):
            return math.nan, steps
        total += loss * r.shape[0]
        with torch.no_grad():                       # torch.optim.SGD's update, in place
            if vt is not None:
                vt[lo:hi].mul_(mu).add_(gt[lo:hi])
                wt[lo:hi].add_(vt[lo:hi], alpha=-lr)
            else:
                wt[lo:hi].add_(gt[lo:hi], alpha=-lr)
    return total, steps


def _net_step(wid, v, static, lo, hi, lr, mu, seed):
    """A worker's share of an epoch (a :class:`SharedWorkers` step): positions
    [lo, hi) of the epoch's order, on the shared weights and its momentum row."""
    model, data, batch, bounds, owned = static
    V = v["V"][wid] if v["V"].shape[1] else None
    blocks = (bounds, owned[wid]) if bounds is not None else None
    return run_part(model, data, v["w"], V, v["order"][lo:hi], batch, lr, mu, blocks, seed)


class NetHogwild:
    """The lock-free epochs of :class:`HogwildNetClassifier` on a
    :class:`TorchModel`'s own flat float32 vector (``model.weights``: training moves
    the module itself). Use :meth:`session` around a run of :meth:`epoch` calls."""

    def __init__(self, model, *, n_workers=1, batch=32, lr=0.01, momentum=0.0,
                 partition=None, backend="threads", start_method="fork"):
        self.model, self.n_workers, self.batch = model, int(n_workers), int(batch)
        self.lr, self.momentum = float(lr), float(momentum)
        self.backend, self.start_method = backend, start_method
        if partition == "blocks":
            self.bounds, self.owned = model.blocks(self.n_workers)
        else:
            self.bounds, self.owned = None, [None] * self.n_workers
        self.w = model.weights
        self.V = np.zeros((self.n_workers, model.n_params if self.momentum > 0 else 0),
                          np.float32)
        self._pool = None

    def session(self, data, n_rows):
        """A context: torch on one thread per worker; with the processes backend,
        worker processes on ``w``, the momentum rows and the order in one shared
        segment (copied back into the module's vector and released on exit)."""
        import contextlib

        @contextlib.contextmanager
        def run():
            with one_torch_thread():
                if self.backend != "processes":
                    yield self
                    return
                from sgd_shm.core.launcher import SharedWorkers
                arrays = {"w": (self.w.shape, np.float32), "V": (self.V.shape, np.float32),
                          "order": ((n_rows,), np.int64)}
                static = (self.model, data, self.batch, self.bounds, self.owned)
                pool = SharedWorkers(arrays, _net_step, static, self.start_method,
                                     driver_works=True)
                try:
                    pool.adopt(self, {"w": "w", "V": "V"})
                    pool.start(self.n_workers)
                    self._pool = pool
                    yield self
                finally:
                    self._pool = None
                    pool.close()
        return run()

    def epoch(self, data, order, seeds):
        """One pass over ``order`` (int64 rows): worker k takes the k-th contiguous
        part; ``seeds[k]`` seeds its block draws. Returns the mean minibatch loss as
        visited. Raises DivergenceError on a non-finite loss or weight."""
        nw = self.n_workers
        order = np.ascontiguousarray(order, dtype=np.int64)
        cuts = np.linspace(0, order.shape[0], nw + 1).astype(np.int64)
        if self._pool is not None:
            self._pool.views["order"][...] = order
            outs = self._pool.run(lambda k: (int(cuts[k]), int(cuts[k + 1]), self.lr,
                                             self.momentum, int(seeds[k])))
        else:
            outs = [None] * nw

            def work(k):
                V = self.V[k] if self.V.shape[1] else None
                blocks = (self.bounds, self.owned[k]) if self.bounds is not None else None
                outs[k] = run_part(self.model, data, self.w, V, order[cuts[k]:cuts[k + 1]],
                                   self.batch, self.lr, self.momentum, blocks, int(seeds[k]))
            run_workers(work, nw)
        total = sum(t for t, _ in outs)
        if not math.isfinite(total) or not np.isfinite(self.w).all():
            raise DivergenceError("the network's loss became inf or NaN: the learning rate is "
                                  "too large for this data; lower lr (or scale the inputs)")
        return total / max(order.shape[0], 1)


class HogwildNetClassifier(ClassifierMixin, BaseEstimator):
    """A PyTorch classifier trained by Hogwild SGD (see the module notes); skorch's
    names for the training settings, scikit-learn's for the rest.

    Parameters
    ----------
    module : the network: an ``nn.Module`` instance (copied at each fit; the trained
        copy is ``module_``) or class (built with no arguments). It outputs class
        scores (logits; log-probabilities with ``loss="nll_loss"``) and declares
        ``input_shape`` (or pass X shaped like its input, see ``input_shape``).
    n_workers : workers updating the shared weights without locks; 1 (default) is
        serial ``torch.optim.SGD``; -1 uses every CPU.
    backend : "threads" (one process; torch releases the GIL inside its operators) or
        "processes" (the calling process and n_workers - 1 worker processes on
        weights in a shared-memory segment that lives for one fit).
    max_epochs : passes over the training data.
    lr, momentum : SGD's step and heavy-ball momentum in [0, 1) (torch.optim.SGD's
        form; each worker keeps its own momentum buffer). ``lr``: a number, or a
        schedule of the epoch (``Cosine(0.1)``: over the max_epochs, ``StepDecay``, any
        callable ``t -> step`` of :mod:`sgd_shm.core.schedules`): epoch e steps at
        ``lr(e - 1)``, as a torch scheduler stepped once per epoch.
    batch_size : rows per minibatch.
    partition : None (every worker steps every weight) or "blocks": each worker alone
        owns some layers and each minibatch moves one of them, drawn at random
        (arXiv:1905.11845); needs at least n_workers layers with parameters.
    random_state : seeds the sample orders and the block draws: with seed =
        ``check_random_state(random_state).randint(2**31 - 1)``, epoch e visits the
        rows in the order :func:`epoch_order` (seed, e, n) (the module's initial
        weights are its own: seed torch, or build e.g. ``DigitsCNN(seed=0)``).
    loss : "cross_entropy" (default) or "nll_loss".
    input_shape : the shape of one sample when the module declares none.
    start_method : how the processes backend starts its workers ("fork", the
        default, "forkserver" or "spawn"; see ``sgd_shm.core.launcher``).
    verbose : log each epoch's record (INFO on this module's logger).

    Attributes after ``fit``: ``classes_``, ``module_`` (the trained network),
    ``model_`` (its :class:`TorchModel`), ``n_iter_`` (epochs run), ``loss_curve_``
    (each epoch's mean minibatch loss as visited), ``history_`` (one record per epoch:
    ``seconds`` of training so far, evaluation excluded; ``step``, the epoch; ``loss``;
    with ``eval_set``, ``val_loss`` and ``val_score``, the held-out loss and accuracy),
    ``blocks_`` and ``block_owners_`` under ``partition="blocks"``.
    """

    def __init__(self, module, *, n_workers=1, backend="threads", max_epochs=10, lr=0.01,
                 momentum=0.0, batch_size=32, partition=None, random_state=None,
                 loss="cross_entropy", input_shape=None, start_method="fork", verbose=False):
        self.module = module
        self.n_workers = n_workers
        self.backend = backend
        self.max_epochs = max_epochs
        self.lr = lr
        self.momentum = momentum
        self.batch_size = batch_size
        self.partition = partition
        self.random_state = random_state
        self.loss = loss
        self.input_shape = input_shape
        self.start_method = start_method
        self.verbose = verbose

    def _validate_params(self):
        """Check the settings; returns the fit's step schedule (``lr`` over the epochs)."""
        resolve_workers(self.n_workers)
        check_choice("backend", self.backend, _BACKENDS)
        check_int("max_epochs", self.max_epochs, lo=1)
        check_verbose(self.verbose)
        lr = for_run(make_schedule(self.lr), 0, int(self.max_epochs))
        check_momentum(self.momentum)
        check_int("batch_size", self.batch_size, lo=1)
        check_choice("partition", self.partition, _PARTITIONS)
        check_choice("loss", self.loss, tuple(LOSSES))
        check_start_method(self.start_method)
        return lr

    def _build(self):
        m = self.module
        if isinstance(m, type) and issubclass(m, torch.nn.Module):
            m = m()
        elif isinstance(m, torch.nn.Module):
            m = copy.deepcopy(m)
        else:
            raise TypeError(f"module: must be a torch.nn.Module instance or class, got "
                            f"{type(m).__name__}; e.g. HogwildNetClassifier(DigitsCNN())")
        return TorchModel(m, self.loss, input_shape=self.input_shape)

    def fit(self, X, y, eval_set=None):
        """Train on (X, y) (X: float32 samples shaped like the module's input, or rows
        of as many values) for ``max_epochs`` epochs; ``eval_set=(X_val, y_val)``
        scores held-out data after every epoch (``history_``)."""
        lr = self._validate_params()
        model = self._build()
        nw = resolve_workers(self.n_workers)
        X, yi, classes = model_data(X, y, model, nw)
        if classes.shape[0] < 2:
            raise ValueError(f"y has only 1 class ({classes[0]!r}); a classifier needs "
                             "samples of at least 2 classes")
        evals = check_eval_set(eval_set, model, classes)
        self._forget()
        try:
            self._train(model, lr, nw, X, yi, classes, evals)
        except BaseException:
            self._forget()              # a diverged or failed fit leaves no half-trained net
            raise
        return self

    _FITTED = ("classes_", "model_", "module_", "loss_curve_", "history_", "n_iter_",
               "blocks_", "block_owners_")

    def _forget(self):
        for name in self._FITTED:
            self.__dict__.pop(name, None)

    def _train(self, model, lr, nw, X, yi, classes, evals):
        """The epochs of a fit (see :meth:`fit`), publishing the fitted attributes."""
        self.classes_, self.model_, self.module_ = classes, model, model.module
        seed = int(check_random_state(self.random_state).randint(2**31 - 1))
        trainer = NetHogwild(model, n_workers=nw, batch=self.batch_size, lr=lr(0),
                             momentum=self.momentum, partition=self.partition,
                             backend=self.backend, start_method=self.start_method)
        data = model.prepare(X, yi)
        val = None if evals is None else (model.prepare(*evals), evals[0], evals[1])
        self.loss_curve_, self.history_, self.n_iter_ = [], [], 0
        n, trained = X.shape[0], 0.0
        with trainer.session(data, n):
            for epoch in range(1, int(self.max_epochs) + 1):
                order = epoch_order(seed, epoch, n)
                trainer.lr = lr(epoch - 1)
                t0 = time.perf_counter()
                loss = trainer.epoch(data, order, epoch_seeds(seed, epoch, nw))
                trained += time.perf_counter() - t0
                self._record(epoch, trained, loss, val, trainer.w)
        if trainer.bounds is not None:
            self.blocks_, self.block_owners_ = trainer.bounds, trainer.owned

    def _record(self, epoch, seconds, loss, val, w):
        self.n_iter_ = epoch
        self.loss_curve_.append(float(loss))
        rec = {"seconds": seconds, "step": epoch, "loss": float(loss)}
        if val is not None:
            data, Xv, yv = val
            rec["val_loss"] = self.model_.loss(w, data)
            rec["val_score"] = float(np.mean(self.model_.predict(w, Xv) == yv))
        self.history_.append(rec)
        _log.log(logging.INFO if self.verbose else logging.DEBUG, "epoch %d: %s", epoch,
                 ", ".join(f"{k}={v:.4g}" for k, v in rec.items() if k != "step"))

    # -- predict ----------------------------------------------------------------------------
    def _X(self, X):
        # called before any fitted attribute is touched: an unfitted estimator says so
        check_is_fitted(self, "model_")
        return model_X(X, self.model_)

    def decision_function(self, X):
        """The module's outputs (n_samples, n_classes)."""
        X = self._X(X)
        return self.model_.decision_function(self.model_.weights, X)

    def predict_proba(self, X):
        """Class probabilities: the softmax of the module's outputs."""
        X = self._X(X)
        return self.model_.predict_proba(self.model_.weights, X)

    def predict(self, X):
        """The class of the highest score."""
        X = self._X(X)
        return self.classes_[self.model_.predict(self.model_.weights, X)]
