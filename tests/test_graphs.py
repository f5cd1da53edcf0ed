"""relaxed.graphs against independent oracles: Python sets of frozensets, scipy,
networkx (when installed) and brute-force grid neighbourhoods."""
import gzip
import itertools
from collections import Counter

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
from scipy.stats import chi2

from relaxed.graphs import (Graph, as_graph, erdos_renyi, grid2d, grid3d, random_local,
                            read_edgelist, rmat)


# ---------------------------------------------------------------- oracles
def edge_set(pairs):
    """The oracle: an undirected simple graph as a set of frozensets."""
    return {frozenset((int(a), int(b))) for a, b in pairs}


def assert_matches(G, oracle, n):
    """G has exactly the oracle's edges on n vertices, and every structural rule holds,
    checked here in plain Python (not with the module's own kernels)."""
    assert isinstance(G, Graph)
    assert G.n == n and G.m == len(oracle)
    assert G.indptr.dtype == np.int64 and G.indptr.shape == (n + 1,)
    assert G.indices.dtype == np.int32 and G.indices.flags.c_contiguous
    assert G.indices.shape == (2 * len(oracle),)
    assert G.indptr[0] == 0 and G.indptr[-1] == 2 * len(oracle)
    adj = {v: [] for v in range(n)}
    for e in oracle:
        a, b = sorted(e)
        adj[a].append(b)
        adj[b].append(a)
    ip, ix = G.indptr.tolist(), G.indices.tolist()
    for v in range(n):
        row = ix[ip[v]:ip[v + 1]]
        assert row == sorted(adj[v]), f"row {v}: {row} != {sorted(adj[v])}"
    assert G.degree().tolist() == [len(adj[v]) for v in range(n)]
    # edges: u < v, lexicographic, exactly the oracle
    E = G.edges
    assert E.dtype == np.int32 and E.shape == (len(oracle), 2)
    pairs = [tuple(p) for p in E.tolist()]
    assert pairs == sorted(tuple(sorted(e)) for e in oracle)
    # edge_ids: both adjacency entries of an edge carry its row of `edges`
    ids = G.edge_ids.tolist()
    assert G.edge_ids.dtype == np.int32 and len(ids) == len(ix)
    for v in range(n):
        for k in range(ip[v], ip[v + 1]):
            assert set(pairs[ids[k]]) == {v, ix[k]}
    assert sorted(Counter(ids).values()) == [2] * len(oracle)


def random_edge_list(rng, n, k):
    """k random non-loop edges plus duplicates and reversed copies, shuffled."""
    u = rng.integers(0, n, k)
    v = rng.integers(0, n, k)
    keep = u != v
    u, v = u[keep], v[keep]
    dup = rng.integers(0, max(1, len(u)), len(u) // 2) if len(u) else np.empty(0, int)
    u2 = np.concatenate((u, u[dup], v[dup[::2]]))
    v2 = np.concatenate((v, v[dup], u[dup[::2]]))
    order = rng.permutation(len(u2))
    return u2[order], v2[order]


def grid_oracle(shape, periodic):
    """Brute force: each cell's +-1 neighbours along every axis (mod L on a torus)."""
    edges = set()
    strides = np.cumprod((1,) + tuple(shape[::-1]))[:-1][::-1]
    for cell in itertools.product(*(range(L) for L in shape)):
        me = int(np.dot(cell, strides))
        for axis, L in enumerate(shape):
            for step in (-1, 1):
                c = list(cell)
                c[axis] += step
                if periodic:
                    c[axis] %= L
                elif not 0 <= c[axis] < L:
                    continue
                other = int(np.dot(c, strides))
                if other != me:
                    edges.add(frozenset((me, other)))
    return edges


# ---------------------------------------------------------------- construction
@pytest.mark.parametrize("seed", range(8))
def test_from_edges_matches_set_oracle(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    u, v = random_edge_list(rng, n, int(rng.integers(0, 120)))
    oracle = edge_set(zip(u, v))
    n_total = n + int(rng.integers(0, 3))          # trailing isolated vertices
    assert_matches(Graph.from_edges(u, v, n=n_total), oracle, n_total)
    assert_matches(Graph.from_edges(np.column_stack((u, v))), oracle,
                   max(max(u.max(), v.max()) + 1, 0) if len(u) else 0)
    G = Graph.from_edges(u, v, n=n_total)
    G._check()


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint32, np.int32, np.int64,
                                   np.uint64])
def test_from_edges_any_integer_dtype(dtype):
    uv = np.array([[0, 3], [3, 0], [2, 1], [1, 2], [4, 3]], dtype=dtype)
    assert_matches(Graph.from_edges(uv), edge_set([(0, 3), (1, 2), (3, 4)]), 5)


