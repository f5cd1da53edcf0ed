"""What every parameter-server transport and the simulator agree on about workers: the
values of a worker's status word, the bins of its staleness histogram, and the lag a
partition is written off with when its worker is flagged or dies. They live here,
beside the other shared contracts, so that the simulator and each transport take them
from one place instead of from one another."""
from __future__ import annotations

#: values of a worker's status word (set by the coordinator)
RUNNING, FLAGGED, DEAD = 0, 1, 2
#: staleness histogram bins per worker
HIST_BINS = 32

__all__ = ["RUNNING", "FLAGGED", "DEAD", "HIST_BINS", "written_off_lag"]


def written_off_lag(epochs, q, unflagged_live):
    """The lag of partition q when its worker is flagged or dies: the smallest epoch of
    the other partitions whose workers are live and unflagged, minus q's (never below
    0); None when there is no such partition. The rule of every transport."""
    others = [int(epochs[p]) for p in unflagged_live if p != q]
    return max(0, min(others) - int(epochs[q])) if others else None
