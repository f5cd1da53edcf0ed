"""``python -m sgd_shm eager`` (also ``python -m sgd_shm.eager``): synchronous, solo
and majority allreduce side by side on an embedded default, under the eager-SGD
paper's load-imbalance model.

An RCV1-like sparse problem (20k x 2k training rows by default, 5k held out) is
trained by 4 ranks; each round, a draw from a shared seed puts one rank to sleep for
a while (``--imbalance``) before its gradient. Each collective runs ``--reps`` times,
interleaved; the table has the medians: rounds, time to the target held-out accuracy,
final held-out accuracy, final training loss, rounds the ranks' gradients were in,
and the speed-up over sync. Writes eager-main.json and eager-main.png (held-out
accuracy against time, training loss against rounds). Under MPI, every rank runs this command and rank 0
prints: ``mpiexec -n 4 python -m sgd_shm eager --backend mpi --seconds 5``.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import traceback

from sgd_shm._argtypes import finite_float, out_dir, seed_int
from sgd_shm.data import make_rcv1_like
from sgd_shm.eager.trainer import train

COLLECTIVES = ("sync", "solo", "majority")


def add_arguments(ap):
    """The command's options, on ``ap``."""
    ap.add_argument("--backend", choices=("shm", "mpi"), default="shm",
                    help="shm: forked processes on shared memory (default); mpi: the ranks "
                         "of mpiexec")
    ap.add_argument("--workers", type=int, default=4, help="ranks with --backend shm "
                    "(default 4; under MPI: mpiexec -n)")
    ap.add_argument("--collectives", default=",".join(COLLECTIVES),
                    help="comma-separated, from sync, solo, majority (default all)")
    ap.add_argument("--late", choices=("carry", "drop"), default="carry",
                    help="what a late gradient does (default carry)")
    ap.add_argument("--imbalance", type=finite_float, nargs=2, default=(1, 0.002),
                    metavar=("K", "SECONDS"),
                    help="each round K ranks sleep SECONDS (default 1 0.002)")
    ap.add_argument("--seconds", type=finite_float, default=3.0,
                    help="seconds per run (default 3)")
    ap.add_argument("--target", type=finite_float, default=0.935,
                    help="target held-out accuracy (default 0.935)")
    ap.add_argument("--reps", type=int, default=1, help="runs per collective (default 1)")
    ap.add_argument("--lr", type=finite_float, default=8.0, help="step size (default 8)")
    ap.add_argument("--alpha", type=finite_float, default=1e-4, help="L2 penalty (default 1e-4)")
    ap.add_argument("--batch", type=int, default=64, help="rows per rank per step")
    ap.add_argument("--samples", type=int, default=20_000,
                    help="training rows (default 20000)")
    ap.add_argument("--holdout", type=int, default=5_000,
                    help="held-out rows, scored as the runs go (default 5000)")
    ap.add_argument("--features", type=int, default=2_000, help="columns (default 2000)")
    ap.add_argument("--seed", type=seed_int, default=0, help="seed of the data, the imbalance "
                    "draws and the runs (default 0)")
    ap.add_argument("--compress", default=None,
                    help="send compressed gradients: 'topk:RATIO' or 'randomk:RATIO' "
                         "(error feedback on; default: dense)")
    ap.add_argument("--epochs", type=int, default=None,
                    help="stop every run after this many epochs (--seconds still caps it)")
    ap.add_argument("--out", default=".", help="folder for eager-main.json / .png (default .)")
    return ap


