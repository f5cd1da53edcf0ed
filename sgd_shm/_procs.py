"""The ``processes`` backend of Hogwild: worker processes on shared-memory weights.

For one training call, a :class:`ProcessPool` puts the weights, intercepts, L1
memory and the epoch's shuffled order in one shared segment
(:class:`relaxed.shm.Segment`), forks ``n_workers`` ``multiprocess`` workers
that inherit the (read-only) data, and on every epoch tells each worker its
slice. The workers run the same Numba kernel as the threads backend, on the
shared arrays, without locks. ``close()`` (always called, from a ``finally``)
copies the weights back to private memory, stops the workers and unlinks the
segment, so nothing is left in /dev/shm after training, an exception in a
worker, or a worker killed by a signal.
"""
from __future__ import annotations

import traceback

import multiprocess as mp
import numpy as np

from relaxed.shm import HEADER_SIZE, Segment
from sgd_shm import _kernels as K
from sgd_shm._intrinsics import LINE_WORDS

_ALIGN = 8 * LINE_WORDS          # every array starts on a padded cache line of its own
_NO_LOCK = np.zeros(LINE_WORDS, dtype=np.int64)     # the processes backend never locks


def _layout(shapes):
    offsets, pos = [], 0
    for shape, dtype in shapes:
        offsets.append(pos)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        pos += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN + _ALIGN    # a line of padding
    return offsets, max(pos, _ALIGN)


def shared_arrays(arrays):
    """One shared :class:`Segment` holding ``arrays`` ({name: (shape, dtype)}),
    each on cache lines of its own; returns (segment, {name: array view}).
    Forked processes inherit the views; close the segment (after dropping the
    views) to unlink it."""
    names = list(arrays)
    shapes = [arrays[k] for k in names]
    offsets, size = _layout(shapes)
    seg = Segment.create(max(size, HEADER_SIZE), shared=True)
    try:
        views = {k: np.ndarray(shape, dtype=dt, buffer=seg.buf, offset=off)
                 for k, (shape, dt), off in zip(names, shapes, offsets)}
    except BaseException:
        seg.close()
        raise
    return seg, views


def worker_epoch(data, model, sched, params, report, wid):
    """One worker's slice of a segment, ``_kernels.run_worker`` (a module function so
    tests can replace it)."""
    K.run_worker(data, model, sched, params, report, wid)


def _serve(conn, wid, step, views, static):
    """A worker's loop: each message but "stop" is one call of ``step``."""
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                return
            conn.send(("ok", step(wid, views, static, *msg[1:])))
    except (EOFError, KeyboardInterrupt):
        return
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except Exception:
            pass


class WorkerError(RuntimeError):
    """A Hogwild worker process raised or died."""


class SharedWorkers:
    """Forked ``multiprocess`` workers around one shared segment.

    ``arrays``: {name: (shape, dtype)} laid out in one :class:`Segment` (each on
    its own cache lines) and exposed as ``self.views``. Each worker loops on
    ``step(wid, views, static, *args) -> result`` for every :meth:`run`;
    ``static`` (the data) is inherited by fork, never copied into the segment.
    :meth:`adopt` moves an object's arrays into the segment for its lifetime;
    :meth:`start` forks the workers once the arrays are filled; :meth:`close`
    stops the workers, gives adopted arrays back and unlinks the segment."""

    def __init__(self, arrays, step, static):
        self.procs, self.conns = [], []
        self.seg, self.views = shared_arrays(arrays)
        self._step, self._static = step, static
        self._adopted = None

    def adopt(self, obj, attrs):
        """Copy obj's arrays ``attrs`` ({view name: attribute name}) into the shared
        views and point the attributes at the views; :meth:`close` copies the views
        back into the original arrays and points the attributes at them again."""
        private = {a: getattr(obj, a) for a in attrs.values()}
        for key, a in attrs.items():
            self.views[key][...] = private[a]
        self._adopted = (obj, attrs, private)
        for key, a in attrs.items():
            setattr(obj, a, self.views[key])

    def start(self, n_workers):
        """Fork the workers (after the caller filled the shared arrays)."""
        ctx = mp.get_context("fork")
        try:
            for _ in range(n_workers):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_serve, args=(child, len(self.procs), self._step,
                                                     self.views, self._static), daemon=True)
                p.start()
                child.close()
                self.procs.append(p)
                self.conns.append(parent)
        except BaseException:
            self.close()
            raise

    def run(self, args_of):
        """Send worker w the arguments ``args_of(w)``, wait for all; returns their
        results. Raises :class:`WorkerError` if one raised or died."""
        for w, conn in enumerate(self.conns):
            conn.send(("run", *args_of(w)))
        errors, results = [], [None] * len(self.conns)
        for w, (conn, p) in enumerate(zip(self.conns, self.procs)):
            while not conn.poll(0.2):
                if not p.is_alive():
                    errors.append(f"worker {w} (pid {p.pid}) died with exit code {p.exitcode}")
                    break
            else:
                try:
                    status, payload = conn.recv()
                except EOFError:                       # it died before answering
                    p.join(timeout=2)
                    errors.append(f"worker {w} (pid {p.pid}) died with exit code {p.exitcode}")
                    continue
                if status == "ok":
                    results[w] = payload
                else:
                    errors.append(f"worker {w} raised:\n{payload}")
        if errors:
            raise WorkerError("Hogwild worker failure; training stopped and shared memory "
                              "released.\n" + "\n".join(errors))
        return results

    def close(self):
        for conn in self.conns:
            try:
                conn.send(("stop",))
            except Exception:
                pass
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        if self._adopted is not None:
            obj, attrs, private = self._adopted
            for key, a in attrs.items():
                private[a][...] = self.views[key]
                setattr(obj, a, private[a])
            self._adopted = None
        self.views = {}
        self.seg.close()


