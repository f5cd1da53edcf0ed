"""relaxed: concurrent relaxed data structures on shared memory.

Structures (each works across Python threads, whose bulk calls run without the
GIL, and across processes when created with ``shared=True``):

    MultiQueue      relaxed concurrent priority queue (Rihani, Sanders, Dementiev 2015)
    QueueFull       raised when every queue of a MultiQueue is full
    MultiCounter    relaxed scalable counter (Alistarh et al., SPAA 2018)

Relaxed schedulers and the greedy algorithms on them (Alistarh et al., PODC 2018):

    greedy_mis, greedy_matching          exactly the sequential greedy answer, in parallel
    ExactScheduler, MultiQueueScheduler, KRelaxedScheduler
    sequential_greedy_mis, sequential_greedy_matching   Numba baselines
    as_graph, graphs                     graph input and generators (relaxed.graphs)

Transactions and conflicts:

    TL2, TransactionAborted   TL2 STM over int64 words, global or MultiCounter clock
    conflict                  ski-rental delay policies and their simulator

Shared memory:

    Segment         a named POSIX shared-memory block or private memory (relaxed.shm)

Example::

    from relaxed import MultiQueue
    mq = MultiQueue(1_000_000, n_queues=8, shared=True, seed=0)
    mq.push_many(keys, values)          # nogil
    keys, values = mq.pop_many(1000)    # nogil, a few smallest-ish
"""
import sys as _sys

if not _sys.platform.startswith("linux"):           # before anything that would half-work
    raise ImportError(
        f"relaxed-sgd-kit supports Linux only (x86-64 tested; it needs POSIX shared memory "
        f"in /dev/shm and the fork start method), and this is {_sys.platform!r}. On macOS or "
        "Windows run it in a Linux container or VM (e.g. Docker with --shm-size=2g).")

from relaxed.shm import Segment
from relaxed._multiqueue import MultiQueue, QueueFull
from relaxed._multicounter import MultiCounter
from relaxed._sched import ExactScheduler, KRelaxedScheduler, MultiQueueScheduler, Scheduler
from relaxed._stm import TL2, TransactionAborted
from relaxed import conflict, graphs
from relaxed.graphs import Graph, as_graph
from relaxed.greedy import (greedy_matching, greedy_mis, sequential_greedy_matching,
                            sequential_greedy_mis)

__all__ = ["MultiQueue", "QueueFull", "MultiCounter", "Segment",
           "Scheduler", "ExactScheduler", "MultiQueueScheduler", "KRelaxedScheduler",
           "TL2", "TransactionAborted", "conflict",
           "graphs", "Graph", "as_graph", "greedy_mis", "greedy_matching",
           "sequential_greedy_mis", "sequential_greedy_matching"]
__version__ = "0.1.0"
