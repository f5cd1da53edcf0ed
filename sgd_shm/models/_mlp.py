"""Numba kernels of the multi-layer perceptron on flat weights (private; see
``sgd_shm.models`` for the interface and ``sgd_shm.hogwild.mlp`` for the estimator).

The network: ReLU hidden layers, a softmax output, cross-entropy loss and L2 of
strength ``alpha`` on the coefficient matrices (not the intercepts), with
scikit-learn's ``MLPClassifier`` conventions: layer l maps ``sizes[l]`` units to
``sizes[l + 1]`` by ``A @ W_l + b_l`` with ``W_l`` of shape (fan_in, fan_out), and a
minibatch of B rows has the loss ``mean cross-entropy + alpha/(2B) sum ||W_l||^2``.
The weights are one flat float64 vector: W_0 (row-major), b_0, W_1, b_1, ...

Backpropagation (Rumelhart, Hinton, Williams 1986) runs on caller-owned scratch
arrays with the matrix products in BLAS ``dgemm``, called from nogil code
through Numba's own BLAS entry point (the one behind ``np.dot`` in Numba, which
binds SciPy's BLAS), so a worker's whole epoch runs without the GIL and without
allocating. :func:`loss_grad` can compute the gradient of a range of the flat
vector only: the block-partitioned workers of Kungurtsev et al. (arXiv:1905.11845)
update one block per iteration, and a block in layer l needs the backward pass
down to layer l only, and the weight gradient of its own rows only.

Intended races (Hogwild, Niu et al. 2011): :func:`run_worker` reads the shared
weights while other workers write them, without locks; a read may mix old and new
values of a layer, which the asynchronous analyses of 1905.11845 allow for.
With ``owned`` blocks a worker writes only its own coordinates.
"""
import math
from typing import NamedTuple

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic
from numba.np.linalg import ensure_blas

ensure_blas()       # SciPy's BLAS is what Numba's matrix products call: a clear error if absent

# slots of a worker's report
O_LOSS, O_ITERS, O_DIVERGED = range(3)
N_OUT = 3


class Net(NamedTuple):
    """The architecture: where each layer's weights lie in the flat vector."""
    sizes: np.ndarray       # (L + 1,) int64 units: features, hidden layers..., outputs
    w_off: np.ndarray       # (L,) int64 start of W_l (sizes[l] x sizes[l + 1], row-major)
    b_off: np.ndarray       # (L,) int64 start of b_l (sizes[l + 1])
    alpha: float            # L2 strength on the W_l


class Data(NamedTuple):
    """The samples: dense rows in ``X`` (float32 or float64; ``indptr`` then is
    empty) or CSR rows (``X`` then has 0 rows), and class indices ``y``."""
    X: np.ndarray           # (n, d) dense rows, or (0, d)
    indptr: np.ndarray      # (n + 1,) int64 CSR row bounds, or empty
    indices: np.ndarray     # (nnz,) int64 feature ids
    values: np.ndarray      # (nnz,) float64
    y: np.ndarray           # (n,) int64 class index of each row


class Scratch(NamedTuple):
    """A worker's buffers for minibatches of up to B rows (see ``models.scratch``)."""
    act: np.ndarray         # activations of every layer, layer l at a_off[l], (B, sizes[l])
    a_off: np.ndarray       # (L + 1,) int64
    delta: np.ndarray       # (2, B * max(sizes[1:])) back-propagated errors, two in turn
    grad: np.ndarray        # (n_params,) the gradient (of the requested range only)


class Share(NamedTuple):
    """A worker's share of an epoch: the minibatches order[lo:hi] in slices of ``batch``."""
    order: np.ndarray       # (n,) int64 the rows of the epoch, in order
    lo: int
    hi: int
    batch: int


class Blocks(NamedTuple):
    """The blocks a worker owns under block partitioning (``owned`` empty: none, the
    worker steps every weight)."""
    bounds: np.ndarray      # block b is the flat range [bounds[b], bounds[b + 1])
    owned: np.ndarray       # (m,) int64 the worker's blocks; empty: no partitioning
    rng: np.ndarray         # uint64, rng[0]: the worker's splitmix64 state for its draws
    trace: np.ndarray       # int64: receives the block of each minibatch (if long enough)


