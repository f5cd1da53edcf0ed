"""Numba kernels of the compressors: exact top-k by magnitude through a sampled
threshold, the sampled (DGC-style) threshold itself, and QSGD's stochastic levels.

Exact top-k (:func:`topk_indices`). ``np.argpartition`` moves every one of the n
entries around; for k << n almost all of them are far below the answer. The kernel
instead

1. reads a fixed pseudo-random sample of m positions and takes, as a threshold t,
   a magnitude that ranks a little *below* k/n of the sample (a margin of a few binomial
   standard deviations), so that about 2-4 k entries lie at or above t;
2. makes one streaming pass collecting, in index order, every entry with |g| >= t
   (the candidates);
3. finds the exact k-th largest magnitude v among the candidates (a partition of
   the small candidate array) and keeps those > v and the lowest-indexed == v.

If fewer than k entries reach t (an unlucky sample), the pass is redone with t = 0
over the nonzeros, and if the nonzeros are fewer than k the lowest-indexed zeros fill
the message. The answer is the same as a stable sort on (-|g|, index) in every case;
only the time depends on the sample. The idea is the sampling step of Deep Gradient
Compression (Lin, Han, Mao, Wang, Dally, ICLR 2018), made exact by the partition of
step 3 (as in hierarchical top-k selection).
"""
from __future__ import annotations

import math

import numba as nb
import numpy as np

_SALT_MASK = (1 << 63) - 1


@nb.njit(nogil=True, cache=True)
def _sample_positions(n, m, salt):
    """m positions in [0, n), spread by a Weyl sequence (deterministic for a salt)."""
    pos = np.empty(m, np.int64)
    x = np.uint64(salt)
    step = np.uint64(0x9E3779B97F4A7C15)
    nn = np.uint64(n)
    for i in range(m):
        x = x + step
        pos[i] = np.int64((x >> np.uint64(11)) % nn)
    return pos


@nb.njit(nogil=True, cache=True)
def _sample_threshold(g, rank, m, salt):
    """The magnitude of rank ``rank`` (0 = largest) among m sampled |g|."""
    pos = _sample_positions(g.size, m, salt)
    mags = np.empty(m, np.float64)
    for i in range(m):
        mags[i] = abs(g[pos[i]])
    r = m - 1 - min(rank, m - 1)                       # ascending index of that rank
    return np.partition(mags, r)[r]


@nb.njit(nogil=True, cache=True)
def _collect(g, t, strict, out):
    """Indices with |g| >= t (|g| > t when ``strict``) into out, in index order;
    returns how many (it stops counting at out.size + 1 so a caller sees overflow)."""
    c = 0
    cap = out.size
    for i in range(g.size):
        a = abs(g[i])
        if a > t or (a == t and not strict):
            if c < cap:
                out[c] = i
            c += 1
            if c > cap:
                return c
    return c


@nb.njit(nogil=True, cache=True)
def _finish(g, cand, c, k, out):
    """From c candidates (index order) the k of largest |g|, ties to lower indices,
    written to out in ascending order."""
    mags = np.empty(c, np.float64)
    for i in range(c):
        mags[i] = abs(g[cand[i]])
    v = np.partition(mags, c - k)[c - k]               # the k-th largest magnitude
    above = 0
    for i in range(c):
        if mags[i] > v:
            above += 1
    ties = k - above
    j = 0
    for i in range(c):
        a = mags[i]
        if a > v or (a == v and ties > 0):
            if a == v:
                ties -= 1
            out[j] = cand[i]
            j += 1
    return j


@nb.njit(nogil=True, cache=True)
def _fill_zeros(g, cand, c, k, out):
    """Fewer than k nonzeros (the c candidates): all of them plus the lowest-indexed
    zeros, merged in ascending order."""
    need = k - c
    j = 0
    ci = 0
    for i in range(g.size):
        if ci < c and cand[ci] == i:
            out[j] = i
            j += 1
            ci += 1
        elif need > 0 and g[i] == 0.0:
            out[j] = i
            j += 1
            need -= 1
        if ci == c and need == 0:
            break
    return j


