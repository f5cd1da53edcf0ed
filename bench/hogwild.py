"""Hogwild SGD: epoch time and time to a target loss vs workers.

Problem: ``sgd_shm.data.make_rcv1_like`` (default 200k × 50k, about 14M nonzeros),
logistic loss, L2 with alpha = 1e-4, 'optimal' learning rate (scikit-learn's defaults
for SGDClassifier with loss='log_loss').

Competitors, same loss, penalty, schedule and number of epochs:
``sklearn`` (SGDClassifier, one epoch per ``partial_fit``: it has no threads for a
binary problem), ``hogwild-threads`` and ``hogwild-processes`` (this kit, 1..T workers,
the estimators' default for a fit with max_iter >= AUTO_HOT_MIN_EPOCHS, the default
1000 included: with several workers the AUTO_HOT_FEATURES most frequent features
buffered per worker, see ``sgd_shm._kernels``), ``hogwild-plain``
(threads, ``hot_features=0``: textbook Hogwild, every weight shared on every step) and
``locked`` (the plain kernel with a spinlock around every sample's step: the classic
alternative to Hogwild). The one-time cost of the hot-first copy of the data is timed
apart (``hot_layout_s``), as it is paid once per fit, not per epoch. Epochs run back to
back, as in a fit (and as the C++ reference runs them): each competitor keeps a copy of
its weights after every epoch, and the full training log losses are computed from
those copies after its last epoch, outside the timed region. With ``--cxx``,
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
rows, the pool of processes, the epochs. A T-worker fit runs twice: ``fresh`` (the
first fit on this matrix: the hot-first copy of the rows is built) and ``reused``
(a refit on the same, unchanged matrix: the layout kept by the last fit is checked
by its fingerprint and reused, see ``sgd_shm.hogwild.hot_rows``). Every fit's
training accuracy and log loss are reported beside its time; speed-ups are paired
with the 1-worker fit of the same repetition, as above.
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from bench.common import Series

#: max_iter of the whole fits timed (see the module notes)
FIT_ITERS = (5, 10)


def train_loss(X, y, coef, icpt):
    """Mean log loss of the linear model (coef, icpt) on X with labels y in {-1, +1}."""
    z = y * (X @ coef + icpt)
    return float(np.mean(np.logaddexp(0.0, -z)))


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
    return times, [train_loss(X, y, *wb) for wb in snaps]


def _run_cxx(ref, X, y, epochs, workers, seed):
    from sgd_shm import _kernels as K
    times, weights = ref.run(workers, epochs, seed, 1e-4, K.optimal_t0(1e-4, K.LOG))
    return times, [train_loss(X, y, coef, icpt) for coef, icpt in weights]


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
    return times, [train_loss(X, y, *wb) for wb in snaps]


def _fit_once(X, y, max_iter, workers, backend, seed, fresh):
    """(seconds, training accuracy, training log loss, hot features buffered) of one
    whole fit: the kit's
    HogwildClassifier (workers >= 1; ``fresh``: forget the kept layout first) or, with
    workers == 0, SGDClassifier."""
    from sklearn.linear_model import SGDClassifier

    from sgd_shm import HogwildClassifier
    from sgd_shm.hogwild import AUTO_HOT_FEATURES, clear_layout_cache, hot_rows, layout_kept
    common = dict(loss="log_loss", alpha=1e-4, learning_rate="optimal", max_iter=max_iter,
                  tol=None, random_state=seed)
    if workers == 0:
        clf = SGDClassifier(**common)
    else:
        clf = HogwildClassifier(n_workers=workers, backend=backend, **common)
        if fresh:
            clear_layout_cache()
        elif workers > 1 and not layout_kept(X, AUTO_HOT_FEATURES):
            hot_rows(X, AUTO_HOT_FEATURES)      # as an earlier fit on X leaves it (untimed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        clf.fit(X, y)
        seconds = time.perf_counter() - t0
    return (seconds, float(clf.score(X, y)), train_loss(X, y, clf.coef_[0], clf.intercept_[0]),
            getattr(clf, "hot_features_", 0))


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


def run_fits(X, y, workers_list, reps, seed, iters=FIT_ITERS):
    """Whole fits (see the module notes), interleaved over ``reps`` repetitions after
    a warm-up, with the cache-line handoff between two threads measured around each
    repetition (``bench.common.handoff_ns``); returns (one row per (competitor,
    workers, max_iter), the handoffs before and after each repetition)."""
    from bench.common import handoff_ns, placement
    comps = [("sklearn", 0, None, False), ("hogwild", 1, "threads", False)]
    for T in workers_list:
        if T > 1:
            comps += [(f"hogwild-{b}-{f}", T, b, f == "fresh")
                      for b in ("threads", "processes") for f in ("fresh", "reused")]
    runs = {(c, it): [] for c in comps for it in iters}
    handoffs = []
    for rep in range(reps + 1):                      # rep 0: warm-up
        before = handoff_ns()
        for it in iters:
            for c in comps:
                name, T, backend, fresh = c
                r = _fit_once(X, y, it, T, backend, seed + rep, fresh)
                if rep:
                    runs[(c, it)].append(r)
        if rep:
            handoffs.append([before, handoff_ns()])
    places = [placement(*h) for h in handoffs]
    rows = []
    for (c, it), rs in runs.items():
        name, T, backend, fresh = c
        secs = np.array([r[0] for r in rs])
        row = {"competitor": name, "workers": max(T, 1), "max_iter": it,
               "fit_s": secs.tolist(), "fit_s_median": float(np.median(secs)),
               "train_accuracy": float(np.median([r[1] for r in rs])),
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
          f"{'vs 1 worker (cores near, far)':>31s} {'vs sklearn':>10s} {'accuracy':>8s} "
          f"{'loss':>7s}")
    for r in fits:
        v1 = f"{r['speedup_vs_1']:.2f}x" if r.get("workers", 1) > 1 else "-"
        for p in ("near", "far"):
            if f"speedup_vs_1_{p}" in r:
                v1 += f" {p} {r[f'speedup_vs_1_{p}']:.2f}x"
        vs = f"{r['speedup_vs_sklearn']:.2f}x" if "speedup_vs_sklearn" in r else "-"
        print(f"{r['competitor']:28s} {r['workers']:7d} {r['max_iter']:8d} "
              f"{r['fit_s_median']:7.3f} {v1:>31s} {vs:>10s} {r['train_accuracy']:8.4f} "
              f"{r['train_loss']:7.4f}")


def run(args, workers_list):
    """Every competitor at every worker count, interleaved over ``args.reps`` (after a
    warm-up). Returns (result rows, extra results, the problem (X, y))."""
    from tqdm import tqdm

    from sgd_shm.data import make_rcv1_like
    from sgd_shm.hogwild import Problem
    t0 = time.perf_counter()
    X, y = make_rcv1_like(args.sgd_samples, args.sgd_features, random_state=args.seed)
    gen_s = time.perf_counter() - t0
    from sgd_shm.hogwild import AUTO_HOT_MIN_EPOCHS, auto_hot_features
    E = args.epochs
    # what a fit with several workers and max_iter >= AUTO_HOT_MIN_EPOCHS uses (the
    # estimators' default max_iter included); this bench runs fewer epochs, per-epoch
    # speed being what it measures, and times the one-time copy apart
    H_auto = auto_hot_features(X, max(E, AUTO_HOT_MIN_EPOCHS))
    layout_s, probs = {}, {}
    from sgd_shm.hogwild import clear_layout_cache
    # the one-time copies, timed apart: plain rows, the hot-first rows of a first fit
    # ("hot") and of a refit ("kept": the layout kept from the last one, checked)
    for what in ("plain", "hot", "kept") * 3:
        if what == "hot":
            clear_layout_cache()
        t0 = time.perf_counter()
        probs[what] = Problem.from_xy(X, y[:, None], hot_features=0 if what == "plain" else H_auto)
        layout_s.setdefault(what, []).append(time.perf_counter() - t0)
    plain, hot = probs["plain"], probs["kept"]

    def prob_of(name, T):
        """The kit's default: hot buffers with several workers (not locked, not plain)."""
        return hot if T > 1 and name in ("hogwild-threads", "hogwild-processes") else plain
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
                    times, losses = _run_sklearn(X, y, E, args.seed + rep)
                elif name == "cxx-hogwild":
                    times, losses = _run_cxx(ref, X, y, E, T, args.seed + rep)
                else:
                    times, losses = _run_kit(prob_of(name, T), X, y, E, T, backend, locked,
                                             args.seed + rep)
                if rep:
                    series[c].rates.append(X.shape[0] / _epoch_time(times))
                    curves[c].append({"epoch_s": times, "train_loss": losses})
                bar.update()
        bar.close()
    finally:
        if ref is not None:
            ref.close()
    rows = []
    target = None
    base = curves[("sklearn", 1, None, False)]
    if base:
        target = 1.01 * float(np.median([cv["train_loss"][-1] for cv in base]))
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
        ttt = []
        for cv in curves[c]:
            cum = np.cumsum(cv["epoch_s"])
            hit = np.flatnonzero(np.asarray(cv["train_loss"]) <= target)
            ttt.append(float(cum[hit[0]]) if hit.size else None)
        ok = [v for v in ttt if v is not None]
        s["time_to_target_s"] = float(np.median(ok)) if len(ok) == len(ttt) else None
        s["curves"] = curves[c]
        rows.append(s)
    # staleness histograms (instrumented runs, not timed): updates by others between a
    # worker's read and its write
    stale = {}
    from sgd_shm.hogwild import HogwildSGD, staleness_summary
    for T in workers_list:
        for backend in ("threads", "processes"):
            sgd = HogwildSGD(X.shape[1], 1, loss="log_loss", alpha=1e-4, intercept_decay=0.01,
                             n_workers=T, backend=backend, instrument=True, seed=args.seed)
            with sgd.session(prob_of("hogwild-threads", T)):
                for _ in range(2):
                    sgd.epoch(prob_of("hogwild-threads", T))
            h = sgd.staleness
            mean_tau, frac_tau0 = staleness_summary(h)
            stale[f"{backend}-{T}"] = {
                "hist": h.tolist(), "updates": int(h.sum()),
                "mean_tau": mean_tau, "frac_tau0": frac_tau0,
                "max_tau_bin": int(np.flatnonzero(h).max()) if h.any() else 0}
    free = [free_cores()]
    fits, handoffs = run_fits(X, y, workers_list, args.reps, args.seed)
    free.append(free_cores())
    extra = {"fits": fits, "free_cores_before_after_fits": free, "staleness": stale,
             "handoff_ns_fits": handoffs,
             "problem": {"n_samples": X.shape[0], "n_features": X.shape[1], "nnz": int(X.nnz),
                         "generate_s": gen_s, "loss": "log_loss", "alpha": 1e-4,
                         "learning_rate": "optimal"},
             "target_train_loss": target,
             "hot_layout_s": {"hot_features": H_auto,
                              "plain_s": float(np.median(layout_s["plain"])),
                              "hot_s": float(np.median(layout_s["hot"])),
                              # a refit's: the kept layout, checked by its fingerprint
                              "hot_reused_s": float(np.median(layout_s["kept"]))}}
    return rows, extra, (X, y)
