"""The model contract: what every trainer of the kit (Hogwild, the parameter server,
eager-SGD) needs from a model, so that any model trains on any of them.

A :class:`Model` is a differentiable model whose parameters are one flat vector of
its ``dtype`` (float64 for the kit's models): it knows its size (``n_params``), draws initial weights (``init``), lays out
the data once (``prepare``), computes the gradient of a minibatch (rows given as an
index array into the prepared data) into the caller's buffer (``grad``, and
``loss_grad`` which also returns the minibatch's loss), evaluates the loss on a whole
prepared data set (``loss``) and predicts (``decision_function``, ``predict_proba``,
``predict``). A trainer owns the weight vector (private, or in shared memory) and
decides how gradients combine. ``blocks`` splits the vector into coordinate blocks
for block-partitioned training (Kungurtsev, Egan, Chatterjee, Alistarh,
arXiv:1905.11845).

The kit's models (:mod:`sgd_shm.models`): ``Linear`` (the L2-regularised linear
losses), ``SoftmaxRegression`` and ``MLP``. Writing one of your own is subclassing
this class; see docs/models.md.

Example::

    import numpy as np
    from sgd_shm.models import Linear
    model = Linear(n_features=X.shape[1], loss="log_loss", alpha=1e-4)
    w = model.init(np.random.default_rng(0))          # flat float64, model.n_params long
    data = model.prepare(X, y)                        # y: class indices 0..n_outputs-1
    g = np.empty(model.n_params)
    model.grad(w, data, np.arange(32), g)             # the minibatch gradient into g
    w -= 0.1 * g
    model.loss(w, data), model.predict(w, X)
"""
from __future__ import annotations

import abc

import numpy as np

__all__ = ["Model", "one_blas_thread"]


