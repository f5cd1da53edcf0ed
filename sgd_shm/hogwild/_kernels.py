"""Numba kernels for Hogwild SGD on linear models (private; see sgd_shm.hogwild).

One worker's share of one epoch: it walks its slice of a shuffled index array
and, for every sample, updates all K linear outputs (K = 1 for binary or
regression, K = n_classes for one-vs-rest) of a weight matrix it shares with
the other workers, without locks (Hogwild!, Niu, Recht, Ré, Wright 2011).

The kernel ``_run`` takes its arguments in five groups (named tuples, built by
the driver): :class:`Data` (the samples), :class:`Model` (the shared state the
workers step), :class:`Schedule` (which samples, and the segment's global
time), :class:`Params` (the hyper-parameters and modes) and :class:`Report`
(what a worker reports back). :func:`run_worker` is the one place it is called,
by the threads driver and the process workers alike.

Regularisation without per-feature timestamps (which race under Hogwild and
decay popular features twice):

* L2 through a weight scale, w = s·v (Bottou's trick, as in scikit-learn's
  ``_sgd_fast``): a step multiplies s by (1 − η·α₂) and touches only the
  sample's nonzeros in v. s is a function of the *global* step count t, read
  from a per-epoch table; each worker estimates t from the progress the workers
  publish every 32 samples (see ``_run``), so all agree on s, also when one
  starts late or runs slower (a scale from a worker's own step count does not:
  a late starter reads the shared weights with the wrong scale). No shared word
  is written per step for it; the driver folds s into v between epochs.
* L1 through cumulative penalties (Tsuruoka, Tsujii, Ananiadou 2009): u is the
  total penalty any weight could have received by global step t (from the same
  table), q[c, j] the penalty weight j actually received; weights are clipped at
  zero. q is shared and updated without locks: an intended Hogwild race (a lost
  update of q only mis-sizes one later clip).

Hot coordinates (sparse data): the most frequent features are touched by almost
every sample, so with several workers their cache lines move between the cores
on almost every step (a line one worker wrote must be fetched from the other
core before the next read). The rows are therefore stored hot-first
(``hogwild.Problem``: the H most frequent features carry slot numbers 0..H-1
instead of feature ids, ``hot_end[i]`` ends row i's hot part; with every feature hot
the rows are read as they are, a feature's slot its id and each row all hot). With
``Params.hot`` set, each worker keeps a private copy of the hot block, applies its
own steps there at once, and every ``hot_flush`` of its samples (K·H / 4) publishes
them through ``Wh`` (shape (n_workers + 1, K, H), in shared memory for processes):
``Wh[0]`` is the block at the start of the segment (the driver gathers it from W
and never changes it during the segment) and ``Wh[1 + w]`` the sum of worker w's
published hot steps, written by worker w alone. A fold adds the steps since the
last fold to the worker's own row and refreshes its copy to ``Wh[0] + sum_w
Wh[1 + w]``, the others' published steps included; after the segment the driver
writes that sum back to W. A worker thus sees its own hot steps immediately and
the others' at most one flush interval of their samples late: a bounded extra
delay on H coordinates (compare the per-core model replicas of DimmWitted, Zhang
and Ré, VLDB 2014, and HogWild++, Zhang, Hsieh, Akella, ICDM 2016). Every word
has one writer, so no hot step is ever lost and no atomic instruction is needed;
a fold is a few vectorised passes over K·H words. Reading another worker's row
while it folds sees each word old or new (aligned 8-byte stores): a tolerated
race that only delays a step to the next fold. The cold coordinates keep
Hogwild's plain read-add-write, whose race loses a step now and then (the price
of lock-free writes; tests/test_hogwild.py bounds it). Without ``Params.hot``
(locked baseline, L1, momentum) the hot slots are mapped back to feature ids and
updated in W directly, as plain Hogwild does.

Averaging (ASGD: the averaged weights of Polyak and Juditsky 1992, as scikit-learn's
``average``): from a given global step on, the average of the weights after every
step is kept lazily (see ``average_table``): each step adds −C·ΔW for the
coordinates it changed to ``Model.A`` (shared, updated without locks like W), and
each worker its intercepts' compensation to its own row of ``Model.Ab``.

Learning rates: constant η₀; inverse scaling η₀ / t^power_t; "optimal"
1 / (α·(t₀ + t)) with Bottou's t₀ heuristic (see ``optimal_t0``). t is the
global sample count (estimated as above).

Kernels raise nothing: a non-finite prediction sets ``out[O_DIVERGED] = 1`` and
returns; the Python driver raises.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numba as nb
import numpy as np

from sgd_shm.core.atomics import (DISTANCE, LINE_WORDS, cas_acquire, claim_add, fetch_add,
                                  load_relaxed, prefetch, prefetch_once, read_only_fields,
                                  store_release)
from sgd_shm.hogwild._mf import shuffle_part
from sgd_shm.models._losses import (HINGE, LOG, LOSSES, MAX_DLOSS, MODIFIED_HUBER,  # noqa: F401
                                    SQUARED, dloss as _dloss, loss as _loss)

# learning-rate codes
CONSTANT, OPTIMAL, INVSCALING = 0, 1, 2
LEARNING_RATES = {"constant": CONSTANT, "optimal": OPTIMAL, "invscaling": INVSCALING}

# the driver's float parameters (HogwildSGD.fp), from which it builds Params
(F_ETA0, F_ALPHA2, F_ALPHA1, F_POWER_T, F_T0, F_T_START, F_NW, F_ICPT_DECAY, F_U0, F_ALPHA_LR,
 F_MOMENTUM, F_AVG_FROM) = range(12)
# (F_U0: the L1 total u at the start of the segment; F_ALPHA_LR: alpha of the 'optimal'
#  schedule, which also holds with penalty=None; F_AVG_FROM: the segment's first step
#  that counts in the average, -1: none, see Params.avg_from)
N_FPARAMS = 12
# the driver's int parameters (HogwildSGD.ip)
I_LOSS, I_LR, I_FIT_ICPT, I_LOCKED, I_INSTRUMENT, I_HOT = range(6)
N_IPARAMS = 6
# slots of Report.out
O_LOSS, O_STEPS, O_DIVERGED, O_SCALE, O_CLIPS = range(5)
N_OUT = 5
#: samples between publications of a worker's intercept steps (see _run)
INTERCEPT_FLUSH = 32
#: fewest of a worker's samples between folds of its hot-coordinate steps (see hot_flush)
HOT_FLUSH = 64
#: samples a worker claims at a time from a part of the epoch (see _run)
CHUNK = 256
#: a part's claim cursor before its owner has started (see _run): nobody may claim
NOT_READY = 1 << 62


_EMPTY1 = np.zeros(0)
_EMPTY2 = np.zeros((0, 0))


# ---- the kernel's arguments ---------------------------------------------------------------
class Data(NamedTuple):
    """The samples as ``hogwild.Problem`` lays them out (``Problem.kernel_data``):
    sparse rows in CSR (``X`` then has 0 rows), or dense rows in ``X`` (``indptr``
    then is empty)."""
    X: np.ndarray           # (n, d) dense rows, or (0, d); float64 or float32, as data
    cols_all: np.ndarray    # (d,) int32 arange(d): the feature ids of a dense row
    indptr: np.ndarray      # (n + 1,) int64 CSR row bounds, or empty
    indices: np.ndarray     # (nnz,) int32 feature ids; hot-first rows: hot slots first
    data: np.ndarray        # (nnz,) values, float64 or float32 (the caller's, uncopied)
    hot_end: np.ndarray     # (n,) int64 end of each row's hot part; empty: no hot part
    hot_feat: np.ndarray    # (H,) int64 the feature of each hot slot
    Y: np.ndarray           # (n, K) float64 targets
    sw: np.ndarray          # (n,) float64 sample weights
    cw: np.ndarray          # (K, 2) float64 class weights: a step on output c is scaled
    #                         by cw[c, 0] when Y[i, c] > 0, else cw[c, 1]; (0, 2): none


class Model(NamedTuple):
    """The state the workers share and step without locks (see the module notes)."""
    W: np.ndarray           # (K, d) weights in units of the segment's L2 scale: w = s·W
    b: np.ndarray           # (K,) intercepts
    q: np.ndarray           # (K, d) L1 penalty each weight received; (0, 0) without L1
    V: np.ndarray           # (K, d) heavy-ball velocity; (0, 0) without momentum
    Wh: np.ndarray          # (n_workers + 1, K, H) hot block and the workers' hot steps
    lock: np.ndarray        # int64, lock[0]: the spinlock of the locked baseline
    A: np.ndarray = _EMPTY2      # (K, d) averaging: the segment's compensation sum
    Ab: np.ndarray = _EMPTY2     # (n_workers, K) ... and each worker's, of the intercepts


class Schedule(NamedTuple):
    """Which samples the workers visit in a segment, and its global time (see
    :meth:`for_segment`)."""
    order: np.ndarray       # (n,) int64 the samples in the order of the epoch
    parts: np.ndarray       # (n_workers + 1,) int64 worker w reshuffles parts[w]:parts[w + 1]
    seeds: np.ndarray       # (n_workers,) int64 seed of that reshuffle; -1: none
    lo: np.ndarray          # (n_workers,) int64: worker w's own positions in the
    hi: np.ndarray          # segment are order[lo[w]:hi[w]]
    progress: np.ndarray    # int64, a padded slot per worker: published count, claim cursor
    eta: np.ndarray         # (L,) step size of each global step of the segment
    scale: np.ndarray       # (L + 1,) the L2 weight scale after 0..L steps
    cum: np.ndarray         # (L + 1,) cumulative step sizes (the L1 totals, over alpha1)
    avg: np.ndarray         # (L + 1,) averaging: the scales summed over the averaged
    #                         steps before each step (see average_table); empty: none

    @classmethod
    def for_segment(cls, order, parts, seeds, lo, hi, progress, eta, scale, cum, g0, L,
                    avg=None):
        """The Schedule of the segment of global steps [g0, g0 + L) of an epoch:
        ``eta`` holds the epoch's step sizes, ``scale``, ``cum`` (and ``avg`` when
        averaging) the segment's tables (from ``segment`` and ``average_table``)."""
        avg = _EMPTY1 if avg is None or avg.shape[0] == 0 else avg[:L + 1]
        return cls(order, parts, seeds, lo, hi, progress, eta[g0:g0 + L], scale[:L + 1],
                   cum[:L + 1], avg)


