"""``python -m sgd_shm ps`` (also ``python -m sgd_shm`` with no command, and
``python -m sgd_shm.ps``): the kit's main job, the parameter server on an embedded
default.

An RCV1-like sparse problem (20k x 2k training rows by default, and 5k held-out
rows, generated in about a second) is trained by 4 worker processes with worker 0
slowed 4x, under each policy (BSP, ASP, SSP, SaPS) in turn. Prints a table (time
to the target held-out accuracy, final held-out accuracy, final training loss,
updates, mean push staleness, minibatches stolen from the straggler, detections)
and writes ps-main.json and ps-main.png (held-out accuracy against time, loss
against updates, staleness histograms, the detection timeline) to --out.
"""
from __future__ import annotations

import json
import os

from sgd_shm._argtypes import finite_float, out_dir, seed_int
from sgd_shm.data import make_rcv1_like
from sgd_shm.ps import POLICIES, curves_of, plot_losses, train


def add_arguments(ap):
    """The main job's options, on ``ap`` (its own parser, or the ``ps`` subcommand's)."""
    ap.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    ap.add_argument("--slow", type=finite_float, default=4.0,
                    help="slowdown factor of worker 0 (default 4; 1 for none)")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help=f"comma-separated, from {', '.join(POLICIES)} (default all)")
    ap.add_argument("--seconds", type=finite_float, default=5.0,
                    help="seconds per policy (default 5)")
    ap.add_argument("--target", type=finite_float, default=0.935,
                    help="target held-out accuracy (default 0.935)")
    ap.add_argument("--samples", type=int, default=20_000,
                    help="training rows (default 20000)")
    ap.add_argument("--holdout", type=int, default=5_000,
                    help="held-out rows, scored as the runs go (default 5000)")
    ap.add_argument("--features", type=int, default=2_000, help="columns (default 2000)")
    ap.add_argument("--seed", type=seed_int, default=0, help="seed of the data and the runs "
                    "(default 0)")
    ap.add_argument("--backend", choices=("shm", "ray"), default="shm",
                    help="shm: worker processes on shared memory (default); ray: Ray actors "
                         "(a local Ray instance, or --address)")
    ap.add_argument("--address", default=None, help="a Ray cluster to join (--backend ray)")
    ap.add_argument("--start-method", choices=("fork", "spawn", "forkserver"), default="fork",
                    help="how --backend shm starts its worker processes (default fork; "
                         "spawn/forkserver for a parent that runs threads)")
    ap.add_argument("--out", default=".", help="folder for ps-main.json / ps-main.png (default .)")
    return ap


def check(ap, args):
    """The options' rules (``ap.error``: exit status 2 naming the option); returns args
    with ``policies`` as a list."""
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        ap.error(f"--policies: unknown {bad}; choose from {', '.join(POLICIES)}")
    args.policies = policies
    for name in ("workers", "samples", "features", "holdout"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    if not args.seconds > 0:
        ap.error("--seconds must be > 0")
    if not 0 < args.target <= 1:
        ap.error(f"--target is a held-out accuracy in (0, 1], got {args.target}")
    if args.slow < 1:
        ap.error("--slow must be >= 1")
    if args.address is not None and args.backend != "ray":
        ap.error("--address joins a Ray cluster: add --backend ray")
    if args.start_method != "fork" and args.backend != "shm":
        ap.error("--start-method applies to --backend shm (Ray starts its own actors)")
    out_dir(ap, args.out)
    return args


def _data(args):
    """(X, y, X_val, y_val): one generated problem, the last --holdout rows held out."""
    X, y = make_rcv1_like(args.samples + args.holdout, args.features, random_state=args.seed)
    n = args.samples
    return X[:n], y[:n], X[n:], y[n:]


def run(args) -> int:
    """The main job on checked ``args`` (see :func:`check`)."""
    X, y, Xv, yv = _data(args)
    kind = "worker processes" if args.backend == "shm" else "Ray worker actors"
    print(f"parameter server: {args.samples:,} x {args.features:,} RCV1-like ({args.holdout:,} "
          f"rows held out), {args.workers} {kind}, worker 0 slowed {args.slow:g}x, "
          f"{args.seconds:g} s per policy ({os.cpu_count()} CPUs)")
    print(f"{'policy':8s} {'to ' + format(args.target, 'g') + ' held-out':>16s} "
          f"{'held-out acc':>12s} {'train loss':>10s} {'updates':>9s} {'mean tau':>9s} "
          f"{'stolen':>7s}  detections")
    out, results = {}, {}
    for pol in args.policies:
        r = train(X, y, n_workers=args.workers, policy=pol, max_seconds=args.seconds,
                  slowdown={0: args.slow} if args.slow > 1 else None, seed=args.seed,
                  backend=args.backend, address=args.address, start_method=args.start_method,
                  eval_set=(Xv, yv))
        results[pol] = r
        ttt = r.time_to_score(args.target)
        det = ", ".join(f"worker {w} at {t:.1f} s" for t, w in r.detections) or "none"
        tau = r.mean_staleness
        stolen = sum(r.batches["stolen_by_worker"])
        print(f"{pol:8s} {('%.2f s' % ttt) if ttt is not None else 'not reached':>16s} "
              f"{r.val_score:12.4f} {r.final_loss:10.4f} {r.updates:9,d} {tau:9.1f} "
              f"{stolen:7,d}  {det if pol == 'saps' else ''}")
        out[pol] = {"time_to_target": ttt, "val_score": r.val_score, "final_loss": r.final_loss,
                    "updates": r.updates, "mean_staleness": tau, "detections": r.detections,
                    "events": r.events, "workers": r.workers,
                    "staleness_hist": r.staleness_hist, "batches": r.batches,
                    "history": r.history}
    _write(args, out, results)
    return 0


def _write(args, out, results):
    by = {p: o["time_to_target"] for p, o in out.items()}
    if by.get("bsp") and by.get("saps"):
        print(f"SaPS reached {args.target:g} held-out accuracy {by['bsp'] / by['saps']:.2f}x "
              "sooner than BSP")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "ps-main.json")
    with open(path, "w") as f:
        json.dump({"settings": vars(args), "target": args.target,
                   "target_kind": "held-out accuracy", "results": out}, f, indent=1)
    png = os.path.join(args.out, "ps-main.png")
    plot_losses(curves_of(results), args.target, png,
                f"parameter server, {args.workers} workers, worker 0 slowed {args.slow:g}x",
                n_workers=args.workers)
    print(f"wrote {path} and {png}")


def main(argv=None) -> int:
    """``python -m sgd_shm.ps [options]``: the same as ``python -m sgd_shm ps``."""
    from sgd_shm.__main__ import standalone
    return standalone("ps", argv, "python -m sgd_shm.ps")


if __name__ == "__main__":
    raise SystemExit(main())
