"""Hogwild on a PyTorch module (``python -m bench torch_nets``): the kit's
:class:`sgd_shm.torch.HogwildNetClassifier` with 1 and 2 workers (threads and
processes; block partitioning on and off) beside a loop written the way PyTorch's
``mnist_hogwild`` example writes it, side by side in one run, on the reference CNN
(:class:`sgd_shm.torch.DigitsCNN`) and the augmented digits
(:func:`sgd_shm.data.make_digits_augmented`: 50,000 training images made from the
training part of scikit-learn's digits; held-out accuracy on the 360 untouched
held-out digits).

Competitors, all from the same initial weights (``DigitsCNN(seed=...)``), minibatches
of ``batch``, ``torch.optim.SGD``'s step (lr, heavy-ball momentum), cross-entropy, one
torch intra-op thread per worker, and the same total work (``epochs`` passes over the
training set in all):

* ``kit-threads-P`` / ``kit-processes-P``: ``HogwildNetClassifier(n_workers=P,
  backend=...)``: each epoch one permutation split into P contiguous parts, one per
  worker, the module's parameters views of one float32 vector (a shared segment for
  processes), momentum per worker;
* ``kit-processes-2-blocks`` / ``kit-threads-2-blocks``: the same with
  ``partition="blocks"`` (each layer owned by one worker, each minibatch moves one of
  the worker's layers: Kungurtsev et al., arXiv:1905.11845);
* ``mnist_hogwild-P``: the example's scheme: ``model.share_memory()``, then P
  ``torch.multiprocessing`` processes (fork), each running the example's ``train``:
  ``torch.manual_seed(seed + rank)``, its own ``DataLoader(dataset, batch_size,
  shuffle=True)`` over the whole training set and its own ``torch.optim.SGD(lr,
  momentum)``, then ``zero_grad``, forward, loss, ``backward``, ``step`` per
  minibatch. As in the example each process walks the whole set per epoch, so each
  runs ``epochs / P`` epochs (the same total work). Departures from the example: the
  data are the augmented digits (a ``TensorDataset``), the loss is cross-entropy on
  the CNN's logits (the example's ``nll_loss`` after ``log_softmax``: the same
  function), and each process calls ``torch.set_num_threads(1)`` (the example leaves
  torch's pool at its default, which on two cores makes two processes fight over
  four threads).

Measured per run: samples per second of training (all the samples the run visited over
the wall time from the first worker's first step to the last worker's last step:
process start-up is excluded for every competitor; the kit's held-out scoring between
epochs is not timed), the final held-out accuracy, and the CPU seconds per 1,000
samples (the kit: ``getrusage`` of the driver and its reaped worker processes around
the whole fit, start-up included; the example: each process's CPU clock over its
training loop): on a machine that other jobs share, the wall clock of a
2-worker run depends on getting two cores at once, while its CPU time per sample shows
whether a worker does more work per sample than alone (on two free cores the
speed-up is at most 2 / that ratio). ``reps`` repetitions with the
competitors interleaved in each (a noisy neighbour hurts them alike), after one
warm-up repetition that is not kept; medians, and ratios paired within a repetition
(2 workers / 1 worker of the same backend; the kit's / the example's at 2).
"""
from __future__ import annotations

import resource
import statistics
import time

import numpy as np
from tqdm import tqdm

#: (name, kind, workers, backend, partition)
COMPETITORS = (
    ("kit-threads-1", "kit", 1, "threads", None),
    ("kit-threads-2", "kit", 2, "threads", None),
    ("kit-processes-1", "kit", 1, "processes", None),
    ("kit-processes-2", "kit", 2, "processes", None),
    ("kit-threads-2-blocks", "kit", 2, "threads", "blocks"),
    ("kit-processes-2-blocks", "kit", 2, "processes", "blocks"),
    ("mnist_hogwild-1", "mnist_hogwild", 1, "processes", None),
    ("mnist_hogwild-2", "mnist_hogwild", 2, "processes", None),
)
#: the claims the findings check: 2 workers / 1 at least this, and the kit's 2
#: workers at least the example's 2 processes' samples/s at held-out accuracy within
#: ACCURACY_GAP
CLAIM_SPEEDUP = 1.5
ACCURACY_GAP = 0.01
SETTINGS = {"n_samples": 50_000, "epochs": 2, "batch": 32, "lr": 0.02, "momentum": 0.9}
QUICK = {"n_samples": 4_000, "epochs": 2}


