"""Simple undirected graphs for greedy maximal independent set and matching.

A :class:`Graph` is a symmetric CSR adjacency structure (``indptr`` int64,
``indices`` int32, each row sorted ascending, no self loops, no duplicates)
plus an edge index: ``edges`` lists every undirected edge once as ``(u, v)``
with ``u < v`` in lexicographic order, and ``edge_ids`` gives, for every
adjacency entry, the row of ``edges`` it belongs to, so an engine can keep one
state per vertex (MIS) or per edge (matching) and walk the CSR for both.

The generators mirror the inputs of the Problem Based Benchmark Suite (PBBS;
Shun, Blelloch, Fineman, Gibbons, Kyrola, Simhadri, Tangwongsan, "Brief
announcement: the Problem Based Benchmark Suite", SPAA 2012), whose maximal
independent set and matching benchmarks run on random local graphs, R-MAT
graphs and grids (the greedy algorithms are analysed in Blelloch, Fineman,
Shun, "Greedy sequential maximal independent set and matching are parallel on
average", SPAA 2012):

    erdos_renyi(n, m)        G(n, m): exactly m distinct uniform edges
    random_local(n, degree)  PBBS randLocalGraph: edges between nearby ids
    rmat(n, m)               R-MAT power-law graph (Chakrabarti, Zhan,
                             Faloutsos, "R-MAT: a recursive model for graph
                             mining", SIAM SDM 2004)
    grid2d(rows, cols)       4-neighbour grid (optionally a torus)
    grid3d(x, y, z)          6-neighbour grid (optionally a torus)

and :func:`as_graph` turns other inputs into a Graph: a scipy.sparse matrix
(its symmetric nonzero pattern), a ``(k, 2)`` integer edge array, a networkx
graph, a Matrix Market file (``.mtx``, ``.mtx.gz``) or an edge-list text file
(:func:`read_edgelist`).

Construction is O(n + m) in Numba kernels: edges are bucketed by their smaller
endpoint (a counting sort), each bucket is sorted (insertion sort, or a
quicksort for long rows) and deduplicated; the lower half of every row (the
transpose) takes one more counting-sort scatter, and a sequential pass writes
the CSR and edge index. There is no ``np.unique`` and no global sort of the
m edges (O(m log m) over one large array): only single rows are sorted,
and rows are short on the inputs above. The first call in a fresh checkout
compiles the kernels; they are cached on disk after that.

Random generators take ``seed=None | int | np.random.Generator`` (anything
``np.random.default_rng`` accepts); the same seed gives the same graph.

Example::

    import numpy as np
    from relaxed.graphs import Graph, as_graph, erdos_renyi

    G = Graph.from_edges(np.array([[0, 1], [1, 2], [2, 0], [1, 0]]))
    G                       # Graph(n=3, m=3)  (the duplicate (1, 0) is dropped)
    G.indptr, G.indices     # [0 2 4 6], [1 2 0 2 0 1]
    G.edges                 # [[0 1] [0 2] [1 2]]
    G.edge_ids              # [0 1 0 2 1 2]
    H = erdos_renyi(1_000_000, 10_000_000, seed=1)
    A = H.to_scipy()        # scipy.sparse.csr_array of ones
    K = as_graph(A)         # back again

Graphs are treated as immutable: the arrays are ordinary writeable numpy
arrays (Numba kernels take them as they are) but ``edges`` and ``edge_ids``
are computed once and cached, so do not modify ``indptr``/``indices`` in place.
"""
from __future__ import annotations

import functools
import gzip
import operator
import os
import sys

import numba as nb
import numpy as np

__all__ = [
    "Graph",
    "as_graph",
    "read_edgelist",
    "erdos_renyi",
    "random_local",
    "rmat",
    "grid2d",
    "grid3d",
]

#: vertex ids and edge ids are int32: n and 2m must stay below this
_ID_LIMIT = 2**31
#: rows up to this long are sorted by insertion sort in the bucket kernel
_INSERTION_SORT_MAX = 32

_SELF_LOOP_FIX = "greedy MIS/matching needs a simple graph; remove the diagonal"


# --------------------------------------------------------------------------
# random numbers inside kernels: SplitMix64 (Steele, Lea, Flood, OOPSLA 2014),
# state passed in as a uint64 array of length 1 and seeded from a numpy Generator
# --------------------------------------------------------------------------
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_MASK32 = np.uint64(0xFFFFFFFF)
_U30 = np.uint64(30)
_U27 = np.uint64(27)
_U31 = np.uint64(31)
_U32 = np.uint64(32)
_U63 = np.uint64(63)
_U0 = np.uint64(0)
_U11 = np.uint64(11)
_TWO_M53 = 1.0 / 9007199254740992.0


@nb.njit(cache=True, nogil=True)
def _next(state):
    """The next 64 random bits of a SplitMix64 stream (all arithmetic in uint64)."""
    z = state[0] + _GOLDEN
    state[0] = z
    z = (z ^ (z >> _U30)) * _MIX1
    z = (z ^ (z >> _U27)) * _MIX2
    return z ^ (z >> _U31)


def _kernel_state(rng):
    """A SplitMix64 state drawn from a numpy Generator."""
    return np.array([rng.integers(0, 2**63, dtype=np.int64)], dtype=np.int64).view(np.uint64)


def _index(x):
    """``x`` as a Python int (operator.index), bools refused: True was 1 vertex."""
    if isinstance(x, (bool, np.bool_)):
        raise TypeError("a bool is not a count")
    return operator.index(x)


