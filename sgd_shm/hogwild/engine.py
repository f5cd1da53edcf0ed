"""Hogwild! SGD driver: n workers update one weight matrix without locks.

Niu, Recht, Ré, Wright, "Hogwild!: A Lock-Free Approach to Parallelizing
Stochastic Gradient Descent" (NIPS 2011). The workers visit the samples through
a shuffled array of sample *indices* (never a shuffled copy of the data: reading
rows in shuffled order already dominates the epoch), cut into ``n_workers``
contiguous parts: a random split of the samples between the workers, drawn once,
and each worker reshuffles its own part in place at the start of every epoch, in
parallel, so that the driver's serial time per epoch does not grow with the
data. One Numba kernel per part runs on a Python thread; the kernels release the
GIL, so the threads run in parallel on the same numpy arrays. Between epochs the driver
folds the exact L2 weight scale into the weights (see ``_kernels``). On sparse
data, the workers can buffer the weights of every feature, or of the most frequent
ones, whose rows ``Problem`` then stores hot-first (``hot_features``; see
``_kernels``): during a segment
those weights live in a contiguous block that the driver gathers from W before
and scatters back after.

Example::

    import numpy as np
    from sgd_shm.hogwild import Problem, HogwildSGD
    prob = Problem.from_xy(X, y_pm1[:, None])      # targets +-1 for a binary classifier
    sgd = HogwildSGD(prob.n_features, 1, loss="log_loss", alpha=1e-4, n_workers=2, seed=0)
    for epoch in range(5):
        mean_loss = sgd.epoch(prob)
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import weakref
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from sgd_shm.core.errors import DivergenceError
from sgd_shm.core.launcher import run_workers
from sgd_shm.core.validation import FLOAT_DTYPES
from sgd_shm.hogwild import _kernels as K
from sgd_shm.core.atomics import LINE_WORDS
from sgd_shm.hogwild._mf import shuffle_part

__all__ = ["Problem", "HogwildSGD", "DivergenceError", "run_workers", "staleness_summary",
           "AUTO_HOT_FEATURES", "AUTO_HOT_MIN_NNZ", "AUTO_HOT_MIN_EPOCHS", "AUTO_ALL_HOT_WORDS",
           "AUTO_ALL_HOT_NNZ_PER_FEATURE", "auto_hot_features",
           "hot_rows", "layout_kept", "clear_layout_cache"]

#: the estimators' hot_features="auto" for a fit with several workers on large sparse
#: data (see auto_hot_features). Where each worker's private copy of all the weights is
#: small (n_outputs · n_features at most AUTO_ALL_HOT_WORDS, 2 MB: about a core's L2
#: cache) and the data has at least AUTO_ALL_HOT_NNZ_PER_FEATURE nonzeros per feature
#: and worker, every feature is buffered: the rows then serve as they are (a feature's
#: slot is its id), no copy, and no cache line of the weights moves between the cores
#: between folds. A worker folds at least 16 times per epoch, each fold a few passes
#: over its copy, so with fewer nonzeros per feature the folds would outweigh the
#: samples' work: wide data buffers its most frequent features instead
AUTO_ALL_HOT_WORDS = 1 << 18
AUTO_ALL_HOT_NNZ_PER_FEATURE = 64
#: otherwise (wider models) the AUTO_HOT_FEATURES most frequent features. On Zipf-like
#: text features a few thousand features carry most of the nonzeros; fewer hot
#: features leave more of the contended lines shared, more make every fold (K·H
#: words) longer
AUTO_HOT_FEATURES = 4096
#: ... used from this many nonzeros on (either way). Smaller problems take
#: milliseconds per epoch, so there is little to gain, and the delayed view of the
#: hot weights costs accuracy in the first, large steps when most of the features are
#: hot
AUTO_HOT_MIN_NNZ = 1_000_000
#: ... and, for the AUTO_HOT_FEATURES case (4 * AUTO_HOT_FEATURES features at least),
#: for runs of at least this many epochs (max_iter in a fit), or shorter ones when
#: the layout of X is kept from an earlier fit (see hot_rows): the hot-first copy
#: costs a pass over the data and the first touch of as much new memory, which the
#: buffers' faster epochs earn back over longer fits only
AUTO_HOT_MIN_EPOCHS = 10


def auto_hot_features(X, epochs, n_outputs=1, n_workers=2) -> int:
    """hot_features="auto" for a run of at most ``epochs`` on X with ``n_workers`` > 1
    workers and ``n_outputs`` linear outputs (K), on sparse X with at least
    AUTO_HOT_MIN_NNZ nonzeros: every feature (X.shape[1]: no copy of the rows) when
    K · X.shape[1] <= AUTO_ALL_HOT_WORDS and X has AUTO_ALL_HOT_NNZ_PER_FEATURE ·
    n_workers nonzeros per feature; else AUTO_HOT_FEATURES when X has 4 *
    AUTO_HOT_FEATURES features and ``epochs`` >= AUTO_HOT_MIN_EPOCHS or the hot-first
    rows of X are kept from an earlier fit (``hot_rows``: no copy to earn back); else 0
    (small problems, or short runs that would not earn back the copy of the data)."""
    if not (sp.issparse(X) and X.nnz >= AUTO_HOT_MIN_NNZ):
        return 0
    d = X.shape[1]
    if (n_outputs * d <= AUTO_ALL_HOT_WORDS
            and X.nnz >= AUTO_ALL_HOT_NNZ_PER_FEATURE * max(n_workers, 1) * d):
        return d
    if d < 4 * AUTO_HOT_FEATURES:
        return 0
    kept = epochs >= 2 and layout_kept(X, AUTO_HOT_FEATURES)
    return AUTO_HOT_FEATURES if epochs >= AUTO_HOT_MIN_EPOCHS or kept else 0

_EMPTY_I = np.empty(0, dtype=np.int64)
_EMPTY_I32 = np.empty(0, dtype=np.int32)
_NO_CLASS_WEIGHT = np.ones((0, 2))


def _value_dtype(dtype):
    """float32 data stays float32 (the kernels read it as it is, without a float64
    copy); anything else is converted to float64."""
    return np.dtype(dtype) if np.dtype(dtype) in FLOAT_DTYPES else np.dtype(np.float64)


def staleness_summary(hist):
    """(mean tau, share of updates with tau = 0) of a staleness histogram (index =
    tau; the last bin, counting that many or more, taken at its index)."""
    h = np.asarray(hist)
    total = max(int(h.sum()), 1)
    return float((np.arange(len(h)) * h).sum() / total), float(h[0] / total)


@dataclass
class Problem:
    """Training data in the layout the kernels read: CSR (int64 indptr, int32
    indices) or a C-contiguous dense matrix, targets Y of shape (n, K), sample
    weights. float32 values stay float32: the kernels read the caller's buffer (a
    C-contiguous dense array, or a CSR matrix's data) without a copy, and compute
    in float64. ``rows`` (see :meth:`subset`) limits the samples an epoch visits;
    ``cw`` holds class weights per output (see ``_kernels.Data``). With
    ``hot_features`` = H > 0, sparse rows are stored hot-first: the H most frequent
    features (``hot_feat``, most frequent first) carry their slot number instead of
    the feature id, ``hot_end[i]`` ends row i's hot part, and the workers buffer
    those weights (see ``_kernels``; this costs a copy of the data, a pass over its
    nonzeros). With H >= n_features every feature is hot and its slot is its id
    (``hot_feat`` = arange(d), ``hot_end`` = indptr[1:]): the rows serve as they are,
    without a copy. The caller's matrix is never modified."""
    n_samples: int
    n_features: int
    Y: np.ndarray
    sw: np.ndarray
    X: np.ndarray            # (n, d) dense, or (0, d) when sparse (float64 or float32)
    indptr: np.ndarray       # (n + 1,) int64 when sparse, else empty
    indices: np.ndarray      # (nnz,) int32 column indices
    data: np.ndarray
    cols_all: np.ndarray     # arange(d) (int32) for dense rows
    hot_end: np.ndarray      # (n,) int64 with hot features: end of each row's hot part
    hot_feat: np.ndarray     # (H,) int64: the hot features, by slot (empty when dense)
    # (K, 2) class weights, or (0, 2): none; the sorted rows an epoch visits, empty: all
    cw: np.ndarray = dataclasses.field(default_factory=lambda: _NO_CLASS_WEIGHT)
    rows: np.ndarray = dataclasses.field(default_factory=lambda: _EMPTY_I)

    @property
    def sparse(self) -> bool:
        return self.indptr.shape[0] > 0

    @property
    def dtype(self) -> np.dtype:
        """The type of the values (float64 or float32)."""
        return (self.data if self.sparse else self.X).dtype

    def weight_sum(self) -> float:
        """The sample weights of the rows an epoch visits, summed."""
        return float(self.sw[self.rows].sum() if self.rows.shape[0] else self.sw.sum())

    def kernel_data(self) -> K.Data:
        """The arrays as the kernel takes them (``_kernels.Data``; ``run_worker`` makes
        them read-only views)."""
        return K.Data(self.X, self.cols_all, self.indptr, self.indices, self.data,
                      self.hot_end, self.hot_feat, self.Y, self.sw, self.cw)

    def subset(self, rows) -> "Problem":
        """The same data (no copy), of which an epoch visits only ``rows`` (e.g. the
        training part of a validation split): n_samples is their count, and without
        shuffling they come in increasing order."""
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        if rows.shape[0] == 0 or rows[0] < 0 or rows[-1] >= self.Y.shape[0]:
            raise ValueError(f"rows must be a non-empty set of row numbers in [0, "
                             f"{self.Y.shape[0]}), got {rows.shape[0]} rows")
        return dataclasses.replace(self, n_samples=int(rows.shape[0]), rows=rows)

    @classmethod
    def from_xy(cls, X, Y, sample_weight=None, hot_features=0, class_weight=None) -> "Problem":
        if isinstance(hot_features, bool) or not isinstance(hot_features, (int, np.integer)):
            raise TypeError(f"hot_features must be an int, got {type(hot_features).__name__}")
        if hot_features < 0:
            raise ValueError(f"hot_features must be >= 0 (0: plain Hogwild), got {hot_features}")
        Y = np.ascontiguousarray(Y, dtype=np.float64)
        if Y.ndim != 2 or Y.shape[0] != X.shape[0]:
            raise ValueError(f"Y must have shape (n_samples, n_outputs), got {Y.shape}")
        n, d = X.shape
        sw = (np.ones(n) if sample_weight is None
              else np.ascontiguousarray(sample_weight, dtype=np.float64))
        cw = _class_weight_table(class_weight, Y.shape[1])
        if sp.issparse(X):
            X = sp.csr_matrix(X, dtype=_value_dtype(X.dtype))
            empty = np.empty((0, d), dtype=X.dtype)
            if hot_features == 0:            # plain rows: no hot part
                indptr, indices, data = _canonical_rows(X)
                hot_end = hot_feat = _EMPTY_I
            elif hot_features >= d:          # every feature hot, its slot its id:
                indptr, indices, data = _canonical_rows(X)     # each row all hot part
                hot_end, hot_feat = indptr[1:], np.arange(d, dtype=np.int64)
            else:
                indptr, indices, data, hot_end, hot_feat = hot_rows(X, int(hot_features))
            return cls(n, d, Y, sw, empty, indptr, indices, data, _EMPTY_I32, hot_end,
                       hot_feat, cw)
        X = np.ascontiguousarray(X, dtype=_value_dtype(X.dtype))
        return cls(n, d, Y, sw, X, _EMPTY_I, _EMPTY_I32, np.empty(0, dtype=X.dtype),
                   np.arange(d, dtype=np.int32), _EMPTY_I, _EMPTY_I, cw)


