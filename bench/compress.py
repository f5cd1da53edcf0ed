"""Sparsified gradients (``python -m bench compress``): what compression saves and
what it costs, on the parameter server and on the eager trainer, side by side in one
run.

* Selection speed: top-k of 1M float32 (Gaussian and heavy-tailed Cauchy values) for
  k = 0.01% ... 10%: the kit's ``TopK.compress`` (whole call: selection, values,
  message) and its selection kernel beside ``np.argpartition`` of |g| (selection
  alone, unordered) and DGC's sampled threshold; interleaved, medians.
* Error curve (the figure of Alistarh et al., NeurIPS 2018): ||G - TopK(G)|| / ||G||
  against k/n for real minibatch gradients of the RCV1-like problem (at w = 0 and
  after one epoch), the error-feedback accumulator of a top-0.1% run, and a Gaussian
  vector, with the worst-case bound sqrt(1 - k/n).
* Training: a small (20k x 2k) and the RCV1-like (200k x 50k) problem, 10 epochs,
  2 workers; dense against TopK at k/n = 0.01%, 0.1%, 1%, 10% with and without error
  feedback, on the parameter server (asp, shared memory) and on the eager trainer
  (sync allreduce, shared memory; under ``mpiexec -n 2`` too when MPI is present,
  dense and top-0.1%); QSGD and DGC's threshold on the parameter server. Final loss
  (the trainer's, on 4096 training rows, and the log loss on all rows) against the
  dense run of the same seed, bytes sent against dense, bytes per step, seconds, time
  to 1.01 x that dense run's final loss.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from tqdm import tqdm

RATIOS = (1e-4, 1e-3, 1e-2, 1e-1)
SPEED_N = 1_000_000
PROBLEMS = {"small": {"samples": 20_000, "features": 2_000, "lr": 8.0, "alpha": 1e-4},
            "rcv1": {"samples": 200_000, "features": 50_000, "lr": 8.0, "alpha": 1e-6}}
EPOCHS = 10
WORKERS = 2
CLAIM_RATIO, CLAIM_BYTES, CLAIM_GAP = 1e-3, 100.0, 0.01
TARGET = 1.01                 # time to target: to 1.01 x the dense run's final loss


# ---- selection speed -------------------------------------------------------------------
def _vector(dist, n, seed):
    rng = np.random.default_rng(seed)
    g = rng.normal(size=n) if dist == "normal" else rng.standard_cauchy(n)
    return g.astype(np.float32)


def _selectors(g, k):
    from sgd_shm import _select
    from sgd_shm.compress import ThresholdTopK, TopK
    n = g.size
    top, thr = TopK(k=k), ThresholdTopK(k=k, sample=0.01)
    return {"kit TopK.compress": lambda: top.compress(g),
            "kit selection kernel": lambda: _select.topk_indices(g, k),
            "np.argpartition": lambda: np.argpartition(np.abs(g), n - k)[n - k:],
            "DGC threshold": lambda: thr.compress(g)}


def selection(reps, n=SPEED_N, ratios=RATIOS, seed=0):
    """Seconds per call, medians over ``reps`` interleaved rounds after a warm-up."""
    rows = []
    for dist in ("normal", "cauchy"):
        g = _vector(dist, n, seed)
        for ratio in ratios:
            k = max(1, round(ratio * n))
            sel = _selectors(g, k)
            times = {name: [] for name in sel}
            for f in sel.values():
                f()                                           # warm-up (and compile)
            for _ in range(reps):
                for name, f in sel.items():
                    t = time.perf_counter()
                    f()
                    times[name].append(time.perf_counter() - t)
            for name, ts in times.items():
                rows.append({"part": "selection", "dist": dist, "ratio": ratio, "k": k,
                             "n": n, "competitor": name, "seconds": statistics.median(ts)})
    return rows


# ---- error curve -----------------------------------------------------------------------
def _grad(X, y, w, rows, alpha):
    """Minibatch log-loss gradient with the L2 term (y in {-1, +1})."""
    Xb, yb = X[rows], y[rows]
    m = Xb @ w
    coef = -yb / (1.0 + np.exp(yb * m))
    return np.asarray(Xb.T @ coef).ravel() / rows.size + alpha * w


def _rel_error(g, ratios):
    from sgd_shm.compress import TopK
    norm = np.linalg.norm(g)
    out = []
    for r in ratios:
        msg = TopK(ratio=r).compress(g)
        out.append(float(math.sqrt(max(norm ** 2 - float(msg.values @ msg.values), 0.0))
                         / norm))
    return out


def error_curve(X, y, alpha, lr, seed, ratios):
    """||G - TopK(G)|| / ||G|| for the gradients named in the module docstring."""
    from sgd_shm.compress import TopK
    rng = np.random.default_rng(seed)
    n, d = X.shape
    w = np.zeros(d)
    curves = {"minibatch at w = 0": _rel_error(_grad(X, y, w, rng.choice(n, 64), alpha), ratios)}
    for start in range(0, n, 64):                             # one epoch of serial SGD
        w -= lr * _grad(X, y, w, np.arange(start, min(start + 64, n)), alpha)
    curves["minibatch after 1 epoch"] = _rel_error(_grad(X, y, w, rng.choice(n, 64), alpha),
                                                   ratios)
    mem, w2 = TopK(ratio=CLAIM_RATIO).memory(d), np.zeros(d)
    for _ in range(500):                                       # a top-0.1% run with memory
        g = _grad(X, y, w2, rng.choice(n, 64), alpha)
        acc = mem.residual + g                                 # what the compressor sees
        msg = mem.step(g)
        w2[msg.indices] -= lr * msg.values * msg.scale
    curves["error-feedback accumulator (500 steps)"] = _rel_error(acc, ratios)
    curves["Gaussian"] = _rel_error(rng.normal(size=d), ratios)
    bound = [math.sqrt(1.0 - r) for r in ratios]
    return {"ratios": list(ratios), "curves": curves, "bound": bound, "d": d}


# ---- training --------------------------------------------------------------------------
def configs(trainer, ratios):
    """(label, compressor factory) for a trainer; a fresh compressor per run."""
    from sgd_shm.compress import QSGD, ThresholdTopK, TopK
    out = [("dense", lambda s: None)]
    for r in ratios:
        out.append((f"topk {r:g} ef", lambda s, r=r: TopK(ratio=r)))
        out.append((f"topk {r:g} no-ef", lambda s, r=r: TopK(ratio=r, error_feedback=False)))
    if trainer == "ps":
        out.append(("qsgd s=16", lambda s: QSGD(levels=16, seed=s)))
        out.append((f"threshold {CLAIM_RATIO:g} ef",
                    lambda s: ThresholdTopK(ratio=CLAIM_RATIO, seed=s)))
    return out


def _full_loss(r, X, y):
    """Mean log loss on every training row (no penalty term)."""
    return float(np.mean(np.logaddexp(0.0, -y * r.decision_function(X))))


def _record(r, X, y, key, steps, epochs):
    last = max(steps, 1)
    return {"final_loss": float(r.final_loss), "full_loss": _full_loss(r, X, y),
            "bytes_sent": int(r.bytes_sent), "bytes_dense": int(r.bytes_dense),
            "steps": int(steps), "seconds": float(r.seconds),
            "history": [[h["seconds"], epochs * h[key] / last, h["loss"]] for h in r.history]}


def _run_ps(X, y, comp, prob, seed, epochs):
    from sgd_shm.ps import train
    r = train(X, y, n_workers=WORKERS, policy="asp", compress=comp, epochs=epochs,
              max_seconds=3600, seed=seed, lr=prob["lr"], alpha=prob["alpha"], progress=False)
    return _record(r, X, y, "step", r.updates, epochs)


def _run_eager(X, y, comp, prob, seed, epochs):
    from sgd_shm.eager import train
    r = train(X, y, n_workers=WORKERS, collective="sync", compress=comp, epochs=epochs,
              max_seconds=3600, seed=seed, lr=prob["lr"], alpha=prob["alpha"],
              sample_every=0.02, progress=False)
    return _record(r, X, y, "step", r.rounds, epochs)


def _run_eager_mpi(prob, spec, seed, epochs, exe):
    """One eager run under ``mpiexec -n 2`` through the command line; the JSON it
    writes carries the loss history and the bytes (no weights: no full loss)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [exe, "-n", str(WORKERS), sys.executable, "-m", "sgd_shm", "eager",
               "--backend", "mpi", "--collectives", "sync", "--imbalance", "0", "0",
               "--epochs", str(epochs), "--seconds", "3600", "--samples",
               str(prob["samples"]), "--features", str(prob["features"]), "--lr",
               str(prob["lr"]), "--alpha", str(prob["alpha"]), "--seed", str(seed),
               "--out", tmp] + (["--compress", spec] if spec else [])
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"mpiexec eager failed:\n{p.stderr[-2000:]}")
        with open(os.path.join(tmp, "eager-main.json")) as f:
            r = json.load(f)["runs"]["sync"][0]
    last = max(r["rounds"], 1)
    return {"final_loss": r["final_loss"], "full_loss": None, "bytes_sent": r["bytes_sent"],
            "bytes_dense": r["bytes_dense"], "steps": r["rounds"], "seconds": r["seconds"],
            "history": [[h["seconds"], epochs * h["step"] / last, h["loss"]]
                        for h in r["history"]]}


