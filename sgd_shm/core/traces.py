"""The traces of traced runs: what a replay needs to make a real run's decisions again.

``ps.train(..., trace=True)`` returns a :class:`PSTrace` (every worker's pushes, the
coordinator's reads and status writes) and ``eager.train(..., trace=True)`` an
:class:`EagerTrace` (every rank's rounds). The trainers write them and the simulator
replays them (``sgd_shm.sim.simulate(replay=trace)``); both sides read the columns
declared here, so neither imports the other.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TRACE_INTS", "TRACE_FLOATS", "PSTrace", "ROUND_INTS", "ROUND_FLOATS",
           "EagerTrace"]

#: the integer columns of a traced push (``train(trace=True)``, :class:`sgd_shm.ps.worker.TraceBuffer`):
#: its minibatch (partition, batch); the version its pull read (``pulled``); the
#: version its staleness check read (``decided``, -1 for a policy that reads none) and
#: the worker's status flag then (``flagged``: 1 flagged, 0 not, -1 not read);
#: ``dropped`` (1: the policy dropped it); the global version the store read when the
#: push began (``read``: staleness = read - pulled) and the version once it was counted
#: (``applied``: its place in the order of pushes); both -1 when not pushed
TRACE_INTS = ("partition", "batch", "pulled", "decided", "flagged", "dropped", "read",
              "applied")
#: the float columns: ``time.perf_counter()`` before and after the pull (pull0, pull1),
#: the staleness check (decide0, decide1; nan without one) and the push (push0,
#: push1; for a dropped push, the report that counted it), and the push's ``scale``
TRACE_FLOATS = ("pull0", "pull1", "decide0", "decide1", "push0", "push1", "scale")


@dataclass
class PSTrace:
    """``TrainResult.trace`` of ``ps.train(..., trace=True)``: what a replay needs to
    make the real run's decisions again (``sgd_shm.sim.simulate(replay=trace)``).
    Times are seconds since the workers were released (the history's clock).

    * ``steps``: per worker, {column: array} of its pushes in order, applied or
      dropped (columns :data:`TRACE_INTS` and :data:`TRACE_FLOATS`).
    * ``reads``: the coordinator's reads of the counters (SaPS's samples), each
      (t0, t1, staleness sums, pushes tried) with the per-worker arrays it read.
    * ``status``: the coordinator's status writes, each (t0, t1, worker, status).
    * ``samples``: the times of the coordinator's samples (the history's, without
      the final record).
    * ``decided``: per worker, the pushes it decided (more than its rows when the
      trace was truncated: ``truncated`` is then True).
    """
    n_workers: int
    policy: str
    steps: list
    reads: list
    status: list
    samples: list
    decided: list
    truncated: bool = False

    def pushes(self):
        """The applied pushes in the order of their versions: (applied version,
        worker, partition, batch, pulled version, scale)."""
        out = []
        for k, st in enumerate(self.steps):
            for i in np.flatnonzero(st["applied"] >= 0):
                out.append((int(st["applied"][i]), k, int(st["partition"][i]),
                            int(st["batch"][i]), int(st["pulled"][i]), float(st["scale"][i])))
        return sorted(out)


#: the columns of a traced round of one rank (:class:`EagerTrace`): the round id;
#: ``skipped`` (1: its round had closed, it contributed nothing new); ``contributed``
#: (1: its contribution is in the round's result); ``mask`` (the round's contributors,
#: bit k for rank k); ``lag0``, ``lag1``: ``time.perf_counter()`` before and after its
#: look at the lag (``comm.lag()``, whether the round had closed); ``post0``, ``post1``:
#: before and after its round (start, arrival and wait), seconds since rank 0's start
ROUND_INTS = ("round", "skipped", "contributed", "mask")
ROUND_FLOATS = ("lag0", "lag1", "post0", "post1")


@dataclass
class EagerTrace:
    """``EagerResult.trace``: per rank (``ranks[k]``), {column: array} of its rounds in
    order (columns :data:`ROUND_INTS`, :data:`ROUND_FLOATS`), and the run's
    ``collective``, ``late``, ``average``, ``seed``, ``n_workers`` and ``momentum``."""
    n_workers: int
    collective: str
    late: str
    average: str
    seed: int
    ranks: list
    momentum: float = 0.0

    def contributors(self):
        """{round: the contributors (sorted tuple)}, as the ranks saw them."""
        out = {}
        for st in self.ranks:
            for r, m in zip(st["round"], st["mask"]):
                out[int(r)] = tuple(j for j in range(self.n_workers) if int(m) >> j & 1)
        return out