def test_empty_and_edgeless_graphs():
    G = Graph.from_edges(np.empty((0, 2), dtype=np.int64))
    assert (G.n, G.m) == (0, 0) and G.indptr.tolist() == [0] and G.edges.shape == (0, 2)
    G = Graph.from_edges([], [], n=4)                   # an empty list is float64: accepted
    assert_matches(G, set(), 4)
    assert repr(G) == "Graph(n=4, m=0)"
    assert_matches(erdos_renyi(3, 0, seed=0), set(), 3)


def test_small_example_from_docstring():
    G = Graph.from_edges(np.array([[0, 1], [1, 2], [2, 0], [1, 0]]))
    assert repr(G) == "Graph(n=3, m=3)"
    assert G.indptr.tolist() == [0, 2, 4, 6]
    assert G.indices.tolist() == [1, 2, 0, 2, 0, 1]
    assert G.edges.tolist() == [[0, 1], [0, 2], [1, 2]]
    assert G.edge_ids.tolist() == [0, 1, 0, 2, 1, 2]
    assert G.neighbors(1).tolist() == [0, 2]
    with pytest.raises(IndexError, match="vertex 3 is not in 0..2"):
        G.neighbors(3)


@pytest.mark.parametrize("seed", range(4))
def test_from_csr_validated_and_trusted(seed):
    rng = np.random.default_rng(seed)
    n = 30
    u, v = random_edge_list(rng, n, 80)
    oracle = edge_set(zip(u, v))
    G = Graph.from_edges(u, v, n=n)
    for validate in (True, False):
        H = Graph.from_csr(G.indptr.astype(np.int32), G.indices.astype(np.int64), n,
                           validate=validate)
        assert "edges" not in H.__dict__ or validate      # trusted: computed lazily
        assert_matches(H, oracle, n)
        H._check()
    # no conversion needed: the Graph shares the caller's arrays
    H = Graph.from_csr(G.indptr, G.indices, n, validate=False)
    assert np.shares_memory(H.indices, G.indices) and np.shares_memory(H.indptr, G.indptr)


def test_to_scipy_roundtrip():
    rng = np.random.default_rng(5)
    u, v = random_edge_list(rng, 25, 60)
    G = Graph.from_edges(u, v, n=25)
    A = G.to_scipy()
    assert A.shape == (25, 25) and A.nnz == 2 * G.m
    assert (A != A.T).nnz == 0
    dense = A.toarray()
    for e in edge_set(zip(u, v)):
        a, b = tuple(e)
        assert dense[a, b] == 1 and dense[b, a] == 1
    assert dense.sum() == 2 * G.m
    assert_matches(as_graph(A), edge_set(zip(u, v)), 25)


# ---------------------------------------------------------------- as_graph
def _sym_scipy(rng, n=20, k=50):
    u, v = random_edge_list(rng, n, k)
    vals = rng.uniform(0.5, 2.0, len(u))               # values differ: only the pattern counts
    A = sp.coo_array((np.concatenate((vals, -vals)), (np.concatenate((u, v)),
                                                      np.concatenate((v, u)))), shape=(n, n))
    return A, edge_set(zip(u, v))


@pytest.mark.parametrize("fmt", ["csr_array", "csr_matrix", "coo_array", "coo_matrix",
                                 "csc_array", "lil_array", "dense"])
def test_as_graph_scipy_formats(fmt):
    A, oracle = _sym_scipy(np.random.default_rng(11))
    dense = np.abs(A.toarray())          # duplicates summed; |.| keeps the pattern nonzero
    if fmt == "dense":
        M = sp.csr_array(dense)
    elif fmt.startswith("coo"):
        M = getattr(sp, fmt)(A)          # duplicate coordinates, some summing to zero below
    else:
        M = getattr(sp, fmt)(dense)
    assert_matches(as_graph(M), oracle, 20)
    assert_matches(as_graph(M, n=20), oracle, 20)


def test_as_graph_scipy_explicit_zeros_and_cancelling_duplicates():
    # (0,1)/(1,0) stored as explicit zeros; (2,3)/(3,2) as +1 and -1 duplicates: no edges
    rows = [0, 1, 2, 2, 3, 3, 4, 5]
    cols = [1, 0, 3, 3, 2, 2, 5, 4]
    vals = [0.0, 0.0, 1.0, -1.0, 1.0, -1.0, 3.0, 7.0]
    A = sp.coo_array((vals, (rows, cols)), shape=(6, 6))
    assert_matches(as_graph(A), {frozenset((4, 5))}, 6)
    B = sp.csr_array(([0.0, 0.0, 2.0, 2.0], [1, 0, 3, 2], [0, 1, 2, 3, 4, 4]), shape=(5, 5))
    assert_matches(as_graph(B), {frozenset((2, 3))}, 5)


