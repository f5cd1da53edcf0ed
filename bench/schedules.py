"""Step-size schedules near a network's stable edge (``python -m bench schedules``): the
last model of asynchronous and partially synchronous SGD at a constant step against the
same run on a cosine step (:class:`sgd_shm.core.schedules.Cosine`), on held-out data.

Problem: the kit's reference CNN (:class:`sgd_shm.torch.DigitsCNN`, from
``DigitsCNN(seed=s)``) on scikit-learn's digits (``load_digits_split(0.2)``: 1,437
training images, 360 held out), minibatches of 32, step 0.1. Trainers, 2 workers each:

* ``ps-asp``: the parameter server, ASP, no momentum, 5 epochs (asynchronous pushes act
  like momentum: Mitliagkas et al., "Asynchrony begets momentum", 2016);
* ``eager-sync`` / ``eager-solo`` / ``eager-majority``: the eager trainer's allreduce,
  solo and majority allreduce (late gradients carried), heavy-ball momentum 0.9,
  8 epochs.

Each trainer runs at the constant step 0.1 and at ``Cosine(0.1, total=N)``, N the
constant run's updates (rounds for the eager trainer), so the step falls to 0.001 by the
last update. Repetitions are seeds (the seed of the run and of the CNN's weights), the
two steps back to back within a seed. Reported per trainer and step: the final training
loss (median, worst), the held-out accuracy of the last model (median, quartiles,
lowest) and the paired difference cosine - constant per seed.
"""
from __future__ import annotations

import statistics

import numpy as np
from tqdm import tqdm

LR, BATCH, WORKERS = 0.1, 32, 2
#: name -> (trainer, settings, epochs)
TRAINERS = {
    "ps-asp": ("ps", dict(policy="asp"), 5),
    "eager-sync": ("eager", dict(collective="sync", momentum=0.9), 8),
    "eager-solo": ("eager", dict(collective="solo", momentum=0.9), 8),
    "eager-majority": ("eager", dict(collective="majority", momentum=0.9), 8),
}
STEPS = ("constant", "cosine")


def _train(data, trainer, kw, epochs, lr, seed):
    from sgd_shm import eager, ps
    from sgd_shm.torch import DigitsCNN, TorchModel
    X, Xte, y, yte = data
    common = dict(model=TorchModel(DigitsCNN(seed=seed)), n_workers=WORKERS, epochs=epochs,
                  lr=lr, batch_size=BATCH, seed=seed, eval_set=(Xte, yte), progress=False)
    if trainer == "ps":
        r = ps.train(X, y, **common, **kw)
        return r, r.updates
    r = eager.train(X, y, sample_every=1.0, **common, **kw)
    return r, r.rounds


def _budget(trainer, data, epochs):
    """A run's updates (rounds for the eager trainer) for a constant-step run that
    diverged: the parameter server's budget is epochs times its partitions'
    minibatches; the eager trainer's rounds are epochs * rows / (workers * batch)."""
    from sgd_shm.core.batches import Batches, eager_rounds
    n = data[0].shape[0]
    if trainer == "ps":
        return Batches.draw(n, WORKERS, BATCH, np.random.default_rng(0)).budget(epochs, False)
    return eager_rounds(epochs, n, WORKERS, BATCH)


def run(reps, seed, *, quick=False, progress=True):
    """``reps`` seeds from ``seed``, every trainer at both steps; ``quick``: 1 epoch."""
    from sgd_shm.core.errors import DivergenceError
    from sgd_shm.core.schedules import Cosine
    from sgd_shm.data import load_digits_split
    data = load_digits_split(0.2, random_state=0)
    runs = {(name, step): [] for name in TRAINERS for step in STEPS}
    bar = tqdm(total=reps * len(runs), desc="schedules", leave=False, disable=not progress)
    for s in range(seed, seed + reps):
        for name, (trainer, kw, epochs) in TRAINERS.items():
            epochs = 1 if quick else epochs
            n = None
            for step in STEPS:
                lr = LR if step == "constant" else Cosine(LR, total=n)
                try:
                    r, n = _train(data, trainer, kw, epochs, lr, s)
                    got = {"final_loss": float(r.final_loss), "val_score": float(r.val_score),
                           "val_loss": float(r.val_loss), "seconds": float(r.seconds)}
                except DivergenceError:        # weights no longer finite: no last model
                    got = {"final_loss": float("inf"), "val_score": None, "val_loss": None,
                           "seconds": None}
                    n = n if n is not None else _budget(trainer, data, epochs)
                runs[(name, step)].append({"seed": s, "updates": n, **got})
                bar.update()
    bar.close()
    rows = [_row(name, step, runs[(name, step)], runs[(name, "constant")])
            for name in TRAINERS for step in STEPS]
    return rows, {"problem": {"lr": LR, "batch": BATCH, "workers": WORKERS,
                              "epochs": {k: 1 if quick else v[2] for k, v in TRAINERS.items()},
                              "seeds": reps}}


