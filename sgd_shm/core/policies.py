"""Training policies of the parameter server, as objects (the parameter server's
transports and the simulator both run them).

Every policy answers the same few questions, so the worker loop and the coordinator
never compare policy names:

* ``may_step(k, my_pushes, link)``: may worker k start its next step? (a gate; the
  worker sleeps briefly and asks again while the answer is no);
* ``sources(k, link)``: partitions to take a minibatch from before k's own, each with
  a refill limit (see :meth:`Policy.sources`);
* ``push_scale(tau, flagged)``: the weight of a push whose staleness is ``tau``
  (global version at push minus the version pulled), or ``None`` to drop it (the
  worker re-queues its minibatch and pulls again);
* ``on_sample(view)``: called by the coordinator at every sample (every
  ``sample_every`` seconds), e.g. to flag stragglers.

Two attributes say what a policy is built for: ``tolerates_loss`` (the run may lose
messages, ``train(drop=p)``: true for ASP and RPS; a gate that counts pushes, as BSP's
and SSP's, would wait forever for a push that was lost) and ``replicated`` (every
worker keeps a full model replica and a step is a round of model averaging, as in
:class:`RPS`; the store then holds the servers' averages).

:class:`Policy` is ASP: every hook has the asynchronous answer. BSP and SSP override
the gate, SaPS the push, the sources and the sample. A user-defined policy subclasses
:class:`Policy` and overrides what it changes; it must pickle (it is sent to the
workers). Example: a policy that drops every push staler than 8 updates::

    class DropStale(Policy):
        name = "drop-stale"
        uses_staleness = True
        def push_scale(self, tau, flagged):
            return None if tau > 8 else 1.0

    train(X, y, policy=DropStale())

Sources: SSP is Ho et al., "More effective distributed ML via a stale synchronous
parallel parameter server", NIPS 2013; SaPS after Yu, Zhu, Chen, Cheng, Hu, Li,
"Accelerating distributed training in heterogeneous clusters via a straggler-aware
parameter server", HPCC 2019, with the exact rules stated in :class:`SaPS`; RPS is
the Robust Parameter Server of Yu, Tang, Renggli, Kassing, Singla, Alistarh, Zhang,
Liu, "Distributed learning over unreliable networks", ICML 2019 (arXiv:1810.07766).
"""
from __future__ import annotations

import copy
import math

import numpy as np

from sgd_shm.core.status import DEAD, FLAGGED
from sgd_shm.core.validation import warn_caller

__all__ = ["Policy", "ASP", "BSP", "SSP", "SaPS", "RPS", "POLICIES", "make_policy",
           "server_average", "SHM_POLL_S"]

#: seconds a shared-memory worker sleeps between looks at a closed gate
#: (``ShmLink.poll_s``): a look at the gate is a few loads, so it can be frequent. Here,
#: not in the transport, because the calibration reads it too (a waiting worker
#: notices an opened gate half a period late on average)
SHM_POLL_S = 0.0002


class Policy:
    """The asynchronous policy (ASP), and the base class of every policy.

    Attributes: ``name`` (for reports and checkpoints); ``uses_staleness``: the
    worker computes tau for :meth:`push_scale` only when this is true (one version
    read per push)."""

    name = "asp"
    uses_staleness = False
    tolerates_loss = True
    replicated = False

    def bind(self, n_workers: int) -> "Policy":
        """A copy of this policy set up for a run of ``n_workers`` workers (a
        policy object can be reused for several runs)."""
        p = copy.copy(self)
        p.n_workers = n_workers
        return p

    def may_step(self, k: int, my_pushes: int, link) -> bool:
        """Worker k has pushed ``my_pushes`` times; may it start another step?"""
        return True

    def sources(self, k: int, link):
        """[(partition, refill_limit)] to take from before k's own partition. A
        partition's queue is refilled with its next epoch e + 1 when it is found
        empty and e < refill_limit (``None``: always)."""
        return ()

    def push_scale(self, tau: int, flagged: bool):
        """Weight of a push of staleness tau (1.0: as is; ``None``: drop it)."""
        return 1.0

    def on_sample(self, view) -> None:
        """Coordinator hook, once per sample; ``view`` is a
        :class:`sgd_shm.ps.coordinator.SampleView`."""

    def __repr__(self):
        return f"{type(self).__name__}()"


ASP = Policy