def test_as_graph_edge_array_and_graph_passthrough():
    rng = np.random.default_rng(3)
    u, v = random_edge_list(rng, 15, 40)
    uv = np.column_stack((u, v)).astype(np.int32)
    assert_matches(as_graph(uv, n=18), edge_set(zip(u, v)), 18)
    G = as_graph(uv)
    assert as_graph(G) is G and as_graph(G, n=G.n) is G
    with pytest.raises(ValueError, match="n=99 but the Graph has n="):
        as_graph(G, n=99)


def test_as_graph_networkx():
    nx = pytest.importorskip("networkx")
    rng = np.random.default_rng(4)
    u, v = random_edge_list(rng, 12, 30)
    oracle = edge_set(zip(u, v))
    # int nodes 0..n-1 inserted in a shuffled order keep their ids
    G = nx.Graph()
    G.add_nodes_from(rng.permutation(14).tolist())
    G.add_edges_from(zip(u.tolist(), v.tolist()))
    assert_matches(as_graph(G), oracle, 14)
    # a multigraph: parallel edges merge
    M = nx.MultiGraph()
    M.add_nodes_from(range(14))
    M.add_edges_from(zip(u.tolist(), v.tolist()))
    M.add_edges_from(zip(u.tolist(), v.tolist()))
    assert_matches(as_graph(M), oracle, 14)
    # string nodes: vertex i is sorted(G.nodes)[i]
    S = nx.Graph([("c", "a"), ("b", "c"), ("d", "a")])
    assert_matches(as_graph(S), edge_set([(2, 0), (1, 2), (3, 0)]), 4)
    # ints that are not 0..n-1 are mapped in sorted order too
    T = nx.Graph([(10, 30), (30, 20)])
    assert_matches(as_graph(T), edge_set([(0, 2), (2, 1)]), 3)
    # unsortable nodes: insertion order
    U = nx.Graph()
    U.add_nodes_from(["x", 1, (2,)])
    U.add_edges_from([("x", (2,)), (1, "x")])
    assert_matches(as_graph(U), edge_set([(0, 2), (1, 0)]), 3)
    with pytest.raises(ValueError, match=r"directed.*G\.to_undirected\(\)"):
        as_graph(nx.DiGraph([(0, 1)]))
    with pytest.raises(ValueError, match="self loop at node 'b'"):
        as_graph(nx.Graph([("a", "b"), ("b", "b")]))
    with pytest.raises(ValueError, match="n=5 but the networkx graph has 4 nodes"):
        as_graph(S, n=5)


@pytest.mark.parametrize("symmetry", ["general", "symmetric"])
@pytest.mark.parametrize("field", ["real", "integer", "pattern"])
def test_as_graph_mtx(tmp_path, symmetry, field):
    A, oracle = _sym_scipy(np.random.default_rng(8))
    A = sp.coo_array(np.abs(A.toarray()))
    if field == "integer":
        A = sp.coo_array((np.ceil(A.data).astype(np.int64), A.coords), shape=A.shape)
    path = tmp_path / "g.mtx"
    scipy.io.mmwrite(str(path), A if symmetry == "general" else sp.coo_array(sp.tril(A)),
                     field=field, symmetry=symmetry)
    assert scipy.io.mminfo(str(path))[-1] == symmetry
    assert_matches(as_graph(path), oracle, 20)                 # pathlib.Path
    assert_matches(as_graph(str(path)), oracle, 20)            # str
    gz = tmp_path / "g.mtx.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert_matches(as_graph(gz), oracle, 20)


def test_as_graph_mtx_dense_array_format(tmp_path):
    A, oracle = _sym_scipy(np.random.default_rng(12), n=8, k=10)
    path = tmp_path / "d.mtx"
    scipy.io.mmwrite(str(path), np.abs(A.toarray()))
    assert scipy.io.mminfo(str(path))[3] == "array"
    assert_matches(as_graph(path), oracle, 8)
    with pytest.raises(ValueError, match="n=9 but the matrix is 8 x 8"):
        as_graph(path, n=9)


def test_as_graph_mtx_general_must_be_symmetric(tmp_path):
    path = tmp_path / "a.mtx"
    scipy.io.mmwrite(str(path), sp.coo_array(([1.0], ([0], [5])), shape=(6, 6)),
                     symmetry="general")
    with pytest.raises(ValueError, match=r"not symmetric \(entry \(0, 5\) has no \(5, 0\)\)"):
        as_graph(path)