class Step(NamedTuple):
    """One epoch's SGD step of a worker (scikit-learn's ``SGDOptimizer``)."""
    lr: float               # learning rate
    momentum: float         # 0: plain SGD
    nesterov: bool          # Nesterov's momentum (Sutskever et al. 2013), as scikit-learn


# ---- BLAS -----------------------------------------------------------------------------------
@intrinsic
def _xgemm(typingctx, ta, tb, m, n, k, alpha, a, aoff, lda, b, boff, ldb, beta, c, coff, ldc):
    """Column-major C = alpha op(A) op(B) + beta C by ``numba_xxgemm`` (Numba's
    helper around SciPy's ``dgemm``); each matrix is a float64 array and an element
    offset into it. Returns BLAS's status (0: done)."""
    sig = types.int32(ta, tb, m, n, k, alpha, a, aoff, lda, b, boff, ldb, beta, c, coff, ldc)

    def codegen(context, builder, signature, args):
        tys = signature.args
        i8 = ir.IntType(8)
        vp = i8.as_pointer()
        intp = context.get_value_type(types.intp)
        fnty = ir.FunctionType(ir.IntType(32), [i8, i8, i8, intp, intp, intp, vp, vp, intp,
                                                 vp, intp, vp, vp, intp])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "numba_xxgemm")

        def idx(i):
            return context.cast(builder, args[i], tys[i], types.intp)

        def ptr(i):
            arr = context.make_array(tys[i])(context, builder, args[i])
            return builder.bitcast(builder.gep(arr.data, [idx(i + 1)]), vp)

        def flag(i):
            nonzero = builder.icmp_signed("!=", idx(i), ir.Constant(intp, 0))
            return builder.select(nonzero, ir.Constant(i8, ord("t")), ir.Constant(i8, ord("n")))

        def scalar(i):
            v = context.cast(builder, args[i], tys[i], types.float64)
            return builder.bitcast(cgutils.alloca_once_value(builder, v), vp)
        return builder.call(fn, [ir.Constant(i8, ord("d")), flag(0), flag(1), idx(2), idx(3),
                                 idx(4), scalar(5), ptr(6), idx(8), ptr(9), idx(11), scalar(12),
                                 ptr(13), idx(15)])
    return sig, codegen


@nb.njit(cache=True, nogil=True)
def gemm(ta, tb, m, n, k, alpha, A, aoff, lda, B, boff, ldb, beta, C, coff, ldc):
    """Row-major C[m, n] = alpha op(A) op(B) + beta C on flat float64 arrays with
    element offsets and leading dimensions (row strides); op(X) = X.T when its
    flag is set. Column-major BLAS computes the transpose: C^T = op(B)^T op(A)^T."""
    return _xgemm(tb, ta, n, m, k, alpha, B, boff, ldb, A, aoff, lda, beta, C, coff, ldc)


# ---- forward and backward -------------------------------------------------------------------
@nb.njit(cache=True, nogil=True)
def _first_layer(net, data, rows, w, act):
    """Z_1 = X[rows] @ W_0 + b_0 into layer 1's activations; dense rows are first
    gathered (and converted to float64) into layer 0's."""
    nb_ = rows.shape[0]
    fi, fo = net.sizes[0], net.sizes[1]
    z = act[nb_ * fi:]                    # layer 1 starts after layer 0's nb_ x fi
    for i in range(nb_):
        for j in range(fo):
            z[i * fo + j] = w[net.b_off[0] + j]
    if data.indptr.shape[0] == 0:
        for i in range(nb_):
            r = rows[i]
            for j in range(fi):
                act[i * fi + j] = data.X[r, j]
        gemm(False, False, nb_, fo, fi, 1.0, act, 0, fi, w, net.w_off[0], fo, 1.0, act,
             nb_ * fi, fo)
        return
    for i in range(nb_):
        r = rows[i]
        for p in range(data.indptr[r], data.indptr[r + 1]):
            v = data.values[p]
            base = net.w_off[0] + data.indices[p] * fo
            for j in range(fo):
                z[i * fo + j] += v * w[base + j]


@nb.njit(cache=True, nogil=True)
def _offsets(net, nb_, a_off):
    """a_off[l]: where layer l's activations of nb_ rows start (packed for nb_)."""
    pos = 0
    for l in range(net.sizes.shape[0]):
        a_off[l] = pos
        pos += nb_ * net.sizes[l]


