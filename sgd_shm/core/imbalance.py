"""The emulated load imbalance that the trainers inject and the simulator models alike,
so both take it from here: the parameter server's stragglers (per-worker compute-time
factors, from a profile name or given, and transient slow spells) and the load-imbalance
model of the eager-SGD paper (Li et al., PPoPP 2020: which ranks sleep in a round)."""
from __future__ import annotations

import numpy as np

#: the parameter server's straggler profiles (``slowdown=``): "straggler" slows worker 0
#: by 4x, "hetero" spreads the workers' factors geometrically from 4x down to 1x
PROFILES = ("none", "straggler", "hetero")


def factors_of(slowdown, n_workers):
    """Per-worker compute-time factors from ``slowdown`` (see :func:`sgd_shm.ps.train`)."""
    factors = np.ones(n_workers)
    if isinstance(slowdown, str):
        if slowdown not in PROFILES:
            raise ValueError(f"slowdown: profile must be one of {PROFILES}, got {slowdown!r}")
        if slowdown == "straggler":
            factors[0] = 4.0
        elif slowdown == "hetero" and n_workers > 1:
            factors = 4.0 ** (1.0 - np.arange(n_workers) / (n_workers - 1))
    elif isinstance(slowdown, dict):
        for k, f in slowdown.items():
            if not isinstance(k, (int, np.integer)) or not 0 <= k < n_workers:
                raise ValueError(f"slowdown: worker {k!r} is not in [0, {n_workers})")
            factors[k] = f
    elif slowdown is not None:
        factors = np.asarray(slowdown, dtype=float)
        if factors.shape != (n_workers,):
            raise ValueError(f"slowdown: expected {n_workers} factors, got shape "
                             f"{factors.shape}")
    if (factors < 1).any() or not np.isfinite(factors).all():
        raise ValueError("slowdown: factors must be finite and >= 1 (1 = full speed)")
    return factors


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
