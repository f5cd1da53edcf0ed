"""Training over unreliable links (``python -m bench unreliable``): the Robust Parameter
Server (RPS) of Yu, Tang, Renggli, Kassing, Singla, Alistarh, Zhang and Liu,
"Distributed learning over unreliable networks", ICML 2019 (arXiv:1810.07766), against
the drop rate p and the number of servers S.

Problem: ``make_rcv1_like(samples + holdout, features)`` with the last ``holdout``
rows held out (as ``python -m sgd_shm`` splits its problem), L2-regularised logistic
regression, worker processes on shared memory, ``train(policy="rps", drop=p, n_shards=S,
epochs=E, lr=LR)``: every run does the same work (E times the largest partition's
minibatches rounds), so runs compare at equal epochs. Every message between a worker
and a server, both directions, is lost with probability p.

Series:

* ``shards``: a fixed number of workers (``workers``, 4) and S servers, S in
  {1, 2, 4, 8, 16}: the issue's question, S alone growing;
* ``coupled``: as many workers as servers (n_workers = S): servers and workers grow
  together, as when a larger cluster brings more of both;
* ``asp``: the asynchronous PS (``policy="asp"``) with the same losses, S = 8 and
  ``workers`` workers, at the same work budget: what a plain PS does when pushes and
  answers to pulls are lost.

An RPS run is deterministic given its seed (synchronous rounds, seeded minibatch
order and loss coins), so the repetitions are different seeds: other partitions,
minibatch orders and coins. A run at p is compared with the run at p = 0 of the same
seed, series and S, paired: the held-out accuracy gap is (final held-out accuracy -
that at p = 0) in points, on all held-out rows; the loss gap is (final loss - final
loss at p = 0) / final loss at p = 0, the training loss on up to 4096 rows. Reported
per (series, S, p): the final held-out accuracy and training loss, the median,
smallest and largest of both gaps over the seeds, the observed loss rate, rounds per
second; the held-out accuracy and the loss against epochs of the first seed (from the
coordinator's samples). The findings state, from the data, whether the gaps shrink as
S grows at p = 0.1 and 0.2, whether the run at p = 0.1 with 8 servers ends within
half a point of held-out accuracy and within 1% of the training loss of the reliable
run in every seed, and where not, how far the data go; each gap beside the seeds'
spread of the held-out accuracy at p = 0 (run-to-run noise).
"""
from __future__ import annotations

import statistics
import time

import numpy as np
from tqdm import tqdm

from sgd_shm.data import make_rcv1_like
from sgd_shm.ps import train

DROPS = (0.0, 0.01, 0.05, 0.1, 0.2, 0.3)
SHARDS = (1, 2, 4, 8, 16)
QUICK_DROPS = (0.0, 0.1, 0.3)
QUICK_SHARDS = (1, 4)
WORKERS = 4                  # workers of the "shards" and "asp" series
EPOCHS = 5
LR = 8.0                     # the step of the eager-SGD scenario on the same problem
ASP_SHARDS = 8
CLAIM_DROP, CLAIM_SHARDS, CLAIM_GAP = 0.1, 8, 0.01
#: the claim on held-out accuracy: at most this far (points / 100) below p = 0
CLAIM_ACC_GAP = 0.005
HOLDOUT = 5_000
SHRINK_DROPS = (0.1, 0.2)
SAMPLE_EVERY = 0.01


def _curve(r, per_epoch):
    """(epochs, loss, held-out accuracy) from the coordinator's samples: under RPS a
    sample's version counts rounds; under ASP applied pushes (per_epoch: updates per
    epoch)."""
    return {"epochs": [h["step"] / per_epoch for h in r.history],
            "loss": [h["loss"] for h in r.history],
            "val_score": [h["val_score"] for h in r.history]}


