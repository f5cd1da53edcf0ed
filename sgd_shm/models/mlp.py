"""The multi-layer perceptron and softmax regression on flat weights (the
:class:`~sgd_shm.core.model.Model` contract).

:class:`MLP`: ReLU hidden layers, softmax output, L2 on the coefficient matrices, as
scikit-learn's ``MLPClassifier``; :class:`SoftmaxRegression`: multinomial logistic
regression, the MLP with no hidden layer. Their minibatch path is one nogil Numba
call (:mod:`sgd_shm.models._mlp`); ``blocks`` gives per-layer row blocks for
block-partitioned training (Kungurtsev et al., arXiv:1905.11845).

Example::

    import numpy as np
    from sgd_shm.models import MLP
    model = MLP(n_features=64, hidden_layer_sizes=(32,), n_outputs=10, alpha=1e-4)
    w = model.init(np.random.default_rng(0))          # flat float64, model.n_params long
    data = model.prepare(X, y)                        # y: class indices 0..9
    grad = np.empty(model.n_params)
    loss = model.loss_grad(w, data, np.arange(32), grad)
    w -= 0.1 * grad
    model.predict(w, X)
"""
from __future__ import annotations

import numbers
import threading

import numpy as np
import scipy.sparse as sp

from sgd_shm.core.atomics import read_only_fields
from sgd_shm.core.model import Model, one_blas_thread  # noqa: F401
from sgd_shm.core.validation import check_int, check_number
from sgd_shm.models import _mlp

__all__ = ["MLP", "SoftmaxRegression", "scratch"]


def scratch(net, batch):
    """A fresh ``_mlp.Scratch`` for minibatches of up to ``batch`` rows of the network
    ``net`` (an ``_mlp.Net``); each concurrent caller needs its own."""
    sizes = net.sizes
    n_params = int(net.b_off[-1] + sizes[-1])
    return _mlp.Scratch(np.empty(batch * int(sizes.sum())), np.zeros(sizes.shape[0], np.int64),
                        np.empty((2, batch * int(sizes[1:].max()))), np.empty(n_params))


def hidden_sizes(h) -> tuple:
    """``hidden_layer_sizes`` as a tuple of ints >= 1: an int (one layer, as scikit-learn's
    MLPClassifier takes it) or a sequence of them; () is no hidden layer."""
    h = (h,) if isinstance(h, numbers.Integral) and not isinstance(h, bool) else h
    try:
        h = tuple(h)
    except TypeError:
        raise TypeError(f"hidden_layer_sizes must be an int or a sequence of ints, got "
                        f"{type(h).__name__} {h!r}") from None
    for s in h:
        if not isinstance(s, numbers.Integral) or isinstance(s, bool) or s < 1:
            raise ValueError(f"hidden_layer_sizes must hold ints >= 1, got {h!r}; e.g. "
                             "(100,) or (256, 128)")
    return tuple(int(s) for s in h)


