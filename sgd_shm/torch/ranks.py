"""Run a function on P local ranks of one ``torch.distributed`` gloo group.

``run_local(fn, size, *args)`` starts ``size`` processes on this machine, joins them in
one gloo process group over a free TCP port on 127.0.0.1, calls ``fn(rank, size, *args)``
on each and gathers what every rank returned (or the exception it raised). It is what
``torch.multiprocessing.spawn`` does, with two differences a DDP experiment on one box
wants: the ranks come from a forkserver that has imported torch (and ``preload``) once,
so a rank starts in well under a second instead of re-importing torch (forking a
process that has already run torch's thread pools is unsafe); and every rank's result
comes back to the caller, while a rank that dies or hangs costs at most ``timeout``
seconds, after which the ranks still alive are killed.

Example::

    from sgd_shm.torch.ranks import run_local, ok
    def work(rank, size, steps):          # a module-level function (pickled by name)
        ...                               # an unchanged DDP loop
        return final_accuracy
    results = ok(run_local(work, 2, 100))    # [rank 0's, rank 1's]
"""
from __future__ import annotations

import multiprocessing
import queue
import socket
import time
import traceback
from datetime import timedelta

#: what every rank's forkserver imports once: torch, its process groups, and DDP
#: (whose constructor imports torch._dynamo: seconds per rank otherwise)
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_local(fn, size, *args, preload=(), timeout=900.0, group_timeout=60.0,
              threads=1, destroy=True):
    """``fn(rank, size, *args)`` on ``size`` local ranks of one gloo group.

    Returns ``{rank: ("ok", result) | ("error", type name, message with traceback)}``;
    a rank that sent nothing within ``timeout`` seconds (it died or hangs) is absent,
    and every rank still alive then is killed. ``fn`` and ``args`` are pickled (``fn``
    by name: define it at module level); ``fn``'s module joins ``preload`` in the
    forkserver. ``group_timeout``: seconds a collective may wait for a missing rank
    before gloo gives up; ``threads``: torch's intra-op threads per rank (1: ranks on
    a few cores do not oversubscribe them); ``destroy``: end the process group after
    ``fn`` returns (False for a run whose ranks may be gone: destroying waits for them).
    """
    if not callable(fn):
        raise TypeError(f"fn must be a callable, got {type(fn).__name__}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"size must be an int >= 1 (the number of ranks), got {size!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    ctx = multiprocessing.get_context("forkserver")
    mods = list(dict.fromkeys([*PRELOAD, *preload, fn.__module__]))
    ctx.set_forkserver_preload([m for m in mods if m != "__main__"])
    q = ctx.Queue()
    port = free_port()
    setup = (port, group_timeout, threads, destroy)
    procs = [ctx.Process(target=_rank_main, args=(r, size, setup, fn, args, q), daemon=True)
             for r in range(size)]
    for p in procs:
        p.start()
    return _gather(procs, q, size, time.monotonic() + timeout)


class RankResults(dict):
    """:func:`run_local`'s ``{rank: outcome}``, knowing how many ranks ran (``size``),
    so that :func:`ok` tells a rank that sent nothing even when it was the last one."""

    def __init__(self, size):
        super().__init__()
        self.size = size


def _gather(procs, q, size, deadline):
    """The ranks' messages until all have sent one, all have died, or the deadline;
    then the ranks are joined (killed if still alive)."""
    out = RankResults(size)
    try:
        while len(out) < size and time.monotonic() < deadline:
            try:
                msg = q.get(timeout=0.2)
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and q.empty():
                    break
                continue
            out[msg[0]] = msg[1:]
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
            if p.is_alive():
                p.kill()
                p.join(5.0)
        q.close()
    return out


def _rank_main(rank, size, setup, fn, args, q):
    import torch
    import torch.distributed as dist
    port, group_timeout, threads, destroy = setup
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=timedelta(seconds=group_timeout))
    try:
        q.put((rank, "ok", fn(rank, size, *args)))
    except BaseException as e:          # the caller reads the error from the result
        q.put((rank, "error", type(e).__name__, f"{e}\n{traceback.format_exc()}"))
    finally:
        if destroy:
            dist.destroy_process_group()


def ok(results, size=None, what="a run"):
    """The ranks' results in rank order, from :func:`run_local`'s dict; RuntimeError
    naming the rank and its traceback if one failed, or the ranks that sent nothing.
    ``size``: the ranks that ran (default: the run's own count; a plain dict gives
    none, and then its largest rank + 1 is all that can be told)."""
    if size is None:
        size = getattr(results, "size", None)
    if size is None:
        size = max(results, default=-1) + 1
    for r in sorted(results):
        if results[r][0] == "error":
            raise RuntimeError(f"rank {r} of {what} failed: {results[r][1]}: {results[r][2]}")
    missing = sorted(set(range(size)) - set(results))
    if missing:
        raise RuntimeError(f"{what}: ranks {missing} sent nothing before the deadline "
                           "(died or hung)")
    return [results[r][1] for r in range(size)]
