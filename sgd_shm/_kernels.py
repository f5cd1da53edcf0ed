"""Numba kernels for Hogwild SGD on linear models (private; see sgd_shm.hogwild).

One worker's share of one epoch: it walks its slice of a shuffled index array
and, for every sample, updates all K linear outputs (K = 1 for binary or
regression, K = n_classes for one-vs-rest) of a weight matrix it shares with
the other workers, without locks (Hogwild!, Niu, Recht, Ré, Wright 2011).

Regularisation without per-feature timestamps (which race under Hogwild and
decay popular features twice, see shared/FACTS.md):

* L2 through a weight scale, w = s·v (Bottou's trick, as in scikit-learn's
  ``_sgd_fast``): a step multiplies s by (1 − η·α₂) and touches only the
  sample's nonzeros in v. Each worker derives its own s from its own step count:
  one of its steps stands for ``n_workers`` global steps, so s ← s·(1 − η·α₂)^n.
  No shared word is written for it; the driver folds the exact global product
  into v between epochs.
* L1 through cumulative penalties (Tsuruoka, Tsujii, Ananiadou 2009): u is the
  total penalty any weight could have received (per-worker estimate as above),
  q[c, j] the penalty weight j actually received; weights are clipped at zero.
  q is shared and updated without locks: an intended Hogwild race (a lost
  update of q only mis-sizes one later clip).

Learning rates: constant η₀; inverse scaling η₀ / t^power_t; "optimal"
1 / (α·(t₀ + t)) with Bottou's t₀ heuristic (see ``optimal_t0``). t is the
global sample count, estimated by each worker as t_start + n_workers·k.

Kernels raise nothing: a non-finite prediction sets ``out[2] = 1`` and returns;
the Python driver raises.
"""
from __future__ import annotations

import math

import numba as nb
import numpy as np

from sgd_shm._prefetch import DISTANCE, prefetch

# loss codes
LOG, HINGE, SQUARED, MODIFIED_HUBER = 0, 1, 2, 3
LOSSES = {"log_loss": LOG, "hinge": HINGE, "squared_error": SQUARED,
          "modified_huber": MODIFIED_HUBER}
# learning-rate codes
CONSTANT, OPTIMAL, INVSCALING = 0, 1, 2
LEARNING_RATES = {"constant": CONSTANT, "optimal": OPTIMAL, "invscaling": INVSCALING}

# float parameter slots
F_ETA0, F_ALPHA2, F_ALPHA1, F_POWER_T, F_T0, F_T_START, F_NW, F_ICPT_DECAY, F_U0 = range(9)
N_FPARAMS = 9
# int parameter slots
I_LOSS, I_LR, I_FIT_ICPT = range(3)
N_IPARAMS = 3
# out slots
O_LOSS, O_STEPS, O_DIVERGED, O_SCALE, O_U, O_CLIPS = range(6)
N_OUT = 6
#: samples between publications of a worker's intercept steps (see _run)
INTERCEPT_FLUSH = 32
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
def _eta(lr, eta0, alpha, power_t, t0, t):
    if lr == CONSTANT:
        return eta0
    if lr == OPTIMAL:
        return 1.0 / (alpha * (t0 + t - 1.0))
    return eta0 / t ** power_t