class Params(NamedTuple):
    """Hyper-parameters and modes of a segment (see :meth:`from_driver`)."""
    loss: int               # a loss code (LOSSES)
    fit_intercept: bool
    intercept_decay: float  # factor on the intercept's steps
    alpha1: float           # L1 strength (L2 is all in Schedule.scale)
    u0: float               # the L1 total at the start of the segment
    momentum: float         # heavy-ball momentum mu; 0: plain SGD
    n_workers: int
    locked: bool            # every step under Model.lock (the locked baseline)
    hot: bool               # step the hot block in a private copy (see the module notes)
    instrument: bool        # measure staleness into Report.stale_hist
    avg_from: int           # averaging: the segment's first averaged step; -1: none

    @classmethod
    def from_driver(cls, fp, ip):
        """The Params of the driver's parameter arrays (``HogwildSGD.fp`` and ``.ip``;
        fp[F_NW]: the workers of this segment)."""
        return cls(int(ip[I_LOSS]), bool(ip[I_FIT_ICPT]), float(fp[F_ICPT_DECAY]),
                   float(fp[F_ALPHA1]), float(fp[F_U0]), float(fp[F_MOMENTUM]),
                   int(fp[F_NW]), bool(ip[I_LOCKED]), bool(ip[I_HOT]),
                   bool(ip[I_INSTRUMENT]), int(fp[F_AVG_FROM]))


