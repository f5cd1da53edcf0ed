"""The parameter server's transport contract: what a worker's loop
(:mod:`sgd_shm.ps.worker`) asks of the server, as a :class:`Link` of five verbs.

A transport is a pair: a *link* (this protocol) that the worker loop calls, and a
*backend* (:class:`Backend`) that the coordinator drives (start, watch and kill the
workers, read their counters, stop, report). The server's state behind both is the
same code on every transport, :class:`sgd_shm.ps.server.ServerState` (the store's
slots, staleness histograms and versions, the partitions' queues, tickets and
exactly-once tally, the message counts): shared memory maps it into every worker
process, the threads transport shares it between threads, the Ray transport hosts it
in its hub actor. A transport only moves the verbs' arguments to that state (and, on
Ray, the weights to and from the shard actors).

The verbs (``k`` is the calling worker):

=================================  =====================================================
``state(k)``                       a :class:`RunState`: the stop flag, whether the
                                   coordinator lives, the global version, every
                                   worker's pushes and status, every partition's epoch
                                   and lag. The policies' gates and sources read it.
``exchange(k, push=None,           apply ``push`` (a :class:`Push`, dense or sparse,
pull=True)``                       with its scale, bytes and shard subset) and/or pull:
                                   returns (weights, version) when ``pull``; else
                                   the push's ``PushResult`` (the version it was
                                   applied at: traces) where the link knows it (shm,
                                   threads), None where it does not (Ray)
``take(k, sources, rng, claim)``   a minibatch (partition, key, batch) from the first of
                                   ``sources`` [(partition, refill limit)] that has
                                   one, after claiming a ticket of the work budget when
                                   ``claim``; None: no ticket is left
``report(k, counts=None, *,        add to k's slot counters (``counts``: {field: n},
applied=None, requeue=None,        fields ``staleness_sum``, ``dropped``, ``stolen``,
messages=None)``                   ``spells``, ``compute_ns``), record minibatch
                                   ``applied`` = (p, j) as applied by k, put
                                   ``requeue`` = (p, key, j) back, add ``messages``
                                   (an (n_shards, 4) count, :data:`MESSAGE_FIELDS
                                   <sgd_shm.core.status.MESSAGE_FIELDS>`)
``average_round(k, r, x, up,       RPS: send block j of replica ``x`` to server j where
down, barrier)``                   ``up[j]`` (round r, one push of k), call
                                   ``barrier()`` (the round's gate; False: stop), then
                                   take each server's average of round r into ``x``
                                   where ``down[j]`` and server j received anything;
                                   returns which servers answered (None: stopped)
``bounds``, ``poll_s``             the shard bounds; seconds between looks at a gate
=================================  =====================================================

What every transport must give (the conformance suite, ``tests/test_transport.py``,
checks each on every transport):

* **Pushes.** A push applies ``-lr * scale * g`` to each shard it reaches (``lr``:
  the run's step, or its schedule at the push's ``version``), each shard's update
  atomic (under the shard's lock, or one actor call) and counted in that shard's
  version; the global version counts pushes applied in full, +1 each, so k pushes of
  a fixed g at a constant step leave the weights at exactly ``-k * lr * g`` and the
  global version at k. A push's staleness is the global version when it is counted
  minus the version its pull returned. Pushes of different workers may interleave
  shard by shard (no push is atomic as a whole).
* **Pulls.** The version a pull returns is read before the weights are copied: the
  weights are at least as new as it.
* **Minibatches, exactly once.** ``take`` pops each queued minibatch once; a queue
  found empty is refilled with its partition's next epoch by exactly one taker (the
  epoch claim is atomic); a requeued minibatch is taken again later; ``applied``
  counts one application. With a work budget, ``claim`` hands out exactly
  ``budget`` tickets. So every minibatch is applied at most once per epoch, and
  exactly once unless the run stops first or a worker dies holding it.
* **Counters.** ``report``'s counters, the message counts and the applied records of
  one worker land in the order that worker sent them, before its next ``state``
  answers (a transport may deliver them later, but not after a later call of the
  same worker).
* **State.** A ``state`` answer may be a snapshot (Ray) or live (shared memory); the
  stop flag it shows turns true at most once and stays true.
* **Dead workers.** A worker may die between any two verbs (SIGKILL, ``ray.kill``,
  the threads transport's kill); the backend reports it, and what it held (a
  ticket, a minibatch) is lost, never applied twice.

The loop does not fuse a push with the next pull: under a gate (BSP, SSP) the next
pull must come after the gate opens, or it would miss the pushes it waited for.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

__all__ = ["Link", "Backend", "RunState", "Push", "StateSnapshot", "Refill", "TRANSPORTS"]

#: the transports ``train(backend=...)`` takes: worker processes on shared memory, Ray
#: actors, threads of the calling process (tests and debugging)
TRANSPORTS = ("shm", "ray", "threads")


@dataclass
class Push:
    """One gradient to apply: dense (``grad``, the whole vector; ``shards``: only
    those, ascending, ``None``: all) or sparse (``indices``, strictly ascending, and
    their ``values``: only the shards they hit). ``version``: what the pull returned;
    ``scale``: the policy's weight; ``nbytes``: what it cost to send (``None``: 8
    bytes per weight for a dense push, the arrays' bytes for a sparse one)."""
    version: int
    scale: float = 1.0
    grad: np.ndarray | None = None
    indices: np.ndarray | None = None
    values: np.ndarray | None = None
    nbytes: int | None = None
    shards: list | None = None

    @property
    def sparse(self) -> bool:
        return self.indices is not None


