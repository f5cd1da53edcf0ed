"""The emulated load imbalance that the trainers inject and the simulator models alike,
so both take it from here: the parameter server's stragglers (per-worker compute-time
factors, from a profile name or given, and transient slow spells), the load-imbalance
model of the eager-SGD paper (Li et al., PPoPP 2020: which ranks sleep in a round) and
the eager trainer's random per-step delays."""
from __future__ import annotations

import numpy as np

from sgd_shm.core.validation import _is_int, _is_real, check_number

#: the distributions of a random per-step delay (``delay=``)
DELAYS = ("exponential", "pareto")

#: the parameter server's straggler profiles (``slowdown=``): "straggler" slows worker 0
#: by 4x, "hetero" spreads the workers' factors geometrically from 4x down to 1x
PROFILES = ("none", "straggler", "hetero")


def factors_of(slowdown, n_workers, name="slowdown"):
    """Per-worker compute-time factors from ``slowdown`` (see :func:`sgd_shm.ps.train`);
    ``name``: the argument's name in the messages."""
    factors = np.ones(n_workers)
    if isinstance(slowdown, str):
        if slowdown not in PROFILES:
            raise ValueError(f"{name}: profile must be one of {PROFILES}, got {slowdown!r}")
        if slowdown == "straggler":
            factors[0] = 4.0
        elif slowdown == "hetero" and n_workers > 1:
            factors = 4.0 ** (1.0 - np.arange(n_workers) / (n_workers - 1))
    elif isinstance(slowdown, dict):
        for k, f in factor_items(slowdown, name, n_workers):
            factors[k] = f
    elif slowdown is not None:
        try:
            given = np.asarray(slowdown)
        except (TypeError, ValueError):
            given = np.asarray(None)
        if given.dtype.kind not in "iuf" or (given.ndim == 1 and any(
                isinstance(x, (bool, np.bool_)) for x in slowdown)):
            raise ValueError(f"{name}: expected a profile name, {{worker: factor}} or "
                             f"{n_workers} factors (numbers), got {slowdown!r}")
        factors = given.astype(float)
        if factors.shape != (n_workers,):
            raise ValueError(f"{name}: expected {n_workers} factors, got shape "
                             f"{factors.shape}")
    if (factors < 1).any() or not np.isfinite(factors).all():
        raise ValueError(f"{name}: factors must be finite and >= 1 (1 = full speed)")
    return factors


def factor_items(slowdown, name="slowdown", n_workers=None):
    """The (worker, factor) pairs of a {worker: factor} dict, checked: workers ints in
    [0, n_workers) (None: any >= 0, for a cluster made before its run's size is known),
    factors finite numbers >= 1."""
    out = []
    for k, f in slowdown.items():
        if not _is_int(k) or k < 0 or (n_workers is not None and k >= n_workers):
            rule = "an int >= 0" if n_workers is None else f"an int in [0, {n_workers})"
            raise ValueError(f"{name}: worker {k!r} is not {rule}")
        f = _factor(f, name)
        if not (f >= 1 and np.isfinite(f)):
            raise ValueError(f"{name}: factors must be finite and >= 1 (1 = full speed)")
        out.append((int(k), f))
    return out


def _factor(f, name="slowdown"):
    if not _is_real(f):
        raise ValueError(f"{name}: a factor must be a number >= 1 (1 = full speed), "
                         f"got {f!r}")
    return float(f)


def transient_of(transient):
    if transient is None:
        return None
    try:
        rate, factor, length = (float(x) for x in transient)
    except (TypeError, ValueError):
        raise ValueError("transient: expected (spells per second, factor, seconds), got "
                         f"{transient!r}") from None
    if not (rate > 0 and factor >= 1 and length > 0) or not all(
            map(np.isfinite, (rate, factor, length))):
        raise ValueError("transient: need spells per second > 0, factor >= 1 and seconds > 0, "
                         f"got {transient!r}")
    return rate, factor, length


def sleepers(seed, round_id, size, k):
    """The ``k`` ranks that sleep in round ``round_id``: a draw from ``seed`` that
    every rank computes alike (distinct ranks, uniform)."""
    if k <= 0:
        return ()
    rng = np.random.default_rng([int(seed) & (2**63 - 1), int(round_id), 0xE6])
    return tuple(int(x) for x in rng.choice(size, min(k, size), replace=False))


def imbalance_of(imbalance, n_workers=None):
    """The eager-SGD imbalance ``(k ranks, seconds)``, checked: k an int in [0, n_workers]
    (>= 0 where the ranks are not known yet), seconds a finite number >= 0; None stays
    None."""
    if imbalance is None:
        return None
    try:
        k, s = imbalance
    except (TypeError, ValueError):
        raise ValueError(f"imbalance: expected (k ranks, seconds), got {imbalance!r}") from None
    top = n_workers if n_workers is not None else float("inf")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= top:
        rule = "an int >= 0" if n_workers is None else f"an int in [0, n_workers={n_workers}]"
        raise ValueError(f"imbalance: k must be {rule}, got {k!r}")
    return int(k), check_number("imbalance", s, lo=0)


def delay_of(delay):
    """A random per-step delay, checked: ``("exponential", mean seconds)`` or
    ``("pareto", mean seconds, shape > 1)`` (a finite mean), the mean >= 0; as a tuple
    of floats after the name. None stays None."""
    if delay is None:
        return None
    form = "expected ('exponential', mean) or ('pareto', mean, shape)"
    if not isinstance(delay, (tuple, list)) or not delay or delay[0] not in DELAYS:
        raise ValueError(f"delay: {form}, got {delay!r}")
    if len(delay) != (2 if delay[0] == "exponential" else 3):
        raise ValueError(f"delay: {form}, got {delay!r}")
    mean = check_number("delay", delay[1], lo=0)
    if delay[0] == "pareto":
        return ("pareto", mean, check_number("delay", delay[2], lo=1, lo_open=True))
    return ("exponential", mean)


def draw_delay(delay, rng):
    """One random delay (seconds) of a checked ``delay`` (:func:`delay_of`), from the
    numpy Generator ``rng``: exponential with that mean, or Pareto of that shape
    scaled to that mean (as eager-SGD's)."""
    if delay[0] == "exponential":
        return float(rng.exponential(delay[1])) if delay[1] > 0 else 0.0
    shape = delay[2]
    return delay[1] * (shape - 1) / shape * (1.0 + float(rng.pareto(shape)))
