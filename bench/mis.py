"""Greedy MIS / matching under relaxed schedulers (``python -m bench mis``).

Two parts:

* waste: mean wasted iterations (over seeds) of greedy MIS on one thread (a
  sequential simulation of the scheduler) vs the number of MultiQueue queues
  q, vs k for the k-relaxed scheduler (uniform and adversarial), at several
  graph sizes n; with a log-log slope (the exponent of the poly(k) curve).
* speed: a 1M-vertex, 10M-edge Erdős–Rényi graph with random priorities:
  sequential greedy in Numba with the same priorities beside MultiQueue MIS
  and matching on 1..T threads, interleaved, median of the repetitions; and
  networkx's maximal_independent_set at 100k vertices (quadratic, one run).
"""
from __future__ import annotations

import math
import time

import numpy as np
from tqdm import tqdm

import relaxed
from relaxed.graphs import erdos_renyi
from relaxed.greedy import _ranks, _seq_matching, _seq_mis


def _fit_slope(xs, ys):
    """Least-squares slope of log(y) on log(x), over points with y > 0."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if y > 0]
    if len(pts) < 2:
        return None
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


def waste(sizes, queues, ks, seeds, degree=10, progress=True):
    """Wasted iterations of 1-thread MIS (batch 1: the plain scheduler)."""
    rows = []
    total = len(sizes) * len(seeds) * (len(queues) + 2 * len(ks))
    bar = tqdm(total=total, desc="waste", leave=False, disable=not progress)
    for n in sizes:
        g = erdos_renyi(n, degree * n // 2, seed=12345 + n)
        acc = {}
        for s in seeds:
            for q in queues:
                st = relaxed.greedy_mis(g, seed=s, n_queues=q, batch=1).stats
                acc.setdefault(("multiqueue", q, ""), []).append(st.wasted)
                bar.update()
            for mode in ("uniform", "adversarial"):
                for k in ks:
                    st = relaxed.greedy_mis(g, seed=s, scheduler="k-relaxed", k=k, mode=mode).stats
                    acc.setdefault(("k-relaxed", k, mode), []).append(st.wasted)
                    bar.update()
        for (sched, param, mode), w in acc.items():
            rows.append({"n": n, "m": g.m, "scheduler": sched, "param": param, "mode": mode,
                         "wasted_mean": float(np.mean(w)), "wasted_std": float(np.std(w)),
                         "wasted": [int(x) for x in w]})
    bar.close()
    slopes = {}
    for n in sizes:
        for sched, mode, label in (("multiqueue", "", "multiqueue vs q"),
                                   ("k-relaxed", "uniform", "k-relaxed uniform vs k"),
                                   ("k-relaxed", "adversarial", "k-relaxed adversarial vs k")):
            pts = sorted((r["param"], r["wasted_mean"]) for r in rows
                         if r["n"] == n and r["scheduler"] == sched and r["mode"] == mode
                         and r["param"] > 1)
            slopes[f"{label}, n={n}"] = _fit_slope([p for p, _ in pts], [w for _, w in pts])
    return rows, slopes


def _time(f):
    t = time.perf_counter()
    out = f()
    return time.perf_counter() - t, out


def speed(n, m, workers, reps, seed, progress=True):
    """Seconds per call, interleaved: sequential Numba greedy vs MultiQueue runs."""
    g = erdos_renyi(n, m, seed=seed + 1)
    rng = np.random.default_rng(seed)
    rank, order = _ranks(None, g.n, "vertex", rng)
    erank, eorder = _ranks(None, g.m, "edge", rng)
    edges = g.edges
    eu = np.ascontiguousarray(edges[:, 0])
    ev = np.ascontiguousarray(edges[:, 1])
    g.edge_ids                                            # build the cached arrays first
    ref_mis = _seq_mis(g.indptr, g.indices, order)
    ref_mate = _seq_matching(eu, ev, eorder, g.n)
    comps = [("MIS", "sequential greedy (Numba)", 1,
              lambda T: _seq_mis(g.indptr, g.indices, order), None)]
    comps += [("MIS", "MultiQueue", T,
               lambda T: relaxed.greedy_mis(g, rank, n_threads=T, seed=seed), "mask")
              for T in workers]
    comps += [("MIS", "exact scheduler", 1,
               lambda T: relaxed.greedy_mis(g, rank, scheduler="exact"), "mask")]
    comps += [("matching", "sequential greedy (Numba)", 1,
               lambda T: _seq_matching(eu, ev, eorder, g.n), None)]
    comps += [("matching", "MultiQueue", T,
               lambda T: relaxed.greedy_matching(g, erank, n_threads=T, seed=seed), "mate")
              for T in workers]
    times = {i: [] for i in range(len(comps))}
    wasted = {i: [] for i in range(len(comps))}
    engine = {i: [] for i in range(len(comps))}
    bar = tqdm(total=(reps + 1) * len(comps), desc="speed", leave=False, disable=not progress)
    for rep in range(reps + 1):                          # rep 0 is the warm-up
        for i, (algo, name, T, f, attr) in enumerate(comps):
            dt, out = _time(lambda: f(T))
            if attr is not None:                         # every run is checked
                ref = ref_mis if attr == "mask" else ref_mate
                if not np.array_equal(getattr(out, attr), ref):
                    raise AssertionError(f"{algo} {name} T={T}: differs from sequential greedy")
            if rep:
                times[i].append(dt)
                if attr is not None:
                    wasted[i].append(out.stats.wasted)
                    engine[i].append(out.stats.seconds)
            bar.update()
    bar.close()
    rows = []
    for i, (algo, name, T, _, attr) in enumerate(comps):
        ts = sorted(times[i])
        rows.append({"algorithm": algo, "competitor": name, "threads": T,
                     "seconds_median": float(np.median(ts)), "seconds_min": ts[0],
                     "seconds_max": ts[-1], "seconds": ts,
                     "engine_seconds_median": float(np.median(engine[i])) if engine[i] else None,
                     "wasted_median": float(np.median(wasted[i])) if wasted[i] else None})
    return rows, {"n": g.n, "m": g.m, "mis_size": int(ref_mis.sum()),
                  "matching_size": int((ref_mate >= 0).sum() // 2)}


def versus_networkx(n, m, seed):
    """One run each at n vertices: networkx's maximal_independent_set (random
    order, quadratic) against MultiQueue MIS on one thread."""
    try:
        import networkx as nx
    except ImportError:
        return None
    g = erdos_renyi(n, m, seed=seed + 2)
    G = nx.Graph()
    G.add_nodes_from(range(g.n))
    G.add_edges_from(g.edges.tolist())
    t_nx, s = _time(lambda: nx.maximal_independent_set(G, seed=seed))
    relaxed.greedy_mis(g, seed=seed)                     # warm
    t_mq, res = _time(lambda: relaxed.greedy_mis(g, seed=seed))
    return {"n": g.n, "m": g.m, "networkx_s": t_nx, "networkx_size": len(s),
            "multiqueue_s": t_mq, "multiqueue_size": int(res.mask.sum()),
            "speedup": t_nx / t_mq}


def plot(d, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.6))
    rows = d["waste"]
    sizes = sorted({r["n"] for r in rows})
    for n in sizes:
        pts = sorted((r["param"], r["wasted_mean"], r["wasted_std"]) for r in rows
                     if r["n"] == n and r["scheduler"] == "multiqueue")
        ax[0].errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                       marker="o", capsize=3, label=f"n = {n:,}")
        for mode, ls in (("uniform", "-"), ("adversarial", "--")):
            pts = sorted((r["param"], r["wasted_mean"]) for r in rows
                         if r["n"] == n and r["scheduler"] == "k-relaxed" and r["mode"] == mode)
            ax[1].plot([p[0] for p in pts], [max(p[1], 0.1) for p in pts], ls, marker="o",
                       label=f"{mode}, n = {n:,}")
    for a, title, xl in ((ax[0], "MultiQueue (1 thread, batch 1)", "queues q"),
                         (ax[1], "k-relaxed scheduler", "k")):
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel(xl)
        a.set_ylabel("wasted iterations (mean over seeds)")
        a.set_title(title)
        a.legend(fontsize=7)
        a.grid(alpha=0.3, which="both")
    sp = d["speed"]
    for algo, marker in (("MIS", "o"), ("matching", "s")):
        mq = sorted((r["threads"], r["seconds_median"]) for r in sp
                    if r["algorithm"] == algo and r["competitor"] == "MultiQueue")
        seq = next(r["seconds_median"] for r in sp
                   if r["algorithm"] == algo and r["competitor"].startswith("sequential"))
        ax[2].plot([t for t, _ in mq], [1e3 * s for _, s in mq], marker=marker,
                   label=f"{algo}, MultiQueue")
        ax[2].axhline(1e3 * seq, ls="--", color=ax[2].lines[-1].get_color(),
                      label=f"{algo}, sequential greedy (Numba)")
    p = d["speed_problem"]
    ax[2].set_title(f"time per call, n={p['n']:,}, m={p['m']:,}")
    ax[2].set_xlabel("threads")
    ax[2].set_ylabel("ms (median)")
    ax[2].set_ylim(bottom=0)
    ax[2].legend(fontsize=7)
    ax[2].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def summary_markdown(d) -> str:
    p = d["speed_problem"]
    lines = [f"Erdős–Rényi graph, n = {p['n']:,}, m = {p['m']:,}, random priorities; "
              "every parallel answer is checked equal to the sequential one. Time per call "
              "(median, min–max), including loading the scheduler:", "",
              "| algorithm | competitor | threads | ms | vs sequential | vs 1 thread | wasted |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for algo in ("MIS", "matching"):
        rs = [r for r in d["speed"] if r["algorithm"] == algo]
        seq = next(r["seconds_median"] for r in rs if r["competitor"].startswith("sequential"))
        one = next((r["seconds_median"] for r in rs
                    if r["competitor"] == "MultiQueue" and r["threads"] == 1), None)
        for r in rs:
            vs1 = (f"{one / r['seconds_median']:.2f}×"
                   if r["competitor"] == "MultiQueue" and one else "")
            w = "" if r["wasted_median"] is None else f"{r['wasted_median']:.0f}"
            lines.append(f"| {algo} | {r['competitor']} | {r['threads']} | "
                         f"{1e3 * r['seconds_median']:.1f} ({1e3 * r['seconds_min']:.1f}–"
                         f"{1e3 * r['seconds_max']:.1f}) | {r['seconds_median'] / seq:.2f}× | "
                         f"{vs1} | {w} |")
    nx = d.get("networkx")
    if nx:
        lines += ["", f"networkx `maximal_independent_set` at n = {nx['n']:,}, m = {nx['m']:,}: "
                  f"{nx['networkx_s']:.2f} s; MultiQueue MIS (1 thread): "
                  f"{1e3 * nx['multiqueue_s']:.1f} ms ({nx['speedup']:.0f}× faster)."]
    lines += ["", "Wasted iterations of greedy MIS on one thread (mean over "
              f"{len(d['waste'][0]['wasted'])} seeds; ER graphs of average degree "
              f"{d['degree']}):", ""]
    sizes = sorted({r["n"] for r in d["waste"]})
    lines += ["| scheduler | " + " | ".join(f"n = {n:,}" for n in sizes) + " |",
              "|---|" + "---:|" * len(sizes)]
    keys = list(dict.fromkeys((r["scheduler"], r["param"], r["mode"]) for r in d["waste"]))
    for sched, param, mode in keys:
        label = (f"MultiQueue q = {param}" if sched == "multiqueue"
                 else f"k-relaxed {mode} k = {param}")
        cells = []
        for n in sizes:
            r = next(r for r in d["waste"] if r["n"] == n and r["scheduler"] == sched
                     and r["param"] == param and r["mode"] == mode)
            cells.append(f"{r['wasted_mean']:.1f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Log-log slopes (wasted ∝ x^slope): " + "; ".join(
        f"{k}: {v:.2f}" for k, v in d["slopes"].items() if v is not None and
        k.endswith(f"n={sizes[-1]}"))]
    h = d["header"]
    lines.append(f"\n<sub>`{h['command']}` · {h['date']} · {h['cpu']}, {h['cpu_count']} CPUs · "
                 f"median of {h['reps']} interleaved repetitions after a warm-up</sub>")
    return "\n".join(lines)