def test_edgelist_file_formats(tmp_path):
    text = ("# a SNAP-style header\n"
            "% and a Matrix Market style comment\n"
            "0 1\n"
            "\n"
            "   1\t2   \n"          # leading blanks and a tab
            "2 0 0.75\r\n"          # a weight column (ignored) and CRLF
            "1 0\n"                 # a reversed duplicate
            "  # an indented comment\n"
            "3 4")                  # no newline at the end
    oracle = edge_set([(0, 1), (1, 2), (2, 0), (3, 4)])
    p = tmp_path / "g.txt"
    p.write_text(text)
    assert_matches(read_edgelist(p), oracle, 5)
    assert_matches(as_graph(str(p)), oracle, 5)
    assert_matches(read_edgelist(p, n=7), oracle, 7)
    # one-based ids
    q = tmp_path / "g1.el"
    q.write_text("% one-based\n1 2\n2 3\n3 1\n4 5\n")
    assert_matches(read_edgelist(q, one_based=True), oracle, 5)
    # gzip
    z = tmp_path / "g.txt.gz"
    z.write_bytes(gzip.compress(text.encode()))
    assert_matches(read_edgelist(z), oracle, 5)
    assert_matches(as_graph(z), oracle, 5)
    # an empty file, a file of comments only
    e = tmp_path / "empty.txt"
    e.write_text("# nothing\n")
    assert_matches(read_edgelist(e), set(), 0)
    assert_matches(read_edgelist(e, n=3), set(), 3)


def test_edgelist_roundtrip_random(tmp_path):
    rng = np.random.default_rng(9)
    u, v = random_edge_list(rng, 500, 3000)
    p = tmp_path / "big.txt"
    with open(p, "w") as f:
        f.write("# u v\n")
        for a, b in zip(u.tolist(), v.tolist()):
            f.write(f"{a}\t{b}\n")
    assert_matches(read_edgelist(p, n=500), edge_set(zip(u, v)), 500)


@pytest.mark.parametrize("line", ["1", "1 x", "a b", "1,2", "1 2x", "- 3"])
def test_edgelist_bad_lines(tmp_path, line):
    p = tmp_path / "bad.txt"
    p.write_text(f"0 1\n# fine\n{line}\n2 3\n")
    with pytest.raises(ValueError, match=r"line 3 is not two whitespace-separated integers"):
        read_edgelist(p)


@pytest.mark.parametrize("line", ["1 1234567890123456789", "-12345678901234567890 1"])
def test_edgelist_ids_too_long_are_named(tmp_path, line):
    """A 19+ digit id is named as too large for a vertex id (it was called 'not two
    integers', though a 19-digit id below 2**63 is an integer)."""
    p = tmp_path / "long.txt"
    p.write_text(f"0 1\n# fine\n{line}\n2 3\n")
    with pytest.raises(ValueError, match=r"line 3 has an id of more than 18 digits.*"
                                         r"ids must be < 2\*\*31"):
        read_edgelist(p)


def test_edgelist_one_based_with_zero(tmp_path):
    p = tmp_path / "z.txt"
    p.write_text("1 2\n0 2\n")
    with pytest.raises(ValueError, match=r"edge \(0, 2\) has an id below 1 but one_based=True"):
        read_edgelist(p, one_based=True)


# ---------------------------------------------------------------- bad inputs
def test_self_loop_messages():
    with pytest.raises(ValueError, match=r"self loop at vertex 7: greedy MIS/matching needs a "
                                         r"simple graph; remove the diagonal"):
        Graph.from_edges(np.array([[0, 1], [7, 7]]))
    A = sp.csr_array(np.eye(3, k=1) + np.eye(3, k=-1) + np.diag([0, 0, 5]))
    with pytest.raises(ValueError, match="self loop at vertex 2"):
        as_graph(A)
    with pytest.raises(ValueError, match="self loop at vertex 1"):
        Graph.from_csr([0, 1, 3], [1, 0, 1], 2)


