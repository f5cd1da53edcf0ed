"""Hogwild SGD: epoch time and time to a held-out accuracy vs workers.

Problem: ``sgd_shm.data.make_rcv1_like`` (default 200k × 50k training rows, about 14M
nonzeros, and a tenth as many more rows held out), logistic loss, L2 with alpha =
1e-4, 'optimal' learning rate (scikit-learn's defaults for SGDClassifier with
loss='log_loss'). After every epoch: the training log loss and the held-out accuracy;
the target: scikit-learn's final held-out accuracy minus TARGET_GAP.

Competitors, same loss, penalty, schedule and number of epochs:
``sklearn`` (SGDClassifier, one epoch per ``partial_fit``: it has no threads for a
binary problem), ``hogwild-threads`` and ``hogwild-processes`` (this kit, 1..T workers,
the estimators' default, ``hot_features="auto"``, for a fit of max_iter >=
AUTO_HOT_MIN_EPOCHS: with several workers on this problem every feature is buffered
per worker and the rows are read in place; on wider data the AUTO_HOT_FEATURES most
frequent ones, in a hot-first copy of the rows; see ``sgd_shm.hogwild``),
``hogwild-plain`` (threads, ``hot_features=0``: textbook Hogwild, every weight shared
on every step) and ``locked`` (the plain kernel with a spinlock around every sample's
step: the classic alternative to Hogwild). Building the rows the kernels read is timed
apart (``hot_layout_s``), as it is paid once per fit, not per epoch. Epochs run back to
back, as in a fit (and as the C++ reference runs them): each competitor keeps a copy of
its weights after every epoch, and the full training log losses and held-out
accuracies are computed from those copies after its last epoch, outside the timed
region. With ``--cxx``,
``cxx-hogwild`` is a plain C++ Hogwild (``bench/cxx/hogwild.cpp``: the same algorithm
with std::thread, no prefetching, no hot buffers), compiled on the spot and run in the
same repetitions.

Speed-ups against one worker are paired: in every repetition the T-worker run of a
competitor follows its 1-worker run directly, and the median of the per-repetition
ratios is reported, so that slow drifts of a shared machine cancel.

Whole fits (``fits`` in the JSON), as a user waits for them: ``fit(X, y)`` of
``SGDClassifier`` and of ``HogwildClassifier`` (1 worker; T workers on threads and
on processes) with the same loss, alpha and schedule, ``tol=None``, at max_iter =
each of FIT_ITERS, everything inside ``fit`` timed: validation, the layout of the
rows, the pool of processes, the epochs. Where "auto" copies the rows hot-first (wide
data), a T-worker fit runs twice: ``fresh`` (the first fit on this matrix: the copy is
built) and ``reused`` (a refit on the same, unchanged matrix: the layout kept by the
last fit is checked by its fingerprint and reused, see ``sgd_shm.hogwild.hot_rows``). Every fit's
held-out accuracy and training log loss are reported beside its time; speed-ups are
paired with the 1-worker fit of the same repetition, as above.
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from bench.common import Series

#: max_iter of the whole fits timed (see the module notes)
FIT_ITERS = (5, 10)
#: the target: scikit-learn's final held-out accuracy minus this (half a point)
TARGET_GAP = 0.005


def train_loss(X, y, coef, icpt):
    """Mean log loss of the linear model (coef, icpt) on X with labels y in {-1, +1}."""
    z = y * (X @ coef + icpt)
    return float(np.mean(np.logaddexp(0.0, -z)))


def accuracy(X, y, coef, icpt):
    """Accuracy of the linear model (coef, icpt) on X with labels y in {-1, +1}."""
    return float(np.mean(np.where(X @ coef + icpt > 0, 1.0, -1.0) == y))


def split(X, y, n_train):
    """(X, y, (X_val, y_val)): the first ``n_train`` rows, and the rest held out."""
    return X[:n_train], y[:n_train], (X[n_train:], y[n_train:])


def _measures(X, y, held, snaps):
    """(training log losses, held-out accuracies) of per-epoch weight copies."""
    return ([train_loss(X, y, *wb) for wb in snaps],
            [accuracy(*held, *wb) for wb in snaps])


def _epoch_time(times):
    """A run's epoch time: the median over epochs 2..E (epoch 1 pays first touches)."""
    return float(np.median(times[1:] if len(times) > 1 else times))


