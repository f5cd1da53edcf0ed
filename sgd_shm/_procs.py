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

from relaxed.shm import Segment
from sgd_shm import _kernels as K

_ALIGN = 64
_NO_LOCK = np.zeros(16, dtype=np.int64)     # the processes backend never locks


def _layout(shapes):
    offsets, pos = [], 0
    for shape, dtype in shapes:
        offsets.append(pos)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        pos += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN + _ALIGN    # a line of padding
    return offsets, max(pos, 64)


def worker_epoch(W, b, q, V, prob, order, lo, hi, fp, ip, out, progress, wid, scale_tab, eta_tab,
                 cum_eta, clock, hist):
    """One worker's slice of an epoch (a module function so tests can replace it)."""
    K._run(W, b, q, V, prob.cols_all, prob.indptr, prob.indices, prob.data, prob.X, prob.Y,
           prob.sw, order, lo, hi, fp, ip, out, _NO_LOCK, progress, wid, scale_tab, eta_tab,
           cum_eta, clock, hist)


def _worker_main(conn, wid, W, b, q, V, order, progress, scale_tab, eta_tab, cum_eta, clock, hists,
                 prob, ip):
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                return
            _, lo, hi, fp, L = msg               # L: global steps in this segment
            out = np.zeros(K.N_OUT)
            worker_epoch(W, b, q, V, prob, order, lo, hi, fp, ip, out, progress, wid,
                         scale_tab[:L + 1], eta_tab[:L], cum_eta[:L + 1], clock,
                         hists[wid, :hists.shape[1] - 16])
            conn.send(("ok", out))
    except (EOFError, KeyboardInterrupt):
        return
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except Exception:
            pass


class WorkerError(RuntimeError):
    """A Hogwild worker process raised or died."""


class ProcessPool:
    def __init__(self, sgd, prob, n_workers):
        k, d = sgd.W.shape
        n = prob.n_samples
        shapes = [((k, d), np.float64), ((k,), np.float64), (sgd.q.shape, np.float64),
                  (sgd.V.shape, np.float64),
                  ((n,), np.int64), ((16 * n_workers,), np.int64), ((n + 1,), np.float64),
                  ((n,), np.float64), ((n + 1,), np.float64), ((16,), np.int64),
                  ((n_workers, sgd.staleness.shape[0] + 16), np.int64)]
        offsets, size = _layout(shapes)
        self.seg = Segment.create(size, shared=True)
        self.sgd = sgd
        self.procs, self.conns = [], []
        try:
            views = [np.ndarray(shape, dtype=dt, buffer=self.seg.buf, offset=off)
                     for (shape, dt), off in zip(shapes, offsets)]
            (self.W, self.b, self.q, self.V, self.order, self.progress, self.scale_tab, self.eta_tab,
             self.cum_eta, self.clock, self.hists) = views
            self.W[...] = sgd.W
            self.b[...] = sgd.b
            self.q[...] = sgd.q
            self.V[...] = sgd.V
            self._private = (sgd.W, sgd.b, sgd.q, sgd.V)
            sgd.W, sgd.b, sgd.q, sgd.V = self.W, self.b, self.q, self.V
            ctx = mp.get_context("fork")
            for _ in range(n_workers):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_worker_main,
                                args=(child, len(self.procs), self.W, self.b, self.q, self.V,
                                      self.order,
                                      self.progress, self.scale_tab, self.eta_tab, self.cum_eta,
                                      self.clock, self.hists, prob, sgd.ip),
                                daemon=True)
                p.start()
                child.close()
                self.procs.append(p)
                self.conns.append(parent)
        except BaseException:
            self.close()
            raise

    def run_epoch(self, order, lo, hi, fp, outs, scale_tab, eta_tab, cum_eta, hists):
        """Run one segment: worker w does positions [lo[w], hi[w]) of ``order``."""
        L = eta_tab.shape[0]
        self.order[...] = order
        self.scale_tab[:L + 1] = scale_tab
        self.eta_tab[:L] = eta_tab
        self.cum_eta[:L + 1] = cum_eta
        self.progress[...] = 0
        self.hists[...] = 0
        for w, conn in enumerate(self.conns):
            conn.send(("epoch", int(lo[w]), int(hi[w]), fp, L))
        errors = []
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
                    outs[w] = payload
                else:
                    errors.append(f"worker {w} raised:\n{payload}")
        hists += self.hists[:, :hists.shape[1]]
        if errors:
            raise WorkerError("Hogwild worker failure; training stopped and shared memory "
                              "released.\n" + "\n".join(errors))

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
        if hasattr(self, "_private"):
            W, b, q, V = self._private
            W[...] = self.W
            b[...] = self.b
            q[...] = self.q
            V[...] = self.V
            self.sgd.W, self.sgd.b, self.sgd.q, self.sgd.V = W, b, q, V
            del self._private
        self.W = self.b = self.q = self.V = self.order = None
        self.progress = self.scale_tab = self.eta_tab = self.cum_eta = None
        self.clock = self.hists = None
        self.seg.close()