@nb.njit(nogil=True, cache=True)
def _topk_kernel(g, k, m, margin, out):
    """See the module docstring; returns k (the entries written to out)."""
    n = g.size
    expect = m * k / n
    rank = int(expect + margin * math.sqrt(expect) + margin)
    t = _sample_threshold(g, rank, m, n)
    cap = min(n, max(8 * k, 4 * (rank + 1) * (n // m + 1)))
    cand = np.empty(cap, np.int64)
    c = -1
    if t > 0.0:
        c = _collect(g, t, False, cand)
        if c > cap:                                    # sample far off: take them all
            cand = np.empty(n, np.int64)
            c = _collect(g, t, False, cand)
    if c < k:                                          # too few reach t: every nonzero
        cand = np.empty(n, np.int64)
        c = _collect(g, 0.0, True, cand)
        if c < k:
            return _fill_zeros(g, cand, c, k, out)
    return _finish(g, cand, c, k, out)


def topk_indices(g, k, sample=4096, margin=3.0):
    """Ascending indices of the k entries of largest |g| (ties: lower index first).
    ``sample`` positions estimate the threshold; ``margin`` standard deviations of
    slack make a second pass rare. Exact for every input; see the module docstring."""
    n = g.size
    out = np.empty(k, np.int64)
    if k >= n:
        return np.arange(n, dtype=np.int64)
    got = _topk_kernel(g, k, min(n, int(sample)), float(margin), out)
    assert got == k
    return out


@nb.njit(nogil=True, cache=True)
def _threshold_kernel(g, t, out):
    return _collect(g, t, False, out)


def threshold_indices(g, k, sample_ratio, salt):
    """DGC's selection: the threshold is the magnitude ranked k/n into a random
    sample of ``sample_ratio * n`` entries; every entry at or above it is sent (about
    k of them, more or fewer as the sample falls). Ascending indices."""
    n = g.size
    m = min(n, max(64, int(math.ceil(sample_ratio * n))))
    rank = max(0, int(math.ceil(m * k / n)) - 1)
    t = _sample_threshold(g, rank, m, salt & _SALT_MASK)
    if t == 0.0:                                       # the sample saw only zeros
        out = np.empty(n, np.int64)
        c = _collect(g, 0.0, True, out)
        return out[:c] if c else np.array([int(np.argmax(np.abs(g)))], np.int64)
    out = np.empty(n, np.int64)
    c = _threshold_kernel(g, t, out)
    return out[:c].copy()


@nb.njit(nogil=True, cache=True, inline="always")
def _bucket_norm(g, lo, hi):
    """||g[lo:hi]|| in float64 (a float32 g's squares too); where the plain sum of
    squares overflows or underflows to 0, again scaled by the largest magnitude (as
    LAPACK's nrm2), so that the norm is right wherever it is a float64 at all."""
    acc = 0.0
    for i in range(lo, hi):
        x = np.float64(g[i])
        acc += x * x
    if acc > 0.0 and acc < math.inf and acc > 1e-290:
        return math.sqrt(acc)
    big = 0.0
    for i in range(lo, hi):
        big = max(big, abs(np.float64(g[i])))
    if big == 0.0:
        return 0.0
    acc = 0.0
    for i in range(lo, hi):
        x = np.float64(g[i]) / big
        acc += x * x
    return big * math.sqrt(acc)


@nb.njit(nogil=True, cache=True)
def _qsgd_kernel(g, s, d, state, idx, lvl, norms):
    """QSGD's stochastic rounding of s |g_i| / ||bucket|| to the integers around it (up
    with the fractional part as probability), in buckets of d consecutive entries (d >=
    g.size: one bucket, the whole gradient). Writes each bucket's norm (a loop: no BLAS
    call, whose pool inherited across fork can make a small dot product cost
    milliseconds in a worker process) and the nonzero levels (signed) with their
    indices; returns how many. The uniforms come from splitmix64 started at ``state``
    (one draw of the compressor's generator per call), one per entry whatever the
    buckets, so a call is reproducible from its seed."""
    c = 0
    x = np.uint64(state)
    golden = np.uint64(0x9E3779B97F4A7C15)
    m1 = np.uint64(0xBF58476D1CE4E5B9)
    m2 = np.uint64(0x94D049BB133111EB)
    for b in range(norms.size):
        lo, hi = b * d, min((b + 1) * d, g.size)
        norm = norms[b] = _bucket_norm(g, lo, hi)
        for i in range(lo, hi):
            x = x + golden
            if norm == 0.0:
                continue
            z = x
            z = (z ^ (z >> np.uint64(30))) * m1
            z = (z ^ (z >> np.uint64(27))) * m2
            z = z ^ (z >> np.uint64(31))
            u = float(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)
            a = s * (abs(g[i]) / norm)        # (|g_i| / norm <= 1: no overflow)
            fl = math.floor(a)
            q = fl + 1.0 if u < a - fl else fl
            if q != 0.0:
                idx[c] = i
                lvl[c] = q if g[i] > 0 else -q
                c += 1
    return c


def _qsgd(g, s, d, rng):
    """(indices, signed levels, bucket norms) of QSGD on g, buckets of d entries; a
    zero g sends nothing and draws nothing."""
    if not g.any():
        return np.empty(0, np.int64), np.empty(0, np.float64), np.zeros(max(1, -(-g.size // d)))
    idx = np.empty(g.size, np.int64)
    lvl = np.empty(g.size, np.float64)
    norms = np.empty(max(1, -(-g.size // d)), np.float64)
    c = _qsgd_kernel(g, float(s), int(d), int(rng.integers(0, 2**63)), idx, lvl, norms)
    if not np.isfinite(norms).all():
        raise ValueError("g: its norm overflows float64 (entries near 1e308), so no level "
                         "can be drawn; lower the step or clip the gradient")
    return idx[:c].copy(), lvl[:c].copy(), norms


def qsgd_levels(g, s, rng):
    """(indices, signed levels, norm) of QSGD's quantization of g with s levels."""
    idx, lvl, norms = _qsgd(g, s, max(1, g.size), rng)
    return idx, lvl, float(norms[0])


def qsgd_bucket_values(g, s, d, rng):
    """(indices, decoded values: signed level times the bucket's norm / s) of QSGD's
    quantization of g with s levels in buckets of d entries."""
    idx, lvl, norms = _qsgd(g, s, d, rng)
    return idx, lvl * (norms / s)[idx // d]