def _run_kit(prob, X, y, epochs, workers, backend, locked, seed):
    from sgd_shm.hogwild import HogwildSGD
    sgd = HogwildSGD(X.shape[1], 1, loss="log_loss", alpha=1e-4, learning_rate="optimal",
                     intercept_decay=0.01, n_workers=workers, backend=backend, locked=locked,
                     seed=seed)
    times, snaps = [], []
    with sgd.session(prob):
        for _ in range(epochs):
            t0 = time.perf_counter()
            sgd.epoch(prob)
            times.append(time.perf_counter() - t0)
            snaps.append((sgd.W[0].copy(), sgd.b[0]))
    return times, snaps


def _run_cxx(ref, X, y, epochs, workers, seed):
    from sgd_shm.hogwild import _kernels as K
    times, weights = ref.run(workers, epochs, seed, 1e-4, K.optimal_t0(1e-4, K.LOG))
    return times, list(weights)


def _run_sklearn(X, y, epochs, seed):
    from sklearn.linear_model import SGDClassifier
    clf = SGDClassifier(loss="log_loss", alpha=1e-4, learning_rate="optimal", random_state=seed)
    times, snaps = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(epochs):
            t0 = time.perf_counter()
            clf.partial_fit(X, y, classes=[-1.0, 1.0])
            times.append(time.perf_counter() - t0)
            snaps.append((clf.coef_[0].copy(), clf.intercept_[0]))
    return times, snaps


def _fit_once(X, y, held, max_iter, workers, backend, seed, layout=None):
    """(seconds, held-out accuracy, training log loss, hot features buffered) of one
    whole fit: the kit's HogwildClassifier (workers >= 1; ``layout`` "fresh": forget
    the kept hot-first layout first, "reused": keep one of X, None: neither, for data
    whose rows "auto" reads in place) or, with workers == 0, SGDClassifier."""
    from sklearn.linear_model import SGDClassifier

    from sgd_shm import HogwildClassifier
    from sgd_shm.hogwild import AUTO_HOT_FEATURES, clear_layout_cache, hot_rows, layout_kept
    common = dict(loss="log_loss", alpha=1e-4, learning_rate="optimal", max_iter=max_iter,
                  tol=None, random_state=seed)
    if workers == 0:
        clf = SGDClassifier(**common)
    else:
        clf = HogwildClassifier(n_workers=workers, backend=backend, **common)
        if layout == "fresh":
            clear_layout_cache()
        elif layout == "reused" and not layout_kept(X, AUTO_HOT_FEATURES):
            hot_rows(X, AUTO_HOT_FEATURES)      # as an earlier fit on X leaves it (untimed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        clf.fit(X, y)
        seconds = time.perf_counter() - t0
    return (seconds, float(clf.score(*held)),
            train_loss(X, y, clf.coef_[0], clf.intercept_[0]), getattr(clf, "hot_features_", 0))


def free_cores(threads=2, reps=3, n=30_000_000):
    """How many cores' worth a private compiled busy loop gets on ``threads`` threads
    against one, interleaved, median of ``reps``: about ``threads`` on a quiet machine,
    near 1 when other processes hold the cores. No speed-up measured beside it can
    exceed it (the issue's calibration: both cores of an idle 2-core VM give 1.94-2.02)."""
    import numba as nb

    from bench.common import timed_threads

    @nb.njit(nogil=True)
    def spin(k):
        x = 0.0
        for _ in range(k):
            x = x * 0.999999 + 1.0
        return x
    spin(10)

    def wall(k):
        return timed_threads(lambda _: spin(n), k)
    return float(np.median([threads * wall(1) / wall(threads) for _ in range(reps)]))


