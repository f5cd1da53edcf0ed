"""Greedy MIS / matching under relaxed schedulers (``python -m bench mis``).

Two parts:

* waste: mean wasted iterations (over seeds) of greedy MIS on one thread (a
  sequential simulation of the scheduler) vs the number of MultiQueue queues
  q, vs k for the k-relaxed scheduler (uniform and adversarial), at several
  graph sizes n; with a log-log slope (the exponent of the poly(k) curve).
* speed: a 1M-vertex, 10M-edge Erdős–Rényi graph with random priorities:
  sequential greedy in Numba with the same priorities (order given, and with
  np.argsort computing it) beside the kit's prefix engine and MultiQueue
  scheduler on 1..T threads, and PBBS's binaries when ``--pbbs`` names a built
  checkout; interleaved, each answer checked, median of the repetitions; and
  networkx's maximal_independent_set at 100k vertices (quadratic, one run).
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile
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
                st = relaxed.greedy_mis(g, seed=s, scheduler="multiqueue", n_queues=q,
                                        batch=1).stats
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


# ---- PBBS (an external build, optional) ------------------------------------------------
# Blelloch, Fineman, Gibbons, Shun's Problem Based Benchmark Suite
# (github.com/cmuparlay/pbbsbench): incrementalMIS and incrementalMatching are
# deterministic reservations; serialMIS and serialMatching the sequential loops.
# Their inputs put priority in the ids: the graph relabelled so that vertex id =
# rank, the edge array in rank order. Each timed call runs the binary with one
# round (after its own warm-up) and reads the time it prints for the algorithm.

PBBS_BINARIES = {
    ("MIS", "PBBS incrementalMIS"): "benchmarks/maximalIndependentSet/incrementalMIS/MIS",
    ("MIS", "PBBS serialMIS"): "benchmarks/maximalIndependentSet/serialMIS/MIS",
    ("matching", "PBBS incrementalMatching"):
        "benchmarks/maximalMatching/incrementalMatching/matching",
    ("matching", "PBBS serialMatching"): "benchmarks/maximalMatching/serialMatching/matching",
}


def pbbs_binaries(root):
    """{(algorithm, name): path} of the built PBBS binaries under ``root``."""
    root = os.path.abspath(root)
    found = {}
    for key, rel in PBBS_BINARIES.items():
        path = os.path.join(root, rel)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            found[key] = path
    return found


def write_pbbs_inputs(g, rank, order, eorder, folder):
    """PBBS text inputs for the same graph and priorities: an AdjacencyGraph
    relabelled so that id = rank (sorted neighbour lists) and an EdgeArray in
    edge-rank order. Returns (graph path, edge-array path)."""
    deg = np.diff(g.indptr)[order]
    rows = np.repeat(rank.astype(np.int64), np.diff(g.indptr))
    nb = rank[g.indices].astype(np.int64)
    nb = nb[np.lexsort((nb, rows))]
    offsets = np.concatenate([[0], np.cumsum(deg)[:-1]]).astype(np.int64)
    adj = os.path.join(folder, "graph.adj")
    with open(adj, "w") as f:
        f.write(f"AdjacencyGraph\n{g.n}\n{nb.size}\n")
        offsets.tofile(f, sep="\n")
        f.write("\n")
        nb.tofile(f, sep="\n")
        f.write("\n")
    ea = os.path.join(folder, "edges.ea")
    with open(ea, "w") as f:
        f.write("EdgeArray\n")
        g.edges[eorder].astype(np.int64).tofile(f, sep="\n")
        f.write("\n")
    return adj, ea


def run_pbbs(binary, infile, threads, outfile):
    """Seconds PBBS reports for one round on ``threads`` threads, and the
    integers it writes (MIS: a flag per relabelled vertex; matching: the
    matched edges' ranks)."""
    env = dict(os.environ, PARLAY_NUM_THREADS=str(threads))
    out = subprocess.run([binary, "-r", "1", "-o", outfile, infile], env=env,
                         capture_output=True, text=True, check=True).stdout
    times = [float(x) for x in re.findall(r"Parlay time:\s*([0-9.eE+-]+)", out)]
    if not times:
        raise RuntimeError(f"{binary}: no 'Parlay time' in its output:\n{out}")
    vals = np.loadtxt(outfile, skiprows=1, dtype=np.int64, ndmin=1)
    return times[-1], vals


def _pbbs_comps(root, workers, g, rank, order, eorder, folder, ref_mis, ref_mate):
    """Competitors running the PBBS binaries; each checks its answer too."""
    found = pbbs_binaries(root)
    adj, ea = write_pbbs_inputs(g, rank, order, eorder, folder)
    eu, ev = g.edges[:, 0], g.edges[:, 1]
    matched = ref_mate[eu] == ev
    erank = np.empty(g.m, np.int64)
    erank[eorder] = np.arange(g.m)
    want_ranks = np.sort(erank[matched])
    comps = []
    for (algo, name), path in found.items():
        threads = [1] if "serial" in name else workers
        for T in threads:
            def call(T, path=path, algo=algo):
                out = os.path.join(folder, "out.txt")
                sec, vals = run_pbbs(path, adj if algo == "MIS" else ea, T, out)
                if algo == "MIS":
                    ok = np.array_equal(vals[rank] == 1, ref_mis)
                else:
                    ok = np.array_equal(np.sort(vals), want_ranks)
                return sec, sec, ok, None
            comps.append((algo, name, T, call))
    return comps


# ---- speed -------------------------------------------------------------------------------

def _kit(f, attr, ref):
    def call(T):
        dt, out = _time(lambda: f(T))
        return dt, out.stats.seconds, np.array_equal(getattr(out, attr), ref), out.stats.wasted
    return call


def _plain(f, check=None):
    def call(T):
        dt, out = _time(f)
        return dt, dt, True if check is None else check(out), None
    return call


def speed(n, m, workers, reps, seed, progress=True, pbbs=None, multiqueue=True):
    """Seconds per call, interleaved and checked: sequential Numba greedy (with
    its order given, and with np.argsort computing it), the kit's default prefix
    engine and the MultiQueue scheduler on each thread count, and PBBS's binaries
    when ``pbbs`` names a built checkout; then seeded priorities on both sides
    (the kit's own draw against numpy's permutation)."""
    g = erdos_renyi(n, m, seed=seed + 1)
    rng = np.random.default_rng(seed)
    prio = rng.permutation(g.n)
    eprio = rng.permutation(g.m)
    rank, order = _ranks(prio, g.n, "vertex", None)
    _, eorder = _ranks(eprio, g.m, "edge", None)
    eu = np.ascontiguousarray(g.edges[:, 0])
    ev = np.ascontiguousarray(g.edges[:, 1])
    g.edge_ids                                            # build the cached arrays first
    ref_mis = _seq_mis(g.indptr, g.indices, order)
    ref_mate = _seq_matching(eu, ev, eorder, g.n)
    same_mis = lambda out: np.array_equal(out, ref_mis)     # noqa: E731
    same_mate = lambda out: np.array_equal(out, ref_mate)   # noqa: E731
    comps = [
        ("MIS", "sequential greedy (Numba)", 1,
         _plain(lambda: _seq_mis(g.indptr, g.indices, order), same_mis)),
        ("MIS", "sequential greedy + argsort", 1,
         _plain(lambda: _seq_mis(g.indptr, g.indices, np.argsort(prio).astype(np.int32)),
                same_mis)),
        ("matching", "sequential greedy (Numba)", 1,
         _plain(lambda: _seq_matching(eu, ev, eorder, g.n), same_mate)),
        ("matching", "sequential greedy + argsort", 1,
         _plain(lambda: _seq_matching(eu, ev, np.argsort(eprio).astype(np.int32), g.n),
                same_mate))]
    comps += _seeded_comps(g, workers, seed)
    for T in workers:
        comps.append(("MIS", "prefix", T, _kit(
            lambda T: relaxed.greedy_mis(g, prio, n_threads=T), "mask", ref_mis)))
        comps.append(("matching", "prefix", T, _kit(
            lambda T: relaxed.greedy_matching(g, eprio, n_threads=T), "mate", ref_mate)))
        if multiqueue:
            comps.append(("MIS", "MultiQueue", T, _kit(lambda T: relaxed.greedy_mis(
                g, prio, scheduler="multiqueue", n_threads=T, seed=seed), "mask", ref_mis)))
            comps.append(("matching", "MultiQueue", T, _kit(lambda T: relaxed.greedy_matching(
                g, eprio, scheduler="multiqueue", n_threads=T, seed=seed), "mate", ref_mate)))
    if multiqueue:
        comps.append(("MIS", "exact scheduler", 1, _kit(
            lambda T: relaxed.greedy_mis(g, prio, scheduler="exact"), "mask", ref_mis)))
    with tempfile.TemporaryDirectory(prefix="bench-pbbs-") as folder:
        if pbbs:
            comps += _pbbs_comps(pbbs, workers, g, rank, order, eorder, folder, ref_mis, ref_mate)
        rows = _interleave(comps, reps, progress)
    return rows, {"n": g.n, "m": g.m, "mis_size": int(ref_mis.sum()),
                  "matching_size": int((ref_mate >= 0).sum() // 2)}


def _seeded_comps(g, workers, seed):
    """Priorities drawn from a seed, the call most users make: the kit's whole
    call against the sequential loop over numpy's random permutation."""
    ss = seed + 17
    ref_mis = relaxed.sequential_greedy_mis(g, seed=ss)
    ref_mate = relaxed.sequential_greedy_matching(g, seed=ss)
    eu = np.ascontiguousarray(g.edges[:, 0])
    ev = np.ascontiguousarray(g.edges[:, 1])
    rng = np.random.default_rng(ss)
    comps = [("MIS", "sequential greedy + rng.permutation", 1, _plain(
                 lambda: _seq_mis(g.indptr, g.indices, rng.permutation(g.n).astype(np.int32)))),
             ("matching", "sequential greedy + rng.permutation", 1, _plain(
                 lambda: _seq_matching(eu, ev, rng.permutation(g.m).astype(np.int32), g.n)))]
    for T in workers:
        comps.append(("MIS", "prefix, seed=", T, _kit(
            lambda T: relaxed.greedy_mis(g, seed=ss, n_threads=T), "mask", ref_mis)))
        comps.append(("matching", "prefix, seed=", T, _kit(
            lambda T: relaxed.greedy_matching(g, seed=ss, n_threads=T), "mate", ref_mate)))
    return comps


def _interleave(comps, reps, progress):
    """Every competitor once per round (round 0 is the warm-up), each answer
    checked; medians over the rounds."""
    times = [[] for _ in comps]
    engine = [[] for _ in comps]
    wasted = [[] for _ in comps]
    bar = tqdm(total=(reps + 1) * len(comps), desc="speed", leave=False, disable=not progress)
    for rep in range(reps + 1):
        for i, (algo, name, T, call) in enumerate(comps):
            dt, eng, ok, w = call(T)
            if not ok:
                raise AssertionError(f"{algo} {name} T={T}: differs from sequential greedy")
            if rep:
                times[i].append(dt)
                engine[i].append(eng)
                if w is not None:
                    wasted[i].append(w)
            bar.update()
    bar.close()
    rows = []
    for i, (algo, name, T, _) in enumerate(comps):
        ts = sorted(times[i])
        rows.append({"algorithm": algo, "competitor": name, "threads": T,
                     "seconds_median": float(np.median(ts)), "seconds_min": ts[0],
                     "seconds_max": ts[-1], "seconds": ts,
                     "engine_seconds_median": float(np.median(engine[i])),
                     "wasted_median": float(np.median(wasted[i])) if wasted[i] else None})
    return rows


def versus_networkx(n, m, seed):
    """One run each at n vertices: networkx's maximal_independent_set (random
    order, quadratic) against the kit's greedy_mis on one thread."""
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
    t_kit, res = _time(lambda: relaxed.greedy_mis(g, seed=seed))
    return {"n": g.n, "m": g.m, "networkx_s": t_nx, "networkx_size": len(s),
            "kit_s": t_kit, "kit_size": int(res.mask.sum()), "speedup": t_nx / t_kit}


def _curves(sp, algo, name):
    return sorted((r["threads"], r["seconds_median"]) for r in sp
                  if r["algorithm"] == algo and r["competitor"] == name)


def _plot_waste(ax, rows):
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


def _plot_speed(ax, sp, problem):
    for algo, marker in (("MIS", "o"), ("matching", "s")):
        for name, ls in (("prefix", "-"), ("MultiQueue", ":"),
                         (f"PBBS incremental{'MIS' if algo == 'MIS' else 'Matching'}", "-.")):
            pts = _curves(sp, algo, name)
            if pts:
                ax.plot([t for t, _ in pts], [1e3 * s for _, s in pts], ls, marker=marker,
                        label=f"{algo}, {name}")
        for name, ls in (("sequential greedy (Numba)", "--"), ("sequential greedy + argsort", ":")):
            pts = _curves(sp, algo, name)
            if pts:
                ax.axhline(1e3 * pts[0][1], ls=ls, color="grey" if algo == "MIS" else "black",
                           lw=1, label=f"{algo}, {name}")
    ax.set_title(f"time per call, n={problem['n']:,}, m={problem['m']:,}")
    ax.set_xlabel("threads")
    ax.set_ylabel("ms (median)")
    ax.set_yscale("log")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3, which="both")


def plot(d, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.6))
    if d.get("waste"):
        _plot_waste(ax, d["waste"])
    _plot_speed(ax[2], d["speed"], d["speed_problem"])
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _median(rows, algo, name, threads=None):
    for r in rows:
        if (r["algorithm"] == algo and r["competitor"] == name
                and (threads is None or r["threads"] == threads)):
            return r
    return None


def _speed_table(d):
    p = d["speed_problem"]
    lines = [f"Erdős–Rényi graph, n = {p['n']:,}, m = {p['m']:,}, random priorities; "
             "every answer is checked equal to the sequential one. Time per call as a user "
             "waits for it (median, min–max; the kit's calls include ranking the priorities), "
             "the algorithm alone (the kit's engine; PBBS's own timer, input relabelled by "
             "priority), and the ratio of the sequential greedy loop to each, with its order "
             "given and with its order computed (`np.argsort` of the priorities; for the seeded "
             "rows, `seed=`, numpy's random permutation):",
             "", "| algorithm | competitor | threads | ms | algorithm ms | speed-up vs sequential "
             "| vs sequential + its order | wasted |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for algo in ("MIS", "matching"):
        rs = [r for r in d["speed"] if r["algorithm"] == algo]
        seq = _median(rs, algo, "sequential greedy (Numba)")
        argsort = _median(rs, algo, "sequential greedy + argsort")
        perm = _median(rs, algo, "sequential greedy + rng.permutation")
        for r in rs:
            ms = r["seconds_median"]
            seeded = r["competitor"] in ("prefix, seed=", "sequential greedy + rng.permutation")
            sort = perm if seeded else argsort
            vs = f"{seq['seconds_median'] / ms:.2f}×" if seq else ""
            vsort = f"{sort['seconds_median'] / ms:.2f}×" if sort else ""
            w = "" if r.get("wasted_median") is None else f"{r['wasted_median']:.0f}"
            eng = r.get("engine_seconds_median")
            lines.append(f"| {algo} | {r['competitor']} | {r['threads']} | {1e3 * ms:.1f} "
                         f"({1e3 * r['seconds_min']:.1f}–{1e3 * r['seconds_max']:.1f}) | "
                         f"{'' if eng is None else f'{1e3 * eng:.1f}'} | {vs} | {vsort} | {w} |")
    return lines


def _claims(d):
    """The comparisons the prefix engine is built for, as sentences."""
    rs, out = d["speed"], []
    top = max((r["threads"] for r in rs if r["competitor"] == "prefix"), default=None)
    if top is None:
        return out
    mis, pbbs = _median(rs, "MIS", "prefix", top), _median(rs, "MIS", "PBBS incrementalMIS", top)
    if mis and pbbs:
        out.append(f"MIS on {top} threads: the kit's engine "
                   f"{1e3 * mis['engine_seconds_median']:.1f} ms, PBBS incrementalMIS "
                   f"{1e3 * pbbs['engine_seconds_median']:.1f} ms "
                   f"({mis['engine_seconds_median'] / pbbs['engine_seconds_median']:.2f}×).")
    sort = _median(rs, "MIS", "sequential greedy + argsort")
    if mis and sort:
        out.append(f"Whole `greedy_mis` call on {top} threads: "
                   f"{sort['seconds_median'] / mis['seconds_median']:.2f}× faster than sequential "
                   "greedy with its argsort.")
    one, seq = _median(rs, "matching", "prefix", 1), _median(rs, "matching",
                                                             "sequential greedy (Numba)")
    msort, mtop = (_median(rs, "matching", "sequential greedy + argsort"),
                   _median(rs, "matching", "prefix", top))
    if one and seq:
        out.append(f"Matching on 1 thread: {one['seconds_median'] / seq['seconds_median']:.2f}× "
                   "the time of the sequential loop with its order given.")
    if mtop and msort:
        out.append(f"Matching on {top} threads: {msort['seconds_median'] / mtop['seconds_median']:.2f}× "
                   "faster than sequential greedy with its argsort.")
    for algo in ("MIS", "matching"):
        kit = _median(rs, algo, "prefix, seed=", top)
        perm = _median(rs, algo, "sequential greedy + rng.permutation")
        if kit and perm:
            out.append(f"{algo} with priorities from a seed, {top} threads: "
                       f"{perm['seconds_median'] / kit['seconds_median']:.2f}× faster than "
                       "sequential greedy over numpy's random permutation.")
    return out


def _waste_table(d):
    lines = ["", "Wasted iterations of greedy MIS on one thread (mean over "
             f"{len(d['waste'][0]['wasted'])} seeds; ER graphs of average degree "
             f"{d['degree']}):", ""]
    sizes = sorted({r["n"] for r in d["waste"]})
    lines += ["| scheduler | " + " | ".join(f"n = {n:,}" for n in sizes) + " |",
              "|---|" + "---:|" * len(sizes)]
    keys = list(dict.fromkeys((r["scheduler"], r["param"], r["mode"]) for r in d["waste"]))
    for sched, param, mode in keys:
        label = (f"MultiQueue q = {param}" if sched == "multiqueue"
                 else f"k-relaxed {mode} k = {param}")
        cells = [f"{r['wasted_mean']:.1f}" for n in sizes for r in d["waste"]
                 if r["n"] == n and r["scheduler"] == sched and r["param"] == param
                 and r["mode"] == mode]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Log-log slopes (wasted ∝ x^slope): " + "; ".join(
        f"{k}: {v:.2f}" for k, v in d["slopes"].items() if v is not None and
        k.endswith(f"n={sizes[-1]}"))]
    return lines


def summary_markdown(d) -> str:
    lines = _speed_table(d)
    claims = _claims(d)
    if claims:
        lines += [""] + claims
    nx = d.get("networkx")
    if nx:
        kit = nx.get("kit_s", nx.get("multiqueue_s"))
        lines += ["", f"networkx `maximal_independent_set` at n = {nx['n']:,}, m = {nx['m']:,}: "
                  f"{nx['networkx_s']:.2f} s; the kit's `greedy_mis` (1 thread): "
                  f"{1e3 * kit:.1f} ms ({nx['speedup']:.0f}× faster)."]
    if d.get("waste"):
        lines += _waste_table(d)
    h = d["header"]
    lines.append(f"\n<sub>`{h['command']}` · {h['date']} · {h['cpu']}, {h['cpu_count']} CPUs · "
                 f"median of {h['reps']} interleaved repetitions after a warm-up</sub>")
    return "\n".join(lines)