# ---- the kit -------------------------------------------------------------------------------
def _kit(data, workers, backend, partition, cfg, seed):
    from sgd_shm.torch import DigitsCNN, HogwildNetClassifier
    X, Xte, y, yte = data
    clf = HogwildNetClassifier(DigitsCNN(seed=seed), n_workers=workers, backend=backend,
                               partition=partition, max_epochs=cfg["epochs"], lr=cfg["lr"],
                               momentum=cfg["momentum"], batch_size=cfg["batch"],
                               random_state=seed)
    clf.fit(X, y)
    seconds = clf.history_[-1]["seconds"]
    return {"seconds": seconds, "samples_per_s": cfg["epochs"] * X.shape[0] / seconds,
            "val_score": float(clf.score(Xte, yte))}


# ---- PyTorch's mnist_hogwild example, as it writes it --------------------------------------
def _example_train(rank, args, model, dataset, dataloader_kwargs, times):
    """The example's ``train``: this process's own loader and optimizer on the shared
    model, ``args["epochs"]`` passes over the whole set; records the wall clock and
    its CPU clock at its first and last step in ``times[rank]``."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    torch.manual_seed(args["seed"] + rank)
    train_loader = torch.utils.data.DataLoader(dataset, **dataloader_kwargs)
    optimizer = torch.optim.SGD(model.parameters(), lr=args["lr"], momentum=args["momentum"])
    times[rank, 0], times[rank, 2] = time.time(), time.process_time()
    for _ in range(args["epochs"]):
        model.train()
        for data, target in train_loader:
            optimizer.zero_grad()
            output = model(data)
            loss = F.cross_entropy(output, target)
            loss.backward()
            optimizer.step()
    times[rank, 1], times[rank, 3] = time.time(), time.process_time()


def _mnist_hogwild(data, processes, cfg, seed):
    import torch
    import torch.multiprocessing as mp

    from sgd_shm.torch import DigitsCNN
    X, Xte, y, yte = data
    if cfg["epochs"] % processes:
        raise ValueError(f"epochs ({cfg['epochs']}) must be a multiple of the processes "
                         f"({processes}): each walks the whole set epochs / processes times")
    model = DigitsCNN(seed=seed)
    model.share_memory()
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(X), torch.from_numpy(y))
    kwargs = {"batch_size": cfg["batch"], "shuffle": True}
    args = {"seed": seed, "lr": cfg["lr"], "momentum": cfg["momentum"],
            "epochs": cfg["epochs"] // processes}
    times = torch.zeros((processes, 4), dtype=torch.float64).share_memory_()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_example_train, args=(rank, args, model, dataset, kwargs,
                                                      times)) for rank in range(processes)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"an mnist_hogwild process exited with code {p.exitcode}")
    seconds = float(times[:, 1].max() - times[:, 0].min())
    with torch.no_grad():
        pred = model.eval()(torch.from_numpy(Xte)).argmax(1).numpy()
    return {"seconds": seconds, "samples_per_s": cfg["epochs"] * X.shape[0] / seconds,
            "val_score": float(np.mean(pred == yte)),
            "cpu_s": float((times[:, 3] - times[:, 2]).sum())}


def _cpu_seconds():
    """CPU seconds of this process and of its exited, reaped children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _one(data, comp, cfg, seed):
    """One run, with the CPU seconds it used per 1,000 samples: the kit's fit, whole
    (the driver's and its reaped workers', pool start included); the example's
    training loops (each process's first ``torch.optim.SGD`` imports torch._dynamo:
    seconds of CPU per process before its loop, left out)."""
    from sgd_shm.core.launcher import _join_reapers
    _, kind, workers, backend, partition = comp
    c0 = _cpu_seconds()
    if kind == "kit":
        out = _kit(data, workers, backend, partition, cfg, seed)
        _join_reapers()            # the pool's workers are reaped: their CPU is counted
        cpu = _cpu_seconds() - c0
    else:
        out = _mnist_hogwild(data, workers, cfg, seed)
        cpu = out.pop("cpu_s")
    out["cpu_s_per_1k_samples"] = 1000 * cpu / (cfg["epochs"] * data[0].shape[0])
    return out


