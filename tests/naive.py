"""Slow, obviously correct reference implementations (the tests' oracles)."""
from __future__ import annotations

import bisect

import numpy as np
import threading


class NaivePQ:
    """An exact min-priority queue over a sorted list."""

    def __init__(self):
        self._items: list[tuple] = []

    def push(self, key, value):
        bisect.insort(self._items, (key, value))

    def pop(self):
        if not self._items:
            raise IndexError("pop from an empty NaivePQ")
        return self._items.pop(0)

    def __len__(self):
        return len(self._items)


def rank_errors(initial_keys, ops):
    """Rank error of each pop in a sequential history.

    initial_keys: keys present at the start. ops: ("push", key, ...) / ("pop", key, ...)
    in program order. The rank error of a pop is the number of keys present at
    that moment that are strictly smaller than the key it returned.
    """
    present = sorted(initial_keys)
    errors = []
    for op, key, *_ in ops:
        if op == "push":
            bisect.insort(present, key)
        else:
            i = bisect.bisect_left(present, key)
            if i == len(present) or present[i] != key:
                raise AssertionError(f"pop returned {key}, which is not in the queue")
            errors.append(i)
            del present[i]
    return errors


def delays(initial, ops):
    """Delay of each popped element: how many pops, while it was present, returned a
    strictly larger key. Elements are (key, value) pairs with unique values.
    initial: list of (key, value); ops: ("push"|"pop", key, value). Quadratic."""
    present = {v: [k, 0] for k, v in initial}
    out = []
    for op, key, value in ops:
        if op == "push":
            present[value] = [key, 0]
            continue
        k, d = present.pop(value)
        assert k == key, f"pop returned ({key}, {value}) but that value has key {k}"
        out.append(d)
        for item in present.values():
            if item[0] < key:
                item[1] += 1
    return out


class LockedCounter:
    """An exact counter behind a lock."""

    def __init__(self):
        self._n = 0
        self._lock = threading.Lock()

    def increment(self, k=1):
        with self._lock:
            self._n += k

    def value(self):
        return self._n


def record_orders(sgd):
    """The list that receives a copy of each epoch's order of samples of a
    ``sgd_shm.hogwild.HogwildSGD`` (for an oracle to replay them)."""
    orders, run = [], sgd.epoch

    def epoch(prob):
        loss = run(prob)
        orders.append(sgd._perm.copy())     # the workers shuffle it in place
        return loss
    sgd.epoch = epoch
    return orders


def serial_sgd_epoch(X, Y, order, W, b, *, loss, eta, alpha2=0.0, alpha1=0.0, u=0.0, q=None,
                     fit_intercept=True, t_start=0, l1_all_features=False, momentum=0.0, V=None):
    """One plain serial SGD epoch on dense X (no weight-scale trick, no Numba):
    for each sample, compute the predictions, decay W by (1 - eta*alpha2), step
    along the gradient, then apply the cumulative L1 penalty (Tsuruoka et al. 2009)
    to the sample's nonzero features (to every feature with ``l1_all_features``, as
    for dense rows). eta(t) gives the step size at global step t. With ``momentum``,
    heavy ball on the same features: V = momentum·V + g·x, W += V (V updated in place).
    Returns (W, b, u); W, b and q are updated in place."""
    import math
    n_out = W.shape[0]
    for k, i in enumerate(order):
        t = t_start + k + 1
        e = eta(t)
        x = X[i]
        d = []
        for c in range(n_out):
            p = float(x @ W[c] + b[c])
            y = Y[i, c]
            if loss == "log_loss":
                d.append(-y / (math.exp(p * y) + 1.0))
            elif loss == "hinge":
                d.append(-y if p * y < 1.0 else 0.0)
            else:
                d.append(p - y)
        W *= (1.0 - e * alpha2)
        feats = np.arange(len(x)) if l1_all_features else np.flatnonzero(x)
        for c in range(n_out):
            if momentum > 0:
                V[c, feats] = momentum * V[c, feats] - e * d[c] * x[feats]
                W[c, feats] += V[c, feats]
            else:
                W[c] -= e * d[c] * x
            if fit_intercept:
                b[c] -= e * d[c]
        if alpha1 > 0:
            u += e * alpha1
            for c in range(n_out):
                for j in (range(len(x)) if l1_all_features else np.flatnonzero(x)):
                    z = W[c, j]
                    if z > 0:
                        w_new = max(0.0, z - (u + q[c, j]))
                    elif z < 0:
                        w_new = min(0.0, z + (u - q[c, j]))
                    else:
                        continue
                    W[c, j] = w_new
                    q[c, j] += w_new - z
    return W, b, u


