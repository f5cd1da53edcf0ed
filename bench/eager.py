"""eager-SGD (``python -m bench eager``): the collectives' speed, then the trainer's
claim, side by side in one run.

Collectives: a float64 allreduce of 1, 4 and 16 MB among P = 2 and 4 ranks on shared
memory (:class:`sgd_shm.collectives.ShmGroup`, forked processes) beside a copy of the
same bytes (``np.copyto``, one process) and, under ``mpiexec -n P``, the kit's
MPICommunicator and a bare ``MPI_Allreduce`` of the same buffer (mpich from PyPI);
the round latency of an 8-element buffer for sync, solo and majority. Medians over
the rounds of each repetition, then over the repetitions.

Trainer: ``make_rcv1_like(20_000, 2_000)`` (and 5,000 more rows held out), 4 ranks,
one rank per round drawn from a shared seed sleeps (the paper's imbalance model), late
gradients carried; sync, solo and majority allreduce interleaved, ``reps`` runs each,
on shared memory and on MPI; time to the target held-out accuracy (rank 0's history),
final held-out accuracy and training loss, rounds/s, participation. Medians.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from tqdm import tqdm

SIZES_MB = (1, 4, 16)
RANKS = (2, 4)
SMALL = 8
KINDS = ("sync", "solo", "majority")
LR = 8.0                      # the step of `python -m sgd_shm eager`
HOLDOUT = 5_000               # held-out rows, as `python -m sgd_shm eager`


def mpiexec():
    """The mpiexec beside this Python (a venv's mpich wheel), else on PATH; None if
    mpi4py or mpiexec is missing."""
    if importlib.util.find_spec("mpi4py") is None:
        return None
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else shutil.which("mpiexec")


# ---- collectives -----------------------------------------------------------------------
def _shm_loop(comm, rounds):
    buf = np.zeros(comm.n)                    # zeros: the sums stay finite
    comm.allreduce(buf)                       # warm-up
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        comm.allreduce(buf)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _shm_small(comm, small_rounds):
    buf = np.zeros(comm.n)
    out = {}
    for kind in KINDS:
        for _ in range(20):
            comm.start(buf, kind).wait()
        t = time.perf_counter()
        for _ in range(small_rounds):
            comm.start(buf, kind).wait()
        out[kind] = (time.perf_counter() - t) / small_rounds
    return out


def shm_speed(P, sizes, rounds, small_rounds):
    from sgd_shm.collectives import ShmGroup
    res = {"sizes": {}, "small": {}}
    for mb in sizes:
        n = int(mb * 2**20) // 8
        with ShmGroup(P, n) as g:
            res["sizes"][str(mb)] = max(g.run(_shm_loop, rounds))
    with ShmGroup(P, SMALL) as g:
        outs = g.run(_shm_small, small_rounds)
    res["small"] = {k: max(o[k] for o in outs) for k in KINDS}
    return res


def memcpy_speed(sizes, rounds):
    out = {}
    for mb in sizes:
        n = int(mb * 2**20) // 8
        a, b = np.ones(n), np.empty(n)
        np.copyto(b, a)
        ts = []
        for _ in range(rounds):
            t = time.perf_counter()
            np.copyto(b, a)
            ts.append(time.perf_counter() - t)
        out[str(mb)] = statistics.median(ts)
    return out


def mpi_speed(P, sizes, rounds, small_rounds):
    exe = mpiexec()
    if exe is None:
        return None
    cmd = [exe, "-n", str(P), sys.executable, "-m", "bench.eager_mpi",
           ",".join(str(s) for s in sizes), str(rounds), str(small_rounds)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def collectives(reps, sizes=SIZES_MB, rounds=20, small_rounds=2000, ranks=RANKS):
    """Rows: one per (backend, P, size) and per (backend, P, kind) for the small
    buffer; medians over ``reps`` repetitions (interleaved backends)."""
    raw = {}
    bar = tqdm(total=reps * len(ranks), desc="collectives", leave=False)
    for rep in range(reps):
        for P in ranks:
            raw.setdefault(("memcpy", 1), []).append({"sizes": memcpy_speed(sizes, rounds)})
            raw.setdefault(("shm", P), []).append(shm_speed(P, sizes, rounds, small_rounds))
            m = mpi_speed(P, sizes, rounds, small_rounds)
            if m is not None:
                raw.setdefault(("mpi", P), []).append(
                    {"sizes": {k: v["kit"] for k, v in m["sizes"].items()},
                     "small": {k: v for k, v in m["small"].items() if k != "bare"}})
                raw.setdefault(("mpi-bare", P), []).append(
                    {"sizes": {k: v["bare"] for k, v in m["sizes"].items()},
                     "small": {"sync": m["small"]["bare"]}})
            bar.update()
    bar.close()
    rows = []
    for (backend, P), runs in raw.items():
        for mb in sizes:
            xs = [r["sizes"][str(mb)] for r in runs]
            rows.append({"part": "bandwidth", "backend": backend, "ranks": P, "mb": mb,
                         "seconds": statistics.median(xs), "all": xs,
                         "gb_per_s": mb * 2**20 / statistics.median(xs) / 1e9})
        for kind in KINDS:
            xs = [r["small"][kind] for r in runs if kind in r.get("small", {})]
            if xs:
                rows.append({"part": "latency", "backend": backend, "ranks": P, "kind": kind,
                             "us": 1e6 * statistics.median(xs), "all": xs})
    return rows


# ---- trainer -----------------------------------------------------------------------------
def trainer(reps, seconds, target, samples, features, imbalance, seed, backends,
            holdout=HOLDOUT):
    from sgd_shm.data import make_rcv1_like
    from sgd_shm.eager.__main__ import compare, summary
    X, y = make_rcv1_like(samples + holdout, features, random_state=seed)
    X, y, held = X[:samples], y[:samples], (X[samples:], y[samples:])
    out = {}
    if "shm" in backends:
        runs = compare(X, y, KINDS, reps, n_workers=4, imbalance=imbalance,
                       max_seconds=seconds, lr=LR, seed=seed, progress=False, eval_set=held)
        out["shm"] = {"summary": summary(runs, target),
                      "curves": {c: [_curve(r) for r in rs] for c, rs in runs.items()}}
    exe = mpiexec()
    if "mpi" in backends and exe is not None:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [exe, "-n", "4", sys.executable, "-m", "sgd_shm", "eager", "--backend",
                   "mpi", "--reps", str(reps), "--seconds", str(seconds), "--target",
                   str(target), "--samples", str(samples), "--features", str(features),
                   "--holdout", str(holdout),
                   "--imbalance", str(imbalance[0]), str(imbalance[1]), "--seed", str(seed),
                   "--lr", str(LR),
                   "--out", tmp]
            p = subprocess.run(cmd, capture_output=True, text=True,
                               timeout=60 + 3 * reps * (seconds + 10))
            if p.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
            with open(os.path.join(tmp, "eager-main.json")) as f:
                d = json.load(f)
        out["mpi"] = {"summary": d["summary"],
                      "curves": {c: [_curve(r) for r in rs] for c, rs in d["runs"].items()}}
    return out


def _curve(r):
    hist = r.history if hasattr(r, "history") else r["history"]
    return {"seconds": [h["seconds"] for h in hist], "step": [h["step"] for h in hist],
            "loss": [h["loss"] for h in hist],
            "val_score": [h["val_score"] for h in hist if "val_score" in h]}


def run(reps, seed, *, seconds=3.0, target=0.935, samples=20_000, features=2_000,
        imbalance=(1, 0.002), backends=("shm", "mpi"), quick=False):
    rows = collectives(reps, sizes=(1,) if quick else SIZES_MB,
                       rounds=5 if quick else 20, small_rounds=200 if quick else 2000)
    tr = trainer(reps, seconds, target, samples, features, imbalance, seed, backends)
    return rows, {"trainer": tr, "target": target, "target_kind": "held-out accuracy",
                  "holdout": HOLDOUT, "imbalance": list(imbalance), "reps": reps,
                  "seconds": seconds, "mpi": mpiexec() is not None}


# ---- report ---------------------------------------------------------------------------------
def summary_markdown(d):
    rows = d["results"]
    lines = ["Allreduce of a float64 buffer, seconds per round (GB/s of buffer):", "",
             "| backend | ranks | " + " | ".join(f"{mb} MB" for mb in SIZES_MB
                                               if any(r.get('mb') == mb for r in rows)) + " |",
             "|---|---:|" + "---:|" * len({r['mb'] for r in rows if 'mb' in r})]
    keys = list(dict.fromkeys((r["backend"], r["ranks"]) for r in rows
                              if r["part"] == "bandwidth"))
    for b, P in keys:
        cells = [f"{r['seconds'] * 1e3:.2f} ms ({r['gb_per_s']:.1f})" for r in rows
                 if r["part"] == "bandwidth" and r["backend"] == b and r["ranks"] == P]
        lines.append(f"| {b} | {P if b != 'memcpy' else '-'} | " + " | ".join(cells) + " |")
    lines += ["", f"Round latency, {SMALL} float64 elements, µs per round:", "",
              "| backend | ranks | " + " | ".join(KINDS) + " |", "|---|---:|---:|---:|---:|"]
    for b, P in keys:
        lat = {r["kind"]: r["us"] for r in rows if r["part"] == "latency"
               and r["backend"] == b and r["ranks"] == P}
        if lat:
            lines.append(f"| {b} | {P} | " + " | ".join(
                f"{lat[k]:.1f}" if k in lat else "-" for k in KINDS) + " |")
    kind = d.get("target_kind", "training loss")
    for backend, tr in d.get("trainer", {}).items():
        lines += ["", f"Trainer on {backend}, 4 ranks, imbalance {tuple(d['imbalance'])}, "
                  f"target {kind} {d['target']}, {d['seconds']:g} s per run (medians):", "",
                  "| collective | rounds/s | time to target | speed-up over sync | held-out "
                  "accuracy | vs sync (points) | final loss | vs sync | gradients in their "
                  "round |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for c, o in tr["summary"].items():
            ttt = f"{o['time_to_target']:.2f} s" if o["time_to_target"] else "not reached"
            sp = f"{o['speedup']:.2f}x" if o.get("speedup") else "-"
            acc = f"{o['val_score']:.4f}" if o.get("val_score") is not None else "–"
            gap = f"{100 * o['val_vs_sync']:+.2f}" if "val_vs_sync" in o else "–"
            lines.append(f"| {c} | {o['rounds_per_s']:.0f} | {ttt} | {sp} | {acc} | {gap} | "
                         f"{o['final_loss']:.4f} | {100 * o.get('final_vs_sync', 0):+.2f}% | "
                         f"{100 * o['participation']:.0f}% |")
    lines += ["", *_findings(d)]
    lines.append(f"\nmedians of {d.get('reps', d['header']['reps'])} repetitions.")
    return "\n".join(lines)


def _findings(d, claim=1.27):
    """One sentence per backend on the paper's claim (>= 1.27x sooner than sync to the
    target, the final held-out accuracy within 1 point of sync's; the final loss within
    1% in files from before held-out data), from the data."""
    out = []
    for backend, tr in d.get("trainer", {}).items():
        sm = tr["summary"]
        parts = []
        for c in ("solo", "majority"):
            o = sm.get(c)
            if not o or o.get("time_to_target") is None:
                parts.append(f"{c} did not reach the target in every run")
                continue
            if o.get("speedup") is None:
                parts.append(f"{c} reached it, sync did not (in every run)")
                continue
            if "val_vs_sync" in o:
                ok = o["speedup"] >= claim and o["val_vs_sync"] >= -0.01
                parts.append(f"{c} {o['speedup']:.2f}x sooner, final held-out accuracy "
                             f"{100 * o['val_vs_sync']:+.2f} points "
                             f"({'holds' if ok else 'short'})")
            else:
                ok = o["speedup"] >= claim and abs(o["final_vs_sync"]) <= 0.01
                parts.append(f"{c} {o['speedup']:.2f}x sooner, final loss "
                             f"{100 * o['final_vs_sync']:+.2f}% ({'holds' if ok else 'short'})")
        held = any("val_vs_sync" in o for o in sm.values())
        out.append(f"- {backend}: " + "; ".join(parts) + f" (claim: >= {claim}x sooner, "
                   + ("final held-out accuracy within 1 point)." if held else "within 1%)."))
    return out


def plot(d, path):
    from matplotlib.figure import Figure
    rows = d["results"]
    tr = d.get("trainer", {})
    fig = Figure(figsize=(12, 4 + 3.5 * len(tr)))
    axes = fig.subplots(1 + len(tr), 2, squeeze=False)
    a_bw, a_lat = axes[0]
    for b, P in dict.fromkeys((r["backend"], r["ranks"]) for r in rows
                              if r["part"] == "bandwidth"):
        pts = [(r["mb"], r["gb_per_s"]) for r in rows if r["part"] == "bandwidth"
               and r["backend"] == b and r["ranks"] == P]
        a_bw.plot(*zip(*pts), marker="o", label=b if b == "memcpy" else f"{b}, {P} ranks")
    a_bw.set_xscale("log", base=2)
    a_bw.set_yscale("log")
    a_bw.set_xlabel("buffer (MB)")
    a_bw.set_ylabel("buffer GB/s (bytes / seconds per round)")
    a_bw.set_title("allreduce against a copy of the same bytes", fontsize=9)
    lat = [r for r in rows if r["part"] == "latency"]
    labels = list(dict.fromkeys(f"{r['backend']}, {r['ranks']}" for r in lat))
    for i, kind in enumerate(KINDS):
        vals = [next((r["us"] for r in lat if f"{r['backend']}, {r['ranks']}" == lab
                      and r["kind"] == kind), 0.0) for lab in labels]
        a_lat.bar(np.arange(len(labels)) + 0.27 * (i - 1), vals, 0.27, label=kind)
    a_lat.set_xticks(range(len(labels)), labels, fontsize=8)
    a_lat.set_ylabel(f"µs per round ({SMALL} elements)")
    a_lat.set_yscale("log")
    a_lat.set_title("round latency", fontsize=9)
    for (backend, t), (a_t, a_r) in zip(tr.items(), axes[1:]):
        for i, (c, curves) in enumerate(t["curves"].items()):
            for j, cv in enumerate(curves):
                kw = {"color": f"C{i}", "alpha": 0.9 if j == 0 else 0.3, "lw": 1.1,
                      "label": c if j == 0 else None}
                held = bool(cv.get("val_score"))
                a_t.plot(cv["seconds"], cv["val_score"] if held else cv["loss"], **kw)
                a_r.plot(cv["step"], cv["loss"], **kw)
        a_t.axhline(d["target"], color="grey", ls="--", lw=1)
        for ax, xl, yl in ((a_t, "seconds", "held-out accuracy" if held else "training loss"),
                           (a_r, "rounds", "training loss")):
            ax.set_xlabel(xl)
            ax.set_ylabel(yl)
            ax.set_title(f"trainer on {backend}, 4 ranks, imbalance {tuple(d['imbalance'])}",
                         fontsize=9)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
