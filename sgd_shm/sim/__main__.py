"""``python -m sgd_shm sim`` (also ``python -m sgd_shm.sim``): parameter-server policies
and eager-SGD collectives side by side at a scale this box cannot run, in virtual time.

An RCV1-like sparse problem (20k x 2k training rows by default, 5k held out) is
trained by ``--workers`` simulated workers (128 by default) of a heterogeneous cluster
(``--classes``: by default three quarters at full speed, a quarter 4x slower) on
``--gbps`` links; each policy of ``--policies`` and each collective of
``--collectives`` runs once, from the same seed. The gradients are real, so the
losses and held-out accuracies are; the seconds are virtual (see docs/sim.md for the
model and its limits). The table: virtual seconds, time to the target held-out
accuracy, final held-out accuracy and training loss, updates (pushes or rounds), the
workers SaPS flagged, and the wall time each simulation took. Writes sim-main.json
and sim-main.png (held-out accuracy against virtual seconds).
"""
from __future__ import annotations

import json
import os

from sgd_shm._argtypes import finite_float, out_dir, seed_int

COMPARED = ("bsp", "asp", "ssp", "saps", "rps", "sync", "solo", "majority")


def add_arguments(ap):
    """The command's options, on ``ap``."""
    ap.add_argument("--workers", type=int, default=128, help="simulated workers (default 128)")
    ap.add_argument("--policies", default="bsp,asp,ssp,saps",
                    help="comma-separated parameter-server policies, from bsp, asp, ssp, "
                         "saps, rps ('' for none; default bsp,asp,ssp,saps)")
    ap.add_argument("--collectives", default="",
                    help="comma-separated collectives, from sync, solo, majority (default none)")
    ap.add_argument("--classes", default="0.75:1,0.25:4",
                    help="the cluster's classes FRACTION:FACTOR,... (default 0.75:1,0.25:4: a "
                         "quarter of the workers 4x slower)")
    ap.add_argument("--step", type=finite_float, default=1e-3,
                    help="virtual seconds of a step at factor 1 (default 0.001)")
    ap.add_argument("--gbps", type=finite_float, default=10.0,
                    help="link bandwidth in Gb/s (default 10; 0: free messages)")
    ap.add_argument("--latency", type=finite_float, default=5e-6,
                    help="seconds per message (default 5e-6)")
    ap.add_argument("--topology", choices=("ring", "tree"), default="ring",
                    help="the allreduce's topology (default ring)")
    ap.add_argument("--imbalance", type=finite_float, nargs=2, default=(0, 0.0),
                    metavar=("K", "SECONDS"),
                    help="collectives: each round K ranks sleep SECONDS (default 0 0)")
    ap.add_argument("--compress", default=None, help="e.g. 'topk:0.01' (default: dense)")
    ap.add_argument("--epochs", type=finite_float, default=5.0, help="epochs per run (default 5)")
    ap.add_argument("--target", type=finite_float, default=0.93,
                    help="target held-out accuracy (default 0.93)")
    ap.add_argument("--lr", type=finite_float, default=None,
                    help="step size (default: 0.5 per push, 2.0 per round)")
    ap.add_argument("--batch", type=int, default=64, help="rows per minibatch (default 64)")
    ap.add_argument("--samples", type=int, default=20_000, help="training rows (default 20000)")
    ap.add_argument("--holdout", type=int, default=5_000, help="held-out rows (default 5000)")
    ap.add_argument("--features", type=int, default=2_000, help="columns (default 2000)")
    ap.add_argument("--density", type=finite_float, default=0.02,
                    help="nonzeros per row / columns (default 0.02)")
    ap.add_argument("--seed", type=seed_int, default=0, help="seed of the data and the runs")
    ap.add_argument("--out", default=".", help="folder for sim-main.json / .png (default .)")
    return ap


def _names(ap, text, allowed, option):
    names = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in names if c not in allowed]
    if bad:
        ap.error(f"{option}: unknown {bad}; choose from {', '.join(allowed)}")
    return names


