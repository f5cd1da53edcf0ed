"""Calibration: the simulator's compute model fitted to short real runs on this box.

:func:`calibrate` runs the real trainer briefly and fits the
:class:`~sgd_shm.sim.Cluster` that makes the simulator reproduce it. It sits above
both the trainers and the simulator (it runs the one to fit the other), so the
simulator itself imports no trainer; ``sgd_shm.sim.calibrate`` and
``sgd_shm.sim.Calibration`` still resolve here, with a DeprecationWarning, for one
release.

* parameter server: two asynchronous runs (``ps.train(policy="asp")``: the gate
  never closes, so every worker steps back to back), one of a single worker, whose
  step is a step with a core of its own; and one of ``n_workers`` with
  the ``slowdown`` of the runs to predict (its start-up is ``start_s``; worker k's
  step is the run's seconds per update over k's share of the pushes). There the
  full-speed workers' steps are longer by a stretch s. The box's ``cores`` (its CPU
  count) serve the workers' computing first come, first served (:class:`Cluster`),
  which alone stretches a full-speed step by max(1, demand / cores) at the workers'
  demand (the sum of 1 / factor_k); the rest of s, ``contention`` (the workers
  slowing each other while they compute at once: caches, memory, the hypervisor), is
  charged to the step: ``step_s`` = the one-worker step times it. A slowed worker's
  step is longer than ``factor * s`` one-worker steps by what its emulation's sleep
  overran (a process that sleeps waits for a core to wake on): ``slow_extra_s``, the mean
  overrun, is added to every slowed step of the predictions. Where ``slowdown`` slows
  every worker, s is read off one more run of ``n_workers`` at full speed (the slowed
  steps hold the overrun, which would pass for contention). ``wake_s``: how long a
  worker waiting at a closed gate (BSP, SSP) takes to notice it opened: half the
  transport's polling period plus the mean time a sleep of that period overran,
  measured on the calibrating machine (the period is
  :data:`sgd_shm.core.policies.SHM_POLL_S`). ``gate_s``: a third run, synchronous
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

Every rate is read off a run's history by :func:`line_fit`: the slope of the robust
(Theil-Sen) line through its records' (updates, seconds); how late its first records
come against that rate is ``start_s``, the run's start-up before its workers step
(starting them, first touches of the buffers), which a short run to a target pays in
full. With ``repeats`` > 1 every calibrating run is made that many times, on successive
seeds, and each fitted quantity is the median over them: on a shared virtual machine a
run's speed moves from one run to the next.

``Calibration.simulate(X, y, **kw)`` runs the simulator with the fitted cluster (and
the trainer's sampling period, so times to a target are read at the same
granularity).

Example::

    from sgd_shm.calibrate import calibrate
    cal = calibrate(X, y, n_workers=4, seconds=1.0, slowdown="straggler")
    sim = cal.simulate(X, y, policy="bsp", slowdown="straggler", max_seconds=3.0,
                       eval_set=(Xv, yv))
"""
from __future__ import annotations

import inspect
import os
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from sgd_shm.core.imbalance import factors_of, imbalance_of
from sgd_shm.core.policies import SHM_POLL_S
from sgd_shm.core.validation import (check_int, check_number, check_positive, check_seed,
                                     resolve_workers)
from sgd_shm.eager import train as eager_train
from sgd_shm.ps import train as ps_train
from sgd_shm.sim.cluster import Cluster, Network
from sgd_shm.sim.simulate import simulate

__all__ = ["calibrate", "Calibration"]

#: the trainers' sampling periods (``sample_every``), which the predictions reuse
PS_SAMPLE_EVERY, EAGER_SAMPLE_EVERY = 0.02, 0.05


