"""What every parameter-server transport and the simulator agree on about workers: the
values of a worker's status word, the bins of its staleness histogram, the lag a
partition is written off with when its worker is flagged or dies, and the coins and
counts of its lost messages over unreliable links (:class:`Losses`). They live here,
beside the other shared contracts, so that the simulator and each transport take them
from one place instead of from one another."""
from __future__ import annotations

import numpy as np

#: values of a worker's status word (set by the coordinator)
RUNNING, FLAGGED, DEAD = 0, 1, 2
#: staleness histogram bins per worker
HIST_BINS = 32

__all__ = ["RUNNING", "FLAGGED", "DEAD", "HIST_BINS", "written_off_lag", "LOSS_STREAM",
           "MESSAGE_FIELDS", "Losses"]


def written_off_lag(epochs, q, unflagged_live):
    """The lag of partition q when its worker is flagged or dies: the smallest epoch of
    the other partitions whose workers are live and unflagged, minus q's (never below
    0); None when there is no such partition. The rule of every transport."""
    others = [int(epochs[p]) for p in unflagged_live if p != q]
    return max(0, min(others) - int(epochs[q])) if others else None


#: the stream of worker k's loss coins: ``np.random.default_rng([loss_seed, k, LOSS_STREAM])``
LOSS_STREAM = 0x1055
#: the columns of a message count: worker -> server messages, of them lost; server ->
#: worker answers, of them lost
MESSAGE_FIELDS = ("up_sent", "up_lost", "down_sent", "down_lost")


class Losses:
    """Message loss of worker k: its coins and its counts per shard.

    Each step (ASP) or round (RPS), worker k draws ``u = rng.random(2 * S)`` from
    ``np.random.default_rng([loss_seed, k, LOSS_STREAM])``: its message to server j
    gets through iff ``u[j] >= p``, server j's answer to it iff ``u[S + j] >= p``.
    The servers' coins are drawn in the worker so that each worker's stream is its
    own (they are independent of everything else all the same), and a run is
    reproducible from its seed on any transport."""

    def __init__(self, p, loss_seed, k, n_shards):
        self.p, self.S = float(p), int(n_shards)
        self.rng = np.random.default_rng([int(loss_seed), int(k), LOSS_STREAM])

    def draw(self):
        """(up, down): boolean arrays of length S, True where the message to server j
        (up) or server j's answer (down) gets through."""
        u = self.rng.random(2 * self.S)
        return u[:self.S] >= self.p, u[self.S:] >= self.p

    def counts(self, up=None, down=None, answered=None):
        """The (S, 4) counts of messages (columns: :data:`MESSAGE_FIELDS`): ``up``
        the worker's messages (None: none sent), ``down`` the servers' answers (None:
        none), of which only the servers in ``answered`` had one to send (default
        all)."""
        c = np.zeros((self.S, len(MESSAGE_FIELDS)), np.int64)
        if up is not None:
            c[:, 0], c[:, 1] = 1, ~up
        if down is not None:
            ans = np.ones(self.S, bool) if answered is None else np.asarray(answered, bool)
            c[:, 2], c[:, 3] = ans, ans & ~down
        return c
