"""A PyTorch ``nn.Module`` plus a loss as a kit :class:`~sgd_shm.core.model.Model`, so
that the kit's trainers (``ps.train``, ``eager.train``, Hogwild) train it.

The kit's trainers own one flat weight vector and ask the model for minibatch
gradients into a flat buffer. :class:`TorchModel` meets that contract on a module:
its trainable parameters are laid out one after the other (in ``module.parameters()``
order) in one flat vector of ``n_params`` floats (a frozen one, ``requires_grad=False``,
stays the module's own tensor, which no trainer changes), and each gradient call

1. points the parameters of this thread's replica of the module at the caller's
   weights: a float32 vector is used in place (the parameters become views of it, as
   in DDP's ``gradient_as_bucket_view`` buckets; the trainers keep float32 buffers for
   this model, its ``dtype``); a float64 one is first rounded into the replica's own
   float32 vector;
2. points the parameters' ``.grad`` at the caller's gradient buffer the same way
   (float32: autograd accumulates straight into it; float64: into the replica's
   float32 buffer, then one conversion into the caller's);
3. runs the forward pass on the minibatch rows and ``backward`` (only into the
   parameters of one block when a block is asked for: ``backward(inputs=...)``).

Everything torch computes is float32; X is a float32 array shaped (n,
*``input_shape``). Each thread that calls the model gets its own replica of the
module (a deep copy, made on its first call), so workers of a threads backend never
share autograd state; a process that is not the one that made the model (a forked or
spawned worker, a Ray actor) runs torch on one intra-op thread, and
:meth:`TorchModel.threads_limited` (which the trainers enter) does the same in the
caller for the length of a run.

``blocks(n_parts)`` partitions the vector by layer: each block is the whole set of
parameter tensors of one submodule (a convolution's weight and bias), and the blocks
are dealt to the parts largest first, each to the part with the fewest coordinates
so far, for block-partitioned training (Kungurtsev, Egan, Chatterjee, Alistarh,
arXiv:1905.11845).

Example::

    import numpy as np
    from sgd_shm import ps
    from sgd_shm.data import load_digits_split
    from sgd_shm.torch import DigitsCNN, TorchModel
    X, X_test, y, y_test = load_digits_split()
    model = TorchModel(DigitsCNN(seed=0))           # input_shape (1, 8, 8) from the net
    res = ps.train(X, y, model=model, n_workers=2, lr=0.05, epochs=5,
                   eval_set=(X_test, y_test))
    res.val_score
    model.set_weights(res.coef_)                    # the trained weights into model.module
"""
from __future__ import annotations

import contextlib
import copy
import os
import threading
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sgd_shm.core.model import Model

__all__ = ["TorchModel", "TorchData", "one_torch_thread"]

#: the losses a TorchModel takes: of the module's output (logits, or log-probabilities
#: for "nll_loss") and the class indices, averaged over the minibatch
LOSSES = {"cross_entropy": F.cross_entropy, "nll_loss": F.nll_loss}
#: rows per forward pass when predicting or evaluating a whole data set
CHUNK = 4096

_LIMITED = {"pid": None}        # the process whose torch runs on one thread already


@contextlib.contextmanager
def one_torch_thread():
    """torch on one intra-op thread for the block (restored on exit): the kit's
    workers each run a module at once, and torch's own pool in each would
    oversubscribe the cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _limit_this_process():
    """torch on one thread from now on in this process (a worker of the kit's: a
    forked or spawned process, a Ray actor), once per process."""
    if _LIMITED["pid"] != os.getpid():
        torch.set_num_threads(1)
        _LIMITED["pid"] = os.getpid()


class TorchData(NamedTuple):
    """A data set prepared for a :class:`TorchModel`: X float32 (n, *input_shape),
    y int64 class indices (None: no labels). Plain numpy arrays, so that the kit's
    launcher moves them through shared memory to spawned workers; the minibatch rows
    become tensors at each step."""
    X: np.ndarray
    y: np.ndarray | None


def _is_flat32(a, n):
    return (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (n,)
            and a.flags.c_contiguous and a.flags.writeable)


def _trainable(module):
    """(name, parameter) of the module's trainable parameters: the weights. A frozen
    one (``requires_grad=False``, e.g. a pretrained layer kept fixed) stays the
    module's own tensor, outside the flat vector."""
    return [(k, p) for k, p in module.named_parameters() if p.requires_grad]


