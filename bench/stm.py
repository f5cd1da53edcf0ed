"""TL2 STM throughput (``python -m bench stm``): commits/s and abort rate of random
bank transfers (and of a sorted-linked-list integer set) vs workers, for the global version clock and the MultiCounter clock,
under each requestor-aborts conflict policy, with few accounts (contended) and many.

Each worker runs ``TL2._bank`` (nogil): a transaction reads two random accounts and
moves up to 10 from one to the other. Threads of one process and processes on one
shared TL2 (randomized policy). Interleaved repetitions after a warm-up; the sum of
all accounts is checked after every run.
"""
from __future__ import annotations

import statistics
import time

import multiprocess as mp
from tqdm import tqdm

from bench import common
from relaxed import TL2, conflict

POLICIES = ("randomized", "deterministic", "backoff", "abort", "wait")
CLOCKS = ("global", "multicounter")
PER = 1000


def _make(n, clock, policy, shared=False):
    pol = policy if policy in ("abort", "wait") else conflict.policy(policy, B=2e-6)
    stm = TL2(n, clock=clock, conflict=pol, shared=shared)
    for lo in range(0, n, 1024):                      # max_writes per transaction
        stm.atomically(lambda tx, lo=lo: [tx.write(i, PER) for i in range(lo, min(n, lo + 1024))])
    return stm


def _threads(run_one, T, seed):
    """Seconds for T threads each calling run_one(seed), and their results."""
    out = [None] * T

    def work(t):
        out[t] = run_one(seed * 1000 + t)
    return common.timed_threads(work, T), out


def _sample(out, dt):
    """(commits/s, abort rate) of one run from the drivers' counts."""
    commits = sum(o["commits"] for o in out)
    aborts = sum(o["aborts"] for o in out)
    return commits / dt, aborts / max(1, commits + aborts)


def _row(samples, **setting):
    """A result row: the setting plus median/min/max commits/s and median abort rate."""
    rates = sorted(r for r, _ in samples)
    return {**setting, "median": statistics.median(rates), "min": rates[0], "max": rates[-1],
            "rates": rates, "abort_rate": statistics.median(a for _, a in samples)}


def _bank_worker(stm, n_tx, seed):
    return stm._bank(n_tx, seed=seed)


