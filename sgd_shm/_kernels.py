"""Numba kernels for Hogwild SGD on linear models (private; see sgd_shm.hogwild).

One worker's share of one epoch: it walks its slice of a shuffled index array
and, for every sample, updates all K linear outputs (K = 1 for binary or
regression, K = n_classes for one-vs-rest) of a weight matrix it shares with
the other workers, without locks (Hogwild!, Niu, Recht, Ré, Wright 2011).

Regularisation without per-feature timestamps (which race under Hogwild and
decay popular features twice, see shared/FACTS.md):

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
instead of feature ids, ``hot_end[i]`` ends row i's hot part). With
``ip[I_HOT]`` set, each worker keeps a private copy of the hot block, applies its
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
of lock-free writes: tests/test_hogwild.py measures it). Without ``ip[I_HOT]``
(locked baseline, L1, momentum) the hot slots are mapped back to feature ids and
updated in W directly, as plain Hogwild does.

Learning rates: constant η₀; inverse scaling η₀ / t^power_t; "optimal"
1 / (α·(t₀ + t)) with Bottou's t₀ heuristic (see ``optimal_t0``). t is the
global sample count (estimated as above).

Kernels raise nothing: a non-finite prediction sets ``out[2] = 1`` and returns;
the Python driver raises.
"""
from __future__ import annotations

import math

import numba as nb
import numpy as np

from sgd_shm._intrinsics import (DISTANCE, cas_acquire, claim_add, fetch_add, load_relaxed,
                                 prefetch, prefetch_once, store_release)
from sgd_shm._mf import shuffle_part

# loss codes
LOG, HINGE, SQUARED, MODIFIED_HUBER = 0, 1, 2, 3
LOSSES = {"log_loss": LOG, "hinge": HINGE, "squared_error": SQUARED,
          "modified_huber": MODIFIED_HUBER}
# learning-rate codes
CONSTANT, OPTIMAL, INVSCALING = 0, 1, 2
LEARNING_RATES = {"constant": CONSTANT, "optimal": OPTIMAL, "invscaling": INVSCALING}

# float parameter slots
(F_ETA0, F_ALPHA2, F_ALPHA1, F_POWER_T, F_T0, F_T_START, F_NW, F_ICPT_DECAY, F_U0, F_ALPHA_LR,
 F_MOMENTUM) = range(11)
# (F_U0: the L1 total u at the start of the segment; F_ALPHA_LR: alpha of the 'optimal'
#  schedule, which also holds with penalty=None)
N_FPARAMS = 11
# int parameter slots
I_LOSS, I_LR, I_FIT_ICPT, I_LOCKED, I_INSTRUMENT, I_HOT = range(6)
N_IPARAMS = 6
# out slots
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
#: the loss derivative is clipped to +-MAX_DLOSS (as scikit-learn does); clips are counted
MAX_DLOSS = 1e12


@nb.njit(cache=True, nogil=True, inline="always")
def _dloss(loss, p, y):
    """Derivative of the loss with respect to the prediction p."""
    if loss == LOG:
        z = p * y
        if z > 18.0:
            return -y * math.exp(-z)
        if z < -18.0:
            return -y
        return -y / (math.exp(z) + 1.0)
    if loss == HINGE:
        return -y if p * y < 1.0 else 0.0
    if loss == MODIFIED_HUBER:
        z = p * y
        if z >= 1.0:
            return 0.0
        if z >= -1.0:
            return -2.0 * (1.0 - z) * y
        return -4.0 * y
    return p - y          # squared


@nb.njit(cache=True, nogil=True, inline="always")
def _loss(loss, p, y):
    if loss == LOG:
        z = p * y
        if z > 18.0:
            return math.exp(-z)
        if z < -18.0:
            return -z
        return math.log1p(math.exp(-z))
    if loss == HINGE:
        return max(0.0, 1.0 - p * y)
    if loss == MODIFIED_HUBER:
        z = p * y
        if z >= 1.0:
            return 0.0
        if z >= -1.0:
            return (1.0 - z) * (1.0 - z)
        return -4.0 * z
    return 0.5 * (p - y) * (p - y)


@nb.njit(cache=True, nogil=True, inline="always")
def _u(x):
    """x (>= 0) as an unsigned index: numba then leaves out the negative-index
    wrap-around, which it cannot rule out for an offset plus a loop counter (with it,
    an epoch measured 30% slower)."""
    return nb.uint64(x)


@nb.njit(cache=True, nogil=True, inline="always")
def _feat(idx, r0, m, nh, hot_feat):
    """Feature id of entry m of the row whose ids start at idx[r0] (its first nh
    entries are hot slots)."""
    return hot_feat[idx[_u(r0 + m)]] if m < nh else idx[_u(r0 + m)]