@runtime_checkable
class RunState(Protocol):
    """What a worker reads of the run (see :meth:`Link.state`)."""
    stopped: bool
    alive: bool
    version: int

    def pushes(self, j: int) -> int: ...

    def status(self, j: int) -> int: ...

    def epoch(self, p: int) -> int: ...

    def lag(self, p: int) -> int: ...


@runtime_checkable
class Link(Protocol):
    """A worker's view of the server (the verbs are described in the module notes)."""
    bounds: np.ndarray
    poll_s: float

    def state(self, k: int) -> RunState: ...

    def exchange(self, k: int, push: Push | None = None, pull: bool = True): ...

    def take(self, k: int, sources, rng, claim: bool): ...

    def report(self, k: int, counts=None, *, applied=None, requeue=None,
               messages=None) -> None: ...

    def average_round(self, k: int, r: int, x, up, down, barrier): ...


@runtime_checkable
class Backend(Protocol):
    """The coordinator's side of a transport: ``start(job, seeds, lr, wait)`` the
    workers; ``kill(k)``; ``poll()`` {worker: "killed" | "diverged" | "failed: ..."}
    for workers that ended since the last poll; ``stop()``; ``pull()`` (weights,
    version); ``version()``; ``counters()`` (staleness sums, pushes tried);
    ``set_status(k, s)``; ``budget_done(n_killed)``; ``write_off(q, unflagged_live)``;
    ``snapshot()`` (weights, shard versions, version, pushes, epochs); ``report()``
    (slots, histograms, the exactly-once tally); ``messages()``; ``close()``. All but
    ``start``, ``kill``, ``poll``, ``stop`` and ``close`` are one call of the
    :class:`~sgd_shm.ps.server.ServerState` that the transport hosts."""
    name: str
    nodes: list

    def start(self, job, seeds, lr, wait) -> None: ...

    def kill(self, k: int) -> bool: ...

    def poll(self) -> dict: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...


class Refill(NamedTuple):
    """A ``take`` on a transport whose server cannot draw the worker's random numbers
    (Ray): partition ``p`` was found empty at epoch ``e``; the worker draws the next
    epoch's order of its ``n`` minibatches and asks again with it (see
    :meth:`sgd_shm.ps.server.ServerState.take`)."""
    p: int
    e: int
    n: int


@dataclass
class StateSnapshot:
    """A :class:`RunState` read at one moment (the Ray transport's answer)."""
    stopped: bool
    version: int
    pushes_: np.ndarray
    status_: np.ndarray
    epochs_: np.ndarray
    lags_: np.ndarray
    alive: bool = True

    def pushes(self, j):
        return int(self.pushes_[j])

    def status(self, j):
        return int(self.status_[j])

    def epoch(self, p):
        return int(self.epochs_[p])

    def lag(self, p):
        return int(self.lags_[p])
