"""Calibration: the simulator's compute model fitted to a short real run on this box.

:func:`calibrate` runs the real trainer briefly and fits the :class:`Cluster` that
makes the simulator reproduce its throughput:

* parameter server: an asynchronous run (``ps.train(policy="asp")``, the gate never
  closes, so every worker steps back to back): worker k's step took ``seconds /
  pushes_k`` of wall time, which is ``step_s * factor_k``; ``step_s`` is the median
  over the workers of ``seconds / (pushes_k * factor_k)``. It holds everything a step
  costs on this box (pull, gradient, push, the shard locks, the other processes on the
  same cores), so the network model is left free.
* collectives: a synchronous run (``eager.train(collective="sync")``) without
  imbalance: a round took ``seconds / rounds``, the slowest rank's step plus the
  allreduce plus rank 0's samples; ``step_s`` is that (the imbalance of the runs to
  predict is then added by the simulator, as the trainer adds it by sleeping).

``Calibration.simulate(X, y, **kw)`` runs the simulator with the fitted cluster (and
the run's sampling period, so times to a target are read at the same granularity).

Example::

    cal = calibrate(X, y, n_workers=4, seconds=1.0)             # a real ASP run
    sim = cal.simulate(X, y, policy="bsp", slowdown="straggler", max_seconds=3.0,
                       eval_set=(Xv, yv))
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sgd_shm.core.validation import check_positive, resolve_workers
from sgd_shm.sim.cluster import Cluster, Network
from sgd_shm.sim.simulate import simulate

__all__ = ["calibrate", "Calibration"]

#: the trainers' sampling periods (``sample_every``), which the predictions reuse
PS_SAMPLE_EVERY, EAGER_SAMPLE_EVERY = 0.02, 0.05


@dataclass
class Calibration:
    """A fitted compute model: ``step_s`` (seconds of a step at factor 1 on this box),
    the ``kind`` of run it was fitted on ("ps" or "collective"), ``n_workers``, and
    what was measured (``measured``: the real run's seconds, updates or rounds and
    per-worker step seconds)."""
    kind: str
    n_workers: int
    step_s: float
    measured: dict = field(default_factory=dict)

    def cluster(self, slowdown=None, imbalance=None) -> Cluster:
        """The cluster of the fitted step with the trainers' ``slowdown`` (parameter
        server) or ``imbalance`` (collectives)."""
        return Cluster(self.step_s, factors=slowdown, imbalance=imbalance)

    def simulate(self, X, y, *, slowdown=None, imbalance=None, **kw):
        """:func:`sgd_shm.sim.simulate` with this cluster, a free network, this many
        workers and the trainer's sampling period (unless given)."""
        kw.setdefault("n_workers", self.n_workers)
        kw.setdefault("sample_every", PS_SAMPLE_EVERY if kw.get("collective") is None
                      else EAGER_SAMPLE_EVERY)
        return simulate(X, y, cluster=self.cluster(slowdown, imbalance), network=Network(),
                        **kw)


def calibrate(X, y, *, n_workers, collective=False, seconds=1.0, seed=0, slowdown=None,
              **train_kw) -> Calibration:
    """Fit the compute model to a real run of ``seconds`` on this box (see the module
    notes): the parameter server's ASP (``collective=False``, with ``slowdown`` as
    ``ps.train`` takes it) or eager-SGD's synchronous allreduce (``collective=True``).
    ``train_kw`` go to the trainer (``lr``, ``batch_size``, ``model``, ...)."""
    n_workers = resolve_workers(n_workers)
    seconds = check_positive("seconds", seconds)
    if collective:
        if slowdown is not None:
            raise ValueError("slowdown: a parameter-server setting; the collectives' runs "
                             "take imbalance= in their predictions instead")
        from sgd_shm.eager import train as eager_train
        r = eager_train(X, y, n_workers=n_workers, collective="sync", max_seconds=seconds,
                        seed=seed, progress=False, **train_kw)
        step = r.seconds / max(r.rounds, 1)
        return Calibration("collective", n_workers, step,
                           {"seconds": r.seconds, "rounds": r.rounds, "round_s": step})
    from sgd_shm.ps import train as ps_train
    from sgd_shm.ps.config import factors_of
    r = ps_train(X, y, n_workers=n_workers, policy="asp", max_seconds=seconds, seed=seed,
                 slowdown=slowdown, progress=False, **train_kw)
    factors = factors_of(slowdown, n_workers)
    pushes = np.array([max(w["pushes"], 1) for w in r.workers], np.float64)
    per = r.seconds / pushes
    step = float(np.median(per / factors))
    return Calibration("ps", n_workers, step,
                       {"seconds": r.seconds, "updates": r.updates,
                        "step_s_per_worker": per.tolist()})
