"""Calibration: the simulator's compute model fitted to short real runs on this box.

:func:`calibrate` runs the real trainer briefly and fits the :class:`Cluster` that
makes the simulator reproduce it:

Every rate is read off a run's history by :func:`line_fit`: the robust (Theil-Sen) line
through its records' (updates, seconds), whose slope is a step of the run and whose
intercept, ``start_s``, the run's start-up before its steady stepping (starting the
workers, first touches of the buffers), which a short run to a target pays in full.

* parameter server: two asynchronous runs (``ps.train(policy="asp")``: the gate
  never closes, so every worker steps back to back), one of a single worker, whose
  step is ``step_s``, a step with a core of its own; and one of ``n_workers`` with
  the ``slowdown`` of the runs to predict (its intercept is ``start_s``; worker k's
  step is the run's seconds per update over k's share of the pushes). There the
  full-speed workers' steps are longer by a stretch s: the workers computing at once
  (on average the sum of 1 / factor_k) share the box's ``cores`` = that sum / s
  (fewer than the box's own when other jobs run; None when s <= 1). A slowed worker's
  step is longer than ``factor * s * step_s`` by what its emulation's sleep overran (a
  process that sleeps waits for a core to wake on): ``slow_extra_s``, the mean
  overrun, is added to every slowed step of the predictions. ``wake_s``: how long a
  worker waiting at a closed gate (BSP, SSP) takes to notice it opened: half the
  transport's polling period plus the mean time a sleep of that period overran,
  measured on the calibrating machine. ``gate_s``: a third run, synchronous
  (``policy="bsp"``, the same slowdown), and the same run simulated with the model
  fitted so far: the real round's excess over the simulated one is what a step under
  a gated policy costs on this box beyond its work (polling, sleeping and waking
  processes), charged to every BSP and SSP step. ``step_s`` holds everything a step
  costs there (pull, gradient, push, shard locks, the other processes on the same
  cores), so the network model is left free.
* collectives: a synchronous run (``eager.train(collective="sync")``) without
  imbalance gives the round, ``step_s``: the slowest rank's step plus the allreduce
  plus rank 0's samples, and ``start_s``; with ``imbalance`` given, a second
  synchronous run with it gives what the sleeps cost a round beyond their nominal
  seconds (``sleep_extra_s``), added to the predictions' imbalance.

``Calibration.simulate(X, y, **kw)`` runs the simulator with the fitted cluster (and
the trainer's sampling period, so times to a target are read at the same
granularity).

Example::

    cal = calibrate(X, y, n_workers=4, seconds=1.0, slowdown="straggler")
    sim = cal.simulate(X, y, policy="bsp", slowdown="straggler", max_seconds=3.0,
                       eval_set=(Xv, yv))
"""
from __future__ import annotations

