"""A parameter store in shared memory: sharded weights with version counters.

The layer under the parameter server (issue: SaPS, BSP/ASP/SSP): worker processes
``pull`` the weights with the global version they saw and ``push`` gradients
computed from them, in the style of ps-lite's few verbs. Everything lives in one
:class:`relaxed.shm.Segment`:

* weights (``dtype``: float64, or float32 for a model that computes in it, e.g. a
  torch module), cut into ``n_shards`` contiguous shards;
* per shard, in its own cache line: a version counter bumped by every update
  applied to it, and a lock word holding the pid of the process applying one
  (0 when free);
* a global version: the number of pushes applied in full, and in the same line a
  *slack* word: how many pushes may have skipped a shard (sparse pushes touch only
  the shards their indices hit, so a shard's version may lag the global version by
  at most the slack);
* per worker, in cache lines of its own: the version it last pulled, its pushes,
  its compute time, a heartbeat and a status word, the sum of the staleness of
  its pushes (global version at push minus version pulled), how many shard
  updates it deferred, what the training driver counts (pushes dropped,
  minibatches stolen, slow spells), the bytes its pushes sent (``bytes_sent``: a
  dense push counts the weights' bytes, 8 per weight in float64 and 4 in float32, a
  compressed one its message's size) and would have sent dense (``bytes_dense``: the
  weights' bytes per push), and the sum
  of the scales its pushes were applied with. Straggler detection reads these
  slots;
* per worker, a histogram of the staleness of its pushes in log2 bins: bin 0
  counts staleness 0, bin i >= 1 counts [2**(i-1), 2**i), the last bin
  everything above.

A worker's slot and histogram are written by that worker's pushes (and the
coordinator's status word): one process per worker id.

A push that finds a shard locked waits by a :class:`WaitPolicy`: spin, then
yield, then give up and *defer* that shard's update (it is returned to the
caller, who retries it later with :meth:`ParameterStore.push_deferred`), so a
slow or stuck holder never stalls the pusher for long. A lock held by a
process that died is taken over (its partial update stays, as in Hogwild; the
shard's version is not bumped for it).

Example::

    from sgd_shm.ps import ParameterStore
    store = ParameterStore(1000, n_shards=8, n_workers=4)   # shared=True: pickles
    w, v = store.pull(worker=0)
    res = store.push(grad, v, lr=0.1, worker=0)              # res.deferred: shards left
    res = store.push_sparse(idx, vals, v, lr=0.1, worker=0)  # only the shards idx hits

A *sparse push* (``push_sparse``: ascending indices and their values, e.g. a top-k
compressed gradient) locks, updates and bumps the version of only the shards its
indices fall in (ascending indices make each shard's part one contiguous run, cut in
one compiled pass over the indices against the shard bounds, which also checks
them), and counts as one push like a dense one:
the same slot counters, histogram and +1 on the global version once it is applied
in full. Its effect on the weights is exactly that of the dense push of the same
vector scattered into zeros.

A push to some shards only (``push(..., shards=[...])``: the messages to the others
were lost) applies and bumps those and counts as one push, raising the slack like a
sparse push. For model averaging (RPS) the store holds the servers' averages:
``deposited`` counts a worker's round in its slot (the blocks went to the servers'
mailbox, not into the weights), and ``publish`` writes server j's average of a round
into shard j once (the first caller) and raises the global version to the rounds
every shard has completed.

The global version's *clock* (``clock=``, see docs/parameter-server.md, "Clocks"):
``"exact"`` (the default) is the one word ``_global[0]``, a push's atomic add and a
pull's load. ``"multicounter"`` is a :class:`relaxed.MultiCounter` of
``clock_counters`` counters (default 4 per worker; in a shared segment of its own whose
name the store's header holds, so a pickled store re-attaches it; private for a
private store). Pushes (``push``, ``push_sparse``, ``push_deferred``, ``account``)
increment it, ``bump`` adds with ``increment_many``; ``version``, ``pull``, ``pulled``
and a push's staleness read its estimate (plus the offset word ``_global[2]`` that
``restore`` sets), and the staleness is clamped at 0 (two estimates may cross): each
read is within ``clock_error_bound()`` (the counter's ``error_bound()``) of
``exact_version``, so a staleness is within twice that of the exact one.
``exact_version`` (the offset plus the sum of the counters, exact at quiescence) is
what ``snapshot`` (checkpoints), ``_check`` and the coordinator read. RPS's rounds need
a monotone exact value: under this clock ``advance`` raises ``_global[0]`` as an exact
round word by CAS, and the call whose CAS moved it from a to b adds b - a to the
counter, so each round is counted once (a store counts pushes or rounds, not both).
The slack stays in ``_global[1]`` under both clocks. The exact clock's path is the
one it always was (one ``is None`` test more per verb).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from relaxed import MultiCounter
from relaxed import shm as _shm
from sgd_shm.core.atomics import (LINE_WORDS, cas_acquire, fetch_add, fetch_add_py,
                                  load_relaxed, store_release)
from sgd_shm.core.atomics import cas_py as _cas_py
from sgd_shm.core.atomics import store_release_py as _store_release_py
from sgd_shm.core.launcher import pid_alive as _pid_alive
from sgd_shm.core.status import HIST_BINS
from sgd_shm.core.validation import check_int, check_number, check_shards

KIND_PS = 4
#: int64 words per padded slot (a cache line as the compiled core pads it); a segment
#: records it, and attaching to one laid out with another stride is refused
LINE = LINE_WORDS
SLOT_FIELDS = ("pulled_version", "pushes", "compute_ns", "heartbeat_ns", "status",
               "staleness_sum", "deferred", "dropped", "stolen", "spells", "bytes_sent",
               "bytes_dense")
#: the column of each slot field (the Ray hub keeps its slots in the same layout)
SLOT_INDEX = {f: i for i, f in enumerate(SLOT_FIELDS)}
_PULLED, _PUSHES, _COMPUTE, _HEARTBEAT, _STATUS, _STALENESS, _DEFERRED = range(7)
_BYTES_SENT, _BYTES_DENSE = SLOT_INDEX["bytes_sent"], SLOT_INDEX["bytes_dense"]
#: counters of a slot that the training driver adds to (:meth:`ParameterStore.add`)
DRIVER_COUNTERS = ("staleness_sum", "dropped", "stolen", "spells")
F_APPLIED = len(SLOT_FIELDS)     # float64 slot field: sum of the scales of the pushes
#: int64 words per worker slot: its fields, padded to whole lines
SLOT = -(-(F_APPLIED + 1) // LINE) * LINE
META = _shm.HEADER_SIZE          # the store's own header (8 int64) follows the common one:
                                 # n_params, n_shards, n_workers, LINE, clock, dtype code
HEADER = 256                     # where the weights start
CLOCKS = ("exact", "multicounter")
_NAME_AT, _NAME_MAX = META + 64, HEADER - META - 64   # the clock's segment name (bytes)
_BASE = 2                        # _global[2]: the relaxed clock's offset (restore)
#: the weights' float types by their code in the header (float64 is 0, the default)
DTYPES = (np.dtype(np.float64), np.dtype(np.float32))


@dataclass(frozen=True)
class WaitPolicy:
    """How a push waits on a locked shard: ``spins`` busy polls, then ``yields``
    polls with ``os.sched_yield`` between them, then it defers the shard. Set
    ``defer=False`` to keep yielding until the lock is free (still taking over a
    lock whose holder died).

    ``conflict``: a ski-rental conflict policy (:mod:`relaxed.conflict`, or its
    name with abort cost ``B`` seconds) decides instead how long to keep yielding
    after the spins: each wait draws its delay from the policy ("deterministic":
    B; "randomized": the e/(e-1)-competitive density on [0, B]; "backoff";
    "abort": 0; "wait": forever), then defers. Deferring is the abort of this
    model: the update is kept and retried later, at about the cost B of a
    retry. Requestor-wins policies do not apply (a push cannot preempt the
    holder)."""
    spins: int = 2000
    yields: int = 50
    defer: bool = True
    conflict: object = None
    B: float = 20e-6

    def __post_init__(self):
        for name in ("spins", "yields"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"WaitPolicy.{name} must be an int >= 0, got {v!r}")
        if self.conflict is not None:
            from relaxed import conflict as _conflict
            if not isinstance(self.conflict, (str, _conflict.Policy)):
                raise TypeError("WaitPolicy.conflict: expected a relaxed.conflict policy or "
                                f"its name, got {type(self.conflict).__name__}")
            pol = _conflict.policy(self.conflict, B=float(self.B)) \
                if isinstance(self.conflict, str) else self.conflict
            if pol.home_model == "requestor-wins":
                raise ValueError(f"WaitPolicy.conflict: {pol.name!r} is a requestor-wins "
                                 "policy; a push cannot abort the shard's holder, use a "
                                 "requestor-aborts one (deterministic, randomized, backoff, "
                                 "abort, wait)")
            object.__setattr__(self, "conflict", pol)

    def budget(self):
        """Seconds to keep yielding on a held shard before deferring (None: count
        ``yields`` instead)."""
        if self.conflict is None:
            return None
        return float(self.conflict.delay(_rng()))


_RNGS = {}


def _rng():
    """This process's generator for conflict delays (a fork gets its own)."""
    pid = os.getpid()
    g = _RNGS.get(pid)
    if g is None:
        g = _RNGS[pid] = np.random.default_rng()
    return g