def check(ap, args):
    """The options' rules (``ap.error``: exit status 2 naming the option); returns args
    with ``collectives`` as a list and ``imbalance`` as (int, float)."""
    args.collectives = [c.strip() for c in args.collectives.split(",") if c.strip()]
    bad = [c for c in args.collectives if c not in COLLECTIVES]
    if bad or not args.collectives:
        ap.error(f"--collectives: unknown {bad}; choose from {', '.join(COLLECTIVES)}")
    for name in ("workers", "samples", "features", "reps", "batch", "holdout"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    if args.epochs is not None and args.epochs < 1:
        ap.error("--epochs must be >= 1")
    if args.compress is not None:
        from sgd_shm.compress import make_compressor
        try:
            make_compressor(args.compress)          # checked here, built by the trainer
        except ValueError as e:
            ap.error(f"--{e}")
    if not args.alpha >= 0:
        ap.error("--alpha must be >= 0")
    for name in ("seconds", "lr"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name} must be > 0")
    if not 0 < args.target <= 1:
        ap.error(f"--target is a held-out accuracy in (0, 1], got {args.target}")
    k, s = args.imbalance
    if k != int(k) or k < 0 or s < 0:
        ap.error("--imbalance: K must be a whole number >= 0 and SECONDS >= 0")
    args.imbalance = (int(k), float(s))
    out_dir(ap, args.out)
    return args


def compare(X, y, collectives, reps, **kw):
    """Run each collective ``reps`` times, interleaved, each for its whole time (the
    time to ``target`` is read from the history afterwards); {collective: [EagerResult]}."""
    runs = {c: [] for c in collectives}
    for rep in range(reps):
        for c in collectives:
            runs[c].append(train(X, y, collective=c, **kw))
    return runs


def summary(runs, target):
    """Medians per collective, and the speed-up over sync in time to ``target``: a
    held-out accuracy for runs given ``eval_set``, else a training loss."""
    out = {}
    for c, rs in runs.items():
        held = all(r.val_score is not None for r in rs)
        ttt = [r.time_to_score(target) if held else r.time_to(target) for r in rs]
        reached = [t for t in ttt if t is not None]
        out[c] = {"time_to_target": statistics.median(reached) if len(reached) == len(rs)
                  else None, "times_to_target": ttt,
                  "final_loss": statistics.median(r.final_loss for r in rs),
                  "val_score": statistics.median(r.val_score for r in rs) if held else None,
                  "rounds": statistics.median(r.rounds for r in rs),
                  "rounds_per_s": statistics.median(r.rounds / r.seconds for r in rs),
                  "participation": statistics.median(
                      sum(r.participation) / len(r.participation) for r in rs),
                  "mean_contributors": statistics.median(r.mean_contributors for r in rs),
                  "replicas_equal": all(r.replicas_equal for r in rs)}
    base = out.get("sync", {}).get("time_to_target")
    for c, o in out.items():
        o["speedup"] = base / o["time_to_target"] if base and o["time_to_target"] else None
        if "sync" in out:
            o["final_vs_sync"] = o["final_loss"] / out["sync"]["final_loss"] - 1.0
            if o["val_score"] is not None:
                o["val_vs_sync"] = o["val_score"] - out["sync"]["val_score"]
    return out


def plot(runs, target, path=None, title="", *, fig=None):
    """Held-out accuracy (runs given ``eval_set``; else the training loss) against
    seconds, with ``target`` dashed, and the training loss against rounds, every run of
    every collective, drawn on ``fig`` (default: a new Figure outside pyplot; the
    backend is never touched); returns the Figure, after writing it to ``path`` when
    given."""
    from sgd_shm.core.results import figure
    fig = figure(fig, (11, 4.2))
    a_t, a_r = fig.subplots(1, 2)
    held = all("val_score" in r.history[-1] for rs in runs.values() for r in rs)
    key = "val_score" if held else "loss"
    for i, (c, rs) in enumerate(runs.items()):
        for j, r in enumerate(rs):
            kw = {"color": f"C{i}", "alpha": 0.9 if j == 0 else 0.35, "lw": 1.2,
                  "label": c if j == 0 else None}
            a_t.plot([h["seconds"] for h in r.history], [h[key] for h in r.history], **kw)
            a_r.plot([h["step"] for h in r.history], [h["loss"] for h in r.history], **kw)
    a_t.axhline(target, color="grey", ls="--", lw=1, label="target")
    for ax, xl, yl in ((a_t, "seconds", "held-out accuracy" if held else "training loss"),
                       (a_r, "rounds (steps)", "training loss")):
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def _table(summ, target):
    lines = [f"{'collective':10s} {'rounds/s':>9s} {'to ' + format(target, 'g') + ' held-out':>16s} "
             f"{'speed-up':>9s} {'held-out acc':>12s} {'train loss':>10s} {'vs sync':>8s} "
             f"{'in round':>9s}"]
    for c, o in summ.items():
        ttt = f"{o['time_to_target']:.2f} s" if o["time_to_target"] else "not reached"
        sp = f"{o['speedup']:.2f}x" if o["speedup"] else "-"
        vs = f"{100 * o['final_vs_sync']:+.2f}%" if "final_vs_sync" in o else "-"
        lines.append(f"{c:10s} {o['rounds_per_s']:9.0f} {ttt:>16s} {sp:>9s} "
                     f"{o['val_score']:12.4f} {o['final_loss']:10.4f} {vs:>8s} "
                     f"{100 * o['participation']:8.0f}%")
    return "\n".join(lines)


def main(argv=None) -> int:
    """``python -m sgd_shm.eager [options]``: the same as ``python -m sgd_shm eager``."""
    from sgd_shm.__main__ import standalone
    return standalone("eager", argv, "python -m sgd_shm.eager")


def run(args) -> int:
    """The comparison on checked ``args`` (see :func:`check`); rank 0 prints and writes.
    Under MPI a rank that fails ends the job (MPI_Abort, after its traceback): the
    others would wait in the round's collective for it forever."""
    if args.backend != "mpi":
        return _compare_and_report(args)
    from mpi4py import MPI
    try:
        return _compare_and_report(args)
    except BaseException:
        if MPI.COMM_WORLD.Get_size() == 1:
            raise
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
        raise                                    # (Abort does not return)


def _compare_and_report(args) -> int:
    rank, n_workers = 0, args.workers
    if args.backend == "mpi":
        from mpi4py import MPI
        rank, n_workers = MPI.COMM_WORLD.Get_rank(), None
    X, y = make_rcv1_like(args.samples + args.holdout, args.features, random_state=args.seed)
    n = args.samples
    X, y, Xv, yv = X[:n], y[:n], X[n:], y[n:]
    say = print if rank == 0 else (lambda *a, **k: None)
    P = n_workers or MPI.COMM_WORLD.Get_size()
    say(f"eager-SGD: {args.samples:,} x {args.features:,} RCV1-like ({args.holdout:,} rows held "
        f"out), {P} ranks "
        f"({args.backend}), {args.imbalance[0]} rank(s) sleeping {args.imbalance[1] * 1e3:g} ms "
        f"per round, late gradients {args.late}, {args.seconds:g} s x {args.reps} per "
        f"collective ({os.cpu_count()} CPUs here)")
    runs = compare(X, y, args.collectives, args.reps, n_workers=n_workers,
                   backend=args.backend, late=args.late, imbalance=args.imbalance,
                   max_seconds=args.seconds, lr=args.lr, alpha=args.alpha,
                   batch_size=args.batch,
                   seed=args.seed, compress=args.compress, epochs=args.epochs,
                   eval_set=(Xv, yv), progress=None if rank == 0 else False)
    summ = summary(runs, args.target)
    if rank != 0:
        return 0
    print(_table(summ, args.target))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "eager-main.json")
    with open(path, "w") as f:
        json.dump({"settings": vars(args), "ranks": P, "target": args.target,
                   "target_kind": "held-out accuracy", "summary": summ,
                   "runs": {c: [{"history": r.history, "final_loss": r.final_loss,
                                 "val_score": r.val_score,
                                 "rounds": r.rounds, "seconds": r.seconds,
                                 "participation": r.participation, "late": r.late,
                                 "skipped": r.skipped, "bytes_sent": r.bytes_sent,
                                 "bytes_dense": r.bytes_dense} for r in rs]
                            for c, rs in runs.items()}}, f, indent=1)
    png = os.path.join(args.out, "eager-main.png")
    plot(runs, args.target, png,
         f"eager-SGD, {P} ranks ({args.backend}), imbalance {args.imbalance}")
    print(f"wrote {path} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