@nb.njit(cache=True, nogil=True)
def _run(W, b, q, cols_all, indptr, indices, data, X, Y, sw, order, lo, hi, fp, ip, out):
    """Shared body of the sparse (X has 0 rows) and dense (indptr is empty) kernels."""
    K = W.shape[0]
    loss = ip[I_LOSS]
    lr = ip[I_LR]
    fit_icpt = ip[I_FIT_ICPT]
    eta0 = fp[F_ETA0]
    a2 = fp[F_ALPHA2]
    a1 = fp[F_ALPHA1]
    power_t = fp[F_POWER_T]
    t0 = fp[F_T0]
    t_start = fp[F_T_START]
    nw = fp[F_NW]
    nw_int = int(nw)
    icpt_decay = fp[F_ICPT_DECAY]
    u = fp[F_U0]
    alpha = a2 + a1
    dense = indptr.shape[0] == 0
    s = 1.0
    loss_sum = 0.0
    g = np.empty(K)
    # the intercept is one word every sample writes: each worker adds its steps to a
    # private delta (used in its own predictions) and publishes it every FLUSH
    # samples, so the line is not bounced between cores on every step
    db = np.zeros(K)
    since_flush = 0
    d_feat = W.shape[1]
    for k in range(lo, hi):
        if k + DISTANCE < hi:                  # ask for a row ahead: reads are shuffled
            j = order[k + DISTANCE]
            if dense:
                p0 = j * d_feat
                p1 = p0 + d_feat
            else:
                p0 = indptr[j]
                p1 = indptr[j + 1]
            while p0 < p1:
                if dense:
                    prefetch(X, p0)
                else:
                    prefetch(data, p0)
                    prefetch(indices, p0)
                p0 += 8
        i = order[k]
        if dense:
            cols = cols_all
            vals = X[i]
        else:
            a = indptr[i]
            e = indptr[i + 1]
            cols = indices[a:e]
            vals = data[a:e]
        t = t_start + (k - lo) * nw + 1.0
        eta = _eta(lr, eta0, alpha, power_t, t0, t)
        wi = sw[i]
        any_step = False
        for c in range(K):
            p = 0.0
            for m in range(cols.shape[0]):
                p += W[c, cols[m]] * vals[m]
            p = p * s + b[c] + db[c]
            if not math.isfinite(p):
                out[O_DIVERGED] = 1.0
                for cc in range(K):
                    b[cc] += db[cc]
                out[O_LOSS] = loss_sum
                out[O_STEPS] = k - lo
                out[O_SCALE] = s
                return
            yc = Y[i, c]
            loss_sum += wi * _loss(loss, p, yc)
            d = _dloss(loss, p, yc)
            if d > MAX_DLOSS or d < -MAX_DLOSS:
                d = MAX_DLOSS if d > 0.0 else -MAX_DLOSS
                out[O_CLIPS] += 1.0
            g[c] = -eta * d * wi
            if g[c] != 0.0:
                any_step = True
        if a2 > 0.0:
            f = 1.0 - eta * a2
            if f <= 0.0:
                out[O_DIVERGED] = 2.0
                out[O_STEPS] = k - lo
                out[O_SCALE] = s
                return
            fn = f
            for _ in range(nw_int - 1):      # f ** n_workers without pow()
                fn *= f
            s *= fn
            if s < 1e-200:
                out[O_DIVERGED] = 2.0
                out[O_STEPS] = k - lo
                out[O_SCALE] = s
                return
        if any_step:
            inv_s = 1.0 / s
            for c in range(K):
                gc = g[c]
                if gc != 0.0:
                    step = gc * inv_s
                    for m in range(cols.shape[0]):
                        W[c, cols[m]] += step * vals[m]
                    if fit_icpt:
                        db[c] += gc * icpt_decay
            since_flush += 1
            if since_flush >= INTERCEPT_FLUSH:
                for c in range(K):
                    b[c] += db[c]
                    db[c] = 0.0
                since_flush = 0
        if a1 > 0.0:
            u += eta * a1 * nw
            for c in range(K):
                for m in range(cols.shape[0]):
                    j = cols[m]
                    z = W[c, j] * s
                    if z > 0.0:
                        w_new = max(0.0, z - (u + q[c, j]))
                    elif z < 0.0:
                        w_new = min(0.0, z + (u - q[c, j]))
                    else:
                        continue
                    W[c, j] = w_new / s
                    q[c, j] += w_new - z
    for c in range(K):
        b[c] += db[c]
    out[O_LOSS] = loss_sum
    out[O_STEPS] = hi - lo
    out[O_SCALE] = s
    out[O_U] = u


def optimal_t0(alpha: float, loss: int) -> float:
    """Bottou's heuristic for the 'optimal' schedule: pick t0 so that the first
    step size is about the one that suits a weight of typical size 1/sqrt(alpha)."""
    typw = math.sqrt(1.0 / math.sqrt(alpha))
    d = abs(float(_dloss(loss, -typw, 1.0)))
    eta_init = typw / max(1.0, d)
    return 1.0 / (eta_init * alpha)


def global_scale_and_u(fp, ip, n_steps):
    """Exact weight scale and L1 total after ``n_steps`` global steps from fp's t_start."""
    t = fp[F_T_START] + np.arange(1, n_steps + 1, dtype=np.float64)
    lr = int(ip[I_LR])
    alpha = fp[F_ALPHA2] + fp[F_ALPHA1]
    if lr == CONSTANT:
        eta = np.full(n_steps, fp[F_ETA0])
    elif lr == OPTIMAL:
        eta = 1.0 / (alpha * (fp[F_T0] + t - 1.0))
    else:
        eta = fp[F_ETA0] / t ** fp[F_POWER_T]
    scale = float(np.exp(np.sum(np.log1p(-eta * fp[F_ALPHA2])))) if fp[F_ALPHA2] > 0 else 1.0
    u = fp[F_U0] + float(np.sum(eta)) * fp[F_ALPHA1]
    return scale, u
