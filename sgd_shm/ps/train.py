"""Training with a multi-process parameter server: BSP, ASP, SSP and SaPS.

Worker processes (``multiprocess``, fork) loop: wait if the policy says so,
``pull`` the weights, compute a minibatch gradient of L2-regularised logistic
loss, sleep to emulate a slower machine (``slowdown``), ``push``. The parent
process is the coordinator: it samples the training loss and the workers'
slots every ``sample_every`` seconds, detects stragglers, and stops the run.

Policies (``s`` = ``staleness``):

* ``asp``: fully asynchronous; every gradient is applied.
* ``bsp``: bulk synchronous: a worker starts its c-th step only when every
  worker has pushed c times (SSP with s = 0).
* ``ssp``: stale synchronous parallel (Ho et al. 2013): a worker starts step c
  only when every worker has pushed at least c - s times.
* ``saps``: straggler-aware, never makes a fast worker wait. Detection reads the
  version counters: a push's staleness is the global version at push minus the
  version pulled; every sample, the coordinator takes each worker's mean
  staleness over its pushes of the last ``window`` seconds (from the slot's
  cumulative staleness and push counters; a worker with no push in the window
  counts as infinitely stale). After a first full window, w is flagged while
  its mean exceeds ``detect_factor`` times the median of the others' (and
  n_workers); it is unflagged when that stops. ``.detections`` lists the first
  time each worker was flagged. Bound: a push with staleness tau (updates
  applied since its pull) above ``s`` is scaled by s / tau; from a flagged
  worker it is dropped instead, and the worker re-pulls. (The SaPS paper also
  hands a straggler's unstarted minibatches to fast workers through a
  MultiQueue; here every worker draws random minibatches, so nothing waits.)

This is the first version of the driver (issue 5); checkpoints, the CLI and the
benchmark build on it.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

import multiprocess as mp
import numpy as np
import scipy.sparse as sp

from sgd_shm.ps.store import ParameterStore

POLICIES = ("bsp", "asp", "ssp", "saps")
FLAGGED = 1
DEAD = 2


@dataclass
class TrainResult:
    policy: str
    history: list                     # dicts: seconds, version, loss
    detections: list                  # (seconds, worker), first time each is flagged
    workers: list                     # per-worker slot dicts (+ dropped)
    final_loss: float
    seconds: float
    time_to_target: float | None = None
    killed: list = field(default_factory=list)

    @property
    def updates(self) -> int:
        return self.history[-1]["version"] if self.history else 0


def _labels(y):
    y = np.asarray(y)
    classes = np.unique(y)
    if classes.size != 2:
        raise ValueError(f"y: expected two classes, got {classes.size} ({classes[:5].tolist()})")
    return np.where(y == classes[1], 1.0, -1.0)


def _loss(X, ys, w, alpha):
    z = ys * (X @ w)
    return float(np.mean(np.logaddexp(0.0, -z)) + 0.5 * alpha * (w @ w))


def _grad(Xb, yb, w, alpha):
    z = yb * (Xb @ w)
    coef = -yb / (1.0 + np.exp(z))           # derivative of log(1 + e^-z) times y
    g = Xb.T @ coef / Xb.shape[0]
    return np.asarray(g).ravel() + alpha * w


def _worker(store, X, ys, w_id, n_workers, policy, s, lr, alpha, batch, slowdown, seed,
            stop):
    rng = np.random.default_rng(seed)
    n = X.shape[0]
    my_pushes = 0
    while not stop.is_set():
        if policy in ("bsp", "ssp"):
            need = my_pushes - (0 if policy == "bsp" else s)
            while not stop.is_set() and min(
                    (int(store._slots[k, 1]) for k in range(n_workers)
                     if int(store._slots[k, 4]) != DEAD), default=need) < need:
                time.sleep(0.0002)
            if stop.is_set():
                break
        w, v = store.pull(worker=w_id)
        t0 = time.perf_counter()
        idx = rng.integers(0, n, batch)
        g = _grad(X[idx], ys[idx], w, alpha)
        dt = time.perf_counter() - t0
        if slowdown > 1:
            time.sleep((slowdown - 1.0) * dt)
        store.record(w_id, compute_ns=int(1e9 * (time.perf_counter() - t0)))
        scale = 1.0
        if policy == "saps":
            tau = store.version - v
            if tau > s:
                if int(store._slots[w_id, 4]) == FLAGGED:
                    store._slots[w_id, 7] += 1      # dropped; re-pull
                    continue
                scale = s / tau
        res = store.push(g, v, lr=lr, worker=w_id, scale=scale)
        while res.deferred and not stop.is_set():
            store.push_deferred(res)
        my_pushes += 1


def train(X, y, *, n_workers=4, policy="saps", slowdown=None, max_seconds=5.0,
          target_loss=None, lr=0.5, alpha=1e-4, batch_size=64, staleness=None,
          n_shards=8, sample_every=0.02, window=1.5, detect_factor=2.0, seed=None,
          faults=None, progress=False) -> TrainResult:
    """Train L2-regularised logistic regression with ``n_workers`` processes on a
    shared ParameterStore under ``policy``; see the module notes for the rules.

    ``slowdown``: a worker's compute time is stretched by this factor (a
    sequence of n_workers factors, or a dict {worker: factor}; default all 1).
    ``staleness``: s for ssp and the bound for saps (default n_workers).
    Stops after ``max_seconds`` or when the training loss (on up to 4096 rows)
    reaches ``target_loss``.

    ``faults``: {worker: seconds} SIGKILLs that worker that long into the run
    (fault injection). A worker that dies is reported in ``.killed``, its slot
    is marked dead so BSP/SSP stop waiting for it, and a shard lock it held is
    taken over by the next push; the run goes on with the others.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy: must be one of {POLICIES}, got {policy!r}")
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise ValueError(f"n_workers: must be an int >= 1, got {n_workers!r}")
    X = sp.csr_matrix(X) if sp.issparse(X) else np.ascontiguousarray(X, dtype=np.float64)
    ys = _labels(y)
    if X.shape[0] != ys.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {ys.shape[0]}")
    factors = np.ones(n_workers)
    if isinstance(slowdown, dict):
        for k, f in slowdown.items():
            if not 0 <= k < n_workers:
                raise ValueError(f"slowdown: worker {k} is not in [0, {n_workers})")
            factors[k] = f
    elif slowdown is not None:
        factors = np.asarray(slowdown, dtype=float)
        if factors.shape != (n_workers,):
            raise ValueError(f"slowdown: expected {n_workers} factors, got {factors.shape}")
    if (factors < 1).any() or not np.isfinite(factors).all():
        raise ValueError("slowdown: factors must be finite and >= 1")
    for name, v in (("max_seconds", max_seconds), ("lr", lr), ("sample_every", sample_every),
                    ("window", window), ("detect_factor", detect_factor)):
        if not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0):
            raise ValueError(f"{name}: must be a finite number > 0, got {v!r}")
    faults = dict(faults or {})
    for k, t in faults.items():
        if not 0 <= k < n_workers or not t >= 0:
            raise ValueError(f"faults: expected {{worker in [0, {n_workers}): seconds >= 0}}, "
                             f"got {{{k!r}: {t!r}}}")
    s = n_workers if staleness is None else int(staleness)
    if s < 0:
        raise ValueError(f"staleness: must be >= 0, got {staleness}")
    rng = np.random.default_rng(seed)
    eval_rows = rng.choice(X.shape[0], min(4096, X.shape[0]), replace=False)
    Xe, ye = X[eval_rows], ys[eval_rows]
    d = X.shape[1]
    store = ParameterStore(d, n_shards=min(n_shards, d), n_workers=n_workers)
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    seeds = rng.integers(0, 2**63 - 1, n_workers)
    procs = [ctx.Process(target=_worker, name=f"ps-worker-{k}",
                         args=(store, X, ys, k, n_workers, policy, s, lr, alpha, batch_size,
                               float(factors[k]), int(seeds[k]), stop), daemon=True)
             for k in range(n_workers)]
    history, detections, killed = [], [], []
    samples = [[] for _ in range(n_workers)]       # (t, staleness sum, pushes)
    flagged = set()
    t_target = None
    try:
        for p in procs:
            p.start()
        t0 = time.perf_counter()
        while True:
            time.sleep(sample_every)
            now = time.perf_counter() - t0
            w, v = store.pull()
            loss = _loss(Xe, ye, w, alpha)
            history.append({"seconds": now, "version": v, "loss": loss})
            if progress:
                print(f"\r{policy}: {now:5.1f} s  updates {v:7d}  loss {loss:.4f}", end="",
                      flush=True)
            for k, t_kill in list(faults.items()):
                if now >= t_kill and procs[k].is_alive():
                    os.kill(procs[k].pid, signal.SIGKILL)
                    del faults[k]
            for k, p in enumerate(procs):
                if p.exitcode is not None and k not in killed:
                    killed.append(k)
                    store._slots[k, 4] = DEAD
            if policy == "saps":
                _detect(store, samples, now, window, detect_factor, n_workers, flagged,
                        detections, killed)
            if target_loss is not None and loss <= target_loss and t_target is None:
                t_target = now
                break
            if now >= max_seconds or len(killed) == n_workers:
                break
    finally:
        stop.set()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
        if progress:
            print()
    w, v = store.pull()
    workers = []
    for k in range(n_workers):
        sl = store.slot(k)
        sl["slowdown"] = float(factors[k])
        workers.append(sl)
    final = _loss(Xe, ye, w, alpha)
    history.append({"seconds": time.perf_counter() - t0, "version": v, "loss": final})
    store.close()
    return TrainResult(policy, history, detections, workers, final, history[-1]["seconds"],
                       t_target, killed)