@dataclass
class PushResult:
    """Shards applied, shards deferred (retry them with ``push_deferred``), and
    the staleness of the push (global version at push minus version pulled)."""
    applied: list
    deferred: list
    staleness: int
    grad: np.ndarray = field(repr=False, default=None)
    lr: float = 0.0
    #: a sparse push's (ascending) indices, values and per-shard cuts into them
    indices: np.ndarray = field(repr=False, default=None)
    values: np.ndarray = field(repr=False, default=None)
    cuts: np.ndarray = field(repr=False, default=None)
    #: the global version once this push was counted (its own tick included): the
    #: push's place in the order of applied pushes (exact clock; -1 while shards are
    #: deferred, and under the relaxed clock, which counts without an order)
    version: int = -1


@njit(cache=True, nogil=True)
def _try_apply(w, grad, lo, hi, step, lock, version, pid, spins):
    """Lock the shard (CAS 0 -> pid, up to ``spins`` polls), apply
    w[lo:hi] -= step * grad[lo:hi], bump its version, unlock. 1 if applied,
    else 0 (the lock stayed held; nothing was written)."""
    for _ in range(spins + 1):
        if load_relaxed(lock, 0) == 0 and cas_acquire(lock, 0, pid):
            for i in range(lo, hi):
                w[i] -= step * grad[i]
            fetch_add(version, 1)
            store_release(lock, 0)
            return 1
    return 0


@njit(cache=True, nogil=True)
def _try_apply_sparse(w, idx, vals, a, b, step, lock, version, pid, spins):
    """The sparse :func:`_try_apply`: w[idx[a:b]] -= step * vals[a:b] under the
    shard's lock (idx[a:b] all lie in that shard), bump its version, unlock."""
    for _ in range(spins + 1):
        if load_relaxed(lock, 0) == 0 and cas_acquire(lock, 0, pid):
            for i in range(a, b):
                w[idx[i]] -= step * vals[i]
            fetch_add(version, 1)
            store_release(lock, 0)
            return 1
    return 0