def serial_mf_epoch(users, items, ratings, order, P, Q, bu, bi, *, lr, reg, reg_bias, mu):
    """One serial SGD epoch of biased matrix factorization (Koren et al. 2009), plain
    Python: error against mu + bu + bi + P[u]·Q[i], then the usual regularised steps."""
    for n in order:
        u, i = users[n], items[n]
        e = ratings[n] - (mu + bu[u] + bi[i] + float(P[u] @ Q[i]))
        bu[u] += lr * (e - reg_bias * bu[u])
        bi[i] += lr * (e - reg_bias * bi[i])
        pu, qi = P[u].copy(), Q[i].copy()
        P[u] = pu + lr * (e * qi - reg * pu)
        Q[i] = qi + lr * (e * pu - reg * qi)
    return P, Q, bu, bi


# ---- greedy MIS / matching (independent of relaxed.graphs and relaxed.greedy) ----

def canonical_edges(edge_list):
    """The simple undirected edges of a list of pairs, as sorted (u, v) tuples, u < v."""
    return sorted({(min(u, v), max(u, v)) for u, v in edge_list if u != v})


def greedy_mis_naive(n, edge_list, priorities):
    """Sequential greedy MIS over sets: visit vertices by increasing priority and
    take each one with no neighbour taken. Returns a bool list."""
    adj = [set() for _ in range(n)]
    for u, v in edge_list:
        if u != v:
            adj[u].add(v)
            adj[v].add(u)
    taken = set()
    for v in sorted(range(n), key=lambda x: priorities[x]):
        if not (adj[v] & taken):
            taken.add(v)
    return [v in taken for v in range(n)]


def greedy_matching_naive(n, edges, priorities):
    """Sequential greedy matching: scan ``edges`` (a list of (u, v)) by increasing
    ``priorities[i]`` and take each edge whose ends are both free. Returns mate."""
    mate = [-1] * n
    for i in sorted(range(len(edges)), key=lambda x: priorities[x]):
        u, v = edges[i]
        if mate[u] == -1 and mate[v] == -1:
            mate[u], mate[v] = v, u
    return mate


def schedule_segments(etas, alpha2, min_scale=1e-9):
    """The L2 schedule by logs (the kit's first implementation): per segment
    (g0, g1, zero_first, scale after 0..L steps, cumulative step sizes). A
    segment ends before the step whose factor 1 - eta*alpha2 is <= 0 or would
    take the scale below min_scale (it keeps at least one step); a first step
    with factor <= 0 counts as 1 (the driver zeroes the weights instead)."""
    etas = np.asarray(etas, dtype=np.float64)
    n = etas.size
    with np.errstate(divide="ignore"):
        logf = (np.log(np.maximum(1.0 - etas * alpha2, 0.0)) if alpha2 > 0
                else np.zeros(n))
    out, g0 = [], 0
    while g0 < n:
        zero_first = bool(np.isneginf(logf[g0]))
        rest = logf[g0:].copy()
        if zero_first:
            rest[0] = 0.0
        rel = np.cumsum(rest)
        bad = np.flatnonzero((rel < np.log(min_scale)) | np.isneginf(rest))
        g1 = max(g0 + (int(bad[0]) if bad.size else n - g0), g0 + 1)
        lf = rest[:g1 - g0]
        scale = np.concatenate([[1.0], np.exp(np.cumsum(lf))])
        cum = np.concatenate([[0.0], np.cumsum(etas[g0:g1])])
        out.append((g0, g1, zero_first, scale, cum))
        g0 = g1
    return out


