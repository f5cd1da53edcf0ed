"""Matrix factorization by Hogwild SGD (``python -m bench mf``): seconds per epoch vs
workers on threads and on processes, and the RMSE reached.

Problem: ``sgd_shm.data.make_ratings`` (default 100k users × 10k items, 2M ratings,
Zipf-like popularity, a hidden rank-10 model plus noise), 90% to train, 10% held out;
``MatrixFactorization(n_factors=20)`` for ``epochs`` epochs. The fit is timed whole
(for processes: forking the workers and setting up the shared factors included) and
divided by the epochs. Interleaved repetitions after a warm-up; medians.
"""
from __future__ import annotations

import statistics
import time

import numpy as np
from tqdm import tqdm

from bench import common
from sgd_shm import MatrixFactorization
from sgd_shm.data import make_ratings

BACKENDS = ("threads", "processes")


def run(workers, reps, seed, *, users=100_000, items=10_000, ratings=2_000_000, epochs=3,
        factors=20, progress=True):
    t0 = time.perf_counter()
    X, y = make_ratings(users, items, ratings, random_state=seed)
    gen_s = time.perf_counter() - t0
    idx = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.9 * len(y))
    tr, te = idx[:cut], idx[cut:]
    Xtr, ytr, Xte, yte = X[tr], y[tr], X[te], y[te]
    comps = [(b, w) for w in workers for b in BACKENDS]
    acc = {c: [] for c in comps}
    bar = tqdm(total=(reps + 1) * len(comps), desc="mf", leave=False, disable=not progress)
    for rep in range(reps + 1):                      # rep 0 is the warm-up
        for b, w in comps:
            mf = MatrixFactorization(n_factors=factors, n_workers=w, backend=b, max_iter=epochs,
                                     random_state=seed)
            t = time.perf_counter()
            mf.fit(Xtr, ytr)
            dt = (time.perf_counter() - t) / epochs
            if rep:
                acc[(b, w)].append((dt, mf.loss_curve_[-1], mf.rmse(Xte, yte)))
            bar.update()
    bar.close()
    base = statistics.median(a[0] for a in acc[("threads", min(workers))])
    rows = []
    for b, w in comps:
        ts = [a[0] for a in acc[(b, w)]]
        med = statistics.median(ts)
        rows.append({"backend": b, "workers": w, "epoch_s": ts, "epoch_s_median": med,
                     "speedup_vs_1_thread": base / med,
                     "train_rmse_median": statistics.median(a[1] for a in acc[(b, w)]),
                     "test_rmse_median": statistics.median(a[2] for a in acc[(b, w)])})
    problem = {"users": users, "items": items, "ratings": int(len(y)), "train": int(len(tr)),
               "factors": factors, "epochs": epochs, "generate_s": gen_s,
               "mean_baseline_test_rmse": float(np.sqrt(np.mean((yte - ytr.mean()) ** 2)))}
    return rows, {"problem": problem}


def plot(d, path):
    from matplotlib.figure import Figure      # no pyplot: the backend is left alone
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.subplots()
    for b in BACKENDS:
        rs = [r for r in d["results"] if r["backend"] == b]
        ax.plot([r["workers"] for r in rs], [r["epoch_s_median"] for r in rs], "o-", label=b)
    p = d["problem"]
    ax.set_xlabel("workers")
    ax.set_ylabel("seconds per epoch")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Hogwild matrix factorization, {p['ratings'] / 1e6:.0f}M ratings, "
                 f"k={p['factors']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    return common.save_plot(fig, path)


def summary_markdown(d):
    p = d["problem"]
    lines = [f"`make_ratings({p['users']:,}, {p['items']:,}, ...)`: {p['ratings']:,} ratings "
             f"({p['train']:,} to train), {p['factors']} factors, {p['epochs']} epochs; "
             f"predicting the mean gives test RMSE {p['mean_baseline_test_rmse']:.4f}:", "",
             "| backend | workers | s / epoch | speed-up vs 1 thread | train RMSE | test RMSE |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in d["results"]:
        lines.append(f"| {r['backend']} | {r['workers']} | {r['epoch_s_median']:.3f} | "
                     f"{r['speedup_vs_1_thread']:.2f}× | {r['train_rmse_median']:.4f} | "
                     f"{r['test_rmse_median']:.4f} |")
    h = d["header"]
    lines.append(f"\n<sub>`{h['command']}` · {h['date']} · {h['cpu']}, {h['cpu_count']} CPUs · "
                 f"medians of {h['reps']} interleaved repetitions after a warm-up; the whole "
                 f"fit (process start-up included) over the epochs</sub>")
    return "\n".join(lines)