@dataclass
class Calibration:
    """A fitted compute model: ``step_s`` (seconds of a step at factor 1 on this box,
    with the calibrated workers' contention), ``cores`` (the cores they share),
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

    def __post_init__(self):
        if self.kind not in ("ps", "collective"):
            raise ValueError(f"kind: must be 'ps' or 'collective', got {self.kind!r}")
        self.n_workers = check_int("n_workers", self.n_workers, lo=1)
        self.step_s = check_positive("step_s", self.step_s)
        for name in ("slow_extra_s", "wake_s", "sleep_extra_s", "gate_s", "start_s"):
            setattr(self, name, check_number(name, getattr(self, name), lo=0))
        if self.cores is not None:
            self.cores = check_positive("cores", self.cores)

    def cluster(self, slowdown=None, imbalance=None, n_workers=None) -> Cluster:
        """The cluster of the fitted step with the trainers' ``slowdown`` (parameter
        server) or ``imbalance`` (collectives), their overruns added, for ``n_workers``
        (default: the calibration's; a simulation may scale beyond them)."""
        n = self.n_workers if n_workers is None else resolve_workers(n_workers)
        f = factors_of(slowdown, n)
        f = np.where(f > 1, f + self.slow_extra_s / self.step_s, 1.0)
        imbalance = imbalance_of(imbalance, n)
        if imbalance is not None:
            imbalance = (imbalance[0], imbalance[1] + self.sleep_extra_s)
        return Cluster(self.step_s, factors=f, imbalance=imbalance, wake_s=self.wake_s,
                       gate_s=self.gate_s, cores=self.cores, start_s=self.start_s)

    @classmethod
    def median(cls, cals) -> "Calibration":
        """One calibration from several of the same kind and workers (e.g. made at
        different times, between the runs they are to predict): each fitted quantity's
        median; ``cores`` the median of those that found shared cores (None when fewer
        than half did); ``measured`` holds each one's."""
        cals = list(cals)
        if not cals or any(not isinstance(c, Calibration) for c in cals):
            raise TypeError(f"cals: expected one or more Calibration objects, got {cals!r}")
        kinds = {(c.kind, c.n_workers) for c in cals}
        if len(kinds) != 1:
            raise ValueError(f"cals: every calibration must be of one kind and worker count, "
                             f"got {sorted(kinds)}; combine each group on its own")
        med = {f: _median([getattr(c, f) for c in cals])
               for f in ("step_s", "slow_extra_s", "wake_s", "sleep_extra_s", "gate_s",
                         "start_s")}
        shared = [c.cores for c in cals if c.cores is not None]
        cores = _median(shared) if 2 * len(shared) > len(cals) else None
        return cls(cals[0].kind, cals[0].n_workers, cores=cores,
                   measured={"combined": [c.measured for c in cals]}, **med)

    def simulate(self, X, y, *, slowdown=None, imbalance=None, **kw):
        """:func:`sgd_shm.sim.simulate` with this cluster, a free network, this many
        workers and the trainer's sampling period (unless given)."""
        kw.setdefault("n_workers", self.n_workers)
        kw.setdefault("sample_every", PS_SAMPLE_EVERY if kw.get("collective") is None
                      else EAGER_SAMPLE_EVERY)
        return simulate(X, y, cluster=self.cluster(slowdown, imbalance, kw["n_workers"]),
                        network=Network(), **kw)


def sleep_overrun(seconds, n=50):
    """The mean seconds by which ``time.sleep(seconds)`` overran, over n sleeps, now."""
    over = []
    for _ in range(n):
        t = time.perf_counter()
        time.sleep(seconds)
        over.append(time.perf_counter() - t - seconds)
    return statistics.fmean(over)


def calibrate(X, y, *, n_workers, collective=False, seconds=1.0, seed=0, slowdown=None,
              imbalance=None, repeats=1, **train_kw) -> Calibration:
    """Fit the compute model to real runs of ``seconds`` on this box (see the module
    notes): the parameter server's ASP (``collective=False``, with ``slowdown`` as
    ``ps.train`` takes it) or eager-SGD's synchronous allreduce (``collective=True``,
    with ``imbalance`` as ``eager.train`` takes it). ``repeats``: how many times each
    calibrating run is made (seeds ``seed``, ``seed + 1``, ...); each fitted quantity is
    the median over them, which a box whose speed moves from run to run needs.
    ``train_kw`` go to the trainer (``lr``, ``batch_size``, ``model``, ``eval_set``,
    ...)."""
    n_workers = resolve_workers(n_workers)
    seconds = check_positive("seconds", seconds)
    repeats = check_int("repeats", repeats, lo=1)
    seed = check_seed("seed", seed)
    if seed is None:                               # fresh entropy, as the trainers take it
        seed = int(np.random.SeedSequence().generate_state(1)[0])
    seeds = [seed + i for i in range(repeats)]
    if not isinstance(collective, (bool, np.bool_)):
        raise TypeError(f"collective: expected True (the collectives: the synchronous "
                        f"allreduce is calibrated, which fits every collective a simulation "
                        f"then runs) or False (the parameter server), got {collective!r}")
    if collective:
        if slowdown is not None:
            raise ValueError("slowdown: a parameter-server setting; the collectives' runs "
                             "take imbalance= instead")
        imbalance = imbalance_of(imbalance, n_workers)
        return _calibrate_eager(X, y, n_workers, seconds, seeds, imbalance, train_kw)
    if imbalance is not None:
        raise ValueError("imbalance: a collectives' setting; the parameter server's runs "
                         "take slowdown= instead")
    return _calibrate_ps(X, y, n_workers, seconds, seeds, slowdown, train_kw)


def line_fit(history, first=3):
    """(start, seconds per step) of a run. The step is the slope of the robust
    (Theil-Sen) line through its records' (step, seconds) once steps are being applied:
    a transient stall weighs as one record instead of being spread over every step.
    The start is how late the run's first ``first`` records with steps come against that
    step (the median of ``seconds - step * slope`` over them, at least 0): the start-up
    before the workers step (spawning, first touches), read where it happens rather
    than as the line's intercept, which a run whose speed drifts later would move."""
    from scipy.stats import theilslopes
    pts = [(h["step"], h["seconds"]) for h in history if h["step"] > 0]
    if len(pts) < 3:
        raise ValueError(f"seconds: the calibration's run recorded {len(pts)} samples with "
                         f"steps, at least 3 are needed; give it longer")
    steps, secs = np.array(pts, np.float64).T
    slope = float(theilslopes(secs, steps)[0])
    start = float(np.median(secs[:first] - steps[:first] * slope))
    return max(start, 0.0), slope


def _median(xs):
    return float(np.median(np.asarray(xs, np.float64)))


def _calibrate_ps(X, y, n_workers, seconds, seeds, slowdown, train_kw):
    def asp(n, slow, seed):
        r = ps_train(X, y, n_workers=n, policy="asp", max_seconds=seconds, seed=seed,
                     slowdown=slow, progress=False, **train_kw)
        start, per_update = line_fit(r.history)
        pushes = np.array([max(w["pushes"], 1) for w in r.workers], np.float64)
        share = pushes / pushes.sum()            # worker k's share of the updates
        return per_update / share, start, r
    # one worker: a step with a core of its own
    base = _median([asp(1, None, s)[0][0] for s in seeds])
    runs = [asp(n_workers, slowdown, s) for s in seeds]
    per = np.median(np.array([p for p, _, _ in runs]), axis=0)
    start = _median([st for _, st, _ in runs])
    factors = factors_of(slowdown, n_workers)
    full = factors == 1
    # the box's cores serve the workers' computing first come, first served (Cluster):
    # at the workers' demand (the sum of 1 / factor_k) they stretch a full-speed step
    # by max(1, demand / cores) by waiting alone; the rest of the measured stretch is
    # what the workers slow each other by while computing at once (caches, memory, the
    # hypervisor), charged to the step itself
    box = float(os.cpu_count() or 1)
    queued = max(1.0, float(np.sum(1.0 / factors)) / box)
    full_speed = {}
    if full.any():
        contention = float(np.median(per[full])) / base / queued
    elif n_workers == 1:            # the one-worker run is the worker at full speed
        contention = 1.0
    else:
        # every worker slowed: their steps hold the sleeps' overrun too, which would
        # pass for contention; it is read off a run of as many workers at full speed
        per_full = np.median(np.array([asp(n_workers, None, s)[0] for s in seeds]), axis=0)
        contention = float(np.median(per_full)) / base / max(1.0, n_workers / box)
        full_speed = {"step_s_per_worker_full_speed": per_full.tolist()}
    stretch = contention * queued
    step = base * contention
    slow = ~full
    extra = float(np.mean(per[slow] - factors[slow] * base * max(stretch, 1.0))) \
        if slow.any() else 0.0
    wake = SHM_POLL_S / 2 + max(sleep_overrun(SHM_POLL_S), 0.0)
    r = runs[-1][2]
    cal = Calibration("ps", n_workers, step, max(extra, 0.0) / max(stretch, 1.0), wake,
                      cores=box if n_workers > 1 else None, start_s=start,
                      measured={"seconds": r.seconds, "updates": r.updates, "step_s_alone": base,
                                "stretch": stretch, "contention": contention,
                                "step_s_per_worker": per.tolist(), "repeats": len(seeds),
                                **full_speed})
    cal.gate_s = _fit_gate(X, y, cal, seconds, seeds, slowdown, train_kw)
    return cal


def _fit_gate(X, y, cal, seconds, seeds, slowdown, train_kw):
    """``gate_s``: real synchronous runs (BSP) against the same run simulated with the
    model fitted so far; the real round's excess over the simulated one (a round of BSP
    is one gated step of its slowest worker, so each step of a gated policy is charged
    that much). Both rounds are the slopes of :func:`line_fit` (times the workers), the
    real one the median over the seeds."""
    P = cal.n_workers
    kw = dict(policy="bsp", max_seconds=seconds, slowdown=slowdown, **train_kw)
    real_round = _median([P * line_fit(ps_train(X, y, n_workers=P, progress=False, seed=s,
                                                **kw).history)[1] for s in seeds])
    takes = inspect.signature(simulate).parameters       # (not the trainer's backend, ...)
    sim = cal.simulate(X, y, seed=seeds[0],
                       **{k: v for k, v in kw.items() if k in takes or k == "slowdown"})
    sim_round = P * line_fit(sim.history)[1]
    cal.measured.update(bsp_round_s=real_round, bsp_round_s_simulated=sim_round)
    return max(real_round - sim_round, 0.0)


def _calibrate_eager(X, y, n_workers, seconds, seeds, imbalance, train_kw):
    def round_s(imb, seed):
        r = eager_train(X, y, n_workers=n_workers, collective="sync", max_seconds=seconds,
                        seed=seed, progress=False, imbalance=imb, **train_kw)
        start, per_round = line_fit(r.history)
        return per_round, start, r
    runs = [round_s(None, s) for s in seeds]
    step, start = _median([a for a, _, _ in runs]), _median([b for _, b, _ in runs])
    r = runs[-1][2]
    measured = {"seconds": r.seconds, "rounds": r.rounds, "round_s": step,
                "repeats": len(seeds)}
    extra = 0.0
    if imbalance is not None and imbalance[0] > 0 and imbalance[1] > 0:
        slept = _median([round_s(imbalance, s)[0] for s in seeds])
        extra = max(slept - step - imbalance[1], 0.0)
        measured.update(round_s_imbalanced=slept)
    return Calibration("collective", n_workers, step, sleep_extra_s=extra, start_s=start,
                       measured=measured)
