"""Communication hooks for ``torch.nn.parallel.DistributedDataParallel``: gradient
compression with error feedback, and eager-SGD's partial allreduce (solo, majority),
registered with ``model.register_comm_hook(state, hook)`` in an unchanged DDP
training loop (CPU; the gloo backend, or any process group that gathers).

DDP hands a hook one *bucket* at a time (a flat tensor holding the local gradients of
a few parameters) and expects a ``torch.futures.Future`` of the tensor that replaces
them, the mean over the ranks in DDP's own allreduce. The state object is what
persists between steps (DDP's ``PowerSGDState`` keeps its error-feedback residuals per
bucket the same way: torch ``distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py``).

* :func:`compression_hook` with :class:`CompressionState`: each rank compresses its
  bucket with one of the kit's compressors (:mod:`sgd_shm.compress`: ``TopK``,
  ``RandomK``, ``ThresholdTopK`` (Deep Gradient Compression's sampled threshold),
  ``QSGD``, or a subclass of your own; or a spec such as ``"topk:0.001"``) through
  its per-bucket :class:`~sgd_shm.compress.ErrorFeedback` memory (what was not sent
  is added to the next gradient: Seide et al. 2014; Karimireddy et al. 2019). The
  messages are sparse and their indices differ between ranks, so they travel by an
  allgather of (indices, values) through the process group (as GRACE does: Xu et
  al., ICDCS 2021, github.com/sands-lab/grace), and every rank adds the decoded
  messages, each divided by the world size, in rank order: the result is the mean
  over ranks, as DDP's allreduce gives, and the same bits on every rank.
  Compressors whose messages always hold the same number of entries (TopK, RandomK,
  Dense) need one allgather per bucket; the others (the threshold, QSGD, a user's)
  first gather the counts. ``momentum=`` compresses a per-bucket velocity instead of
  the gradient (Deep Gradient Compression's momentum correction, Lin et al., ICLR
  2018), for an optimizer without momentum.
* :func:`partial_allreduce_hook` with :class:`PartialAllreduceState`: the bucket is
  reduced by one of the kit's communicators (:mod:`sgd_shm.collectives`:
  ``ShmGroup`` for processes on one box, ``MPICommunicator`` across boxes) as a
  ``"solo"`` round (closed by the first rank to arrive), a ``"majority"`` round
  (closed by a drawn initiator) or a ``"sync"`` allreduce (all ranks), with the
  communicator's late policy: a gradient that misses its round is dropped or carried
  into the rank's next contribution (``late=``). Eager-SGD: Li, Ben-Nun, Di
  Girolamo, Alistarh, Hoefler, "Taming unbalanced training workloads in deep
  learning with partial collective operations", PPoPP 2020 (arXiv:1908.04207). Every
  rank passes through every round and gets every round's result, so the replicas
  stay identical; a rank that is late gets the round's result at once. The state
  records each round's contributors (``state.rounds``), as the round reports them.

Both hooks reduce the first ``start_iter`` iterations (2 by default) with DDP's own
mean allreduce: DDP may rebuild its buckets after the first iteration, and a memory
or a communicator belongs to one bucket layout (PowerSGD's ``start_powerSGD_iter``
has the same lower bound for the same reason).

Example (each of P processes, after ``dist.init_process_group("gloo", ...)``)::

    from torch.nn.parallel import DistributedDataParallel as DDP
    from sgd_shm.torch.hooks import CompressionState, compression_hook

    model = DDP(net)
    model.register_comm_hook(CompressionState("topk:0.01"), compression_hook)
    for x, y in loader:                    # the usual loop, unchanged
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    # or eager-SGD's solo allreduce over shared memory:
    state = PartialAllreduceState("solo", late="carry")
    model.register_comm_hook(state, partial_allreduce_hook)
    ...
    state.close()                          # releases the shared segments
"""
from __future__ import annotations

import copy

import numpy as np
import torch
import torch.distributed as dist

from sgd_shm.collectives.base import AVERAGE, KINDS, LATE, CollectiveError, check_timeout
from sgd_shm.compress import Dense, RandomK, TopK, make_compressor
from sgd_shm.core.validation import check_bool, check_choice, check_int, check_momentum

__all__ = ["BACKENDS", "CompressionState", "PartialAllreduceState", "compression_hook",
           "partial_allreduce_hook"]