def _one(data, series, S, p, seed, epochs, lr, workers):
    """One run of a series; returns its record."""
    n = S if series == "coupled" else workers
    policy = "asp" if series == "asp" else "rps"
    X, y, Xv, yv = data
    t0 = time.perf_counter()
    r = train(X, y, n_workers=n, policy=policy, drop=p, n_shards=S, epochs=epochs, lr=lr,
              seed=seed, max_seconds=600.0, sample_every=SAMPLE_EVERY, progress=False,
              eval_set=(Xv, yv))
    wall = time.perf_counter() - t0
    done = int(np.sum(r.batches["applied"]))      # minibatches taken (RPS: rounds x workers)
    per_epoch = (r.updates if policy == "rps" else done) / epochs
    return {"final_loss": r.final_loss, "val_score": r.val_score, "updates": r.updates,
            "wall_s": wall,
            "run_s": r.seconds, "observed_drop": r.observed_drop,
            "lost_everywhere": done - r.updates if policy == "asp" else 0,
            "curve": _curve(r, per_epoch)}


def _grid(drops, shards, workers):
    """The (series, S, p) settings, every p of a (series, S) together."""
    out = [("shards", S, p) for S in shards for p in drops]
    out += [("coupled", S, p) for S in shards for p in drops]
    out += [("asp", ASP_SHARDS, p) for p in drops]
    return out


def problem(samples, features, holdout, seed):
    """(X, y, X_val, y_val): ``samples + holdout`` rows of one ``make_rcv1_like``
    call, the last ``holdout`` held out."""
    X, y = make_rcv1_like(samples + holdout, features, random_state=seed)
    return X[:samples], y[:samples], X[samples:], y[samples:]


def run(reps, seed, *, samples=20_000, features=2_000, holdout=HOLDOUT, workers=WORKERS,
        epochs=EPOCHS, lr=LR, drops=DROPS, shards=SHARDS, quick=False, progress=True):
    """Every setting of the grid for ``reps`` seeds (seed, seed + 1, ...; the problem
    is drawn once from ``seed``); rows per (series, S, p) and, in the extra dict, the
    problem, the first seed's curves and the findings. ``quick``: p in QUICK_DROPS, S
    in QUICK_SHARDS, one seed."""
    if quick:
        drops, shards, reps = QUICK_DROPS, QUICK_SHARDS, 1
    drops = tuple(sorted(set(drops) | {0.0}))
    data = problem(samples, features, holdout, seed)
    grid = _grid(drops, shards, workers)
    res = {}
    bar = tqdm(total=len(grid) * reps, desc="unreliable", leave=False, disable=not progress)
    for rep in range(reps):
        for series, S, p in grid:
            res.setdefault((series, S, p), []).append(
                _one(data, series, S, p, seed + rep, epochs, lr, workers))
            bar.update()
    bar.close()
    rows = [_row(series, S, p, workers, res[series, S, p], res[series, S, 0.0])
            for series, S, p in grid]
    curves = {f"{series}/{S}/{p:g}": res[series, S, p][0]["curve"] for series, S, p in grid}
    info = {"samples": samples, "features": features, "holdout": holdout, "workers": workers,
               "epochs": epochs, "lr": lr, "drops": list(drops), "shards": list(shards),
               "asp_shards": ASP_SHARDS, "reps": reps, "seeds": [seed + i for i in range(reps)],
               "sample_every": SAMPLE_EVERY}
    extra = {"problem": info, "curves": curves}
    extra["findings"] = findings({"results": rows, **extra})
    return rows, extra


def _row(series, S, p, workers, runs, base):
    gaps = [(r["final_loss"] - b["final_loss"]) / b["final_loss"] for r, b in zip(runs, base)]
    acc = [r["val_score"] - b["val_score"] for r, b in zip(runs, base)]
    return {"series": series, "policy": "asp" if series == "asp" else "rps",
            "workers": S if series == "coupled" else workers, "shards": S, "drop": p,
            "final_loss": [r["final_loss"] for r in runs],
            "final_loss_median": statistics.median(r["final_loss"] for r in runs),
            "gap": gaps, "gap_median": statistics.median(gaps),
            "gap_range": [min(gaps), max(gaps)],
            "val_score": [r["val_score"] for r in runs],
            "val_score_median": statistics.median(r["val_score"] for r in runs),
            "val_gap": acc, "val_gap_median": statistics.median(acc),
            "val_gap_range": [min(acc), max(acc)],
            "observed_drop": [r["observed_drop"] for r in runs],
            "updates": [r["updates"] for r in runs],
            "updates_per_s_median": statistics.median(r["updates"] / r["run_s"] for r in runs),
            "lost_everywhere": [r["lost_everywhere"] for r in runs],
            "wall_s": [r["wall_s"] for r in runs]}


