"""Traces of real parameter-server runs, and their replay in the simulator.

:class:`Recorder` wraps a policy object and records what the real worker loop asks of
it, with the wall-clock time: each step's start (``sources``, called once a step
before the pull, with the run's state) and each push's decision (``push_scale``,
called just before the push with tau = version now - version pulled). It changes
nothing the wrapped policy decides; it asks the worker for the staleness of every
push (``uses_staleness``), which costs one read of the version per push. The records
come back in the calling process, so record a run of the in-process transport
(``ps.train(..., backend="threads")``).

:meth:`Recorder.trace` turns the records and the run's result into a :class:`Trace`:
per worker, the seconds of each step from its start to its push (``pre``) and from
its push to the next step's start (``post``), its first start, and the coordinator's
sample times. ``simulate(..., replay=trace)`` then runs the simulator on that
timeline instead of its compute and network models: worker k's i-th step reads the
weights at its start and pushes ``pre[i]`` later, and the coordinator samples at the
real run's times, so the simulated run makes decisions close to the real one's: the
versions pulled and applied, in order, and SaPS's flags (``Trace.pushes`` holds the
real run's (worker, pulled version) sequence to compare with the simulated log). The
hooks see each push's count only between its decision and the worker's next look at
its gate; for an exact replay trace the run itself (``ps.train(..., trace=True)``,
replayed by :mod:`sgd_shm.sim.replay`).

Example::

    rec = Recorder(SaPS())
    real = ps.train(X, y, n_workers=4, policy=rec, backend="threads", slowdown="straggler",
                    max_seconds=0.5)
    tr = rec.trace(real)
    sim = simulate(X, y, n_workers=4, policy=SaPS(), replay=tr, max_seconds=real.seconds)
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from sgd_shm.core.policies import Policy

__all__ = ["Recorder", "Trace"]


@dataclass
class Trace:
    """A real run's timeline: per worker ``lead`` (seconds of each step from its start
    to its pull), ``pre`` (from its pull to its push's decision), ``lag`` (from the
    decision to the push's end: the worker's next look at its gate) and ``post`` (from
    the push's end, or a dropped push's decision, to the next step's start), ``first``
    (its first start), ``samples`` (the
    coordinator's sample times), and ``pushes``: the real run's pushes in the order
    they were decided, as (worker, pulled version, dropped)."""
    lead: list
    pre: list
    lag: list
    post: list
    first: list
    samples: list
    pushes: list

    @property
    def n_workers(self) -> int:
        return len(self.pre)


class Recorder(Policy):
    """Recorder(policy): ``policy`` (an object or a name, as ``ps.train`` takes it),
    whose every decision is recorded (see the module notes)."""

    uses_staleness = True

    def __init__(self, policy, **kw):
        from sgd_shm.core.policies import make_policy
        self.inner = make_policy(policy, **kw)
        self.name = self.inner.name
        self.tolerates_loss = self.inner.tolerates_loss
        if self.inner.replicated:
            raise ValueError(f"policy: {self.inner.name!r} averages replicas in rounds; "
                             "the recorder records the steps of a gradient-pushing policy")
        self._lock = threading.Lock()
        self.starts, self.decisions, self.pulls, self.gates, self.t0 = [], [], [], [], None
        self._local = threading.local()

    def __copy__(self):
        p = object.__new__(type(self))
        p.__dict__.update(self.__dict__)
        return p

    def __getstate__(self):
        raise TypeError("a Recorder records in the calling process: run ps.train with "
                        "backend='threads'")

    def bind(self, n_workers):
        p = super().bind(n_workers)
        p.inner = self.inner.bind(n_workers)
        p._lock = threading.Lock()
        p.starts, p.decisions, p.pulls, p.gates = (self.starts, self.decisions, self.pulls,
                                                   self.gates)
        p.t0 = None
        p._local = self._local
        p._parent = self
        return p

    def model(self, model):
        """``model`` (a :class:`sgd_shm.models.Model`) wrapped so that each worker's
        gradient call records its time: the pull's (the worker computes right after
        it). Pass it as ``ps.train(model=...)``."""
        return _RecordingModel(model, self)

    def may_step(self, k, my_pushes, link):
        self.gates.append((time.perf_counter(), k))     # after the last push: it is done
        return self.inner.may_step(k, my_pushes, link)

    def sources(self, k, link):
        now = time.perf_counter()
        self._local.k, self._local.state = k, link
        with self._lock:
            self.starts.append((now, k, int(link.version)))
        return self.inner.sources(k, link)

    def push_scale(self, tau, flagged):
        now = time.perf_counter()
        k, state = self._local.k, self._local.state
        v = int(state.version) - int(tau)
        s = self.inner.push_scale(tau, flagged) if self.inner.uses_staleness else 1.0
        with self._lock:
            self.decisions.append((now, k, v, s is None))
        return s

    def on_sample(self, view):
        if self.t0 is None:
            self.t0 = time.perf_counter() - view.now
            self._parent.t0 = self.t0
        self.inner.on_sample(view)

    def trace(self, result) -> Trace:
        """The :class:`Trace` of the recorded run (``result``: what ``ps.train``
        returned)."""
        if self.t0 is None:
            raise ValueError("trace: the run sampled no time (it ended before its first "
                             "sample); record a longer run")
        n = len(result.workers)
        per = [[t - self.t0 for t, k, *_ in rec if k == w] for rec in
               (self.starts, self.pulls, self.decisions, self.gates) for w in range(n)]
        starts, pulls, pushes, gates = per[:n], per[n:2 * n], per[2 * n:3 * n], per[3 * n:]
        drops = [[d for _, k, _, d in self.decisions if k == w] for w in range(n)]
        lead, pre, lag, post, first = [], [], [], [], []
        for w in range(n):
            s, g, p, m = starts[w], pulls[w], pushes[w], np.array(gates[w])
            steps = min(len(s), len(g), len(p))
            done = [float(m[np.searchsorted(m, p[i], side="right")])
                    if np.searchsorted(m, p[i], side="right") < m.size else p[i]
                    for i in range(steps)]
            lead.append(np.array([g[i] - s[i] for i in range(steps)]))
            pre.append(np.array([p[i] - g[i] for i in range(steps)]))
            lag.append(np.array([done[i] - p[i] for i in range(steps)]))
            post.append(np.array([s[i + 1] - (p[i] if drops[w][i] else done[i])
                                  for i in range(min(steps, len(s) - 1))]))
            first.append(s[0] if s else np.inf)
        order = sorted(self.decisions)
        if not any(len(x) for x in lead):
            raise ValueError("trace: no gradient was recorded; pass model=recorder.model(m) "
                             "to ps.train beside policy=recorder")
        return Trace(lead, pre, lag, post, first, [h["seconds"] for h in result.history[:-1]],
                     [(k, v, d) for _, k, v, d in order])


class _RecordingModel:
    """A model that records the time of each worker's gradient call (see
    :meth:`Recorder.model`) and otherwise is the model it wraps."""

    def __init__(self, model, recorder):
        self._m, self._rec = model, recorder

    def __getattr__(self, name):
        return getattr(self._m, name)

    def grad(self, w, data, rows, grad, block=None):
        k = getattr(self._rec._local, "k", None)
        if k is not None:
            with self._rec._lock:
                self._rec.pulls.append((time.perf_counter(), k))
        return self._m.grad(w, data, rows, grad, block)


def _register():
    from sgd_shm.core.model import Model
    Model.register(_RecordingModel)           # it is one: every call goes to the model


_register()