def delayed_sgd_naive(X, y, order, epochs, lr, alpha, tau, mu, squared):
    """Serial SGD whose step t uses the gradient at the weights of step
    max(t - tau, 0) (the bench's max-delay mode), heavy ball mu; returns the weights."""
    d = X.shape[1]
    past = [np.zeros(d)]                    # past[t] = weights before step t
    v = np.zeros(d)
    for _ in range(epochs):
        for i in order:
            ws = past[max(len(past) - 1 - tau, 0)]
            if squared:
                g = (X[i] @ ws - y[i]) * X[i] + alpha * ws
            else:
                g = -y[i] / (1.0 + np.exp(y[i] * (X[i] @ ws))) * X[i] + alpha * ws
            v = mu * v + g
            past.append(past[-1] - lr * v)
    return past[-1]


def partial_allreduce_naive(grads, masks, late):
    """What a sequence of (partial) allreduce rounds must produce.

    grads[k][r]: the vector rank k handed to round r; masks[r]: the contributor bit
    mask round r reported; late: "drop" or "carry". Replays the rounds serially: a
    rank accumulates what it hands in, a contributor sends its accumulation (with
    "drop" only the current vector) and starts again. Returns (sums, leftover):
    sums[r] is the exact result round r must have; leftover[k] what rank k still
    carries at the end (zeros with "drop")."""
    size = len(grads)
    n_rounds = len(masks)
    acc = [np.zeros_like(np.asarray(grads[k][0], dtype=np.float64)) for k in range(size)]
    sums = []
    for r in range(n_rounds):
        total = np.zeros_like(acc[0])
        for k in range(size):
            g = np.asarray(grads[k][r], dtype=np.float64)
            acc[k] = acc[k] + g if late == "carry" else g.copy()
            if (int(masks[r]) >> k) & 1:
                total = total + acc[k]
                acc[k] = np.zeros_like(acc[k])
        sums.append(total)
    leftover = acc if late == "carry" else [np.zeros_like(a) for a in acc]
    return sums, leftover


def _at(lr, t):
    """The step at t of ``lr``: a number, or a function of t."""
    return lr(t) if callable(lr) else lr


def data_parallel_sgd_naive(X, y, batches, lr, alpha, momentum=0.0):
    """Synchronous data-parallel SGD of L2-regularised logistic regression, serially:
    ``batches[t]`` is the list of P row-index arrays of step t (one per rank); every
    step applies w -= lr * mean over ranks of (mean log-loss gradient of the rank's
    rows + alpha w); ``lr``: a number, or a function of t. With ``momentum``, heavy
    ball: v = momentum * v - lr(t) * mean, w += v. y in {-1, +1}. Returns the
    weights."""
    X = np.asarray(X.todense()) if hasattr(X, "todense") else np.asarray(X, dtype=float)
    w = np.zeros(X.shape[1])
    v = np.zeros_like(w)
    for t, step in enumerate(batches):
        total = np.zeros_like(w)
        for rows in step:
            Xb, yb = X[rows], y[rows]
            z = yb * (Xb @ w)
            dl = -yb / (1.0 + np.exp(z))
            total += Xb.T @ dl / len(rows) + alpha * w
        v = momentum * v - _at(lr, t) * total / len(step)
        w = w + v
    return w


def topk_feedback_sgd_naive(X, y, batches, lr, alpha, k):
    """Synchronous data-parallel SGD as :func:`data_parallel_sgd_naive`, where each
    rank sends only the k largest entries of (its gradient + its residual) and keeps
    the rest as its residual (TopK with error feedback, Alistarh et al. 2018); every
    step applies w -= lr * (sum of the ranks' sparse messages) / P."""
    X = np.asarray(X.todense()) if hasattr(X, "todense") else np.asarray(X, dtype=float)
    w = np.zeros(X.shape[1])
    residual = [np.zeros_like(w) for _ in batches[0]]
    for step in batches:
        total = np.zeros_like(w)
        for r, rows in enumerate(step):
            Xb, yb = X[rows], y[rows]
            dl = -yb / (1.0 + np.exp(yb * (Xb @ w)))
            acc = residual[r] + (Xb.T @ dl / len(rows) + alpha * w)
            idx = topk_naive(acc, k)
            total[idx] += acc[idx]
            residual[r] = acc.copy()
            residual[r][idx] = 0.0
        w = w - lr * total / len(step)
    return w


def topk_naive(g, k):
    """Indices of the k largest |g| (ties: lower index first), ascending."""
    order = sorted(range(len(g)), key=lambda i: (-abs(float(g[i])), i))
    return np.array(sorted(order[:k]), dtype=np.int64)