def run_fits(X, y, held, workers_list, reps, seed, iters=FIT_ITERS):
    """Whole fits (see the module notes), interleaved over ``reps`` repetitions after
    a warm-up, with the cache-line handoff between two threads measured around each
    repetition (``bench.common.handoff_ns``); returns (one row per (competitor,
    workers, max_iter), the handoffs before and after each repetition)."""
    from bench.common import handoff_ns, placement
    from sgd_shm.hogwild import auto_hot_features
    comps = [("sklearn", 0, None, None), ("hogwild", 1, "threads", None)]
    # a first fit and a refit differ only where "auto" copies the rows hot-first
    copies = 0 < auto_hot_features(X, max(iters), 1, max(workers_list)) < X.shape[1]
    for T in workers_list:
        if T > 1:
            comps += [(f"hogwild-{b}-{f}" if copies else f"hogwild-{b}", T, b,
                       f if copies else None)
                      for b in ("threads", "processes") for f in ("fresh", "reused")[:1 + copies]]
    runs = {(c, it): [] for c in comps for it in iters}
    handoffs = []
    for rep in range(reps + 1):                      # rep 0: warm-up
        before = handoff_ns()
        for it in iters:
            for c in comps:
                name, T, backend, layout = c
                r = _fit_once(X, y, held, it, T, backend, seed + rep, layout)
                if rep:
                    runs[(c, it)].append(r)
        if rep:
            handoffs.append([before, handoff_ns()])
    places = [placement(*h) for h in handoffs]
    rows = []
    for (c, it), rs in runs.items():
        name, T, backend, _ = c
        secs = np.array([r[0] for r in rs])
        row = {"competitor": name, "workers": max(T, 1), "max_iter": it,
               "fit_s": secs.tolist(), "fit_s_median": float(np.median(secs)),
               "val_accuracy": float(np.median([r[1] for r in rs])),
               "train_loss": float(np.median([r[2] for r in rs])),
               "hot_features": int(rs[0][3])}
        one = np.array([r[0] for r in runs[(comps[1], it)]])
        sk = np.array([r[0] for r in runs[(comps[0], it)]])
        if name != "sklearn":
            ratios = one / secs                      # paired: the same repetition's
            row["speedup_vs_1"] = float(np.median(ratios))
            row["speedup_vs_1_range"] = [float(ratios.min()), float(ratios.max())]
            row["speedup_vs_sklearn"] = float(np.median(sk / secs))
            for place in ("near", "far"):            # the repetitions of one placement
                pick = [i for i, p in enumerate(places) if p == place]
                if pick:
                    row[f"speedup_vs_1_{place}"] = float(np.median(ratios[pick]))
                    row[f"reps_{place}"] = len(pick)
        rows.append(row)
    return rows, handoffs


def print_fits(fits, free=None):
    """The whole-fit table on stdout (``free``: free_cores() before and after)."""
    print("\nwhole fits (fit(X, y), tol=None), median seconds; paired speed-ups" +
          (f"; a private busy loop on 2 threads got {free[0]:.2f} and {free[1]:.2f} cores "
           "before and after" if free else "") + ":")
    print(f"{'competitor':28s} {'workers':>7s} {'max_iter':>8s} {'fit s':>7s} "
          f"{'vs 1 worker (cores near, far)':>31s} {'vs sklearn':>10s} {'held-out acc':>12s} "
          f"{'train loss':>10s}")
    for r in fits:
        v1 = f"{r['speedup_vs_1']:.2f}x" if r.get("workers", 1) > 1 else "-"
        for p in ("near", "far"):
            if f"speedup_vs_1_{p}" in r:
                v1 += f" {p} {r[f'speedup_vs_1_{p}']:.2f}x"
        vs = f"{r['speedup_vs_sklearn']:.2f}x" if "speedup_vs_sklearn" in r else "-"
        print(f"{r['competitor']:28s} {r['workers']:7d} {r['max_iter']:8d} "
              f"{r['fit_s_median']:7.3f} {v1:>31s} {vs:>10s} {r['val_accuracy']:12.4f} "
              f"{r['train_loss']:10.4f}")