class Report(NamedTuple):
    """What a worker reports back."""
    out: np.ndarray         # (N_OUT,) float64: O_LOSS, O_STEPS, O_DIVERGED, O_SCALE, O_CLIPS
    stale_hist: np.ndarray  # int64 this worker's staleness histogram (Params.instrument)
    clock: np.ndarray       # int64, clock[0]: the shared update counter it is measured with


def run_worker(data: Data, model: Model, sched: Schedule, params: Params, report: Report,
               wid: int):
    """Worker ``wid``'s share of a segment (see ``_run``): the one call of the kernel,
    from the threads driver and from the process workers. The data go in as read-only
    views (``read_only_fields``): one compiled kernel serves the caller's arrays, a
    memory map and the writeable views a worker process gets from shared memory."""
    data = read_only_fields(data)
    nw = params.n_workers
    if sched.progress.shape[0] != LINE_WORDS * nw or sched.lo.shape[0] != nw:
        raise ValueError(f"the schedule is for {sched.lo.shape[0]} workers with "
                         f"{sched.progress.shape[0]} progress words, not {nw} workers with "
                         f"{LINE_WORDS} each (see fresh_progress)")
    lean = (not params.locked and not params.instrument and params.momentum == 0.0
            and params.alpha1 == 0.0 and params.avg_from < 0 and data.cw.shape[0] == 0)
    (_run_lean if lean else _run_full)(data, model, sched, params, report, wid)


@nb.njit(cache=True, nogil=True, inline="always")
def _u(x):
    """x (>= 0) as an unsigned index: numba then leaves out the negative-index
    wrap-around, which it cannot rule out for an offset plus a loop counter (a
    compare and a select on every access of the inner loops)."""
    return nb.uint64(x)


@nb.njit(cache=True, nogil=True, inline="always")
def _feat(idx, r0, m, nh, hot_feat):
    """Feature id of entry m of the row whose ids start at idx[r0] (its first nh
    entries are hot slots)."""
    return hot_feat[idx[_u(r0 + m)]] if m < nh else idx[_u(r0 + m)]