def _flag(value, name, what):
    """A True/False option ("no" was true: a torus, one-based ids)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what}: {name}={value!r} must be True or False")
    return bool(value)


def _as_rng(seed, what):
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError(f"{what}: seed={seed!r} is not usable; pass None, a non-negative int "
                        "or a np.random.Generator")
    if isinstance(seed, (int, np.integer)) and seed < 0:
        raise ValueError(f"{what}: seed={seed} must be >= 0 (or None, or a "
                         "np.random.Generator)")
    try:
        return np.random.default_rng(seed)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{what}: seed={seed!r} is not usable; pass None, a non-negative int or a "
            f"np.random.Generator"
        ) from exc


# --------------------------------------------------------------------------
# kernels: building the CSR
# --------------------------------------------------------------------------
@nb.njit(cache=True, nogil=True)
def _unique_pairs(lo, hi, n):
    """Distinct pairs (lo[e], hi[e]) (each lo < hi < n) in lexicographic order.

    A counting sort on lo, then each bucket sorted and deduplicated: O(n + k)
    plus the bucket sorts.
    """
    k = lo.shape[0]
    start = np.zeros(n + 1, dtype=np.int64)
    for e in range(k):
        start[lo[e] + 1] += 1
    for r in range(n):
        start[r + 1] += start[r]
    pos = start[:-1].copy()
    buf = np.empty(k, dtype=np.int32)
    for e in range(k):
        r = lo[e]
        buf[pos[r]] = hi[e]
        pos[r] += 1
    out_lo = np.empty(k, dtype=np.int32)
    out = 0
    for r in range(n):
        s = start[r]
        t = start[r + 1]
        if t - s <= _INSERTION_SORT_MAX:
            for q in range(s + 1, t):
                x = buf[q]
                p = q - 1
                while p >= s and buf[p] > x:
                    buf[p + 1] = buf[p]
                    p -= 1
                buf[p + 1] = x
        else:
            buf[s:t].sort()
        prev = -1
        for q in range(s, t):
            x = buf[q]
            if x != prev:
                buf[out] = x          # out <= q: compacting in place is safe
                out_lo[out] = r
                out += 1
                prev = x
    return out_lo[:out], buf[:out]


@nb.njit(cache=True, nogil=True)
def _csr_from_pairs(lo, hi, n):
    """Symmetric CSR and edge index from distinct pairs lo < hi in lexicographic order.

    Row r is its smaller neighbours (the pairs (c, r), c < r) followed by its
    larger ones (the pairs (r, x), contiguous and increasing in x). The smaller
    ones are a transpose: one counting-sort scatter of packed (c << 32 | edge id)
    words bucketed by r (pairs arrive in increasing c, so every bucket comes out
    sorted), then one sequential pass writes indices and edge_ids row by row.
    """
    m = lo.shape[0]
    low_start = np.zeros(n + 1, dtype=np.int64)
    n_up = np.zeros(n, dtype=np.int64)
    for e in range(m):
        low_start[hi[e] + 1] += 1
        n_up[lo[e]] += 1
    indptr = np.empty(n + 1, dtype=np.int64)
    indptr[0] = 0
    for r in range(n):
        indptr[r + 1] = indptr[r] + low_start[r + 1] + n_up[r]
        low_start[r + 1] += low_start[r]
    pos = low_start[:-1].copy()
    packed = np.empty(m, dtype=np.int64)
    for e in range(m):
        b = hi[e]
        packed[pos[b]] = (np.int64(lo[e]) << 32) | e
        pos[b] += 1
    indices = np.empty(2 * m, dtype=np.int32)
    edge_ids = np.empty(2 * m, dtype=np.int32)
    edges = np.empty((m, 2), dtype=np.int32)
    p = 0
    e = 0
    for r in range(n):
        for q in range(low_start[r], low_start[r + 1]):
            x = packed[q]
            indices[p] = np.int32(x >> 32)
            edge_ids[p] = np.int32(x & 0xFFFFFFFF)
            p += 1
        while e < m and lo[e] == r:
            indices[p] = hi[e]
            edge_ids[p] = e
            edges[e, 0] = r
            edges[e, 1] = hi[e]
            p += 1
            e += 1
    return indptr, indices, edge_ids, edges


@nb.njit(cache=True, nogil=True)
def _check_rows(indptr, indices, n):
    """Row-wise CSR checks. Returns (code, row, position); code 0 = all good,
    1 = index out of range, 2 = row not strictly increasing, 3 = self loop."""
    for r in range(n):
        prev = -1
        for p in range(indptr[r], indptr[r + 1]):
            c = indices[p]
            if c < 0 or c >= n:
                return 1, r, p
            if c <= prev:
                return 2, r, p
            if c == r:
                return 3, r, p
            prev = c
    return 0, 0, 0


@nb.njit(cache=True, nogil=True)
def _index_csr(indptr, indices, n):
    """Edge index of a CSR with sorted, duplicate-free rows, checking symmetry.

    Edges are the upper-triangle entries (r, c > r) in CSR order. Their ids are
    scattered, packed with r, into the lower part of row c (bounds-checked, so
    a broken CSR cannot write out of place); the rows r < c that name c arrive
    in increasing r, so a symmetric matrix fills each lower part exactly with
    its own entries, which one sequential pass then compares. Returns (edges,
    edge_ids, ok); see _find_asymmetry for a witness when not ok.
    """
    nnz = indices.shape[0]
    split = np.empty(n, dtype=np.int64)   # first entry > r in row r
    low_start = np.empty(n + 1, dtype=np.int64)
    low_start[0] = 0
    m = 0
    for r in range(n):
        p = indptr[r]
        t = indptr[r + 1]
        while p < t and indices[p] < r:
            p += 1
        split[r] = p
        m += t - p
        low_start[r + 1] = low_start[r] + (p - indptr[r])
    edges = np.empty((m, 2), dtype=np.int32)
    edge_ids = np.empty(nnz, dtype=np.int32)
    if 2 * m != nnz:
        return edges, edge_ids, False
    pos = low_start[:-1].copy()
    packed = np.empty(m, dtype=np.int64)
    e = 0
    for r in range(n):
        for p in range(split[r], indptr[r + 1]):
            c = indices[p]
            if c <= r or c >= n:
                return edges, edge_ids, False
            q = pos[c]
            if q >= low_start[c + 1]:
                return edges, edge_ids, False
            packed[q] = (np.int64(r) << 32) | e
            pos[c] = q + 1
            edges[e, 0] = r
            edges[e, 1] = c
            edge_ids[p] = e
            e += 1
    for c in range(n):
        if pos[c] != low_start[c + 1]:
            return edges, edge_ids, False
        q = low_start[c]
        for p in range(indptr[c], split[c]):
            x = packed[q]
            if indices[p] != (x >> 32):
                return edges, edge_ids, False
            edge_ids[p] = np.int32(x & 0xFFFFFFFF)
            q += 1
    return edges, edge_ids, True


@nb.njit(cache=True, nogil=True)
def _find_asymmetry(indptr, indices, n):
    """The first entry (r, c) in CSR order whose mirror (c, r) is missing (binary
    search in row c; rows must be sorted); (-1, -1) if there is none."""
    for r in range(n):
        for p in range(indptr[r], indptr[r + 1]):
            c = indices[p]
            if c < 0 or c >= n:
                return r, c
            a = indptr[c]
            b = indptr[c + 1]
            while a < b:
                mid = (a + b) // 2
                if indices[mid] < r:
                    a = mid + 1
                else:
                    b = mid
            if a == indptr[c + 1] or indices[a] != r:
                return r, c
    return -1, -1


# --------------------------------------------------------------------------
# kernels: generators
# --------------------------------------------------------------------------
@nb.njit(cache=True, nogil=True)
def _below(state, n):
    """Uniform int in [0, n): 53 random bits as a fraction of n (bias < n / 2**53,
    and no 64-bit division)."""
    j = np.int64(np.float64(_next(state) >> _U11) * _TWO_M53 * n)
    return j if j < n else n - 1


@nb.njit(cache=True, nogil=True)
def _er_pairs(state, n, k):
    """k uniform unordered pairs {u, v}, u != v (self loops redrawn)."""
    lo = np.empty(k, dtype=np.int32)
    hi = np.empty(k, dtype=np.int32)
    for t in range(k):
        a = _below(state, n)
        b = _below(state, n)
        while a == b:
            a = _below(state, n)
            b = _below(state, n)
        lo[t] = min(a, b)
        hi[t] = max(a, b)
    return lo, hi


@nb.njit(cache=True, nogil=True)
def _local_pairs(state, n, degree, dim):
    """PBBS edgeRandomWithDimension: `degree` edges i -> (i + off) mod n per vertex,
    off uniform in [0, 2**p), p = dim + 2 + dim * G, G ~ Geometric(1/2) (failures)."""
    un = np.uint64(n)
    k = n * degree
    lo = np.empty(k, dtype=np.int32)
    hi = np.empty(k, dtype=np.int32)
    t = 0
    for i in range(n):
        ui = np.uint64(i)
        for _ in range(degree):
            pw = dim + 2
            while True:                      # as PBBS: pw is not reset on a retry
                while (_next(state) >> _U63) == _U0:
                    pw += dim
                if pw > 62:
                    pw = 62
                off = _next(state) >> np.uint64(64 - pw)
                j = np.int64((ui + off % un) % un)
                if j != i:
                    break
            lo[t] = min(i, j)
            hi[t] = max(i, j)
            t += 1
    return lo, hi


@nb.njit(cache=True, nogil=True)
def _rmat_pairs(state, n, scale, k, ta, tab, tabc):
    """k R-MAT pairs on 2**scale vertices, redrawn until u != v and both < n.

    Each level takes 32 random bits r and picks the quadrant a (r < ta),
    b (r < tab), c (r < tabc) or d; thresholds are probabilities times 2**32.
    Returns (lo, hi, drawn): drawn < k when the redraws ran past RMAT_TRIES per pair
    on average (quadrant probabilities that almost only give self loops or ids >= n;
    the caller refuses them), instead of drawing on forever.
    """
    lo = np.empty(k, dtype=np.int32)
    hi = np.empty(k, dtype=np.int32)
    budget = RMAT_TRIES * (k + 16)
    for t in range(k):
        while True:
            budget -= 1
            if budget < 0:
                return lo[:t], hi[:t], t
            u = 0
            v = 0
            x = _U0
            have = False
            for _ in range(scale):
                if have:
                    r = x >> _U32
                    have = False
                else:
                    x = _next(state)
                    r = x & _MASK32
                    have = True
                # branch-free quadrant: u bit set in c and d, v bit set in b and d
                ge_ab = np.int64(r >= tab)
                u = (u << 1) | ge_ab
                v = (v << 1) | (np.int64(r >= ta) - ge_ab + np.int64(r >= tabc))
            if u != v and u < n and v < n:
                break
        lo[t] = min(u, v)
        hi[t] = max(u, v)
    return lo, hi, k


#: redraws per R-MAT pair, on average, before rmat gives up on (a, b, c)
RMAT_TRIES = 10_000


def _rmat_draw(state, n, scale, k, ta, tab, tabc, params, what):
    """k R-MAT pairs (see _rmat_pairs), or a ValueError naming (a, b, c) where they
    give almost only self loops or ids >= n."""
    lo, hi, drawn = _rmat_pairs(state, n, scale, k, ta, tab, tabc)
    if drawn < k:
        raise ValueError(
            f"{what}: (a, b, c) = {params} give almost only self loops or ids >= n={n} "
            f"(fewer than 1 in {RMAT_TRIES:,} draws is an edge of the graph); raise b + c "
            f"and a, e.g. the defaults 0.57, 0.19, 0.19")
    return lo, hi


# --------------------------------------------------------------------------
# kernel: edge-list text parser
# --------------------------------------------------------------------------
@nb.njit(cache=True, nogil=True)
def _parse_edgelist(buf, cap):
    """Two integers per line; '#'/'%' lines and blank lines skipped; further
    columns ignored. Returns (u, v, error_line, error_offset, too_long); error_line
    0 = ok, else the 1-based number of the bad line and the offset where it starts;
    too_long says the line's fault is a number of more than 18 digits."""
    u = np.empty(cap, dtype=np.int64)
    v = np.empty(cap, dtype=np.int64)
    size = buf.shape[0]
    k = 0
    i = 0
    line = 0
    while i < size:
        line += 1
        begin = i
        while i < size and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
            i += 1
        if i >= size:
            break
        c = buf[i]
        if c == 10:
            i += 1
            continue
        if c == 35 or c == 37:               # '#' or '%'
            while i < size and buf[i] != 10:
                i += 1
            i += 1
            continue
        a = np.int64(0)
        b = np.int64(0)
        for col in range(2):
            if col == 1:
                if i >= size or not (buf[i] == 32 or buf[i] == 9):
                    return u[:k], v[:k], line, begin, False
                while i < size and (buf[i] == 32 or buf[i] == 9):
                    i += 1
            neg = False
            if i < size and (buf[i] == 45 or buf[i] == 43):    # '-' or '+'
                neg = buf[i] == 45
                i += 1
            digits = 0
            val = np.int64(0)
            while i < size and buf[i] >= 48 and buf[i] <= 57:
                val = val * 10 + (np.int64(buf[i]) - 48)
                digits += 1
                i += 1
            if digits == 0 or digits > 18:
                return u[:k], v[:k], line, begin, digits > 18
            if neg:
                val = -val
            if col == 0:
                a = val
            else:
                b = val
        if i < size and not (buf[i] == 32 or buf[i] == 9 or buf[i] == 13 or buf[i] == 10):
            return u[:k], v[:k], line, begin, False
        while i < size and buf[i] != 10:
            i += 1
        i += 1
        u[k] = a
        v[k] = b
        k += 1
    return u[:k], v[:k], 0, 0, False