def print_sweep(sweep):
    """The hot-feature sweep (see hot_sweep) on stdout; * marks what "auto" picks."""
    print("\nbuffered features, two workers (threads), median s per epoch; * = auto:")
    for r in sweep:
        print(f"  {r['problem']:8s} {r['n_features']:>9,} features "
              f"({r['nnz'] / r['n_features']:6.0f} nnz each)  {r['variant']:14s} "
              f"{r['workers']} worker(s) {r['epoch_s']:7.3f} s  {r['speedup_vs_1']:5.2f}x "
              f"train loss {r['train_loss']:.4f}  held-out acc {r['val_accuracy']:.4f}"
              f"{' *' if r['auto'] else ''}")


def _problems(X, y, E, workers_list):
    """(prob_of(competitor, T): the rows a competitor's T workers read, the hot features
    of the largest T, the seconds of building the rows: plain, hot (a first fit's: every
    feature, the rows read in place, or a hot-first copy) and kept (a refit's: the copy
    kept from the last one, checked))."""
    from sgd_shm.hogwild import (AUTO_HOT_MIN_EPOCHS, Problem, auto_hot_features,
                                 clear_layout_cache)

    # what a fit with T workers and max_iter >= AUTO_HOT_MIN_EPOCHS uses (the estimators'
    # default max_iter included); this bench runs fewer epochs, per-epoch speed being
    # what it measures, and times building the rows apart
    def h_auto(T):
        return auto_hot_features(X, max(E, AUTO_HOT_MIN_EPOCHS), 1, T)
    H_auto = h_auto(max(workers_list))
    layout_s, probs = {}, {}
    for what in ("plain", "hot", "kept") * 3:
        if what == "hot":
            clear_layout_cache()
        t0 = time.perf_counter()
        probs[what] = Problem.from_xy(X, y[:, None], hot_features=0 if what == "plain" else H_auto)
        layout_s.setdefault(what, []).append(time.perf_counter() - t0)
    plain = probs["plain"]
    by_h = {0: plain, H_auto: probs["kept"]}

    def prob_of(name, T):
        """The kit's default: hot buffers with several workers (not locked, not plain)."""
        if T == 1 or name not in ("hogwild-threads", "hogwild-processes"):
            return plain
        H = h_auto(T)
        if H not in by_h:
            by_h[H] = Problem.from_xy(X, y[:, None], hot_features=H)
        return by_h[H]
    return prob_of, H_auto, layout_s


def _staleness(X, workers_list, prob_of, seed):
    """Staleness histograms (instrumented runs of 2 epochs, not timed): updates by
    others between a worker's read and its write, per backend and worker count."""
    from sgd_shm.hogwild import HogwildSGD, staleness_summary
    stale = {}
    for T in workers_list:
        for backend in ("threads", "processes"):
            sgd = HogwildSGD(X.shape[1], 1, loss="log_loss", alpha=1e-4, intercept_decay=0.01,
                             n_workers=T, backend=backend, instrument=True, seed=seed)
            with sgd.session(prob_of("hogwild-threads", T)):
                for _ in range(2):
                    sgd.epoch(prob_of("hogwild-threads", T))
            h = sgd.staleness
            mean_tau, frac_tau0 = staleness_summary(h)
            stale[f"{backend}-{T}"] = {
                "hist": h.tolist(), "updates": int(h.sum()),
                "mean_tau": mean_tau, "frac_tau0": frac_tau0,
                "max_tau_bin": int(np.flatnonzero(h).max()) if h.any() else 0}
    return stale


#: the hot-feature sweep's problems: (name, features as a multiple of --sgd-features,
#: density as a multiple of make_rcv1_like's default): the bench's problem, and one ten
#: times wider with about as many nonzeros (a few per feature)
SWEEP_PROBLEMS = (("default", 1, 1.0), ("wide", 10, 0.11))