def fresh_progress(nw, out=None):
    """The workers' progress slots for a segment (``out``, or a new array of
    LINE_WORDS·nw): worker w's slot is progress[LINE_WORDS·w:LINE_WORDS·(w + 1)], its
    published count (word 0) 0 and its part's claim cursor (word LINE_WORDS // 2)
    NOT_READY (see _run). With the default 128-byte padding the count and the cursor
    lie in different 64-byte lines; with 64-byte padding they share one, which costs
    little: the owner writes its count every INTERCEPT_FLUSH samples, and a cursor
    moves every CHUNK samples."""
    progress = np.empty(LINE_WORDS * nw, dtype=np.int64) if out is None else out
    progress[...] = 0
    progress[LINE_WORDS // 2::LINE_WORDS] = NOT_READY
    return progress


@nb.njit(cache=True, nogil=True, inline="always")
def _claim(progress, stride, los, his, v, left):
    """The next CHUNK of positions a worker takes: from part v (its own first),
    moving on to the next part when v has no more, ``left`` parts still to try
    (part v's cursor: progress[stride * v + stride // 2]). Returns (start, end, v,
    left); start == end when every part is taken."""
    nw = los.shape[0]
    while left > 0:
        n_v = his[v] - los[v]
        c = claim_add(progress, stride * v + stride // 2, CHUNK)
        if c < n_v:
            return los[v] + c, los[v] + min(c + CHUNK, n_v), v, left
        v = v + 1 if v + 1 < nw else 0
        left -= 1
    return 0, 0, v, 0


@nb.njit(cache=True, nogil=True, inline="always")
def _ahead(q, ce, ns, ne):
    """Position q of a worker's run (current chunk up to ce, then the claimed next
    chunk [ns, ne)), or -1 beyond both."""
    if q < ce:
        return q
    q = ns + (q - ce)
    return q if q < ne else -1


@nb.njit(cache=True, nogil=True, inline="always")
def hot_flush(K, H, part):
    """A worker's samples between folds of its hot steps, for a K x H block and a
    part of ``part`` samples: K·H / 4, so that a fold (a few passes over K·H words)
    costs about one word per sample, but at most part / 16, so that a worker folds
    at least 16 times per part, and at least HOT_FLUSH."""
    return max(HOT_FLUSH, min((K * H) // 4, part // 16))


@nb.njit(cache=True, nogil=True)
def _fold(Wh, hw, snap, wid):
    """Publish a worker's hot steps since its last fold (hw − snap) in its own row
    Wh[1 + wid] and refresh its copy hw (and snap) to Wh[0] + the sum of all rows,
    the other workers' published steps included (see the module docstring)."""
    mine = Wh[1 + wid]
    for c in range(hw.shape[0]):
        for h in range(hw.shape[1]):
            mine[c, h] += hw[c, h] - snap[c, h]
        for h in range(hw.shape[1]):
            hw[c, h] = Wh[0, c, h]
        for r in range(1, Wh.shape[0]):
            for h in range(hw.shape[1]):
                hw[c, h] += Wh[r, c, h]
        for h in range(hw.shape[1]):
            snap[c, h] = hw[c, h]


@nb.njit(cache=True, nogil=True)
def feature_counts(indices, d, p0=0, p1=-1):
    """Nonzeros per feature among entries p0..p1-1 of ``indices`` (all by default;
    blocks of entries run on threads): np.bincount without its int64 copy."""
    counts = np.zeros(d, dtype=np.int64)
    if p1 < 0:
        p1 = indices.shape[0]
    for m in range(p0, p1):
        counts[indices[m]] += 1
    return counts


#: an odd 64-bit constant (the golden ratio's): entry m's key is m * _KEY
_KEY = np.uint64(0x9E3779B97F4A7C15)


@nb.njit(cache=True, nogil=True, inline="always")
def _mix(z):
    """SplitMix64's finalizer (Steele, Lea, Flood, OOPSLA 2014): a bijection of the
    64-bit words that spreads every input bit over the output."""
    z = (z ^ (z >> nb.uint64(30))) * nb.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> nb.uint64(27))) * nb.uint64(0x94D049BB133111EB)
    return z ^ (z >> nb.uint64(31))


@nb.njit(cache=True, nogil=True)
def _fingerprint_row(i, p0, p1, idx_bits, val_bits, acc):
    """Add row i's entries p0..p1-1 to the fingerprints ``acc`` (see scan_rows);
    acc[2] counts the entries whose index is not above the one before it."""
    acc[3] += _mix(nb.uint64(p1) ^ (nb.uint64(i) * _KEY))
    prev = -1
    hi = nb.uint64(0)
    hv = nb.uint64(0)
    bad = 0
    for m in range(p0, p1):
        j = np.int64(idx_bits[m])
        key = nb.uint64(m) * _KEY
        hi += _mix(nb.uint64(j) ^ key)
        hv += _mix(nb.uint64(val_bits[m]) ^ key)
        bad += j <= prev
        prev = j
    acc[0] += hi
    acc[1] += hv
    acc[2] += nb.uint64(bad)


@nb.njit(cache=True, nogil=True)
def scan_rows(indptr, idx_bits, val_bits, r0, r1, out):
    """One pass over CSR rows r0..r1-1 (a row block: the blocks run on threads)
    that adds to ``out``: out[0], out[1] the fingerprints of the column indices and
    of the values (``idx_bits``, ``val_bits``: their raw bits as unsigned ints),
    out[2] the number of entries whose index is not above the one before it in the
    row (0: the rows are in canonical form, sorted without duplicates), out[3] the
    fingerprint of the row ends. A fingerprint is the sum over the entries m of
    mix(x_m xor m·K), modulo 2^64 (uint64 arithmetic wraps), with mix a bijection
    (:func:`_mix`) and K an odd constant: a change of any single entry changes its
    term and so the sum, and, the terms being scrambled, changes of many entries
    (a rescaled ``X.data``, swapped values) cancel only by a 2^-64 chance, where a
    linear sum would let structured changes cancel exactly; the blocks' sums add up. It tells a matrix changed in place from the one a layout
    was built from (see ``hogwild.hot_rows``) at the cost of one read of the data."""
    acc = np.zeros(4, dtype=np.uint64)
    for i in range(r0, r1):
        _fingerprint_row(i, indptr[i], indptr[i + 1], idx_bits, val_bits, acc)
    for k in range(4):
        out[k] += acc[k]


@nb.njit(cache=True, nogil=True)
def hot_layout(indptr, indices, data, slot, ind_out, dat_out, hot_end, r0, r1, bits, out):
    """Rewrite CSR rows r0..r1-1 hot-first: entries whose feature has slot[j] >= 0
    come first, carrying the slot instead of the feature id; hot_end[i] ends row
    i's hot part. Each part keeps the row's order. One slot lookup per entry and
    no branch on it: every entry is written to both the hot front and a cold row
    buffer, and only the matching cursor moves. In the same pass, with the row in
    cache, adds the rows' fingerprints and canonical-form count to ``out`` (as
    scan_rows does; ``bits``: (indices, data) as raw unsigned ints)."""
    longest = 0
    for i in range(r0, r1):
        longest = max(longest, indptr[i + 1] - indptr[i])
    cold_i = np.empty(longest + 1, dtype=ind_out.dtype)
    cold_v = np.empty(longest + 1, dtype=dat_out.dtype)
    idx_bits, val_bits = bits
    acc = np.zeros(4, dtype=np.uint64)
    for i in range(r0, r1):
        w = indptr[i]
        nc = 0
        for m in range(indptr[i], indptr[i + 1]):
            j = indices[m]
            h = slot[j]
            v = data[m]
            ind_out[w] = h
            dat_out[w] = v
            cold_i[nc] = j
            cold_v[nc] = v
            hot = h >= 0
            w += hot
            nc += 1 - hot
        hot_end[i] = w
        for c in range(nc):
            ind_out[w + c] = cold_i[c]
            dat_out[w + c] = cold_v[c]
        _fingerprint_row(i, indptr[i], indptr[i + 1], idx_bits, val_bits, acc)
    for k in range(4):
        out[k] += acc[k]


def _make_run(full):
    """The kernel ``_run`` compiled for one of two cases, told apart at compile time
    (``full`` is a constant of the closure, passed on to ``_run_body`` as a literal, so
    ``_run_body`` is compiled once per value with the branches it decides removed; a
    call: Numba's IR inlining of the body would copy its whole IR, a slower compile for
    no faster kernel): full=False, the lean variant, for the default fits: no lock, no
    staleness clock, no momentum, no L1, no averaging and no class weights, so that
    the sample loop carries no test or argument of those features; full=True, every
    feature, each tested at run time. ``run_worker`` picks the variant."""

    @nb.njit(cache=True, nogil=True)
    def _run(data, model, sched, params, report, wid):
        return _run_body(data, model, sched, params, report, wid, full)
    return _run


@nb.njit(cache=True, nogil=True)
def _run_body(data, model, sched, params, report, wid, full):
    """Worker wid's share of an epoch (segment): its own part, positions
    [lo[wid], hi[wid]) of ``sched.order``, and whatever it takes over of the other
    parts. Sparse rows (``data.X`` has 0 rows) and dense rows (``data.indptr`` is
    empty) share the body. With seeds[wid] >= 0 (the first segment of a shuffled
    epoch) the worker first reshuffles its part of the epoch,
    order[parts[wid]:parts[wid + 1]], in place.

    Progress slots: ``sched.progress`` holds one padded slot of ``stride`` words
    per worker (stride = its length / n_workers, a cache line: see
    ``fresh_progress``); word 0 of worker w's slot is the count it publishes, word
    stride // 2 the claim cursor of its part.

    Work stealing: the workers claim their positions CHUNK at a time from the
    per-part cursors (atomic adds), the owner of a part first, and a worker that
    has finished its own part goes on claiming chunks of the others' (as OpenMP's
    dynamic schedule). The workers thus finish together although one may start
    late, run slower or be paused by the OS, instead of the epoch waiting on the
    slowest. Every position is still visited exactly once. A part is claimable
    only once its owner has started (the driver sets the cursor to NOT_READY; the
    owner resets it to 0 with a release store, after reshuffling its part), so
    that nobody reads a part while its owner shuffles it. With one worker the
    positions come in order, as without stealing. The next chunk is claimed while
    the current one runs, so the row prefetches run on across chunks.

    Global time: the worker publishes how many samples it has done in its slot
    every INTERCEPT_FLUSH samples, and for every sample, once it has read the
    sample's weights, takes the global step count tg as its own count plus the
    counts the others have published (and from tg the step size eta[tg], the L2
    scale s = scale[tg] and the L1 total). tg thus lags the true count by less
    than INTERCEPT_FLUSH · (n_workers − 1) steps whatever the workers' start
    times, speeds or pauses. Reading the slots only every INTERCEPT_FLUSH samples
    and extrapolating in between would not do: a worker that starts late or is
    paused would use a scale off by orders of magnitude under strong L2 until its
    next read. The slots are read with relaxed atomic loads, so every read is
    fresh; a slot's line changes only every INTERCEPT_FLUSH samples, so the reads
    mostly hit the cache. The tables are the driver's, for this segment.

    With params.locked, every sample's read-modify-write runs under a spinlock in
    model.lock[0] (the "locked SGD" baseline of the benchmarks); otherwise no lock
    is taken.

    With params.instrument, staleness is measured: report.clock[0] is a shared
    update counter, read before a sample's prediction and fetch-and-incremented at
    its write; the difference minus one is how many updates other workers applied
    in between (the delay tau of the asynchronous SGD analyses), counted in
    report.stale_hist (last bin: that many or more). It costs one contended atomic
    per update.

    With params.momentum = mu > 0, heavy-ball momentum on the coordinates a sample
    touches: V ← mu·V + g·x and w ← (1 − η·α₂)·w + V (V in weight units, shared by
    the workers without locks: asynchronous momentum). Dense rows touch every
    coordinate, so there it is the exact heavy-ball method; on sparse rows a
    coordinate's velocity waits, undecayed, until a sample touches it again.

    Sparse rows may be hot-first: entries [indptr[i], hot_end[i]) name slots of
    ``hot_feat`` (feature hot_feat[slot]), the rest feature ids (hot_end empty:
    none). With params.hot, the worker steps the hot slots in a private copy of
    the block ``Wh[0]`` and publishes them in ``Wh[1 + wid]`` every ``hot_flush``
    samples and at the end (see the module docstring); otherwise it maps the slots
    to features and works on W."""
    nb.literally(full)      # one compile per value, its branches removed (see _make_run)
    W, b, q, V, Wh, lock, A, Ab = model
    order, parts, seeds, los, his, progress, eta_tab, scale_tab, cum_eta, avg_tab = sched
    out, stale_hist, clock = report
    X, cols_all, indptr, indices, vals, hot_end, hot_feat, Y, sw, cw = data
    K, d_feat = W.shape
    loss, fit_icpt, icpt_decay = params.loss, params.fit_intercept, params.intercept_decay
    nw, u0 = params.n_workers, params.u0
    # the features the lean variant leaves out (see _make_run): constants there
    mom = params.momentum if full else 0.0
    a1 = params.alpha1 if full else 0.0           # (L2: all in scale_tab)
    locked = params.locked if full else False
    instrument = params.instrument if full else False
    weighted = full and cw.shape[0] > 0           # class weights
    n_tab = scale_tab.shape[0] - 1          # global steps in this segment
    stride = progress.shape[0] // nw        # words per progress slot
    dense = indptr.shape[0] == 0
    hot = params.hot and not dense
    if hot:                                  # a private copy of the hot block, and its base
        hw = Wh[0].copy()                    # (the published rows are zero at the start)
        snap = hw.copy()
    else:
        hw = np.empty((0, 0))
        snap = hw
    n_bins = stale_hist.shape[0]
    loss_sum = 0.0
    g = np.empty(K)
    dots = np.empty(K)
    # the intercept is one word every sample writes: each worker adds its steps to a
    # private delta (used in its own predictions) and publishes it every
    # INTERCEPT_FLUSH samples, so the line is not bounced between cores on every step
    db = np.zeros(K)
    # averaging (params.avg_from >= 0): this worker's intercept compensation (see
    # average_table), written to its own row Ab[wid] at the end
    avg_from = params.avg_from if full else -1
    dab = np.zeros(K)
    cb = 0.0
    c_read = 0                               # (instrument: the clock at the read)
    since = 0                                # own samples since the last publication
    done_own = 0
    s = 1.0
    part = his[wid] - los[wid]
    # a lone worker has nobody to show its hot steps to: it folds once, at the end
    hot_every = hot_flush(K, hw.shape[1], part) if nw > 1 else part + 1
    hot_since = 0
    nh = 0                                   # hot entries of the current row
    has_hot = hot_end.shape[0] > 0           # (plain rows: no hot part, nothing to read)
    # a row's entries are idx[r0 + m] (feature ids, or hot slots first) and val[v0 + m],
    # m < nnz: offsets into the CSR arrays, or into cols_all and the flat X for a dense
    # row. Not slices: numba keeps the reference counting of row slices in this loop,
    # calls to NRT_incref/NRT_decref that are each a locked (so fencing, on x86) atomic
    # add, several per sample
    idx = cols_all if dense else indices
    val = X.reshape(X.shape[0] * X.shape[1]) if dense else vals
    r0 = v0 = nnz = 0
    if seeds[wid] >= 0:
        shuffle_part(order, parts[wid], parts[wid + 1], seeds[wid])
    store_release(progress[stride * wid + stride // 2:], 0)     # this part is open for claims
    vic, left = wid, nw                      # the part claimed from, parts left to try
    k, ce, vic, left = _claim(progress, stride, los, his, vic, left)    # current chunk
    ns, ne, vic, left = _claim(progress, stride, los, his, vic, left)   # and the next
    while True:
        if k >= ce:
            if ns >= ne:
                break
            k, ce = ns, ne
            ns, ne, vic, left = _claim(progress, stride, los, his, vic, left)
        k2 = _ahead(k + 2 * DISTANCE, ce, ns, ne)
        if k2 >= 0:
            _prefetch_bookkeeping(order[k2], Y, sw, indptr, hot_end, dense, has_hot)
        k1 = _ahead(k + DISTANCE, ce, ns, ne)
        if k1 >= 0:                            # a row ahead: the reads are shuffled
            if dense:
                _prefetch_dense_row(order[k1], X, d_feat)
            else:
                _prefetch_sparse_row(order[k1], indptr, indices, vals)
        i = order[k]
        k += 1
        if dense:
            v0 = i * d_feat
            nnz = d_feat
        else:
            r0 = indptr[i]
            v0 = r0
            nnz = indptr[i + 1] - r0
            if has_hot:
                nh = hot_end[i] - r0
        wi = sw[i]
        if locked:
            while not cas_acquire(lock, 0, 1):
                pass
        if instrument:
            c_read = load_relaxed(clock, 0)
        _dots(dots, W, hw, idx, val, r0, v0, nh, nnz, hot_feat, hot)   # the raw dot products
        # ... then the global time, so that the scale is no older than the weights read:
        # a worker paused between the two would otherwise scale fresh weights by an old,
        # larger scale (under strong L2 by orders of magnitude: one sample's loss could
        # outweigh the epoch's); this way a pause makes the prediction smaller instead,
        # a bounded error (a stale gradient)
        tg = _global_step(progress, stride, wid, nw, done_own, n_tab)
        eta = eta_tab[tg]
        s = scale_tab[tg]                      # scale before this step ...
        s_after = scale_tab[tg + 1]            # ... and after its L2 decay
        if not (s_after >= 1e-200):
            if locked:
                store_release(lock, 0)
            out[O_DIVERGED] = 2.0
            break
        loss_sum, any_step, bad = _gradient(loss_sum, g, dots, s, b, db, Y, i, wi, eta, loss,
                                            out, cw, weighted)
        if bad:
            if locked:
                store_release(lock, 0)
            out[O_DIVERGED] = 1.0
            break
        if instrument:
            tau = fetch_add(clock, 1) - c_read
            stale_hist[tau if tau < n_bins else n_bins - 1] += 1
        if avg_from >= 0:         # averaging: the scales of the averaged steps before
            cb = avg_tab[tg]      # this one, summed (see average_table)
            if fit_icpt and tg > avg_from:
                _average_intercept(dab, g, tg - avg_from, icpt_decay)
        if mom > 0.0:             # heavy ball: the velocity moves w even when g is zero
            _momentum_step(W, V, g, mom, 1.0 / s_after, idx, val, r0, v0, nh, nnz, hot_feat,
                           A, cb)
            if fit_icpt:
                for c in range(K):
                    if g[c] != 0.0:
                        db[c] += g[c] * icpt_decay
        elif any_step:
            _step(W, hw, db, g, 1.0 / s_after, idx, val, r0, v0, nh, nnz, hot_feat, hot,
                  fit_icpt, icpt_decay)
            if avg_from >= 0 and cb != 0.0:
                _average_step(A, g, cb / s_after, idx, val, r0, v0, nh, nnz, hot_feat)
        if a1 > 0.0:
            _l1_clip(W, q, u0 + a1 * cum_eta[tg + 1], s_after, idx, r0, nh, nnz, hot_feat,
                     A, cb)
        if locked:                             # serialised: publish the intercept too
            _flush_intercept(b, db)
            store_release(lock, 0)
        done_own += 1
        if hot:
            hot_since += 1
            if hot_since >= hot_every:
                _fold(Wh, hw, snap, wid)
                hot_since = 0
        since += 1
        if since >= INTERCEPT_FLUSH:
            _flush_intercept(b, db)
            progress[stride * wid] = done_own      # only this worker writes its count
            since = 0
    for c in range(K):
        b[c] += db[c]
    if avg_from >= 0:
        for c in range(K):
            Ab[wid, c] += dab[c]
    if hot and hot_since > 0:
        _fold(Wh, hw, snap, wid)
    progress[stride * wid] = done_own
    out[O_LOSS] = loss_sum
    out[O_STEPS] = done_own
    out[O_SCALE] = s


_run_lean = _make_run(False)
_run_full = _make_run(True)


# The helpers below are inlined into the sample loop of _run. Numba counts references
# to the arrays a helper takes, and whether its pruning pass then removes those
# increments and decrements from the loop depends on how the helper uses them (an
# array used on some paths only may leave a pair in the loop: an atomic add each, on a
# line all the workers share). A change to the loop or to these helpers is worth a
# look at the loop's LLVM IR (``_run.inspect_llvm()``, compiled without the cache): it
# should call no NRT_incref or NRT_decref. The row bounds, the choice of the rows to
# prefetch and the intercept part of the momentum step stay in the loop for that reason.
@nb.njit(cache=True, nogil=True, inline="always")
def _prefetch_bookkeeping(j, Y, sw, indptr, hot_end, dense, has_hot):
    """Ask for row j's bookkeeping (its bounds, hot part, target and weight), ahead of
    the row itself, so that the row's prefetch finds its bounds in cache."""
    prefetch(Y, j * Y.shape[1])
    prefetch(sw, j)
    if not dense:
        prefetch(indptr, j)
        if has_hot:
            prefetch(hot_end, j)


@nb.njit(cache=True, nogil=True, inline="always")
def _prefetch_sparse_row(j, indptr, indices, vals):
    """Ask for every line of CSR row j (read once: low locality)."""
    p0 = indptr[j]
    p1 = indptr[j + 1]
    while p0 < p1:
        prefetch_once(vals, p0)
        prefetch_once(indices, p0)
        p0 += 8


@nb.njit(cache=True, nogil=True, inline="always")
def _prefetch_dense_row(j, X, d_feat):
    """Ask for every line of dense row j (read once: low locality)."""
    p0 = j * d_feat
    p1 = p0 + d_feat
    while p0 < p1:
        prefetch_once(X, p0)
        p0 += 8


@nb.njit(cache=True, nogil=True, inline="always")
def _dots(dots, W, hw, idx, val, r0, v0, nh, nnz, hot_feat, hot):
    """The row's raw (unscaled) dot product with every output's weights: the hot
    entries from the worker's copy hw when ``hot``, the others from W."""
    for c in range(W.shape[0]):
        p = 0.0
        if hot:
            for m in range(nh):
                p += hw[c, idx[_u(r0 + m)]] * val[_u(v0 + m)]
            for m in range(nh, nnz):
                p += W[c, idx[_u(r0 + m)]] * val[_u(v0 + m)]
        else:
            for m in range(nnz):
                p += W[c, _feat(idx, r0, m, nh, hot_feat)] * val[_u(v0 + m)]
        dots[c] = p


@nb.njit(cache=True, nogil=True, inline="always")
def _global_step(progress, stride, wid, nw, done_own, n_tab):
    """The global samples before this one: the worker's own count plus the counts the
    others published, at most n_tab - 1."""
    tg = done_own
    for w in range(nw):
        if w != wid:
            tg += load_relaxed(progress, stride * w)
    if tg > n_tab - 1:
        tg = n_tab - 1
    return tg


@nb.njit(cache=True, nogil=True, inline="always")
def _gradient(loss_sum, g, dots, s, b, db, Y, i, wi, eta, loss, out, cw, weighted):
    """The step g[c] = −η·dloss·wi·cwc of every output for sample i (cwc: the class
    weight of output c for the sample's target when ``weighted``, else 1; as scikit-learn, it
    scales the step, not the reported loss). Returns (loss_sum plus the sample's
    weighted losses, whether any step is nonzero, whether a prediction is not finite:
    g is then incomplete)."""
    any_step = False
    for c in range(g.shape[0]):
        p = dots[c] * s + b[c] + db[c]
        if not math.isfinite(p):
            return loss_sum, any_step, True
        yc = Y[i, c]
        loss_sum += wi * _loss(loss, p, yc)
        d = _dloss(loss, p, yc)
        if d > MAX_DLOSS or d < -MAX_DLOSS:
            d = MAX_DLOSS if d > 0.0 else -MAX_DLOSS
            out[O_CLIPS] += 1.0
        g[c] = -eta * d * wi
        if weighted:
            g[c] *= cw[c, 0] if yc > 0.0 else cw[c, 1]
        if g[c] != 0.0:
            any_step = True
    return loss_sum, any_step, False


@nb.njit(cache=True, nogil=True, inline="always")
def _step(W, hw, db, g, inv_s, idx, val, r0, v0, nh, nnz, hot_feat, hot, fit_icpt,
          icpt_decay):
    """Add the steps g (in weight units; inv_s converts them to W's) on the row's
    entries: the hot ones to the worker's copy hw when ``hot``, the others to W; the
    intercept's steps to the private delta db."""
    for c in range(W.shape[0]):
        gc = g[c]
        if gc != 0.0:
            step = gc * inv_s
            if hot:
                for m in range(nh):
                    hw[c, idx[_u(r0 + m)]] += step * val[_u(v0 + m)]
                for m in range(nh, nnz):
                    W[c, idx[_u(r0 + m)]] += step * val[_u(v0 + m)]
            else:
                for m in range(nnz):
                    W[c, _feat(idx, r0, m, nh, hot_feat)] += step * val[_u(v0 + m)]
            if fit_icpt:
                db[c] += gc * icpt_decay


@nb.njit(cache=True, nogil=True, inline="always")
def _momentum_step(W, V, g, mom, inv_s, idx, val, r0, v0, nh, nnz, hot_feat, A, cb):
    """The heavy-ball step on the row's entries: V <- mom*V + g*x, W += V (in W's
    units: inv_s); with cb != 0 (averaging) each change of W also goes into A, times
    -cb (see average_table)."""
    for c in range(W.shape[0]):
        gc = g[c]
        for m in range(nnz):
            j = _feat(idx, r0, m, nh, hot_feat)
            vel = mom * V[c, j] + gc * val[_u(v0 + m)]
            V[c, j] = vel
            W[c, j] += vel * inv_s
            if cb != 0.0:
                A[c, j] -= cb * vel * inv_s


@nb.njit(cache=True, nogil=True, inline="always")
def _average_intercept(dab, g, before, icpt_decay):
    """Averaging: the intercepts' compensation for this step's change, times the
    count of averaged steps ``before`` it (see average_table)."""
    for c in range(dab.shape[0]):
        dab[c] -= before * g[c] * icpt_decay


@nb.njit(cache=True, nogil=True, inline="always")
def _average_step(A, g, cb_inv_s, idx, val, r0, v0, nh, nnz, hot_feat):
    """Averaging: A -= cb · (the change ``_step`` made to W), cb_inv_s = cb / s
    (see average_table)."""
    for c in range(A.shape[0]):
        gc = g[c] * cb_inv_s
        if gc != 0.0:
            for m in range(nnz):
                A[c, _feat(idx, r0, m, nh, hot_feat)] -= gc * val[_u(v0 + m)]


@nb.njit(cache=True, nogil=True, inline="always")
def _l1_clip(W, q, u, s_after, idx, r0, nh, nnz, hot_feat, A, cb):
    """The cumulative L1 penalty on the row's weights (Tsuruoka et al.): move each
    toward zero by what it has not yet received of the total u, without crossing
    zero; q records what it received. With cb != 0 (averaging) each change of W also
    goes into A, times -cb (see average_table)."""
    for c in range(W.shape[0]):
        for m in range(nnz):
            j = _feat(idx, r0, m, nh, hot_feat)
            z = W[c, j] * s_after
            if z > 0.0:
                w_new = max(0.0, z - (u + q[c, j]))
            elif z < 0.0:
                w_new = min(0.0, z + (u - q[c, j]))
            else:
                continue
            W[c, j] = w_new / s_after
            q[c, j] += w_new - z
            if cb != 0.0:
                A[c, j] -= cb * (w_new - z) / s_after


@nb.njit(cache=True, nogil=True, inline="always")
def _flush_intercept(b, db):
    """Publish the worker's intercept delta: b += db, db = 0."""
    for c in range(b.shape[0]):
        b[c] += db[c]
        db[c] = 0.0


@nb.njit(cache=True)
def epoch_etas(fp, ip, eta):
    """Fill eta with the step sizes of the epoch's global steps 1..n (from fp's
    t_start), n = len(eta); returns eta."""
    lr = ip[I_LR]
    t_start = fp[F_T_START]
    for k in range(eta.shape[0]):
        t = t_start + k + 1.0
        if lr == CONSTANT:
            eta[k] = fp[F_ETA0]
        elif lr == OPTIMAL:
            eta[k] = 1.0 / (fp[F_ALPHA_LR] * (fp[F_T0] + t - 1.0))
        else:
            eta[k] = fp[F_ETA0] / t ** fp[F_POWER_T]
    return eta


#: the driver folds the weight scale into the weights before it falls below this
MIN_SCALE = 1e-9


@nb.njit(cache=True)
def segment(fp, eta, g0, scale, cum):
    """The segment of global steps [g0, g1) that starts at g0: it ends before the
    step whose L2 factor 1 − η·α₂ would take the weight scale (relative to the
    segment's start) below MIN_SCALE, or is <= 0; it holds at least one step.
    Fills scale[0..L] (the scale after 0..L of its steps, a running product as
    scikit-learn keeps it) and cum[0..L] (the cumulative step sizes: the L1 total)
    and returns (g1, zero_first): zero_first when step g0's own factor is <= 0
    (the driver then zeroes the weights and the step counts with factor 1)."""
    n = eta.shape[0]
    a2 = fp[F_ALPHA2]
    zero_first = a2 > 0.0 and 1.0 - eta[g0] * a2 <= 0.0
    scale[0] = 1.0
    cum[0] = 0.0
    s = 1.0
    k = g0
    while k < n:
        f = 1.0 - eta[k] * a2 if a2 > 0.0 else 1.0
        if k == g0 and zero_first:
            f = 1.0
        if k > g0 and (f <= 0.0 or s * f < MIN_SCALE):
            break
        s *= f
        scale[k - g0 + 1] = s
        cum[k - g0 + 1] = cum[k - g0] + eta[k]
        k += 1
    return k, zero_first


def average_table(scale, L, a0, out):
    """Averaging (ASGD) in a segment of L steps whose steps a0, a0 + 1, ... count in
    the average: fills out[k] (k = 0..L) with C(k), the sum of the weight scales
    ``scale[j + 1]`` after the averaged steps j < k, and returns out[:L + 1].

    The average of the weights over the averaged steps is kept lazily, without a
    pass over all the weights per step (the trick of Xu, "Towards optimal one pass
    large scale learning with averaged stochastic gradient descent", 2011, as in
    scikit-learn's ``WeightVector.add_average``). With raw weights W (the true
    weights are s_k·W after step k), the sum of the true weights over the averaged
    steps of the segment is C(L)·W_end + A, where every change ΔW that step k makes
    to a weight adds −C(k)·ΔW to its entry of A (the earlier steps saw the old
    value); the intercepts likewise, with C counting the averaged steps. The kernel
    does those additions for the coordinates a step touches (its gradient step,
    momentum, L1 clip); the driver folds A into the running average at the end of
    the segment."""
    out[:a0 + 1] = 0.0
    if a0 < L:
        np.cumsum(scale[a0 + 1:L + 1], out=out[a0 + 1:L + 1])
    return out[:L + 1]


def optimal_t0(alpha: float, loss: int) -> float:
    """Bottou's heuristic for the 'optimal' schedule: pick t0 so that the first
    step size is about the one that suits a weight of typical size 1/sqrt(alpha)."""
    typw = math.sqrt(1.0 / math.sqrt(alpha))
    # as scikit-learn: the derivative at (prediction -typw, label 1) is negative for
    # every loss of this module, so the divisor is 1 and the first step is typw
    d = float(_dloss(loss, -typw, 1.0))
    eta_init = typw / max(1.0, d)
    return 1.0 / (eta_init * alpha)