BACKENDS = ("shm", "mpi")
#: integer types as wide as each supported float: indices travel bit-cast into the
#: bucket's own dtype, so one tensor carries a message
_INDEX = {torch.float32: np.int32, torch.float64: np.int64}
#: compressors whose messages on n weights always hold the same number of entries
_FIXED = (TopK, RandomK, Dense)


# ---- what both hooks share -----------------------------------------------------------
def _check_state(state, cls, hook):
    if not isinstance(state, cls):
        raise TypeError(f"{hook}: state must be a sgd_shm.torch.hooks.{cls.__name__}, "
                        f"got {type(state).__name__}; register it as "
                        f"model.register_comm_hook({cls.__name__}(...), {hook})")


def _bucket_arrays(bucket, hook):
    """The bucket's flat tensor and a numpy view of it (the same memory)."""
    t = bucket.buffer()
    if t.device.type != "cpu":
        raise ValueError(f"{hook}: the bucket is on {t.device}; the kit's compressors and "
                         "communicators work on CPU memory: train on the CPU (gloo)")
    if t.dtype not in _INDEX:
        raise TypeError(f"{hook}: gradients must be float32 or float64, got {t.dtype}; "
                        "train the model in float32 (model.float())")
    return t, t.detach().numpy()


def _group(pg):
    """(process group, this rank in it, its size)."""
    pg = pg if pg is not None else dist.group.WORLD
    return pg, dist.get_rank(pg), dist.get_world_size(pg)


def _allreduce_mean(pg, t):
    """DDP's own reduction (torch ``default_hooks.allreduce_hook``): divide by the
    world size, sum by allreduce."""
    pg, _, size = _group(pg)
    t.div_(size)
    return dist.all_reduce(t, group=pg, async_op=True).get_future().then(
        lambda fut: fut.value()[0])


def _check_start_iter(start_iter):
    return check_int("start_iter", start_iter, lo=0)


class _Iterations:
    """An iteration counter that DDP's buckets advance: the last bucket of a backward
    pass ends its iteration."""
    iteration = 0

    def _advance(self, bucket):
        if bucket.is_last():
            self.iteration += 1