# ---- findings ---------------------------------------------------------------------------

def _by(rows, series):
    return {(r["shards"], r["drop"]): r for r in rows if r["series"] == series}


def _shrinks(by, p, shards, key="gap"):
    """(gaps by S, the S where the gap first grows again or None, the largest rise
    from one S to the next, spread): the median gaps (``key``: "gap", the relative
    training loss, or "val_gap", the held-out accuracy drop, sign turned so that a
    larger value is worse) at drop p over S and the seeds' spread (the largest max -
    min of a gap over the S), to judge a rise against."""
    sign = -1.0 if key == "val_gap" else 1.0
    gaps = [sign * by[S, p][f"{key}_median"] for S in shards]
    steps = np.diff(gaps)
    rise = next((shards[i + 1] for i, st in enumerate(steps) if st > 0), None)
    spread = max(by[S, p][f"{key}_range"][1] - by[S, p][f"{key}_range"][0] for S in shards)
    return gaps, rise, float(max(steps.max(), 0.0)), spread


def _noise(by, shards):
    """The run-to-run spread of the held-out accuracy at p = 0: the largest range over
    the seeds among the S."""
    return max(max(by[S, 0.0]["val_score"]) - min(by[S, 0.0]["val_score"]) for S in shards)


def _shrink_sentence(who, by, p, shards, key):
    gaps, rise, top, spread = _shrinks(by, p, shards, key)
    acc = key == "val_gap"
    unit, scale, what = ((" points", 100.0, "held-out accuracy drop") if acc else
                         ("%", 100.0, "training loss gap"))
    txt = ", ".join(f"S={S}: {scale * g:+.2f} points" if acc else f"S={S}: {scale * g:+.3f}%"
                    for S, g in zip(shards, gaps))
    verdict = ("shrinks at every step" if rise is None else
               f"first grows again at S={rise} (largest rise {scale * top:.3f}{unit})")
    smaller = gaps[-1] < gaps[0]
    return (f"- {who}, p = {p}: median {what} to p = 0 {txt}; it {verdict}; S={shards[-1]} "
            f"{'below' if smaller else 'not below'} S={shards[0]}; the seeds' spread of one "
            f"gap is up to {scale * spread:.3f}{unit}.")


def _claim_sentence(r, pr, noise):
    ok_acc = min(r["val_gap"]) >= -CLAIM_ACC_GAP
    ok = max(abs(g) for g in r["gap"]) <= CLAIM_GAP
    lo, hi = r["val_gap_range"]
    return (f"- p = {CLAIM_DROP}, {CLAIM_SHARDS} servers, {pr['workers']} workers: final held-out "
            f"accuracy {100 * r['val_gap_median']:+.2f} points from the reliable run (seeds: "
            f"{100 * lo:+.2f} to {100 * hi:+.2f}; the seeds' spread at p = 0 is "
            f"{100 * noise:.2f} points): {'within' if ok_acc else 'not within'} "
            f"{100 * CLAIM_ACC_GAP:g} point in every seed; final training loss "
            f"{100 * r['gap_median']:+.3f}% (seeds: {100 * r['gap_range'][0]:+.3f}% to "
            f"{100 * r['gap_range'][1]:+.3f}%): {'within' if ok else 'not within'} 1% in every "
            "seed (claim: within 1%).")


def _overall(rows):
    """One sentence over every RPS setting with p > 0: the range of the median
    held-out accuracy gaps and how many lie within their own seeds' range (the
    spread of the paired gaps, so a gap inside it is indistinguishable from run-to-run
    noise)."""
    rs = [r for r in rows if r["policy"] == "rps" and r["drop"] > 0
          and not (r["series"] == "coupled" and r["shards"] == 1)]
    if not rs:
        return []
    meds = [r["val_gap_median"] for r in rs]
    inside = sum(r["val_gap_range"][0] <= 0.0 <= r["val_gap_range"][1] for r in rs)
    worst = min(rs, key=lambda r: r["val_gap_median"])
    return [f"- RPS, every setting with p > 0 ({len(rs)}): median held-out accuracy gap to "
            f"p = 0 from {100 * min(meds):+.2f} to {100 * max(meds):+.2f} points (largest drop: "
            f"{worst['series']}, S = {worst['shards']}, p = {worst['drop']:g}); in {inside} of "
            f"{len(rs)} the seeds' gaps straddle 0 (some seeds better at p than at p = 0, "
            "others worse), i.e. no drop beyond run-to-run noise there."]