class SSP(Policy):
    """Stale synchronous parallel: worker k starts step c only when every live
    worker has pushed at least c - staleness times (Ho et al. 2013)."""

    name = "ssp"
    tolerates_loss = False

    def __init__(self, staleness=None):
        self.staleness = staleness

    def bind(self, n_workers):
        p = super().bind(n_workers)
        p.s = _bound(self.staleness, n_workers)
        return p

    def may_step(self, k, my_pushes, link):
        need = my_pushes - self.s
        for j in range(self.n_workers):
            if link.status(j) != DEAD and link.pushes(j) < need:
                return False
        return True

    def __repr__(self):
        return f"{type(self).__name__}(staleness={self.staleness!r})"


class BSP(SSP):
    """Bulk synchronous: worker k starts its c-th step only when every live worker
    has pushed c times (SSP with staleness 0)."""

    name = "bsp"

    def __init__(self):
        super().__init__(staleness=0)

    def __repr__(self):
        return "BSP()"


class SaPS(Policy):
    """Straggler-aware: never makes a fast worker wait.

    - Detection reads the version counters. A push's staleness is the global version
      at push minus the version its worker pulled. At every sample the coordinator
      takes each worker's mean staleness over its pushes (applied or dropped) of the
      last ``window`` seconds (a worker with no push in the window counts as
      infinitely stale). After a first full window, worker w is flagged while its
      mean exceeds ``detect_factor`` times the median of the other live workers'
      means (and at least 1) and exceeds n_workers; it is unflagged when that stops.
    - Bound: a push with staleness tau above ``staleness`` (default n_workers) is
      down-weighted by staleness / tau; from a flagged worker it is dropped instead,
      the worker re-pulls, and its minibatch goes back to its queue.
    - Stealing: when worker q is flagged (or dies), its partition's deficit is
      written off (``lag_q`` = the smallest epoch of the other unflagged live
      partitions minus q's, at that moment). An unflagged worker first takes
      minibatches from the queue of a flagged or dead worker q whose partition is not
      ahead of its own (q's epoch + lag_q <= its own), refilling that queue when it
      is empty and strictly behind; only then from its own. A straggler's unstarted
      minibatches are processed by the fast workers and its data keeps pace from the
      detection on. (Making up the deficit from before the detection would be a
      burst of one partition's gradients, which biases the model.)
    """

    name = "saps"
    uses_staleness = True
    tolerates_loss = False

    def __init__(self, staleness=None, window=0.5, detect_factor=2.0):
        for nm, v in (("window", window), ("detect_factor", detect_factor)):
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v)
                                           and v > 0):
                raise ValueError(f"{nm}: must be a finite number > 0, got {v!r}")
        self.staleness, self.window, self.detect_factor = staleness, window, detect_factor

    def bind(self, n_workers):
        p = super().bind(n_workers)
        p.s = _bound(self.staleness, n_workers)
        p._samples = [[] for _ in range(n_workers)]     # (t, staleness sum, pushes)
        return p

    def push_scale(self, tau, flagged):
        if tau <= self.s:
            return 1.0
        return None if flagged else self.s / tau

    def sources(self, k, link):
        if link.status(k) == FLAGGED:
            return ()
        own = link.epoch(k)
        out = []
        for q in range(self.n_workers):
            if q != k and link.status(q) in (FLAGGED, DEAD):
                lag = link.lag(q)
                if link.epoch(q) + lag <= own:
                    out.append((q, own - lag))
        return out

    def on_sample(self, view):
        n, now = self.n_workers, view.now
        for k in range(n):
            s = self._samples[k]
            s.append((now, view.staleness_sum(k), view.pushes_tried(k)))
            while len(s) > 1 and s[0][0] < now - self.window:
                s.pop(0)
        if now < self.window:                    # a full window before any verdict
            return
        level = []
        for s in self._samples:
            (_, s0, p0), (_, s1, p1) = s[0], s[-1]
            level.append((s1 - s0) / (p1 - p0) if p1 > p0 else math.inf)
        for k in range(n):
            if k in view.killed:
                continue
            others = [level[j] for j in range(n) if j != k and j not in view.killed]
            if not others:
                continue
            slow = (level[k] > self.detect_factor * max(float(np.median(others)), 1.0)
                    and level[k] > n)
            if slow and k not in view.flagged:
                view.flag(k)
            elif not slow and k in view.flagged:
                view.unflag(k)

    def __repr__(self):
        return (f"SaPS(staleness={self.staleness!r}, window={self.window!r}, "
                f"detect_factor={self.detect_factor!r})")