# --------------------------------------------------------------------------
# the Graph
# --------------------------------------------------------------------------
def _check_n(n, what):
    """n as a Python int in [0, 2**31)."""
    try:
        n = _index(n)
    except TypeError:
        raise TypeError(f"{what}: n={n!r} must be an int (the number of vertices)") from None
    if n < 0:
        raise ValueError(f"{what}: n={n} must be >= 0 (the number of vertices)")
    if n >= _ID_LIMIT:
        raise ValueError(
            f"{what}: n={n} is too large for int32 ids (vertices must be < 2**31); "
            f"split the graph or use fewer vertices"
        )
    return n


def _check_m(m, what):
    if 2 * m >= _ID_LIMIT:
        raise ValueError(
            f"{what}: m={m} edges (2m={2 * m} adjacency entries) is too large for int32 ids "
            f"(2m must be < 2**31); use fewer edges"
        )


class Graph:
    """A simple undirected graph as a symmetric CSR adjacency with an edge index.

    Build one with :meth:`from_edges`, :meth:`from_csr`, :func:`as_graph` or a
    generator; the constructor itself trusts its arguments (see
    ``from_csr(..., validate=False)``).

    Attributes
    ----------
    n : int
        Number of vertices, ``0 .. n-1``.
    m : int
        Number of undirected edges.
    indptr : ndarray of int64, shape (n + 1,)
        Row ``v`` of the adjacency is ``indices[indptr[v]:indptr[v + 1]]``.
    indices : ndarray of int32, shape (2m,)
        Neighbours; every row sorted ascending, symmetric, no self loops, no
        duplicates; C-contiguous.
    edges : ndarray of int32, shape (m, 2)
        Each undirected edge once as ``(u, v)``, ``u < v``, lexicographic
        (the order of the upper triangle of the CSR). Cached.
    edge_ids : ndarray of int32, shape (2m,)
        Parallel to ``indices``: ``edges[edge_ids[k]]`` is the edge of the
        adjacency entry ``k`` (both entries of an edge carry its id). Cached.
    """

    def __init__(self, indptr, indices, n):
        self.n = int(n)
        self.indptr = indptr
        self.indices = indices
        self.m = int(indices.shape[0]) // 2

    # -- construction -----------------------------------------------------
    @classmethod
    def _from_pairs(cls, lo, hi, n, what):
        """From distinct pairs lo < hi (int32) in lexicographic order."""
        _check_m(int(lo.shape[0]), what)
        indptr, indices, edge_ids, edges = _csr_from_pairs(lo, hi, n)
        g = cls(indptr, indices, n)
        g.__dict__["edges"] = edges
        g.__dict__["edge_ids"] = edge_ids
        return g

    @classmethod
    def _from_any_pairs(cls, lo, hi, n, what):
        """From pairs lo < hi (int32) in any order, duplicates allowed."""
        lo, hi = _unique_pairs(lo, hi, n)
        return cls._from_pairs(lo, hi, n, what)

    @classmethod
    def from_edges(cls, u, v=None, n=None):
        """Graph from an edge list; duplicates and reversed copies are merged.

        Parameters
        ----------
        u, v : array_like of int
            Endpoints, two 1-D arrays of equal length; or ``u`` alone as a
            ``(k, 2)`` array and ``v=None``. Any integer dtype.
        n : int, optional
            Number of vertices; defaults to the largest id + 1 (0 without edges).

        Raises
        ------
        TypeError
            Non-integer ids.
        ValueError
            Wrong shapes, negative ids, ids >= n, a self loop, or a graph too
            large for int32 ids.
        """
        what = "from_edges"
        if v is None:
            arr = np.asarray(u)
            if arr.ndim != 2 or arr.shape[1] != 2:
                raise ValueError(
                    f"{what}(u): a single argument must be a (k, 2) array of edges, got shape "
                    f"{arr.shape}; pass u and v as two 1-D arrays or stack them with "
                    f"np.column_stack((u, v))"
                )
            _check_int_dtype(arr, f"{what}(u)")
            uu, vv = arr[:, 0], arr[:, 1]
        else:
            uu, vv = np.asarray(u), np.asarray(v)
            if uu.ndim != 1 or vv.ndim != 1 or uu.shape[0] != vv.shape[0]:
                raise ValueError(
                    f"{what}(u, v): u and v must be 1-D arrays of one length, got shapes "
                    f"{uu.shape} and {vv.shape}; for a (k, 2) array pass it alone as u"
                )
            _check_int_dtype(uu, f"{what}(u, v): u")
            _check_int_dtype(vv, f"{what}(u, v): v")
        return cls._from_endpoints(uu, vv, n, what)

    @classmethod
    def _from_endpoints(cls, uu, vv, n, what):
        """Validated endpoints (1-D integer arrays) -> Graph."""
        k = uu.shape[0]
        if k:
            if uu.dtype.kind != "u" or vv.dtype.kind != "u":
                bad = (uu < 0) | (vv < 0)
                if bad.any():
                    e = int(np.argmax(bad))
                    x = int(uu[e]) if uu[e] < 0 else int(vv[e])
                    raise ValueError(
                        f"{what}: edge ({int(uu[e])}, {int(vv[e])}) names vertex {x}: vertex ids "
                        f"must be >= 0; map your labels to 0..n-1 first"
                    )
            top = max(int(uu.max()), int(vv.max()))
        else:
            top = -1
        if n is None:
            if top >= _ID_LIMIT:
                raise ValueError(
                    f"{what}: the largest vertex id is {top}, too large for int32 ids "
                    f"(ids must be < 2**31); relabel the vertices to 0..n-1"
                )
            n = top + 1
        else:
            n = _check_n(n, what)
            if top >= n:
                bad = (uu >= n) | (vv >= n)
                e = int(np.argmax(bad))
                x = int(uu[e]) if uu[e] >= n else int(vv[e])
                raise ValueError(
                    f"{what}: edge ({int(uu[e])}, {int(vv[e])}) names vertex {x} but n={n}: "
                    f"pass n >= {top + 1} or drop the edges with ids >= n"
                )
        if k:
            loop = uu == vv
            if loop.any():
                x = int(uu[int(np.argmax(loop))])
                raise ValueError(
                    f"{what}: self loop at vertex {x}: {_SELF_LOOP_FIX} (drop the edges (v, v))"
                )
        lo = np.minimum(uu, vv).astype(np.int32)
        hi = np.maximum(uu, vv).astype(np.int32)
        return cls._from_any_pairs(lo, hi, n, what)

    @classmethod
    def from_csr(cls, indptr, indices, n, validate=True):
        """Graph from a symmetric CSR adjacency.

        Parameters
        ----------
        indptr : array_like of int, shape (n + 1,)
        indices : array_like of int, shape (indptr[-1],)
            Each row sorted ascending, no duplicates, no self loops, and the
            pattern symmetric (``c`` in row ``r`` iff ``r`` in row ``c``).
        n : int
        validate : bool, default True
            Check every rule above (O(n + m)). With ``validate=False`` the arrays
            are converted (int64 ``indptr``, C-contiguous int32 ``indices``; no copy
            if they already are) and checked only for what memory safety needs (a
            few vectorised passes: the shapes, ``indptr`` from 0 to ``len(indices)``
            without falling, every index in [0, n)); unsorted rows, duplicates,
            self loops or asymmetry then surface as a ValueError when
            ``edges``/``edge_ids`` are first used, or as wrong results.

        The Graph shares memory with arrays that need no conversion.
        """
        what = "from_csr"
        n = _check_n(n, what)
        indptr = np.asarray(indptr)
        indices = np.asarray(indices)
        _check_int_dtype(indptr, f"{what}: indptr")
        _check_int_dtype(indices, f"{what}: indices")
        if indptr.ndim != 1 or indptr.shape[0] != n + 1:
            raise ValueError(
                f"{what}: indptr has shape {indptr.shape} but n + 1 = {n + 1}; indptr must be "
                f"1-D with one entry per vertex plus one"
            )
        if indices.ndim != 1:
            raise ValueError(f"{what}: indices must be 1-D, got shape {indices.shape}")
        indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        _check_m(indices.shape[0] // 2, what)
        if not validate:
            _check_csr_bounds(indptr, indices, n, what)
            return cls(indptr, np.ascontiguousarray(indices, dtype=np.int32), n)
        return cls._validated_csr(indptr, indices, n, what)

    @classmethod
    def _validated_csr(cls, indptr, indices, n, what):
        if indptr[0] != 0:
            raise ValueError(f"{what}: indptr[0] = {int(indptr[0])} must be 0")
        steps = np.diff(indptr)
        if steps.size and steps.min() < 0:
            r = int(np.argmax(steps < 0))
            raise ValueError(
                f"{what}: indptr decreases at row {r} (indptr[{r}] = {int(indptr[r])} > "
                f"indptr[{r + 1}] = {int(indptr[r + 1])}); indptr must be non-decreasing"
            )
        if indptr[-1] != indices.shape[0]:
            raise ValueError(
                f"{what}: indptr[-1] = {int(indptr[-1])} but indices has {indices.shape[0]} "
                f"entries; they must agree"
            )
        if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= n):
            p = int(np.argmax((indices < 0) | (indices >= n)))
            r = int(np.searchsorted(indptr, p, side="right")) - 1
            raise ValueError(f"{what}: row {r} names vertex {int(indices[p])} but n={n}; "
                             f"every index must be in 0..n-1")
        indices = np.ascontiguousarray(indices, dtype=np.int32)
        code, r, p = _check_rows(indptr, indices, n)
        if code == 1:
            raise ValueError(f"{what}: row {r} names vertex {int(indices[p])} but n={n}; "
                             f"every index must be in 0..n-1")
        if code == 2:
            row = indices[indptr[r]:indptr[r + 1]]
            raise ValueError(
                f"{what}: row {r} is not sorted ascending or has a duplicate entry "
                f"({int(indices[p - 1])} then {int(indices[p])}; row starts {row[:8].tolist()}); "
                f"sort each row and merge duplicates (scipy: A.sum_duplicates())"
            )
        if code == 3:
            raise ValueError(f"{what}: self loop at vertex {r}: {_SELF_LOOP_FIX}")
        edges, edge_ids, ok = _index_csr(indptr, indices, n)
        if not ok:
            a, b = _find_asymmetry(indptr, indices, n)
            raise ValueError(
                f"{what}: the matrix is not symmetric (entry ({a}, {b}) has no ({b}, {a})); "
                f"pass A + A.T or A.maximum(A.T)"
            )
        g = cls(indptr, indices, n)
        g.__dict__["edges"] = edges
        g.__dict__["edge_ids"] = edge_ids
        return g

    # -- derived data -----------------------------------------------------
    def _index(self):
        edges, edge_ids, ok = _index_csr(self.indptr, self.indices, self.n)
        if not ok:
            a, b = _find_asymmetry(self.indptr, self.indices, self.n)
            witness = f" (entry ({a}, {b}) has no ({b}, {a}))" if a >= 0 else ""
            raise ValueError(
                f"Graph: the adjacency is not a sorted, symmetric CSR{witness}; it was built "
                f"with from_csr(..., validate=False) from a broken CSR: use validate=True"
            )
        self.__dict__["edges"] = edges
        self.__dict__["edge_ids"] = edge_ids

    @functools.cached_property
    def edges(self):
        self._index()
        return self.__dict__["edges"]

    @functools.cached_property
    def edge_ids(self):
        self._index()
        return self.__dict__["edge_ids"]

    def degree(self):
        """Degree of every vertex (int64, length n)."""
        return np.diff(self.indptr)

    def neighbors(self, v):
        """Sorted neighbours of vertex ``v`` (a view into ``indices``)."""
        v = _index(v)
        if not 0 <= v < self.n:
            raise IndexError(f"neighbors: vertex {v} is not in 0..{self.n - 1}")
        return self.indices[self.indptr[v]:self.indptr[v + 1]]

    def to_scipy(self):
        """The adjacency as a ``scipy.sparse.csr_array`` of int8 ones (shape (n, n))."""
        import scipy.sparse as sp
        data = np.ones(self.indices.shape[0], dtype=np.int8)
        return sp.csr_array((data, self.indices, self.indptr), shape=(self.n, self.n))

    def __repr__(self):
        return f"Graph(n={self.n}, m={self.m})"

    def _check(self):
        """Assert every invariant (CSR shape and dtypes, sorted rows, symmetry,
        no self loops, the edge index); raises AssertionError with the state."""
        def fail(msg):
            raise AssertionError(
                f"Graph invariant broken: {msg}\n  {self!r}\n  indptr[:20]={self.indptr[:20]}\n"
                f"  indices[:40]={self.indices[:40]}"
            )
        ip, ix, n = self.indptr, self.indices, self.n
        if ip.dtype != np.int64 or ip.shape != (n + 1,):
            fail(f"indptr dtype {ip.dtype} shape {ip.shape}, expected int64 ({n + 1},)")
        if ix.dtype != np.int32 or ix.ndim != 1 or not ix.flags.c_contiguous:
            fail(f"indices dtype {ix.dtype}, ndim {ix.ndim}, contiguous {ix.flags.c_contiguous}")
        if ip[0] != 0 or ip[-1] != ix.shape[0] or (n and np.diff(ip).min() < 0):
            fail("indptr does not start at 0, end at len(indices) and never decrease")
        if ix.shape[0] != 2 * self.m:
            fail(f"len(indices) = {ix.shape[0]} but m = {self.m}")
        code, r, p = _check_rows(ip, ix, n)
        if code:
            fail(f"row {r}, entry {p}: " + ["", "out of range", "not increasing", "self loop"][code])
        edges, edge_ids, ok = _index_csr(ip, ix, n)
        if not ok:
            a, b = _find_asymmetry(ip, ix, n)
            fail(f"not symmetric: entry ({a}, {b}) has no ({b}, {a})")
        if not (np.array_equal(edges, self.edges) and np.array_equal(edge_ids, self.edge_ids)):
            fail("cached edges / edge_ids differ from the adjacency")
        if self.edges.dtype != np.int32 or self.edge_ids.dtype != np.int32:
            fail("edges / edge_ids are not int32")