import statistics
import time
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
    ``slow_extra_s`` (what a slowed step overran its factor), ``wake_s`` (a gate's
    wake-up), ``gate_s`` (what a gated policy's step costs beyond its work),
    ``sleep_extra_s`` (what an imbalance sleep overran, a round), ``start_s`` (the
    run's start-up before its first step), the
    ``kind`` of run it was fitted on ("ps" or "collective"), ``n_workers``, and what
    was measured (``measured``)."""
    kind: str
    n_workers: int
    step_s: float
    slow_extra_s: float = 0.0
    wake_s: float = 0.0
    sleep_extra_s: float = 0.0
    cores: float | None = None
    gate_s: float = 0.0
    start_s: float = 0.0
    measured: dict = field(default_factory=dict)

    def cluster(self, slowdown=None, imbalance=None) -> Cluster:
        """The cluster of the fitted step with the trainers' ``slowdown`` (parameter
        server) or ``imbalance`` (collectives), their overruns added."""
        from sgd_shm.ps.config import factors_of
        f = factors_of(slowdown, self.n_workers)
        f = np.where(f > 1, f + self.slow_extra_s / self.step_s, 1.0)
        if imbalance is not None:
            imbalance = (imbalance[0], imbalance[1] + self.sleep_extra_s)
        return Cluster(self.step_s, factors=f, imbalance=imbalance, wake_s=self.wake_s,
                       gate_s=self.gate_s, cores=self.cores, start_s=self.start_s)

    def simulate(self, X, y, *, slowdown=None, imbalance=None, **kw):
        """:func:`sgd_shm.sim.simulate` with this cluster, a free network, this many
        workers and the trainer's sampling period (unless given)."""
        kw.setdefault("n_workers", self.n_workers)
        kw.setdefault("sample_every", PS_SAMPLE_EVERY if kw.get("collective") is None
                      else EAGER_SAMPLE_EVERY)
        return simulate(X, y, cluster=self.cluster(slowdown, imbalance), network=Network(),
                        **kw)


def sleep_overrun(seconds, n=50):
    """The mean seconds by which ``time.sleep(seconds)`` overran, over n sleeps, now."""
    over = []
    for _ in range(n):
        t = time.perf_counter()
        time.sleep(seconds)
        over.append(time.perf_counter() - t - seconds)
    return statistics.fmean(over)


def calibrate(X, y, *, n_workers, collective=False, seconds=1.0, seed=0, slowdown=None,
              imbalance=None, **train_kw) -> Calibration:
    """Fit the compute model to real runs of ``seconds`` on this box (see the module
    notes): the parameter server's ASP (``collective=False``, with ``slowdown`` as
    ``ps.train`` takes it) or eager-SGD's synchronous allreduce (``collective=True``,
    with ``imbalance`` as ``eager.train`` takes it). ``train_kw`` go to the trainer
    (``lr``, ``batch_size``, ``model``, ``eval_set``, ...)."""
    n_workers = resolve_workers(n_workers)
    seconds = check_positive("seconds", seconds)
    if collective:
        if slowdown is not None:
            raise ValueError("slowdown: a parameter-server setting; the collectives' runs "
                             "take imbalance= instead")
        return _calibrate_eager(X, y, n_workers, seconds, seed, imbalance, train_kw)
    if imbalance is not None:
        raise ValueError("imbalance: a collectives' setting; the parameter server's runs "
                         "take slowdown= instead")
    return _calibrate_ps(X, y, n_workers, seconds, seed, slowdown, train_kw)


def line_fit(history):
    """(start, seconds per step) of a run: the robust (Theil-Sen) line through its
    records' (step, seconds) once steps are being applied. The intercept is the run's
    start-up (its clock's zero to where its steady stepping begins); the slope, a step
    of the whole run (its transient stalls, which a mean over the run would spread over
    every step, weigh as little as one record each)."""
    from scipy.stats import theilslopes
    pts = [(h["step"], h["seconds"]) for h in history if h["step"] > 0]
    if len(pts) < 3:
        raise ValueError(f"seconds: the calibration's run recorded {len(pts)} samples with "
                         f"steps, at least 3 are needed; give it longer")
    steps, secs = np.array(pts, np.float64).T
    slope, icpt, _, _ = theilslopes(secs, steps)
    return max(float(icpt), 0.0), float(slope)


def _calibrate_ps(X, y, n_workers, seconds, seed, slowdown, train_kw):
    from sgd_shm.ps import train as ps_train
    from sgd_shm.ps.config import factors_of
    from sgd_shm.ps.shm_backend import ShmLink

    def asp(n, slow):
        r = ps_train(X, y, n_workers=n, policy="asp", max_seconds=seconds, seed=seed,
                     slowdown=slow, progress=False, **train_kw)
        start, per_update = line_fit(r.history)
        pushes = np.array([max(w["pushes"], 1) for w in r.workers], np.float64)
        share = pushes / pushes.sum()            # worker k's share of the updates
        return per_update / share, start, r
    alone, start, _ = asp(1, None)               # one worker: a step with a core of its own
    base = float(alone[0])
    per, start_n, r = asp(n_workers, slowdown)
    factors = factors_of(slowdown, n_workers)
    full = factors == 1
    stretch = float(np.median(per[full] if full.any() else per / factors)) / base
    cores = None
    if stretch > 1.0:                            # the workers shared fewer cores than them
        cores = float(np.sum(1.0 / factors)) / stretch
    slow = ~full
    extra = float(np.mean(per[slow] - factors[slow] * base * max(stretch, 1.0))) \
        if slow.any() else 0.0
    poll = ShmLink.poll_s
    wake = poll / 2 + max(sleep_overrun(poll), 0.0)
    cal = Calibration("ps", n_workers, base, max(extra, 0.0) / max(stretch, 1.0), wake,
                      cores=cores, start_s=start_n,
                      measured={"seconds": r.seconds, "updates": r.updates, "step_s_alone": base,
                                "start_s_alone": start, "stretch": stretch,
                                "step_s_per_worker": per.tolist()})
    cal.gate_s = _fit_gate(X, y, cal, seconds, seed, slowdown, train_kw)
    return cal


def _fit_gate(X, y, cal, seconds, seed, slowdown, train_kw):
    """``gate_s``: a real synchronous run (BSP) against the same run simulated with the
    model fitted so far; the real round's excess over the simulated one (a round of BSP
    is one gated step of its slowest worker, so each step of a gated policy is charged
    that much). Both rounds are the slopes of :func:`line_fit` (times the workers)."""
    import inspect

    from sgd_shm.ps import train as ps_train
    kw = dict(policy="bsp", max_seconds=seconds, seed=seed, slowdown=slowdown, **train_kw)
    real = ps_train(X, y, n_workers=cal.n_workers, progress=False, **kw)
    takes = inspect.signature(simulate).parameters       # (not the trainer's backend, ...)
    sim = cal.simulate(X, y, **{k: v for k, v in kw.items() if k in takes or k == "slowdown"})
    P = cal.n_workers
    real_round = P * line_fit(real.history)[1]
    sim_round = P * line_fit(sim.history)[1]
    cal.measured.update(bsp_round_s=real_round, bsp_round_s_simulated=sim_round)
    return max(real_round - sim_round, 0.0)


def _calibrate_eager(X, y, n_workers, seconds, seed, imbalance, train_kw):
    from sgd_shm.eager import train as eager_train

    def round_s(imb):
        r = eager_train(X, y, n_workers=n_workers, collective="sync", max_seconds=seconds,
                        seed=seed, progress=False, imbalance=imb, **train_kw)
        start, per_round = line_fit(r.history)
        return per_round, start, r
    step, start, r = round_s(None)
    measured = {"seconds": r.seconds, "rounds": r.rounds, "round_s": step}
    extra = 0.0
    if imbalance is not None and imbalance[0] > 0 and imbalance[1] > 0:
        slept, start_imb, r2 = round_s(imbalance)
        extra = max(slept - step - imbalance[1], 0.0)
        measured.update(round_s_imbalanced=slept, rounds_imbalanced=r2.rounds,
                        start_s_imbalanced=start_imb)
    return Calibration("collective", n_workers, step, sleep_extra_s=extra, start_s=start,
                       measured=measured)