def run(workers, reps, seed, n_tx=100_000, accounts=(64, 4096), progress=True):
    rows = []
    settings = [(n, clock, pol) for n in accounts for clock in CLOCKS for pol in POLICIES]
    bar = tqdm(total=len(settings) * len(workers) * (reps + 1), desc="stm threads",
               leave=False, disable=not progress)
    for T in workers:
        stms = {s: _make(s[0], s[1], s[2]) for s in settings}
        acc = {s: [] for s in settings}
        for rep in range(reps + 1):
            for s in settings:
                dt, out = _threads(lambda sd, st=stms[s]: st._bank(n_tx, seed=sd), T, seed + rep)
                if stms[s].snapshot().sum() != s[0] * PER:
                    raise AssertionError(f"{s}: money was created or lost")
                if rep:
                    acc[s].append(_sample(out, dt))
                bar.update()
        for s in settings:
            rows.append(_row(acc[s], workload="bank", backend="threads", workers=T,
                             accounts=s[0], clock=s[1], policy=s[2]))
            stms[s].close()
    bar.close()
    # processes: one shared TL2 per clock, randomized policy
    ctx = mp.get_context("fork")
    for T in workers:
        stms = {(n, clock): _make(n, clock, "randomized", shared=True)
                for n in accounts for clock in CLOCKS}
        acc = {k: [] for k in stms}
        with ctx.Pool(T) as pool:
            for rep in range(reps + 1):
                for k, stm in stms.items():
                    t0 = time.perf_counter()
                    out = pool.starmap(_bank_worker,
                                       [(stm, n_tx, (seed + rep) * 1000 + t) for t in range(T)])
                    dt = time.perf_counter() - t0
                    if stm.snapshot().sum() != k[0] * PER:
                        raise AssertionError(f"{k}: money was created or lost")
                    if rep:
                        acc[k].append(_sample(out, dt))
        for k, stm in stms.items():
            rows.append(_row(acc[k], workload="bank", backend="processes", workers=T,
                             accounts=k[0], clock=k[1], policy="randomized"))
            stm.close()
    rows += intset(workers, reps, seed, n_ops=max(1, n_tx // 20), progress=progress)
    return rows


def intset(workers, reps, seed, n_ops=5000, universe=256, progress=True):
    """Sorted-linked-list integer set (20% updates), randomized policy, threads."""
    rows = []
    for T in workers:
        stms = {}
        for clock in CLOCKS:
            stm = TL2(universe + 1, clock=clock, conflict=conflict.policy("randomized", B=2e-6))
            stm.atomically(lambda tx: [tx.write(i, -1) for i in range(universe + 1)])
            stm._intset(universe * 4, update_pct=100, seed=seed)     # about half full
            stms[clock] = stm
        acc = {c: [] for c in CLOCKS}
        for rep in range(reps + 1):
            for clock, stm in stms.items():
                dt, out = _threads(lambda sd, st=stm: st._intset(n_ops, update_pct=20, seed=sd),
                                   T, seed + rep)
                if rep:
                    acc[clock].append(_sample(out, dt))
        for clock, stm in stms.items():
            rows.append(_row(acc[clock], workload="intset", backend="threads", workers=T,
                             accounts=universe, clock=clock, policy="randomized"))
            stm._check()
            stm.close()
    return rows


def ratios(rows):
    """MultiCounter clock / global clock commits/s, per setting (same run)."""
    out = []
    for r in rows:
        if r["clock"] != "multicounter":
            continue
        g = next(x for x in rows if x["clock"] == "global" and
                 all(x[k] == r[k] for k in ("workload", "backend", "workers", "accounts", "policy")))
        out.append({k: r[k] for k in ("workload", "backend", "workers", "accounts", "policy")} |
                   {"ratio": r["median"] / g["median"]})
    return out


def plot(d, path):
    from matplotlib.figure import Figure      # no pyplot: the backend is left alone
    rows = d["results"]
    accounts = sorted({r["accounts"] for r in rows if r["workload"] == "bank"})
    fig = Figure(figsize=(6 * len(accounts), 4.3))
    axes = fig.subplots(1, len(accounts), squeeze=False)
    for ax, n in zip(axes[0], accounts):
        for clock, ls in (("global", "-"), ("multicounter", "--")):
            lines = [("threads", pol) for pol in POLICIES] + [("processes", "randomized")]
            for backend, pol in lines:
                pts = sorted((r["workers"], r["median"]) for r in rows
                             if r["workload"] == "bank"
                             and r["accounts"] == n and r["clock"] == clock
                             and r["policy"] == pol and r["backend"] == backend)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] / 1e6 for p in pts], ls,
                            marker="o" if backend == "threads" else "s",
                            label=f"{clock}, {pol}, {backend}")
        ax.set_title(f"TL2 bank transfers, {n} accounts")
        ax.set_xlabel("workers")
        ax.set_ylabel("M commits/s (median)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    return common.save_plot(fig, path)


def summary_markdown(d):
    rows = d["results"]
    ws = sorted({r["workers"] for r in rows})
    lines = ["| workload | backend | words | policy | clock | " +
             " | ".join(f"{w} worker{'s' if w > 1 else ''}" for w in ws) +
             " | MultiCounter / global |",
             "|---|---|---:|---|---|" + "---:|" * len(ws) + "---:|"]
    rat = ratios(rows)
    keys = list(dict.fromkeys((r["workload"], r["backend"], r["accounts"], r["policy"],
                               r["clock"]) for r in rows))
    for wl, b, n, pol, clock in keys:
        cells = []
        for w in ws:
            r = next((r for r in rows if (r["workload"], r["backend"], r["accounts"],
                                          r["policy"], r["clock"], r["workers"])
                      == (wl, b, n, pol, clock, w)), None)
            cells.append(f"{r['median'] / 1e6:.2f} M ({100 * r['abort_rate']:.1f}% ab.)"
                         if r else "–")
        rr = ""
        if clock == "multicounter":
            rr = ", ".join(f"{x['ratio']:.2f}×" for x in rat
                           if (x["workload"], x["backend"], x["accounts"], x["policy"])
                           == (wl, b, n, pol))
        lines.append(f"| {wl} | {b} | {n} | {pol} | {clock} | " + " | ".join(cells)
                     + f" | {rr} |")
    h = d["header"]
    lines.append(f"\n<sub>`{h['command']}` · {h['date']} · {h['cpu']}, {h['cpu_count']} CPUs · "
                 f"commits/s (abort rate) median of {h['reps']} interleaved repetitions after "
                 "a warm-up; ratios per worker count, in the order of the columns</sub>")
    return "\n".join(lines)
