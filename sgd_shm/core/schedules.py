"""Step-size schedules: ``ps.train(..., lr=schedule)``, ``eager.train(..., lr=schedule)``
and ``simulate(..., lr=schedule)``.

A schedule maps ``t`` to a step. For a push ``t`` is the global version its worker
pulled (the updates applied before the weights its gradient was computed at): one
worker's t-th push is at ``t``; with several workers a stale push is stepped by the
schedule at the weights it saw, so the schedule follows the run's progress and not the
order of arrival. Under a replicated policy (RPS) and in eager-SGD's rounds ``t`` is
the round (from 0, the same on every replica). On Ray with several nodes the version a
worker pulls is its node's, which counts the other nodes' pushes up to two syncs late
(:mod:`sgd_shm.ps.ray_local`). A checkpoint keeps the version, so a resumed run goes on
along the schedule.

A constant step gives each push the same weight; asynchronous SGD at a constant step
keeps wandering around a minimum (stale gradients act like momentum, Mitliagkas et al.,
"Asynchrony begets momentum", 2016), and a step that falls towards the end of the run
settles the last model. The schedules here are those of ``torch.optim.lr_scheduler``
stepped once per update: :class:`StepDecay` is ``MultiStepLR``, :class:`Cosine` is
``CosineAnnealingLR`` (held at its floor after ``total``). Any callable ``t -> step``
works too (it must pickle for workers that do not fork: Ray, ``start_method="spawn"``).

Example::

    from sgd_shm.ps import Cosine, train
    # the step falling from 0.1 to 0.001 over the run's updates (10 epochs)
    r = train(X, y, n_workers=4, policy="asp", epochs=10, lr=Cosine(0.1))
"""
from __future__ import annotations

import math

import numpy as np

from sgd_shm.core.validation import check_number, check_positive

__all__ = ["Schedule", "Constant", "StepDecay", "Cosine", "make_schedule", "check_steps",
           "for_run"]


class Schedule:
    """The base of the schedules: ``schedule(t)`` is the step at ``t``, a finite float
    > 0. ``lr`` is the step at t = 0 (what error messages name)."""

    lr: float

    def __call__(self, t: int) -> float:
        raise NotImplementedError

    def over(self, total: int) -> "Schedule":
        """This schedule for a run whose last step is ``total - 1``: a schedule that
        falls over the whole run (:class:`Cosine` without ``total``) takes the run's
        length; the others stay as they are."""
        return self


class Constant(Schedule):
    """The same step ``lr`` at every ``t`` (what a number given as ``lr`` becomes)."""

    def __init__(self, lr):
        self.lr = check_positive("lr", lr)

    def __call__(self, t):
        return self.lr

    def __repr__(self):
        return repr(self.lr)


class StepDecay(Schedule):
    """``lr`` times ``gamma`` once for every milestone passed: the step at t is
    ``lr * gamma ** (number of milestones <= t)`` (torch's ``MultiStepLR``).
    ``milestones``: increasing ints >= 1 (updates, or rounds under RPS)."""

    def __init__(self, lr, milestones, gamma=0.1):
        self.lr = check_positive("lr", lr)
        self.gamma = check_number("gamma", gamma, lo=0, hi=1, lo_open=True)
        try:
            m = np.asarray(milestones)
        except (TypeError, ValueError):                # (ragged nesting)
            m = np.asarray(None)
        if m.ndim != 1 or m.size == 0 or not np.issubdtype(m.dtype, np.integer) \
                or (m < 1).any() or (np.diff(m) <= 0).any():
            raise ValueError(f"milestones: must be increasing ints >= 1 (the updates at "
                             f"which the step is multiplied by gamma), got {milestones!r}")
        self.milestones = tuple(int(v) for v in m)
        if not self.lr * self.gamma ** len(self.milestones) > 0:
            raise ValueError(f"gamma: the step after the last of {len(self.milestones)} "
                             f"milestones, lr * gamma ** {len(self.milestones)}, underflows "
                             "to 0; use fewer milestones or a gamma nearer 1")

    def __call__(self, t):
        passed = int(np.searchsorted(self.milestones, t, side="right"))
        return self.lr * self.gamma ** passed

    def __repr__(self):
        return f"StepDecay({self.lr!r}, milestones={list(self.milestones)}, gamma={self.gamma!r})"


