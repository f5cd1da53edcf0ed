"""The simulator's models of the machines and of the network between them.

:class:`Cluster`: how long a worker's step (or a rank's gradient) takes in virtual
time. A step of worker k takes ``step_s * factor_k`` seconds, times a transient slow
spell's factor while one lasts, plus a random delay of its own and, for eager-SGD
rounds, the imbalance sleep of the ranks drawn for that round. The parts are the
trainers' straggler emulation, in virtual time:

* ``factors``: per-worker stretch (>= 1): a sequence, a dict {worker: factor}, a
  profile of ``ps.train``'s ``slowdown`` ("straggler": worker 0 at 4x, "hetero":
  worker k at 4 ** (1 - k / (n - 1)), "none"), or ``classes``: a heterogeneous
  cluster as [(fraction, factor), ...] (e.g. ``[(0.75, 1.0), (0.25, 4.0)]``: the
  last quarter of the workers 4x slower);
* ``transient``: (spells per second, factor, seconds): a Poisson process of slow
  spells per worker, as ``ps.train(transient=...)``;
* ``delay``: ("exponential", mean) or ("pareto", mean, shape): a random delay added
  to each step, as ``eager.train(delay=...)``;
* ``imbalance``: (k, seconds): eager-SGD's load imbalance, k ranks drawn per round
  from the run's seed (:func:`sgd_shm.core.imbalance.sleepers`, the same draw) sleep
  that long;
* ``trace``: per-worker step durations recorded from a real run, replayed in order
  (cycled when the simulation needs more steps than the trace holds) instead of
  ``step_s * factor``;
* ``compress_s``: seconds a worker spends compressing one message, added to its step
  when the run compresses (the simulator computes the real messages, but their cost
  on the cluster's machines is a setting, e.g. measured on one of them);
* ``wake_s``: seconds a parameter-server worker waiting at a closed gate (BSP, SSP)
  takes to notice that it opened (the real workers look at their gate every
  ``poll_s`` and sleep in between);
* ``gate_s``: seconds a parameter-server step costs beyond its work under a policy
  with a gate (BSP, SSP), even when the gate is open: what the box the simulator is
  calibrated on spends per gated step (its workers' polling and sleeping, the
  processes' hand-offs) that a free-running ASP step does not, charged before the
  step's push (so it lengthens a round without changing which step gets a core
  first); on a cluster, 0;
* ``cores``: the cores the parameter server's workers share (None: each its own, as
  on a cluster): ceil(cores) servers, each cores / ceil(cores) as fast, run the
  workers' computing first come, first served and to completion (a step's computing
  is far shorter than an operating system's time slice). A step waiting for a core is
  stretched by its wait, its sleeping part (a slowed worker's emulation, a multiple of
  the time its computing took) alike: the one box the simulator is calibrated on runs
  more workers than cores;
* ``start_s``: seconds from the run's start (its clock's zero) to the workers' first
  steps: what a real trainer spends starting its workers and touching its buffers
  before the first minibatch (on a cluster: its launcher's start-up; 0 by default).

:class:`Network`: every message between two machines takes ``latency + bytes /
bandwidth`` seconds. The parameter server is a star: workers talk to the
``n_shards`` servers, whose links together carry ``n_shards * bandwidth`` bytes per
second in each direction and serialise the messages (first come, first served), so
many workers saturate them. Allreduce runs on a ring (2 (P - 1) steps of latency +
n / (P bandwidth)) or a binomial tree (2 ceil(log2 P) steps of latency + n /
bandwidth); an allgather of compressed messages on a ring moves every payload past
every rank ((P - 1) latency + the payloads' bytes / bandwidth) and on a tree takes
ceil(log2 P) latencies plus the same bytes.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields

import numpy as np

from sgd_shm.core.imbalance import (delay_of, draw_delay, factor_items, factors_of,
                                    imbalance_of, transient_of)
from sgd_shm.core.validation import check_number, check_positive

__all__ = ["Cluster", "Network", "TOPOLOGIES"]

TOPOLOGIES = ("ring", "tree")


@dataclass(frozen=True, eq=False)
class Cluster:
    """Cluster(step_s=1e-3, *, factors=None, classes=None, transient=None, delay=None,
    imbalance=None, trace=None, compress_s=0.0, wake_s=0.0, gate_s=0.0, cores=None,
    start_s=0.0): the
    compute-time model (see the module notes).

    ``step_s``: seconds of one step (one minibatch's pull, gradient and push on the
    parameter server; one rank's gradient in eager-SGD) of a worker at factor 1."""

    step_s: float = 1e-3
    factors: object = None
    classes: object = None
    transient: tuple | None = None
    delay: tuple | None = None
    imbalance: tuple | None = None
    trace: object = None
    compress_s: float = 0.0
    wake_s: float = 0.0
    cores: float | None = None
    gate_s: float = 0.0
    start_s: float = 0.0

    def __post_init__(self):
        if self.cores is not None:
            check_positive("cores", self.cores)
        check_positive("step_s", self.step_s)
        check_number("compress_s", self.compress_s, lo=0)
        check_number("wake_s", self.wake_s, lo=0)
        check_number("gate_s", self.gate_s, lo=0)
        check_number("start_s", self.start_s, lo=0)
        if self.factors is not None and self.classes is not None:
            raise ValueError("classes: give factors or classes, not both")
        if self.factors is not None:
            self._check_factors()
        if self.classes is not None:
            self._classes()
        object.__setattr__(self, "delay", delay_of(self.delay))
        if self.transient is not None:
            object.__setattr__(self, "transient", transient_of(self.transient))
        if self.imbalance is not None:
            object.__setattr__(self, "imbalance", imbalance_of(self.imbalance))
        if self.trace is not None:
            try:
                tr = [np.array(t, np.float64).ravel() for t in self.trace]     # (copies)
            except (TypeError, ValueError):
                tr = []                 # not numbers: refused below, naming trace
            if not tr or any(t.size == 0 or not np.isfinite(t).all() or (t < 0).any()
                             for t in tr) or _holds_bool(self.trace):
                raise ValueError("trace: expected one non-empty sequence of step seconds "
                                 "(finite, >= 0, not bools) per worker")
            for t in tr:
                t.flags.writeable = False          # (a frozen cluster: its times too)
            object.__setattr__(self, "trace", tuple(tr))

    def _check_factors(self):
        """The factors, checked now (not first when a run uses them): as many workers
        as they name (a profile: any)."""
        f = self.factors
        if isinstance(f, str):
            n = 1
        elif isinstance(f, dict):               # (no vector as long as the largest id)
            factor_items(f, "factors")
            return
        else:
            try:
                n = len(f)
            except TypeError:
                n = 1
        factors_of(f, n, name="factors")

    def _key(self):
        """The fields as hashable values (arrays and lists as tuples, dicts as sorted
        items): equality and hashing by value."""
        def frozen(v):
            if isinstance(v, np.ndarray):
                return ("array", v.shape, tuple(v.ravel().tolist()))
            if isinstance(v, dict):
                return ("dict", tuple(sorted((frozen(k), frozen(x)) for k, x in v.items())))
            if isinstance(v, (list, tuple)):
                return (type(v).__name__, tuple(frozen(x) for x in v))
            return v
        return tuple(frozen(getattr(self, f.name)) for f in fields(self))

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def _classes(self):
        try:
            if _holds_bool(self.classes):
                raise TypeError
            cl = [(float(f), float(x)) for f, x in self.classes]
        except (TypeError, ValueError):
            raise ValueError(f"classes: expected [(fraction, factor), ...], got "
                             f"{self.classes!r}") from None
        if not cl or any(not (0 < f <= 1) or not (x >= 1 and math.isfinite(x)) for f, x in cl) \
                or abs(sum(f for f, _ in cl) - 1.0) > 1e-9:
            raise ValueError(f"classes: fractions in (0, 1] that add up to 1 and factors >= 1, "
                             f"got {self.classes!r}; e.g. [(0.75, 1.0), (0.25, 4.0)]")
        return cl

    def worker_factors(self, n_workers) -> np.ndarray:
        """The per-worker stretch of a run of ``n_workers``."""
        if self.classes is not None:
            cl = self._classes()
            cuts = np.rint(np.cumsum([f for f, _ in cl]) * n_workers).astype(np.int64)
            out = np.ones(n_workers)
            lo = 0
            for (_, x), hi in zip(cl, cuts):
                out[lo:hi] = x
                lo = hi
            return out
        return factors_of(self.factors, n_workers, name="factors")

    def check_workers(self, n_workers):
        """Raise when the trace does not hold one sequence per worker, or the imbalance
        puts more ranks to sleep than the run has (as eager.train refuses)."""
        if self.trace is not None and len(self.trace) != n_workers:
            raise ValueError(f"trace: holds {len(self.trace)} workers' step times, the run "
                             f"has n_workers={n_workers}; record a run of as many workers")
        if self.imbalance is not None:
            imbalance_of(self.imbalance, n_workers)
        self.worker_factors(n_workers)


class StepTimes:
    """The step durations of one run's workers, drawn in virtual time: worker k's
    draws come from its own generator (seeded from the run's seed and k), so one
    worker's times do not depend on how many steps the others took."""

    def __init__(self, cluster: Cluster, n_workers, seed):
        self.c = cluster
        self.factors = cluster.worker_factors(n_workers)
        self.base = cluster.step_s * self.factors
        self.rngs = [np.random.default_rng([int(seed), k, 0x51]) for k in range(n_workers)]
        self.steps = np.zeros(n_workers, np.int64)
        tr = cluster.transient
        self.spell_until = np.full(n_workers, -1.0)
        self.spell_next = np.full(n_workers, math.inf)
        if tr is not None:
            self.spell_next = np.array([g.exponential(1.0 / tr[0]) for g in self.rngs])
        self.spells = np.zeros(n_workers, np.int64)
        self.simple = tr is None and cluster.delay is None and cluster.trace is None

    def of(self, k, now):
        """Seconds of worker k's next step, begun at virtual time ``now``."""
        if self.simple:
            return self.base[k]
        c = self.c
        i = self.steps[k]
        self.steps[k] += 1
        if c.trace is not None:
            t = c.trace[k]
            s = float(t[i % t.size])
        else:
            s = self.base[k]
        if c.transient is not None:
            rate, factor, length = c.transient
            if now >= self.spell_next[k]:
                self.spell_until[k] = now + length
                self.spell_next[k] = self.spell_until[k] + self.rngs[k].exponential(1.0 / rate)
                self.spells[k] += 1
            if now < self.spell_until[k]:
                s *= factor
        if c.delay is not None:
            s += draw_delay(c.delay, self.rngs[k])
        return s


def _holds_bool(seq):
    """Whether a sequence (of sequences) holds a bool: numpy would take it as 1."""
    if isinstance(seq, (bool, np.bool_)):
        return True
    if isinstance(seq, np.ndarray):
        return seq.dtype.kind == "b"
    if isinstance(seq, (list, tuple)):
        return any(_holds_bool(x) for x in seq)
    return False


@dataclass(frozen=True)
class Network:
    """Network(latency=0.0, bandwidth=inf, topology="ring"): every message takes
    ``latency`` seconds plus its bytes over ``bandwidth`` (bytes per second); the
    parameter server's links are shared (see the module notes); ``topology``: the
    allreduce's, "ring" or "tree". :meth:`gbps` builds one from Gb/s."""

    latency: float = 0.0
    bandwidth: float = math.inf
    topology: str = "ring"

    def __post_init__(self):
        check_number("latency", self.latency, lo=0)
        if not (isinstance(self.bandwidth, numbers.Real)
                and not isinstance(self.bandwidth, (bool, np.bool_)) and self.bandwidth > 0):
            raise ValueError(f"bandwidth: must be a number of bytes per second > 0 (inf: "
                             f"free), got {self.bandwidth!r}")
        object.__setattr__(self, "bandwidth", float(self.bandwidth))
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"topology: must be one of {TOPOLOGIES}, got {self.topology!r}")

    @classmethod
    def gbps(cls, gbits, latency=5e-6, topology="ring"):
        """A network of ``gbits`` Gb/s links (``gbits * 1e9 / 8`` bytes per second)."""
        return cls(latency, check_positive("gbits", gbits) * 1e9 / 8, topology)

    def message(self, nbytes) -> float:
        """Seconds of one message of ``nbytes`` on one link."""
        return self.latency + nbytes / self.bandwidth

    def allreduce(self, nbytes, P) -> float:
        """Seconds of an allreduce of ``nbytes`` per rank among P ranks."""
        if P <= 1:
            return 0.0
        if self.topology == "ring":
            return 2 * (P - 1) * (self.latency + nbytes / (P * self.bandwidth))
        return 2 * math.ceil(math.log2(P)) * (self.latency + nbytes / self.bandwidth)

    def allgather(self, total_bytes, P) -> float:
        """Seconds of an allgather whose payloads add up to ``total_bytes``."""
        if P <= 1:
            return 0.0
        steps = P - 1 if self.topology == "ring" else math.ceil(math.log2(P))
        return steps * self.latency + total_bytes / self.bandwidth
