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
* Training: a small (20k x 2k) and a large (200k x 50k) RCV1-shaped problem
  (``make_rcv1_like``, learnable: held-out accuracy near 0.95), each with rows held
  out (generated beside the training rows and split off, as ``python -m sgd_shm``
  does), 10 epochs, 2 workers; on the parameter server (asp, shared memory) and on
  the eager trainer (sync allreduce, shared memory; under ``mpiexec -n 2`` too when
  MPI is present, dense and top-0.1%): on the small problem dense against TopK at
  k/n = 0.01%, 0.1%, 1%, 10% with and without error feedback, QSGD and DGC's
  threshold on the parameter server; on the large one dense against top-0.1% with
  and without error feedback (a run there costs about ten of the small one).
  Per run: the final held-out accuracy (all held-out rows) and its gap to the dense
  run of the same seed (points), the time to a held-out accuracy (within
  ACC_TARGET_GAP of that dense run's final one, on the trainer's 4096-row held-out
  sample), the final training loss (the trainer's, on 4096 training rows) and its gap,
  bytes sent against dense, bytes per step, seconds.
* Error feedback: for every k, whether TopK without error feedback ends measurably
  worse in held-out accuracy than with it, paired by seed: every seed's difference
  positive and the smallest larger than the run-to-run spread (the largest range over
  the seeds of either run's held-out accuracy), and the k where that stops.
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
CLAIM_RATIO, CLAIM_BYTES = 1e-3, 100.0
#: the training problems: rows, columns, held-out rows (generated with them), lr, alpha,
#: and "grid": False to run only dense and TopK at CLAIM_RATIO with and without error
#: feedback (the large problem: a run of it takes about ten of the small one)
PROBLEMS = {"small": {"samples": 20_000, "features": 2_000, "holdout": 5_000, "lr": 8.0,
                      "alpha": 1e-4, "grid": True},
            "large": {"samples": 200_000, "features": 50_000, "holdout": 20_000, "lr": 8.0,
                      "alpha": 1e-6, "grid": False}}
EPOCHS = 10
WORKERS = 2
#: the claim's held-out accuracy: at most this far (points / 100) below dense's
CLAIM_ACC_GAP = 0.005
#: time to target: to a held-out accuracy this far below the dense run's final one
ACC_TARGET_GAP = 0.01


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
def configs(trainer, ratios, grid=True):
    """(label, compressor factory) for a trainer; a fresh compressor per run.
    ``grid=False``: dense and TopK at CLAIM_RATIO only."""
    from sgd_shm.compress import QSGD, ThresholdTopK, TopK
    out = [("dense", lambda s: None)]
    for r in (ratios if grid else (CLAIM_RATIO,)):
        out.append((f"topk {r:g} ef", lambda s, r=r: TopK(ratio=r)))
        out.append((f"topk {r:g} no-ef", lambda s, r=r: TopK(ratio=r, error_feedback=False)))
    if trainer == "ps" and grid:
        out.append(("qsgd s=16", lambda s: QSGD(levels=16, seed=s)))
        out.append((f"threshold {CLAIM_RATIO:g} ef",
                    lambda s: ThresholdTopK(ratio=CLAIM_RATIO, seed=s)))
    return out


def problem(name, seed):
    """(X, y, X_val, y_val) of a named problem: samples + holdout rows from one
    ``make_rcv1_like`` call, the last ``holdout`` rows held out (as ``python -m
    sgd_shm`` splits its problem)."""
    from sgd_shm.data import make_rcv1_like
    p = PROBLEMS[name]
    X, y = make_rcv1_like(p["samples"] + p["holdout"], p["features"], random_state=seed)
    n = p["samples"]
    return X[:n], y[:n], X[n:], y[n:]


def _full_loss(r, X, y):
    """Mean log loss on every training row (no penalty term)."""
    return float(np.mean(np.logaddexp(0.0, -y * r.decision_function(X))))


def _record(r, X, y, steps, epochs):
    """A run's record; history rows are [seconds, epochs, training loss, held-out
    accuracy on the trainer's held-out sample]."""
    last = max(steps, 1)
    return {"val_score": float(r.val_score), "val_loss": float(r.val_loss),
            "final_loss": float(r.final_loss), "full_loss": _full_loss(r, X, y),
            "bytes_sent": int(r.bytes_sent), "bytes_dense": int(r.bytes_dense),
            "steps": int(steps), "seconds": float(r.seconds),
            "history": [[h["seconds"], epochs * h["step"] / last, h["loss"], h["val_score"]]
                        for h in r.history]}


def _run_ps(data, comp, prob, seed, epochs):
    from sgd_shm.ps import train
    X, y, Xv, yv = data
    r = train(X, y, n_workers=WORKERS, policy="asp", compress=comp, epochs=epochs,
              max_seconds=3600, seed=seed, lr=prob["lr"], alpha=prob["alpha"], progress=False,
              eval_set=(Xv, yv))
    return _record(r, X, y, r.updates, epochs)


def _run_eager(data, comp, prob, seed, epochs):
    from sgd_shm.eager import train
    X, y, Xv, yv = data
    r = train(X, y, n_workers=WORKERS, collective="sync", compress=comp, epochs=epochs,
              max_seconds=3600, seed=seed, lr=prob["lr"], alpha=prob["alpha"],
              sample_every=0.02, progress=False, eval_set=(Xv, yv))
    return _record(r, X, y, r.rounds, epochs)


def _run_eager_mpi(prob, spec, seed, epochs, exe):
    """One eager run under ``mpiexec -n 2`` through the command line, on the same
    rows and held-out rows as ``problem`` draws from ``seed`` (the command seeds its
    problem with the run's seed, so each repetition has its own problem, paired with
    its own dense run); the JSON it writes carries the histories, the final held-out
    accuracy and the bytes (no weights: no all-row loss)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [exe, "-n", str(WORKERS), sys.executable, "-m", "sgd_shm", "eager",
               "--backend", "mpi", "--collectives", "sync", "--imbalance", "0", "0",
               "--epochs", str(epochs), "--seconds", "3600", "--samples",
               str(prob["samples"]), "--features", str(prob["features"]), "--holdout",
               str(prob["holdout"]), "--lr", str(prob["lr"]), "--alpha", str(prob["alpha"]),
               "--seed", str(seed), "--out", tmp] + (["--compress", spec] if spec else [])
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"mpiexec eager failed:\n{p.stderr[-2000:]}")
        with open(os.path.join(tmp, "eager-main.json")) as f:
            r = json.load(f)["runs"]["sync"][0]
    last = max(r["rounds"], 1)
    return {"val_score": r["val_score"], "val_loss": None, "final_loss": r["final_loss"],
            "full_loss": None, "bytes_sent": r["bytes_sent"], "bytes_dense": r["bytes_dense"],
            "steps": r["rounds"], "seconds": r["seconds"],
            "history": [[h["seconds"], epochs * h["step"] / last, h["loss"], h["val_score"]]
                        for h in r["history"]]}


def _plan(problems, ratios, mpi):
    """(problem, trainer, label, runner) in the order a repetition runs them."""
    plan = []
    for name in problems:
        for trainer, runner in (("ps", _run_ps), ("eager", _run_eager)):
            for label, make in configs(trainer, ratios, PROBLEMS[name]["grid"]):
                plan.append((name, trainer, label,
                             lambda data, p, s, e, runner=runner, make=make:
                             runner(data, make(s), p, s, e)))
        if mpi:
            for label, spec in (("dense", None), (f"topk {CLAIM_RATIO:g} ef",
                                                  f"topk:{CLAIM_RATIO:g}")):
                plan.append((name, "eager-mpi", label,
                             lambda data, p, s, e, spec=spec:
                             _run_eager_mpi(p, spec, s, e, mpi)))
    return plan


def training(reps, seed, problems, ratios=RATIOS, epochs=EPOCHS, mpi=None):
    """Every configuration of :func:`_plan`, ``reps`` interleaved repetitions (seeds
    seed, seed + 1, ...; the problem is drawn once from ``seed``)."""
    data = {n: problem(n, seed) for n in problems}
    plan = _plan(problems, ratios, mpi)
    rows = []
    with tqdm(total=reps * len(plan), desc="compress: training runs", unit="run") as bar:
        for rep in range(reps):
            for name, trainer, label, run in plan:
                out = run(data[name], {**PROBLEMS[name]}, seed + rep, epochs)
                rows.append({"part": "training", "problem": name, "trainer": trainer,
                             "config": label, "rep": rep, **out})
                bar.update()
    return rows, data


# ---- summary ---------------------------------------------------------------------------
def _at(history, epoch, col):
    """Column ``col`` of the first sample at or past ``epoch`` (None: not reached)."""
    return next((h[col] for h in history if h[1] >= epoch - 1e-9), None)


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


def _diff(a, b):
    return None if a is None or b is None else a - b


def _time_to(r, level):
    """Seconds of the first sample whose held-out accuracy is >= level (None: never)."""
    return next((h[0] for h in r["history"] if h[3] is not None and h[3] >= level), None)


def _summarize_one(rs, dense, epochs):
    """Medians over the repetitions of each run against the dense run of the same
    repetition (the same seed: the same rows, batches and evaluation samples)."""
    ref = {r["rep"]: r for r in dense}
    acc = [_diff(r["val_score"], ref[r["rep"]]["val_score"]) for r in rs]
    gaps = [_rel(r["final_loss"], ref[r["rep"]]["final_loss"]) for r in rs]
    ttt = [_time_to(r, ref[r["rep"]]["val_score"] - ACC_TARGET_GAP) for r in rs]
    curve = {e: _med(_diff(_at(r["history"], e, 3), _at(ref[r["rep"]]["history"], e, 3))
                     for r in rs) for e in range(1, epochs + 1)}
    sent = _med(r["bytes_sent"] for r in rs)
    dense_bytes = _med(r["bytes_dense"] for r in rs)
    return {"val_score": _med(r["val_score"] for r in rs),
            "val_scores": [r["val_score"] for r in rs],
            "acc_gap": _med(acc), "acc_gap_range": [min(acc), max(acc)],
            "time_to_target": _med(ttt) if None not in ttt else None,
            "reached": sum(t is not None for t in ttt),
            "final_loss": _med(r["final_loss"] for r in rs), "gap": _med(gaps),
            "gap_range": [min(gaps), max(gaps)],
            "full_gap": _med(_rel(r["full_loss"], ref[r["rep"]]["full_loss"]) for r in rs),
            "bytes_sent": sent, "bytes_dense": dense_bytes,
            "bytes_ratio": dense_bytes / max(sent, 1),
            "bytes_per_step": sent / max(_med(r["steps"] for r in rs), 1),
            "seconds": _med(r["seconds"] for r in rs), "runs": len(rs),
            "acc_gap_by_epoch": curve}


def summarize(rows, epochs=EPOCHS):
    """{problem/trainer: {config: medians and gaps against dense}}; the time to
    target is to the final held-out accuracy of the dense run of the same seed minus
    ACC_TARGET_GAP."""
    out = {}
    for (prob, trainer), by in _group(rows).items():
        out[f"{prob}/{trainer}"] = {"target_gap": ACC_TARGET_GAP, "configs": {
            c: _summarize_one(rs, by["dense"], epochs) for c, rs in by.items()}}
    return out


def _feedback_one(on, off):
    """TopK with against without error feedback, paired by seed: the differences of
    the final held-out accuracies, the run-to-run spread (the larger range over the
    seeds of either's accuracy) and whether every difference exceeds it (None with
    fewer than two seeds: no spread to judge against)."""
    a = {r["rep"]: r["val_score"] for r in on}
    b = {r["rep"]: r["val_score"] for r in off}
    reps = sorted(set(a) & set(b))
    diffs = [a[k] - b[k] for k in reps]
    spread = max(max(v) - min(v) for v in ([a[k] for k in reps], [b[k] for k in reps]))
    return {"seeds": len(reps), "diff": statistics.median(diffs),
            "diff_range": [min(diffs), max(diffs)], "spread": spread,
            "measurable": None if len(reps) < 2 else min(diffs) > spread}


def feedback(rows):
    """{problem/trainer: {k/n: :func:`_feedback_one`}} for every TopK ratio run both
    with and without error feedback."""
    out = {}
    for (prob, trainer), by in _group(rows).items():
        res = {}
        for c in by:
            parts = c.split()
            if parts[0] == "topk" and parts[-1] == "ef" and f"topk {parts[1]} no-ef" in by:
                res[parts[1]] = _feedback_one(by[c], by[f"topk {parts[1]} no-ef"])
        if res:
            out[f"{prob}/{trainer}"] = dict(sorted(res.items(), key=lambda t: float(t[0])))
    return out


def claims(summary, fb):
    """The claim per problem and trainer: top-0.1% with error feedback sends >= 100x
    fewer bytes and ends, in every seed, at most CLAIM_ACC_GAP below dense in held-out
    accuracy; its time to target beside dense's; without feedback, the gap."""
    out = {}
    on, off = f"topk {CLAIM_RATIO:g} ef", f"topk {CLAIM_RATIO:g} no-ef"
    for key, s in summary.items():
        c = s["configs"]
        if on not in c:
            continue
        o = c[on]
        first = next((e for e, gp in sorted(o["acc_gap_by_epoch"].items(),
                                             key=lambda t: int(t[0]))
                      if gp is not None and gp >= -CLAIM_ACC_GAP), None)
        out[key] = {"bytes_ratio": o["bytes_ratio"], "val_score": o["val_score"],
                    "dense_val_score": c["dense"]["val_score"], "acc_gap": o["acc_gap"],
                    "acc_gap_range": o["acc_gap_range"], "gap": o["gap"],
                    "time_to_target": o["time_to_target"],
                    "dense_time_to_target": c["dense"]["time_to_target"],
                    "holds": (o["bytes_ratio"] >= CLAIM_BYTES
                              and o["acc_gap_range"][0] >= -CLAIM_ACC_GAP),
                    "no_ef_acc_gap": c[off]["acc_gap"] if off in c else None,
                    "feedback": fb.get(key, {}).get(f"{CLAIM_RATIO:g}"),
                    "first_epoch_within": first}
    return out


def run(reps, seed, *, problems=("small", "large"), ratios=RATIOS, epochs=EPOCHS,
        speed_n=SPEED_N, mpi=None, curve_problem="large"):
    rows = selection(reps, n=speed_n, ratios=ratios, seed=seed)
    tr, data = training(reps, seed, problems, ratios, epochs, mpi)
    rows += tr
    name = curve_problem if curve_problem in data else problems[0]
    X, y = data[name][:2]
    curve = error_curve(X, y, PROBLEMS[name]["alpha"], PROBLEMS[name]["lr"], seed,
                        np.unique(np.concatenate([np.logspace(-4, 0, 13), ratios])))
    summ = summarize(rows, epochs)
    fb = feedback(rows)
    return rows, {"curve": curve, "summary": summ, "feedback": fb, "claims": claims(summ, fb),
                  "reps": reps, "epochs": epochs, "workers": WORKERS, "problems":
                  {n: PROBLEMS[n] for n in problems}, "mpi": mpi is not None}


# ---- report ----------------------------------------------------------------------------
def _pct(x):
    return "-" if x is None else f"{100 * x:+.2f}%"


def _pts(x):
    """A held-out accuracy difference in points (hundredths)."""
    return "-" if x is None else f"{100 * x:+.2f}"


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


def _training_table(key, s, problems):
    prob = problems.get(key.split("/")[0], {})
    size = (f" ({prob['samples']:,} x {prob['features']:,}, {prob['holdout']:,} rows held out)"
            if prob else "")
    lines = [f"{key}{size}: medians over the seeds, each run against the dense run of its "
             f"seed; held-out accuracy on all held-out rows, its gap to dense in points (range "
             f"over the seeds); time to target: to the dense run's final held-out accuracy "
             f"minus {100 * s['target_gap']:g} point(s), on the 4096-row held-out sample "
             "(wall clock of a shared 2-core machine: noisy):", "",
             "| compressor | held-out acc | vs dense, points (range) | time to target | "
             "final training loss | vs dense | bytes sent | dense / sent | bytes per step | "
             "seconds |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c, o in s["configs"].items():
        ttt = (f"{o['time_to_target']:.2f} s" if o["time_to_target"] is not None else
               f"reached in {o['reached']} of {o['runs']}")
        lo, hi = o["acc_gap_range"]
        lines.append(f"| {c} | {o['val_score']:.4f} | {_pts(o['acc_gap'])} ({_pts(lo)} to "
                     f"{_pts(hi)}) | {ttt} | {o['final_loss']:.4f} | {_pct(o['gap'])} | "
                     f"{o['bytes_sent'] / 1e6:.2f} MB | {o['bytes_ratio']:.0f}x | "
                     f"{o['bytes_per_step']:.0f} | {o['seconds']:.1f} |")
    return lines


def _feedback_table(fb):
    lines = ["Error feedback: held-out accuracy of TopK with minus without it, paired by "
             "seed, in points; spread: the larger range over the seeds of either run's "
             "held-out accuracy; measurable: every seed's difference above the spread:", "",
             "| problem / trainer | k / n | seeds | with - without (range) | spread | "
             "measurable |", "|---|---:|---:|---:|---:|---|"]
    for key, res in fb.items():
        for ratio, f in res.items():
            lo, hi = f["diff_range"]
            verdict = {True: "yes", False: "no", None: "one seed"}[f["measurable"]]
            lines.append(f"| {key} | {100 * float(ratio):g}% | {f['seeds']} | "
                         f"{_pts(f['diff'])} ({_pts(lo)} to {_pts(hi)}) | "
                         f"{100 * f['spread']:.2f} | {verdict} |")
    return lines


def _feedback_finding(key, res):
    """Where, over k, dropping error feedback costs held-out accuracy beyond the
    run-to-run spread, and where it stops (the boundary)."""
    yes = [r for r, f in res.items() if f["measurable"]]
    no = [r for r, f in res.items() if f["measurable"] is False]
    if not yes and not no:
        return (f"- {key}: error feedback's effect cannot be judged against run-to-run "
                "spread with one seed.")
    seeds = min(f["seeds"] for f in res.values())

    def ks(rs):
        return ", ".join(f"{100 * float(r):g}%" for r in rs)
    txt = (f"- {key} ({seeds} seeds): without error feedback TopK ends measurably worse in "
           f"held-out accuracy (every seed's difference above the spread) at k/n = "
           f"{ks(yes) or 'none'}")
    if no:
        worst = max(no, key=lambda r: res[r]["diff"])
        txt += (f"; not at {ks(no)} (e.g. {100 * float(worst):g}%: "
                f"{_pts(res[worst]['diff'])} points, spread {100 * res[worst]['spread']:.2f})")
    return txt + "."


def findings(d):
    """The claims per problem and trainer and error feedback's effect over k, in
    words computed from the data."""
    out = []
    for key, c in d.get("claims", {}).items():
        verdict = "holds" if c["holds"] else "does not hold"
        first = (f"; its held-out accuracy first comes within {100 * CLAIM_ACC_GAP:g} point "
                 f"of dense at epoch {c['first_epoch_within']} of {d['epochs']}"
                 if c["first_epoch_within"] else
                 f"; its held-out accuracy is never within {100 * CLAIM_ACC_GAP:g} point of "
                 "dense at an epoch mark")
        t, td = c["time_to_target"], c["dense_time_to_target"]
        ttt = (f"; time to target {t:.2f} s against dense's {td:.2f} s"
               if t is not None and td is not None else
               "; the target is not reached in every seed")
        no_ef = ("" if c["no_ef_acc_gap"] is None else
                 f"; without error feedback {_pts(c['no_ef_acc_gap'])} points")
        lo, hi = c["acc_gap_range"]
        out.append(f"- {key}: top-{100 * CLAIM_RATIO:g}% with error feedback sends "
                   f"{c['bytes_ratio']:.0f}x fewer bytes than dense and ends at held-out "
                   f"accuracy {c['val_score']:.4f} against dense's {c['dense_val_score']:.4f} "
                   f"({_pts(c['acc_gap'])} points, seeds {_pts(lo)} to {_pts(hi)}; training "
                   f"loss {_pct(c['gap'])}): the claim (>= {CLAIM_BYTES:g}x fewer bytes, every "
                   f"seed at most {100 * CLAIM_ACC_GAP:g} point below dense) {verdict}"
                   f"{first}{ttt}{no_ef}.")
    for key, res in d.get("feedback", {}).items():
        out.append(_feedback_finding(key, res))
    return out


def summary_markdown(d):
    rows = d["results"]
    n = next((r["n"] for r in rows if r["part"] == "selection"), SPEED_N)
    lines = [f"Top-k selection on {n:,} float32 (seconds per call, medians):", ""]
    lines += _selection_table(rows)
    for key, s in d.get("summary", {}).items():
        lines += [""] + _training_table(key, s, d.get("problems", {}))
    if d.get("feedback"):
        lines += [""] + _feedback_table(d["feedback"])
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
    keys = list(d.get("summary", {}))
    big = [k for k in keys if k.startswith("large")] or keys
    for ax, key in zip(axes[3:], big):
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
    """The final held-out accuracy gap to dense (points; median and range over the
    seeds) against k/n, with and without error feedback."""
    for i, (key, s) in enumerate(summary.items()):
        for ef, ls in (("ef", "-"), ("no-ef", ":")):
            pts = sorted((float(c.split()[1]), o) for c, o in s["configs"].items()
                         if c.startswith("topk") and c.endswith(f" {ef}"))
            if not pts:
                continue
            xs = [p[0] for p in pts]
            med = [100 * o["acc_gap"] for _, o in pts]
            err = [[m - 100 * o["acc_gap_range"][0] for m, (_, o) in zip(med, pts)],
                   [100 * o["acc_gap_range"][1] - m for m, (_, o) in zip(med, pts)]]
            ax.errorbar(xs, med, yerr=err, fmt="o" + ls, color=f"C{i}", ms=4, capsize=2,
                        label=f"{key} {'with' if ef == 'ef' else 'without'} feedback")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.axhline(-100 * CLAIM_ACC_GAP, color="grey", ls="--", lw=1)
    ax.set(xscale="log", xlabel="k / n", ylabel="held-out accuracy vs dense (points)",
           title="final held-out accuracy gap after the epochs")
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
            h = [p for p in r["history"] if p[3] is not None]
            ax.plot([p[1] for p in h], [p[3] for p in h], color=f"C{i}", lw=1.1,
                    alpha=0.9 if j == 0 else 0.3, label=c if j == 0 else None)
    finals = [r["val_score"] for r in rows if r["part"] == "training"
              and r["problem"] == prob and r["trainer"] == trainer and r["config"] in want]
    if finals:                  # the start (about 0.5) would squash the ends together
        ax.set_ylim(max(0.0, min(finals) - 0.05), 1.0)
    ax.set(xlabel="epochs", ylabel="held-out accuracy (4096 rows)", title=key)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