def hot_sweep(args, epochs=4):
    """Two-worker (threads) epochs with hot_features 0 (plain Hogwild), AUTO_HOT_FEATURES
    (a hot-first copy of the rows) and every feature (the rows read in place), beside
    one worker, on SWEEP_PROBLEMS: what "auto" chooses between; each run as the main
    table's (``_run_kit``). Interleaved over ``args.reps`` after a warm-up; epoch time =
    median of epochs 2..E, paired with the same repetition's one-worker epoch; training
    loss and held-out accuracy (a tenth as many more rows) after the last epoch.
    Returns one row per (problem, variant)."""
    from sgd_shm.data import make_rcv1_like
    from sgd_shm.hogwild import AUTO_HOT_FEATURES, AUTO_HOT_MIN_EPOCHS, Problem, auto_hot_features
    rows = []
    for name, wider, denser in SWEEP_PROBLEMS:
        d = args.sgd_features * wider
        X, y = make_rcv1_like(args.sgd_samples + args.sgd_samples // 10, d,
                              density=0.0015 * denser, random_state=args.seed)
        X, y, held = split(X, y, args.sgd_samples)
        Y = y[:, None]
        top = min(AUTO_HOT_FEATURES, d - 1)
        variants = (("1 worker", 0, 1), ("plain", 0, 2), (f"top {top}", top, 2),
                    ("every feature", d, 2))
        probs = {H: Problem.from_xy(X, Y, hot_features=H) for _, H, _ in variants}
        times = {v: [] for v in variants}
        losses = {v: [] for v in variants}
        accs = {v: [] for v in variants}
        for rep in range(args.reps + 1):
            for v in variants:
                ts, snaps = _run_kit(probs[v[1]], X, y, epochs, v[2], "threads", False,
                                     args.seed + rep)
                if rep:
                    times[v].append(_epoch_time(ts))
                    ls, acc = _measures(X, y, held, snaps[-1:])
                    losses[v].append(ls[-1])
                    accs[v].append(acc[-1])
        one = np.asarray(times[variants[0]])
        auto = auto_hot_features(X, AUTO_HOT_MIN_EPOCHS, 1, 2)
        for v in variants:
            rows.append({"problem": name, "n_samples": X.shape[0], "n_features": d,
                         "nnz": int(X.nnz), "variant": v[0], "hot_features": v[1],
                         "workers": v[2], "epoch_s": float(np.median(times[v])),
                         "speedup_vs_1": float(np.median(one / np.asarray(times[v]))),
                         "train_loss": float(np.median(losses[v])),
                         "val_accuracy": float(np.median(accs[v])),
                         "auto": v[2] > 1 and v[1] == auto})
    return rows


def _summaries(comps, series, curves):
    """(one result row per competitor: rates, epoch time, paired speed-up against its
    one worker, final training loss and held-out accuracy, time to the target; the
    target: sklearn's final held-out accuracy minus TARGET_GAP)."""
    rows = []
    target = None
    base = curves[("sklearn", 1, None, False)]
    if base:
        target = float(np.median([cv["val_accuracy"][-1] for cv in base])) - TARGET_GAP

    def epoch_s(c):
        return [_epoch_time(cv["epoch_s"]) for cv in curves[c]]
    for c in comps:
        s = series[c].summary()
        eps = epoch_s(c)
        s["epoch_s_median"] = float(np.median(eps))
        one = next((o for o in comps if o[1] == 1 and o[2:] == c[2:] and
                    o[0] == ("hogwild-threads" if c[0] == "hogwild-plain" else c[0])), None)
        if one is not None and c[0] != "sklearn":
            # paired: this repetition's 1-worker epoch over this one's
            ratios = np.asarray(epoch_s(one)) / np.asarray(eps)
            s["speedup_vs_1"] = float(np.median(ratios))
            s["speedup_vs_1_range"] = [float(ratios.min()), float(ratios.max())]
        s["final_train_loss"] = float(np.median([cv["train_loss"][-1] for cv in curves[c]]))
        s["final_val_accuracy"] = float(np.median([cv["val_accuracy"][-1]
                                                   for cv in curves[c]]))
        ttt = []
        for cv in curves[c]:
            cum = np.cumsum(cv["epoch_s"])
            hit = np.flatnonzero(np.asarray(cv["val_accuracy"]) >= target)
            ttt.append(float(cum[hit[0]]) if hit.size else None)
        ok = [v for v in ttt if v is not None]
        s["time_to_target_s"] = float(np.median(ok)) if len(ok) == len(ttt) else None
        s["curves"] = curves[c]
        rows.append(s)
    return rows, target