def _plan(problems, ratios, mpi):
    """(problem, trainer, label, runner) in the order a repetition runs them."""
    plan = []
    for name in problems:
        for trainer, runner in (("ps", _run_ps), ("eager", _run_eager)):
            for label, make in configs(trainer, ratios):
                plan.append((name, trainer, label,
                             lambda X, y, p, s, e, runner=runner, make=make:
                             runner(X, y, make(s), p, s, e)))
        if mpi:
            for label, spec in (("dense", None), (f"topk {CLAIM_RATIO:g} ef",
                                                  f"topk:{CLAIM_RATIO:g}")):
                plan.append((name, "eager-mpi", label,
                             lambda X, y, p, s, e, spec=spec:
                             _run_eager_mpi(p, spec, s, e, mpi)))
    return plan


def training(reps, seed, problems, ratios=RATIOS, epochs=EPOCHS, mpi=None):
    """Every configuration of :func:`_plan`, ``reps`` interleaved repetitions."""
    from sgd_shm.data import make_rcv1_like
    data = {n: make_rcv1_like(PROBLEMS[n]["samples"], PROBLEMS[n]["features"],
                              random_state=seed) for n in problems}
    plan = _plan(problems, ratios, mpi)
    rows = []
    with tqdm(total=reps * len(plan), desc="compress: training runs", unit="run") as bar:
        for rep in range(reps):
            for name, trainer, label, run in plan:
                X, y = data[name]
                out = run(X, y, {**PROBLEMS[name]}, seed + rep, epochs)
                rows.append({"part": "training", "problem": name, "trainer": trainer,
                             "config": label, "rep": rep, **out})
                bar.update()
    return rows, data


