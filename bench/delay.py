"""The price of asynchrony (``python -m bench delay``): SGD whose gradients are
computed on stale weights, with a controlled delay tau, with and without momentum.

The delay of real Hogwild depends on the machine and the scheduler (``bench hogwild``
measures it), so here it is set instead: a serial simulation (Numba) where the gradient
of step t is taken at the weights of step t - tau ("max", every step as late as the
bound allows: the adversary of the asynchronous SGD analyses, e.g. Alistarh, De Sa,
Konstantinov PODC 2018) or of step t - u with u uniform in [0, tau] ("uniform"), and
heavy-ball momentum mu (the asynchronous-momentum setting: Mitliagkas et al. 2016 argue
that asynchrony itself acts like extra momentum). Problem: L2-regularised logistic
regression on a dense, well-conditioned synthetic problem, with ``holdout`` rows drawn
beside the training rows and held out; constant step size; the same shuffled order and
seed for every setting. Reported: the final training loss minus the loss at tau = 0
(the price of the delay) and, beside it, the final model on the held-out rows: its
accuracy and its gap to tau = 0 in points (log loss), its held-out loss minus that at
tau = 0 (squared loss, a regression: no accuracy).
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
#: rows held out beside the problem's rows
HOLDOUT = 5_000


@nb.njit(cache=True)
def delayed_weights(X, y, order, epochs, lr, alpha, tau, uniform, mu, seed, squared):
    """Final weights of SGD whose step t uses the gradient at the weights of step
    t - delay (delay = tau, or uniform in [0, tau]), heavy ball mu; log loss, or
    squared loss when ``squared``; all infinite once a step left the finite range."""
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
                return np.full(d, np.inf)
            t += 1
    return w


@nb.njit(cache=True)
def mean_loss(X, y, w, alpha, squared):
    """Mean log loss (squared loss when ``squared``) of weights w on (X, y), plus the
    L2 term."""
    n = X.shape[0]
    loss = 0.0
    for i in range(n):
        if squared:
            loss += 0.5 * (X[i] @ w - y[i]) ** 2
        else:
            loss += np.logaddexp(0.0, -y[i] * (X[i] @ w))
    return loss / n + 0.5 * alpha * (w @ w)


@nb.njit(cache=True)
def delayed_sgd(X, y, order, epochs, lr, alpha, tau, uniform, mu, seed, squared):
    """Final mean loss (+ L2) on (X, y) of :func:`delayed_weights` (inf: diverged)."""
    w = delayed_weights(X, y, order, epochs, lr, alpha, tau, uniform, mu, seed, squared)
    if not np.isfinite(w).all():
        return np.inf
    return mean_loss(X, y, w, alpha, squared)


def problem(n, d, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))                 # |x|^2 about d: the step size matters
    w_true = rng.normal(size=d) * 3.0 / math.sqrt(d)
    y = np.where(X @ w_true + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
    return np.ascontiguousarray(X), y


def _held_out(X, y, w, loss):
    """(accuracy or None, loss without the L2 term) of weights w on held-out rows."""
    if not np.isfinite(w).all():
        return None, None
    squared = loss == "squared"
    val_loss = float(mean_loss(X, y, w, 0.0, squared))
    return (None if squared else float(np.mean(np.sign(X @ w) == y))), val_loss


def _data(seed, n, d, holdout):
    """Training and held-out rows of the log-loss task (labels +-1) and the squared-
    loss task (a noisy linear target of the same rows)."""
    X, y_sign = problem(n + holdout, d, seed)
    y_lin = X @ np.random.default_rng(seed + 1).normal(size=d) / math.sqrt(d) \
        + 0.1 * np.random.default_rng(seed + 2).normal(size=n + holdout)
    return {"log": (X[:n], y_sign[:n], X[n:], y_sign[n:]),
            "squared": (X[:n], y_lin[:n], X[n:], y_lin[n:])}


def _one(data, loss, mode, mu, tau, order, epochs, lr, alpha, seed):
    """(final training loss or inf, held-out accuracy or None, held-out loss or None)."""
    X, y, Xv, yv = data[loss]
    # heavy ball moves by lr * v with v about g / (1 - mu): compare the settings at
    # the same effective step lr, i.e. run lr * (1 - mu)
    w = delayed_weights(X, y, order, epochs, lr * (1.0 - mu), alpha, tau, mode == "uniform",
                        mu, seed, loss == "squared")
    if not np.isfinite(w).all():
        return math.inf, None, None
    return (float(mean_loss(X, y, w, alpha, loss == "squared")),
            *_held_out(Xv, yv, w, loss))


def run(seed, *, n=20_000, d=50, holdout=HOLDOUT, epochs=5, alpha=1e-4, lr=0.02, taus=TAUS,
        momenta=MOMENTA, progress=True):
    from tqdm import tqdm
    data = _data(seed, n, d, holdout)
    order = np.random.default_rng(seed).permutation(n).astype(np.int64)
    settings = [(loss, mode, mu) for loss in ("log", "squared") for mode in ("max", "uniform")
                for mu in momenta]
    bar = tqdm(total=len(settings) * len(taus), desc="delay", leave=False,
               disable=not progress)
    rows = []
    for loss, mode, mu in settings:
        base = None
        for tau in taus:
            f, acc, vloss = _one(data, loss, mode, mu, tau, order, epochs, lr, alpha, seed)
            bar.update()
            if tau == taus[0]:
                base = (f, acc, vloss)
            diverged = not math.isfinite(f) or f > DIVERGED * base[0]
            rows.append({"loss": loss, "mode": mode, "momentum": mu, "tau": tau,
                         "final_loss": f if math.isfinite(f) else None, "diverged": diverged,
                         "excess": None if diverged else f - base[0],
                         "val_score": None if diverged else acc,
                         "val_score_gap": (None if diverged or acc is None else acc - base[1]),
                         "val_loss": None if diverged else vloss,
                         "val_loss_excess": None if diverged else vloss - base[2]})
    bar.close()
    return rows, {"problem": {"n": n, "d": d, "holdout": holdout, "epochs": epochs,
                              "alpha": alpha, "lr": lr}}


def plot(d, path):
    from matplotlib.figure import Figure      # no pyplot: the backend is left alone
    fig = Figure(figsize=(16, 4.2))
    axes = fig.subplots(1, 3)
    for ax, loss in zip(axes, ("log", "squared")):
        for mode, mu, ls in _lines(d["results"]):
            rs = _series(d["results"], loss, mode, mu)
            xs = [r["tau"] for r in rs if r["excess"] is not None and r["tau"] > 0]
            ys = [r["excess"] for r in rs if r["excess"] is not None and r["tau"] > 0]
            ax.plot(xs, ys, ls, marker="o", ms=3, label=f"{mode} delay, momentum {mu:g}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("symlog", linthresh=1e-5)
        ax.set_xlabel("delay bound tau (a line stops where it diverged)")
        ax.set_ylabel("final training loss − loss at tau = 0")
        ax.set_title(f"{loss} loss, effective step {d['problem']['lr']}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    ax = axes[2]
    for mode, mu, ls in _lines(d["results"]):
        rs = [r for r in _series(d["results"], "log", mode, mu)
              if r.get("val_score_gap") is not None and r["tau"] > 0]
        ax.plot([r["tau"] for r in rs], [100 * r["val_score_gap"] for r in rs], ls, marker="o",
                ms=3, label=f"{mode} delay, momentum {mu:g}")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("delay bound tau (a line stops where it diverged)")
    ax.set_ylabel("held-out accuracy − that at tau = 0 (points)")
    ax.set_title(f"log loss: held-out accuracy ({d['problem'].get('holdout', 0):,} rows)",
                 fontsize=9)
    ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    fig.suptitle("SGD on stale weights: the price of the delay", fontsize=10)
    return common.save_plot(fig, path)


def _lines(rows):
    """(mode, momentum, line style) of every series, max delay solid."""
    return [(mode, mu, ls) for mode, ls in (("max", "-"), ("uniform", ":"))
            for mu in sorted({r["momentum"] for r in rows})]


def _series(rows, loss, mode, mu):
    return [r for r in rows if (r["loss"], r["mode"], r["momentum"]) == (loss, mode, mu)]


def _table(d, taus, cell):
    """One row per (loss, delay, momentum), one column per tau, ``cell(row)``."""
    lines = ["| loss | delay | momentum | " + " | ".join(f"tau={t}" for t in taus) + " |",
             "|---|---|---:|" + "---:|" * len(taus)]
    for r0 in d["results"]:
        if r0["tau"] != taus[0]:
            continue
        rs = {r["tau"]: r for r in _series(d["results"], r0["loss"], r0["mode"],
                                           r0["momentum"])}
        cells = ["diverged" if rs[t]["diverged"] else cell(rs[t]) for t in taus]
        lines.append(f"| {r0['loss']} | {r0['mode']} | {r0['momentum']:g} | "
                     + " | ".join(cells) + " |")
    return lines


def _held_out_cell(r):
    if r.get("val_score") is not None:
        return f"{r['val_score']:.4f} ({100 * r['val_score_gap']:+.2f})"
    return f"{r['val_loss_excess']:+.5f}"


def findings(d):
    """Per log-loss series: the largest tau whose final held-out accuracy stays within
    the held-out rows' binomial standard error of tau = 0, and the first that
    diverged; computed from the rows."""
    p = d["problem"]
    out = []
    for mode, mu, _ in _lines(d["results"]):
        rs = _series(d["results"], "log", mode, mu)
        if not rs or rs[0].get("val_score") is None:
            continue
        a0 = rs[0]["val_score"]
        se = math.sqrt(a0 * (1 - a0) / p["holdout"])
        last = 0
        for r in rs:                        # the taus in order, until the first outside
            if r["val_score_gap"] is None or abs(r["val_score_gap"]) > se:
                break
            last = r["tau"]
        div = next((r["tau"] for r in rs if r["diverged"]), None)
        worst = min((r for r in rs if r["val_score_gap"] is not None),
                    key=lambda r: r["val_score_gap"])
        drop = ("no tau lowers it" if worst["val_score_gap"] >= 0 else
                f"largest drop {100 * worst['val_score_gap']:+.2f} points at tau = "
                f"{worst['tau']} (training loss {worst['excess']:+.5f})")
        out.append(f"- log loss, {mode} delay, momentum {mu:g}: held-out accuracy {a0:.4f} at "
                   f"tau = 0; within one standard error ({100 * se:.2f} points) of it up to "
                   f"tau = {last}; {drop}"
                   + (f"; diverged from tau = {div}" if div is not None else "") + ".")
    return out


def summary_markdown(d):
    p = d["problem"]
    taus = sorted({r["tau"] for r in d["results"]})
    lines = [f"Dense {p['n']:,} × {p['d']} problem, {p['epochs']} epochs, constant effective step "
             f"{p['lr']} (lr / (1 − momentum)); final training loss minus the loss at tau = 0 "
             f"(\"diverged\": above {DIVERGED:g}× it):", ""]
    lines += _table(d, taus, lambda r: f"{r['excess']:+.5f}")
    if "holdout" in p:
        lines += ["", f"The same runs on {p['holdout']:,} held-out rows: log loss, held-out "
                  "accuracy (its gap to tau = 0 in points); squared loss, held-out loss minus "
                  "that at tau = 0:", ""]
        lines += _table(d, taus, _held_out_cell)
        f = findings(d)
        if f:
            lines += ["", "Findings (computed from this run):", ""] + f
    h = d["header"]
    lines.append(f"\n<sub>`{h['command']}` · {h['date']} · a deterministic simulation (the same "
                 f"order and seed for every setting): no timing, no repetitions</sub>")
    return "\n".join(lines)