def model_averaging_naive(X, y, rows, lr, alpha, bounds, up=None, down=None):
    """Synchronous model averaging through block servers (the RPS round of Yu et al.,
    ICML 2019), serially, for L2-regularised logistic regression (y in {-1, +1}).

    ``rows[t][k]``: the row indices of worker k's minibatch in round t; ``bounds``:
    server j owns weights bounds[j]:bounds[j + 1]; ``up[t, k, j]`` / ``down[t, k, j]``
    (bool, default all True): worker k's block j reached server j / server j's answer
    reached worker k in round t. Every replica starts at zeros. A round: each worker
    steps x_k -= lr * (mean log-loss gradient of its rows at x_k + alpha x_k) (``lr``: a
    number, or a function of t); server
    j sums the blocks it received in worker order and divides by their count (it
    keeps its last average when it received none, and then sends nothing); a worker
    takes block j of the average where the answer reached it and keeps its own
    otherwise. ``rows[t][k]`` None: worker k takes no part in round t (no step, no
    block sent, no answer). Returns (the servers' model, the replicas)."""
    X = np.asarray(X.todense()) if hasattr(X, "todense") else np.asarray(X, dtype=float)
    n_rounds, n = len(rows), len(rows[0])
    S = len(bounds) - 1
    up = np.ones((n_rounds, n, S), bool) if up is None else np.array(up, bool)
    down = np.ones((n_rounds, n, S), bool) if down is None else np.array(down, bool)
    xs = [np.zeros(X.shape[1]) for _ in range(n)]
    server = np.zeros(X.shape[1])
    for t in range(n_rounds):
        step = _at(lr, t)
        gone = [rows[t][k] is None for k in range(n)]
        up[t, gone], down[t, gone] = False, False
        for k in range(n):
            if gone[k]:
                continue
            Xb, yb = X[rows[t][k]], y[rows[t][k]]
            dl = -yb / (1.0 + np.exp(yb * (Xb @ xs[k])))
            xs[k] = xs[k] - step * (Xb.T @ dl / len(yb) + alpha * xs[k])
        for j in range(S):
            lo, hi = bounds[j], bounds[j + 1]
            got = [k for k in range(n) if up[t, k, j]]
            if not got:
                continue
            total = xs[got[0]][lo:hi].copy()
            for k in got[1:]:
                total = total + xs[k][lo:hi]
            server[lo:hi] = total / len(got)
            for k in range(n):
                if down[t, k, j]:
                    xs[k][lo:hi] = server[lo:hi]
    return server, xs


def rounds_of_log(res, n):
    """A simulated run's logged pushes (``res``: its result) as rounds of n pushes:
    round t's row indices, one array per worker in worker order."""
    log, rounds = res.log, []
    for i in range(0, len(log["worker"]), n):
        step = {log["worker"][q]: res.batches.rows_of(log["partition"][q], log["batch"][q])
                for q in range(i, i + n)}
        rounds.append([step[k] for k in range(n)])
    return rounds


def rps_rounds_of_log(res, n):
    """A simulated RPS run's logged sends as rounds (a send's ``pulled`` column is its
    round): round t's row indices, one array per worker in worker order, None for a
    worker that sent nothing that round (it had died)."""
    log = res.log
    rounds = [[None] * n for _ in range(max(log["pulled"], default=-1) + 1)]
    for q, (t, k) in enumerate(zip(log["pulled"], log["worker"])):
        assert rounds[t][k] is None, "one send per worker and round"
        rounds[t][k] = res.batches.rows_of(log["partition"][q], log["batch"][q])
    return rounds


def model_averaging_of_log(X, y, res, n, S, p, seed, lr, alpha):
    """:func:`model_averaging_naive` on the rounds a simulated RPS run logged (``res``:
    its result; worker k's minibatch of round t from ``res.log`` and ``res.batches``)
    with the run's documented loss coins (``core.status.Losses`` of ``seed``, one
    draw per worker and round). Returns (the servers' model, up, down)."""
    from sgd_shm.core.status import Losses
    rows = rps_rounds_of_log(res, n)
    rounds = len(rows)
    coins = [Losses(p, seed, k, S) for k in range(n)]
    none = (np.zeros(S, bool), np.zeros(S, bool))      # a dead worker draws no coins
    draws = [[none if rows[t][k] is None else coins[k].draw() for k in range(n)]
             for t in range(rounds)]
    up = np.array([[d[k][0] for k in range(n)] for d in draws])
    down = np.array([[d[k][1] for k in range(n)] for d in draws])
    bounds = np.linspace(0, X.shape[1], S + 1).astype(np.int64)
    server, _ = model_averaging_naive(X, y, rows, lr, alpha, bounds, up, down)
    return server, up, down