def _check_csr_bounds(indptr, indices, n, what):
    """What every kernel's reads of a CSR rely on: indptr from 0 to len(indices) without
    falling, every index in [0, n)."""
    nnz = indices.shape[0]
    if indptr[0] != 0 or indptr[-1] != nnz or (np.diff(indptr) < 0).any():
        raise ValueError(f"{what}: indptr must rise from 0 to len(indices) = {nnz} without "
                         f"falling, got {indptr[0]} ... {indptr[-1]}")
    if nnz and (indices.min() < 0 or indices.max() >= n):
        raise ValueError(f"{what}: indices must be vertex ids in 0..{n - 1}, got "
                         f"{indices.min()} ... {indices.max()}")


def _check_int_dtype(arr, what):
    if arr.size == 0 and arr.dtype.kind in "fb":
        return                               # an empty list becomes float64: allow it
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(
            f"{what} has dtype {arr.dtype}, not an integer dtype; vertex ids must be integers "
            f"(cast whole-valued floats with .astype(np.int64))"
        )


# --------------------------------------------------------------------------
# conversions
# --------------------------------------------------------------------------
def _from_scipy(A, n, what):
    import scipy.sparse as sp
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"{what}: an adjacency matrix must be square, got shape {A.shape}")
    if n is not None and _check_n(n, what) != A.shape[0]:
        raise ValueError(f"{what}: n={n} but the matrix is {A.shape[0]} x {A.shape[1]}; "
                         f"leave n out or pass n={A.shape[0]}")
    nv = _check_n(A.shape[0], what)
    A = sp.csr_array(A, copy=True)
    A.sum_duplicates()
    A.eliminate_zeros()
    indptr = np.asarray(A.indptr, dtype=np.int64)
    _check_m(A.nnz // 2, what)
    indices = np.ascontiguousarray(A.indices, dtype=np.int32)
    return Graph._validated_csr(indptr, indices, nv, what)


def _networkx_graph(G, n, what):
    if G.is_directed():
        raise ValueError(f"{what}: a directed networkx graph ({type(G).__name__}); greedy "
                         f"MIS/matching needs an undirected one: pass G.to_undirected()")
    nodes = list(G.nodes)
    k = len(nodes)
    if n is not None and _check_n(n, what) != k:
        raise ValueError(f"{what}: n={n} but the networkx graph has {k} nodes; leave n out")
    k = _check_n(k, what)
    identity = all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
                   for x in nodes) and set(int(x) for x in nodes) == set(range(k))
    pairs = list(G.edges())
    loops = [x for x, y in pairs if x == y]
    if loops:
        raise ValueError(f"{what}: self loop at node {loops[0]!r}: {_SELF_LOOP_FIX} "
                         f"(G.remove_edges_from(nx.selfloop_edges(G)))")
    if identity:
        flat = [int(x) for pair in pairs for x in pair]
    else:
        try:
            nodes = sorted(nodes)
        except TypeError:
            pass                             # not sortable: insertion order
        index = {x: i for i, x in enumerate(nodes)}
        flat = [index[x] for pair in pairs for x in pair]
    uv = np.array(flat, dtype=np.int64).reshape(-1, 2)
    return Graph._from_endpoints(uv[:, 0], uv[:, 1], k, what)


