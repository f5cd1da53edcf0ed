"""DDP communication hooks on the reference CNN (``python -m bench torch_ddp``): two
claims, each side by side in one run, on :class:`sgd_shm.torch.DigitsCNN` and the
handwritten digits (:func:`sgd_shm.data.load_digits_split`, or with ``--torch-ddp-data
augmented`` the >= 50,000-image set of :func:`sgd_shm.data.make_digits_augmented`),
held-out accuracy on the untouched held-out digits.

Every run is P processes (``--torch-ddp-ranks``, 2 by default on a 2-core box) of an
unchanged PyTorch DDP loop (gloo on the CPU, one intra-op thread per rank): each rank
walks its own shard of the training rows (rows k, k + P, ...) in a fresh random order
per epoch, minibatches of ``batch`` rows, ``torch.optim.SGD`` (plain, lr 0.2, by
default; with ``momentum`` > 0, DDP's allreduce and the partial hooks run
``torch.optim.SGD(momentum=...)``, and the compression hook applies the momentum
itself, Deep Gradient Compression's momentum correction, before an optimizer without
momentum: a momentum optimizer after a sparse hook amplifies every entry that a
residual releases late). Every ``eval_every`` steps every rank measures the held-out
accuracy (a forward pass over the 360 held-out images, inside the timed loop: on every
rank, so that the ranks' loads differ only by the injected delays), and rank 0's
record is kept, with its accuracy at the end.

(a) eager-SGD under load imbalance: the eager-SGD paper's model (Li et al., PPoPP 2020,
    arXiv:1908.04207; ``sgd_shm.eager``'s ``imbalance=(k, seconds)``): before each step,
    ``k`` ranks drawn from a seed that all ranks share (:func:`sgd_shm.eager.sleepers`)
    sleep ``seconds``. DDP's own allreduce (no hook) against
    :func:`sgd_shm.torch.hooks.partial_allreduce_hook` with solo and majority rounds on
    the kit's shared-memory communicator (late gradients dropped, as fflib2; the mean
    over the round's contributors, so that a round of one gradient is a full step; with
    ``late="carry"`` a rank that stays behind, which an unchanged DDP loop cannot skip
    ahead, sends many steps of gradient at once when it is next on time), the same
    epochs: seconds to the target held-out accuracy (rank 0's clock,
    from a barrier before the first step), final held-out accuracy, steps/s, the mean
    contributors per round.
(b) compression: :func:`sgd_shm.torch.hooks.compression_hook` with TopK at 0.1 % of each
    bucket, with and without error feedback, against DDP's dense allreduce, the same
    epochs, no imbalance: final held-out accuracy, bytes sent per rank.

``reps`` repetitions, the competitors interleaved within each (a noisy neighbour
hurts them alike), after one warm-up run that is not kept; medians.
"""
from __future__ import annotations

import statistics
import time

import numpy as np
from tqdm import tqdm

#: what the ranks' forkserver imports once beside torch (see sgd_shm.torch.ranks)
PRELOAD = ["sgd_shm.torch.hooks", "sgd_shm.torch.nets", "sgd_shm.collectives.shm",
           "sgd_shm.compress"]
IMBALANCE_MODES = ("allreduce", "solo", "majority")
COMPRESS_MODES = ("dense", "topk", "topk-no-ef")
TOPK_RATIO = 0.001


# ---- one rank -----------------------------------------------------------------------------
def _hook(job):
    """(state, hook) for the run's mode; (None, None): DDP's own allreduce."""
    from sgd_shm.compress import TopK
    from sgd_shm.torch import hooks
    mode = job["mode"]
    if mode in ("solo", "majority"):
        return (hooks.PartialAllreduceState(mode, late=job["late"], average=job["average"],
                                            seed=job["seed"], timeout=job["timeout"]),
                hooks.partial_allreduce_hook)
    if mode in ("topk", "topk-no-ef"):
        comp = TopK(ratio=job["ratio"], error_feedback=mode == "topk")
        return (hooks.CompressionState(comp, momentum=job["momentum"]),
                hooks.compression_hook)
    return None, None