def mlp_loss_grad_naive(coefs, intercepts, X, y, alpha):
    """The MLP minibatch loss and gradient by plain numpy, layer by layer: ReLU hidden
    layers, softmax output, loss = mean cross-entropy of the rows (y: class indices)
    + alpha / (2 n) * sum ||W_l||^2. Returns (loss, coef grads, intercept grads)."""
    X = np.asarray(X.todense()) if hasattr(X, "todense") else np.asarray(X, dtype=float)
    n = X.shape[0]
    acts = [X]
    for l, (W, b) in enumerate(zip(coefs, intercepts)):
        z = acts[-1] @ W + b
        acts.append(np.maximum(z, 0.0) if l < len(coefs) - 1 else z)
    z = acts[-1]
    logp = z - z.max(axis=1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(axis=1, keepdims=True))
    onehot = np.zeros_like(z)
    onehot[np.arange(n), y] = 1.0
    loss = -np.sum(logp * onehot) / n + 0.5 * alpha * sum(np.sum(W * W) for W in coefs) / n
    delta = (np.exp(logp) - onehot) / n
    gW, gb = [None] * len(coefs), [None] * len(coefs)
    for l in range(len(coefs) - 1, -1, -1):
        gW[l] = acts[l].T @ delta + alpha * coefs[l] / n
        gb[l] = delta.sum(axis=0)
        if l > 0:
            delta = (delta @ coefs[l].T) * (acts[l] > 0)
    return loss, gW, gb


def mlp_flat_naive(coefs, intercepts):
    """The flat weight vector of the kit's MLP: W_0 (row-major), b_0, W_1, b_1, ..."""
    return np.concatenate([p for W, b in zip(coefs, intercepts) for p in (W.ravel(), b)])


def mlp_unflat_naive(w, sizes):
    """Inverse of ``mlp_flat_naive`` for layer sizes (features, hidden..., outputs)."""
    coefs, intercepts, pos = [], [], 0
    for fi, fo in zip(sizes[:-1], sizes[1:]):
        coefs.append(np.array(w[pos:pos + fi * fo]).reshape(fi, fo))
        intercepts.append(np.array(w[pos + fi * fo:pos + fi * fo + fo]))
        pos += fi * fo + fo
    return coefs, intercepts


def mlp_sgd_naive(X, y, sizes, w, steps, lr, alpha, momentum=0.0, nesterov=True):
    """Serial minibatch SGD of the MLP on its flat weights ``w`` (copied), as
    scikit-learn's SGDOptimizer: ``steps`` is a list of (rows, (lo, hi)): the
    minibatch's full gradient (``mlp_loss_grad_naive``) is computed and only
    coordinates lo:hi move (one velocity vector v: v = mu v - lr g, w += v, or with
    Nesterov w += mu v - lr g). ``lr``: a number or one per step. Returns (w, the
    minibatch losses)."""
    w = np.array(w, dtype=float)
    v = np.zeros_like(w)
    losses = []
    for t, (rows, (lo, hi)) in enumerate(steps):
        eta = lr[t] if np.ndim(lr) else lr
        coefs, intercepts = mlp_unflat_naive(w, sizes)
        loss, gW, gb = mlp_loss_grad_naive(coefs, intercepts, X[rows], y[rows], alpha)
        g = mlp_flat_naive(gW, gb)[lo:hi]
        losses.append(loss)
        if momentum == 0:
            w[lo:hi] -= eta * g
            continue
        v[lo:hi] = momentum * v[lo:hi] - eta * g
        w[lo:hi] += momentum * v[lo:hi] - eta * g if nesterov else v[lo:hi]
    return w, losses