@njit(cache=True, nogil=True)
def _sparse_push(w, idx, vals, bounds, step, locks, versions, line, pid, spins, cuts, hit,
                 done):
    """A sparse push in one call: check idx (strictly ascending, in range) and vals
    (finite) before writing anything (-1: bad indices, -2: a value not finite); cut
    idx into per-shard runs (shard s: idx[cuts[s]:cuts[s + 1]], found by walking
    the ascending indices against the shard bounds); then try each hit shard once
    (``spins`` polls). Returns the number of hit shards h: hit[:h] are they,
    done[t] = 1 where hit[t] was applied. ``line``: the stride of the lock and
    version words."""
    m = idx.shape[0]
    n = w.shape[0]
    for i in range(m):
        if idx[i] < 0 or idx[i] >= n or (i > 0 and idx[i] <= idx[i - 1]):
            return -1
        if not np.isfinite(vals[i]):
            return -2
    n_shards = bounds.shape[0] - 1
    i = 0
    h = 0
    cuts[0] = 0
    for s in range(n_shards):
        a = i
        hi = bounds[s + 1]
        while i < m and idx[i] < hi:
            i += 1
        cuts[s + 1] = i
        if i > a:
            hit[h] = s
            h += 1
    for t in range(h):
        s = hit[t]
        o = s * line
        done[t] = _try_apply_sparse(w, idx, vals, cuts[s], cuts[s + 1], step,
                                    locks[o:o + 1], versions[o:o + 1], pid, spins)
    return h


@njit(cache=True, nogil=True)
def _account_slot(slot, slotf, hist, stale, hbin, deferred, nbytes, dense, scale, now):
    """A push's counters in its worker's slot, in one call: pushes, staleness sum,
    deferred shards and histogram bin atomically (the coordinator reads them); the
    byte counts, the applied weight and the heartbeat plainly (only this worker's
    process writes them)."""
    fetch_add(slot[_PUSHES:_PUSHES + 1], 1)
    fetch_add(slot[_STALENESS:_STALENESS + 1], max(stale, 0))
    fetch_add(slot[_DEFERRED:_DEFERRED + 1], deferred)
    fetch_add(hist[hbin:hbin + 1], 1)
    slot[_BYTES_SENT] += nbytes
    slot[_BYTES_DENSE] += dense
    slotf[F_APPLIED] += scale
    slot[_HEARTBEAT] = now


def _attach(name):
    return ParameterStore.attach(name)