@nb.njit(cache=True, nogil=True)
def forward(net, data, rows, w, scr):
    """The activations of rows through the network into ``scr.act`` (the last
    layer: softmax probabilities); returns the summed cross-entropy of the rows."""
    nb_ = rows.shape[0]
    L = net.sizes.shape[0] - 1
    act, a_off = scr.act, scr.a_off
    _offsets(net, nb_, a_off)
    _first_layer(net, data, rows, w, act)
    for l in range(1, L):
        fi, fo = net.sizes[l], net.sizes[l + 1]
        o = a_off[l]
        for i in range(nb_ * fi):                 # ReLU of layer l's pre-activations
            if act[o + i] < 0.0:
                act[o + i] = 0.0
        z = a_off[l + 1]
        for i in range(nb_):
            for j in range(fo):
                act[z + i * fo + j] = w[net.b_off[l] + j]
        gemm(False, False, nb_, fo, fi, 1.0, act, o, fi, w, net.w_off[l], fo, 1.0, act, z, fo)
    return _softmax_ce(act, a_off[L], nb_, net.sizes[L], data.y, rows)


@nb.njit(cache=True, nogil=True)
def _softmax_ce(act, o, nb_, k, y, rows):
    ce = 0.0
    for i in range(nb_):
        base = o + i * k
        m = act[base]
        for j in range(1, k):
            m = max(m, act[base + j])
        s = 0.0
        for j in range(k):
            e = math.exp(act[base + j] - m)
            act[base + j] = e
            s += e
        ce += math.log(s) - math.log(act[base + y[rows[i]]])
        for j in range(k):
            act[base + j] /= s
    return ce


@nb.njit(cache=True, nogil=True)
def _layer_of(net, pos):
    """The layer whose W or b holds flat position ``pos``."""
    L = net.sizes.shape[0] - 1
    for l in range(L - 1, -1, -1):
        if pos >= net.w_off[l]:
            return l
    return 0