def _row(name, step, mine, constant):
    """One trainer at one step: its runs and their summary (paired by seed with the
    constant step's runs)."""
    done = [m for m in mine if m["val_score"] is not None]
    acc = np.array([m["val_score"] for m in done] or [np.nan])
    loss = np.array([m["final_loss"] for m in mine])
    diff = [m["val_score"] - c["val_score"] for m, c in zip(mine, constant)
            if m["val_score"] is not None and c["val_score"] is not None]
    return {"trainer": name, "step": step, "runs": mine,
            "updates": mine[0]["updates"], "diverged": len(mine) - len(done),
            "final_loss_median": float(np.median(loss)),
            "final_loss_worst": float(loss.max()),
            "val_score_median": float(np.median(acc)),
            "val_score_quartiles": [float(v) for v in np.percentile(acc, [25, 75])],
            "val_score_lowest": float(acc.min()),
            "val_gain_median": float(statistics.median(diff)) if diff else float("nan")}


def summary_markdown(d):
    p = d["problem"]
    lines = ["| trainer | step | updates | diverged | final loss: median | worst | held-out "
             "accuracy: median | quartiles | lowest | cosine − constant (paired) |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in d["results"]:
        gain = "" if r["step"] == "constant" else f"{100 * r['val_gain_median']:+.1f} pt"
        q = r["val_score_quartiles"]
        lines.append(f"| {r['trainer']} | {r['step']} | {r['updates']:,} | {r['diverged']} | "
                     f"{r['final_loss_median']:.3f} | {r['final_loss_worst']:.3f} | "
                     f"{r['val_score_median']:.3f} | {q[0]:.3f}–{q[1]:.3f} | "
                     f"{r['val_score_lowest']:.3f} | {gain} |")
    h = d["header"]
    ep = ", ".join(f"{k} {v}" for k, v in p["epochs"].items())
    lines.append(f"\n<sub>`{h['command']}` · {h['date']} · {h['cpu']}, {h['cpu_count']} CPUs · "
                 f"{p['seeds']} seeds, each trainer at both steps back to back; step "
                 f"{p['lr']}, minibatch {p['batch']}, {p['workers']} workers; epochs: {ep}; "
                 f"the last model's held-out accuracy on the 360 held-out digits (a run "
                 f"that diverged has no last model: it counts in `diverged` and its final "
                 f"loss as infinite, not in the accuracies)</sub>")
    return "\n".join(lines)


def plot(d, path):
    from matplotlib.figure import Figure      # no pyplot: the backend is left alone
    from bench.common import save_plot
    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    names = list(dict.fromkeys(r["trainer"] for r in d["results"]))
    for r in d["results"]:
        i = names.index(r["trainer"])
        x = i + (-0.15 if r["step"] == "constant" else 0.15)
        acc = [m["val_score"] for m in r["runs"] if m["val_score"] is not None]
        jitter = np.linspace(-0.05, 0.05, len(acc)) if len(acc) > 1 else [0.0]
        ax.scatter(x + np.asarray(jitter), acc, s=14, alpha=0.7,
                   color="C0" if r["step"] == "constant" else "C1",
                   label=r["step"] if i == 0 else None)
        ax.hlines(r["val_score_median"], x - 0.1, x + 0.1, color="k", lw=1.5)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("held-out accuracy of the last model")
    ax.set_title(f"DigitsCNN, step {d['problem']['lr']}: constant vs cosine "
                 f"({d['problem']['seeds']} seeds; bars: medians)", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(loc="lower left")
    return save_plot(fig, path)
