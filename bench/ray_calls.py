"""Ray's own 1:1 actor-call rate on this machine, to print beside the parameter
server's pushes/s from the same run: the ceiling Ray's transport puts on any actor
protocol here, and so the yardstick for the Ray backend's pushes.

Mirrors Ray's release microbenchmark "1:1 actor calls sync" / "1:1 actor calls
async": one driver calls a trivial method of one actor,

* sync: ``ray.get(a.f.remote())``, one call at a time (a round trip per call);
* pipelined: ``window`` calls kept in flight, waiting on the oldest before
  submitting the next (Ray's "async" case, without asyncio).

Each is warmed up, then timed in 3 repetitions of ``seconds / 3``; the rates are the
medians. Uses the running Ray instance (call
:func:`sgd_shm.ps.ray_session.connect` first); the actor declares no CPUs (so it
starts beside other actors) and is killed afterwards. Not a ``python -m bench``
scenario: a function the scenarios call.
"""
from __future__ import annotations

import collections
import functools
import math
import statistics
import time

from sgd_shm.ps.ray_session import require_ray

REPS = 3


@functools.cache
def _echo_actor():
    """The actor class (made on first use: this module imports without Ray)."""
    ray = require_ray()

    @ray.remote(num_cpus=0)
    class Echo:
        def f(self):
            return None

    return Echo


def _sync(ray, actor, seconds: float) -> float:
    """Calls per second of ``ray.get(actor.f.remote())`` in a loop for ``seconds``."""
    n, t0 = 0, time.perf_counter()
    deadline = t0 + seconds
    while True:
        ray.get(actor.f.remote())
        n += 1
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - t0)


def _pipelined(ray, actor, seconds: float, window: int) -> float:
    """Calls per second with ``window`` calls in flight for ``seconds`` (the ones in
    flight at the end are waited for and counted, their time too)."""
    t0 = time.perf_counter()
    deadline = t0 + seconds
    flight = collections.deque(actor.f.remote() for _ in range(window))
    n = 0
    while time.perf_counter() < deadline:
        ray.wait([flight.popleft()], num_returns=1)
        n += 1
        flight.append(actor.f.remote())
    ray.get(list(flight))
    return (n + len(flight)) / (time.perf_counter() - t0)


def actor_call_rate(seconds: float = 2.0, window: int = 32) -> dict:
    """``{"sync_calls_per_s", "pipelined_calls_per_s", "window", "seconds", "reps"}``:
    the medians of 3 timed repetitions of ``seconds / 3`` each (``reps``: every
    repetition's rates), after a warm-up of each mode."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"seconds: must be a finite number > 0, got {seconds!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window: must be an integer >= 1, got {window!r}")
    ray = require_ray()
    actor = _echo_actor().remote()
    try:
        ray.get(actor.f.remote())                       # the actor is up
        part = seconds / REPS
        warm = min(part, 0.5)
        _sync(ray, actor, warm)
        sync = [_sync(ray, actor, part) for _ in range(REPS)]
        _pipelined(ray, actor, warm, window)
        piped = [_pipelined(ray, actor, part, window) for _ in range(REPS)]
    finally:
        ray.kill(actor)
    return {"sync_calls_per_s": statistics.median(sync),
            "pipelined_calls_per_s": statistics.median(piped),
            "window": window, "seconds": seconds,
            "reps": {"sync": sync, "pipelined": piped}}