def check(ap, args):
    """The options' rules (``ap.error``: exit status 2 naming the option)."""
    args.policies = _names(ap, args.policies, COMPARED[:5], "--policies")
    args.collectives = _names(ap, args.collectives, COMPARED[5:], "--collectives")
    if not args.policies and not args.collectives:
        ap.error("--policies / --collectives: name at least one run")
    try:
        args.classes = [tuple(float(x) for x in c.split(":")) for c in args.classes.split(",")]
        from sgd_shm.sim import Cluster
        Cluster(args.step, classes=args.classes)
    except ValueError as e:
        ap.error(f"--classes / --step: {e}")
    for name in ("workers", "samples", "features", "batch", "holdout"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    for name in ("epochs", "density"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name} must be > 0")
    if args.gbps < 0 or args.latency < 0:
        ap.error("--gbps and --latency must be >= 0")
    if args.lr is not None and not args.lr > 0:
        ap.error("--lr must be > 0")
    if not 0 < args.target <= 1:
        ap.error(f"--target is a held-out accuracy in (0, 1], got {args.target}")
    k, s = args.imbalance
    if k != int(k) or k < 0 or s < 0:
        ap.error("--imbalance: K must be a whole number >= 0 and SECONDS >= 0")
    args.imbalance = (int(k), float(s)) if k > 0 else None
    if args.compress is not None:
        from sgd_shm.compress import make_compressor
        try:
            make_compressor(args.compress)
        except ValueError as e:
            ap.error(f"--{e}")
    out_dir(ap, args.out)
    return args


def compare(X, y, names, args, eval_set):
    """One simulated run per name (a policy or a collective); {name: SimResult}."""
    from sgd_shm.sim import Cluster, Network, simulate
    cluster = Cluster(args.step, classes=args.classes, imbalance=args.imbalance)
    network = (Network(args.latency, topology=args.topology) if args.gbps == 0 else
               Network.gbps(args.gbps, args.latency, args.topology))
    runs = {}
    for name in names:
        kind = {"collective": name} if name in COMPARED[5:] else {"policy": name}
        runs[name] = simulate(X, y, n_workers=args.workers, epochs=args.epochs,
                              cluster=cluster, network=network, compress=args.compress,
                              lr=args.lr, batch_size=args.batch, seed=args.seed,
                              eval_set=eval_set, **kind)
    return runs


def summary(runs, target):
    """{name: the figures of its run}: virtual seconds, time to ``target`` held-out
    accuracy, final accuracy and loss, updates, flagged workers, wall seconds."""
    return {name: {"seconds": r.seconds, "time_to_target": r.time_to_score(target),
                   "val_score": r.val_score, "final_loss": r.final_loss,
                   "updates": r.updates, "flagged": sorted(k for _, k in r.detections),
                   "wall_seconds": r.wall_seconds} for name, r in runs.items()}


def plot(runs, target, path=None, title="", *, fig=None):
    """Held-out accuracy against virtual seconds, every run, with ``target`` dashed;
    returns the Figure (written to ``path`` when given)."""
    from sgd_shm.core.results import figure
    fig = figure(fig, (7, 4.2))
    ax = fig.subplots()
    for i, (name, r) in enumerate(runs.items()):
        ax.plot([h["seconds"] for h in r.history], [h["val_score"] for h in r.history],
                color=f"C{i}", lw=1.3, label=name)
    ax.axhline(target, color="grey", ls="--", lw=1, label="target")
    ax.set_xlabel("virtual seconds")
    ax.set_ylabel("held-out accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def _table(summ, target):
    lines = [f"{'run':9s} {'virtual s':>10s} {'to ' + format(target, 'g'):>10s} "
             f"{'held-out':>9s} {'loss':>7s} {'updates':>8s} {'flagged':>8s} {'wall s':>7s}"]
    for name, o in summ.items():
        ttt = f"{o['time_to_target']:.4g}" if o["time_to_target"] is not None else "-"
        lines.append(f"{name:9s} {o['seconds']:10.4g} {ttt:>10s} {o['val_score']:9.4f} "
                     f"{o['final_loss']:7.4f} {o['updates']:8d} {len(o['flagged']):8d} "
                     f"{o['wall_seconds']:7.2f}")
    return "\n".join(lines)


def run(args) -> int:
    """The comparison on checked ``args`` (see :func:`check`)."""
    from sgd_shm.data import make_rcv1_like
    X, y = make_rcv1_like(args.samples + args.holdout, args.features, density=args.density,
                          random_state=args.seed)
    n = args.samples
    names = args.policies + args.collectives
    net = "free messages" if args.gbps == 0 else f"{args.gbps:g} Gb/s links"
    print(f"simulated: {args.samples:,} x {args.features:,} RCV1-like ({args.holdout:,} held "
          f"out), {args.workers} workers, classes {args.classes} of {args.step:g} s steps, "
          f"{net}, {args.epochs:g} epochs; virtual seconds (wall seconds on "
          f"{os.cpu_count()} CPUs of this box)")
    runs = compare(X[:n], y[:n], names, args, (X[n:], y[n:]))
    summ = summary(runs, args.target)
    print(_table(summ, args.target))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sim-main.json"), "w") as f:
        json.dump({"settings": {k: v for k, v in vars(args).items() if k != "func"},
                   "runs": summ}, f, indent=1, default=str)
    plot(runs, args.target, os.path.join(args.out, "sim-main.png"),
         f"{args.workers} simulated workers, {net}")
    return 0


def main(argv=None) -> int:
    """``python -m sgd_shm.sim [options]``: the same as ``python -m sgd_shm sim``."""
    from sgd_shm.__main__ import standalone
    return standalone("sim", argv, "python -m sgd_shm.sim")


if __name__ == "__main__":
    raise SystemExit(main())