def _canonical_rows(X):
    """CSR X's rows as the kernels read them, (indptr int64, indices int32, data):
    X's own index and value arrays where they are already so (no copy), summed in a
    copy where X has duplicates or unsorted rows (never in the caller's matrix)."""
    if not X.has_canonical_format:
        X = X.copy()
        X.sum_duplicates()
    # int32 column indices: rows are read in shuffled order, so bytes per nonzero
    # matter more than anything else in the epoch
    return (X.indptr.astype(np.int64), X.indices.astype(np.int32, copy=False),
            np.ascontiguousarray(X.data))


#: the hot-first rows of the last matrix laid out (see hot_rows), kept for the next
#: fit on the same, unchanged matrix: a dict with the matrix's arrays (weak
#: references), its fingerprint, the hot feature count and the layout; None: empty
_layout_cache = None
_layout_lock = threading.RLock()     # (re-entrant: a release callback may run in a holder)


def clear_layout_cache():
    """Drop the hot-first rows kept for the next fit on the same matrix (see
    :func:`hot_rows`), freeing their memory now rather than when the matrix goes."""
    global _layout_cache
    with _layout_lock:
        _layout_cache = None


def _row_blocks(n, per_block=10_000):
    """Cuts of n rows into blocks for threads: up to min(CPUs, 8), of at least
    ``per_block`` rows each."""
    nt = max(1, min(os.cpu_count() or 1, 8, n // per_block))
    return np.linspace(0, n, nt + 1).astype(np.int64)


def _bits(a):
    """The raw bits of a numeric array, as unsigned ints of its width (a view)."""
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def _scan(X):
    """X's fingerprint (see ``_kernels.scan_rows``), from one parallel read of CSR X."""
    cuts = _row_blocks(X.shape[0])
    outs = np.zeros((len(cuts) - 1, 4), dtype=np.uint64)
    ib, vb = _bits(X.indices), _bits(X.data)
    run_workers(lambda w: K.scan_rows(X.indptr, ib, vb, cuts[w], cuts[w + 1], outs[w]),
                len(cuts) - 1)
    return _fingerprint(X, outs)


def _fingerprint(X, outs):
    """The fingerprint of X from the row blocks' sums ``outs`` (see
    ``_kernels.scan_rows``; their column 2 is left out: it counts entries out of
    canonical order)."""
    tot = outs.sum(axis=0, dtype=np.uint64)           # wraps modulo 2^64, as the kernel
    return int(tot[0]), int(tot[1]), int(tot[3]), X.shape, X.data.dtype.str


def _counts(X):
    """Nonzeros per feature of CSR X, counted in parallel blocks of entries."""
    d = X.shape[1]
    cuts = _row_blocks(X.nnz, per_block=max(1_000_000, d))   # per-block arrays of d stay cheap
    parts = [None] * (len(cuts) - 1)

    def count(w):
        parts[w] = K.feature_counts(X.indices, d, cuts[w], cuts[w + 1])
    run_workers(count, len(parts))
    return np.sum(parts, axis=0) if len(parts) > 1 else parts[0]


def layout_kept(X, H) -> bool:
    """Whether the hot-first rows kept by ``hot_rows`` were built from the arrays of
    the sparse matrix X (the same memory, alive) with H hot features; whether X has
    changed since, ``hot_rows`` checks (one read of the data)."""
    return _matches(_layout_cache, sp.csr_matrix(X, dtype=_value_dtype(X.dtype)), H)


def _matches(entry, X, H):
    """Whether the cache entry was built from CSR X's arrays with H hot features."""
    return (entry is not None and entry["H"] == H and entry["arrays"] == _identities(X)
            and all(ref() is not None for ref in entry["owners"]))


def _cached_layout(X, H):
    """The kept layout if it was built from the arrays of X (the same memory) with
    H hot features and X still has that fingerprint, else None."""
    entry = _layout_cache
    if not _matches(entry, X, H):
        return None
    return entry["layout"] if _scan(X) == entry["fingerprint"] else None


def _keep_layout(X, H, fingerprint, layout):
    """Keep ``layout`` as the one cached (see _layout_cache), until the next layout,
    clear_layout_cache(), or the death of one of X's arrays."""
    global _layout_cache
    token = object()         # names the entry; the callback must not hold the entry
    entry = {"H": H, "fingerprint": fingerprint, "layout": layout, "token": token}
    lock = _layout_lock      # (held here: at interpreter exit the module's globals are gone)

    def drop(_ref):          # (a reference to entry here would make a cycle through the
        global _layout_cache  # weakrefs: a cleared layout would live on until a gc pass)
        with lock:
            if _layout_cache is not None and _layout_cache["token"] is token:
                _layout_cache = None
    entry["arrays"] = _identities(X)
    entry["owners"] = tuple(weakref.ref(_owner(a), drop) for a in (X.indptr, X.indices, X.data))
    _layout_cache = entry


def _owner(a):
    """The array that owns a's memory (a itself, or the end of its chain of bases)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _identities(X):
    """X's arrays as (owner's id, address, shape, strides, dtype) each: two matrices
    (scipy makes new views of the same arrays when it converts one) with equal
    identities read the same memory while the owners live."""
    return tuple((id(_owner(a)), a.__array_interface__["data"][0], a.shape, a.strides,
                  a.dtype.str) for a in (X.indptr, X.indices, X.data))


def hot_rows(X, H):
    """The rows of CSR matrix X stored hot-first with its H most frequent features
    (see ``Problem``): (indptr int64, indices int32, data, hot_end, hot_feat).

    Built in parallel blocks: one pass over the column indices counts the features,
    one writes the new rows (and fingerprints X, see ``_kernels.scan_rows``). The
    layout of the last matrix is kept (one entry, released with the matrix or by
    :func:`clear_layout_cache`), and a later call with the same arrays, unchanged (the
    fingerprint, one read of the data, tells), and the same H returns it without the
    copy: refits on the same data (another alpha, another seed) skip the copy. The
    kernels only read these arrays, so one layout serves every fit that gets it."""
    with _layout_lock:
        hit = _cached_layout(X, H)
        if hit is not None:
            return hit
        layout, fingerprint, canonical = _build_hot_rows(X, H)
        if not canonical:                # (rare) duplicates or unsorted rows: sum them
            X = X.copy()                 # in a copy, never in the caller's matrix
            X.sum_duplicates()
            layout, _, _ = _build_hot_rows(X, H)
        else:                            # (a canonical copy has no caller to match)
            _keep_layout(X, H, fingerprint, layout)
        return layout


def _build_hot_rows(X, H):
    """(the hot-first rows of CSR X, as hot_rows returns them, X's fingerprint,
    whether X's rows are in canonical form: else the layout is void)."""
    n, d = X.shape
    counts = _counts(X)
    n_hot = min(H, int(np.count_nonzero(counts)))
    hot_feat = np.argsort(-counts, kind="stable")[:n_hot].astype(np.int64)
    slot = np.full(d, -1, dtype=np.int32)
    slot[hot_feat] = np.arange(n_hot)
    # int32 column indices: rows are read in shuffled order, so bytes per nonzero
    # matter more than anything else in the epoch. Fresh arrays (numpy's, so large
    # ones get huge pages: the rows are read at random); X itself is never modified
    indptr = X.indptr.astype(np.int64)
    indices = np.empty(X.nnz, dtype=np.int32)
    data = np.empty(X.nnz, dtype=X.dtype)
    hot_end = np.empty(n, dtype=np.int64)
    # row blocks on threads (the kernel releases the GIL; the pages of the new
    # arrays are first touched there too); the same pass fingerprints X
    cuts = _row_blocks(n)
    outs = np.zeros((len(cuts) - 1, 4), dtype=np.uint64)
    bits = (_bits(X.indices), _bits(X.data))
    run_workers(lambda w: K.hot_layout(X.indptr, X.indices, X.data, slot, indices, data,
                                       hot_end, cuts[w], cuts[w + 1], bits, outs[w]),
                len(cuts) - 1)
    return ((indptr, indices, data, hot_end, hot_feat), _fingerprint(X, outs),
            int(outs[:, 2].sum()) == 0)


def _class_weight_table(class_weight, k):
    """class_weight as the kernels' (K, 2) table (see ``_kernels.Data``), checked."""
    if class_weight is None:
        return _NO_CLASS_WEIGHT
    cw = np.array(class_weight, dtype=np.float64)
    if cw.shape != (k, 2) or not np.isfinite(cw).all() or (cw < 0).any():
        raise ValueError(f"class_weight must be a finite (n_outputs, 2) = ({k}, 2) table of "
                         f"weights >= 0 (a step on output c is scaled by [c, 0] for a target "
                         f"> 0, else [c, 1]), got shape {cw.shape}")
    return cw


class HogwildSGD:
    """The state of one Hogwild run: weights, intercepts, L1 memory, schedule."""

    def __init__(self, n_features, n_outputs, *, loss="log_loss", alpha=1e-4, l1_ratio=0.0,
                 learning_rate="optimal", eta0=0.0, power_t=0.5, fit_intercept=True,
                 intercept_decay=1.0, n_workers=1, backend="threads", locked=False,
                 instrument=False, stale_bins=64, penalty_scale=1.0, momentum=0.0,
                 seed=None, shuffle=True, start_method="fork", average=0):
        if loss not in K.LOSSES:
            raise ValueError(f"loss must be one of {sorted(K.LOSSES)}, got {loss!r}")
        if learning_rate not in K.LEARNING_RATES:
            raise ValueError(f"learning_rate must be one of {sorted(K.LEARNING_RATES)}, "
                             f"got {learning_rate!r}")
        self.W = np.zeros((n_outputs, n_features))
        self.b = np.zeros(n_outputs)
        self.q = (np.zeros((n_outputs, n_features)) if alpha * l1_ratio * penalty_scale > 0
                  else np.zeros((0, 0)))
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        # heavy-ball velocity in weight units (empty without momentum)
        self.V = (np.zeros((n_outputs, n_features)) if momentum > 0 else np.zeros((0, 0)))
        self.n_workers = int(n_workers)
        self._init_average(average, n_outputs, n_features)
        if backend not in ("threads", "processes"):
            raise ValueError(f"backend must be 'threads' or 'processes', got {backend!r}")
        self.backend = backend
        # how the processes backend starts its workers (see sgd_shm.hogwild._pool)
        from sgd_shm.core.launcher import check_start_method
        self.start_method = check_start_method(start_method)
        self._pool = None
        self.rng = np.random.default_rng(seed)
        # shuffle=False: every epoch visits the samples in index order (as scikit-learn's
        # shuffle=False), worker w the w-th contiguous block
        self.shuffle = bool(shuffle)
        self._perm = np.empty(0, dtype=np.int64)      # the order of the samples (_split)
        self._eta = self._scale = self._cum = np.empty(0)   # schedule tables (_tables)
        self._Wh = np.empty((0, 0, 0))                 # the hot block's buffer (_hot_buffer)
        self.ip = np.zeros(K.N_IPARAMS, dtype=np.int64)
        self.ip[K.I_LOSS] = K.LOSSES[loss]
        self.ip[K.I_LR] = K.LEARNING_RATES[learning_rate]
        self.ip[K.I_FIT_ICPT] = int(bool(fit_intercept))
        # locked=True: a spinlock around every sample's step (a baseline, not Hogwild)
        self.ip[K.I_LOCKED] = int(bool(locked))
        self.lock = np.zeros(LINE_WORDS, dtype=np.int64)
        # instrument=True: per-update staleness histogram (see _kernels._run)
        self.ip[K.I_INSTRUMENT] = int(bool(instrument))
        self.clock = np.zeros(LINE_WORDS, dtype=np.int64)
        self.staleness = np.zeros(int(stale_bins), dtype=np.int64)
        self.fp = np.zeros(K.N_FPARAMS)
        self.fp[K.F_ETA0] = eta0
        # penalty_scale=0 keeps alpha for the 'optimal' schedule but applies no penalty
        self.fp[K.F_ALPHA2] = alpha * (1.0 - l1_ratio) * penalty_scale
        self.fp[K.F_ALPHA1] = alpha * l1_ratio * penalty_scale
        self.fp[K.F_ALPHA_LR] = alpha
        self.fp[K.F_MOMENTUM] = momentum
        self.fp[K.F_POWER_T] = power_t
        self.fp[K.F_T0] = K.optimal_t0(alpha, K.LOSSES[loss]) if learning_rate == "optimal" else 0.0
        self.fp[K.F_ICPT_DECAY] = intercept_decay
        self.fp[K.F_T_START] = 0.0
        self.fp[K.F_U0] = 0.0
        self.fp[K.F_AVG_FROM] = -1.0     # set per segment when averaging (_average_from)
        self.clipped = 0           # loss derivatives clipped to +-MAX_DLOSS so far

    def _init_average(self, average, k, d):
        """average = a >= 1: from the a-th sample on (1-based global count, as
        scikit-learn's ``average``), keep the average of the weights and intercepts
        after every step in ``avg_W``, ``avg_b`` (over ``avg_count`` steps); 0: none.
        The kernels keep it lazily (see ``_kernels.average_table``)."""
        if isinstance(average, bool) or not isinstance(average, (int, np.integer)) \
                or average < 0:
            raise ValueError(f"average must be an int >= 0 (0: no averaging), got {average!r}")
        self.average = int(average)
        on = self.average > 0
        self.avg_W = np.zeros((k, d)) if on else None
        self.avg_b = np.zeros(k) if on else None
        self.avg_count = 0
        self.A = np.zeros((k, d)) if on else np.zeros((0, 0))
        self.Ab = np.zeros((self.n_workers, k)) if on else np.zeros((0, 0))
        self._avg = np.empty(0)                    # the segment's table (_tables)

    @property
    def t(self) -> float:
        """Samples seen so far (the global step count)."""
        return float(self.fp[K.F_T_START])

    def averaged(self):
        """(weights, intercepts) as published: the averages once averaging has
        counted a step, else the current ones."""
        if self.average and self.avg_count > 0:
            return self.avg_W, self.avg_b
        return self.W, self.b

    @contextlib.contextmanager
    def session(self, prob: Problem):
        """Context for a run of epochs on ``prob``: with the processes backend it starts
        the worker processes and the shared segment, and always releases both."""
        if self.backend != "processes" or self._pool is not None:
            yield self
            return
        from sgd_shm.hogwild._pool import ProcessPool
        hot = self._set_hot(prob)           # the workers get ip as it is at their start
        self._split(prob.n_samples, prob.rows)   # the pool moves these into shared memory
        self._tables(prob.n_samples)
        self._hot_buffer(prob, hot)
        self._pool = ProcessPool(self, prob, self._workers_for(prob.n_samples),
                                 self.start_method)
        self._pool_prob = prob
        try:
            yield self
        finally:
            pool, self._pool, self._pool_prob = self._pool, None, None
            pool.close()

    def epoch(self, prob: Problem) -> float:
        """One pass over the data by all workers; returns the mean (weighted) loss
        of the samples as they were visited.

        The pass runs in segments of global time: a segment ends before the L2 weight
        scale would fall below 1e-9 (or to zero, when eta·alpha >= 1), and the driver
        folds the scale into the weights between segments (scikit-learn rescales at the
        same threshold). Almost always there is one segment."""
        if self.backend == "processes" and self._pool is None:
            with self.session(prob):
                return self._epoch(prob)
        if self._pool is not None and prob is not self._pool_prob:
            raise ValueError("epoch() got other data than its session(); open a new session")
        return self._epoch(prob)

    def _epoch(self, prob):
        n = prob.n_samples
        nw = self._workers_for(n)
        hot = self._set_hot(prob)
        self._split(n, prob.rows)
        bounds = np.linspace(0, n, nw + 1).astype(np.int64)
        lens = np.diff(bounds)
        # each worker reshuffles its part [bounds[w], bounds[w + 1]) with seeds[w]
        # in its first segment (-1: no shuffle)
        no_shuffle = np.full(nw, -1, dtype=np.int64)
        seeds = self.rng.integers(0, 2**63 - 1, size=nw) if self.shuffle else no_shuffle
        outs = np.zeros((nw, K.N_OUT))
        nbins = self.staleness.shape[0]
        hists = np.zeros((nw, nbins + LINE_WORDS), dtype=np.int64)   # padded rows
        fp = self.fp.copy()
        fp[K.F_NW] = nw
        eta, scale_buf, cum_buf = self._tables(n)
        Wh = self._hot_buffer(prob, hot)
        K.epoch_etas(self.fp, self.ip, eta)
        g0 = 0
        while g0 < n:
            g1, zero_first = K.segment(self.fp, eta, g0, scale_buf, cum_buf)
            if zero_first:                   # eta·alpha >= 1: this step zeroes the weights
                self.W[...] = 0.0
            L = g1 - g0
            cum_end = float(cum_buf[L])
            lo = bounds[:-1] + lens * g0 // n
            hi = bounds[:-1] + lens * g1 // n
            seg_outs = np.zeros((nw, K.N_OUT))
            fp[K.F_U0] = self.fp[K.F_U0]
            a0 = self._average_from(g0, L)
            fp[K.F_AVG_FROM] = a0
            # the hot block travels as Wh[0], and each worker publishes its steps on
            # it in Wh[1 + w] (see _kernels)
            Wh[...] = 0.0
            if hot:
                Wh[0] = self.W[:, prob.hot_feat]
            self._run_segment(prob, lo, hi, bounds, seeds if g0 == 0 else no_shuffle, fp,
                              seg_outs, g0, L, hists[:, :nbins], Wh)
            if hot:
                self.W[:, prob.hot_feat] = Wh.sum(axis=0)
            outs += seg_outs
            if seg_outs[:, K.O_DIVERGED].any():
                raise DivergenceError(
                    "SGD diverged (a prediction became inf/NaN) after "
                    f"{self.t + outs[:, K.O_STEPS].sum():.0f} samples; lower eta0 or alpha, "
                    "scale the features (e.g. StandardScaler), or use learning_rate='optimal'")
            if a0 >= 0:
                self._fold_average(float(self._avg[L]), L - a0)
            scale = float(scale_buf[L])
            if scale != 1.0:
                self.W *= scale
            self.fp[K.F_U0] += self.fp[K.F_ALPHA1] * cum_end
            g0 = g1
        self.clipped += int(outs[:, K.O_CLIPS].sum())
        self.staleness += hists[:, :nbins].sum(axis=0)
        self.fp[K.F_T_START] += n
        if not (np.isfinite(self.W).all() and np.isfinite(self.b).all()):
            raise DivergenceError("SGD diverged: the weights are no longer finite; lower eta0")
        return float(outs[:, K.O_LOSS].sum() / max(prob.weight_sum(), 1e-300))

    def _average_from(self, g0, L):
        """The first step of the segment [g0, g0 + L) of this epoch that counts in the
        average (-1: none), with its table filled (see ``_kernels.average_table``)."""
        if not self.average:
            return -1
        first = self.average - 1 - int(self.fp[K.F_T_START]) - g0   # 1-based sample count
        a0 = max(0, first)
        if a0 >= L:
            return -1
        K.average_table(self._scale, L, a0, self._avg)
        return a0

    def _fold_average(self, c_end, m):
        """Fold the segment's m averaged steps into avg_W, avg_b (the weights W still
        unscaled: the true sum over the segment is c_end·W + A, see
        ``_kernels.average_table``) and clear the compensation sums."""
        k0 = self.avg_count
        total = k0 + m
        self.avg_W *= k0 / total
        self.avg_W += (c_end * self.W + self.A) / total
        self.avg_b *= k0 / total
        self.avg_b += (m * self.b + self.Ab.sum(axis=0)) / total
        self.avg_count = total
        self.A[...] = 0.0
        self.Ab[...] = 0.0

    def _split(self, n, rows=_EMPTY_I):
        """The order array for n samples (kept while n stays the same). A new one is a
        random permutation (identity without shuffle): cut into the workers' contiguous
        parts, it splits the samples between the workers at random, once. Every epoch
        each worker then reshuffles its own part in place (``_mf.shuffle_part``, as the
        MF workers do), in parallel, so that the driver's serial time per epoch does not
        grow with the data; with one worker the part is all of it, so a lone worker
        still sees a fresh uniform order every epoch. With ``rows`` (n of them), the
        order holds those rows instead of 0..n-1 (kept while the same array comes)."""
        if self._perm.shape[0] != n or rows is not getattr(self, "_perm_rows", _EMPTY_I):
            self._perm = rows.copy() if rows.shape[0] else np.arange(n, dtype=np.int64)
            self._perm_rows = rows
            if self.shuffle:
                shuffle_part(self._perm, 0, n, int(self.rng.integers(0, 2**63 - 1)))
        return self._perm

    def _tables(self, n):
        """The epoch's schedule buffers (step sizes, L2 scales, L1 totals; see
        ``_kernels.segment``), allocated once for n samples instead of every epoch.
        Scratch: every epoch writes them before it reads them, so the processes pool
        moves them into its segment without copying their contents either way."""
        if self._eta.shape[0] != n:
            self._eta, self._scale, self._cum = np.empty(n), np.empty(n + 1), np.empty(n + 1)
            self._avg = np.empty(n + 1 if self.average else 0)
        return self._eta, self._scale, self._cum

    def _workers_for(self, n) -> int:
        """How many workers run on n samples: n_workers, but at least 1, at most n."""
        return max(1, min(self.n_workers, n))

    def _hot_buffer(self, prob, hot):
        """The (workers + 1, K, H) buffer of the hot block (H = 0 unless ``hot``, see
        _set_hot), kept while its shape stays; a scratch buffer like the tables (every
        segment zeroes it first), which the processes pool places in its segment."""
        shape = (self._workers_for(prob.n_samples) + 1, self.W.shape[0],
                 prob.hot_feat.shape[0] if hot else 0)
        if self._Wh.shape != shape:
            self._Wh = np.zeros(shape)
        return self._Wh

    def _set_hot(self, prob) -> bool:
        """Whether the workers buffer the hot coordinates of ``prob`` (sparse data
        with hot features, no lock, no L1, no momentum, no averaging), written to
        ip[I_HOT]."""
        hot = (prob.sparse and prob.hot_feat.shape[0] > 0 and not self.ip[K.I_LOCKED]
               and self.fp[K.F_ALPHA1] == 0.0 and self.fp[K.F_MOMENTUM] == 0.0
               and not self.average)
        self.ip[K.I_HOT] = int(hot)
        return hot

    def _run_segment(self, prob, lo, hi, parts, seeds, fp, outs, g0, L, hists, Wh):
        """Worker w runs positions [lo[w], hi[w]) of the order, and takes over chunks
        of the others' when done, with the schedule of global steps [g0, g0 + L),
        after reshuffling its part [parts[w], parts[w + 1]) with seeds[w] unless it
        is -1 (see _kernels._run)."""
        nw = len(lo)
        if self._pool is not None:
            self._pool.run_epoch(lo, hi, parts, seeds, fp, outs, g0, L, hists, Wh)
            return
        data = prob.kernel_data()
        model = K.Model(self.W, self.b, self.q, self.V, Wh, self.lock, self.A, self.Ab)
        sched = K.Schedule.for_segment(self._perm, parts, seeds, lo, hi, K.fresh_progress(nw),
                                       self._eta, self._scale, self._cum, g0, L, self._avg)
        params = K.Params.from_driver(fp, self.ip)
        run_workers(lambda w: K.run_worker(data, model, sched, params,
                                           K.Report(outs[w], hists[w], self.clock), w), nw)