def fresh_progress(nw, out=None):
    """The workers' progress slots for a segment (``out``, or a new array of 16·nw):
    published counts 0, claim cursors NOT_READY (see _run)."""
    progress = np.empty(16 * nw, dtype=np.int64) if out is None else out
    progress[...] = 0
    progress[8::16] = NOT_READY
    return progress


@nb.njit(cache=True, nogil=True, inline="always")
def _claim(progress, los, his, v, left):
    """The next CHUNK of positions a worker takes: from part v (its own first),
    moving on to the next part when v has no more, ``left`` parts still to try.
    Returns (start, end, v, left); start == end when every part is taken."""
    nw = los.shape[0]
    while left > 0:
        n_v = his[v] - los[v]
        c = claim_add(progress, 16 * v + 8, CHUNK)
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
def feature_counts(indices, d):
    """Nonzeros per feature (np.bincount without its int64 copy of the indices)."""
    counts = np.zeros(d, dtype=np.int64)
    for m in range(indices.shape[0]):
        counts[indices[m]] += 1
    return counts


@nb.njit(cache=True, nogil=True)
def hot_layout(indptr, indices, data, slot, ind_out, dat_out, hot_end, r0, r1):
    """Rewrite CSR rows r0..r1-1 hot-first: entries whose feature has slot[j] >= 0
    come first, carrying the slot instead of the feature id; hot_end[i] ends row
    i's hot part. Each part keeps the row's order. One slot lookup per entry and
    no branch on it: every entry is written to both the hot front and a cold row
    buffer, and only the matching cursor moves."""
    longest = 0
    for i in range(r0, r1):
        longest = max(longest, indptr[i + 1] - indptr[i])
    cold_i = np.empty(longest + 1, dtype=ind_out.dtype)
    cold_v = np.empty(longest + 1, dtype=dat_out.dtype)
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