def run(args, workers_list):
    """Every competitor at every worker count, interleaved over ``args.reps`` (after a
    warm-up). Returns (result rows, extra results, the problem (X, y))."""
    from tqdm import tqdm

    from sgd_shm.data import make_rcv1_like
    t0 = time.perf_counter()
    X, y = make_rcv1_like(args.sgd_samples + args.sgd_samples // 10, args.sgd_features,
                          random_state=args.seed)
    X, y, held = split(X, y, args.sgd_samples)
    gen_s = time.perf_counter() - t0
    E = args.epochs
    prob_of, H_auto, layout_s = _problems(X, y, E, workers_list)
    comps = [("sklearn", 1, None, False)]
    # each competitor's worker counts side by side (paired speed-ups, see above);
    # hogwild-plain's T-worker runs follow hogwild-threads' and pair with its 1 worker
    for name, backend, locked in (("hogwild-threads", "threads", False),
                                  ("hogwild-plain", "threads", False),
                                  ("hogwild-processes", "processes", False),
                                  ("locked", "threads", True)):
        comps += [(name, T, backend, locked) for T in workers_list
                  if T > 1 or name != "hogwild-plain"]
    ref = None
    if getattr(args, "cxx", False):
        from bench.cxx_hogwild import Reference
        ref = Reference(X, y)
        comps += [("cxx-hogwild", T, "cxx", False) for T in workers_list]
    series = {c: Series(c[0], {"workers": c[1], "epochs": E}) for c in comps}
    curves = {c: [] for c in comps}
    try:
        bar = tqdm(total=(args.reps + 1) * len(comps), desc="hogwild", leave=False)
        for rep in range(args.reps + 1):                 # rep 0: warm-up (JIT, page faults)
            for c in comps:
                name, T, backend, locked = c
                if name == "sklearn":
                    times, snaps = _run_sklearn(X, y, E, args.seed + rep)
                elif name == "cxx-hogwild":
                    times, snaps = _run_cxx(ref, X, y, E, T, args.seed + rep)
                else:
                    times, snaps = _run_kit(prob_of(name, T), X, y, E, T, backend, locked,
                                            args.seed + rep)
                if rep:
                    series[c].rates.append(X.shape[0] / _epoch_time(times))
                    losses, accs = _measures(X, y, held, snaps)
                    curves[c].append({"epoch_s": times, "train_loss": losses,
                                      "val_accuracy": accs})
                bar.update()
        bar.close()
    finally:
        if ref is not None:
            ref.close()
    rows, target = _summaries(comps, series, curves)
    stale = _staleness(X, workers_list, prob_of, args.seed)
    sweep = hot_sweep(args)
    free = [free_cores()]
    fits, handoffs = run_fits(X, y, held, workers_list, args.reps, args.seed)
    free.append(free_cores())
    extra = {"fits": fits, "free_cores_before_after_fits": free, "staleness": stale,
             "hot_sweep": sweep,
             "handoff_ns_fits": handoffs,
             "problem": {"n_samples": X.shape[0], "n_features": X.shape[1], "nnz": int(X.nnz),
                         "n_held_out": held[0].shape[0],
                         "generate_s": gen_s, "loss": "log_loss", "alpha": 1e-4,
                         "learning_rate": "optimal"},
             "target_val_accuracy": target, "target_gap": TARGET_GAP,
             "hot_layout_s": {"hot_features": H_auto,
                              "plain_s": float(np.median(layout_s["plain"])),
                              "hot_s": float(np.median(layout_s["hot"])),
                              # a refit's: the kept layout, checked by its fingerprint
                              "hot_reused_s": float(np.median(layout_s["kept"]))}}
    return rows, extra, (X, y)