class _Replica:
    """One thread's copy of the module, with its own float32 weight and gradient
    buffers for callers whose vectors are not float32. ``bind_*`` point the
    parameters (or their ``.grad``) at a flat vector; the binding is kept while the
    caller passes the same vector (no work per step)."""

    def __init__(self, template, spans):
        self.module = copy.deepcopy(template)
        self.module.train()
        self.params = [p for _, p in _trainable(self.module)]
        self.spans = spans
        n = spans[-1][1] if spans else 0
        self.w_own = torch.empty(n, dtype=torch.float32)
        self.g_own = torch.zeros(n, dtype=torch.float32)
        self.w_key = self.g_key = None
        self._refs = [None, None]             # the caller's vectors bound (kept alive)

    def _point(self, flat, attr):
        for p, (lo, hi) in zip(self.params, self.spans):
            view = flat[lo:hi].view(p.shape)
            if attr == "data":
                p.data = view
            else:
                p.grad = view

    def bind_weights(self, w):
        n = self.w_own.shape[0]
        if _is_flat32(w, n):
            key = ("caller", w.ctypes.data)
            if key != self.w_key:
                self._point(torch.from_numpy(w), "data")
                self.w_key, self._refs[0] = key, w
            return
        if self.w_key != "own":
            self._point(self.w_own, "data")
            self.w_key, self._refs[0] = "own", None
        w = np.asarray(w)
        if w.shape != (n,):
            raise ValueError(f"w: expected a flat vector of {n} weights (model.n_params), got "
                             f"shape {w.shape}")
        np.copyto(self.w_own.numpy(), w, casting="same_kind")

    def bind_grad(self, grad):
        """The flat float32 tensor the gradient lands in (the caller's or our own)."""
        n = self.g_own.shape[0]
        if _is_flat32(grad, n):
            key = ("caller", grad.ctypes.data)
            if key != self.g_key:
                self._point(torch.from_numpy(grad), "grad")
                self.g_key, self._refs[1] = key, grad
            return torch.from_numpy(grad)
        if self.g_key != "own":
            self._point(self.g_own, "grad")
            self.g_key, self._refs[1] = "own", None
        return self.g_own


