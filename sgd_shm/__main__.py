"""The kit's main job: ``python -m sgd_shm``.

``python -m sgd_shm [options]`` runs the multi-process parameter server on its
embedded default: BSP, ASP, SSP and straggler-aware SaPS with worker 0 slowed
4x (see ``python -m sgd_shm --help`` and :mod:`sgd_shm.ps.__main__`).

``python -m sgd_shm eager [options]`` compares synchronous, solo and majority
allreduce (eager-SGD) under load imbalance (see :mod:`sgd_shm.eager.__main__`).

``python -m sgd_shm selftest`` runs every component briefly (a smoke test of an
installed kit; see :mod:`sgd_shm.selftest`).

``python -m sgd_shm hogwild [options]`` runs lock-free Hogwild SGD on an
embedded default: an RCV1-like sparse binary classification problem is
generated (seeded), then logistic regression is trained by Hogwild SGD with 1
and 2 workers (threads and processes) and by scikit-learn's SGDClassifier with
the same loss, penalty and schedule, and the epoch times, accuracies and the
staleness of the lock-free updates are printed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["hogwild"]:
        return hogwild_main(argv[1:])
    if argv[:1] == ["eager"]:
        from sgd_shm.eager.__main__ import main as eager_main
        return eager_main(argv[1:])
    if argv[:1] == ["selftest"]:
        from sgd_shm.selftest import main as selftest_main
        return selftest_main(argv[1:])
    from sgd_shm.ps.__main__ import main as ps_main
    return ps_main(argv)


def hogwild_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sgd_shm hogwild", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=200_000, help="rows (default 200000)")
    ap.add_argument("--features", type=int, default=50_000, help="columns (default 50000)")
    ap.add_argument("--epochs", type=int, default=5, help="epochs (default 5)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for name in ("samples", "features", "epochs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")

    from sklearn.linear_model import SGDClassifier
    from sklearn.model_selection import train_test_split

    from sgd_shm import HogwildClassifier
    from sgd_shm.hogwild import staleness_summary
    from sgd_shm.data import make_rcv1_like

    print(f"sgd_shm: Hogwild SGD (python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"seed {args.seed})")
    t0 = time.perf_counter()
    X, y = make_rcv1_like(args.samples, args.features, random_state=args.seed)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, random_state=args.seed)
    print(f"problem: RCV1-like, {X.shape[0]:,} x {X.shape[1]:,}, {X.nnz / 1e6:.1f}M nonzeros "
          f"(generated in {time.perf_counter() - t0:.1f} s); logistic loss, L2 alpha=1e-4, "
          f"'optimal' schedule, {args.epochs} epochs\n")
    runs = [("scikit-learn SGDClassifier", None),
            ("Hogwild, 1 worker", dict(n_workers=1, backend="threads")),
            ("Hogwild, 2 threads", dict(n_workers=2, backend="threads")),
            ("Hogwild, 2 processes", dict(n_workers=2, backend="processes"))]
    # compile the kernels once so that the timings below are of training only
    HogwildClassifier(loss="log_loss", max_iter=1, tol=None).fit(Xtr[:1000], ytr[:1000])
    print(f"{'trainer':28s} {'fit s / epoch':>13s} {'test accuracy':>13s} {'staleness':>24s}")
    for name, kw in runs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")

            def make(instrument=False):
                if kw is None:
                    return SGDClassifier(loss="log_loss", alpha=1e-4, max_iter=args.epochs,
                                         tol=None, random_state=args.seed)
                return HogwildClassifier(loss="log_loss", alpha=1e-4, max_iter=args.epochs,
                                         tol=None, instrument=instrument,
                                         random_state=args.seed, **kw)
            times = []
            for _ in range(2):                # the faster of two fits: the machine drifts
                clf = make()
                t = time.perf_counter()
                clf.fit(Xtr, ytr)
                times.append((time.perf_counter() - t) / args.epochs)
            per_epoch = min(times)
            acc = clf.score(Xte, yte)
            stale = ""
            if kw is not None and kw["n_workers"] > 1:
                # staleness from a third, instrumented fit (the shared update counter
                # it needs costs one contended atomic per update, so it is not timed)
                mean_tau, frac0 = staleness_summary(make(instrument=True).fit(Xtr, ytr).staleness_)
                stale = f"mean tau {mean_tau:.2f}, {100 * frac0:.0f}% tau=0"
        print(f"{name:28s} {per_epoch:13.3f} {acc:13.4f} {stale:>24s}")
    print("\n(fit s / epoch: the faster of two whole fits, input checks and worker "
          "start-up included (on wide data with 2 workers and 10 or more epochs also the "
          "hot-first copy of the rows in the first, see docs/hogwild.md), over the epochs; "
          "`python -m bench hogwild` times epochs alone.\n tau "
          "(from a separate instrumented fit): updates by other "
          "workers between a worker's read of the weights and its write; speed-ups need as "
          "many free cores as workers)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