class ParameterStore:
    """ParameterStore(n_params, *, n_shards=None, n_workers=4, shared=True, init=None,
    dtype=np.float64)

    Sharded weights with per-shard versions and locks, a global version and
    per-worker slots, in one shared-memory segment (pickles as a handle that
    re-attaches). ``n_shards``: at most one per parameter (None: 8, or ``n_params``
    where fewer). ``init`` sets the initial weights (default zeros); ``dtype`` is
    their float type (float64, or float32 for a model that computes in it: pulls,
    pushes and snapshots then move float32, and a push's gradient is converted to it).
    """

    def __init__(self, n_params, *, n_shards=None, n_workers=4, shared=True, init=None,
                 clock="exact", clock_counters=None, dtype=np.float64):
        n_params = check_int("n_params", n_params)
        n_shards = check_shards(n_shards, n_params)
        n_workers = check_int("n_workers", n_workers)
        if not isinstance(shared, bool):
            raise TypeError(f"shared must be a bool, got {type(shared).__name__}")
        clock, m = _clock_args(clock, clock_counters, n_workers)
        dt = _dtype_arg(dtype)
        total = self._size(n_params, n_shards, n_workers, dt.itemsize)
        seg = _shm.Segment.create(total, shared=shared)
        mc = None
        try:
            _shm.write_header(seg.buf, KIND_PS, total)
            meta = np.frombuffer(seg.buf, np.int64, 8, offset=META)
            meta[:] = (n_params, n_shards, n_workers, LINE, CLOCKS.index(clock),
                       DTYPES.index(dt), 0, 0)
            if clock == "multicounter":
                mc = MultiCounter(m, shared=shared)
                if shared:
                    _write_name(seg.buf, mc.name)
            self._map(seg, mc)
            if init is not None:
                a = np.asarray(init, dtype=dt)
                if a.shape != (n_params,):
                    raise ValueError(f"init: expected shape ({n_params},), got {a.shape}")
                if not np.isfinite(a).all():
                    raise ValueError("init: contains NaN or inf")
                self.weights[:] = a
        except BaseException:
            self._views_off()
            if mc is not None:
                mc.close()
            seg.close()
            raise

    @staticmethod
    def _size(n_params, n_shards, n_workers, itemsize=8):
        return HEADER + _weight_bytes(n_params, itemsize) + 8 * (
            2 * LINE * n_shards + LINE + SLOT * n_workers + HIST_BINS * n_workers)

    @classmethod
    def attach(cls, name):
        """Attach to the shared store called ``name``."""
        seg = _shm.Segment.attach(name)
        self = cls.__new__(cls)
        try:
            _shm.check_header(seg.buf, KIND_PS, name)
            n_params, n_shards, n_workers, line = np.frombuffer(seg.buf, np.int64, 4,
                                                                offset=META)
            if line != LINE:
                raise ValueError(f"segment {name!r} pads its slots to {int(line)} words, this "
                                 f"build to {LINE} (RELAXED_CACHE_LINE); attach from a process "
                                 "of the same build")
            code, dcode = (int(c) for c in np.frombuffer(seg.buf, np.int64, 2, offset=META + 32))
            if not 0 <= dcode < len(DTYPES) or cls._size(
                    int(n_params), int(n_shards), int(n_workers),
                    DTYPES[dcode].itemsize) != seg.size:
                raise ValueError(f"segment {name!r} has an inconsistent ParameterStore header")
            self._map(seg, MultiCounter.attach(_read_name(seg.buf)) if code == 1 else None)
        except BaseException:
            self._views_off()
            seg.close()
            raise
        return self

    def _map(self, seg, mc=None):
        self._seg, self._mc = seg, mc
        n_params, n_shards, n_workers = (int(x) for x in
                                         np.frombuffer(seg.buf, np.int64, 3, offset=META))
        self.n_params, self.n_shards, self.n_workers = n_params, n_shards, n_workers
        self.dtype = DTYPES[int(np.frombuffer(seg.buf, np.int64, 1, offset=META + 40)[0])]
        off = HEADER
        self.weights = np.frombuffer(seg.buf, self.dtype, n_params, offset=off)
        off += _weight_bytes(n_params, self.dtype.itemsize)
        self._versions = np.frombuffer(seg.buf, np.int64, LINE * n_shards, offset=off)
        off += 8 * LINE * n_shards
        self._locks = np.frombuffer(seg.buf, np.int64, LINE * n_shards, offset=off)
        off += 8 * LINE * n_shards
        self._global = np.frombuffer(seg.buf, np.int64, LINE, offset=off)
        off += 8 * LINE
        self._slots = np.frombuffer(seg.buf, np.int64, SLOT * n_workers,
                                    offset=off).reshape(n_workers, SLOT)
        self._slotsf = self._slots.view(np.float64)
        off += 8 * SLOT * n_workers
        self._hist = np.frombuffer(seg.buf, np.int64, HIST_BINS * n_workers,
                                   offset=off).reshape(n_workers, HIST_BINS)
        self.bounds = np.linspace(0, n_params, n_shards + 1).astype(np.int64)

    def _views_off(self):
        for a in ("weights", "_versions", "_locks", "_global", "_slots", "_slotsf", "_hist"):
            self.__dict__.pop(a, None)

    # ---- lifecycle ------------------------------------------------------------------
    @property
    def name(self):
        return self._seg.name if getattr(self, "_seg", None) is not None else None

    @property
    def closed(self):
        return getattr(self, "_seg", None) is None

    def close(self):
        """Unmap; the owner also removes the segment. Idempotent."""
        seg = getattr(self, "_seg", None)
        if seg is None:
            return
        self._views_off()
        self._seg = None
        mc, self._mc = self.__dict__.get("_mc"), None
        if mc is not None:
            mc.close()
        seg.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        self._check_open()
        if self._seg.name is None:
            raise TypeError("a ParameterStore with shared=False cannot be sent to another "
                            "process; create it with shared=True")
        return (_attach, (self._seg.name,))

    def _check_open(self):
        if self.closed:
            raise RuntimeError("this ParameterStore is closed")

    # ---- verbs --------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The global version: pushes applied in full (under the relaxed clock, the
        MultiCounter's estimate of them: within :meth:`clock_error_bound` of
        :attr:`exact_version`)."""
        self._check_open()
        return self._now()

    @property
    def exact_version(self) -> int:
        """The global version counted exactly (the relaxed clock sums its counters):
        what checkpoints, the final version and the invariants read."""
        self._check_open()
        return int(self._global[0]) if self._mc is None else \
            int(self._global[_BASE]) + self._mc.exact()

    @property
    def clock(self) -> str:
        """"exact" (one atomic word) or "multicounter" (see the module notes)."""
        self._check_open()
        return "exact" if self._mc is None else "multicounter"

    @property
    def dense_bytes(self) -> int:
        """Bytes of one dense push: every weight in the store's ``dtype`` (8 each in
        float64, 4 in float32)."""
        return self.dtype.itemsize * self.n_params

    def clock_error_bound(self) -> int:
        """The bound on ``|version - exact_version|`` of one read: the MultiCounter's
        ``error_bound()`` (0 for the exact clock). A staleness, the difference of two
        reads, is within twice this of the exact one."""
        self._check_open()
        return 0 if self._mc is None else int(self._mc.error_bound())

    def _now(self) -> int:
        """The global version as a pull reads it: the exact word, or the relaxed
        clock's estimate (plus the offset a restore set)."""
        if self._mc is None:
            return int(self._global[0])
        return int(self._global[_BASE]) + int(self._mc.read())

    def _stale(self, version):
        """The staleness of a push from ``version``: the global version now minus it;
        under the relaxed clock clamped at 0 (two estimates may cross)."""
        if self._mc is None:
            return int(self._global[0]) - int(version)
        return max(0, self._now() - int(version))

    def _tick(self, n=1):
        """Count ``n`` pushes applied in full on the global version's clock; returns
        the version after them (the exact clock), or -1 (the relaxed one)."""
        if self._mc is None:
            return fetch_add_py(self._global, 0, int(n)) + int(n)
        if n == 1:
            self._mc.increment()
        else:
            self._mc.increment_many(int(n))
        return -1

    def shard_versions(self) -> np.ndarray:
        self._check_open()
        return self._versions[::LINE].copy()

    def shard_version(self, shard) -> int:
        """One shard's version, read as it is (an update may be landing)."""
        return int(self._versions[int(shard) * LINE])

    def snapshot(self):
        """(weights, shard_versions, version), consistent shard by shard: each
        shard is copied under its lock, with the version that counts exactly the
        updates in the copy (a lock whose holder died is taken over). Pushes go on
        meanwhile, so different shards may be at different versions; ``version``
        (the global version, read first) is at most every shard's plus the slack
        (:attr:`slack`: 0 unless sparse pushes skipped shards). For checkpoints."""
        self._check_open()
        v = self.exact_version
        w = np.empty(self.n_params, self.dtype)
        vers = np.empty(self.n_shards, np.int64)
        for s in range(self.n_shards):
            lo, hi = int(self.bounds[s]), int(self.bounds[s + 1])
            lock = self._lock(s)
            w[lo:hi] = self.weights[lo:hi]
            vers[s] = self._versions[s * LINE]
            _store_release_py(lock, 0)
        return w, vers, v

    def _lock(self, s):
        """Take shard s's lock from Python (waiting with ``sched_yield``; a lock whose
        holder died is taken over); returns the lock word, to release with
        ``store_release``."""
        lock = self._locks[s * LINE:s * LINE + 1]
        pid = os.getpid()
        while not _cas_py(lock, 0, pid):
            holder = int(lock[0])
            if holder and not _pid_alive(holder):
                _cas_py(lock, holder, 0)                # its holder died: take it over
            else:
                os.sched_yield()
        return lock

    @property
    def slack(self) -> int:
        """How many pushes may have skipped a shard: sparse pushes that missed some
        shard, plus the lag a restore allowed. Every shard's version is at least
        the global version minus this."""
        self._check_open()
        return int(self._global[1])

    def restore(self, weights, shard_versions, version, *, slack=0):
        """Set the weights and versions (from :meth:`snapshot`, e.g. a checkpoint).
        Only while no process pushes; worker slots are left as they are.
        ``version`` must be at most min(shard_versions) + ``slack``: a run with
        sparse pushes leaves shards behind the global version, and restoring its
        snapshot needs ``slack >= version - min(shard_versions)``."""
        self._check_open()
        w = np.asarray(weights, dtype=self.dtype)
        if w.shape != (self.n_params,) or not np.isfinite(w).all():
            raise ValueError(f"weights: expected {self.n_params} finite floats, got shape "
                             f"{w.shape}")
        vers = np.asarray(shard_versions)
        if vers.shape != (self.n_shards,) or vers.dtype.kind not in "iu" or (vers < 0).any():
            raise ValueError(f"shard_versions: expected {self.n_shards} ints >= 0, got "
                             f"{vers!r}")
        version = int(version)
        slack = int(slack)
        if slack < 0:
            raise ValueError(f"slack: must be >= 0, got {slack}")
        if not 0 <= version <= int(vers.min()) + slack:
            raise ValueError(f"version: must be in [0, min(shard_versions) + slack], got "
                             f"{version} (slack {slack})")
        if (self._locks[::LINE] != 0).any():
            raise RuntimeError("restore: a shard is locked; restore only while no one pushes")
        self.weights[:] = w
        self._versions[::LINE] = vers
        self._global[0] = version
        self._global[1] = slack
        if self._mc is not None:
            self._global[_BASE] = version - self._mc.exact()

    def staleness_histogram(self, worker=None) -> np.ndarray:
        """Counts of push staleness in log2 bins (see the module notes), of one
        worker or summed over all."""
        self._check_open()
        if worker is None:
            return self._hist.sum(axis=0)
        return self._hist[self._worker(worker)].copy()

    def pull(self, worker=None, out=None):
        """(weights, version): a copy of the weights and the global version read
        before copying (an asynchronous read: updates may land during the copy,
        so the copy is at least as new as ``version``). Records the version in
        the worker's slot."""
        self._check_open()
        v = self._now()
        if out is None:
            out = self.weights.copy()
        else:
            if not isinstance(out, np.ndarray) or out.shape != (self.n_params,) \
                    or out.dtype != self.dtype:
                raise ValueError(f"out: expected a {self.dtype} array of shape "
                                 f"({self.n_params},) (the store's weights)")
            out[:] = self.weights
        if worker is not None:
            s = self._slots[self._worker(worker)]
            s[_PULLED] = v
            s[_HEARTBEAT] = time.monotonic_ns()
        return out, v

    def push(self, grad, version, *, lr, worker=None, scale=1.0, wait=WaitPolicy(),
             nbytes=None, shards=None):
        """Apply ``weights -= lr * scale * grad`` shard by shard, each under its
        lock, bumping each shard's version and then the global version. Returns
        a :class:`PushResult`; shards whose lock stayed held past the wait
        policy are deferred (not applied) and listed in ``.deferred``.
        ``nbytes``: what the pushed gradient cost to send, added to the worker's
        ``bytes_sent`` (``None``: the weights' bytes, :attr:`dense_bytes`; a decoded
        compressed message passes its own size). ``shards``: apply only these (ascending, distinct;
        ``None``: all), as when the messages to the others were lost; the push
        counts once, like a sparse push that skipped shards (the slack is raised)."""
        self._check_open()
        todo = range(self.n_shards) if shards is None else self._shard_list(shards)
        g = self._grad(grad)
        lr, scale, wid = self._push_args(lr, scale, wait, version, worker)
        stale = self._stale(version)
        res = PushResult([], [], stale, g, lr * scale)
        if len(todo) < self.n_shards:                   # the other shards skip this push
            fetch_add_py(self._global, 1, 1)
        self._apply(res, todo, wait)
        if wid is not None:
            self._account(wid, stale, res, scale, self.dense_bytes if nbytes is None
                          else nbytes)
        if not res.deferred:
            res.version = self._tick()
        return res

    def push_sparse(self, indices, values, version, *, lr, worker=None, scale=1.0,
                    wait=WaitPolicy(), nbytes=None):
        """Apply ``weights[indices] -= lr * scale * values``: the dense push of the
        vector with ``values`` at ``indices`` and zeros elsewhere, touching only the
        shards the indices hit. ``indices``: strictly ascending ints in
        [0, n_params); each hit shard's run of them (contiguous, as they ascend)
        is cut in one pass against the shard bounds and applied under that
        shard's lock, whose version
        alone is bumped; the global version is bumped once the push is applied
        in full (+1, as a dense push). The worker's slot counts it as one push
        (pushes, staleness, histogram, deferred, applied weight), ``bytes_sent``
        += ``nbytes`` (``None``: the bytes of ``indices`` and ``values``) and
        ``bytes_dense`` += :attr:`dense_bytes`. Deferred shards are retried with
        :meth:`push_deferred`, as for a dense push."""
        self._check_open()
        idx, vals = self._sparse(indices, values)
        lr, scale, wid = self._push_args(lr, scale, wait, version, worker)
        stale = self._stale(version)
        ns = self.n_shards
        cuts = np.empty(ns + 1, np.int64)                # shard s: idx[cuts[s]:cuts[s+1]]
        hit = np.empty(ns, np.int64)
        done = np.empty(ns, np.int64)
        h = _sparse_push(self.weights, idx, vals, self.bounds, lr * scale, self._locks,
                         self._versions, LINE, os.getpid(), wait.spins, cuts, hit, done)
        if h < 0:
            raise ValueError(f"indices: must be strictly ascending and in "
                             f"[0, {self.n_params})" if h == -1 else
                             "values: contains NaN or inf; the update would corrupt the "
                             "weights (lower the learning rate or clip the gradient)")
        res = PushResult([], [], stale, None, lr * scale, idx, vals, cuts)
        if h < ns:                                       # the other shards skip this push
            fetch_add_py(self._global, 1, 1)
        self._wait_sparse(res, hit[:h], done[:h], wait)
        if wid is not None:
            self._account(wid, stale, res, scale, idx.nbytes + vals.nbytes if nbytes is None
                          else nbytes)
        if not res.deferred:
            res.version = self._tick()
        return res

    def _push_args(self, lr, scale, wait, version, worker):
        """A push's checked (lr, scale, worker id or None)."""
        lr, scale = check_number("lr", lr), check_number("scale", scale)
        if not isinstance(wait, WaitPolicy):
            raise TypeError(f"wait: expected a WaitPolicy, got {type(wait).__name__}")
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)) \
                or version < 0:
            raise ValueError(f"version: expected the int version returned by pull(), "
                             f"got {version!r}")
        return lr, scale, None if worker is None else self._worker(worker)

    def _account(self, wid, stale, res, scale, nbytes):
        """A push's slot counters (this worker's process only writes its slot's
        byte counts and applied weight)."""
        _account_slot(self._slots[wid], self._slotsf[wid], self._hist[wid], stale,
                      staleness_bin(stale), len(res.deferred), int(nbytes),
                      self.dense_bytes, scale, time.monotonic_ns())

    def push_deferred(self, res: PushResult, *, wait=WaitPolicy()):
        """Retry the deferred shards of an earlier push; the global version is
        bumped once its last shard lands. Returns the same result, updated."""
        self._check_open()
        if not isinstance(res, PushResult):
            raise TypeError(f"res: expected a PushResult, got {type(res).__name__}")
        if not res.deferred:
            return res
        todo, res.deferred = res.deferred, []
        if res.indices is not None:
            self._wait_sparse(res, np.asarray(todo, np.int64),
                              np.zeros(len(todo), np.int64), wait)
        else:
            self._apply(res, todo, wait)
        if not res.deferred:
            res.version = self._tick()
        return res

    def _shard_list(self, shards):
        out = [int(s) for s in shards]
        if not out or any(not 0 <= s < self.n_shards for s in out) or any(
                b <= a for a, b in zip(out, out[1:])):
            raise ValueError(f"shards: expected ascending distinct shards in [0, "
                             f"{self.n_shards}), at least one, got {list(shards)!r}; a push "
                             "that reaches no shard is not made")
        return out

    # ---- model averaging (RPS): the store holds the servers' averages --------------------
    def deposited(self, worker, nbytes):
        """Count a model-averaging deposit in the worker's slot: one push of staleness
        0 whose blocks went to the servers' mailbox, not into the weights;
        ``bytes_sent`` += ``nbytes`` (the blocks that were sent), ``bytes_dense`` +=
        :attr:`dense_bytes`. The pushes counter is what the round barrier reads."""
        self._check_open()
        k = self._worker(worker)
        _account_slot(self._slots[k], self._slotsf[k], self._hist[k], 0, 0, 0, int(nbytes),
                      self.dense_bytes, 1.0, time.monotonic_ns())

    def publish(self, shard, values, version) -> bool:
        """Server ``shard``'s state after round ``version``: under the shard's lock, if
        its version is below ``version``, set its weights to ``values`` (``None``:
        keep them, the server received nothing) and its version to ``version``, then
        raise the global version to the smallest shard version (the rounds every
        server has completed). The first caller of a round writes and gets True;
        later callers (with the same values) find the version and get False."""
        self._check_open()
        s = int(shard)
        if not 0 <= s < self.n_shards:
            raise ValueError(f"shard: must be in [0, {self.n_shards}), got {shard!r}")
        lo, hi = int(self.bounds[s]), int(self.bounds[s + 1])
        if values is not None and np.shape(values) != (hi - lo,):
            raise ValueError(f"values: shard {s} holds {hi - lo} weights, got shape "
                             f"{np.shape(values)}")
        lock = self._lock(s)
        wrote = int(self._versions[s * LINE]) < int(version)
        if wrote:
            if values is not None:
                self.weights[lo:hi] = values
            self._versions[s * LINE] = int(version)
        _store_release_py(lock, 0)
        self.advance(int(self._versions[::LINE].min()))
        return wrote

    def advance(self, version) -> int:
        """Raise the global version to at least ``version`` (atomically: a CAS loop,
        never lowering it); returns the global version after."""
        self._check_open()
        g = self._global[0:1]
        cur, version = int(g[0]), int(version)
        while cur < version and not _cas_py(g, cur, version):
            cur = int(g[0])
        if self._mc is not None and cur < version:   # this call's CAS moved cur -> version
            self._mc.increment_many(version - cur)
        return max(cur, version)

    # ---- accounting of updates applied elsewhere (the Ray transport's shard actors) -----
    def pulled(self, worker) -> int:
        """Record in the worker's slot that it pulled now (the version it saw, its
        heartbeat), without copying the weights: the weights came from elsewhere.
        Returns the global version."""
        self._check_open()
        v = self._now()
        s = self._slots[self._worker(worker)]
        s[_PULLED] = v
        s[_HEARTBEAT] = time.monotonic_ns()
        return v

    def account(self, worker, version, *, scale=1.0, nbytes=None, skipped=False):
        """Count one push of ``worker`` whose shard updates were applied elsewhere (by
        the Ray transport's shard actors): its slot counters and histogram as
        :meth:`push` counts them (staleness: the global version now minus
        ``version``), then +1 on the global version; ``skipped``: it missed some
        shard (the slack is raised, as for a sparse push). Returns the staleness."""
        self._check_open()
        lr, scale, wid = self._push_args(0.0, scale, WaitPolicy(), version, worker)
        stale = self._stale(version)
        if skipped:
            fetch_add_py(self._global, 1, 1)
        res = PushResult([], [], stale)
        self._account(wid, stale, res, scale, self.dense_bytes if nbytes is None else nbytes)
        self._tick()
        return stale

    # ---- a node's replica (the Ray transport's node-local memory) -------------------------
    def add_at(self, shard, offsets, delta):
        """Under shard ``shard``'s lock: ``w[lo + offsets] += delta`` (``offsets``
        None: the whole shard), without counting a push: other nodes' updates merged
        into this node's replica (the version moves with :meth:`bump`)."""
        self._check_open()
        s = int(shard)
        lo, hi = int(self.bounds[s]), int(self.bounds[s + 1])
        lock = self._lock(s)
        try:
            if offsets is None:
                self.weights[lo:hi] += delta
            else:
                self.weights[lo + np.asarray(offsets, np.int64)] += delta
        finally:
            _store_release_py(lock, 0)

    def bump(self, shard_deltas, version_delta):
        """Count pushes applied elsewhere whose updates were merged (:meth:`add_at`):
        each shard's version += its delta, then the global version += ``version_delta``
        (after the weights, so a pull that sees the version sees the updates). Pushes
        that skipped a shard (sparse ones) raise the slack: by as many as the version
        moves past the shard that moved least."""
        self._check_open()
        deltas = np.asarray(shard_deltas, np.int64)
        for s, d in enumerate(deltas.tolist()):
            if d:
                fetch_add_py(self._versions, s * LINE, d)
        skipped = int(version_delta) - int(deltas.min())
        if skipped > 0:
            fetch_add_py(self._global, 1, skipped)
        if version_delta:
            self._tick(version_delta)

    def mirror(self, workers, pushes):
        """Set the push counts of workers that run elsewhere (another node's), as the
        gates and sources read them; only their node's agent writes them."""
        self._check_open()
        for k, n in zip(workers, pushes):
            self._slots[self._worker(int(k)), _PUSHES] = int(n)

    def _apply(self, res, shards, wait):
        pid = os.getpid()
        for s in shards:
            lo, hi = int(self.bounds[s]), int(self.bounds[s + 1])
            lock = self._locks[s * LINE:s * LINE + 1]
            ver = self._versions[s * LINE:s * LINE + 1]
            done = _try_apply(self.weights, res.grad, lo, hi, res.lr, lock, ver, pid,
                              wait.spins)
            tries = 0
            budget = wait.budget() if not done else None
            t0 = time.perf_counter()
            while not done:
                holder = int(lock[0])
                if holder and not _pid_alive(holder):
                    _cas_py(lock, holder, 0)     # the holder died mid-update: free its lock
                elif wait.defer and (tries >= wait.yields if budget is None
                                     else time.perf_counter() - t0 >= budget):
                    break
                else:
                    tries += 1
                    os.sched_yield()
                done = _try_apply(self.weights, res.grad, lo, hi, res.lr, lock, ver, pid,
                                  wait.spins)
            (res.applied if done else res.deferred).append(s)

    def _wait_sparse(self, res, shards, done, wait):
        """Finish a sparse push on ``shards``: those with done[t] = 0 are tried again,
        waited on as in :meth:`_apply`, and deferred past the wait policy."""
        pid = os.getpid()
        a, b = res.cuts, res.indices
        for t, s in enumerate(shards.tolist()):
            if not done[t]:
                lock = self._locks[s * LINE:s * LINE + 1]
                ver = self._versions[s * LINE:s * LINE + 1]
                tries = 0
                budget = wait.budget()
                t0 = time.perf_counter()
                ok = 0
                while not ok:
                    holder = int(lock[0])
                    if holder and not _pid_alive(holder):
                        _cas_py(lock, holder, 0)
                    elif wait.defer and (tries >= wait.yields if budget is None
                                         else time.perf_counter() - t0 >= budget):
                        break
                    else:
                        tries += 1
                        os.sched_yield()
                    ok = _try_apply_sparse(self.weights, b, res.values, a[s], a[s + 1],
                                           res.lr, lock, ver, pid, wait.spins)
                done[t] = ok
            (res.applied if done[t] else res.deferred).append(s)

    def _sparse(self, indices, values):
        idx = np.asarray(indices)
        if idx.ndim != 1 or idx.dtype.kind not in "iu":
            raise TypeError(f"indices: expected a 1-d int array, got dtype {idx.dtype} and "
                            f"shape {idx.shape}")
        if idx.dtype != np.int32:
            idx = idx.astype(np.int64, copy=False)
        idx = np.ascontiguousarray(idx)
        vals = np.asarray(values)
        if vals.dtype.kind not in "iuf" or vals.dtype == bool:
            raise TypeError(f"values: expected a float array, got dtype {vals.dtype}")
        if vals.shape != idx.shape:
            raise ValueError(f"values: expected shape {idx.shape} (one per index), got "
                             f"{vals.shape}")
        vals = np.ascontiguousarray(vals, dtype=self.dtype)
        return idx, vals          # order, range and finiteness: checked by the kernel

    # ---- worker slots -------------------------------------------------------------------
    def _worker(self, worker):
        if isinstance(worker, bool) or not isinstance(worker, (int, np.integer)):
            raise TypeError(f"worker: expected an int, got {type(worker).__name__}")
        if not 0 <= worker < self.n_workers:
            raise ValueError(f"worker: must be in [0, {self.n_workers}), got {worker}")
        return int(worker)

    def slot(self, worker) -> dict:
        """A copy of a worker's slot (pulled_version, pushes, compute_ns,
        heartbeat_ns, status, staleness_sum, deferred, dropped, stolen, spells,
        bytes_sent, bytes_dense, and applied_weight: the sum of the scales its
        pushes were applied with)."""
        self._check_open()
        k = self._worker(worker)
        row = self._slots[k]
        d = {f: int(row[i]) for i, f in enumerate(SLOT_FIELDS)}
        d["applied_weight"] = float(self._slotsf[k, F_APPLIED])
        return d

    def record(self, worker, *, compute_ns=None, status=None):
        """Add compute time / set the status word of a worker's slot."""
        self._check_open()
        row = self._slots[self._worker(worker)]
        if compute_ns is not None:
            fetch_add_py(row, _COMPUTE, int(compute_ns))
        if status is not None:
            row[_STATUS] = int(status)
        row[_HEARTBEAT] = time.monotonic_ns()

    def counter(self, worker, field) -> int:
        """One field of a worker's slot (a name of :data:`SLOT_FIELDS`), read as it is
        (the worker may be writing it)."""
        return int(self._slots[self._worker(worker), _field(field)])

    def add(self, worker, field, n):
        """Atomically add ``n`` to a driver counter of a worker's slot (one of
        :data:`DRIVER_COUNTERS`)."""
        if field not in DRIVER_COUNTERS:
            raise ValueError(f"field: must be one of {DRIVER_COUNTERS}, got {field!r}")
        fetch_add_py(self._slots[self._worker(worker)], SLOT_INDEX[field], int(n))

    def all_pushes(self) -> np.ndarray:
        """Every worker's applied pushes (for a checkpoint)."""
        self._check_open()
        return self._slots[:, SLOT_INDEX["pushes"]].copy()

    def all_status(self) -> np.ndarray:
        """Every worker's status word."""
        self._check_open()
        return self._slots[:, _STATUS].copy()

    def set_pushes(self, pushes):
        """Set every worker's push count (resuming from a checkpoint; only while no
        one pushes)."""
        self._check_open()
        p = np.asarray(pushes)
        if p.shape != (self.n_workers,) or p.dtype.kind not in "iu" or (p < 0).any():
            raise ValueError(f"pushes: expected {self.n_workers} ints >= 0, got {pushes!r}")
        self._slots[:, SLOT_INDEX["pushes"]] = p

    def _grad(self, grad):
        g = np.asarray(grad)
        if g.dtype.kind not in "iuf" or g.dtype == bool:
            raise TypeError(f"grad: expected a float array, got dtype {g.dtype}")
        if g.shape != (self.n_params,):
            raise ValueError(f"grad: expected shape ({self.n_params},), got {g.shape}")
        g = np.ascontiguousarray(g, dtype=self.dtype)
        if not np.isfinite(g).all():
            raise ValueError("grad: contains NaN or inf; the update would corrupt the "
                             "weights (lower the learning rate or clip the gradient)")
        return g

    def release_dead_locks(self) -> int:
        """Free every shard lock whose holder process is dead (a push takes such a
        lock over anyway; this is for quiescence, e.g. after the last worker was
        killed). Returns how many were freed."""
        self._check_open()
        freed = 0
        for s in range(self.n_shards):
            lock = self._locks[s * LINE:s * LINE + 1]
            holder = int(lock[0])
            if holder and not _pid_alive(holder) and _cas_py(lock, holder, 0):
                freed += 1
        return freed

    def _lock_shard_for_test(self, s):
        """Tests: take shard s's lock and keep it (simulates a holder)."""
        lock = self._locks[s * LINE:s * LINE + 1]
        if not _cas_py(lock, 0, os.getpid()):
            raise RuntimeError(f"shard {s} is locked")

    def _check(self):
        """Invariants at quiescence: no shard locked; every shard's version is at
        least the global version minus the slack (every full push bumped every
        shard it hit, and a push that skipped shards raised the slack)."""
        self._check_open()
        locks = self._locks[::LINE]
        if (locks != 0).any():
            raise AssertionError(f"shards locked at quiescence: {np.flatnonzero(locks).tolist()}")
        if (self.shard_versions() + self.slack < self.exact_version).any():
            raise AssertionError("a shard version is below the global version minus the "
                                 "slack")
        return True

    def __repr__(self):
        if self.closed:
            return "<ParameterStore closed>"
        return (f"<ParameterStore n_params={self.n_params} n_shards={self.n_shards} "
                f"n_workers={self.n_workers} version={self.exact_version} clock={self.clock} "
                f"dtype={self.dtype} name={self.name!r}>")