def plot_losses(curves, target, path, title=""):
    """Training loss against seconds, one line per policy, with each SaPS
    detection as a dotted vertical line. ``curves``: {policy: {"seconds": [...],
    "loss": [...], "detections": [(seconds, worker), ...]}}. Writes a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for pol, c in curves.items():
        line, = ax.plot(c["seconds"], c["loss"], label=pol)
        for t, _ in c["detections"]:
            ax.axvline(t, color=line.get_color(), ls=":", lw=1)
    ax.axhline(target, color="grey", ls="--", lw=1, label="target")
    ax.set_xlabel("seconds")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _detect(store, samples, now, window, factor, n_workers, flagged, detections, killed):
    """SaPS detection from version counters (see the module notes)."""
    for k in range(n_workers):
        samples[k].append((now, int(store._slots[k, 5]), int(store._slots[k, 1])))
        while len(samples[k]) > 1 and samples[k][0][0] < now - window:
            samples[k].pop(0)
    if now < window:                       # a full window before any verdict
        return
    level = []
    for k in range(n_workers):
        (_, s0, p0), (_, s1, p1) = samples[k][0], samples[k][-1]
        # mean staleness of the pushes of the last window (a worker that pushed
        # nothing in it samples by at least what it would have seen)
        level.append((s1 - s0) / (p1 - p0) if p1 > p0 else float("inf"))
    for k in range(n_workers):
        if k in killed:
            continue
        others = [level[j] for j in range(n_workers) if j != k and j not in killed]
        if not others:
            continue
        slow = level[k] > factor * max(float(np.median(others)), 1.0) and level[k] > n_workers
        if slow and k not in flagged:
            flagged.add(k)
            store._slots[k, 4] = FLAGGED
            if all(w != k for _, w in detections):
                detections.append((now, k))
        elif not slow and k in flagged:
            flagged.discard(k)
            store._slots[k, 4] = 0