def _warm_up(job):
    """Load the kit's compiled kernels that the run's hook calls (Numba's cache, per
    process) before the clock starts, as ``sgd_shm.eager.train`` does: a one-rank
    shared-memory round of each kind, or a compression of a small vector."""
    if job["mode"] in ("solo", "majority"):
        from sgd_shm.collectives.shm import ShmGroup
        with ShmGroup(1, 8, np.float32) as g:
            comm = g.communicator(0)
            for kind in ("sync", "solo", "majority"):
                comm.start(np.zeros(8, np.float32), kind, "mean").wait()
            comm.close()
    elif job["mode"] in ("topk", "topk-no-ef"):
        from sgd_shm.compress import TopK
        TopK(ratio=0.5).memory(64, np.float32).step(np.ones(64, np.float32))


def _accuracy(net, X, y):
    """The fraction of X's images classified right (a count over a count: exact)."""
    import torch
    with torch.no_grad():
        return int((net(X).argmax(1) == y).sum()) / len(y)


def _train(rank, size, job, data):
    """The DDP loop of the module notes; rank 0's record: history (seconds, step,
    held-out accuracy), final accuracy, seconds, steps, and the hook's tallies."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from sgd_shm.eager import sleepers
    from sgd_shm.torch.nets import DigitsCNN
    Xtr, ytr, Xte, yte = (torch.from_numpy(a) for a in data)
    net = DigitsCNN(seed=job["seed"])
    model = DDP(net)
    state, hook = _hook(job)
    if hook is not None:
        model.register_comm_hook(state, hook)
    # a compression hook applies the momentum itself (DGC's momentum correction)
    momentum = 0.0 if job["mode"] in ("topk", "topk-no-ef") else job["momentum"]
    opt = torch.optim.SGD(model.parameters(), lr=job["lr"], momentum=momentum)
    rows = np.arange(rank, Xtr.shape[0], size)
    per_epoch = (Xtr.shape[0] // size) // job["batch"]
    rng = np.random.default_rng([job["seed"], rank, job["rep"]])
    k_sleep, s_sleep = job["imbalance"]
    hist = []
    try:
        _warm_up(job)
        dist.barrier()
        t0 = time.perf_counter()
        step = 0
        for _ in range(job["epochs"]):
            order = torch.from_numpy(rng.permutation(rows))
            for i in range(per_epoch):
                if s_sleep > 0 and rank in sleepers(job["seed"] + job["rep"], step, size,
                                                    k_sleep):
                    time.sleep(s_sleep)
                idx = order[i * job["batch"]:(i + 1) * job["batch"]]
                opt.zero_grad()
                F.cross_entropy(model(Xtr[idx]), ytr[idx]).backward()
                opt.step()
                step += 1
                if step % job["eval_every"] == 0:    # every rank: the same load on each
                    acc = _accuracy(net, Xte, yte)
                    hist.append((time.perf_counter() - t0, step, acc))
        seconds = time.perf_counter() - t0
        out = {"seconds": seconds, "steps": step}
        if rank == 0:
            hist.append((seconds, step, _accuracy(net, Xte, yte)))
            out.update(history=hist, accuracy=hist[-1][2])
        if state is not None and hasattr(state, "rounds"):
            r = [x for x in state.rounds]
            out["contributors"] = (float(np.mean([len(x["contributors"]) for x in r]))
                                   if r else None)
            out["late"] = sum(not x["contributed"] for x in r)
            out["rounds"] = len(r)
        if state is not None and hasattr(state, "bytes_sent"):
            out.update(bytes_sent=state.bytes_sent, bytes_dense=state.bytes_dense)
        return out
    finally:
        if hasattr(state, "close"):
            state.close()


# ---- a run of P ranks ---------------------------------------------------------------------
def run_ranks(size, job, data, timeout=900.0):
    """``size`` ranks of :func:`_train` (:func:`sgd_shm.torch.ranks.run_local`: forked
    from a forkserver that has imported torch); the ranks' records, rank 0 first.
    Raises RuntimeError with a rank's traceback if one failed, or if one sent nothing
    by the deadline."""
    from sgd_shm.torch.ranks import ok, run_local
    res = run_local(_train, size, job, data, preload=PRELOAD, timeout=timeout,
                    group_timeout=job["timeout"])
    return ok(res, size, f"a {job['mode']} run")


# ---- the scenario -------------------------------------------------------------------------
def load(data, n_samples, seed):
    """(X_train, y_train, X_test, y_test) as float32 images and int64 labels."""
    from sgd_shm.data import load_digits_split, make_digits_augmented
    if data == "augmented":
        Xtr, Xte, ytr, yte = make_digits_augmented(n_samples, random_state=seed)
    else:
        Xtr, Xte, ytr, yte = load_digits_split(random_state=seed)
    return Xtr, ytr, Xte, yte


def _time_to(hist, target):
    return next((s for s, _, a in hist if a >= target), None)


def _row(part, mode, rep, recs, target):
    r0 = recs[0]
    row = {"part": part, "mode": mode, "rep": rep, "accuracy": r0["accuracy"],
           "seconds": max(r["seconds"] for r in recs), "steps": r0["steps"],
           "steps_per_s": r0["steps"] / r0["seconds"], "history": r0["history"]}
    if target is not None:
        row["time_to_target"] = _time_to(r0["history"], target)
    if "contributors" in r0:
        row["contributors"] = r0["contributors"]
        row["late"] = [r["late"] for r in recs]
    if "bytes_sent" in r0:
        row["bytes_sent"] = r0["bytes_sent"]
        row["bytes_dense"] = r0["bytes_dense"]
    return row


def _interleaved(part, modes, reps, size, base, data, target, bar, warmup):
    """Rep 0 (one run of each mode) is the warm-up (left out without ``warmup``); then
    ``reps`` rounds of every mode."""
    rows = []
    for rep in range(0 if warmup else 1, reps + 1):
        for mode in modes:
            recs = run_ranks(size, dict(base, mode=mode, rep=rep), data)
            if rep:
                rows.append(_row(part, mode, rep, recs, target))
            bar.update()
    return rows


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(rows, part, modes, baseline):
    """Per mode: medians over the repetitions, and the ratios to the baseline."""
    out = {}
    for m in modes:
        rs = [r for r in rows if r["part"] == part and r["mode"] == m]
        ttt = [r.get("time_to_target") for r in rs]
        o = {"accuracy": _median([r["accuracy"] for r in rs]),
             "accuracy_min": min(r["accuracy"] for r in rs),
             "accuracy_max": max(r["accuracy"] for r in rs),
             "seconds": _median([r["seconds"] for r in rs]),
             "steps_per_s": _median([r["steps_per_s"] for r in rs]),
             "reached": sum(t is not None for t in ttt), "runs": len(rs)}
        # a run that never reached the target counts as slower than every one that did
        o["time_to_target"] = (statistics.median([t if t is not None else float("inf")
                                                  for t in ttt]) if ttt else None)
        if o["time_to_target"] == float("inf"):
            o["time_to_target"] = None
        if rs and "contributors" in rs[0]:
            o["contributors"] = _median([r["contributors"] for r in rs])
        if rs and "bytes_sent" in rs[0]:
            o["bytes_sent"] = _median([r["bytes_sent"] for r in rs])
            o["bytes_dense"] = _median([r["bytes_dense"] for r in rs])
        out[m] = o
    b = out.get(baseline)
    for m, o in out.items():
        o["accuracy_vs_baseline"] = o["accuracy"] - b["accuracy"]
        if part == "imbalance" and o["time_to_target"] and b["time_to_target"]:
            o["speedup"] = b["time_to_target"] / o["time_to_target"]
    return out


def run(reps, seed, *, ranks=2, data="digits", n_samples=50_000, epochs=15,
        compress_epochs=30, batch=32, lr=0.2, momentum=0.0, imbalance=(1, 0.05),
        target=0.95, late="drop", average="contributors", eval_every=None,
        parts=("imbalance", "compress"), warmup=True):
    """Both parts (see the module notes); (rows, extra) for bench/results/torch_ddp.json."""
    from sgd_shm.core.validation import check_momentum
    momentum = check_momentum(momentum)
    arrays = load(data, n_samples, seed)
    per_epoch = (arrays[0].shape[0] // ranks) // batch
    if eval_every is None:              # about 20 points per epoch, at most one per 5 steps
        eval_every = max(5, per_epoch // 20)
    base = {"seed": seed, "lr": lr, "momentum": momentum, "batch": batch, "epochs": epochs,
            "eval_every": eval_every, "late": late, "average": average, "ratio": TOPK_RATIO,
            "timeout": 600.0,
            "imbalance": tuple(imbalance)}
    todo = [p for p in ("imbalance", "compress") if p in parts]
    bar = tqdm(total=(reps + warmup) * 3 * len(todo), desc="torch_ddp", unit="run",
               leave=False)
    rows, summary = [], {}
    try:
        if "imbalance" in todo:
            rows += _interleaved("imbalance", IMBALANCE_MODES, reps, ranks, base, arrays,
                                 target, bar, warmup)
            summary["imbalance"] = summarize(rows, "imbalance", IMBALANCE_MODES, "allreduce")
        if "compress" in todo:
            cb = dict(base, imbalance=(0, 0.0), epochs=compress_epochs or epochs)
            rows += _interleaved("compress", COMPRESS_MODES, reps, ranks, cb, arrays, None,
                                 bar, warmup)
            summary["compress"] = summarize(rows, "compress", COMPRESS_MODES, "dense")
    finally:
        bar.close()
    return rows, {"summary": summary, "ranks": ranks, "data": data,
                  "train_rows": int(arrays[0].shape[0]), "held_out": int(arrays[2].shape[0]),
                  "epochs": epochs, "compress_epochs": compress_epochs or epochs,
                  "batch": batch, "lr": lr, "momentum": momentum,
                  "imbalance": list(imbalance), "target": target, "late": late,
                  "average": average,
                  "topk_ratio": TOPK_RATIO, "eval_every": eval_every, "reps": reps,
                  "steps_per_epoch": per_epoch}


# ---- report -------------------------------------------------------------------------------
def summary_markdown(d):
    lines = []
    sm = d.get("summary", {})
    imb = sm.get("imbalance")
    if imb:
        k, s = d["imbalance"]
        lines += [f"eager-SGD as a DDP hook: DigitsCNN on {d['data']} ({d['train_rows']:,} "
                  f"training images, {d['held_out']} held out), {d['ranks']} ranks, "
                  f"{d['epochs']} epochs, batch {d['batch']} per rank, SGD lr {d['lr']:g} "
                  f"momentum {d['momentum']:g}, imbalance: {k} rank(s) "
                  f"per step sleep {s * 1e3:g} ms, late gradients {d['late']}, mean over "
                  f"{d.get('average', 'size')}, target "
                  f"held-out accuracy {d['target']} (medians):", "",
                  "| DDP reduction | time to target | speed-up over allreduce | held-out "
                  "accuracy (min–max) | vs allreduce (points) | steps/s | contributors "
                  "per round |", "|---|---:|---:|---:|---:|---:|---:|"]
        for m, o in imb.items():
            ttt = (f"{o['time_to_target']:.2f} s" if o["time_to_target"] is not None
                   else "not reached")
            if o["reached"] < o["runs"]:
                ttt += f" ({o['reached']}/{o['runs']} reached)"
            sp = f"{o['speedup']:.2f}x" if o.get("speedup") else "–"
            c = f"{o['contributors']:.2f}" if o.get("contributors") else str(d["ranks"])
            lines.append(f"| {m} | {ttt} | {sp} | {o['accuracy']:.4f} ({o['accuracy_min']:.3f}"
                         f"–{o['accuracy_max']:.3f}) | {100 * o['accuracy_vs_baseline']:+.2f} "
                         f"| {o['steps_per_s']:.0f} | {c} |")
    cmp_ = sm.get("compress")
    if cmp_:
        lines += ["", f"TopK {100 * d['topk_ratio']:g} % as a DDP hook: DigitsCNN on "
                  f"{d['data']}, {d['ranks']} ranks, {d['compress_epochs']} epochs, SGD lr "
                  f"{d['lr']:g} momentum {d['momentum']:g}, no imbalance (medians):", "",
                  "| DDP reduction | held-out accuracy (min–max) | vs dense (points) | bytes "
                  "sent per rank | of dense |", "|---|---:|---:|---:|---:|"]
        for m, o in cmp_.items():
            b = (f"{_size(o['bytes_sent'])} | {o['bytes_sent'] / o['bytes_dense']:.4f}"
                 if o.get("bytes_sent") else "– | 1")
            lines.append(f"| {m} | {o['accuracy']:.4f} ({o['accuracy_min']:.3f}–"
                         f"{o['accuracy_max']:.3f}) | {100 * o['accuracy_vs_baseline']:+.2f} "
                         f"| {b} |")
    lines += ["", *findings(d), f"\nmedians of {d['reps']} repetitions."]
    return "\n".join(lines)


def _size(nbytes):
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def _why_not(o, base, ranks):
    """Why a partial reduction did not reach the target much sooner: how much faster it
    stepped and how many more steps it then needed (a round of fewer contributors
    averages fewer gradients and drops the late ones)."""
    if not base or not base.get("steps_per_s") or not base.get("time_to_target"):
        return ""
    rate = o["steps_per_s"] / base["steps_per_s"]
    steps = (o["time_to_target"] * o["steps_per_s"]) / (base["time_to_target"]
                                                       * base["steps_per_s"])
    return (f"It stepped {rate:.2f}x as fast as allreduce, but its rounds averaged "
            f"{o.get('contributors', float('nan')):.2f} of {ranks} gradients (the late ones "
            f"dropped), so it needed {steps:.2f}x as many steps to the target.")


def findings(d, speedup=1.2, points=1.0):
    """The issue's two claims, read from the data: solo / majority reach the target
    >= 1.2x sooner than DDP's allreduce under imbalance; TopK 0.1 % with error
    feedback ends within 1 point of dense held-out accuracy."""
    out = []
    imb = d.get("summary", {}).get("imbalance")
    if imb:
        for m in ("solo", "majority"):
            o = imb.get(m)
            if not o:
                continue
            sp = o.get("speedup")
            verdict = ("holds" if sp and sp >= speedup else "does not hold")
            what = (f"{sp:.2f}x as fast as allreduce to held-out accuracy {d['target']}"
                    if sp else f"no time to compare: it or allreduce did not reach held-out "
                    f"accuracy {d['target']} in most runs")
            line = (f"- {m}: {what}; final accuracy {100 * o['accuracy_vs_baseline']:+.2f} "
                    f"points from allreduce's: the >= {speedup}x claim {verdict} here.")
            if sp and sp < speedup:
                line += " " + _why_not(o, imb.get("allreduce"), d.get("ranks"))
            out.append(line)
    cmp_ = d.get("summary", {}).get("compress")
    if cmp_ and "topk" in cmp_:
        gap = 100 * cmp_["topk"]["accuracy_vs_baseline"]
        gap_no = 100 * cmp_["topk-no-ef"]["accuracy_vs_baseline"]
        out.append(f"- TopK {100 * d['topk_ratio']:g} % with error feedback: {gap:+.2f} points "
                   f"from dense (without: {gap_no:+.2f}): the within-{points:g}-point claim "
                   f"{'holds' if gap >= -points else 'does not hold'} here.")
    return out


def plot(d, path):
    from matplotlib.figure import Figure
    parts = [p for p in ("imbalance", "compress") if p in d.get("summary", {})]
    fig = Figure(figsize=(6.5 * len(parts), 4.2))
    axes = fig.subplots(1, len(parts), squeeze=False)[0]
    for ax, part in zip(axes, parts):
        for i, m in enumerate(d["summary"][part]):
            runs = [r for r in d["results"] if r["part"] == part and r["mode"] == m]
            for j, r in enumerate(runs):
                h = np.asarray(r["history"])
                x = h[:, 0] if part == "imbalance" else h[:, 1]
                ax.plot(x, h[:, 2], color=f"C{i}", lw=1, alpha=0.8,
                        label=m if j == 0 else None)
        if part == "imbalance":
            ax.axhline(d["target"], color="k", lw=0.6, ls=":")
        ax.set_xlabel("seconds (rank 0)" if part == "imbalance" else "steps")
        ax.set_ylabel("held-out accuracy")
        low = min(a for r in d["results"] if r["part"] == part for _, _, a in r["history"])
        ax.set_ylim(0.5 if low >= 0.5 else 0.0, 1.0)
        ax.set_title(f"{part}, {d['ranks']} ranks, {d['data']}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