class Cosine(Schedule):
    """From ``lr`` at t = 0 down to ``floor`` at t = ``total`` along half a cosine,
    ``floor + (lr - floor) * (1 + cos(pi * t / total)) / 2``, then ``floor`` (torch's
    ``CosineAnnealingLR`` with ``T_max=total``, ``eta_min=floor``). ``total``: the
    run's updates, e.g. ``epochs * minibatches`` (``r.updates`` of a run with a budget),
    or None: the whole run, whose length a trainer given ``epochs`` knows (its updates,
    rounds or epochs; a run with a time limit only refuses it); ``floor`` > 0 and <
    ``lr`` (default ``lr / 100``)."""

    def __init__(self, lr, total=None, floor=None):
        self.lr = check_positive("lr", lr)
        if total is not None and (isinstance(total, bool)
                                  or not isinstance(total, (int, np.integer)) or total < 1):
            raise ValueError(f"total: must be None (the whole run) or an int >= 1 (the "
                             f"updates the step falls over), got {total!r}")
        self.total = None if total is None else int(total)
        self.floor = self.lr / 100 if floor is None else check_positive("floor", floor)
        if not self.floor > 0:
            raise ValueError(f"lr: {self.lr!r} is too small for the default floor (lr / 100 "
                             "underflows to 0); give floor= or a larger lr")
        if self.floor >= self.lr:
            raise ValueError(f"floor: must be < lr ({self.lr}), got {self.floor}; the "
                             "schedule falls from lr to floor")

    def __call__(self, t):
        if self.total is None:
            raise ValueError(f"lr: {self!r} falls over the whole run, and this run's length "
                             "is unknown (a time limit only); give total= or epochs=")
        if t >= self.total:
            return self.floor
        return self.floor + (self.lr - self.floor) * (1 + math.cos(math.pi * t / self.total)) / 2

    def over(self, total):
        if self.total is not None:
            return self
        return Cosine(self.lr, total=max(1, int(total)), floor=self.floor)

    def __repr__(self):
        return f"Cosine({self.lr!r}, total={self.total}, floor={self.floor!r})"


class _Callable(Schedule):
    """A user's callable ``t -> step``, checked at every call (a step that is not a
    finite number > 0 is a ValueError naming ``lr`` and ``t``)."""

    def __init__(self, f):
        self.f = f
        self.lr = self(0)

    def __call__(self, t):
        v = self.f(t)
        try:
            return check_positive("lr", v)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{e} (the schedule's step at t = {t})") from None

    def __repr__(self):
        return f"schedule {self.f!r} (step {self.lr!r} at t = 0)"


def make_schedule(lr) -> Schedule:
    """``lr`` as a :class:`Schedule`: a number becomes :class:`Constant`, a schedule
    stays as it is, another callable is wrapped (and its step at t = 0 checked)."""
    if isinstance(lr, Schedule):
        return lr
    if callable(lr) and not isinstance(lr, type):
        return _Callable(lr)
    return Constant(lr)


#: the most steps check_steps calls a user's callable at (about a second of calls)
CHECKED_STEPS = 1 << 20


def check_steps(schedule: Schedule, start: int, stop: int) -> None:
    """Check a user's callable at every t in [start, stop) before a run whose steps are
    known in advance (a budget of ``epochs``): a bad step is a ValueError naming ``lr``
    and ``t`` at the caller, instead of a worker or a rank failing mid-run. Past
    ``CHECKED_STEPS`` steps it checks that many, evenly spread and both ends included
    (the run still checks every step it takes). The schedules of this module are valid
    by construction and are not called."""
    if not isinstance(schedule, _Callable) or stop <= start:
        return
    if stop - start <= CHECKED_STEPS:
        ts = range(start, stop)
    else:
        ts = np.unique(np.linspace(start, stop - 1, CHECKED_STEPS).astype(np.int64)).tolist()
    for t in ts:
        schedule(t)


def for_run(schedule: Schedule, start: int = 0, stop: int | None = None,
            slack: int = 0) -> Schedule:
    """The schedule a run uses, checked before it starts. The run's steps are ``start``
    to ``stop - 1`` (``stop`` None: a run with a time limit only, whose length is
    unknown): a schedule that falls over the whole run takes ``stop`` as its total, a
    user's callable is checked at every step up to ``stop + slack`` (steps a run may
    take past its budget: pushes already on their way), and a schedule that needs the
    run's length without one is a ValueError naming ``lr``."""
    s = schedule if stop is None else schedule.over(stop)
    s(start)
    if stop is not None:
        check_steps(s, start, stop + slack)
    return s