def fixed_gradient_model(g):
    """A sgd_shm Model whose every minibatch gradient is the vector ``g``: the
    closed-form tests of the parameter server (after k pushes the weights moved by
    exactly -lr * k * g). A user-defined Model, written against the contract only."""
    import scipy.sparse as sp

    from sgd_shm.models import Model

    g = np.ascontiguousarray(g, dtype=np.float64)

    class FixedGradient(Model):
        n_outputs = 2
        has_proba = False

        def __init__(self):
            self.n_features = self.n_params = g.shape[0]

        def init(self, rng):
            return np.zeros(self.n_params)

        def prepare(self, X, y=None):
            X = sp.csr_matrix(X) if sp.issparse(X) else np.asarray(X)
            n = X.shape[0]
            return (X, np.zeros(n, np.int64) if y is None else np.asarray(y))

        def n_rows(self, data):
            return data[1].shape[0]

        def loss_grad(self, w, data, rows, grad, block=None):
            grad[:] = g
            return 0.0

        def loss(self, w, data):
            return 0.0

        def decision_function(self, w, X):
            return np.asarray(X @ w).ravel()

        def predict(self, w, X):
            return (self.decision_function(w, X) > 0).astype(np.int64)

    return FixedGradient()


# ---- the simulator (sgd_shm.sim) ---------------------------------------------------------

def asp_order_naive(step_s, n_pushes):
    """The order of the pushes of an asynchronous parameter server whose worker k
    takes ``step_s[k]`` seconds per step (pull, gradient, push), with free messages:
    worker k pushes at step_s[k], then step_s[k] + step_s[k], ... (each time the
    previous one plus its step, as a clock adds them). Returns the first ``n_pushes``
    as (seconds, worker, pulled version), sorted by time (ties: lower worker first);
    a push's pulled version counts the pushes at or before its worker's previous
    push."""
    pushes = []
    per = max(1, n_pushes)
    for k, s in enumerate(step_s):
        t = 0.0
        for _ in range(per):
            t = t + s
            pushes.append((t, k))
    pushes.sort()
    pushes = pushes[:n_pushes]
    out, prev = [], {}
    for t, k in pushes:
        t0 = prev.get(k, 0.0)
        pulled = sum(1 for u, _ in pushes if u <= t0) if k in prev else 0
        out.append((t, k, pulled))
        prev[k] = t
    return out


def logistic_grad_naive(X, y, rows, w, alpha):
    """The L2-regularised log-loss gradient of ``rows`` at w (y in {-1, +1}): mean of
    -y x / (1 + exp(y x.w)) plus alpha w."""
    X = np.asarray(X.todense()) if hasattr(X, "todense") else np.asarray(X, dtype=float)
    Xb, yb = X[rows], y[rows]
    dl = -yb / (1.0 + np.exp(yb * (Xb @ w)))
    return Xb.T @ dl / len(rows) + alpha * w


# ---- torch models (sgd_shm.torch) --------------------------------------------------------
class _one_torch_thread:
    """torch on one thread for the block (restored after): a pool of spinning threads
    on a shared 2-core machine makes the oracles crawl."""

    def __init__(self, torch):
        self.torch = torch

    def __enter__(self):
        self.n = self.torch.get_num_threads()
        self.torch.set_num_threads(1)

    def __exit__(self, *exc):
        self.torch.set_num_threads(self.n)


def torch_sgd_naive(module, X, y, batches, *, lr, momentum=0.0, loss="cross_entropy"):
    """Serial ``torch.optim.SGD`` on (a copy of) ``module`` over the minibatches
    ``batches`` (arrays of row indices of X, y), the way a PyTorch user writes it:
    zero_grad, forward, loss, backward, step. ``lr``: a number, or a function of the
    step t, run by torch's own ``LambdaLR`` (stepped after each ``opt.step()``).
    Returns the final parameters as one flat float32 vector (in
    ``module.parameters()`` order)."""
    import copy

    import torch
    with _one_torch_thread(torch):
        net = copy.deepcopy(module).float().train()
        lr0 = _at(lr, 0)
        opt = torch.optim.SGD(net.parameters(), lr=lr0, momentum=momentum)
        sched = (torch.optim.lr_scheduler.LambdaLR(opt, lambda t: lr(t) / lr0)
                 if callable(lr) else None)
        f = getattr(torch.nn.functional, loss)
        Xt, yt = torch.from_numpy(np.ascontiguousarray(X, np.float32)), torch.from_numpy(
            np.asarray(y, np.int64))
        for rows in batches:
            idx = torch.from_numpy(np.asarray(rows, np.int64))
            opt.zero_grad()
            f(net(Xt[idx]), yt[idx]).backward()
            opt.step()
            if sched is not None:
                sched.step()
        return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()


