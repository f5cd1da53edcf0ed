"""The price of asynchrony (``python -m bench delay``): SGD whose gradients are
computed on stale weights, with a controlled delay tau, with and without momentum.

The delay of real Hogwild depends on the machine and the scheduler (``bench hogwild``
measures it), so here it is set instead: a serial simulation (Numba) where the gradient
of step t is taken at the weights of step t - tau ("max", every step as late as the
bound allows: the adversary of the asynchronous SGD analyses, e.g. Alistarh, De Sa,
Konstantinov PODC 2018) or of step t - u with u uniform in [0, tau] ("uniform"), and
heavy-ball momentum mu (the asynchronous-momentum setting: Mitliagkas et al. 2016 argue
that asynchrony itself acts like extra momentum). Problem: L2-regularised logistic
regression on a dense, well-conditioned synthetic problem; constant step size; the same
shuffled order and seed for every setting. Reported: the final training loss minus the
loss at tau = 0 (the price of the delay), at a fixed step size and at the best of a
step-size grid, and which step size was best.
"""
from __future__ import annotations

import math

import numba as nb
import numpy as np

from bench import common

TAUS = (0, 1, 2, 4, 8, 16, 32, 64)
MOMENTA = (0.0, 0.5, 0.9)
#: a final loss above this many times the tau = 0 loss counts as diverged
DIVERGED = 10.0


@nb.njit(cache=True)
def delayed_sgd(X, y, order, epochs, lr, alpha, tau, uniform, mu, seed, squared):
    """Final mean loss (+ L2) of SGD whose step t uses the gradient at the weights
    of step t - delay (delay = tau, or uniform in [0, tau]), heavy ball mu; log
    loss, or squared loss when ``squared``."""
    np.random.seed(seed)
    n, d = X.shape
    hist = np.zeros((tau + 1, d))             # ring buffer: weights of the last tau+1 steps
    w = np.zeros(d)
    v = np.zeros(d)
    t = 0
    for _ in range(epochs):
        for i in order:
            hist[t % (tau + 1)] = w
            lag = tau if not uniform else np.random.randint(0, tau + 1)
            lag = min(lag, t)
            ws = hist[(t - lag) % (tau + 1)]
            if squared:
                g = (X[i] @ ws - y[i]) * X[i] + alpha * ws
            else:
                z = y[i] * (X[i] @ ws)
                g = -y[i] / (1.0 + math.exp(z)) * X[i] + alpha * ws
            v = mu * v + g
            w = w - lr * v
            if not np.isfinite(w).all():
                return np.inf
            t += 1
    loss = 0.0
    for i in range(n):
        if squared:
            loss += 0.5 * (X[i] @ w - y[i]) ** 2
        else:
            loss += np.logaddexp(0.0, -y[i] * (X[i] @ w))
    return loss / n + 0.5 * alpha * (w @ w)


def problem(n, d, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))                 # |x|^2 about d: the step size matters
    w_true = rng.normal(size=d) * 3.0 / math.sqrt(d)
    y = np.where(X @ w_true + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
    return np.ascontiguousarray(X), y


def run(seed, *, n=20_000, d=50, epochs=5, alpha=1e-4, lr=0.02, taus=TAUS, momenta=MOMENTA,
        progress=True):
    from tqdm import tqdm
    X, y_sign = problem(n, d, seed)
    # the squared-loss task regresses a noisy linear target of the same rows
    y_lin = X @ np.random.default_rng(seed + 1).normal(size=d) / math.sqrt(d) \
        + 0.1 * np.random.default_rng(seed + 2).normal(size=n)
    order = np.random.default_rng(seed).permutation(n).astype(np.int64)
    settings = [(loss, mode, mu) for loss in ("log", "squared") for mode in ("max", "uniform")
                for mu in momenta]
    bar = tqdm(total=len(settings) * len(taus), desc="delay", leave=False,
               disable=not progress)
    rows = []
    for loss, mode, mu in settings:
        y = y_sign if loss == "log" else y_lin
        base = None
        for tau in taus:
            # heavy ball moves by lr * v with v about g / (1 - mu): compare the settings at
            # the same effective step lr, i.e. run lr * (1 - mu)
            f = float(delayed_sgd(X, y, order, epochs, lr * (1.0 - mu), alpha, tau,
                                  mode == "uniform", mu, seed, loss == "squared"))
            bar.update()
            if tau == taus[0]:
                base = f
            diverged = not math.isfinite(f) or f > DIVERGED * base
            rows.append({"loss": loss, "mode": mode, "momentum": mu, "tau": tau,
                         "final_loss": f if math.isfinite(f) else None, "diverged": diverged,
                         "excess": None if diverged else f - base})
    bar.close()
    return rows, {"problem": {"n": n, "d": d, "epochs": epochs, "alpha": alpha, "lr": lr}}


def plot(d, path):
    from matplotlib.figure import Figure      # no pyplot: the backend is left alone
    fig = Figure(figsize=(11, 4.2))
    axes = fig.subplots(1, 2)
    for ax, loss in zip(axes, ("log", "squared")):
        for mode, ls in (("max", "-"), ("uniform", ":")):
            for mu in sorted({r["momentum"] for r in d["results"]}):
                rs = [r for r in d["results"]
                      if r["loss"] == loss and r["mode"] == mode and r["momentum"] == mu]
                xs = [r["tau"] for r in rs if r["excess"] is not None and r["tau"] > 0]
                ys = [r["excess"] for r in rs if r["excess"] is not None and r["tau"] > 0]
                ax.plot(xs, ys, ls, marker="o", ms=3, label=f"{mode} delay, momentum {mu:g}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("symlog", linthresh=1e-5)
        ax.set_xlabel("delay bound tau (a line stops where it diverged)")
        ax.set_ylabel("final loss − loss at tau = 0")
        ax.set_title(f"{loss} loss, effective step {d['problem']['lr']}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    fig.suptitle("SGD on stale weights: the price of the delay", fontsize=10)
    return common.save_plot(fig, path)


def summary_markdown(d):
    p = d["problem"]
    taus = sorted({r["tau"] for r in d["results"]})
    lines = [f"Dense {p['n']:,} × {p['d']} problem, {p['epochs']} epochs, constant effective step "
             f"{p['lr']} (lr / (1 − momentum)); final training loss minus the loss at tau = 0 "
             f"(\"diverged\": above {DIVERGED:g}× it):", "",
             "| loss | delay | momentum | " + " | ".join(f"tau={t}" for t in taus) + " |",
             "|---|---|---:|" + "---:|" * len(taus)]
    for r0 in d["results"]:
        if r0["tau"] != taus[0]:
            continue
        rs = {r["tau"]: r for r in d["results"] if (r["loss"], r["mode"], r["momentum"]) ==
              (r0["loss"], r0["mode"], r0["momentum"])}
        cells = ["diverged" if rs[t]["diverged"] else f"{rs[t]['excess']:+.5f}" for t in taus]
        lines.append(f"| {r0['loss']} | {r0['mode']} | {r0['momentum']:g} | "
                     + " | ".join(cells) + " |")
    h = d["header"]
    lines.append(f"\n<sub>`{h['command']}` · {h['date']} · a deterministic simulation (the same "
                 f"order and seed for every setting): no timing, no repetitions</sub>")
    return "\n".join(lines)