@nb.njit(cache=True, nogil=True)
def _run(W, b, q, V, cols_all, indptr, indices, data, X, Y, sw, order, los, his, fp, ip, out,
         lock, progress, wid, scale_tab, eta_tab, cum_eta, clock, stale_hist, hot_end, hot_feat,
         Wh, parts, seeds):
    """Worker wid's share of an epoch (segment): its own part, positions
    [los[wid], his[wid]) of ``order``, and whatever it takes over of the other
    parts. Shared body of the sparse (X has 0 rows) and dense (indptr is empty) cases.
    With seeds[wid] >= 0 (the first segment of a shuffled epoch) the worker first
    reshuffles its part of the epoch, order[parts[wid]:parts[wid + 1]], in place.

    Work stealing: the workers claim their positions CHUNK at a time from per-part
    cursors (``progress[16 * w + 8]``, atomic adds), the owner of a part first, and a
    worker that has finished its own part goes on claiming chunks of the others'
    (as OpenMP's dynamic schedule). The workers thus finish together although one
    may start late, run slower or be paused (measured on 2 workers before: the
    epoch waited 1-8 ms on the slower one in half of the epochs). Every position is
    still visited exactly once. A part is claimable only once its owner has
    started (the driver sets the cursor to NOT_READY; the owner resets it to 0 with
    a release store, after reshuffling its part), so that nobody reads a part
    while its owner shuffles it. With one worker the positions come in order, as
    without stealing. The next chunk is claimed while the current one runs, so the
    row prefetches below run on across chunks.

    Global time: the worker publishes how many samples it has done in its own slot
    ``progress[16 * wid]`` every INTERCEPT_FLUSH samples, and for every sample, once
    it has read the sample's weights, takes the global step count tg as its own count
    plus the counts the others have published (and from tg the step size eta_tab[tg],
    the L2 scale s = scale_tab[tg] and the L1 total). tg thus lags the true count by
    less than INTERCEPT_FLUSH · (n_workers − 1) steps whatever the workers' start
    times, speeds or pauses. (Reading the slots only every INTERCEPT_FLUSH samples and extrapolating
    in between went wrong for a worker that started late or was paused by the OS:
    it used a scale up to 1e9 times off under strong L2 until its next read.) The
    slots are read with relaxed atomic loads, so every read is fresh; a slot's line
    changes only every INTERCEPT_FLUSH samples, so the reads mostly hit the cache.
    The tables are the driver's, for this epoch.

    With ip[I_LOCKED] set, every sample's read-modify-write runs under a spinlock in
    lock[0] (the "locked SGD" baseline of the benchmarks); otherwise no lock is taken.

    With ip[I_INSTRUMENT] set, staleness is measured: clock[0] is a shared update
    counter, read before a sample's prediction and fetch-and-incremented at its write;
    the difference minus one is how many updates other workers applied in between
    (the delay tau of the asynchronous SGD analyses), counted in stale_hist (last
    bin: that many or more). It costs one contended atomic per update.

    With fp[F_MOMENTUM] = mu > 0, heavy-ball momentum on the coordinates a sample
    touches: V ← mu·V + g·x and w ← (1 − η·α₂)·w + V (V in weight units, shared by the
    workers without locks: asynchronous momentum). Dense rows touch every coordinate,
    so there it is the exact heavy-ball method; on sparse rows a coordinate's velocity
    waits, undecayed, until a sample touches it again.

    Sparse rows may be hot-first: entries [indptr[i], hot_end[i]) name slots of
    ``hot_feat`` (feature hot_feat[slot]), the rest feature ids (hot_end empty: none). With ip[I_HOT]
    set, the worker steps the hot slots in a private copy of the block ``Wh[0]`` and
    publishes them in ``Wh[1 + wid]`` every ``hot_flush`` samples and at the
    end (see the module docstring); otherwise it maps the slots to features and
    works on W."""
    K = W.shape[0]
    loss = ip[I_LOSS]
    fit_icpt = ip[I_FIT_ICPT]
    locked = ip[I_LOCKED] != 0
    instrument = ip[I_INSTRUMENT] != 0
    n_bins = stale_hist.shape[0]
    a1 = fp[F_ALPHA1]          # (L2 is all in the scale table)
    mom = fp[F_MOMENTUM]
    nw = int(fp[F_NW])
    icpt_decay = fp[F_ICPT_DECAY]
    u0 = fp[F_U0]
    n_tab = scale_tab.shape[0] - 1          # global steps in this epoch
    dense = indptr.shape[0] == 0
    loss_sum = 0.0
    g = np.empty(K)
    dots = np.empty(K)
    # the intercept is one word every sample writes: each worker adds its steps to a
    # private delta (used in its own predictions) and publishes it every FLUSH
    # samples, so the line is not bounced between cores on every step
    db = np.zeros(K)
    since = 0                                # own samples since the last publication
    done_own = 0
    d_feat = W.shape[1]
    s = 1.0
    hot = ip[I_HOT] != 0 and not dense
    if hot:                                  # private copy of the hot block, and its base
        hw = Wh[0].copy()                    # (the published rows are zero at the start)
        snap = hw.copy()
    else:
        hw = np.empty((0, 0))
        snap = hw
    part = his[wid] - los[wid]
    # a lone worker has nobody to show its hot steps to: it folds once, at the end
    hot_every = hot_flush(K, hw.shape[1], part) if nw > 1 else part + 1
    hot_since = 0
    nh = 0                                   # hot entries of the current row
    has_hot = hot_end.shape[0] > 0           # (plain rows: no hot part, nothing to read)
    # a row's entries are idx[r0 + m] (feature ids, or hot slots first) and val[v0 + m],
    # m < nnz: offsets into the CSR arrays, or into cols_all and the flat X for a dense
    # row. Not slices: in this kernel numba kept the reference counting of the row
    # slices, calls to NRT_incref/NRT_decref with a locked (so fencing, on x86) atomic
    # add each, four of each per sample; without them 2 workers measured 2-5 ms per
    # epoch faster in 3 of 3 interleaved pairs (README problem), 1 worker about the same
    if dense:
        idx = cols_all
        val = X.reshape(X.shape[0] * X.shape[1])
    else:
        idx = indices
        val = data
    r0 = 0
    v0 = 0
    nnz = 0
    if seeds[wid] >= 0:
        shuffle_part(order, parts[wid], parts[wid + 1], seeds[wid])
    store_release(progress[16 * wid + 8:], 0)      # this part is open for claims
    vic, left = wid, nw                      # the part claimed from, parts left to try
    k, ce, vic, left = _claim(progress, los, his, vic, left)       # current chunk
    ns, ne, vic, left = _claim(progress, los, his, vic, left)      # and the next
    while True:
        if k >= ce:
            if ns >= ne:
                break
            k, ce = ns, ne
            ns, ne, vic, left = _claim(progress, los, his, vic, left)
        k2 = _ahead(k + 2 * DISTANCE, ce, ns, ne)
        if k2 >= 0:                            # the row's bookkeeping (its bounds, hot
            j2 = order[k2]                     # part, target and weight) further ahead,
            prefetch(Y, j2 * K)                # so that the row prefetch below finds its
            prefetch(sw, j2)                   # bounds in cache
            if not dense:
                prefetch(indptr, j2)
                if has_hot:
                    prefetch(hot_end, j2)
        k1 = _ahead(k + DISTANCE, ce, ns, ne)
        if k1 >= 0:                            # ask for a row ahead: reads are shuffled
            j = order[k1]
            if dense:
                p0 = j * d_feat
                p1 = p0 + d_feat
            else:
                p0 = indptr[j]
                p1 = indptr[j + 1]
            while p0 < p1:
                if dense:
                    prefetch_once(X, p0)
                else:
                    prefetch_once(data, p0)
                    prefetch_once(indices, p0)
                p0 += 8
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
        for c in range(K):                     # the raw dot products (unscaled) ...
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
        # ... then the global time, so that the scale is no older than the weights
        # read: a worker paused between the two would otherwise scale fresh weights
        # by an old, larger scale (under strong L2, predictions 1000x too large:
        # one sample's loss outweighed the epoch's); this way a pause makes the
        # prediction smaller instead, a bounded error (a stale gradient)
        tg = done_own                          # global samples before this one
        for w in range(nw):
            if w != wid:
                tg += load_relaxed(progress, 16 * w)
        if tg > n_tab - 1:
            tg = n_tab - 1
        eta = eta_tab[tg]
        s = scale_tab[tg]                      # scale before this step ...
        s_after = scale_tab[tg + 1]            # ... and after its L2 decay
        if not (s_after >= 1e-200):
            if locked:
                store_release(lock, 0)
            out[O_DIVERGED] = 2.0
            break
        any_step = False
        bad = False
        for c in range(K):
            p = dots[c] * s + b[c] + db[c]
            if not math.isfinite(p):
                bad = True
                break
            yc = Y[i, c]
            loss_sum += wi * _loss(loss, p, yc)
            d = _dloss(loss, p, yc)
            if d > MAX_DLOSS or d < -MAX_DLOSS:
                d = MAX_DLOSS if d > 0.0 else -MAX_DLOSS
                out[O_CLIPS] += 1.0
            g[c] = -eta * d * wi
            if g[c] != 0.0:
                any_step = True
        if bad:
            if locked:
                store_release(lock, 0)
            out[O_DIVERGED] = 1.0
            break
        if instrument:
            tau = fetch_add(clock, 1) - c_read
            stale_hist[tau if tau < n_bins else n_bins - 1] += 1
        if mom > 0.0:                          # heavy ball: the velocity moves w even
            inv_s = 1.0 / s_after              # when this sample's gradient is zero
            for c in range(K):
                gc = g[c]
                for m in range(nnz):
                    j = _feat(idx, r0, m, nh, hot_feat)
                    vel = mom * V[c, j] + gc * val[_u(v0 + m)]
                    V[c, j] = vel
                    W[c, j] += vel * inv_s
                if fit_icpt and gc != 0.0:
                    db[c] += gc * icpt_decay
        elif any_step:
            inv_s = 1.0 / s_after
            for c in range(K):
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
        if a1 > 0.0:
            u = u0 + a1 * cum_eta[tg + 1]
            for c in range(K):
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
        if locked:
            for c in range(K):                # serialised: publish the intercept too
                b[c] += db[c]
                db[c] = 0.0
            store_release(lock, 0)
        done_own += 1
        if hot:
            hot_since += 1
            if hot_since >= hot_every:
                _fold(Wh, hw, snap, wid)
                hot_since = 0
        since += 1
        if since >= INTERCEPT_FLUSH:
            for c in range(K):
                b[c] += db[c]
                db[c] = 0.0
            progress[16 * wid] = done_own          # only this worker writes its slot
            since = 0
    for c in range(K):
        b[c] += db[c]
    if hot and hot_since > 0:
        _fold(Wh, hw, snap, wid)
    progress[16 * wid] = done_own
    out[O_LOSS] = loss_sum
    out[O_STEPS] = done_own
    out[O_SCALE] = s


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


def optimal_t0(alpha: float, loss: int) -> float:
    """Bottou's heuristic for the 'optimal' schedule: pick t0 so that the first
    step size is about the one that suits a weight of typical size 1/sqrt(alpha)."""
    typw = math.sqrt(1.0 / math.sqrt(alpha))
    # as scikit-learn: the derivative at (prediction -typw, label 1) is negative for
    # every loss here, so the divisor is 1 and the first step is typw
    d = float(_dloss(loss, -typw, 1.0))
    eta_init = typw / max(1.0, d)
    return 1.0 / (eta_init * alpha)