_HOGWILD = ("W", "b", "q", "V", "order", "progress", "scale", "eta", "cum", "clock", "hists",
            "Wh")


def _hogwild_step(wid, v, static, lo, hi, parts, seeds, fp, g0, L):
    data, ip = static
    out = np.zeros(K.N_OUT)
    hists = v["hists"]
    worker_epoch(data, K.Model(v["W"], v["b"], v["q"], v["V"], v["Wh"], _NO_LOCK),
                 K.Schedule.for_segment(v["order"], parts, seeds, lo, hi, v["progress"],
                                        v["eta"], v["scale"], v["cum"], g0, L),
                 K.Params.from_driver(fp, ip),
                 K.Report(out, hists[wid, :hists.shape[1] - LINE_WORDS], v["clock"]), wid)
    return out


class ProcessPool:
    """The Hogwild linear models' worker processes: weights, intercepts, L1
    memory, the order of the samples and the schedule tables live in the shared
    segment for one fit (the driver fills the tables there; each worker reshuffles
    its part of the order there)."""

    def __init__(self, sgd, prob, n_workers):
        k, d = sgd.W.shape
        n = prob.n_samples
        shapes = [((k, d), np.float64), ((k,), np.float64), (sgd.q.shape, np.float64),
                  (sgd.V.shape, np.float64),
                  ((n,), np.int64), ((LINE_WORDS * n_workers,), np.int64),
                  ((n + 1,), np.float64), ((n,), np.float64), ((n + 1,), np.float64),
                  ((LINE_WORDS,), np.int64),
                  ((n_workers, sgd.staleness.shape[0] + LINE_WORDS), np.int64),
                  ((n_workers + 1, k, prob.hot_feat.shape[0]), np.float64)]
        self.pool = SharedWorkers(dict(zip(_HOGWILD, shapes)), _hogwild_step,
                                  (prob.kernel_data(), sgd.ip))
        try:
            self.pool.adopt(sgd, {"W": "W", "b": "b", "q": "q", "V": "V", "order": "_perm",
                                  "scale": "_scale", "eta": "_eta", "cum": "_cum"})
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
        v["Wh"][...] = Wh
        K.fresh_progress(len(lo), v["progress"])
        v["hists"][...] = 0
        try:
            for w, out in enumerate(self.pool.run(
                    lambda w: (lo, hi, parts, seeds, fp, int(g0), int(L)))):
                outs[w] = out
        finally:
            hists += v["hists"][:, :hists.shape[1]]
            Wh[...] = v["Wh"]

    def close(self):
        self.pool.close()


def _mf_step(wid, v, static, lo, hi, seed, lr, reg, reg_bias, mu, fit_bias):
    from sgd_shm import _mf
    users, items, ratings = static
    out = np.zeros(_mf.MN_OUT)
    _mf.shuffle_part(v["order"], lo, hi, seed)        # this worker's part, in place
    mf_epoch(v["P"], v["Q"], v["bu"], v["bi"], users, items, ratings, v["order"], lo, hi, lr,
             reg, reg_bias, mu, fit_bias, out)
    return out


def mf_epoch(*args):
    """One worker's slice of a matrix-factorization epoch (replaceable in tests)."""
    from sgd_shm import _mf
    _mf.mf_run(*args)


class MFPool:
    """Matrix factorization's worker processes: the factor matrices, biases and
    the order of the ratings live in the shared segment for one fit (each worker
    reshuffles its own part every epoch); the ratings are inherited by fork.
    ``close`` copies the factors back to the estimator."""

    def __init__(self, est, users, items, ratings, n_workers, order):
        arrays = {"P": (est.user_factors_.shape, np.float64),
                  "Q": (est.item_factors_.shape, np.float64),
                  "bu": (est.user_bias_.shape, np.float64),
                  "bi": (est.item_bias_.shape, np.float64),
                  "order": ((users.shape[0],), np.int64)}
        self.pool = SharedWorkers(arrays, _mf_step, (users, items, ratings))
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