class MLP(Model):
    """A multi-layer perceptron: ReLU hidden layers of ``hidden_layer_sizes`` units,
    a softmax output of ``n_outputs`` classes, cross-entropy loss, and L2 of
    strength ``alpha`` on the coefficient matrices, as ``MLPClassifier``: the loss of
    a minibatch of B rows is mean cross-entropy + alpha/(2B) sum ||W_l||^2.

    The flat vector holds W_0 (n_features x h_1, row-major), b_0, W_1, b_1, ...;
    :meth:`unpack` gives them as views (scikit-learn's ``coefs_``, ``intercepts_``)."""

    uses_blas = True

    def __init__(self, n_features, hidden_layer_sizes=(100,), n_outputs=2, alpha=0.0001):
        hidden = hidden_sizes(hidden_layer_sizes)
        sizes = [check_int("n_features", n_features), *hidden]
        if check_int("n_outputs", n_outputs) < 2:
            raise ValueError(f"n_outputs must be >= 2 (a softmax over the classes), got "
                             f"{n_outputs}; a binary problem has 2")
        sizes.append(int(n_outputs))
        check_number("alpha", alpha, lo=0)
        self.sizes = np.array(sizes, dtype=np.int64)
        self.n_features, self.n_outputs = sizes[0], sizes[-1]
        self.hidden_layer_sizes = hidden
        self.alpha = float(alpha)
        w_off, b_off, pos = [], [], 0
        for fi, fo in zip(sizes[:-1], sizes[1:]):
            w_off.append(pos)
            b_off.append(pos + fi * fo)
            pos += fi * fo + fo
        self.n_params = pos
        # read-only views, as the data (see ``prepare``): one compiled kernel per dtype
        self.net = read_only_fields(_mlp.Net(self.sizes, np.array(w_off, np.int64),
                                             np.array(b_off, np.int64), self.alpha))
        self._local = threading.local()

    def __getstate__(self):           # the per-thread scratch stays behind
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.net = read_only_fields(self.net)   # unpickled arrays come back writeable
        self._local = threading.local()

    @property
    def n_layers(self):
        """Weight layers (hidden layers + 1)."""
        return self.sizes.shape[0] - 1

    def unpack(self, w):
        """(coefs, intercepts): lists of views of ``w``, W_l of shape
        (sizes[l], sizes[l + 1]) and b_l."""
        w = np.asarray(w)
        if w.shape != (self.n_params,):
            raise ValueError(f"w must have shape ({self.n_params},), got {w.shape}")
        coefs, intercepts = [], []
        for l in range(self.n_layers):
            fi, fo = int(self.sizes[l]), int(self.sizes[l + 1])
            o = int(self.net.w_off[l])
            coefs.append(w[o:o + fi * fo].reshape(fi, fo))
            intercepts.append(w[o + fi * fo:o + fi * fo + fo])
        return coefs, intercepts

    def init(self, rng):
        """Glorot-uniform weights and intercepts per layer, as ``MLPClassifier``:
        uniform in +-sqrt(6 / (fan_in + fan_out)), W_l then b_l, layer by layer."""
        w = np.empty(self.n_params)
        coefs, intercepts = self.unpack(w)
        for c, b in zip(coefs, intercepts):
            bound = np.sqrt(6.0 / (c.shape[0] + c.shape[1]))
            c[...] = rng.uniform(-bound, bound, c.shape)
            b[...] = rng.uniform(-bound, bound, b.shape)
        return w

    def prepare(self, X, y=None):
        """X (dense float32/float64, kept as is when C-contiguous, or any scipy
        sparse matrix, read as CSR) and y (class indices, or None for zeros) as the
        kernel's ``Data``, as read-only views (``_intrinsics.read_only_fields``)."""
        n = X.shape[0]
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"X must be 2-D with {self.n_features} features, got shape "
                             f"{X.shape}")
        y = np.zeros(n, np.int64) if y is None else np.ascontiguousarray(y, dtype=np.int64)
        if y.shape != (n,):
            raise ValueError(f"y must have shape ({n},), got {y.shape}")
        if n and (y.min() < 0 or y.max() >= self.n_outputs):
            raise ValueError(f"y must hold class indices in [0, {self.n_outputs}), got "
                             f"[{y.min()}, {y.max()}]; encode the labels first")
        if sp.issparse(X):
            X = sp.csr_matrix(X)
            return read_only_fields(_mlp.Data(
                np.empty((0, X.shape[1])), X.indptr.astype(np.int64),
                X.indices.astype(np.int64), X.data.astype(np.float64), y))
        X = np.asarray(X)
        if X.dtype != np.float32:
            X = X.astype(np.float64, copy=False)
        empty = np.empty(0, np.int64)
        return read_only_fields(_mlp.Data(np.ascontiguousarray(X), empty, empty,
                                          np.empty(0), y))

    def _scratch_for(self, batch):
        scr = getattr(self._local, "scratch", None)
        if scr is None or scr.act.shape[0] < batch * int(self.sizes.sum()):
            scr = self._local.scratch = scratch(self.net, batch)
        return scr

    def loss_grad(self, w, data, rows, grad, block=None):
        """See :meth:`Model.loss_grad`. One nogil Numba call; ``grad`` may be ``w``'s
        neighbour in shared memory, it is written only on the block."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if rows.ndim != 1 or rows.shape[0] == 0:
            raise ValueError(f"rows must be a non-empty 1-D index array, got shape {rows.shape}")
        if w.shape != (self.n_params,) or grad.shape != (self.n_params,):
            raise ValueError(f"w and grad must have shape ({self.n_params},), got {w.shape} "
                             f"and {grad.shape}")
        lo, hi = (0, self.n_params) if block is None else (int(block[0]), int(block[1]))
        # prepared data that came through a pickle or shared memory is writeable: made
        # read-only again, as prepare() made it, so that one compiled kernel serves all
        if data.y.flags.writeable:
            data = read_only_fields(data)
        scr = self._scratch_for(rows.shape[0])
        loss = _mlp.loss_grad(self.net, data, rows, w, scr, lo, hi)
        grad[lo:hi] = scr.grad[lo:hi]
        return float(loss)

    def decision_function(self, w, X):
        """The output layer's pre-softmax scores, by numpy (sparse X: scipy)."""
        coefs, intercepts = self.unpack(w)
        a = X
        for l, (c, b) in enumerate(zip(coefs, intercepts)):
            a = np.asarray(a @ c) + b
            if l < len(coefs) - 1:
                np.maximum(a, 0.0, out=a)
        return a

    def blocks(self, n_parts):
        """Per-layer row blocks: W_l's rows split into min(n_parts, fan_in) contiguous
        chunks (b_l joins the last one), chunk c owned by part c. Every part owns at
        most one block per layer; a ValueError when some part would own none."""
        n_parts = check_int("n_parts", n_parts)
        bounds, owners = [0], [[] for _ in range(n_parts)]
        for l in range(self.n_layers):
            fi, fo = int(self.sizes[l]), int(self.sizes[l + 1])
            o = int(self.net.w_off[l])
            cuts = np.linspace(0, fi, min(n_parts, fi) + 1).astype(np.int64)
            for c in range(cuts.shape[0] - 1):
                owners[c].append(len(bounds) - 1)
                bounds.append(o + int(cuts[c + 1]) * fo + (fo if c == cuts.shape[0] - 2 else 0))
        empty = [p for p, own in enumerate(owners) if not own]
        if empty:
            raise ValueError(f"partition='blocks' with {n_parts} workers: every layer has "
                             f"fewer input rows than workers ({self.sizes[:-1].tolist()}), so "
                             f"workers {empty} would own no block; use fewer workers")
        return np.array(bounds, np.int64), [np.array(o, np.int64) for o in owners]


class SoftmaxRegression(MLP):
    """Multinomial logistic regression with L2 on the coefficients: the
    :class:`MLP` with no hidden layer (its kernel, flat layout and ``blocks``)."""

    def __init__(self, n_features, n_outputs=2, alpha=0.0001):
        super().__init__(n_features, (), n_outputs, alpha)