# ---- DDP communication hooks (sgd_shm.torch.hooks) ---------------------------------------
def ddp_mean_naive(parts):
    """The mean over ranks of their (decoded) bucket vectors, in float64."""
    return np.sum([np.asarray(p, dtype=np.float64) for p in parts], axis=0) / len(parts)


def error_feedback_naive(inputs, sents):
    """Replay error feedback from a rank's gradients and the messages it sent: before
    step t the memory holds r_t (r_0 = 0); the compressor sees acc_t = r_t + g_t (in
    the gradients' own float type, as the memory adds them) and keeps r_{t+1} = acc_t -
    sent_t. Returns (the sum of the messages sent, in float64; [acc_t])."""
    resid = np.zeros_like(inputs[0])
    acc, total = [], np.zeros(inputs[0].shape, np.float64)
    for g, s in zip(inputs, sents):
        a = resid + g
        acc.append(a)
        resid = a - s
        total += s
    return total, acc


def torch_block_sgd_naive(module, X, y, batches, draws, bounds, *, lr):
    """Serial block-partitioned SGD (arXiv:1905.11845) of ``module``: for each
    minibatch, the full gradient by autograd, and only the coordinates of the drawn
    block ``[bounds[b], bounds[b + 1])`` of the flat parameter vector move by
    -lr * g. ``draws``: the block of each minibatch. Returns the flat float32
    parameters."""
    import copy

    import torch
    net = copy.deepcopy(module).float().train()
    params = list(net.parameters())
    ends = np.cumsum([p.numel() for p in params])
    Xt, yt = torch.from_numpy(np.ascontiguousarray(X, np.float32)), torch.from_numpy(
        np.asarray(y, np.int64))
    with _one_torch_thread(torch):
        for rows, b in zip(batches, draws):
            idx = torch.from_numpy(np.asarray(rows, np.int64))
            net.zero_grad()
            torch.nn.functional.cross_entropy(net(Xt[idx]), yt[idx]).backward()
            with torch.no_grad():
                for p, end in zip(params, ends):
                    start = end - p.numel()
                    if bounds[b] <= start and end <= bounds[b + 1]:
                        p.add_(p.grad, alpha=-lr)
    return torch.cat([p.detach().reshape(-1) for p in params]).numpy()


# ---- DDP communication hooks, continued (sgd_shm.torch.hooks) ----------------------------
def momentum_correction_naive(inputs, sents, momentum):
    """Replay Deep Gradient Compression's momentum correction on one rank from its
    gradients and the messages it sent: u_t = momentum * u_{t-1} + g_t, acc_t = r_t +
    u_t, r_{t+1} = acc_t - sent_t, and the entries sent are zeroed in u (momentum
    factor masking), all in the gradients' float type. Returns ([acc_t], [u_t after
    masking])."""
    u = np.zeros_like(inputs[0])
    resid = np.zeros_like(inputs[0])
    acc, vel = [], []
    for g, s in zip(inputs, sents):
        u = u * u.dtype.type(momentum) + g
        a = resid + u
        acc.append(a)
        resid = a - s
        u = np.where(s != 0, u.dtype.type(0), u)
        vel.append(u)
    return acc, vel


# ---- traces of real runs and their replays (sgd_shm.sim.replay) --------------------------
def trace_counters_naive(steps):
    """Per worker, from a parameter-server trace's rows alone (``PSTrace.steps``):
    (pushes applied, pushes dropped, staleness sum), the staleness of an applied push
    being the version the store read when it began minus the version pulled, of a
    dropped one the version its check read minus the version pulled: what the
    store's slot counters must hold at the end."""
    out = []
    for st in steps:
        applied = st["applied"] >= 0
        dropped = st["dropped"] == 1
        stale = int((st["read"][applied] - st["pulled"][applied]).sum()) + int(
            (st["decided"][dropped] - st["pulled"][dropped]).sum())
        out.append((int(applied.sum()), int(dropped.sum()), stale))
    return out