# ---- compression ---------------------------------------------------------------------
class CompressionState(_Iterations):
    """CompressionState(compress, *, error_feedback=None, momentum=0.0,
    process_group=None, start_iter=2, record=False)

    The state of :func:`compression_hook`: the compressor and each bucket's memory.

    compress : a :class:`sgd_shm.compress.Compressor` (``TopK(ratio=0.001)``,
        ``RandomK``, ``ThresholdTopK``, ``QSGD``, ``Dense``, a subclass of your own)
        or a spec: "topk:RATIO", "randomk:RATIO", "threshold:RATIO", "qsgd:LEVELS",
        "dense".
    error_feedback [None] : True / False overrides the compressor's own setting
        (TopK, RandomK and the threshold keep a residual by default; QSGD does not).
    momentum [0.0] : Deep Gradient Compression's momentum correction (Lin, Han, Mao,
        Wang, Dally, ICLR 2018): each rank keeps a velocity per bucket, u = momentum *
        u + g, and compresses u (through the memory) instead of g; the entries sent
        are zeroed in u too (momentum factor masking). Pair it with an optimizer
        *without* momentum: the hook has applied it. A momentum optimizer after a
        sparse hook instead multiplies every entry a residual releases late.
    process_group [None] : the group the messages travel in (None: the default one).
    start_iter [2] : iterations reduced by DDP's own allreduce before compression
        starts (see the module notes).
    record [False] : keep, per compressed bucket, copies of the local gradient
        (``input``), the decoded message sent (``sent``), the residual after it
        (``residual``), the velocity after masking (``velocity``, with momentum) and
        the bucket's result (``output``) in ``log``: for checks, not for long runs.

    Attributes: ``compressor``, ``momentum``, ``velocities`` (bucket index -> u, with
    momentum), ``memories`` (bucket index -> ErrorFeedback; random
    compressors draw from the stream (seed, rank + size * bucket)), ``iteration``,
    ``bytes_sent`` (this rank's messages: indices and values), ``bytes_dense`` (what
    its dense buckets would have been), ``log``.
    """

    def __init__(self, compress, *, error_feedback=None, momentum=0.0, process_group=None,
                 start_iter=2, record=False):
        comp = make_compressor(compress)
        if comp is None:
            raise ValueError("compress: expected a compressor or a spec such as "
                             "'topk:0.001', got None; leave the hook out for plain "
                             "allreduce")
        if error_feedback is not None:
            comp = copy.copy(comp)
            comp.error_feedback = check_bool("error_feedback", error_feedback)
        self.compressor = comp
        self.momentum = check_momentum(momentum)
        self.velocities = {}
        self.process_group = process_group
        self.start_iter = _check_start_iter(start_iter)
        self.memories = {}
        self.bytes_sent = self.bytes_dense = 0
        self.log = [] if check_bool("record", record) else None

    def __repr__(self):
        return (f"CompressionState({self.compressor!r}, iteration={self.iteration}, "
                f"buckets={len(self.memories)})")

    def memory(self, index, n, dtype, rank, size):
        """Bucket ``index``'s memory (made on first use)."""
        mem = self.memories.get(index)
        if mem is None:
            mem = self.compressor.memory(n, dtype, stream=rank + size * index)
            self.memories[index] = mem
        elif mem.n != n:
            raise ValueError(
                f"compression_hook: bucket {index} holds {n} gradients, its memory {mem.n}: "
                f"DDP rebuilt its buckets after compression started (iteration "
                f"{self.iteration}); raise start_iter (got {self.start_iter})")
        return mem

    def exchange(self, index, t, g):
        """Compress bucket ``index`` (tensor t, numpy view g) and start the allgather;
        a future of t holding the mean of the decoded messages."""
        pg, rank, size = _group(self.process_group)
        mem = self.memory(index, g.size, g.dtype, rank, size)
        before = g.copy() if self.log is not None else None
        u = self._velocity(index, g)
        msg = mem.step(g if u is None else u)
        if u is not None:
            u[msg.indices] = 0                # momentum factor masking (DGC)
        vals = msg.values * msg.scale if msg.scale != 1.0 else msg.values
        vals = np.asarray(vals, dtype=g.dtype)            # decoded, in the bucket's type
        m = msg.indices.size
        if type(self.compressor) in _FIXED:
            counts = [m] * size                            # the same on every rank
        else:
            counts = _gather_counts(pg, m, size)
        wire = _encode(msg.indices, vals, max(counts), t.dtype)
        parts = [torch.empty_like(wire) for _ in range(size)]
        self.bytes_sent += 2 * m * g.itemsize
        self.bytes_dense += g.nbytes
        entry = None
        if self.log is not None:
            sent = np.zeros_like(g)
            sent[msg.indices] = vals
            entry = {"iteration": self.iteration, "bucket": index, "input": before,
                     "sent": sent, "residual": mem.residual.copy()}
            if u is not None:
                entry["velocity"] = u.copy()
            self.log.append(entry)
        fut = dist.all_gather(parts, wire, group=pg, async_op=True).get_future()
        return fut.then(lambda f: _decode(f, parts, counts, t, g, entry))


    def _velocity(self, index, g):
        """With momentum: bucket ``index``'s velocity u = momentum * u + g (what the
        memory then accumulates), else None."""
        if not self.momentum:
            return None
        u = self.velocities.get(index)
        if u is None:
            u = self.velocities[index] = np.zeros_like(g)
        u *= self.momentum
        u += g
        return u


def _gather_counts(pg, m, size):
    """Every rank's message length (one small allgather)."""
    mine = torch.tensor([m], dtype=torch.int64)
    out = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(out, mine, group=pg)
    return [int(c.item()) for c in out]


def _encode(indices, values, width, dtype):
    """One tensor of 2 * width elements of ``dtype``: the indices (bit-cast into the
    float type: an allgather copies bytes, it does not do arithmetic on them), then the
    values, each padded to width."""
    itype = _INDEX[dtype]
    buf = np.zeros(2 * max(width, 1), dtype=values.dtype)
    m = indices.size
    buf[:m] = indices.astype(itype).view(values.dtype)
    w = buf.size // 2
    buf[w:w + m] = values
    return torch.from_numpy(buf)


