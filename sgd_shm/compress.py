"""Gradient compressors with error feedback: what a worker sends instead of its dense
gradient (a parameter-server push, a collective's contribution).

* :class:`TopK`: the k largest-magnitude entries (Alistarh, Hoefler, Johansson, Khirirat,
  Konstantinov, Renggli, *The convergence of sparsified gradient methods*, NeurIPS 2018).
* :class:`RandomK`: k entries drawn uniformly (optionally rescaled by n/k: unbiased).
* :class:`ThresholdTopK`: Deep Gradient Compression's selection (Lin, Han, Mao, Wang,
  Dally, ICLR 2018): every entry at or above a threshold estimated from a random
  sample, so about k entries (the count varies).
* :class:`QSGD`: stochastic quantization to s levels (Alistarh, Grubic, Li, Tomioka,
  Vojnovic, *QSGD*, NeurIPS 2017): unbiased, usually run without error feedback.
* :class:`Dense`: the identity, for comparisons.

A compressor is a description; ``comp.memory(n, dtype, stream=k)`` gives worker k its
:class:`ErrorFeedback` memory (with a compressor of its own: the random ones draw from
the stream (seed, k), so the workers of one run do not draw the same indices or
levels): ``step(g)`` adds the residual to g, compresses the sum,
and keeps what was not sent as the new residual (so sent + residual == accumulated input,
exactly for the compressors that send values verbatim: the residual is the sum with
the sent entries zeroed; QSGD's residual is the sum minus the decoded message, exact
up to rounding); ``keep(msg)`` puts a message that was lost back.

The three roles follow GRACE (Xu et al., "GRACE: a compressed communication framework
for distributed machine learning", ICDCS 2021):

* the **compressor** (:class:`Compressor`; subclass it and implement ``compress``:
  any subclass trains in ``ps.train`` and ``eager.train``);
* the **memory** (:class:`ErrorFeedback`: what was not sent, added to the next
  gradient; a compressor with ``error_feedback = False`` keeps none);
* the **communicator** (:class:`Channel`): memory step, delivery by the trainer's
  transport (a push to the parameter server's shards; an allgather among eager-SGD's
  ranks), and a lost message's mass back into the memory. Messages travel in one wire
  format (:func:`pack` / :func:`unpack`: int32 or int64 indices and the values in the
  buffer's float type, float64 or float32, bit for bit).

Every buffer follows the model's float type: ``memory(n, dtype)`` keeps the residual in
it, a message's values are of its gradient's type (QSGD's levels, small integers, too),
and a float32 model's messages pack into float32 buffers, so nothing is widened to
float64 on the way.
"""
from __future__ import annotations

import abc
import copy
import numbers
from dataclasses import dataclass

import numpy as np

from sgd_shm import _select

__all__ = ["Compressor", "SparseMessage", "TopK", "RandomK", "ThresholdTopK", "QSGD",
           "Dense", "ErrorFeedback", "Channel", "make_compressor", "pack", "unpack",
           "add_packed", "packed_size"]


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


def _sparse(g, idx, ordered=False):
    itype = np.int32 if g.size < 2**31 else np.int64
    idx = (idx if ordered else np.sort(idx)).astype(itype)
    vals = g[idx].copy()
    return SparseMessage(idx, vals, g.size, idx.nbytes + vals.nbytes)


def _reseeded(comp, stream):
    """A copy of a seeded compressor whose generator is (seed, stream); others as is."""
    if not hasattr(comp, "_rng"):
        return comp
    c = copy.copy(comp)
    c._rng = np.random.default_rng(None if comp.seed is None else [int(comp.seed), int(stream)])
    return c


def _check_g(g):
    if not isinstance(g, np.ndarray) or g.ndim != 1 or g.dtype not in _WIRE:
        raise TypeError(f"g must be a 1-D float64 or float32 numpy array (a model's "
                        f"weights' type), got {type(g).__name__} "
                        f"{getattr(g, 'dtype', '')} of shape {np.shape(g)}")
    if g.size == 0:
        raise ValueError("g is empty: a message needs at least one weight")
    if not np.isfinite(g).all():
        raise ValueError("g contains NaN or inf: the gradient diverged; lower the step")