def saps_flags_naive(samples, reads, n, window, factor):
    """SaPS's detection written out from its rule, on the counters each sample read
    (``samples``: the sample times; ``reads``: per sample (staleness sums, pushes
    tried)): per worker the mean staleness over the pushes of the last ``window``
    seconds (no push: infinite); after a first full window, a worker is flagged
    while its mean exceeds ``factor`` times the median of the others' (and 1) and
    exceeds n. Returns the flag changes [(time, worker, flagged)]."""
    hist = [[] for _ in range(n)]
    flagged, events = set(), []
    for t, (sums, tried) in zip(samples, reads):
        for k in range(n):
            hist[k].append((t, int(sums[k]), int(tried[k])))
            hist[k] = [h for h in hist[k][:-1] if h[0] >= t - window] + [hist[k][-1]]
        if t < window:
            continue
        level = []
        for h in hist:
            (_, s0, p0), (_, s1, p1) = h[0], h[-1]
            level.append((s1 - s0) / (p1 - p0) if p1 > p0 else float("inf"))
        for k in range(n):
            others = sorted(level[j] for j in range(n) if j != k)
            m = len(others)
            med = others[m // 2] if m % 2 else (others[m // 2 - 1] + others[m // 2]) / 2
            slow = level[k] > factor * max(med, 1.0) and level[k] > n
            if slow and k not in flagged:
                flagged.add(k)
                events.append((t, k, True))
            elif not slow and k in flagged:
                flagged.discard(k)
                events.append((t, k, False))
    return events


# ---- float32 end to end in ps.train and eager.train (a float32 model's buffers) ---------
def store_pushes_naive(w0, pushes):
    """The weights after ``pushes``, each (indices or None for all, values, step), as
    the parameter store applies them to weights of ``w0``'s float type: each entry
    w[i] - step * g[i] evaluated in float64 and rounded once to that type."""
    w = np.array(w0, copy=True)
    for idx, vals, step in pushes:
        sel = slice(None) if idx is None else np.asarray(idx, np.int64)
        w[sel] = (w[sel].astype(np.float64) - float(step) * np.asarray(vals, np.float64)
                  ).astype(w.dtype)
    return w


def topk_feedback_naive(grads, k):
    """TopK with error feedback written out, in the gradients' own float type: before
    step t the residual is r_t (r_0 = 0); acc_t = r_t + g_t; the message is the k
    largest |acc_t| (:func:`topk_naive`) with their values; r_{t+1} is acc_t with them
    zeroed. Returns ([(indices, values)] per step, the last residual)."""
    resid = np.zeros_like(grads[0])
    sent = []
    for g in grads:
        acc = resid + g
        idx = topk_naive(acc, k)
        sent.append((idx, acc[idx].copy()))
        resid = acc.copy()
        resid[idx] = 0
    return sent, resid


def eager_sparse_mean_sgd_naive(w0, rounds, lr):
    """Replicas of synchronous eager-SGD on compressed messages: each round, the
    messages [(indices, values)] of every rank in rank order are added into zeros of
    the weights' float type and divided by the ranks' count, and w -= lr * mean in
    that type."""
    w = np.array(w0, copy=True)
    for msgs in rounds:
        up = np.zeros_like(w)
        for idx, vals in msgs:
            up[idx] += vals
        up /= len(msgs)
        w -= w.dtype.type(lr) * up
    return w


def eager_rank_batches(n, P, k, b, seed, rounds):
    """Rank k's minibatches as the eager trainer documents them: its rows k, k + P, ...
    in a fresh permutation of default_rng([seed, k, 0x5EED]) whenever a batch would run
    past the end."""
    rng = np.random.default_rng([seed, k, 0x5EED])
    rows = np.arange(k, n, P)
    order, pos, out = rng.permutation(rows), 0, []
    for _ in range(rounds):
        if pos + b > order.size:
            order, pos = rng.permutation(rows), 0
        out.append(order[pos:pos + b])
        pos += b
    return out


def eager_round_batches(n, P, b, seed, rounds):
    """Every round's minibatches, rank by rank (``[[rank 0's, rank 1's, ...], ...]``),
    by the rule of :func:`eager_rank_batches`."""
    per_rank = [eager_rank_batches(n, P, k, b, seed, rounds) for k in range(P)]
    return [[per_rank[k][t] for k in range(P)] for t in range(rounds)]