def findings(d):
    """Sentences on the paper's claims, computed from the rows: the held-out accuracy
    gap first, the training-loss gap beside it."""
    rows, pr = d["results"], d["problem"]
    out = []
    for series, who in (("shards", f"{pr['workers']} workers, S servers"),
                        ("coupled", "as many workers as servers (workers = S)")):
        by = _by(rows, series)
        # coupled S = 1 is one worker: no loss changes its replica, only the server's lag
        shards = [S for S in pr["shards"] if series == "shards" or S > 1]
        if len(shards) < 2:
            continue
        for p in SHRINK_DROPS:
            if (shards[0], p) not in by:
                continue
            for key in ("val_gap", "gap"):
                out.append(_shrink_sentence(who, by, p, shards, key))
    out += _overall(rows)
    by = _by(rows, "shards")
    if (CLAIM_SHARDS, CLAIM_DROP) in by:
        out.append(_claim_sentence(by[CLAIM_SHARDS, CLAIM_DROP], pr,
                                   _noise(by, [S for S, p in by if p == 0.0])))
    asp, rps = _by(rows, "asp"), _by(rows, "shards")
    top = max(pr["drops"])
    if (ASP_SHARDS, top) in asp and (ASP_SHARDS, top) in rps:
        a, r = asp[ASP_SHARDS, top], rps[ASP_SHARDS, top]
        out.append(f"- p = {top}, {ASP_SHARDS} servers (median gaps at equal work): held-out "
                   f"accuracy RPS {100 * r['val_gap_median']:+.2f} points, ASP "
                   f"{100 * a['val_gap_median']:+.2f} points from their reliable runs; training "
                   f"loss RPS {100 * r['gap_median']:+.3f}%, ASP {100 * a['gap_median']:+.3f}%.")
    return out


# ---- report -------------------------------------------------------------------------------

def summary_markdown(d):
    rows, pr = d["results"], d["problem"]
    drops = pr["drops"]
    held = f", {pr['holdout']:,} rows held out" if "holdout" in pr else ""
    lines = [f"RPS on {pr['samples']:,} x {pr['features']:,} RCV1-like{held}, {pr['epochs']} "
             f"epoch(s), lr {pr['lr']:g}; per p: the median gap to p = 0 (paired by seed, "
             f"{pr['reps']} seed{'s' if pr['reps'] > 1 else ''}) of the final held-out "
             "accuracy in points, and in brackets of the final training loss in %:"]
    for series, title in (("shards", f"{pr['workers']} workers, S servers"),
                          ("coupled", "workers = S servers"),
                          ("asp", f"ASP, {pr['workers']} workers, {pr['asp_shards']} shards")):
        by = _by(rows, series)
        ss = sorted({S for S, _ in by})
        rate = "updates/s" if series == "asp" else "rounds/s"
        lines += ["", f"{title}:", "",
                  "| S | held-out acc at p = 0 | loss at p = 0 | " +
                  " | ".join(f"p = {p:g}" for p in drops if p) + f" | {rate} at p = 0 |",
                  "|---:|---:|---:|" + "---:|" * (len(drops))]
        for S in ss:
            cells = [f"{100 * by[S, p]['val_gap_median']:+.2f} "
                     f"({100 * by[S, p]['gap_median']:+.3f}%)" for p in drops if p]
            lines.append(f"| {S} | {by[S, 0.0]['val_score_median']:.4f} | "
                         f"{by[S, 0.0]['final_loss_median']:.4f} | " + " | ".join(cells)
                         + f" | {by[S, 0.0]['updates_per_s_median']:.0f} |")
    lines += ["", "Findings:", "", *d.get("findings", findings(d))]
    return "\n".join(lines)


