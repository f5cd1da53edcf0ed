"""The load-imbalance model of the eager-SGD paper (Li et al., PPoPP 2020): which ranks
sleep in a round. The eager trainer injects it and the simulator replays the same draw,
so both take it from here."""
from __future__ import annotations

import numpy as np


def sleepers(seed, round_id, size, k):
    """The ``k`` ranks that sleep in round ``round_id``: a draw from ``seed`` that
    every rank computes alike (distinct ranks, uniform)."""
    if k <= 0:
        return ()
    rng = np.random.default_rng([int(seed) & (2**63 - 1), int(round_id), 0xE6])
    return tuple(int(x) for x in rng.choice(size, min(k, size), replace=False))
