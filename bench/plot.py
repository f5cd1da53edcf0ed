"""PNG plots from bench/results/*.json (``python -m bench plot``)."""
from __future__ import annotations

import importlib

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench import common  # noqa: E402
from bench.common import load_results as _load  # noqa: E402


#: scenarios whose module draws its own plot (``plot(d, path)``)
OWN_PLOTS = ("mis", "delay", "mf", "ps", "eager", "compress", "unreliable", "stm", "conflict",
             "nonconvex", "clock", "torch_nets", "torch_ddp", "schedules")


def _throughput(data, title, out, ylabel="ops/s (median, min–max bars)"):
    rows = data["results"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for comp in dict.fromkeys(r["competitor"] for r in rows):
        rs = sorted((r for r in rows if r["competitor"] == comp), key=lambda r: r["workers"])
        x = [r["workers"] for r in rs]
        med = [r["median"] for r in rs]
        lo = [r["median"] - r["min"] for r in rs]
        hi = [r["max"] - r["median"] for r in rs]
        ax.errorbar(x, med, yerr=[lo, hi], marker="o", capsize=3, label=comp)
    ax.set_yscale("log")
    ax.set_xlabel("workers")
    ax.set_ylabel(ylabel)
    h = data["header"]
    ax.set_title(f"{title}\n{h['cpu']} ({h['cpu_count']} CPUs), {h['date'][:10]}", fontsize=9)
    ax.set_xticks(sorted({r["workers"] for r in rows}))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = common.results_dir() / out
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _hogwild(d):
    rows = d["results"]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.3))
    sk = next(r for r in rows if r["competitor"] == "sklearn")
    for comp in ("hogwild-threads", "hogwild-processes", "hogwild-plain", "locked", "cxx-hogwild"):
        rs = sorted((r for r in rows if r["competitor"] == comp), key=lambda r: r["workers"])
        ax1.plot([r["workers"] for r in rs], [r["epoch_s_median"] for r in rs], marker="o",
                 label=comp)
    ax1.axhline(sk["epoch_s_median"], color="k", ls="--", label="sklearn SGDClassifier")
    ax1.set_xlabel("workers")
    ax1.set_ylabel("seconds per epoch (median)")
    ax1.set_xticks(sorted({r["workers"] for r in rows}))
    ax1.set_ylim(bottom=0)
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    held = "val_accuracy" in rows[0]["curves"][0]       # files from before: training loss
    key = "val_accuracy" if held else "train_loss"
    for r in rows:
        cv = r["curves"][0]
        ax2.plot(np.cumsum(cv["epoch_s"]), cv[key], marker=".",
                 label=f"{r['competitor']} ({r['workers']})")
    target = d.get("target_val_accuracy" if held else "target_train_loss")
    if target:
        ax2.axhline(target, color="gray", ls=":", label="target")
    ax2.set_xlabel("training seconds")
    ax2.set_ylabel("held-out accuracy" if held else "training log loss")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=7)
    for key, v in d.get("staleness", {}).items():
        hist = np.asarray(v["hist"], dtype=float)
        if hist.sum() and not key.endswith("-1"):
            ax3.step(np.arange(len(hist)), hist / hist.sum(), where="mid",
                     label=f"{key} (mean {v['mean_tau']:.2f})")
    ax3.set_yscale("log")
    ax3.set_xlabel("staleness tau (updates by others between read and write)")
    ax3.set_ylabel("fraction of updates")
    ax3.grid(alpha=0.3)
    ax3.legend(fontsize=7)
    p = d["problem"]
    h = d["header"]
    fig.suptitle(f"Hogwild, {p['n_samples']:,} x {p['n_features']:,} RCV1-like, log loss; "
                 f"{h['cpu']} ({h['cpu_count']} CPUs)", fontsize=9)
    fig.tight_layout()
    path = common.results_dir() / "hogwild.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all():
    out = []
    d = _load("pq-threads")
    if d:
        out.append(_throughput(d, "Hold model, threads (1M prefill)", "pq-threads.png"))
    d = _load("pq-processes")
    if d:
        out.append(_throughput(d, "Hold model, processes sharing one queue", "pq-processes.png"))
    d = _load("counter")
    if d:
        out.append(_throughput(d, "Counter increments", "counter.png", "increments/s"))
    d = _load("hogwild")
    if d:
        out.append(_hogwild(d))
    for name in OWN_PLOTS:
        d = _load(name)
        if d:
            mod = importlib.import_module(f"bench.{name}")
            out.append(mod.plot(d, common.results_dir() / f"{name}.png"))
    d = _load("sim")
    if d:                                   # one PNG per simulated part
        from bench import sim
        out += sim.plot(d, common.results_dir())
    d = _load("quality")
    if d:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, c in d["rank_cdf"].items():
            if label.endswith("-s1"):
                ax.step(c["rank"], c["cdf"], where="post", label=label[:-3])
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("rank error of a pop (capped at 1000)")
        ax.set_ylabel("fraction of pops ≤ x")
        ax.set_title("MultiQueue rank-error CDF (threads t, queues q)", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = common.results_dir() / "quality-rank-cdf.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path)
    return out