# ---- the scenario --------------------------------------------------------------------------
def run(reps, seed, *, n_samples=None, epochs=None, quick=False, warmup=True, progress=True):
    """Every competitor once per repetition, interleaved, after a warm-up repetition
    (not kept). Returns (rows: one per competitor with the runs and medians, extra:
    the settings, the paired ratios and the findings)."""
    import torch

    from sgd_shm.data import make_digits_augmented
    cfg = dict(SETTINGS, **(QUICK if quick else {}))
    if n_samples is not None:
        cfg["n_samples"] = int(n_samples)
    if epochs is not None:
        cfg["epochs"] = int(epochs)
    data = make_digits_augmented(cfg["n_samples"], random_state=seed)
    threads = torch.get_num_threads()
    runs = {c[0]: [] for c in COMPETITORS}
    rounds = list(range(-1 if warmup else 0, reps))
    bar = tqdm(total=len(rounds) * len(COMPETITORS), desc="torch_nets", leave=False,
               disable=not progress)
    try:
        torch.set_num_threads(1)           # the driver's own forward passes (scoring)
        for rep in rounds:
            for comp in COMPETITORS:
                out = _one(data, comp, cfg, seed + max(rep, 0))
                if rep >= 0:
                    runs[comp[0]].append(out)
                bar.update()
    finally:
        torch.set_num_threads(threads)
        bar.close()
    rows = [_row(c, runs[c[0]]) for c in COMPETITORS]
    ratios = _ratios(runs, reps)
    extra = {"settings": {**cfg, "torch": torch.__version__, "held_out": int(len(data[1])),
                          "warmup": bool(warmup)},
             "ratios": ratios}
    extra["findings"] = findings({"results": rows, **extra})
    return rows, extra


def _row(comp, runs):
    name, kind, workers, backend, partition = comp
    med = {k: statistics.median(r[k] for r in runs)
           for k in ("samples_per_s", "val_score", "seconds", "cpu_s_per_1k_samples")}
    return {"competitor": name, "kind": kind, "workers": workers, "backend": backend,
            "partition": partition, "samples_per_s_median": med["samples_per_s"],
            "samples_per_s_min": min(r["samples_per_s"] for r in runs),
            "samples_per_s_max": max(r["samples_per_s"] for r in runs),
            "val_score_median": med["val_score"], "seconds_median": med["seconds"],
            "cpu_s_per_1k_samples_median": med["cpu_s_per_1k_samples"], "runs": runs}


#: paired ratios: (name, numerator, denominator)
PAIRS = (("threads 2 / 1", "kit-threads-2", "kit-threads-1"),
         ("processes 2 / 1", "kit-processes-2", "kit-processes-1"),
         ("mnist_hogwild 2 / 1", "mnist_hogwild-2", "mnist_hogwild-1"),
         ("kit processes 2 / mnist_hogwild 2", "kit-processes-2", "mnist_hogwild-2"),
         ("kit threads 2 / mnist_hogwild 2", "kit-threads-2", "mnist_hogwild-2"),
         ("blocks / no blocks, processes 2", "kit-processes-2-blocks", "kit-processes-2"),
         ("blocks / no blocks, threads 2", "kit-threads-2-blocks", "kit-threads-2"))


def _ratios(runs, reps):
    out = {}
    for name, a, b in PAIRS:
        sp = [runs[a][i]["samples_per_s"] / runs[b][i]["samples_per_s"] for i in range(reps)]
        acc = [runs[a][i]["val_score"] - runs[b][i]["val_score"] for i in range(reps)]
        cpu = [runs[a][i]["cpu_s_per_1k_samples"] / runs[b][i]["cpu_s_per_1k_samples"]
               for i in range(reps)]
        out[name] = {"samples_per_s_ratio_median": statistics.median(sp),
                     "samples_per_s_ratio_runs": sp,
                     "val_score_difference_median": statistics.median(acc),
                     "cpu_per_sample_ratio_median": statistics.median(cpu)}
    return out