@nb.njit(cache=True, nogil=True)
def _weight_grad(net, data, rows, w, scr, l, delta, glo, ghi):
    """Gradient of the rows of W_l and of b_l that lie in [glo, ghi), given the error
    ``delta`` (nb_ x fan_out) of layer l's output."""
    nb_ = rows.shape[0]
    fi, fo = net.sizes[l], net.sizes[l + 1]
    wo, bo = net.w_off[l], net.b_off[l]
    r0 = min(max(glo - wo, 0) // fo, fi)
    r1 = min(max(ghi - wo + fo - 1, 0) // fo, fi)
    g = scr.grad
    if r1 > r0:
        reg = net.alpha / nb_
        for p in range(wo + r0 * fo, wo + r1 * fo):
            g[p] = reg * w[p]
        if l > 0 or data.indptr.shape[0] == 0:
            gemm(True, False, r1 - r0, fo, nb_, 1.0, scr.act, scr.a_off[l] + r0, fi, delta, 0,
                 fo, 1.0, g, wo + r0 * fo, fo)
        else:
            for i in range(nb_):
                r = rows[i]
                for p in range(data.indptr[r], data.indptr[r + 1]):
                    c = data.indices[p]
                    if r0 <= c < r1:
                        v = data.values[p]
                        base = wo + c * fo
                        for j in range(fo):
                            g[base + j] += v * delta[i * fo + j]
    if glo <= bo and bo + fo <= ghi:
        for j in range(fo):
            g[bo + j] = 0.0
        for i in range(nb_):
            for j in range(fo):
                g[bo + j] += delta[i * fo + j]


@nb.njit(cache=True, nogil=True)
def backward(net, data, rows, w, scr, glo, ghi):
    """The gradient of the minibatch loss with respect to flat positions [glo, ghi)
    into ``scr.grad[glo:ghi]`` (nothing else of it is written), after
    :func:`forward` on the same rows. The range must start and end on a row of some
    W_l or on a b_l (``models.MLP.blocks`` makes such ranges); the backward pass
    stops at the lowest layer the range touches."""
    nb_ = rows.shape[0]
    L = net.sizes.shape[0] - 1
    low = _layer_of(net, glo)
    top = _layer_of(net, ghi - 1)
    k = net.sizes[L]
    cur = 0
    d = scr.delta[cur]
    o = scr.a_off[L]
    inv = 1.0 / nb_
    for i in range(nb_):                 # d loss / d z of the softmax layer: (P - Y) / B
        for j in range(k):
            d[i * k + j] = scr.act[o + i * k + j] * inv
        d[i * k + data.y[rows[i]]] -= inv
    for l in range(L - 1, low - 1, -1):
        if l <= top:
            _weight_grad(net, data, rows, w, scr, l, scr.delta[cur], glo, ghi)
        if l > low:                      # the error of layer l's input: (d @ W_l^T) * ReLU'
            fi, fo = net.sizes[l], net.sizes[l + 1]
            nxt = scr.delta[1 - cur]
            gemm(False, True, nb_, fi, fo, 1.0, scr.delta[cur], 0, fo, w, net.w_off[l], fo,
                 0.0, nxt, 0, fi)
            a = scr.a_off[l]
            for i in range(nb_ * fi):
                if scr.act[a + i] <= 0.0:
                    nxt[i] = 0.0
            cur = 1 - cur


@nb.njit(cache=True, nogil=True)
def penalty(net, w):
    """sum over layers of ||W_l||^2 (the intercepts are not penalised)."""
    s = 0.0
    for l in range(net.sizes.shape[0] - 1):
        for p in range(net.w_off[l], net.b_off[l]):
            s += w[p] * w[p]
    return s


@nb.njit(cache=True, nogil=True)
def loss_grad(net, data, rows, w, scr, glo, ghi):
    """The minibatch loss of ``rows`` (mean cross-entropy + alpha/(2B) sum ||W_l||^2)
    and its gradient on [glo, ghi) into ``scr.grad``."""
    ce = forward(net, data, rows, w, scr)
    backward(net, data, rows, w, scr, glo, ghi)
    nb_ = rows.shape[0]
    return ce / nb_ + 0.5 * net.alpha * penalty(net, w) / nb_


# ---- the worker's epoch ---------------------------------------------------------------------
@nb.njit(cache=True, nogil=True)
def _uniform(state):
    """A uniform in [0, 1) from a splitmix64 stream whose state is state[0]."""
    state[0] += np.uint64(0x9E3779B97F4A7C15)
    z = state[0]
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return float(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@nb.njit(cache=True, nogil=True)
def apply_step(w, V, g, lo, hi, step):
    """w[lo:hi] moves by one SGD step on g; with momentum mu the velocity V[lo:hi]
    becomes mu V - lr g and w moves by it, or with Nesterov by mu V - lr g again
    (scikit-learn's ``SGDOptimizer``). Plain stores: other workers may be reading."""
    lr, mu = step.lr, step.momentum
    if mu == 0.0:
        for p in range(lo, hi):
            w[p] -= lr * g[p]
        return
    for p in range(lo, hi):
        v = mu * V[p] - lr * g[p]
        V[p] = v
        if step.nesterov:
            w[p] += mu * v - lr * g[p]
        else:
            w[p] += v


@nb.njit(cache=True, nogil=True)
def _draw(blocks, it):
    """The flat range of the block a partitioned worker steps at its iteration ``it``:
    one of its blocks, uniformly (recorded in blocks.trace)."""
    m = blocks.owned.shape[0]
    b = blocks.owned[min(int(_uniform(blocks.rng) * m), m - 1)]
    if blocks.trace.shape[0] > it:
        blocks.trace[it] = b
    return blocks.bounds[b], blocks.bounds[b + 1]


@nb.njit(cache=True, nogil=True)
def run_worker(net, data, w, V, share, blocks, step, scr, out):
    """One worker's share of an epoch. Without owned blocks each minibatch steps
    every weight with the worker's velocity V; with them (block partitioning,
    1905.11845) each minibatch steps one of the worker's blocks, drawn uniformly,
    with momentum kept per block in V. ``out``: summed minibatch loss (times its
    rows), minibatches done, diverged flag."""
    n_params = w.shape[0]
    total = 0.0
    it = 0
    for start in range(share.lo, share.hi, share.batch):
        end = min(start + share.batch, share.hi)
        rows = share.order[start:end]
        glo, ghi = 0, n_params
        if blocks.owned.shape[0] > 0:
            glo, ghi = _draw(blocks, it)
        loss = loss_grad(net, data, rows, w, scr, glo, ghi)
        if not math.isfinite(loss):
            out[O_DIVERGED] = 1.0
            break
        total += loss * (end - start)
        apply_step(w, V, scr.grad, glo, ghi, step)
        it += 1
    out[O_LOSS] = total
    out[O_ITERS] = it
