"""``python -m sgd_shm hogwild`` (also ``python -m sgd_shm.hogwild``): lock-free
Hogwild SGD on an embedded default.

An RCV1-like sparse binary classification problem is generated (seeded), then
logistic regression is trained by Hogwild SGD with 1 and 2 workers (threads and
processes) and by scikit-learn's SGDClassifier with the same loss, penalty and
schedule, and the epoch times, the held-out accuracy (a fifth of the rows, held
out) beside the training log loss, and the staleness of the lock-free updates are
printed.
"""
from __future__ import annotations

import os
import sys
import time
import warnings

from sgd_shm._argtypes import seed_int


def add_arguments(ap):
    """The command's options, on ``ap``."""
    ap.add_argument("--samples", type=int, default=200_000, help="rows (default 200000)")
    ap.add_argument("--features", type=int, default=50_000, help="columns (default 50000)")
    ap.add_argument("--epochs", type=int, default=5, help="epochs (default 5)")
    ap.add_argument("--seed", type=seed_int, default=0, help="seed of the data and the fits "
                    "(default 0)")
    return ap


def check(ap, args):
    """The options' rules (``ap.error``: exit status 2 naming the option)."""
    for name in ("samples", "features", "epochs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    return args


RUNS = [("scikit-learn SGDClassifier", None),
        ("Hogwild, 1 worker", dict(n_workers=1, backend="threads")),
        ("Hogwild, 2 threads", dict(n_workers=2, backend="threads")),
        ("Hogwild, 2 processes", dict(n_workers=2, backend="processes"))]


def run(args) -> int:
    """The comparison on checked ``args``; prints the table."""
    from sklearn.model_selection import train_test_split

    from sgd_shm import HogwildClassifier
    from sgd_shm.data import make_rcv1_like

    print(f"sgd_shm: Hogwild SGD (python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"seed {args.seed})")
    t0 = time.perf_counter()
    X, y = make_rcv1_like(args.samples, args.features, random_state=args.seed)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, random_state=args.seed)
    print(f"problem: RCV1-like, {X.shape[0]:,} x {X.shape[1]:,}, {X.nnz / 1e6:.1f}M nonzeros "
          f"(generated in {time.perf_counter() - t0:.1f} s); logistic loss, L2 alpha=1e-4, "
          f"'optimal' schedule, {args.epochs} epochs\n")
    # compile the kernels once so that the timings below are of training only
    HogwildClassifier(loss="log_loss", max_iter=1, tol=None).fit(Xtr[:1000], ytr[:1000])
    print(f"{'trainer':28s} {'fit s / epoch':>13s} {'held-out acc':>12s} {'train loss':>10s} "
          f"{'staleness':>24s}")
    for name, kw in RUNS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            per_epoch, acc, loss, stale = _compare(args, kw, Xtr, ytr, Xte, yte)
        print(f"{name:28s} {per_epoch:13.3f} {acc:12.4f} {loss:10.4f} {stale:>24s}")
    print("\n(fit s / epoch: the faster of two whole fits, input checks and worker "
          "start-up included (on wide data with 2 workers and 10 or more epochs also the "
          "hot-first copy of the rows in the first, see docs/hogwild.md), over the epochs; "
          "`python -m bench hogwild` times epochs alone.\n tau "
          "(from a separate instrumented fit): updates by other "
          "workers between a worker's read of the weights and its write; speed-ups need as "
          "many free cores as workers)")
    return 0


def _compare(args, kw, Xtr, ytr, Xte, yte):
    """(seconds per epoch, the faster of two fits; held-out accuracy; training log
    loss (without the penalty, the same measure for every row); staleness summary) of
    one row of the table (kw None: scikit-learn's SGDClassifier)."""
    from sklearn.linear_model import SGDClassifier
    from sklearn.metrics import log_loss

    from sgd_shm import HogwildClassifier
    from sgd_shm.hogwild import staleness_summary

    def make(instrument=False):
        if kw is None:
            return SGDClassifier(loss="log_loss", alpha=1e-4, max_iter=args.epochs,
                                 tol=None, random_state=args.seed)
        return HogwildClassifier(loss="log_loss", alpha=1e-4, max_iter=args.epochs,
                                 tol=None, instrument=instrument, random_state=args.seed,
                                 verbose=getattr(args, "verbose", 0), **kw)
    times = []
    for _ in range(2):                # the faster of two fits: the machine drifts
        clf = make()
        t = time.perf_counter()
        clf.fit(Xtr, ytr)
        times.append((time.perf_counter() - t) / args.epochs)
    stale = ""
    if kw is not None and kw["n_workers"] > 1:
        # staleness from a third, instrumented fit (the shared update counter it needs
        # costs one contended atomic per update, so it is not timed)
        mean_tau, frac0 = staleness_summary(make(instrument=True).fit(Xtr, ytr).staleness_)
        stale = f"mean tau {mean_tau:.2f}, {100 * frac0:.0f}% tau=0"
    loss = log_loss(ytr, clf.predict_proba(Xtr), labels=clf.classes_)
    return min(times), clf.score(Xte, yte), loss, stale


def main(argv=None) -> int:
    """``python -m sgd_shm.hogwild [options]``: the same as ``python -m sgd_shm hogwild``."""
    from sgd_shm.__main__ import standalone
    return standalone("hogwild", argv, "python -m sgd_shm.hogwild")


if __name__ == "__main__":
    raise SystemExit(main())