def _read_mtx(path, n, what):
    import scipy.io
    import scipy.sparse as sp
    info = scipy.io.mminfo(path)
    A = scipy.io.mmread(path)
    if not sp.issparse(A):
        A = sp.csr_array(np.asarray(A))
    symmetry = str(info[-1]).lower()
    if symmetry != "general":
        # symmetric / skew-symmetric / hermitian files store one triangle; scipy
        # may or may not mirror it: take the union of the pattern and its mirror
        A = sp.csr_array(A)
        A.eliminate_zeros()
        P = sp.csr_array((np.ones(A.nnz, dtype=np.int8), A.indices, A.indptr), shape=A.shape)
        A = P + P.T
    return _from_scipy(A, n, what)


def read_edgelist(path, n=None, one_based=False):
    """Graph from an edge-list text file (optionally gzip-compressed, ``.gz``).

    Every line holds two integers separated by spaces or tabs: an edge
    ``u v``. Lines starting with ``#`` or ``%`` (after optional blanks) are
    comments, blank lines are skipped, and further columns (weights) are
    ignored. Duplicate and reversed edges are merged; self loops raise. The
    file is read whole and parsed by a Numba kernel in one pass over its bytes.

    Parameters
    ----------
    path : str or os.PathLike
    n : int, optional
        Number of vertices; defaults to the largest id + 1.
    one_based : bool, default False
        Ids in the file start at 1 (Matrix Market, SNAP some files): 1 is
        subtracted from every id.
    """
    path = os.fsdecode(path)
    what = f"read_edgelist({path!r})"
    one_based = _flag(one_based, "one_based", what)
    if path.lower().endswith(".gz"):
        with gzip.open(path, "rb") as f:
            buf = np.frombuffer(f.read(), dtype=np.uint8)
    else:
        buf = np.fromfile(path, dtype=np.uint8)
    cap = int(np.count_nonzero(buf == 10)) + 1
    uu, vv, bad_line, start, too_long = _parse_edgelist(buf, cap)
    if bad_line:
        end = start
        while end < buf.shape[0] and buf[end] != 10 and end - start < 80:
            end += 1
        text = bytes(buf[start:end]).decode("utf-8", "replace")
        if too_long:
            raise ValueError(
                f"{what}: line {bad_line} has an id of more than 18 digits: {text!r}; "
                f"vertex ids must be < 2**31, relabel the vertices to 0..n-1")
        raise ValueError(
            f"{what}: line {bad_line} is not two whitespace-separated integers: {text!r}; "
            f"an edge list has lines 'u v', comment lines start with '#' or '%'"
        )
    if one_based:
        if uu.size and min(int(uu.min()), int(vv.min())) < 1:
            e = int(np.argmax((uu < 1) | (vv < 1)))
            raise ValueError(
                f"{what}: edge ({int(uu[e])}, {int(vv[e])}) has an id below 1 but "
                f"one_based=True; pass one_based=False for ids starting at 0"
            )
        uu -= 1
        vv -= 1
    return Graph._from_endpoints(uu, vv, n, what)