class TorchModel(Model):
    """An ``nn.Module`` and a loss as a kit model (see the module notes).

    Parameters
    ----------
    module : the network (an ``nn.Module`` instance, on the CPU). Its trainable
        parameters are made float32 and become views of one flat vector (``weights``;
        frozen ones stay its own); its initial weights are what :meth:`init` returns.
        Its state must all be parameters: buffers (BatchNorm's running statistics)
        stay each replica's own.
    loss : "cross_entropy" (the module outputs logits; the default) or "nll_loss"
        (it outputs log-probabilities, as with a final ``log_softmax``), averaged over
        the minibatch.
    input_shape : the shape of one sample, e.g. (1, 8, 8); by default the module's
        ``input_shape`` attribute (``DigitsCNN`` has one).

    Attributes: ``module``, ``loss_name``, ``input_shape``, ``n_features`` (values per
    sample), ``n_outputs`` (the module's output width, read from one forward pass),
    ``n_params``, ``dtype`` (float32), ``spans`` ((lo, hi) of each parameter tensor in
    the flat vector), ``names`` (their names).
    """

    dtype = np.float32
    has_proba = True

    def __init__(self, module, loss="cross_entropy", *, input_shape=None):
        if not isinstance(module, nn.Module):
            raise TypeError(f"module: must be a torch.nn.Module instance, got "
                            f"{type(module).__name__}; e.g. TorchModel(DigitsCNN())")
        if not isinstance(loss, str) or loss not in LOSSES:
            raise ValueError(f"loss: must be one of {tuple(LOSSES)}, got {loss!r} "
                             "('cross_entropy' for a module that outputs logits)")
        self.module, self.loss_name = module.float(), loss
        self.input_shape = self._shape(input_shape, module)
        self.n_features = int(np.prod(self.input_shape))
        named = _trainable(module)
        if not named:
            raise ValueError("module: has no parameters to train (none, or all have "
                             "requires_grad=False)")
        if any(p.device.type != "cpu" for _, p in named):
            raise ValueError("module: must be on the CPU (the kit's buffers are host memory); "
                             "call module.cpu() first")
        self.names = [k for k, _ in named]
        ends = np.cumsum([p.numel() for _, p in named])
        self.spans = [(int(e - p.numel()), int(e)) for e, (_, p) in zip(ends, named)]
        self.n_params = int(ends[-1])
        self._flat = torch.empty(self.n_params, dtype=torch.float32)
        with torch.no_grad():
            for (_, p), (lo, hi) in zip(named, self.spans):
                self._flat[lo:hi] = p.detach().reshape(-1)
                p.data = self._flat[lo:hi].view(p.shape)
        self.n_outputs = self._output_width()
        self._pid = os.getpid()
        self._local = threading.local()

    @staticmethod
    def _shape(input_shape, module):
        shape = input_shape if input_shape is not None else getattr(module, "input_shape", None)
        if shape is None:
            raise ValueError("input_shape: the module declares none; pass the shape of one "
                             "sample, e.g. TorchModel(net, input_shape=(1, 28, 28))")
        try:
            if isinstance(shape, (str, bytes)) or any(
                    isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer))
                    for s in shape):
                raise TypeError      # ("18" was (1, 8); 2.5 was 2)
            shape = tuple(int(s) for s in shape)
        except TypeError:
            raise TypeError(f"input_shape: must be a tuple of ints, got {shape!r}") from None
        if not shape or min(shape) < 1:
            raise ValueError(f"input_shape: must be a non-empty tuple of ints >= 1, got {shape}")
        return shape

    def _output_width(self):
        was = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                out = self.module(torch.zeros((2,) + self.input_shape))
        except Exception as e:
            raise ValueError(f"module: a forward pass on zeros shaped (2, *{self.input_shape}) "
                             f"failed ({e}); check input_shape") from e
        finally:
            self.module.train(was)
        if out.ndim != 2 or out.shape[1] < 2:
            raise ValueError(f"module: must output (batch, n_classes >= 2) scores, got shape "
                             f"{tuple(out.shape)} for a batch of 2")
        return int(out.shape[1])

    def __repr__(self):
        return (f"TorchModel({type(self.module).__name__}, loss={self.loss_name!r}, "
                f"input_shape={self.input_shape}, n_params={self.n_params})")

    # -- pickling: the module travels with its weights; buffers are rebuilt ----------------
    def __getstate__(self):
        d = dict(self.__dict__)
        d.pop("_local")
        d.pop("_flat")
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._local = threading.local()
        self._flat = torch.empty(self.n_params, dtype=torch.float32)
        with torch.no_grad():
            for (_, p), (lo, hi) in zip(_trainable(self.module), self.spans):
                self._flat[lo:hi] = p.detach().reshape(-1)
                p.data = self._flat[lo:hi].view(p.shape)

    # -- the flat weights ---------------------------------------------------------------
    @property
    def weights(self) -> np.ndarray:
        """The module's parameters as one flat float32 vector (a view: writing it
        changes the module)."""
        return self._flat.numpy()

    def set_weights(self, w):
        """Copy flat weights (float32 or float64, ``n_params``; e.g. a trainer's
        ``coef_``) into the module, so that ``model.module`` is the trained network."""
        w = np.asarray(w)
        if w.shape != (self.n_params,):
            raise ValueError(f"w: expected {self.n_params} weights (model.n_params), got shape "
                             f"{w.shape}")
        if w.dtype.kind == "f" and not np.isfinite(w).all():
            raise ValueError("w: holds NaN or inf; the module's weights must be finite")
        np.copyto(self.weights, w, casting="same_kind")
        return self

    def init(self, rng=None) -> np.ndarray:
        """The module's weights as it was given (torch's initialisation when it was
        built: seed torch, or build ``DigitsCNN(seed=...)``, to fix them), as float64;
        ``rng`` is not used, so the same module starts every trainer at the same
        point."""
        return self._flat.numpy().astype(np.float64)

    # -- data and gradients ---------------------------------------------------------------
    def prepare(self, X, y=None) -> TorchData:
        """(X as float32 (n, *input_shape), y as int64 class indices)."""
        X = np.ascontiguousarray(X, dtype=np.float32).reshape((-1,) + self.input_shape)
        if y is not None:
            y = np.ascontiguousarray(y, dtype=np.int64)
            if y.shape != (X.shape[0],):
                raise ValueError(f"y: expected {X.shape[0]} labels, got shape {y.shape}")
        return TorchData(X, y)

    def replica(self) -> _Replica:
        """This thread's replica of the module (made on its first call)."""
        rep = getattr(self._local, "rep", None)
        if rep is None:
            if self._pid != os.getpid():
                _limit_this_process()
            rep = self._local.rep = _Replica(self.module, self.spans)
        return rep

    def _block_params(self, rep, block):
        lo, hi = int(block[0]), int(block[1])
        inside = [i for i, (a, b) in enumerate(self.spans) if lo <= a and b <= hi]
        if not inside or self.spans[inside[0]][0] != lo or self.spans[inside[-1]][1] != hi:
            raise ValueError(f"block: ({lo}, {hi}) is not a range of whole parameter tensors; "
                             "use the bounds of model.blocks(n_parts)")
        return [rep.params[i] for i in inside], lo, hi

    def loss_grad(self, w, data, rows, grad, block=None) -> float:
        """The mean loss of the minibatch ``rows`` at weights ``w``, its gradient
        written into ``grad`` (all ``n_params``, or with ``block=(lo, hi)`` only
        grad[lo:hi], the others untouched). ``w`` and ``grad``: float32 vectors are
        used in place, float64 ones are converted (see the module notes)."""
        if np.shape(grad) != (self.n_params,):        # (checked before the passes)
            raise ValueError(f"grad: expected a flat buffer of {self.n_params} values "
                             f"(model.n_params), got shape {np.shape(grad)}")
        rep = self.replica()
        rep.bind_weights(w)
        g = rep.bind_grad(grad)
        if block is None:
            params, lo, hi = rep.params, 0, self.n_params
        else:
            params, lo, hi = self._block_params(rep, block)
        g[lo:hi].zero_()
        rows = np.asarray(rows, dtype=np.int64)
        xb = torch.from_numpy(data.X[rows])
        yb = torch.from_numpy(data.y[rows])
        loss = LOSSES[self.loss_name](rep.module(xb), yb)
        loss.backward(inputs=params)
        if g is rep.g_own:
            grad[lo:hi] = rep.g_own.numpy()[lo:hi]
        return float(loss.detach())

    def _forward_all(self, w, X):
        """The module's outputs (float32 tensor) on every row of X, in chunks,
        without autograd, in eval mode."""
        rep = self.replica()
        rep.bind_weights(w)
        X = np.ascontiguousarray(X, dtype=np.float32).reshape((-1,) + self.input_shape)
        rep.module.eval()
        try:
            with torch.no_grad():
                outs = [rep.module(torch.from_numpy(X[i:i + CHUNK]))
                        for i in range(0, X.shape[0], CHUNK)]
        finally:
            rep.module.train()
        return torch.cat(outs) if outs else torch.zeros((0, self.n_outputs))

    def loss(self, w, data) -> float:
        """The mean loss over every row of the prepared data (forward passes only)."""
        n = data.X.shape[0]
        out = self._forward_all(w, data.X)
        total = LOSSES[self.loss_name](out, torch.from_numpy(data.y), reduction="sum")
        return float(total) / max(n, 1)

    def decision_function(self, w, X) -> np.ndarray:
        """The module's outputs (n, n_outputs), as float64."""
        return self._forward_all(w, X).numpy().astype(np.float64)

    # -- block partitioning -------------------------------------------------------------
    def layers(self) -> np.ndarray:
        """The bounds of the layer blocks: each block is the parameter tensors of one
        submodule (consecutive in the flat vector)."""
        owner = [k.rpartition(".")[0] for k in self.names]
        bounds = [0] + [self.spans[i][0] for i in range(1, len(owner))
                        if owner[i] != owner[i - 1]] + [self.n_params]
        return np.array(bounds, np.int64)

    def blocks(self, n_parts) -> tuple[np.ndarray, list]:
        """(bounds, owners): the layer blocks (:meth:`layers`) and the blocks each of
        ``n_parts`` parts alone updates, dealt largest first to the part with the
        fewest coordinates so far (so the parts' sizes are balanced)."""
        bounds = self.layers()
        nb = bounds.shape[0] - 1
        if isinstance(n_parts, bool) or not isinstance(n_parts, (int, np.integer)) \
                or not 1 <= n_parts <= nb:
            raise ValueError(f"n_parts: must be an int in [1, {nb}] (the module has {nb} "
                             f"layers with parameters, a block each), got {n_parts!r}; use "
                             "fewer workers or no block partitioning")
        sizes = np.diff(bounds)
        load = np.zeros(int(n_parts), np.int64)
        owned = [[] for _ in range(int(n_parts))]
        for b in np.argsort(-sizes, kind="stable"):
            p = int(np.argmin(load))
            owned[p].append(int(b))
            load[p] += sizes[b]
        return bounds, [np.array(sorted(o), np.int64) for o in owned]

    def threads_limited(self):
        """torch on one intra-op thread for the block (see :func:`one_torch_thread`)."""
        return one_torch_thread()