def findings(d):
    """The claims, each stated as measured (met or not)."""
    rows = {r["competitor"]: r for r in d["results"]}
    rat = d["ratios"]
    out = []
    for name in ("threads 2 / 1", "processes 2 / 1"):
        r = rat[name]["samples_per_s_ratio_median"]
        c = rat[name]["cpu_per_sample_ratio_median"]
        out.append(f"{name}: {r:.2f}x the samples/s (claim >= {CLAIM_SPEEDUP}x: "
                   f"{'met' if r >= CLAIM_SPEEDUP else 'not met'}); {c:.2f}x the CPU seconds "
                   f"per sample (two workers on two free cores could reach at most "
                   f"{2 / c:.2f}x)")
    ex = rows["mnist_hogwild-2"]
    for kit in ("kit-processes-2", "kit-threads-2"):
        k = rows[kit]
        r = k["samples_per_s_median"] / ex["samples_per_s_median"]
        gap = k["val_score_median"] - ex["val_score_median"]
        met = r >= 1.0 and gap >= -ACCURACY_GAP
        out.append(f"{kit} vs mnist_hogwild-2: {r:.2f}x the samples/s, held-out accuracy "
                   f"{k['val_score_median']:.3f} vs {ex['val_score_median']:.3f} "
                   f"({'met' if met else 'not met'}: >= 1x, accuracy at most "
                   f"{ACCURACY_GAP:.0%} lower)")
    for name in ("blocks / no blocks, processes 2", "blocks / no blocks, threads 2"):
        r = rat[name]
        out.append(f"{name}: {r['samples_per_s_ratio_median']:.2f}x the samples/s, held-out "
                   f"accuracy {r['val_score_difference_median']:+.3f} after the same epochs")
    return out


def summary_markdown(d):
    s = d["settings"]
    load = d["header"].get("loadavg_at_start")
    lines = [f"Hogwild on DigitsCNN, {s['n_samples']:,} augmented digits, {s['epochs']} "
             f"epochs in all, batch {s['batch']}, lr {s['lr']}, momentum {s['momentum']}, "
             f"torch {s['torch']}; held-out accuracy on {s['held_out']} untouched digits; "
             f"medians of {d['header'].get('reps')} interleaved repetitions"
             + (f"; load average {load[0]:.1f} at the start (other processes on the same "
                f"cores slow 2-worker runs most)" if load else "") + ".", "",
             "| competitor | workers | samples/s (median) | [min, max] | held-out accuracy "
             "| CPU s per 1,000 samples |", "|---|---|---|---|---|---|"]
    for r in d["results"]:
        cpu = r.get("cpu_s_per_1k_samples_median")
        lines.append(f"| {r['competitor']} | {r['workers']} | {r['samples_per_s_median']:,.0f} "
                     f"| [{r['samples_per_s_min']:,.0f}, {r['samples_per_s_max']:,.0f}] | "
                     f"{r['val_score_median']:.3f} | {'-' if cpu is None else f'{cpu:.3f}'} |")
    lines += ["", "| paired ratio | samples/s | held-out accuracy difference | CPU per sample |",
              "|---|---|---|---|"]
    for name, r in d["ratios"].items():
        cpu = r.get("cpu_per_sample_ratio_median")
        lines.append(f"| {name} | {r['samples_per_s_ratio_median']:.2f}x | "
                     f"{r['val_score_difference_median']:+.3f} | "
                     f"{'-' if cpu is None else f'{cpu:.2f}x'} |")
    lines += [""] + [f"* {f}" for f in d["findings"]]
    return "\n".join(lines)


def plot(d, path):
    """Samples/s and held-out accuracy of each competitor (medians, min-max bars)."""
    from matplotlib.figure import Figure

    from bench.common import save_plot
    rows = d["results"]
    fig = Figure(figsize=(11, 4))
    ax1, ax2 = fig.subplots(1, 2)
    names = [r["competitor"] for r in rows]
    med = np.array([r["samples_per_s_median"] for r in rows])
    err = [med - [r["samples_per_s_min"] for r in rows],
           np.array([r["samples_per_s_max"] for r in rows]) - med]
    ax1.barh(names, med, xerr=err, color=["C0" if r["kind"] == "kit" else "C3" for r in rows])
    ax1.set_xlabel("samples/s (median, min-max)")
    ax1.invert_yaxis()
    ax2.barh(names, [r["val_score_median"] for r in rows],
             color=["C0" if r["kind"] == "kit" else "C3" for r in rows])
    ax2.set_xlim(0, 1)
    ax2.set_xlabel("held-out accuracy (median)")
    ax2.invert_yaxis()
    h = d["header"]
    load = h.get("loadavg_at_start")
    fig.suptitle(f"Hogwild on DigitsCNN: {h['cpu']} ({h['cpu_count']} CPUs), {h['date'][:10]}"
                 + (f", load average {load[0]:.1f} at start" if load else ""), fontsize=9)
    return save_plot(fig, path)
