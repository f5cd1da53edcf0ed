"""The ``processes`` backend of Hogwild's engine, matrix factorization and the MLP:
their worker pools over :class:`sgd_shm.core.launcher.SharedWorkers` (the weights,
the schedule tables and the order of the samples in one shared segment per fit;
the calling process is worker 0). See :mod:`sgd_shm.core.launcher` for the start
methods and what a pool guarantees (no segment left behind, dead workers reported)."""
from __future__ import annotations

import numpy as np

from sgd_shm.core.atomics import LINE_WORDS
from sgd_shm.core.launcher import SharedWorkers, WorkerError  # noqa: F401 (tests)
from sgd_shm.hogwild import _kernels as K
from sgd_shm.hogwild import _mf

_NO_LOCK = np.zeros(LINE_WORDS, dtype=np.int64)     # the processes backend never locks


def worker_epoch(data, model, sched, params, report, wid):
    """One worker's slice of a segment, ``_kernels.run_worker`` (a module function so
    tests can replace it)."""
    K.run_worker(data, model, sched, params, report, wid)


_HOGWILD = ("W", "b", "q", "V", "order", "progress", "scale", "eta", "cum", "clock", "hists",
            "Wh", "A", "Ab", "avg", "iargs", "fargs")


def _hogwild_step(wid, v, static, g0, L):
    """Worker wid's share of the segment [g0, g0 + L): its other arguments lie in the
    shared views "iargs" (lo, hi, parts, seeds: see ProcessPool.run_epoch) and
    "fargs" (the driver's fp), so that the message that starts a segment is two
    ints (pickling arrays into every message costs milliseconds per epoch)."""
    data, ip = static
    nw = v["progress"].shape[0] // LINE_WORDS
    lo, hi, parts, seeds = _split_iargs(v["iargs"], nw)
    fp = v["fargs"]
    out = np.zeros(K.N_OUT)
    hists = v["hists"]
    worker_epoch(data, K.Model(v["W"], v["b"], v["q"], v["V"], v["Wh"], _NO_LOCK, v["A"],
                               v["Ab"]),
                 K.Schedule.for_segment(v["order"], parts, seeds, lo, hi, v["progress"],
                                        v["eta"], v["scale"], v["cum"], g0, L, v["avg"]),
                 K.Params.from_driver(fp, ip),
                 K.Report(out, hists[wid, :hists.shape[1] - LINE_WORDS], v["clock"]), wid)
    return out


def _split_iargs(iargs, nw):
    """(lo, hi, parts, seeds) of a segment from the shared "iargs" view."""
    return iargs[:nw], iargs[nw:2 * nw], iargs[2 * nw:3 * nw + 1], iargs[3 * nw + 1:]