# ---- summary ---------------------------------------------------------------------------
def _loss_at(history, epoch):
    """The sampled loss at the first sample at or past ``epoch`` (None: not reached)."""
    return next((h[2] for h in history if h[1] >= epoch - 1e-9), None)


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _group(rows):
    g = {}
    for r in rows:
        if r["part"] == "training":
            g.setdefault((r["problem"], r["trainer"]), {}).setdefault(r["config"], []).append(r)
    return g


def _rel(a, b):
    return None if a is None or not b else a / b - 1.0


def _summarize_one(rs, dense, epochs):
    """Medians over the repetitions of each run against the dense run of the same
    repetition (the same seed: the same rows, batches and evaluation sample)."""
    ref = {r["rep"]: r for r in dense}
    gaps = [_rel(r["final_loss"], ref[r["rep"]]["final_loss"]) for r in rs]
    full = [_rel(r["full_loss"], ref[r["rep"]]["full_loss"]) for r in rs]
    ttt = [next((h[0] for h in r["history"]
                 if h[2] <= TARGET * ref[r["rep"]]["final_loss"]), None) for r in rs]
    curve = {}
    for e in range(1, epochs + 1):
        curve[e] = _med(_rel(_loss_at(r["history"], e), _loss_at(ref[r["rep"]]["history"], e))
                        for r in rs)
    sent = _med(r["bytes_sent"] for r in rs)
    dense_bytes = _med(r["bytes_dense"] for r in rs)
    return {"final_loss": _med(r["final_loss"] for r in rs), "gap": _med(gaps),
            "gap_range": [min(gaps), max(gaps)], "full_gap": _med(full),
            "bytes_sent": sent, "bytes_dense": dense_bytes,
            "bytes_ratio": dense_bytes / max(sent, 1),
            "bytes_per_step": sent / max(_med(r["steps"] for r in rs), 1),
            "seconds": _med(r["seconds"] for r in rs),
            "time_to_target": _med(ttt) if None not in ttt else None,
            "gap_by_epoch": curve}


def summarize(rows, epochs=EPOCHS):
    """{problem/trainer: {config: medians and gaps against dense}}; the time to
    target is to TARGET x the final loss of the dense run of the same seed."""
    out = {}
    for (prob, trainer), by in _group(rows).items():
        out[f"{prob}/{trainer}"] = {"target": TARGET, "configs": {
            c: _summarize_one(rs, by["dense"], epochs) for c, rs in by.items()}}
    return out


