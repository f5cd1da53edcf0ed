"""The parameter server's version clock under contention: pushes/s of processes that
push tiny fixed gradients as fast as they can, with the exact clock (one atomic word
every push adds to) and the MultiCounter clock (``ParameterStore(clock="multicounter")``,
4 counters per process), 1 and 2 processes.

Two workloads per setting, on an 8-weight store of one shard:

* ``push``: each step is ``pull`` (reads the clock) then ``push`` of a fixed gradient
  (reads the clock for the staleness, locks the shard, applies, bumps the clock): what
  a worker of the parameter server does, less the gradient;
* ``clock``: only the clock's part of a push (a read and an increment), to show what
  the clock itself costs without the rest of the push around it.

Every repetition runs every (workload, processes, clock) for ``seconds`` in an
interleaved order (a noisy neighbour hurts all of them alike); one warm-up repetition
is dropped; tables give the median and range, and the median of the per-repetition
ratios MultiCounter / exact.
"""
from __future__ import annotations

import time

import multiprocess as mp
import numpy as np

from bench import common
from sgd_shm.ps.store import ParameterStore

CLOCKS = ("exact", "multicounter")
WORKLOADS = ("push", "clock")
N_PARAMS = 8


def _push_loop(st, k, t_end):
    g = np.full(N_PARAMS, 2.0 ** -20)
    buf = np.empty(N_PARAMS)
    n = 0
    while time.perf_counter() < t_end:
        _, v = st.pull(worker=k, out=buf)
        res = st.push(g, v, lr=0.0, worker=k)
        while res.deferred:                      # as a worker does: finish it
            st.push_deferred(res)
        n += 1
    return n


def _clock_loop(st, k, t_end):
    """The clock's part of a push: one read (the staleness) and one increment, by the
    store's own words (the exact clock) or its MultiCounter."""
    n = 0
    if st.clock == "exact":
        from sgd_shm.core.atomics import fetch_add_py
        g = st._global
        while time.perf_counter() < t_end:
            int(g[0])
            fetch_add_py(g, 0, 1)
            n += 1
    else:
        mc = st._mc
        while time.perf_counter() < t_end:
            mc.read()
            mc.increment()
            n += 1
    return n


LOOPS = {"push": _push_loop, "clock": _clock_loop}


def _body(st, k, loop, seconds, barrier, out):
    barrier.wait()
    t_end = time.perf_counter() + seconds
    out.put(LOOPS[loop](st, k, t_end))


def measure(workload, processes, clock, seconds):
    """Pushes (or clock steps) per second, all processes together, of one run."""
    ctx = mp.get_context("fork")
    with ParameterStore(N_PARAMS, n_shards=1, n_workers=processes, clock=clock) as st:
        barrier, out = ctx.Barrier(processes), ctx.Queue()
        ps = [ctx.Process(target=_body, args=(st, k, workload, seconds, barrier, out))
              for k in range(processes)]
        for p in ps:
            p.start()
        total = sum(out.get(timeout=60 + 10 * seconds) for _ in ps)
        for p in ps:
            p.join()
        if workload == "push":
            assert st.exact_version == total, (st.exact_version, total)
            st._check()
    return total / seconds


def _warm():
    """Compile (or load) the store's kernels here, before the forks: a child's first
    push would otherwise compile them inside the timed loop."""
    from sgd_shm.core.atomics import fetch_add_py
    from sgd_shm.ps.shm_backend import warm_up
    warm_up()
    fetch_add_py(np.zeros(8, np.int64), 0, 1)


def run(processes_list, reps, seed, seconds=1.0):
    _warm()
    settings = [(w, p, c) for w in WORKLOADS for p in processes_list for c in CLOCKS]
    rates = {s: [] for s in settings}
    order = np.random.default_rng(seed)
    for rep in range(reps + 1):                      # rep 0: warm-up, dropped
        for i in order.permutation(len(settings)):
            s = settings[i]
            r = measure(*s, seconds)
            if rep:
                rates[s].append(r)
    rows = []
    for (w, p, c), rs in rates.items():
        rows.append({"workload": w, "processes": p, "clock": c, "rates": rs,
                     "median": float(np.median(rs)), "min": float(min(rs)),
                     "max": float(max(rs)), "seconds": seconds})
    return rows, {"ratios": ratios(rows)}


def ratios(rows):
    """MultiCounter / exact, per (workload, processes): the median of the
    per-repetition ratios (the runs of one repetition ran next to each other)."""
    out = []
    for r in rows:
        if r["clock"] != "multicounter":
            continue
        e = next(x for x in rows if x["clock"] == "exact" and x["workload"] == r["workload"]
                 and x["processes"] == r["processes"])
        per = [a / b for a, b in zip(r["rates"], e["rates"])]
        out.append({"workload": r["workload"], "processes": r["processes"],
                    "ratio": float(np.median(per)), "ratio_min": float(min(per)),
                    "ratio_max": float(max(per))})
    return out


def summary_markdown(d):
    rows, rat = d["results"], d["ratios"]
    lines = ["| workload | processes | exact clock | MultiCounter clock | MultiCounter / exact |",
             "|---|---:|---:|---:|---:|"]
    for x in rat:
        cells = []
        for c in CLOCKS:
            r = next(r for r in rows if (r["workload"], r["processes"], r["clock"])
                     == (x["workload"], x["processes"], c))
            cells.append(f"{common.fmt_rate(r['median'])}/s ({common.fmt_rate(r['min'])}–"
                         f"{common.fmt_rate(r['max'])})")
        lines.append(f"| {x['workload']} | {x['processes']} | {cells[0]} | {cells[1]} | "
                     f"{x['ratio']:.2f}× ({x['ratio_min']:.2f}–{x['ratio_max']:.2f}) |")
    h = d["header"]
    lines.append(f"\n<sub>`{h['command']}` · {h['date']} · {h['cpu']}, {h['cpu_count']} CPUs · "
                 f"all processes together, median (min–max) of {h['reps']} interleaved "
                 f"repetitions of {rows[0]['seconds']:g} s after a warm-up; ratio: median "
                 "(min–max) of the per-repetition ratios</sub>")
    return "\n".join(lines)


def plot(d, path):
    from matplotlib.figure import Figure
    rows = d["results"]
    fig = Figure(figsize=(10, 4))
    axes = fig.subplots(1, len(WORKLOADS))
    for ax, w in zip(axes, WORKLOADS):
        ps = sorted({r["processes"] for r in rows})
        x = np.arange(len(ps))
        for i, c in enumerate(CLOCKS):
            rs = [next(r for r in rows if (r["workload"], r["processes"], r["clock"])
                       == (w, p, c)) for p in ps]
            med = np.array([r["median"] for r in rs]) / 1e6
            err = [med - np.array([r["min"] for r in rs]) / 1e6,
                   np.array([r["max"] for r in rs]) / 1e6 - med]
            ax.bar(x + (i - 0.5) * 0.38, med, 0.38, yerr=err, capsize=3, label=f"{c} clock")
        ax.set_xticks(x, [f"{p} process{'es' if p > 1 else ''}" for p in ps])
        ax.set_ylabel("M per second, all processes (median)")
        ax.set_title("pull + push, 8 weights" if w == "push" else "the clock alone "
                     "(read + increment)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    return common.save_plot(fig, path)