def _field(field):
    try:
        return SLOT_INDEX[field]
    except KeyError:
        raise ValueError(f"field: must be one of {SLOT_FIELDS}, got {field!r}") from None


def staleness_bin(stale: int) -> int:
    """Histogram bin of a staleness: 0 for <= 0, else bit_length (1; 2-3; 4-7;
    ...), capped at the last bin."""
    return min(max(int(stale), 0).bit_length(), HIST_BINS - 1)


def _clock_args(clock, counters, n_workers):
    """(clock, n_counters): the clock's name checked, and the MultiCounter's counters
    (default 4 per worker, as its docs advise per thread)."""
    if not isinstance(clock, str) or clock not in CLOCKS:
        raise ValueError(f'clock: must be "exact" or "multicounter", got {clock!r}')
    if counters is None:
        return clock, max(2, 4 * n_workers)
    if clock != "multicounter":
        raise ValueError(f"clock_counters: applies to clock='multicounter' only, got "
                         f"clock={clock!r}")
    return clock, check_int("clock_counters", counters)


def _dtype_arg(dtype):
    """The weights' float type: float64 or float32 (a TypeError naming the rest)."""
    from sgd_shm.core.validation import check_float_dtype
    return check_float_dtype("dtype", dtype, "pass np.float64 or np.float32")


def _weight_bytes(n_params, itemsize):
    """Bytes the weights take in the segment: whole int64 words, so that the version
    and lock words after them stay aligned."""
    return -(-n_params * itemsize // 8) * 8


def _write_name(buf, name):
    b = name.encode()
    if len(b) >= _NAME_MAX:
        raise ValueError(f"the clock's segment name {name!r} is longer than the store's "
                         f"header holds ({_NAME_MAX - 1} bytes)")
    np.frombuffer(buf, np.uint8, len(b), offset=_NAME_AT)[:] = np.frombuffer(b, np.uint8)


def _read_name(buf):
    raw = bytes(np.frombuffer(buf, np.uint8, _NAME_MAX, offset=_NAME_AT))
    return raw.split(b"\0", 1)[0].decode()