def _decode(fut, parts, counts, t, g, entry=None):
    """t (g, its numpy view) = the sum over ranks, in rank order, of each decoded
    message divided by the world size (recorded in ``entry``, a log entry, if any)."""
    fut.wait()                                   # raises the allgather's error, if any
    size = len(parts)
    itype = _INDEX[t.dtype]
    g[:] = 0
    for part, m in zip(parts, counts):
        a = part.numpy()
        w = a.size // 2
        idx = a[:m].view(itype)
        g[idx] += a[w:w + m] / size              # indices are distinct within a message
    if entry is not None:
        entry["output"] = g.copy()
    return t


def compression_hook(state, bucket):
    """DDP communication hook: the bucket's gradients compressed through the state's
    per-bucket error-feedback memory, allgathered as (indices, values), decoded and
    averaged over the ranks (see :class:`CompressionState` and the module notes)."""
    _check_state(state, CompressionState, "compression_hook")
    t, g = _bucket_arrays(bucket, "compression_hook")
    if state.iteration < state.start_iter:
        fut = _allreduce_mean(state.process_group, t)
    else:
        fut = state.exchange(bucket.index(), t, g)
    state._advance(bucket)
    return fut


# ---- partial allreduce (eager-SGD) ---------------------------------------------------
class PartialAllreduceState(_Iterations):
    """PartialAllreduceState(kind="solo", *, late="drop", average="size", backend="shm",
    depth=8, seed=0, timeout=120.0, process_group=None, mpi_comm=None, start_iter=2,
    record=False)

    The state of :func:`partial_allreduce_hook`: one kit communicator per DDP bucket.

    kind ["solo"] : "solo" (the first rank to arrive closes each round), "majority"
        (the round's initiator, drawn from ``seed``, closes it) or "sync" (every rank:
        a plain allreduce).
    late ["drop"], average ["size"] : a gradient that misses its round is dropped (as
        fflib2) or carried into the rank's next contribution; the mean divides by the
        world size (as fflib2 and DDP) or by the round's contributors.
    backend ["shm"] : "shm" (one :class:`~sgd_shm.collectives.ShmGroup` per bucket:
        processes on one box; rank 0 creates it and the others attach, through the
        process group, at the first compressed iteration) or "mpi" (one
        :class:`~sgd_shm.collectives.MPICommunicator` per bucket over ``mpi_comm``,
        default COMM_WORLD, whose ranks must be the process group's).
    depth [8] : rounds a rank may run ahead of the slowest before it waits.
    seed [0] : draws each majority round's initiator (the same on every rank).
    timeout [120.0] : seconds a round may wait before ``CollectiveTimeout`` (None: no
        limit); a rank that died is reported as ``RankFailure`` without waiting it out.
    process_group [None] : the DDP process group (None: the default one).
    start_iter [2] : iterations reduced by DDP's own allreduce first (module notes).
    record [False] : also keep copies of each round's input (the bucket this rank
        handed in) and output (the round's mean) in ``rounds``: for checks.

    Attributes: ``rounds`` (per round of this rank, in order: ``bucket``,
    ``iteration``, ``round`` (the communicator's id), ``contributors`` (the ranks
    whose gradients are in the result), ``contributed`` (this rank among them)),
    ``iteration``. :meth:`close` releases the communicators and, on the shm backend,
    the shared segments (rank 0 owns them; if rank 0 died, the others unlink them);
    the state is a context manager.
    """

    def __init__(self, kind="solo", *, late="drop", average="size", backend="shm", depth=8,
                 seed=0, timeout=120.0, process_group=None, mpi_comm=None, start_iter=2,
                 record=False):
        self.kind = check_choice("kind", kind, KINDS)
        self.late = check_choice("late", late, LATE)
        self.average = check_choice("average", average, AVERAGE)
        self.backend = check_choice("backend", backend, BACKENDS)
        self.depth = check_int("depth", depth)
        self.seed = check_int("seed", seed, lo=0, hi=2 ** 63 - 1)
        self.timeout = check_timeout("timeout", timeout)
        if mpi_comm is not None and self.backend != "mpi":
            raise ValueError("mpi_comm: an MPI communicator needs backend='mpi'")
        self.process_group, self.mpi_comm = process_group, mpi_comm
        self.start_iter = _check_start_iter(start_iter)
        self.record = check_bool("record", record)
        self.comms = {}               # bucket index -> communicator
        self._groups = []             # ShmGroups this rank holds (rank 0 owns them)
        self.rounds = []
        self.closed = False

    def __repr__(self):
        return (f"PartialAllreduceState(kind={self.kind!r}, late={self.late!r}, backend="
                f"{self.backend!r}, iteration={self.iteration}, buckets={len(self.comms)})")

    def communicator(self, index, n, dtype):
        """Bucket ``index``'s communicator (made on first use: collective, every rank
        makes it at the same bucket)."""
        if self.closed:
            raise CollectiveError("partial_allreduce_hook: the state is closed; make a new "
                                  "PartialAllreduceState for a new run")
        comm = self.comms.get(index)
        if comm is None:
            comm = self._make(n, dtype)
            self.comms[index] = comm
        elif comm.n != n:
            raise ValueError(
                f"partial_allreduce_hook: bucket {index} holds {n} gradients, its "
                f"communicator {comm.n}: DDP rebuilt its buckets after the partial rounds "
                f"started (iteration {self.iteration}); raise start_iter (got "
                f"{self.start_iter})")
        return comm

    def _make(self, n, dtype):
        pg, rank, size = _group(self.process_group)
        kw = dict(late=self.late, average=self.average, timeout=self.timeout)
        if self.backend == "mpi":
            from sgd_shm.collectives.mpi import MPICommunicator
            comm = MPICommunicator(n, dtype, comm=self.mpi_comm, depth=self.depth,
                                   seed=self.seed, **kw)
            if (comm.rank, comm.size) != (rank, size):
                comm.close()
                raise ValueError(f"mpi_comm: its rank {comm.rank} of {comm.size} differs "
                                 f"from the process group's {rank} of {size}; pass the MPI "
                                 "communicator whose ranks are DDP's")
            return comm
        import os

        from sgd_shm.collectives.shm import ShmGroup
        box = [(ShmGroup(size, n, dtype, depth=self.depth, seed=self.seed, **kw), os.getpid())
               if rank == 0 else None]
        dist.broadcast_object_list(box, src=dist.get_global_rank(pg, 0), group=pg)
        group, owner = box[0]           # the others attached by name while unpickling
        self._groups.append((group, owner))
        comm = group.communicator(rank)
        dist.barrier(group=pg)          # all attached before rank 0 may unlink
        return comm

    def reduce(self, index, t, g):
        """Bucket ``index``'s round: g (t's numpy view) becomes the round's mean."""
        comm = self.communicator(index, g.size, g.dtype)
        before = g.copy() if self.record else None
        try:
            res = comm.start(g, self.kind, "mean").wait()
        except CollectiveError as e:
            raise type(e)(f"partial_allreduce_hook, bucket {index}, iteration "
                          f"{self.iteration}: {e}") from e
        rec = {"bucket": index, "iteration": self.iteration, "round": res.round,
               "contributors": res.contributors, "contributed": res.contributed}
        if self.record:
            rec.update(input=before, output=g.copy())
        self.rounds.append(rec)
        fut = torch.futures.Future()
        fut.set_result(t)
        return fut

    def close(self):
        """Close every communicator (in bucket order: an MPI close is collective) and
        release the shared segments."""
        if self.closed:
            return
        self.closed = True
        try:
            for index in sorted(self.comms):
                self.comms[index].close()
        finally:
            for group, owner in self._groups:
                _release(group, owner)
            self._groups = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _release(group, owner):
    """Close a ShmGroup: the owner's close unlinks it; another rank unlinks it too when
    the owner died (killed: its segments would stay until the resource tracker that
    it shares with its siblings exits, with the parent of the whole run)."""
    from relaxed.shm import unlink_orphan
    from sgd_shm.core.launcher import pid_alive
    name, mine = group.name, group.owner
    group.close()
    if not mine and not pid_alive(owner):
        unlink_orphan(name)


def partial_allreduce_hook(state, bucket):
    """DDP communication hook: the bucket reduced by the state's ``kind`` of round
    (solo, majority, sync) on the kit's communicator for it; the result is the mean
    of the round's contributions (see :class:`PartialAllreduceState`)."""
    _check_state(state, PartialAllreduceState, "partial_allreduce_hook")
    t, g = _bucket_arrays(bucket, "partial_allreduce_hook")
    if state.iteration < state.start_iter:
        fut = _allreduce_mean(state.process_group, t)
    else:
        fut = state.reduce(bucket.index(), t, g)
    state._advance(bucket)
    return fut