def as_graph(obj, n=None):
    """A :class:`Graph` from any supported input.

    Parameters
    ----------
    obj :
        * a :class:`Graph`: returned as is;
        * a scipy.sparse matrix or array: square, its stored nonzero pattern
          (after summing duplicates and dropping explicit zeros) is the edge
          set; the pattern must be symmetric and the diagonal empty; values
          are ignored;
        * a numpy integer array of shape ``(k, 2)``: an edge list (see
          :meth:`Graph.from_edges`);
        * a networkx ``Graph`` or ``MultiGraph`` (parallel edges merged;
          DiGraph raises). Nodes that are exactly the ints ``0..n-1`` keep their
          ids; otherwise node ``sorted(G.nodes)[i]`` becomes vertex ``i``, or
          ``list(G.nodes)[i]`` when the nodes cannot be sorted;
        * a path (str or os.PathLike): ``.mtx`` / ``.mtx.gz`` is read with
          ``scipy.io.mmread`` (a symmetric file's stored triangle is mirrored;
          a general one must be symmetric); anything else is an edge-list text
          file (:func:`read_edgelist`, zero-based ids).
    n : int, optional
        Number of vertices; for edge lists it defaults to the largest id + 1;
        for the other inputs it must equal their size if given.

    Raises
    ------
    TypeError
        For any other type.
    ValueError
        For asymmetric matrices, self loops, bad ids (see :meth:`Graph.from_edges`).
    """
    what = "as_graph"
    if isinstance(obj, Graph):
        if n is not None and _check_n(n, what) != obj.n:
            raise ValueError(f"{what}: n={n} but the Graph has n={obj.n}; leave n out")
        return obj
    sp = sys.modules.get("scipy.sparse")
    if sp is not None and sp.issparse(obj):
        return _from_scipy(obj, n, what)
    if isinstance(obj, np.ndarray):
        if obj.ndim != 2 or obj.shape[1] != 2:
            raise ValueError(
                f"{what}: a numpy array must be an edge list of shape (k, 2), got shape "
                f"{obj.shape}; for a dense adjacency matrix pass scipy.sparse.csr_array(A)"
            )
        _check_int_dtype(obj, f"{what}: the edge array")
        return Graph._from_endpoints(obj[:, 0], obj[:, 1], n, what)
    nx = sys.modules.get("networkx")         # a networkx graph implies networkx is imported
    if nx is not None and isinstance(obj, nx.Graph):
        return _networkx_graph(obj, n, what)
    if isinstance(obj, (str, os.PathLike)):
        path = os.fsdecode(obj)
        lower = path.lower()
        if lower.endswith(".mtx") or lower.endswith(".mtx.gz"):
            return _read_mtx(path, n, f"{what}({path!r})")
        return read_edgelist(path, n=n)
    raise TypeError(
        f"{what}: cannot make a graph from {type(obj).__name__}; pass a Graph, a scipy.sparse "
        f"matrix, a (k, 2) integer numpy array of edges, a networkx Graph, or a path to a "
        f".mtx or edge-list file"
    )


