"""Gradient compressors with error feedback: what a worker sends instead of its dense
gradient (a parameter-server push, a collective's contribution).

* :class:`TopK`: the k largest-magnitude entries (Alistarh, Hoefler, Johansson, Khirirat,
  Konstantinov, Renggli, *The convergence of sparsified gradient methods*, NeurIPS 2018).
* :class:`RandomK`: k entries drawn uniformly (optionally rescaled by n/k: unbiased).
* :class:`Dense`: the identity, for comparisons.

A compressor is a stateless description; ``comp.memory(n, dtype)`` gives a worker its
:class:`ErrorFeedback` memory: ``step(g)`` adds the residual to g, compresses the sum,
and keeps what was not sent as the new residual (so sent + residual == accumulated input,
exactly: the residual is the sum with the sent entries zeroed); ``keep(msg)`` puts a
message that was lost back. The split of compressor, memory and communicator follows
GRACE (Xu et al., 2021).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SparseMessage", "TopK", "RandomK", "Dense", "ErrorFeedback", "make_compressor"]


@dataclass(frozen=True)
class SparseMessage:
    """indices (ascending), values, the dense length n, the bytes that travel
    (indices + values) and a scale applied on decoding."""
    indices: np.ndarray
    values: np.ndarray
    n: int
    nbytes: int
    scale: float = 1.0

    def add_to(self, out):
        """out += the decoded message."""
        out[self.indices] += self.values * self.scale
        return out

    def to_dense(self, dtype=np.float64):
        return self.add_to(np.zeros(self.n, dtype))


def _sparse(g, idx):
    itype = np.int32 if g.size < 2**31 else np.int64
    idx = np.sort(idx).astype(itype)
    vals = g[idx].copy()
    return SparseMessage(idx, vals, g.size, idx.nbytes + vals.nbytes)


def _check_g(g):
    if not isinstance(g, np.ndarray) or g.ndim != 1 or g.dtype.kind != "f":
        raise TypeError("g must be a 1-D float numpy array")
    if not np.isfinite(g).all():
        raise ValueError("g contains NaN or inf: the gradient diverged; lower the step")


class _Sized:
    """k from ``k`` or ``ratio`` (exactly one)."""

    def __init__(self, ratio, k, error_feedback):
        if (ratio is None) == (k is None):
            raise ValueError(f"{type(self).__name__}: give exactly one of ratio and k, "
                             f"got ratio={ratio!r}, k={k!r}")
        if ratio is not None and not (isinstance(ratio, (int, float))
                                      and not isinstance(ratio, bool) and 0 < ratio <= 1):
            raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")
        if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer))
                              or k < 1):
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        self.ratio, self.k, self.error_feedback = ratio, k, bool(error_feedback)

    def k_for(self, n):
        """Entries of a message on n weights."""
        if self.k is not None:
            if self.k > n:
                raise ValueError(f"k={self.k} exceeds the {n} entries of the gradient")
            return int(self.k)
        return max(1, int(round(self.ratio * n)))

    def memory(self, n, dtype=np.float64):
        return ErrorFeedback(self, n, dtype)

    def __repr__(self):
        size = f"ratio={self.ratio}" if self.ratio is not None else f"k={self.k}"
        return f"{type(self).__name__}({size}, error_feedback={self.error_feedback})"


class TopK(_Sized):
    """The k entries of largest magnitude; among equal magnitudes at the boundary the
    lower indices win (a stable order of (-|g|, index))."""

    def __init__(self, ratio=None, k=None, error_feedback=True):
        super().__init__(ratio, k, error_feedback)

    def compress(self, g):
        _check_g(g)
        k = self.k_for(g.size)
        if k >= g.size:
            return _sparse(g, np.arange(g.size))
        mag = np.abs(g)
        part = np.argpartition(-mag, k - 1)[:k]
        kth = mag[part].min()
        above = np.flatnonzero(mag > kth)
        ties = np.flatnonzero(mag == kth)[:k - above.size]     # lower indices first
        return _sparse(g, np.concatenate([above, ties]))


class RandomK(_Sized):
    """k entries drawn uniformly without replacement; with ``rescale`` the values are
    multiplied by n/k on decoding, which makes the message unbiased."""

    def __init__(self, ratio=None, k=None, error_feedback=True, seed=0, rescale=False):
        super().__init__(ratio, k, error_feedback)
        self.seed, self.rescale = seed, bool(rescale)
        self._rng = np.random.default_rng(seed)

    def compress(self, g):
        _check_g(g)
        k = self.k_for(g.size)
        msg = _sparse(g, self._rng.choice(g.size, k, replace=False))
        if self.rescale:
            msg = SparseMessage(msg.indices, msg.values, msg.n, msg.nbytes, g.size / k)
        return msg


class Dense:
    """No compression: the message is every entry (8 or 4 bytes each, no indices)."""
    error_feedback = False

    def compress(self, g):
        _check_g(g)
        idx = np.arange(g.size, dtype=np.int32 if g.size < 2**31 else np.int64)
        return SparseMessage(idx, g.copy(), g.size, g.nbytes)

    def k_for(self, n):
        return n

    def memory(self, n, dtype=np.float64):
        return ErrorFeedback(self, n, dtype)

    def __repr__(self):
        return "Dense()"


class ErrorFeedback:
    """A worker's memory of what its compressor did not send."""

    def __init__(self, compressor, n, dtype=np.float64):
        self.compressor, self.n = compressor, int(n)
        self.residual = np.zeros(self.n, dtype)
        self._acc = np.zeros(self.n, dtype)

    def step(self, g):
        """The message for gradient g (plus the residual, with error feedback on)."""
        if not self.compressor.error_feedback:
            return self.compressor.compress(np.asarray(g, self.residual.dtype))
        np.add(self.residual, g, out=self._acc)
        msg = self.compressor.compress(self._acc)
        self.residual[:] = self._acc
        self.residual[msg.indices] = 0.0              # acc - sent, exactly
        return msg

    def keep(self, msg):
        """A message that was not applied: its mass goes back into the residual."""
        if self.compressor.error_feedback:
            self.residual[msg.indices] += msg.values * msg.scale

    def reset(self):
        self.residual[:] = 0.0


_SPECS = {"topk": TopK, "randomk": RandomK}


def make_compressor(spec):
    """A compressor from an object, None, "dense", or "topk:RATIO" / "randomk:RATIO"."""
    if spec is None or isinstance(spec, (TopK, RandomK, Dense)):
        return spec
    if isinstance(spec, str):
        name, _, arg = spec.partition(":")
        if name == "dense" and not arg:
            return Dense()
        if name in _SPECS and arg:
            try:
                return _SPECS[name](ratio=float(arg))
            except ValueError as e:
                raise ValueError(f"compress: {e} (in {spec!r})") from None
    raise ValueError(f"compress: expected None, a compressor object (TopK, RandomK, Dense) "
                     f"or a spec such as 'topk:0.001', 'randomk:0.01', 'dense'; got {spec!r}")