def claims(summary):
    """The issue's claim per problem and trainer: top-0.1% with error feedback sends
    >= 100x fewer bytes and ends within 1% of dense; the gap without feedback."""
    out = {}
    on, off = f"topk {CLAIM_RATIO:g} ef", f"topk {CLAIM_RATIO:g} no-ef"
    for key, s in summary.items():
        c = s["configs"]
        if on not in c:
            continue
        o = c[on]
        gaps = [o["gap"]] + ([o["full_gap"]] if o["full_gap"] is not None else [])
        first = next((e for e, gp in sorted(o["gap_by_epoch"].items(), key=lambda t: int(t[0]))
                      if gp is not None and gp <= CLAIM_GAP), None)
        out[key] = {"bytes_ratio": o["bytes_ratio"], "gap": o["gap"], "full_gap": o["full_gap"],
                    "holds": o["bytes_ratio"] >= CLAIM_BYTES and max(gaps) <= CLAIM_GAP,
                    "no_ef_gap": c[off]["gap"] if off in c else None,
                    "first_epoch_within": first}
    return out


def run(reps, seed, *, problems=("small", "rcv1"), ratios=RATIOS, epochs=EPOCHS,
        speed_n=SPEED_N, mpi=None, curve_problem="rcv1"):
    rows = selection(reps, n=speed_n, ratios=ratios, seed=seed)
    tr, data = training(reps, seed, problems, ratios, epochs, mpi)
    rows += tr
    X, y = data[curve_problem if curve_problem in data else problems[0]]
    prob = PROBLEMS[curve_problem if curve_problem in data else problems[0]]
    curve = error_curve(X, y, prob["alpha"], prob["lr"], seed,
                        np.unique(np.concatenate([np.logspace(-4, 0, 13), ratios])))
    summ = summarize(rows, epochs)
    return rows, {"curve": curve, "summary": summ, "claims": claims(summ), "reps": reps,
                  "epochs": epochs, "workers": WORKERS, "problems":
                  {n: PROBLEMS[n] for n in problems}, "mpi": mpi is not None}


# ---- report ----------------------------------------------------------------------------
def _pct(x):
    return "-" if x is None else f"{100 * x:+.2f}%"


def _selection_table(rows):
    sel = [r for r in rows if r["part"] == "selection"]
    names = list(dict.fromkeys(r["competitor"] for r in sel))
    lines = ["| values | k / n | " + " | ".join(names) + " | np.argpartition / kit TopK |",
             "|---|---:|" + "---:|" * (len(names) + 1)]
    for dist, ratio in dict.fromkeys((r["dist"], r["ratio"]) for r in sel):
        t = {r["competitor"]: r["seconds"] for r in sel
             if r["dist"] == dist and r["ratio"] == ratio}
        cells = [f"{t[n] * 1e3:.2f} ms" for n in names]
        lines.append(f"| {dist} | {100 * ratio:g}% | " + " | ".join(cells) +
                     f" | {t['np.argpartition'] / t['kit TopK.compress']:.1f}x |")
    return lines