class ProcessPool:
    """The Hogwild linear models' worker processes: weights, intercepts, L1
    memory, the order of the samples and the schedule tables live in the shared
    segment for one fit (the driver fills the tables there; each worker reshuffles
    its part of the order there). The calling process is worker 0 (the kernel keeps
    no state between calls). The data is inherited under fork and copied once
    into shared memory under spawn and forkserver (see :class:`SharedWorkers`)."""

    def __init__(self, sgd, prob, n_workers, start_method="fork"):
        k, d = sgd.W.shape
        n = prob.n_samples
        shapes = [((k, d), np.float64), ((k,), np.float64), (sgd.q.shape, np.float64),
                  (sgd.V.shape, np.float64),
                  ((n,), np.int64), ((LINE_WORDS * n_workers,), np.int64),
                  ((n + 1,), np.float64), ((n,), np.float64), ((n + 1,), np.float64),
                  ((LINE_WORDS,), np.int64),
                  ((n_workers, sgd.staleness.shape[0] + LINE_WORDS), np.int64),
                  (sgd._Wh.shape, np.float64),
                  (sgd.A.shape, np.float64), (sgd.Ab.shape, np.float64),
                  (sgd._avg.shape, np.float64),     # averaging (empty without)
                  ((4 * n_workers + 1,), np.int64), ((K.N_FPARAMS,), np.float64)]
        self.pool = SharedWorkers(dict(zip(_HOGWILD, shapes)), _hogwild_step,
                                  (prob.kernel_data(), sgd.ip), start_method,
                                  driver_works=True)
        try:
            self.pool.adopt(sgd, {"W": "W", "b": "b", "q": "q", "V": "V", "order": "_perm",
                                  "scale": "_scale", "eta": "_eta", "cum": "_cum", "A": "A",
                                  "Ab": "Ab", "avg": "_avg", "Wh": "_Wh"},
                            scratch=("_scale", "_eta", "_cum", "_avg", "_Wh"))  # (_tables)
            self.pool.start(n_workers)
        except BaseException:
            self.close()
            raise

    def run_epoch(self, lo, hi, parts, seeds, fp, outs, g0, L, hists, Wh):
        """Run one segment: worker w does positions [lo[w], hi[w]) of the order (and
        takes over chunks of the others' when done) with the schedule of global steps
        [g0, g0 + L), after reshuffling its part [parts[w], parts[w + 1]) with
        seeds[w] unless it is -1; ``Wh`` (the hot block and the workers' published
        steps on it, see _kernels) goes through the segment."""
        v = self.pool.views
        if Wh is not v["Wh"]:                # (the driver's buffer is the view itself)
            v["Wh"][...] = Wh
        K.fresh_progress(len(lo), v["progress"])
        v["hists"][...] = 0
        v["iargs"][...] = np.concatenate([lo, hi, parts, seeds])
        v["fargs"][...] = fp
        try:
            for w, out in enumerate(self.pool.run(lambda w: (int(g0), int(L)))):
                outs[w] = out
        finally:
            hists += v["hists"][:, :hists.shape[1]]
            if Wh is not v["Wh"]:
                Wh[...] = v["Wh"]

    def close(self):
        self.pool.close()


def _mf_step(wid, v, static, lo, hi, seed, lr, reg, reg_bias, mu, fit_bias):
    users, items, ratings = static
    out = np.zeros(_mf.MN_OUT)
    _mf.shuffle_part(v["order"], lo, hi, seed)        # this worker's part, in place
    mf_epoch(v["P"], v["Q"], v["bu"], v["bi"], users, items, ratings, v["order"], lo, hi, lr,
             reg, reg_bias, mu, fit_bias, out)
    return out


def mf_epoch(*args):
    """One worker's slice of a matrix-factorization epoch (replaceable in tests)."""
    _mf.mf_run(*args)


class MFPool:
    """Matrix factorization's worker processes: the factor matrices, biases and
    the order of the ratings live in the shared segment for one fit (each worker
    reshuffles its own part every epoch); the ratings are inherited under fork and
    copied once into shared memory under spawn and forkserver. The calling process
    is worker 0. ``close`` copies the factors back to the estimator."""

    def __init__(self, est, users, items, ratings, n_workers, order, start_method="fork"):
        arrays = {"P": (est.user_factors_.shape, np.float64),
                  "Q": (est.item_factors_.shape, np.float64),
                  "bu": (est.user_bias_.shape, np.float64),
                  "bi": (est.item_bias_.shape, np.float64),
                  "order": ((users.shape[0],), np.int64)}
        self.pool = SharedWorkers(arrays, _mf_step, (users, items, ratings), start_method,
                                  driver_works=True)
        try:
            self.pool.adopt(est, {"P": "user_factors_", "Q": "item_factors_",
                                  "bu": "user_bias_", "bi": "item_bias_"})
            self.pool.views["order"][...] = order
            self.pool.start(n_workers)
        except BaseException:
            self.close()
            raise

    def run_epoch(self, bounds, seeds, *params):
        return self.pool.run(lambda w: (int(bounds[w]), int(bounds[w + 1]), int(seeds[w]),
                                        *params))

    def close(self):
        self.pool.close()