def _gap_curves(ax, curves, drops, ends, workers):
    """The loss against epochs relative to the run at p = 0 of the same seed (its
    samples interpolated at the run's epochs), for the fewest and the most servers
    and the two largest drop rates, from half an epoch on."""
    for ls, S in zip(("-", "--"), ends):
        base = curves.get(f"shards/{S}/0")
        for i, p in enumerate(drops):
            c = curves.get(f"shards/{S}/{p:g}")
            if not p or p not in drops[-2:] or not c or not base:
                continue
            ep = np.asarray(c["epochs"])
            keep = ep >= 0.5            # before, the two runs' samples sit on a steep curve
            ref = np.interp(ep[keep], base["epochs"], base["loss"])
            ax.plot(ep[keep], 100 * (np.asarray(c["loss"])[keep] / ref - 1), ls=ls, lw=1.1,
                    color=f"C{i}", label=f"S = {S}, p = {p:g}")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_ylabel("training loss gap to p = 0 (%)")
    ax.set_title(f"RPS, {workers} workers: training loss relative to p = 0 (first seed)",
                 fontsize=9)


def _accuracy_curves(ax, curves, series, S, drops, title):
    """Held-out accuracy (the coordinator's 4096-row sample) against epochs."""
    ends = []
    for i, p in enumerate(drops):
        c = curves.get(f"{series}/{S}/{p:g}")
        if c and c.get("val_score"):
            ax.plot(c["epochs"], c["val_score"], color=f"C{i}", lw=1.1, label=f"p = {p:g}",
                    marker="o" if len(c["val_score"]) < 8 else None, ms=3)
            ends.append(c["val_score"][-1])
    if ends:                    # the start (about 0.5) would squash the ends together
        ax.set_ylim(max(0.0, min(ends) - 0.05), 1.0)
    ax.set_ylabel("held-out accuracy")
    ax.set_title(title + " (first seed)", fontsize=9)


def _gap_by_shards(ax, by, drops, shards, title):
    for i, p in enumerate(drops):
        if not p:
            continue
        med = [100 * by[S, p]["val_gap_median"] for S in shards]
        lo = [m - 100 * by[S, p]["val_gap_range"][0] for m, S in zip(med, shards)]
        hi = [100 * by[S, p]["val_gap_range"][1] - m for m, S in zip(med, shards)]
        ax.errorbar(shards, med, yerr=[lo, hi], marker="o", capsize=3, color=f"C{i}",
                    label=f"p = {p:g}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("servers S")
    ax.set_ylabel("final held-out accuracy gap to p = 0 (points)")
    ax.set_title(f"RPS, {title}: median and range over seeds", fontsize=9)


def plot(d, path):
    from matplotlib.figure import Figure
    rows, pr, curves = d["results"], d["problem"], d["curves"]
    drops, shards = pr["drops"], pr["shards"]
    fig = Figure(figsize=(15, 8.5))
    axes = fig.subplots(2, 3)
    mid = shards[len(shards) // 2 + 1] if len(shards) > 2 else shards[-1]
    _accuracy_curves(axes[0][0], curves, "shards", mid, drops,
                     f"RPS, {pr['workers']} workers, S = {mid}")
    _accuracy_curves(axes[0][2], curves, "asp", pr["asp_shards"], drops,
                     f"ASP, {pr['workers']} workers, {pr['asp_shards']} shards")
    _gap_curves(axes[0][1], curves, drops, (shards[0], shards[-1]), pr["workers"])
    for ax in axes[0]:
        ax.set_xlabel("epochs")
    _gap_by_shards(axes[1][0], _by(rows, "shards"), drops, shards,
                   f"{pr['workers']} workers, S servers")
    _gap_by_shards(axes[1][1], _by(rows, "coupled"), drops, shards, "workers = S servers")
    ax = axes[1][2]
    for series, label in (("shards", f"RPS, S = {pr['asp_shards']}"),
                          ("asp", f"ASP, {pr['asp_shards']} shards")):
        by = _by(rows, series)
        ps = [p for p in drops if (pr["asp_shards"], p) in by]
        if ps:
            ax.plot(ps, [100 * by[pr["asp_shards"], p]["val_gap_median"] for p in ps],
                    marker="o", label=label)
    ax.set_xlabel("drop rate p")
    ax.set_ylabel("final held-out accuracy gap to p = 0 (points)")
    ax.set_title(f"RPS and ASP, {pr['workers']} workers, equal work", fontsize=9)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes[1]):
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.axhline(-100 * CLAIM_ACC_GAP, color="grey", ls="--", lw=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