def test_asymmetric_matrix_message():
    A = sp.csr_array(([1.0], ([0], [5])), shape=(6, 6))
    with pytest.raises(ValueError, match=r"the matrix is not symmetric \(entry \(0, 5\) has no "
                                         r"\(5, 0\)\); pass A \+ A\.T or A\.maximum\(A\.T\)"):
        as_graph(A)
    B = sp.csr_array(([1.0], ([4], [1])), shape=(6, 6))          # only the lower entry
    with pytest.raises(ValueError, match=r"entry \(4, 1\) has no \(1, 4\)"):
        as_graph(B)
    # symmetric except for one extra entry in a row that has others
    C = sp.csr_array(np.array([[0, 1, 1], [1, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match=r"entry \(0, 2\) has no \(2, 0\)"):
        as_graph(C)
    D = sp.csr_array(np.array([[0, 1, 0], [1, 0, 0], [1, 0, 0]]))
    with pytest.raises(ValueError, match=r"entry \(2, 0\) has no \(0, 2\)"):
        as_graph(D)


def test_bad_ids_messages():
    with pytest.raises(ValueError, match=r"edge \(3, 12\) names vertex 12 but n=10: pass n >= 13"):
        Graph.from_edges(np.array([[0, 1], [3, 12]]), n=10)
    with pytest.raises(ValueError, match=r"edge \(3, -1\) names vertex -1: vertex ids must be >= 0"):
        Graph.from_edges([0, 3], [1, -1])
    with pytest.raises(ValueError, match="names vertex 12 but n=10"):
        as_graph(np.array([[3, 12]]), n=10)
    with pytest.raises(ValueError, match=r"largest vertex id is 2147483648.*too large for int32"):
        Graph.from_edges(np.array([[0, 2**31]]))


def test_type_and_shape_errors():
    with pytest.raises(TypeError, match="u has dtype float64, not an integer dtype"):
        Graph.from_edges(np.array([0.0, 1.0]), np.array([1, 2]))
    with pytest.raises(TypeError, match=r"from_edges\(u\) has dtype float64"):
        Graph.from_edges(np.array([[0.0, 1.0]]))
    with pytest.raises(TypeError, match="bool"):
        Graph.from_edges(np.array([[True, False]]))
    with pytest.raises(ValueError, match=r"must be a \(k, 2\) array of edges, got shape \(3,\)"):
        Graph.from_edges(np.array([0, 1, 2]))
    with pytest.raises(ValueError, match=r"must be a \(k, 2\) array of edges, got shape \(2, 3\)"):
        Graph.from_edges(np.array([[0, 1, 2], [1, 2, 3]]))
    with pytest.raises(ValueError, match=r"u and v must be 1-D arrays of one length"):
        Graph.from_edges([0, 1], [1, 2, 3])
    with pytest.raises(TypeError, match=r"cannot make a graph from list; pass a Graph, a "
                                        r"scipy\.sparse matrix"):
        as_graph([[0, 1]])
    with pytest.raises(TypeError, match="cannot make a graph from dict"):
        as_graph({0: [1]})
    with pytest.raises(ValueError, match=r"edge list of shape \(k, 2\), got shape \(3, 3\).*"
                                         r"scipy\.sparse\.csr_array\(A\)"):
        as_graph(np.zeros((3, 3), dtype=np.int64))
    with pytest.raises(TypeError, match="the edge array has dtype float64"):
        as_graph(np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"must be square, got shape \(2, 3\)"):
        as_graph(sp.csr_array((2, 3)))
    with pytest.raises(ValueError, match="n=4 but the matrix is 3 x 3"):
        as_graph(sp.csr_array((3, 3)), n=4)


def test_size_limits():
    with pytest.raises(ValueError, match=r"n=2147483648 is too large for int32 ids"):
        Graph.from_edges([0], [1], n=2**31)
    with pytest.raises(ValueError, match=r"n=2147483648 is too large for int32 ids"):
        grid2d(2**16, 2**15)
    with pytest.raises(ValueError, match=r"m=1073741824 edges .* too large for int32 ids"):
        erdos_renyi(100_000, 2**30)
    with pytest.raises(ValueError, match=r"too large for int32 ids"):
        random_local(2**28, 8)
    with pytest.raises(ValueError, match="n=-1 must be >= 0"):
        erdos_renyi(-1, 0)
    with pytest.raises(TypeError, match="n=2.5 must be an int"):
        Graph.from_edges([0], [1], n=2.5)


def test_from_csr_errors():
    with pytest.raises(ValueError, match=r"indptr has shape \(3,\) but n \+ 1 = 4"):
        Graph.from_csr([0, 1, 2], [1, 0], 3)
    with pytest.raises(ValueError, match=r"indptr\[0\] = 1 must be 0"):
        Graph.from_csr([1, 1, 2], [1, 0], 2)
    with pytest.raises(ValueError, match=r"indptr decreases at row 1 \(indptr\[1\] = 2 > indptr\[2\] = 1\)"):
        Graph.from_csr([0, 2, 1], [1, 0], 2)
    with pytest.raises(ValueError, match=r"indptr\[-1\] = 2 but indices has 3 entries"):
        Graph.from_csr([0, 1, 2], [1, 0, 0], 2)
    with pytest.raises(ValueError, match=r"row 1 names vertex 5 but n=2"):
        Graph.from_csr([0, 1, 2], [1, 5], 2)
    with pytest.raises(ValueError, match=r"row 1 names vertex 4294967296 but n=2"):
        Graph.from_csr([0, 1, 2], np.array([1, 2**32]), 2)
    with pytest.raises(ValueError, match=r"row 0 is not sorted ascending or has a duplicate"):
        Graph.from_csr([0, 2, 3, 4], [2, 1, 0, 0], 3)
    with pytest.raises(ValueError, match=r"row 0 is not sorted ascending or has a duplicate"):
        Graph.from_csr([0, 2, 4], [1, 1, 0, 0], 2)
    with pytest.raises(TypeError, match="indices has dtype float64"):
        Graph.from_csr([0, 1, 2], [1.0, 0.0], 2)
    # trusted and broken: caught when the edge index is built
    G = Graph.from_csr([0, 1, 1], [1], 2, validate=False)
    with pytest.raises(ValueError, match=r"entry \(0, 1\) has no \(1, 0\)"):
        G.edges
    # trusted, but what the kernels' reads rest on is checked (they read out of bounds)
    for args, match in ((([0], [], 3_000_000), "indptr has shape"),
                        (([0, 2], [], 1), "indptr must rise from 0 to len"),
                        (([0, 2, 1], [1, 0], 2), "indptr must rise from 0 to len"),
                        (([0, 1, 1], [5], 2), r"indices must be vertex ids in 0\.\.1"),
                        (([0, 1, 1], [-1], 2), r"indices must be vertex ids")):
        with pytest.raises(ValueError, match=match):
            Graph.from_csr(*(np.asarray(a, np.int64) for a in args[:2]), args[2],
                           validate=False)


def test_check_finds_corruption():
    G = erdos_renyi(50, 200, seed=0)
    G._check()
    G.indices[3], G.indices[4] = G.indices[4], G.indices[3]
    with pytest.raises(AssertionError, match="not increasing"):
        G._check()
    H = erdos_renyi(50, 200, seed=0)
    H.__dict__["edge_ids"] = H.edge_ids[::-1].copy()
    with pytest.raises(AssertionError, match="cached edges / edge_ids differ"):
        H._check()


def test_generator_argument_errors():
    with pytest.raises(ValueError, match=r"m=11 exceeds the n\(n-1\)/2 = 10 possible edges"):
        erdos_renyi(5, 11)
    with pytest.raises(ValueError, match="m=-1 must be >= 0"):
        erdos_renyi(5, -1)
    with pytest.raises(TypeError, match="seed='x' is not usable"):
        erdos_renyi(5, 2, seed="x")
    with pytest.raises(ValueError, match="n=1 leaves no other vertex"):
        random_local(1, 3)
    with pytest.raises(ValueError, match="dim=0 must be >= 1"):
        random_local(10, 3, dim=0)
    with pytest.raises(ValueError, match="degree=-2 must be >= 0"):
        random_local(10, -2)
    with pytest.raises(ValueError, match=r"a > 0, b \+ c > 0 and a \+ b \+ c <= 1"):
        rmat(16, 10, a=0.5, b=0.3, c=0.3)
    with pytest.raises(ValueError, match=r"a > 0, b \+ c > 0"):
        rmat(16, 10, a=0.5, b=0.0, c=0.0)
    with pytest.raises(ValueError, match=r"b=-0.1 must be a probability in \[0, 1\]"):
        rmat(16, 10, b=-0.1)
    with pytest.raises(ValueError, match=r"m=200 exceeds the n\(n-1\)/2 = 120"):
        rmat(16, 200)
    with pytest.raises(ValueError, match="only .* of m=.* edges are distinct; R-MAT concentrates"):
        rmat(64, 2016, a=0.9, b=0.05, c=0.05, seed=0)
    with pytest.raises(ValueError, match="rows=0 must be >= 1"):
        grid2d(0, 3)
    with pytest.raises(TypeError, match="z=2.0 must be an int"):
        grid3d(2, 2, 2.0)


def test_bools_and_flags_are_checked(tmp_path):
    """A bool is no count (True was 1 vertex, 1 edge, 1 dimension) and a flag takes only
    True/False ("no" built a torus, read ids as one-based, permuted); a negative seed
    is a ValueError."""
    for call, words in ((lambda: erdos_renyi(True, 0), "n=True must be an int"),
                        (lambda: erdos_renyi(5, True), "m=True must be an int"),
                        (lambda: grid2d(True, 3), "rows=True must be an int"),
                        (lambda: random_local(5, 2, dim=True), "dim=True must be an int"),
                        (lambda: erdos_renyi(5, 2, seed=True), "seed=True is not usable"),
                        (lambda: Graph.from_edges(np.array([[0, 1]]), n=True),
                         "n=True must be an int"),
                        (lambda: grid2d(3, 3, periodic="no"), "periodic='no' must be True"),
                        (lambda: rmat(16, 10, permute="yes"), "permute='yes' must be True"),
                        (lambda: rmat(16, 10, a=True), "a=True must be a probability")):
        with pytest.raises((TypeError, ValueError), match=words):
            call()
    p = tmp_path / "e.txt"
    p.write_text("1 2\n2 3\n")
    with pytest.raises(TypeError, match="one_based='no' must be True or False"):
        read_edgelist(p, one_based="no")
    with pytest.raises(ValueError, match="seed=-1 must be >= 0"):
        erdos_renyi(5, 2, seed=-1)
    assert grid2d(3, 3, periodic=np.True_).m == 18      # numpy's bools are bools


# ---------------------------------------------------------------- generators
@pytest.mark.parametrize("n,m", [(2, 1), (10, 20), (10, 45), (300, 2000), (1000, 1000)])
def test_erdos_renyi_exact_m(n, m):
    G = erdos_renyi(n, m, seed=1)
    E = G.edges
    assert G.m == m and E.shape == (m, 2)
    assert (E[:, 0] < E[:, 1]).all() and len(edge_set(E.tolist())) == m
    assert_matches(G, edge_set(E.tolist()), n)


def test_erdos_renyi_seeds():
    a = erdos_renyi(2000, 5000, seed=7)
    b = erdos_renyi(2000, 5000, seed=7)
    c = erdos_renyi(2000, 5000, seed=8)
    assert np.array_equal(a.edges, b.edges) and np.array_equal(a.indices, b.indices)
    assert not np.array_equal(a.edges, c.edges)
    g1 = erdos_renyi(2000, 5000, seed=np.random.default_rng(3))
    g2 = erdos_renyi(2000, 5000, seed=np.random.default_rng(3))
    assert np.array_equal(g1.edges, g2.edges)
    assert erdos_renyi(2000, 5000).m == 5000                  # seed=None works


@pytest.mark.parametrize("m", [3, 7])                           # sparse path, dense path
def test_erdos_renyi_uniform_over_edge_sets(m):
    """All C(10, m) = 120 graphs of G(5, m) equally likely: a chi-square test over 3600
    fixed seeds, against the 1e-6 upper quantile (deterministic, so never flaky)."""
    counts = Counter(tuple(map(tuple, erdos_renyi(5, m, seed=s).edges.tolist()))
                     for s in range(3600))
    assert len(counts) <= 120
    expected = 3600 / 120
    stat = sum((counts.get(k, 0) - expected) ** 2 / expected
               for k in itertools.combinations(itertools.combinations(range(5), 2), m))
    limit = chi2.isf(1e-6, 119)
    assert stat < limit, f"chi-square {stat:.1f} >= {limit:.1f} (p < 1e-6): not uniform"


def test_random_local_size_and_locality():
    n, degree = 20_000, 10
    G = random_local(n, degree, seed=3)
    G._check()
    assert 0.9 * n * degree <= G.m <= n * degree, f"m={G.m} not within 90-100% of n*degree"
    d = np.abs(G.edges[:, 1].astype(np.int64) - G.edges[:, 0])
    circular = np.minimum(d, n - d)
    med = float(np.median(circular))
    assert med < n / 100, f"median circular distance {med} >= n/100 = {n / 100}"
    assert np.median(d) < n / 4
    # heavy tail: some long edges too (p grows by dim bits with probability 1/2 each time)
    assert circular.max() > n / 10
    # every vertex drew `degree` edges (merged duplicates aside), so none is isolated
    assert G.degree().min() >= 1
    H = random_local(n, degree, seed=3)
    assert np.array_equal(G.indices, H.indices)
    assert not np.array_equal(G.indices, random_local(n, degree, seed=4).indices)
    assert random_local(5, 0, seed=0).m == 0


def test_random_local_dimension_spreads_edges():
    """Higher dim -> longer edges (p starts at dim + 2 and grows in steps of dim)."""
    meds = []
    for dim in (1, 3, 6):
        E = random_local(50_000, 4, seed=0, dim=dim).edges
        d = E[:, 1].astype(np.int64) - E[:, 0]
        meds.append(np.median(np.minimum(d, 50_000 - d)))
    assert meds[0] < meds[1] < meds[2], meds


def test_rmat_skewed_and_exact():
    n, m = 2**14, 100_000
    R = rmat(n, m, seed=0)
    R._check()
    assert R.m == m
    E = erdos_renyi(n, m, seed=0)
    dr, de = R.degree(), E.degree()
    assert dr.mean() == pytest.approx(de.mean())
    assert dr.max() > 30 * dr.mean(), f"R-MAT max degree {dr.max()} not >> mean {dr.mean():.1f}"
    assert de.max() < 4 * de.mean(), f"G(n, m) max degree {de.max()} vs mean {de.mean():.1f}"
    assert (dr == 0).sum() > 10 * max(1, (de == 0).sum())     # many isolated vertices too
    # without permute, low ids carry the weight (quadrant a = both top bits 0)
    assert dr[: n // 2].sum() > 2 * dr[n // 2:].sum()
    assert np.array_equal(rmat(n, m, seed=0).edges, R.edges)
    assert not np.array_equal(rmat(n, m, seed=1).edges, R.edges)


def test_rmat_not_power_of_two_and_permute():
    n = 1000                                       # 10 bits: ids 1000..1023 must not appear
    R = rmat(n, 5000, seed=2)
    assert R.n == n and R.m == 5000 and R.edges.max() < n
    R._check()
    P = rmat(n, 5000, seed=2, permute=True)
    P._check()
    assert P.m == 5000
    assert sorted(P.degree().tolist()) == sorted(R.degree().tolist())
    assert not np.array_equal(P.degree(), R.degree())
    # a, b, c are used: a less skewed R-MAT has a lower maximum degree
    flat = rmat(n, 5000, a=0.25, b=0.25, c=0.25, seed=2)
    assert flat.degree().max() < R.degree().max()
    # (a, b, c) that give (almost) only self loops are refused, not redrawn forever
    for n_, abc in ((4, (0.9, 1e-11, 0.0)), (1 << 20, (0.9, 1e-9, 1e-9))):
        with pytest.raises(ValueError, match="almost only self loops"):
            rmat(n_, 1, a=abc[0], b=abc[1], c=abc[2], seed=0)


@pytest.mark.parametrize("rows,cols", [(1, 1), (1, 5), (5, 1), (2, 2), (2, 3), (3, 3), (4, 7)])
@pytest.mark.parametrize("periodic", [False, True])
def test_grid2d_exact(rows, cols, periodic):
    G = grid2d(rows, cols, periodic=periodic)
    oracle = grid_oracle((rows, cols), periodic)
    assert_matches(G, oracle, rows * cols)
    if not periodic:
        assert G.m == rows * (cols - 1) + cols * (rows - 1)
    elif rows >= 3 and cols >= 3:
        assert G.m == 2 * rows * cols


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 4), (3, 3, 3), (1, 4, 5), (4, 2, 3)])
@pytest.mark.parametrize("periodic", [False, True])
def test_grid3d_exact(shape, periodic):
    x, y, z = shape
    G = grid3d(x, y, z, periodic=periodic)
    assert_matches(G, grid_oracle(shape, periodic), x * y * z)
    if not periodic:
        assert G.m == (x - 1) * y * z + x * (y - 1) * z + x * y * (z - 1)
    elif min(shape) >= 3:
        assert G.m == 3 * x * y * z


def test_grid_neighbours_by_hand():
    G = grid2d(3, 4)                     # vertex r*4 + c
    assert G.neighbors(5).tolist() == [1, 4, 6, 9]
    assert G.neighbors(0).tolist() == [1, 4]
    T = grid2d(3, 4, periodic=True)
    assert T.neighbors(0).tolist() == [1, 3, 4, 8]
    C = grid3d(3, 3, 3)                  # vertex (i*3 + j)*3 + k
    assert C.neighbors(13).tolist() == [4, 10, 12, 14, 16, 22]
    assert grid3d(3, 3, 3, periodic=True).neighbors(0).tolist() == [1, 2, 3, 6, 9, 18]


def test_large_smoke():
    """One larger graph through the Numba paths, checked in bulk with numpy/scipy."""
    n, m = 200_000, 1_000_000
    G = erdos_renyi(n, m, seed=123)
    assert G.m == m and G.degree().sum() == 2 * m
    E = G.edges.astype(np.int64)
    assert (E[:, 0] < E[:, 1]).all()
    key = E[:, 0] * n + E[:, 1]
    assert (np.diff(key) > 0).all()                 # strictly lexicographic: distinct
    A = G.to_scipy()
    assert (A != A.T).nnz == 0 and A.diagonal().sum() == 0
    ref = sp.coo_array((np.ones(m), (E[:, 0], E[:, 1])), shape=(n, n)).tocsr()
    ref = (ref + ref.T).tocsr()
    ref.sort_indices()
    assert np.array_equal(ref.indptr, G.indptr) and np.array_equal(ref.indices, G.indices)
    rows = np.repeat(np.arange(n), np.diff(G.indptr))
    ends = G.edges[G.edge_ids]
    assert ((ends[:, 0] == rows) & (ends[:, 1] == G.indices)
            | (ends[:, 1] == rows) & (ends[:, 0] == G.indices)).all()
    H = as_graph(A)
    assert np.array_equal(H.edge_ids, G.edge_ids) and np.array_equal(H.edges, G.edges)
    L = random_local(n, 5, seed=1)
    assert 0.9 * 5 * n <= L.m <= 5 * n
    R = rmat(2**17, m, seed=1)
    assert R.m == m and R.degree().sum() == 2 * m


@pytest.mark.parametrize("seed", range(6))
def test_symmetry_witness_is_the_mirror_of_a_removed_entry(seed):
    rng = np.random.default_rng(seed)
    u, v = random_edge_list(rng, 40, 150)
    A = Graph.from_edges(u, v, n=40).to_scipy().tocoo()
    drop = int(rng.integers(A.nnz))
    a, b = int(A.row[drop]), int(A.col[drop])
    keep = np.arange(A.nnz) != drop
    B = sp.coo_array((A.data[keep], (A.row[keep], A.col[keep])), shape=A.shape)
    with pytest.raises(ValueError, match=rf"entry \({b}, {a}\) has no \({a}, {b}\)"):
        as_graph(B)