class Compressor(abc.ABC):
    """The compressor role: what a worker sends instead of its gradient.

    A subclass implements :meth:`compress` and may override:

    * ``error_feedback`` [True]: whether its memory keeps what was not sent;
    * :meth:`max_entries` [n]: the most entries of a message on n weights (a tight
      bound lets eager-SGD size its exchange to it);
    * :meth:`check` [accepts every n]: a ``ValueError`` when it cannot run on n weights.

    A compressor that draws random numbers keeps its generator in ``self._rng`` and
    its seed in ``self.seed``: :meth:`for_stream` then gives worker k a copy that
    draws from (seed, k), so the workers of one run draw differently. Any subclass
    trains in ``sgd_shm.ps.train(compress=...)`` and ``sgd_shm.eager.train(compress=
    ...)``; see docs/compress.md for a worked example (scaled sign-SGD).
    """
    error_feedback = True

    @abc.abstractmethod
    def compress(self, g) -> SparseMessage:
        """The message for the 1-D float array g: a :class:`SparseMessage` whose
        indices are distinct and ascending, whose n is g.size and whose decoding
        (``values * scale`` at ``indices``) approximates g."""

    def max_entries(self, n) -> int:
        """The most entries a message on n weights can hold."""
        return int(n)

    def check(self, n) -> None:
        """Raise ValueError when this compressor cannot run on n weights."""

    def for_stream(self, stream):
        """This compressor, drawing from the random stream (seed, stream)."""
        return _reseeded(self, stream)

    def memory(self, n, dtype=np.float64, stream=0) -> "ErrorFeedback":
        """Worker ``stream``'s memory for a model of n weights (float64 or float32)."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"n: the model's weights, an int >= 1, got {n!r}")
        if n < 1:
            raise ValueError(f"n: the model's weights, an int >= 1, got {n!r}")
        _wire_dtype(dtype)
        self.check(n)
        return ErrorFeedback(self.for_stream(stream), n, dtype)

    def __repr__(self):
        return f"{type(self).__name__}()"


class _Sized(Compressor):
    """k from ``k`` or ``ratio`` (exactly one)."""

    def __init__(self, ratio, k, error_feedback):
        if (ratio is None) == (k is None):
            raise ValueError(f"{type(self).__name__}: give exactly one of ratio and k, "
                             f"got ratio={ratio!r}, k={k!r}")
        if ratio is not None and not (isinstance(ratio, numbers.Real)
                                      and not isinstance(ratio, bool) and 0 < ratio <= 1):
            raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")
        if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer))
                              or k < 1):
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        self.ratio = None if ratio is None else float(ratio)
        self.k, self.error_feedback = k, bool(error_feedback)

    def k_for(self, n):
        """Entries of a message on n weights."""
        if self.k is not None:
            if self.k > n:
                raise ValueError(f"k={self.k} exceeds the {n} entries of the gradient")
            return int(self.k)
        return max(1, int(round(self.ratio * n)))

    def check(self, n):
        self.k_for(n)

    def __repr__(self):
        size = f"ratio={self.ratio}" if self.ratio is not None else f"k={self.k}"
        return f"{type(self).__name__}({size}, error_feedback={self.error_feedback})"


class TopK(_Sized):
    """The k entries of largest magnitude; among equal magnitudes at the boundary the
    lower indices win (a stable order of (-|g|, index)). Selection is a sampled
    threshold, one streaming pass and a partition of the few candidates (see
    ``sgd_shm._select``), exact for every input."""

    def __init__(self, ratio=None, k=None, error_feedback=True):
        super().__init__(ratio, k, error_feedback)

    def max_entries(self, n):
        return self.k_for(n)

    def compress(self, g):
        _check_g(g)
        return _sparse(g, _select.topk_indices(g, self.k_for(g.size)), ordered=True)


class RandomK(_Sized):
    """k entries drawn uniformly without replacement; with ``rescale`` the values are
    multiplied by n/k on decoding, which makes the message unbiased."""

    def __init__(self, ratio=None, k=None, error_feedback=True, seed=0, rescale=False):
        super().__init__(ratio, k, error_feedback)
        self.seed, self.rescale = seed, bool(rescale)
        self._rng = np.random.default_rng(seed)

    def max_entries(self, n):
        return self.k_for(n)

    def check(self, n):
        k = self.k_for(n)
        if self.rescale and self.error_feedback and k < n:
            raise ValueError(
                f"RandomK(rescale=True) with error_feedback=True diverges: each sent entry "
                f"is scaled by n/k = {n / k:.3g}, so the memory takes back {n / k - 1:.3g} "
                f"times the entry each step and the residual grows without bound; use "
                f"rescale=False with error feedback, or error_feedback=False (the rescaled "
                f"message is unbiased without it)")

    def __repr__(self):
        return super().__repr__()[:-1] + (", rescale=True)" if self.rescale else ")")

    def compress(self, g):
        _check_g(g)
        k = self.k_for(g.size)
        msg = _sparse(g, self._rng.choice(g.size, k, replace=False))
        if self.rescale:
            msg = SparseMessage(msg.indices, msg.values, msg.n, msg.nbytes, g.size / k)
        return msg


class ThresholdTopK(_Sized):
    """Deep Gradient Compression's selection: the threshold is the magnitude ranked
    k/n into a random sample of ``sample`` * n entries (at least 64), and every entry
    at or above it is sent. Cheaper to choose than an exact TopK on wide models, but
    the message holds about k entries, not exactly k (more when the sample falls
    low); ``bytes_sent`` counts what was sent."""

    def __init__(self, ratio=None, k=None, error_feedback=True, sample=0.01, seed=0):
        super().__init__(ratio, k, error_feedback)
        if not (isinstance(sample, (int, float)) and not isinstance(sample, bool)
                and 0 < sample <= 1):
            raise ValueError(f"sample must be a fraction in (0, 1], got {sample!r}")
        self.sample, self.seed = float(sample), seed
        self._rng = np.random.default_rng(seed)

    def compress(self, g):
        _check_g(g)
        salt = int(self._rng.integers(0, 2**62))
        idx = _select.threshold_indices(g, self.k_for(g.size), self.sample, salt)
        return _sparse(g, idx, ordered=True)


class QSGD(Compressor):
    """QSGD's stochastic quantization with ``levels`` = s: entry i is sent as
    ||g|| * sign(g_i) * l / s, where l is s|g_i|/||g|| rounded up with probability its
    fractional part and down otherwise, so the message is unbiased (E[decoded] = g).
    The message carries the nonzero levels (the decoding scale is ||g|| / s).

    Bytes: a 4-byte norm plus the cheaper of two fixed-width codings: every entry
    as sign + ceil(log2(s+1)) bits, or each nonzero as a 4-byte index + sign + level
    bits. (The paper's Elias coding is tighter; this one is simple to check.)

    Buckets (``bucket=d``, the paper's Section 3.1 and its experiments' 512): g is cut
    into runs of d consecutive entries, each quantized against its own norm, so the
    variance factor below depends on d instead of n; the message then carries the
    decoded values (signed level times the bucket's norm / s) and the bytes count one
    4-byte norm per bucket. The uniforms are the same as without buckets, so
    ``bucket >= n`` sends what ``bucket=None`` sends.

    Error feedback needs a compressor whose error is smaller than its input; QSGD's
    variance is at most omega ||g||^2 with omega = min(d / s^2, sqrt(d) / s), d the
    bucket (n without one; Lemma 3.1 of the paper), so ``memory(n)`` with error
    feedback on requires omega < 1, that is s > sqrt(d); with fewer levels the residual
    grows without bound."""

    def __init__(self, levels=16, error_feedback=False, seed=0, bucket=None):
        if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)) or levels < 1:
            raise ValueError(f"levels must be an int >= 1 (the s of QSGD), got {levels!r}")
        if bucket is not None and (isinstance(bucket, bool)
                                   or not isinstance(bucket, (int, np.integer)) or bucket < 1):
            raise ValueError(f"bucket must be None (one bucket: the whole gradient) or an "
                             f"int >= 1 (entries quantized against one norm; the paper "
                             f"uses 512), got {bucket!r}")
        self.levels, self.error_feedback, self.seed = int(levels), bool(error_feedback), seed
        self.bucket = None if bucket is None else int(bucket)
        self._rng = np.random.default_rng(seed)

    def _d(self, n):
        """Entries per bucket on n weights."""
        return n if self.bucket is None else min(self.bucket, n)

    def bits(self, n, nnz):
        """Bits of a message with nnz nonzero levels out of n entries (a 32-bit norm
        per bucket)."""
        b = 1 + int(np.ceil(np.log2(self.levels + 1)))
        buckets = 1 if self.bucket is None else max(1, -(-n // self.bucket))
        return 32 * buckets + min(n * b, nnz * (32 + b))

    def compress(self, g):
        _check_g(g)
        itype = np.int32 if g.size < 2**31 else np.int64
        if self.bucket is None:
            idx, lvl, norm = _select.qsgd_levels(g, self.levels, self._rng)
            # the levels are integers <= s: exact in the gradient's float type
            vals, scale = lvl.astype(g.dtype, copy=False), norm / self.levels
        else:
            idx, vals = _select.qsgd_bucket_values(g, self.levels, self.bucket, self._rng)
            vals, scale = vals.astype(g.dtype, copy=False), 1.0
        nbytes = -(-self.bits(g.size, idx.size) // 8)
        return SparseMessage(idx.astype(itype), vals, g.size, nbytes, scale)

    def k_for(self, n):
        return n

    def omega(self, n):
        """The variance factor: E||Q(g) - g||^2 <= omega ||g||^2."""
        d = self._d(n)
        return min(d / self.levels ** 2, np.sqrt(d) / self.levels)

    def check(self, n):
        if self.error_feedback and self.omega(n) >= 1:
            raise ValueError(
                f"QSGD(levels={self.levels}) with error_feedback=True diverges on {n} "
                f"weights: its variance factor min(d/s^2, sqrt(d)/s) = "
                f"{self.omega(n):.3g} must be < 1; use levels > sqrt(d) = "
                f"{int(np.sqrt(self._d(n))) + 1} (d = {self._d(n)}, the entries of a "
                "bucket), a smaller bucket, or error_feedback=False (QSGD is unbiased "
                "without it)")

    def __repr__(self):
        b = "" if self.bucket is None else f", bucket={self.bucket}"
        return f"QSGD(levels={self.levels}, error_feedback={self.error_feedback}{b})"


class Dense(Compressor):
    """No compression: the message is every entry (8 or 4 bytes each, no indices)."""
    error_feedback = False

    def compress(self, g):
        _check_g(g)
        idx = np.arange(g.size, dtype=np.int32 if g.size < 2**31 else np.int64)
        return SparseMessage(idx, g.copy(), g.size, g.nbytes)

    def k_for(self, n):
        return n


class ErrorFeedback:
    """The memory role: a worker's memory of what its compressor did not send."""

    def __init__(self, compressor, n, dtype=np.float64):
        self.compressor, self.n = compressor, int(n)
        self.residual = np.zeros(self.n, dtype)
        self._acc = np.zeros(self.n, dtype)
        self._carried = False            # (no error feedback) residual holds kept messages
        # the kit's own compressors are tested against the contract: only the messages
        # of other classes (a user's, a subclass) are checked at every step, and they
        # see the gradient read-only (one that edited it would lose mass from the memory)
        self._check = type(compressor) not in _BUILTIN

    def step(self, g):
        """The message for gradient g (plus the residual: with error feedback on, what
        was not sent; without, the messages :meth:`keep` took back)."""
        if np.shape(g) != (self.n,):
            raise ValueError(f"g must be a 1-D array of the memory's {self.n} entries "
                             f"(one per weight), got shape {np.shape(g)}; make the memory "
                             "with compressor.memory(n) for this model's n")
        if not self.compressor.error_feedback and not self._carried:
            msg = self.compressor.compress(self._view(np.asarray(g, self.residual.dtype)))
            return self._checked(msg) if self._check else msg
        np.add(self.residual, g, out=self._acc)
        msg = self.compressor.compress(self._view(self._acc))
        if self._check:
            self._checked(msg)
        if not self.compressor.error_feedback:      # the carried mass went out with it
            self.residual[:] = 0.0
            self._carried = False
            return msg
        self.residual[:] = self._acc
        # acc - decoded: exactly zero where values travel verbatim (scale 1)
        self.residual[msg.indices] -= msg.values * msg.scale
        return msg

    def keep(self, msg):
        """A message that was not applied: its mass goes back into the residual (and,
        without error feedback, into the next step's gradient)."""
        self.residual[msg.indices] += msg.values * msg.scale
        self._carried = not self.compressor.error_feedback

    def _view(self, x):
        """x as a user's compressor sees it: read-only (the kit's own, as it is)."""
        if not self._check:
            return x
        x = x.view()
        x.flags.writeable = False
        return x

    def reset(self):
        self.residual[:] = 0.0
        self._carried = False

    def _checked(self, msg):
        """A compressor's message, checked against the contract (a user's subclass
        that breaks it fails here, not as wrong weights later)."""
        who = type(self.compressor).__name__
        if not isinstance(msg, SparseMessage):
            raise TypeError(f"{who}.compress must return a sgd_shm.compress.SparseMessage, "
                            f"got {type(msg).__name__}")
        idx, vals = msg.indices, msg.values
        if not isinstance(idx, np.ndarray) or not isinstance(vals, np.ndarray):
            raise TypeError(f"{who}.compress: indices and values must be numpy arrays, got "
                            f"{type(idx).__name__} and {type(vals).__name__}")
        if isinstance(msg.scale, bool) or not isinstance(msg.scale, numbers.Real) \
                or not np.isfinite(msg.scale):
            raise ValueError(f"{who}.compress: the message's scale must be a finite number, "
                             f"got {msg.scale!r}")
        if isinstance(msg.nbytes, bool) or not isinstance(msg.nbytes, numbers.Integral) \
                or msg.nbytes < 0:
            raise ValueError(f"{who}.compress: nbytes (the bytes the message costs) must be "
                             f"an int >= 0, got {msg.nbytes!r}")
        if msg.n != self.n or idx.ndim != 1 or idx.shape != vals.shape:
            raise ValueError(f"{who}.compress returned a message with n={msg.n}, "
                             f"{idx.shape} indices and {vals.shape} values; it needs "
                             f"n={self.n} and as many 1-D indices as values")
        if idx.dtype.kind not in "iu" or vals.dtype.kind != "f":
            raise TypeError(f"{who}.compress: indices must be integers and values floats, "
                            f"got {idx.dtype} and {vals.dtype}")
        if idx.size and (idx[0] < 0 or idx[-1] >= self.n or
                         (idx.size > 1 and not np.all(idx[1:] > idx[:-1]))):
            raise ValueError(f"{who}.compress: indices must be distinct, ascending and in "
                             f"[0, {self.n}); sort them (np.sort) and drop repeats")
        if not np.isfinite(vals).all():
            raise ValueError(f"{who}.compress: the message's values hold NaN or inf (made "
                             f"by the compressor, or by a gradient that diverged: then lower "
                             f"the step)")
        return msg


class Channel:
    """The communicator role, one worker's side: its memory, and what became of each
    message. A trainer delivers the message by its own transport (a parameter-server
    push, an eager-SGD allgather) and reports back with :meth:`delivered`; a message
    that was not applied goes back into the memory when ``keep_lost`` (eager-SGD's
    ``late="carry"``), and is gone otherwise (a message lost on an unreliable link, of
    which the worker is not told)."""

    def __init__(self, compressor, n, *, stream=0, keep_lost=False, dtype=np.float64):
        if not isinstance(keep_lost, (bool, np.bool_)):
            raise TypeError(f"keep_lost: must be True or False, got {keep_lost!r}")
        self.memory = compressor.memory(n, dtype, stream=stream)
        self.keep_lost = bool(keep_lost)
        self.bytes_sent = 0                 # the compressor's count of applied messages

    def message(self, g) -> SparseMessage:
        """The message for gradient g (through the memory)."""
        return self.memory.step(g)

    def delivered(self, msg, applied=True) -> None:
        """Record msg's fate: applied (its bytes count as sent) or not."""
        if applied:
            self.bytes_sent += int(msg.nbytes)
        elif self.keep_lost:
            self.memory.keep(msg)


# ---- the wire format -----------------------------------------------------------------
_HEAD = 3                                   # [entries, decoding scale, index bytes]
_HEAD_BYTES = 24                            # the same three as int64, float64, int64
_WIRE = (np.dtype(np.float64), np.dtype(np.float32))


def _wire_dtype(dtype):
    dt = np.dtype(dtype)
    if dt not in _WIRE:
        raise TypeError(f"dtype: a packed message is float64 or float32 (the model's float "
                        f"type), got {dt}")
    return dt


def _head(dt):
    """Elements of the header: float64 holds its three numbers as values; float32
    holds their bytes (an int64 count, the float64 scale, an int64 width), so that
    neither a count past 2**24 nor the decoding scale is rounded."""
    return _HEAD if dt.itemsize == 8 else _HEAD_BYTES // dt.itemsize


def packed_size(entries, n, dtype=np.float64):
    """Elements of ``dtype`` (float64 or float32) that :func:`pack` uses for a message
    of ``entries`` entries on n weights: the header (3 float64 elements, or the 24
    bytes of the same three numbers in 6 float32 ones), the indices' bytes (4 each
    below 2**31 weights, else 8) rounded up to whole elements, and the values."""
    dt = _wire_dtype(dtype)
    width = 4 if n < 2 ** 31 else 8
    return _head(dt) + -(-entries * width // dt.itemsize) + entries


def pack(msg, out) -> int:
    """Write msg into ``out``, a float64 or float32 array (the model's float type) at
    least ``packed_size(entries, n, out.dtype)`` long; returns the elements written.
    Indices travel as their bytes (not as floats), values in ``out``'s float type (a
    float32 model's values are float32 already), so :func:`unpack` gives the same
    bits back."""
    m = msg.indices.size
    width = 4 if msg.n < 2 ** 31 else 8
    dt = out.dtype if isinstance(out, np.ndarray) else None
    used = packed_size(m, msg.n, dt) if dt in _WIRE else None
    if used is None or out.size < used:
        raise ValueError(f"out must be a float64 or float32 array of at least "
                         f"packed_size({m}, {msg.n}, out.dtype) elements for a message of "
                         f"{m} entries, got {getattr(out, 'dtype', type(out).__name__)} x "
                         f"{getattr(out, 'size', '?')}")
    h = _head(dt)
    if h == _HEAD:
        out[0], out[1], out[2] = m, msg.scale, width
    else:
        raw = out[:h].view(np.uint8)
        raw[:8] = np.array([m], np.int64).view(np.uint8)
        raw[8:16] = np.array([msg.scale], np.float64).view(np.uint8)
        raw[16:24] = np.array([width], np.int64).view(np.uint8)
    raw = out[h:used - m].view(np.uint8)
    raw[:m * width] = msg.indices.astype(np.int32 if width == 4 else np.int64).view(np.uint8)
    out[used - m:used] = msg.values
    return used


def _read(buf, n):
    """(entries, scale, indices (a view), values (a view), elements used) of the
    message :func:`pack` wrote at the start of ``buf``."""
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"buf must be the numpy array pack() wrote, got {type(buf).__name__}")
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"n must be the message's dense length (an int >= 1), got "
                        f"{type(n).__name__} {n!r}")
    if n < 1:
        raise ValueError(f"n must be the message's dense length (an int >= 1), got {n!r}")
    dt = _wire_dtype(buf.dtype)
    h = _head(dt)
    if buf.ndim != 1 or buf.size < h:
        raise _not_packed(buf, n, "too short for the header")
    if h == _HEAD:
        m_read, scale, w_read = float(buf[0]), float(buf[1]), float(buf[2])
        m = int(m_read) if m_read.is_integer() else -1    # (NaN, inf, fractions: no count)
        width = int(w_read) if w_read.is_integer() else -1
    else:
        raw = buf[:h].view(np.uint8)
        m = m_read = int(raw[:8].view(np.int64)[0])
        scale = float(raw[8:16].view(np.float64)[0])
        width = w_read = int(raw[16:24].view(np.int64)[0])
    if not 0 <= m <= n or width != (4 if n < 2 ** 31 else 8) or not np.isfinite(scale):
        raise _not_packed(buf, n, f"entries {m_read}, index width {w_read}, scale {scale}")
    used = packed_size(m, n, dt)
    if used > buf.size:
        raise _not_packed(buf, n, f"{m} entries need {used} elements")
    idx = buf[h:used - m].view(np.uint8)[:m * width].view(
        np.int32 if width == 4 else np.int64)
    return m, scale, idx, buf[used - m:used], used


def _not_packed(buf, n, why):
    return ValueError(f"buf ({buf.size} {buf.dtype} elements) does not hold a message "
                      f"pack() wrote for n={n} weights ({why}); pass the buffer pack() "
                      "filled and the same n")


def add_packed(buf, n, out):
    """out += the message :func:`pack` wrote at the start of ``buf`` (n: the dense
    length), as ``unpack(buf, n).add_to(out)`` without building the message."""
    _, scale, idx, vals, _ = _read(buf, n)
    if idx.size and (idx.min() < 0 or idx.max() >= n):    # (a negative one added to out[-1])
        raise _not_packed(buf, n, "its indices are not in [0, n)")
    out[idx] += vals if scale == 1.0 else vals * scale
    return out


def unpack(buf, n) -> SparseMessage:
    """The message :func:`pack` wrote at the start of ``buf`` (n: the dense length);
    its values are of ``buf``'s float type."""
    _, scale, idx, vals, used = _read(buf, n)
    if idx.size and (idx[0] < 0 or idx[-1] >= n or (np.diff(idx) <= 0).any()):
        raise _not_packed(buf, n, "its indices are not ascending in [0, n)")
    return SparseMessage(idx.copy(), vals.copy(), n, buf.itemsize * used, scale)


_SPECS = {"topk": TopK, "randomk": RandomK, "threshold": ThresholdTopK}
_BUILTIN = frozenset({TopK, RandomK, ThresholdTopK, QSGD, Dense})


def make_compressor(spec):
    """A compressor from a :class:`Compressor` (any subclass, as is), None, "dense",
    "topk:RATIO", "randomk:RATIO", "threshold:RATIO", "qsgd:LEVELS" or
    "qsgd:LEVELS:BUCKET"."""
    if spec is None or isinstance(spec, Compressor):
        return spec
    if isinstance(spec, str):
        name, _, arg = spec.partition(":")
        if name == "dense" and not arg:
            return Dense()
        try:
            if name in _SPECS and arg:
                return _SPECS[name](ratio=float(arg))
            if name == "qsgd" and arg:
                levels, _, bucket = arg.partition(":")
                if not levels.strip().isdigit():
                    raise ValueError(f"levels must be an int >= 1, got {levels!r}")
                if bucket and not bucket.strip().isdigit():
                    raise ValueError(f"bucket must be None or an int >= 1, got {bucket!r}")
                return QSGD(levels=int(levels), bucket=int(bucket) if bucket else None)
        except ValueError as e:
            raise ValueError(f"compress: {e} (in {spec!r})") from None
    raise ValueError(f"compress: expected None, a sgd_shm.compress.Compressor (TopK, "
                     f"RandomK, ThresholdTopK, QSGD, Dense or a subclass of your own) or a "
                     f"spec such as 'topk:0.001', 'randomk:0.01', 'threshold:0.001', "
                     f"'qsgd:16', 'qsgd:16:512', 'dense'; got {spec!r}")