# --------------------------------------------------------------------------
# generators
# --------------------------------------------------------------------------
def _check_count(x, name, what, low=0):
    try:
        x = _index(x)
    except TypeError:
        raise TypeError(f"{what}: {name}={x!r} must be an int") from None
    if x < low:
        raise ValueError(f"{what}: {name}={x} must be >= {low}")
    return x


def _check_edge_count(n, m, what):
    """m as an int: at most the n(n-1)/2 pairs of n vertices, and int32-sized."""
    m = _check_count(m, "m", what)
    total = n * (n - 1) // 2
    if m > total:
        raise ValueError(f"{what}: m={m} exceeds the n(n-1)/2 = {total} possible edges of "
                         f"n={n} vertices; lower m or raise n")
    _check_m(m, what)
    return m


def _trim(lo, hi, m, rng):
    """Keep a uniformly random m of the pairs (order preserved)."""
    extra = lo.shape[0] - m
    if extra <= 0:
        return lo, hi
    keep = np.ones(lo.shape[0], dtype=bool)
    keep[rng.choice(lo.shape[0], size=extra, replace=False)] = False
    return lo[keep], hi[keep]


def erdos_renyi(n, m, seed=None):
    """Uniform random graph G(n, m): exactly ``m`` distinct edges.

    Every set of ``m`` of the ``n(n-1)/2`` possible edges is equally likely.
    Sparse case (m <= half of all pairs): uniform unordered pairs are drawn
    (self loops redrawn; about ``-T log(1 - m/T)`` draws plus a margin, T the
    number of pairs), deduplicated, topped up if short, and a uniformly random
    surplus is dropped; the procedure treats all pairs alike, so the result is
    uniform. Dense case: ``m`` distinct pair numbers drawn without replacement
    and decoded.

    Parameters
    ----------
    n : int
        Vertices, ``0 <= n < 2**31``.
    m : int
        Edges, ``0 <= m <= n(n-1)/2``.
    seed : None, int or np.random.Generator
    """
    what = "erdos_renyi"
    n = _check_n(n, what)
    m = _check_edge_count(n, m, what)
    total = n * (n - 1) // 2
    rng = _as_rng(seed, what)
    if m == 0:
        return Graph._from_pairs(np.empty(0, np.int32), np.empty(0, np.int32), n, what)
    if 2 * m > total:
        idx = np.sort(rng.choice(total, size=m, replace=False))
        rows = np.arange(n, dtype=np.int64)
        start = rows * (2 * n - rows - 1) // 2       # first pair number of row u
        u = np.searchsorted(start, idx, side="right") - 1
        v = idx - start[u] + u + 1
        return Graph._from_pairs(u.astype(np.int32), v.astype(np.int32), n, what)
    state = _kernel_state(rng)
    k = int(np.ceil(-total * np.log1p(-m / total))) + int(4 * np.sqrt(m)) + 16
    lo, hi = _unique_pairs(*_er_pairs(state, n, k), n)
    while lo.shape[0] < m:                       # rare: a short draw
        have = lo.shape[0]
        k = int((m - have) * total / (total - have) * 1.1) + 64
        nlo, nhi = _er_pairs(state, n, k)
        lo, hi = _unique_pairs(np.concatenate((lo, nlo)), np.concatenate((hi, nhi)), n)
    lo, hi = _trim(lo, hi, m, rng)
    return Graph._from_pairs(lo, hi, n, what)


def random_local(n, degree=10, seed=None, dim=3):
    """PBBS "random local graph" (randLocalGraph, edgeRandomWithDimension).

    Vertex ``i`` draws ``degree`` edges to ``j = (i + off) mod n`` where ``off``
    is uniform in ``[0, 2**p)`` and ``p = dim + 2 + dim*G`` (capped at 62), ``G``
    the number of heads before the first tail of a fair coin; ``j == i`` is
    redrawn, keeping the ``p`` reached (as PBBS does). An edge at distance
    ``d`` thus has probability roughly proportional to ``(1/d)**((dim+1)/dim)``,
    as for points in a ``dim``-dimensional space, and most edges are short.
    Offsets only go forward (with wrap-around), but the graph is undirected, so
    every vertex gets neighbours on both sides. Duplicates are merged, so
    ``m`` is a little below ``n * degree``.

    PBBS generates its MIS/matching inputs ``randLocalGraph_J_{5,10}_<n>``
    with ``dim = 3``; PBBS hashes the edge number for randomness where this
    uses a seeded SplitMix64 stream.

    Parameters
    ----------
    n : int
        Vertices (at least 2 when ``degree > 0``).
    degree : int, default 10
        Edges drawn per vertex.
    seed : None, int or np.random.Generator
    dim : int, default 3
        The dimension the locality imitates (>= 1).
    """
    what = "random_local"
    n = _check_n(n, what)
    degree = _check_count(degree, "degree", what)
    dim = _check_count(dim, "dim", what, low=1)
    if degree > 0 and n < 2:
        raise ValueError(f"{what}: n={n} leaves no other vertex to connect to; "
                         f"pass n >= 2 or degree=0")
    _check_m(n * degree, what)
    rng = _as_rng(seed, what)
    lo, hi = _local_pairs(_kernel_state(rng), n, degree, dim)
    return Graph._from_any_pairs(lo, hi, n, what)


