"""The minibatches of a parameter-server run: which rows make minibatch j of partition p,
and the work budgets of ``epochs=``.

The trainer's workers and the simulator cut the data alike from the same seeded draw,
so both take the cut from here (the queues that hand the minibatches out at run time
are :class:`sgd_shm.ps.partitions.Partitions`); both trainers and the simulator count
an ``epochs=`` budget in steps with the same two functions."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Batches", "eager_rounds"]


@dataclass(frozen=True)
class Batches:
    """Which rows make minibatch j of partition p: a seeded permutation of the rows cut
    into one contiguous partition per worker, each into minibatches of ``size`` rows.
    Small and picklable: every worker computes its minibatches' rows itself."""
    rows: np.ndarray
    part_lo: np.ndarray
    part_hi: np.ndarray
    size: int

    @classmethod
    def draw(cls, n_rows, n_workers, batch_size, rng):
        bounds = cls._bounds(n_rows, n_workers)
        return cls(rng.permutation(n_rows), bounds[:-1], bounds[1:], int(batch_size))

    @staticmethod
    def _bounds(n_rows, n_workers):
        return np.linspace(0, n_rows, n_workers + 1).astype(np.int64)

    @classmethod
    def per_pass(cls, n_rows, n_workers, batch_size) -> int:
        """The minibatches of one pass over the data (all partitions together), as
        :meth:`draw` cuts them."""
        b = cls._bounds(n_rows, n_workers)
        return int(_per_part(b[:-1], b[1:], int(batch_size)).sum())

    @property
    def n_batches(self) -> np.ndarray:
        """Minibatches per partition (at least one)."""
        return _per_part(self.part_lo, self.part_hi, self.size)

    def rows_of(self, p, j):
        lo = int(self.part_lo[p]) + j * self.size
        return self.rows[lo:min(lo + self.size, int(self.part_hi[p]))]

    def budget(self, epochs, replicated):
        """The parameter server's work budget of ``epochs`` passes: minibatch
        applications, or under a replicated policy (RPS) rounds, epochs times the
        largest partition's minibatches (each worker takes one minibatch of its own
        partition per round). At least one."""
        per = int(self.n_batches.max()) if replicated else int(self.n_batches.sum())
        return max(1, math.ceil(epochs * per))


def _per_part(lo, hi, size):
    """Minibatches of ``size`` rows in each partition [lo, hi) (at least one)."""
    return np.maximum(1, -(-(hi - lo) // size))


def eager_rounds(epochs, n_rows, n_workers, batch_size):
    """The eager trainer's rounds for ``epochs`` passes over ``n_rows``: each round every
    one of ``n_workers`` ranks takes a minibatch of ``batch_size`` rows. At least one."""
    return max(1, math.ceil(epochs * n_rows / (n_workers * batch_size)))
