"""Multi-process DDP runs for tests/test_torch_hooks.py: P processes on this box, the
gloo backend over a free TCP port, one small model trained by an unchanged DDP loop
with or without one of sgd_shm.torch.hooks' hooks.

The ranks come from :func:`sgd_shm.torch.ranks.run_local` (a forkserver that has
imported torch once). Every rank sends back ("ok", its result) or ("error", the
exception's type name, its message); :func:`launch` waits for all of them up to a
deadline and kills the ranks it started that are still alive after it.
"""
import os
import time
from datetime import timedelta

import numpy as np

from sgd_shm.torch.ranks import free_port, run_local

def launch(size, cfg, timeout=90.0):
    """Run :func:`train` on ``size`` ranks with ``cfg``
    (:func:`sgd_shm.torch.ranks.run_local`); {rank: ("ok", result) or ("error", type
    name, message)}. A rank that sent nothing by the deadline (or died) is absent."""
    return run_local(train, size, cfg, preload=["sgd_shm.torch.hooks"], timeout=timeout,
                     destroy=cfg.get("destroy", True))


def make_net(cfg):
    """The test network: the same weights on every rank (seeded)."""
    import torch
    from torch import nn
    torch.manual_seed(cfg.get("init_seed", 0))
    width = cfg.get("width", 32)
    return nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width),
                         nn.ReLU(), nn.Linear(width, 5))


def make_state(cfg):
    """The hook's state named by cfg["hook"] (None: no hook)."""
    from sgd_shm.torch import hooks
    kind = cfg.get("hook")
    if kind is None:
        return None, None
    if kind == "compress":
        return hooks.CompressionState(cfg["compress"], record=True,
                                      **cfg.get("state", {})), hooks.compression_hook
    return hooks.PartialAllreduceState(kind, record=True, **cfg.get("state", {})), \
        hooks.partial_allreduce_hook


def flat_params(module):
    import torch
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy().copy()


def train(rank, size, cfg):
    """cfg["steps"] steps of SGD on rank-seeded random minibatches in the plain DDP loop
    (zero_grad, forward, backward, step). cfg: hook (None | "compress" | a partial
    kind), compress, state (keywords of the state), bucket_cap_mb, lr, die_at
    ((rank, step): that rank exits there), hang_at (likewise: it sleeps hang_s
    seconds, then exits), sleep ({step: {rank:
    seconds}}: a rank's pause before its step). Returns the final weights, the
    buckets' sizes and the state's records."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    net = make_net(cfg)
    model = DDP(net, bucket_cap_mb=cfg.get("bucket_cap_mb"))
    state, hook = make_state(cfg)
    sizes = []
    if hook is not None:
        model.register_comm_hook(state, _spy(hook, sizes))
    opt = torch.optim.SGD(model.parameters(), lr=cfg.get("lr", 0.1))
    gen = torch.Generator().manual_seed(1000 + rank)
    try:
        for step in range(cfg["steps"]):
            if cfg.get("die_at") == (rank, step):
                os._exit(3)
            if cfg.get("hang_at") == (rank, step):
                time.sleep(cfg.get("hang_s", 10.0))      # alive, silent; then gone
                os._exit(0)
            pause = cfg.get("sleep", {}).get(step, {}).get(rank, 0.0)
            if pause:
                time.sleep(pause)
            x = torch.randn(cfg.get("batch", 8), 16, generator=gen)
            y = torch.randint(0, 5, (x.shape[0],), generator=gen)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return {"w": flat_params(net), "sizes": sizes, "log": getattr(state, "log", None),
                "rounds": getattr(state, "rounds", None),
                "residuals": {i: m.residual.copy() for i, m in
                              getattr(state, "memories", {}).items()}}
    finally:
        if hasattr(state, "close"):
            state.close()


def _spy(hook, sizes):
    """The hook, noting (iteration, bucket index, bucket length) of every call."""
    def spied(state, bucket):
        sizes.append((state.iteration, bucket.index(), bucket.buffer().numel()))
        return hook(state, bucket)
    return spied


def contributions(res, bucket):
    """(inputs, outputs, masks) of one bucket's partial rounds, from every rank's
    records: inputs[k][r] what rank k handed to its r-th round of the bucket."""
    size = len(res)
    recs = [[x for x in res[k]["rounds"] if x["bucket"] == bucket] for k in range(size)]
    masks = [sum(1 << c for c in x["contributors"]) for x in recs[0]]
    inputs = [[np.asarray(x["input"], np.float64) for x in recs[k]] for k in range(size)]
    outputs = [[x["output"] for x in recs[k]] for k in range(size)]
    return inputs, outputs, masks, recs


def mpi_main(kind, late):
    """Under ``mpiexec -n P``: :func:`train` with the partial hook on the MPI backend
    (the gloo group's port comes from MPI rank 0); rank 0 prints each rank's records
    as one pickle file's path, then "OK mpi"."""
    import pickle
    import tempfile

    import torch
    import torch.distributed as dist
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    port = world.bcast(free_port() if rank == 0 else None, root=0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=timedelta(seconds=60))
    cfg = dict(steps=8, bucket_cap_mb=0.002, hook=kind, sleep={3: {1: 0.4}, 5: {0: 0.3}},
               state={"late": late, "backend": "mpi", "timeout": 60.0})
    res = train(rank, size, cfg)
    out = world.gather(res, root=0)
    dist.destroy_process_group()
    if rank == 0:
        with tempfile.NamedTemporaryFile("wb", suffix=".pkl", delete=False) as f:
            pickle.dump(out, f)
        print(f"RESULT {f.name}")
        print("OK mpi", flush=True)


if __name__ == "__main__":
    import sys
    mpi_main(sys.argv[1], sys.argv[2])


def exits(rank, size, exit_rank):
    """For tests/test_torch_ranks.py: rank ``exit_rank`` dies (os._exit) without a
    word; the others return their rank."""
    if rank == exit_rank:
        os._exit(3)
    return rank


def sum_of_ranks(rank, size, fail_rank=None):
    """For tests/test_torch_ranks.py: an allreduce of each rank's number (rank + 1);
    ``fail_rank`` raises a ValueError instead of joining."""
    import torch
    import torch.distributed as dist
    if rank == fail_rank:
        raise ValueError(f"rank {rank} fails on purpose")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return (rank, dist.get_world_size(), float(t.item()))