def rmat(n, m, a=0.57, b=0.19, c=0.19, seed=None, permute=False):
    """R-MAT power-law graph with exactly ``m`` distinct edges.

    R-MAT (Chakrabarti, Zhan, Faloutsos, SDM 2004) places an edge by choosing
    one quadrant of the adjacency matrix per bit of the vertex ids, with
    probabilities ``a`` (top left), ``b``, ``c`` and ``d = 1 - a - b - c``
    (bottom right); the defaults are Graph500's. Vertex ids have
    ``ceil(log2 n)`` bits; a draw with an endpoint ``>= n`` or with ``u == v``
    is redrawn (so the edges follow R-MAT conditioned on both ends below
    ``n``). Edges are undirected (b and c play the same role). Duplicates are
    merged, more edges are drawn until ``m`` distinct ones exist, and a
    uniformly random surplus is dropped. Without ``permute`` low ids have the
    highest degrees (vertex 0 most of all).

    Parameters
    ----------
    n : int
        Vertices (>= 2 if m > 0); need not be a power of two.
    m : int
        Distinct edges in the result, ``<= n(n-1)/2``. When ``m`` comes close
        to the number of pairs R-MAT reaches with noticeable probability, the
        top-up gives up after 64 rounds with a ValueError.
    a, b, c : float
        Quadrant probabilities, each >= 0, ``a > 0``, ``b + c > 0``,
        ``a + b + c <= 1``.
    seed : None, int or np.random.Generator
    permute : bool, default False
        Relabel the vertices by a uniformly random permutation (as Graph500
        does), which hides the id/degree correlation.
    """
    what = "rmat"
    n = _check_n(n, what)
    m = _check_edge_count(n, m, what)
    permute = _flag(permute, "permute", what)
    for name, p in (("a", a), ("b", b), ("c", c)):
        if isinstance(p, (bool, np.bool_)) or not (
                isinstance(p, (int, float, np.floating, np.integer)) and 0 <= p <= 1):
            raise ValueError(f"{what}: {name}={p!r} must be a probability in [0, 1]")
    if a <= 0 or b + c <= 0 or a + b + c > 1 + 1e-12:
        raise ValueError(
            f"{what}: (a, b, c) = ({a}, {b}, {c}) must have a > 0, b + c > 0 and "
            f"a + b + c <= 1 (d = 1 - a - b - c); e.g. the defaults 0.57, 0.19, 0.19"
        )
    rng = _as_rng(seed, what)
    if m == 0:
        return Graph._from_pairs(np.empty(0, np.int32), np.empty(0, np.int32), n, what)
    scale = max(1, int(n - 1).bit_length())
    th = [min(int(round(x * 2**32)), 2**32) for x in (a, a + b, a + b + c)]
    ta, tab, tabc = (np.uint64(x) for x in th)
    state = _kernel_state(rng)
    params = (a, b, c)
    lo, hi = _unique_pairs(*_rmat_draw(state, n, scale, m, ta, tab, tabc, params, what), n)
    drawn = m
    rounds = 0
    while lo.shape[0] < m:
        rounds += 1
        if rounds > 64:
            raise ValueError(
                f"{what}: after {drawn} draws only {lo.shape[0]} of m={m} edges are distinct; "
                f"R-MAT concentrates its edges on few pairs: lower m, raise n, or make "
                f"(a, b, c) less skewed"
            )
        have = lo.shape[0]
        k = min(int((m - have) * drawn / have * 1.2) + 64, 4 * m + 64)
        nlo, nhi = _rmat_draw(state, n, scale, k, ta, tab, tabc, params, what)
        drawn += k
        lo, hi = _unique_pairs(np.concatenate((lo, nlo)), np.concatenate((hi, nhi)), n)
    lo, hi = _trim(lo, hi, m, rng)
    if permute:
        perm = rng.permutation(n).astype(np.int32)
        pu, pv = perm[lo], perm[hi]
        return Graph._from_any_pairs(np.minimum(pu, pv), np.maximum(pu, pv), n, what)
    return Graph._from_pairs(lo, hi, n, what)


def _grid(shape, periodic, what):
    periodic = _flag(periodic, "periodic", what)
    dims = [_check_count(x, name, what, low=1) for name, x in shape]
    n = _check_n(int(np.prod(dims, dtype=object)), what)
    ids = np.arange(n, dtype=np.int32).reshape(dims)
    los, his = [], []
    for axis, length in enumerate(dims):
        if length >= 2:
            a = np.take(ids, np.arange(length - 1), axis=axis).ravel()
            b = np.take(ids, np.arange(1, length), axis=axis).ravel()
            los.append(a)
            his.append(b)
        if periodic and length >= 3:         # for length 2 the wrap edge is the same edge
            los.append(np.take(ids, [0], axis=axis).ravel())
            his.append(np.take(ids, [length - 1], axis=axis).ravel())
    if los:
        lo, hi = np.concatenate(los), np.concatenate(his)
    else:
        lo = hi = np.empty(0, dtype=np.int32)
    _check_m(lo.shape[0], what)
    return Graph._from_any_pairs(lo, hi, n, what)


def grid2d(rows, cols, periodic=False):
    """4-neighbour grid graph; vertex ``r * cols + c`` is cell ``(r, c)``.

    With ``periodic=True`` the grid wraps around (a torus) along every
    dimension of length >= 3; a dimension of length 2 is the same either way
    (its wrap edge would repeat an edge) and one of length 1 has no edges.
    So the graph has ``rows*(cols-1) + cols*(rows-1)`` edges, or
    ``2*rows*cols`` on a torus with both lengths >= 3.
    """
    return _grid((("rows", rows), ("cols", cols)), periodic, "grid2d")


def grid3d(x, y, z, periodic=False):
    """6-neighbour grid graph; vertex ``(i * y + j) * z + k`` is cell ``(i, j, k)``.

    Wrap-around as in :func:`grid2d`: ``periodic=True`` adds the wrap edges of
    every dimension of length >= 3 (``3*x*y*z`` edges when all are >= 3).
    """
    return _grid((("x", x), ("y", y), ("z", z)), periodic, "grid3d")