class Model(abc.ABC):
    """The contract of a model on flat weights of its ``dtype`` (see the module notes).

    Attributes: ``n_features``, ``n_outputs`` (classes), ``n_params``; ``uses_blas``
    (its kernels call BLAS: trainers then cap BLAS at one thread per worker, which
    would otherwise oversubscribe the cores); ``has_proba`` (``predict_proba`` gives
    probabilities); ``input_shape`` (None: X is a matrix of ``n_features`` columns;
    a tuple: the shape of one sample, X is an array (n, *input_shape), e.g. images
    (n, C, H, W), whose samples hold ``n_features`` values in all) and ``dtype`` (the
    float type X is checked into and the trainers keep every buffer of a run in:
    float64, or float32 for a model that computes in it)."""

    n_features: int
    n_outputs: int
    n_params: int
    uses_blas: bool = False
    has_proba: bool = True
    input_shape: tuple | None = None
    dtype = np.float64

    @abc.abstractmethod
    def init(self, rng: np.random.Generator) -> np.ndarray:
        """Fresh initial weights (float64, ``n_params``) drawn from ``rng``."""

    @abc.abstractmethod
    def prepare(self, X, y=None):
        """The data in the layout ``grad`` reads (made once per data set); ``y`` holds
        class indices in [0, n_outputs). The result must pickle (it travels to worker
        processes and Ray actors)."""

    @abc.abstractmethod
    def loss_grad(self, w, data, rows, grad, block=None) -> float:
        """The loss of the minibatch ``rows`` (int64 indices into the prepared data)
        at weights ``w``; writes its gradient into ``grad`` (``n_params`` float64),
        all of it, or with ``block=(lo, hi)`` (one of :meth:`blocks`) only
        grad[lo:hi]."""

    def grad(self, w, data, rows, grad, block=None) -> None:
        """The minibatch gradient only, as :meth:`loss_grad` writes it (what the
        trainers call each step; a model whose loss costs extra overrides it)."""
        self.loss_grad(w, data, rows, grad, block)

    def loss(self, w, data) -> float:
        """The loss (with its regulariser) of every row of the prepared ``data``."""
        n = self.n_rows(data)
        v = self.loss_grad(w, data, np.arange(n, dtype=np.int64), np.empty(self.n_params))
        if isinstance(v, (bool, np.bool_)) or np.ndim(v) != 0 \
                or not np.issubdtype(np.asarray(v).dtype, np.number):
            raise TypeError(f"{type(self).__name__}.loss_grad must return the loss as one "
                            f"number, got {type(v).__name__} of shape {np.shape(v)}")
        return float(v)

    def n_rows(self, data) -> int:
        """Rows of the prepared data (by default its ``y``)."""
        return int(data.y.shape[0])

    @abc.abstractmethod
    def decision_function(self, w, X) -> np.ndarray:
        """The model's scores (n_samples, n_outputs) of the rows of X (a binary model
        may give the positive class's score only, shape (n_samples,))."""

    def blocks(self, n_parts) -> tuple[np.ndarray, list]:
        """(bounds, owners): coordinate blocks [bounds[b], bounds[b + 1]) covering the
        vector, and ``owners[p]``: the blocks part p alone updates. By default
        ``n_parts`` contiguous ranges, one per part."""
        if isinstance(n_parts, bool) or not isinstance(n_parts, (int, np.integer)) \
                or not 1 <= n_parts <= self.n_params:
            raise ValueError(f"n_parts: must be an int in [1, {self.n_params}] (one block "
                             f"per part at least), got {n_parts!r}; use fewer workers")
        bounds = np.linspace(0, self.n_params, int(n_parts) + 1).astype(np.int64)
        return bounds, [np.array([p], np.int64) for p in range(int(n_parts))]

    def predict_proba(self, w, X) -> np.ndarray:
        """Class probabilities: the softmax of the decision function (the logistic
        function of a binary model's one score)."""
        z = self._scores(w, X)
        if z.ndim == 1:
            p = 0.5 * (1.0 + np.tanh(0.5 * z))           # 1 / (1 + e^-z), no overflow
            return np.column_stack([1.0 - p, p])
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    def predict(self, w, X) -> np.ndarray:
        """The class index of the highest score of each row (a binary model's one
        score: class 1 where it is > 0)."""
        z = self._scores(w, X)
        return (z > 0).astype(np.int64) if z.ndim == 1 else np.argmax(z, axis=1)

    def _scores(self, w, X) -> np.ndarray:
        """decision_function checked against the contract's shapes, so a model that
        breaks it is named here rather than by numpy's axis errors in predict."""
        z = np.asarray(self.decision_function(w, X))
        n = X.shape[0] if hasattr(X, "shape") else len(X)
        if z.shape == (n, self.n_outputs) or (z.shape == (n,) and self.n_outputs == 2):
            return z
        binary = f" or ({n},) (the positive class's score)" if self.n_outputs == 2 else ""
        raise ValueError(f"{type(self).__name__}.decision_function must return scores of "
                         f"shape ({n}, {self.n_outputs}){binary}, got shape {z.shape}")

    def threads_limited(self):
        """A context in which the model computes on one thread per worker (the
        trainers enter it around their workers: several workers each running a
        threaded kernel would oversubscribe the cores). By default BLAS on one thread
        when the model ``uses_blas``; a model with its own thread pool (torch)
        overrides it."""
        return one_blas_thread() if self.uses_blas else _null()


def initial_weights(model, rng, dtype=np.float64) -> np.ndarray:
    """``model.init(rng)`` checked against the contract, as a fresh array of ``dtype``:
    a flat vector of ``model.n_params`` finite numbers (a user's model that breaks it
    fails here, naming its init, not inside a worker)."""
    w = model.init(rng)
    who = f"{type(model).__name__}.init"
    try:
        a = np.array(w, dtype=dtype, copy=True)
    except (TypeError, ValueError):
        raise TypeError(f"{who} must return the initial weights as a float array, got "
                        f"{type(w).__name__}") from None
    if w is None or a.shape != (model.n_params,):
        raise ValueError(f"{who} returned shape {np.shape(w)}; the weights are a flat vector "
                         f"of the model's n_params = {model.n_params}")
    if not np.isfinite(a).all():
        raise ValueError(f"{who} returned NaN or infinite weights")
    return a


def one_blas_thread():
    """BLAS on one thread: from now on in this process, or, used as ``with
    one_blas_thread():``, for the block (the limiter restores the pools on exit).
    A model's workers all run matrix products at once, and a threaded BLAS in each
    would oversubscribe the cores (OpenBLAS also serialises concurrent callers of
    its pool)."""
    from threadpoolctl import threadpool_limits
    return threadpool_limits(limits=1, user_api="blas")


def _null():
    import contextlib
    return contextlib.nullcontext()


def blas_limited(model):
    """A context that runs ``model`` on one thread per worker: its
    ``threads_limited()``, or for an object outside the Model class, BLAS on one
    thread when it ``uses_blas``, else nothing."""
    if isinstance(model, Model):
        return model.threads_limited()
    return one_blas_thread() if getattr(model, "uses_blas", False) else _null()