class RPS(BSP):
    """Robust Parameter Server: synchronous model averaging that tolerates lost
    messages (Yu, Tang, Renggli, Kassing, Singla, Alistarh, Zhang, Liu, "Distributed
    learning over unreliable networks", ICML 2019, arXiv:1810.07766).

    Every worker keeps a full replica of the model; the ``n_shards`` shards are the
    servers, server j owning block j. A round of worker k:

    1. a local SGD step on its replica, with the next minibatch of its own partition;
    2. it sends block j of its replica to server j, for every j (each message lost
       with probability ``drop``, ``train``'s argument);
    3. the round's barrier (BSP's gate, asked after the sends): every live worker
       has sent this round;
    4. server j averages the blocks it received this round (:func:`server_average`)
       and answers every worker (each answer lost with probability ``drop``); a
       server that received nothing has nothing to send;
    5. worker k replaces its block j with server j's answer where one arrived and
       keeps its own block j where none did.

    The store holds the servers' model (shard j: server j's last average; its
    version: the rounds server j completed); that is the model the coordinator
    evaluates and ``train`` returns. With ``drop=0`` every replica equals the
    servers' model after each round: synchronous model averaging (one local step
    per round). A worker never steals minibatches; a killed worker is no longer
    waited for, as under BSP."""

    name = "rps"
    tolerates_loss = True
    replicated = True

    def __repr__(self):
        return "RPS()"


def server_average(blocks):
    """Server j's answer: the mean of the blocks it received (a list of equal-length
    float arrays, in worker order), summed one after another in the blocks' float type
    (float64, or float32 for a float32 model: no wider copy) and divided by their
    count, so every transport computes the same bits; ``None`` when it received
    none."""
    if not blocks:
        return None
    first = np.asarray(blocks[0])
    acc = np.array(first, dtype=first.dtype if first.dtype == np.float32 else np.float64,
                   copy=True)
    for b in blocks[1:]:
        acc += b
    acc /= len(blocks)
    return acc


#: the policies by name, as ``train(policy=...)`` takes them, that ``python -m sgd_shm``
#: and ``python -m bench ps`` compare on a straggler
POLICIES = ("bsp", "asp", "ssp", "saps")
#: every name ``train(policy=...)`` takes: POLICIES and "rps" (model averaging over an
#: unreliable network, see :class:`RPS` and ``python -m bench unreliable``)
POLICY_NAMES = POLICIES + ("rps",)


def _bound(staleness, n_workers):
    s = n_workers if staleness is None else staleness
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
        raise ValueError(f"staleness: must be an int >= 0, got {staleness!r}")
    return int(s)


def make_policy(policy, *, staleness=None, window=None, detect_factor=None) -> Policy:
    """A policy object from ``train``'s arguments: a name in :data:`POLICY_NAMES` (with
    ``staleness``, ``window``, ``detect_factor``; None: the policy's default), or a
    :class:`Policy` instance, returned as it is (a setting given beside one is refused:
    the object carries its own). A setting that a named policy does not use is ignored
    with a warning."""
    given = {k: v for k, v in (("staleness", staleness), ("window", window),
                               ("detect_factor", detect_factor)) if v is not None}
    if isinstance(policy, Policy):
        if given:
            name, v = next(iter(given.items()))
            cls = "SSP" if name == "staleness" else "SaPS"
            raise ValueError(f"{name}: a policy object carries its own settings; give "
                             f"them to it (e.g. {cls}({name}={v!r})) and leave {name} out")
        return policy
    if isinstance(policy, type) and issubclass(policy, Policy):
        raise TypeError(f"policy: pass an instance, e.g. policy={policy.__name__}(), "
                        "not the class")
    if policy not in POLICY_NAMES:
        raise ValueError(f"policy: must be one of {POLICY_NAMES} or a sgd_shm.ps.Policy "
                         f"instance, got {policy!r}")
    _unused(policy, given)
    if policy == "ssp":
        return SSP(staleness)
    if policy == "saps":
        return SaPS(**given)
    return {"asp": Policy, "bsp": BSP, "rps": RPS}[policy]()


def _unused(policy, given):
    """Warn of each setting in ``given`` that policy ``policy`` ignores (as scikit-learn
    warns of an ``l1_ratio`` without an elastic-net penalty): a comparison may pass one
    set of settings to every policy, but a run that ignores one should say so."""
    for name, v in given.items():
        if name == "staleness" and policy not in ("ssp", "saps"):
            warn_caller(f"staleness: policy {policy!r} has no staleness bound (it is the "
                        f"bound of 'ssp' and of 'saps'), so staleness={v!r} is ignored")
        elif name != "staleness" and policy != "saps":
            warn_caller(f"{name}: a setting of SaPS's straggler detection, which policy "
                        f"{policy!r} does not run, so {name}={v!r} is ignored")