def _training_table(key, s):
    lines = [f"{key} (medians over the seeds, each run against the dense run of its seed; "
             f"target: {s['target']:g} x that run's final loss):", "",
             "| compressor | final loss | vs dense (range) | all-row log loss vs dense | "
             "bytes sent | dense / sent | bytes per step | seconds | time to target |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c, o in s["configs"].items():
        ttt = f"{o['time_to_target']:.2f} s" if o["time_to_target"] is not None else "not reached"
        lo, hi = o["gap_range"]
        lines.append(f"| {c} | {o['final_loss']:.4f} | {_pct(o['gap'])} ({_pct(lo)} to "
                     f"{_pct(hi)}) | "
                     f"{_pct(o['full_gap'])} | {o['bytes_sent'] / 1e6:.2f} MB | "
                     f"{o['bytes_ratio']:.0f}x | {o['bytes_per_step']:.0f} | "
                     f"{o['seconds']:.1f} | {ttt} |")
    return lines


def findings(d):
    """The claim, per problem and trainer, in words computed from the data."""
    out = []
    for key, c in d.get("claims", {}).items():
        verdict = "holds" if c["holds"] else "does not hold"
        first = (f"; its loss curve first comes within 1% of dense at epoch "
                 f"{c['first_epoch_within']} of {d['epochs']}" if c["first_epoch_within"]
                 else "; its loss curve is never within 1% of dense")
        out.append(f"- {key}: top-{100 * CLAIM_RATIO:g}% with error feedback sends "
                   f"{c['bytes_ratio']:.0f}x fewer bytes than dense and ends "
                   f"{_pct(c['gap'])} from dense (all-row log loss {_pct(c['full_gap'])}): "
                   f"the claim {verdict}{first}; without error feedback {_pct(c['no_ef_gap'])}.")
    return out


def summary_markdown(d):
    rows = d["results"]
    n = next((r["n"] for r in rows if r["part"] == "selection"), SPEED_N)
    lines = [f"Top-k selection on {n:,} float32 (seconds per call, medians):", ""]
    lines += _selection_table(rows)
    for key, s in d.get("summary", {}).items():
        lines += [""] + _training_table(key, s)
    cv = d.get("curve")
    if cv:
        lines += ["", f"||G - TopK(G)|| / ||G|| on {cv['d']:,} weights:", "",
                  "| k / n | " + " | ".join(cv["curves"]) + " | bound sqrt(1 - k/n) |",
                  "|---:|" + "---:|" * (len(cv["curves"]) + 1)]
        for i, r in enumerate(cv["ratios"]):
            lines.append(f"| {100 * r:.3g}% | " + " | ".join(
                f"{v[i]:.3f}" for v in cv["curves"].values()) + f" | {cv['bound'][i]:.3f} |")
    f = findings(d)
    if f:
        lines += ["", "Findings (computed from this run):", ""] + f
    return "\n".join(lines)


def plot(d, path):
    from matplotlib.figure import Figure       # no pyplot: the caller's backend is left alone
    fig = Figure(figsize=(15, 8.5))
    axes = fig.subplots(2, 3).ravel()
    _plot_selection(axes[0], d["results"])
    _plot_curve(axes[1], d.get("curve"))
    _plot_gaps(axes[2], d.get("summary", {}))
    for ax, key in zip(axes[3:], [k for k in d.get("summary", {}) if k.startswith("rcv1")]
                       or list(d.get("summary", {}))):
        _plot_history(ax, d["results"], key)
    fig.suptitle(f"Sparsified gradients: {d.get('epochs')} epochs, {d.get('workers')} workers",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return path


def _plot_selection(ax, rows):
    sel = [r for r in rows if r["part"] == "selection" and r["dist"] == "normal"]
    for i, name in enumerate(dict.fromkeys(r["competitor"] for r in sel)):
        pts = [(r["ratio"], r["seconds"] * 1e3) for r in sel if r["competitor"] == name]
        ax.plot(*zip(*pts), "o-", color=f"C{i}", label=name)
    n = sel[0]["n"] if sel else SPEED_N
    ax.set(xscale="log", yscale="log", xlabel="k / n", ylabel="ms per call",
           title=f"top-k of {n:,} float32 (Gaussian)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _plot_curve(ax, cv):
    if not cv:
        return
    for i, (name, ys) in enumerate(cv["curves"].items()):
        ax.plot(cv["ratios"], ys, "o-", ms=3, color=f"C{i}", label=name)
    ax.plot(cv["ratios"], cv["bound"], "k--", lw=1, label="bound sqrt(1 - k/n)")
    ax.set(xscale="log", xlabel="k / n", ylabel="||G - TopK(G)|| / ||G||",
           title=f"what top-k leaves out ({cv['d']:,} weights)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _plot_gaps(ax, summary):
    for i, (key, s) in enumerate(summary.items()):
        for ef, ls in (("ef", "-"), ("no-ef", ":")):
            pts = sorted((float(c.split()[1]), o["gap"] * 100) for c, o in s["configs"].items()
                         if c.startswith("topk") and c.endswith(f" {ef}"))
            if pts:
                ax.plot(*zip(*pts), "o" + ls, color=f"C{i}", ms=4,
                        label=f"{key} {'with' if ef == 'ef' else 'without'} feedback")
    ax.axhline(100 * CLAIM_GAP, color="grey", ls="--", lw=1)
    ax.set(xscale="log", yscale="symlog", xlabel="k / n",
           ylabel="final loss vs dense (%)", title="final loss gap after the epochs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _plot_history(ax, rows, key):
    prob, trainer = key.split("/")
    want = ("dense", f"topk {CLAIM_RATIO:g} ef", f"topk {CLAIM_RATIO:g} no-ef", "qsgd s=16",
            f"threshold {CLAIM_RATIO:g} ef")
    for i, c in enumerate(want):
        rs = [r for r in rows if r["part"] == "training" and r["problem"] == prob
              and r["trainer"] == trainer and r["config"] == c]
        for j, r in enumerate(rs):
            h = r["history"]
            ax.plot([p[1] for p in h], [p[2] for p in h], color=f"C{i}", lw=1.1,
                    alpha=0.9 if j == 0 else 0.3, label=c if j == 0 else None)
    ax.set(xlabel="epochs", ylabel="training loss (4096 rows)", title=key)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
