"""The MPI half of ``python -m bench eager``, run under mpiexec by bench/eager.py:

    mpiexec -n P python -m bench.eager_mpi SIZES_MB ROUNDS SMALL_ROUNDS

Times, per buffer size, the kit's MPICommunicator allreduce (its progress thread
included) and a bare ``comm.Allreduce`` of the same float64 buffer; then the round
latency of an 8-element buffer for sync, solo and majority. Rank 0 prints one JSON
line: {"sizes": {MB: {"kit": s, "bare": s}}, "small": {kind: s}} (medians per round).
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np


def _timed(comm, fn, rounds):
    ts = []
    for _ in range(rounds):
        comm.Barrier()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main(argv):
    from mpi4py import MPI

    from sgd_shm.collectives.mpi import MPICommunicator
    sizes = argv[0].split(",")
    rounds, small_rounds = int(argv[1]), int(argv[2])
    world = MPI.COMM_WORLD
    out = {"sizes": {}, "small": {}}
    for mb in sizes:
        n = int(float(mb) * 2**20) // 8
        buf = np.zeros(n)
        bare = _timed(world, lambda: world.Allreduce(MPI.IN_PLACE, buf), rounds)
        with MPICommunicator(n, comm=world) as c:
            c.allreduce(buf)                                   # warm-up
            kit = _timed(world, lambda: c.allreduce(buf), rounds)
        out["sizes"][mb] = {"kit": kit, "bare": bare}
    small = np.zeros(8)
    with MPICommunicator(8, comm=world) as c:
        for kind in ("sync", "solo", "majority"):
            for _ in range(20):
                c.start(small, kind).wait()                   # warm-up
            t = time.perf_counter()
            for _ in range(small_rounds):
                c.start(small, kind).wait()
            out["small"][kind] = (time.perf_counter() - t) / small_rounds
        world.Barrier()
    bare = np.zeros(8)
    t = time.perf_counter()
    for _ in range(small_rounds):
        world.Allreduce(MPI.IN_PLACE, bare)
    out["small"]["bare"] = (time.perf_counter() - t) / small_rounds
    if world.Get_rank() == 0:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
