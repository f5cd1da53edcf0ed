"""Allreduce and the partial collectives of eager-SGD (solo, majority) among processes
on one box, through one shared-memory segment (:class:`ShmGroup`).

Usage::

    from sgd_shm.collectives import ShmGroup

    def train(comm, steps):
        g = np.zeros(1000)
        for _ in range(steps):
            ...                                    # fill g
            rnd = comm.solo_allreduce(g, op="mean")
        return comm.stats

    with ShmGroup(4, 1000, late="carry") as group:
        stats = group.run(train, 100)              # forks 4 ranks, returns 4 values

Every rank calls the same kind of collective in the same round (as in MPI); a rank
that finds another kind or operation already recorded for its round raises
CollectiveError and aborts the group (the others stop with RankFailure), so a mix-up
never returns a wrong result or hangs. A group made with ``gather=True`` also runs
gather rounds (``comm.allgather(payload, kind)``: every contributor's payload reaches
every rank, copied, not summed).

Layout (int64 words, after the common 64-byte header; ``L`` = LINE_WORDS, a word that
several processes write gets a cache line of its own):

* meta (read-only): size, n, depth, dtype code, seed, L, row stride.
* ``abort`` (0, or a code naming the failed rank), ``closed_upto`` (rounds closed so
  far; an atomic max), and per rank one line: pid, ``left`` (1 + rounds passed when
  it closed its communicator), ``posted`` (1 + last round it posted), ``passed``
  (rounds it has finished).
* ``depth`` slots; round r uses slot r % depth. A slot has six lines: ``round`` (the
  round the slot serves now), ``state`` (CLOSED bit 62 | arrival mask, bits 0..59),
  ``claim`` (next reduction chunk to hand out), ``done`` (chunks reduced), ``consumed``
  (ranks that have copied the result out), ``kinds`` (one bit per kind and operation
  that ranks called the round as: more than one bit is an error).
* data (page aligned): one contribution row per rank, one result row per slot. In a
  group that gathers, a contribution row is [count, payload] (n + 1 elements) and a
  result row holds ``size`` of them.

A round is two compiled calls on the fast path (``_k_post``: steps 1-2, ``_k_complete``:
steps 3-4, each polling a bounded number of times); Python only backs off between
tries (``sched_yield``, then sleeps of 50-200 us) and runs the failure checks.

Protocol of round r, slot s = r % depth, on rank k:

1. Back-pressure: wait until ``round[s] == r`` (acquire). The slot is recycled from
   r - depth to r only once every rank consumed round r - depth, so a rank is never more
   than ``depth`` rounds ahead of the slowest one (bounded lag; a slow rank holds the
   fast ones back). ``round[s]`` holds the full round id, so there is no ABA: it
   can only move past r after k itself consumed r.
2. The rank ORs its kind bit into ``kinds``; a different bit there is a disagreement
   (see above). If ``state`` is already CLOSED the rank is late: the base class's ``_keep_late``
   gets its buffer (drop / carry) and nothing is copied. Otherwise it copies its buffer
   into its contribution row, then CASes its bit into ``state`` (acq_rel); in the same
   CAS it closes the round when its kind says so (sync: the mask is full; solo:
   always; majority: k is the round's initiator). The CAS may also find the round
   closed (another rank closed it in between): late, as above. The closer raises
   ``closed_upto`` to r + 1 (atomic max; rounds close in order because a rank
   finishes round r before it posts r + 1).
3. Once CLOSED is seen, the contributors are the mask, fixed forever for round r.
   Every waiting rank (contributor or late) claims chunks of the result with an
   atomic add on ``claim`` and writes result[c] = sum of the contributors' rows over
   chunk c, in ascending rank order (so every rank reads the same bits), then adds 1 to
   ``done`` (acq_rel). A rank busy elsewhere never stalls the reduction.
   A gather round hands out chunks of the contributors' rows instead: each is copied,
   up to the row's count, to the same place in the result row (``_k_gather``).
4. When ``done`` == number of chunks (acquire), the rank copies the result out, then
   adds 1 to ``consumed`` (acq_rel). The rank whose add makes it ``size`` resets
   state/claim/done/consumed (plain stores) and store-releases ``round[s] = r + depth``.

Memory ordering: a contribution is written before the arrival CAS (release); the CAS
chain on ``state`` is a release sequence, so any rank that acquires a CLOSED state sees
every contributor's row. Each ``done`` add releases its chunk; the acquire load that
reads ``done == chunks`` sees them all. Each ``consumed`` add comes after the rank's
last read of the slot, and the last consumer's acq_rel add acquires them all, so its
reset cannot overtake anybody's read; the release store of ``round[s]`` publishes the
reset to the ranks that acquire it for round r + depth. A contribution row is rewritten
only by its owner for its next round, which it posts after ``done`` reached the chunk
count of its current round, i.e. after every read of the row. Waits only poll (spin,
then ``sched_yield``, then short sleeps), so there are no lost wake-ups.

Failures: every wait checks the abort word, its deadline (CollectiveTimeout naming the
round and the ranks it waits for), and every ~0.1 s the recorded pids of the other
ranks (a dead rank, or one that closed before the round, sets the abort word and
raises RankFailure) and, under :meth:`ShmGroup.run`, the parent's pid.
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import traceback

import numpy as np
from numba import njit

from relaxed import shm as _shm
from sgd_shm.collectives.base import (AVERAGE, LATE, MAX_RANKS, CollectiveError,
                                      CollectiveTimeout, Communicator, RankFailure,
                                      check_dtype, check_timeout, initiator)
from sgd_shm.core.atomics import LINE_WORDS
from sgd_shm.core.atomics import add_acq_rel as _add
from sgd_shm.core.atomics import cas_acq_rel as _cas
from sgd_shm.core.atomics import cas_acq_rel_py as _k_cas
from sgd_shm.core.atomics import load_acquire_py as _k_load
from sgd_shm.core.atomics import load_acquire as _load_acq
from sgd_shm.core.atomics import store_release_at as _store_rel
from sgd_shm.core.atomics import store_release_at_py as _k_store
from sgd_shm.core.launcher import check_start_method, exit_now
from sgd_shm.core.launcher import pid_alive as _pid_alive
from sgd_shm.core.validation import check_choice, check_int

__all__ = ["ShmGroup", "ShmCommunicator"]

KIND_COLLECTIVE = 5
L = LINE_WORDS
CLOSED = 1 << 62
MASK = (1 << MAX_RANKS) - 1
#: elements per reduction chunk (a claim is one atomic add; chunks spread the sum over
#: every waiting rank)
CHUNK = 32768
_SYNC, _SOLO, _MAJ_INIT, _MAJ_OTHER = 0, 1, 2, 3
_DTYPES = {0: np.dtype(np.float32), 1: np.dtype(np.float64)}

# word offsets (in units of int64 words)
_META = 8                                   # after the 64-byte common header
_M_SIZE, _M_N, _M_DEPTH, _M_DTYPE, _M_SEED, _M_LINE, _M_ROW, _M_GATHER = range(8)
_ABORT = -(-(_META + 8) // L) * L
_CLOSED_UPTO = _ABORT + L
_RANKS = _CLOSED_UPTO + L
_R_PID, _R_LEFT, _R_POSTED, _R_PASSED = range(4)
_S_ROUND, _S_STATE, _S_CLAIM, _S_DONE, _S_CONSUMED, _S_KINDS = range(6)
_SLOT_WORDS = 6 * L
_PAGE = 4096

# abort codes: 1 + k: rank k died / failed; 1 + size + k: rank k raised;
# 1 + 2 * size: the parent (run) stopped the group (timeout, interrupt)


def _layout(size, n, depth, itemsize, gather):
    """(control words before the slots, data offset, contribution row and result row
    in elements, total bytes). A group that gathers has a count before each
    contribution and results of ``size`` rows of n + 1 elements."""
    slots = _RANKS + size * L
    ctrl_bytes = (slots + depth * _SLOT_WORDS) * 8
    data = -(-ctrl_bytes // _PAGE) * _PAGE
    n1 = n + 1 if gather else n

    def page(elements):
        return -(-(elements * itemsize) // _PAGE) * _PAGE // itemsize

    row, rrow = page(n1), page(size * n1 if gather else n)
    total = data + (size * row + depth * rrow) * itemsize
    return slots, data, row, rrow, total


@njit(cache=True, nogil=True)
def _k_spin(W, off, m, want, iters):
    """Poll W[off] (acquire) up to ``iters`` times until (value & m) == want; the value,
    or -1 (every polled word is >= 0)."""
    for _ in range(iters):
        v = _load_acq(W, off)
        if (v & m) == want:
            return v
    return -1


@njit(cache=True, nogil=True)
def _k_arrive(W, st, cu, bit, full, mode, r):
    """Arrive at the round whose state word is W[st]: CAS bit in, closing as ``mode``
    says. Returns the state after the CAS, or the closed state found (late: bit unset)."""
    while True:
        old = _load_acq(W, st)
        if old & CLOSED:
            return old
        new = old | bit
        if mode == 1 or mode == 2 or (mode == 0 and new == full):
            new |= CLOSED
        if _cas(W, st, old, new):
            if new & CLOSED:                       # closed_upto = max(closed_upto, r + 1)
                while True:
                    c = _load_acq(W, cu)
                    if c >= r + 1 or _cas(W, cu, c, r + 1):
                        break
            return new


@njit(cache=True, nogil=True)
def _k_sum_block(r, C, ranks, m, lo, hi):
    """r[:] = sum of rows ranks[0..m) of C over [lo, hi), left to right in rank order.
    Up to four rows per pass over r, each pass one vectorised loop over 1-D slices (a
    loop of 2-D element accesses, or of ``r[i] += s[i]``, does not vectorise)."""
    j = 0
    while j < m:
        first = j == 0
        t = min(m - j, 4 if first else 3)
        s0 = C[ranks[j], lo:hi]
        if t >= 2:
            s1 = C[ranks[j + 1], lo:hi]
        if t >= 3:
            s2 = C[ranks[j + 2], lo:hi]
        if first:
            if t == 1:
                r[:] = s0
            elif t == 2:
                for i in range(r.size):
                    r[i] = s0[i] + s1[i]
            elif t == 3:
                for i in range(r.size):
                    r[i] = s0[i] + s1[i] + s2[i]
            else:
                s3 = C[ranks[j + 3], lo:hi]
                for i in range(r.size):
                    r[i] = s0[i] + s1[i] + s2[i] + s3[i]
        elif t == 1:
            for i in range(r.size):
                r[i] = r[i] + s0[i]
        elif t == 2:
            for i in range(r.size):
                r[i] = r[i] + s0[i] + s1[i]
        else:
            for i in range(r.size):
                r[i] = r[i] + s0[i] + s1[i] + s2[i]
        j += t


@njit(cache=True, nogil=True)
def _k_reduce(W, claim, done, C, R, mask, nchunks, chunk, n):
    """Claim chunks of the result and sum the contributors' rows into them (ascending
    rank order, left to right, so every chunk's bits do not depend on who sums it).
    Returns the number of chunks this call reduced."""
    ranks = np.empty(64, np.int64)
    m = 0
    for k in range(64):
        if (mask >> k) & 1:
            ranks[m] = k
            m += 1
    got = 0
    while True:
        c = _add(W, claim, 1)
        if c >= nchunks:
            break
        lo = c * chunk
        hi = min(n, lo + chunk)
        b = lo
        while b < hi:                              # 4096-element blocks stay in L1
            e = min(hi, b + 4096)
            _k_sum_block(R[b:e], C, ranks, m, b, e)
            b = e
        _add(W, done, 1)
        got += 1
    return got


@njit(cache=True, nogil=True)
def _k_finish_slot(W, base, line, size, depth, r):
    """Count this rank's read of round r's result (slot words at W[base:]); the last
    reader resets state/claim/done/consumed and store-releases round = r + depth."""
    if _add(W, base + _S_CONSUMED * line, 1) + 1 == size:
        W[base + _S_STATE * line] = 0
        W[base + _S_CLAIM * line] = 0
        W[base + _S_DONE * line] = 0
        W[base + _S_CONSUMED * line] = 0
        W[base + _S_KINDS * line] = 0
        _store_rel(W, base + _S_ROUND * line, r + depth)
        return True
    return False


@njit(cache=True, nogil=True)
def _k_or(W, off, bits):
    """W[off] |= bits (atomic); the value before."""
    while True:
        old = _load_acq(W, off)
        if (old & bits) == bits or _cas(W, off, old, old | bits):
            return old


@njit(cache=True, nogil=True)
def _k_post(W, base, line, r, row, buf, bit, full, mode, copy, cu, kind, gather):
    """Steps 1-2 of a round in one call: -1 if the slot does not serve round r yet;
    -2 if another rank called round r as another kind or operation (``kind``: one
    bit per kind and operation); else the state after arriving (copying ``buf`` into
    ``row`` first, after a count when gathering, unless the round is closed or
    ``copy`` is False), or the closed state found (late: ``bit`` unset)."""
    if _load_acq(W, base + _S_ROUND * line) != r:
        return -1
    if _k_or(W, base + _S_KINDS * line, kind) & ~kind:
        return -2
    st = base + _S_STATE * line
    old = _load_acq(W, st)
    if old & CLOSED:
        return old
    if gather:
        row[0] = buf.size
        row[1:1 + buf.size] = buf
    elif copy:
        row[:buf.size] = buf
    return _k_arrive(W, st, cu, bit, full, mode, r)


@njit(cache=True, nogil=True)
def _k_gather(W, claim, done, C, R, mask, per_row, chunk, n1):
    """Claim chunks of the result and copy the contributors' rows (count, payload)
    into them: chunk c is piece c % per_row of rank c // per_row's row, copied only
    up to its count. Returns the number of chunks this call handled."""
    got = 0
    total = per_row * C.shape[0]
    while True:
        c = _add(W, claim, 1)
        if c >= total:
            break
        j = c // per_row
        if (mask >> j) & 1:
            lo = (c % per_row) * chunk
            hi = min(int(C[j, 0]) + 1, lo + chunk)
            if lo < hi:
                R[j * n1 + lo:j * n1 + hi] = C[j, lo:hi]
        _add(W, done, 1)
        got += 1
    return got


@njit(cache=True, nogil=True)
def _k_complete(W, base, line, r, state, C, R, out, nchunks, chunk, n, size, depth,
                spins, gather):
    """Steps 3-4 of a round, polling each word at most ``spins`` times. Returns
    (0, state) when done (``out`` holds the result, or for a gather each
    contributor's count and payload at its row of n + 1, and this rank's read is
    counted), (1, 0) while the round is open, (2, state) while chunks are being
    reduced or copied."""
    if not state & CLOSED:
        state = _k_spin(W, base + _S_STATE * line, CLOSED, CLOSED, spins)
        if state < 0:
            return 1, 0
    mask = state & MASK
    if gather:
        _k_gather(W, base + _S_CLAIM * line, base + _S_DONE * line, C, R, mask,
                  nchunks // size, chunk, n + 1)
    else:
        _k_reduce(W, base + _S_CLAIM * line, base + _S_DONE * line, C, R, mask,
                  nchunks, chunk, n)
    if _k_spin(W, base + _S_DONE * line, -1, nchunks, spins) < 0:
        return 2, state
    if gather:
        for j in range(size):
            if (mask >> j) & 1:
                o = j * (n + 1)
                e = o + int(R[o]) + 1
                out[o:e] = R[o:e]
    else:
        out[:n] = R[:n]
    _k_finish_slot(W, base, line, size, depth, r)
    return 0, state


def _attach_group(name, late, average, timeout):
    return ShmGroup._attach(name, late, average, timeout)


class ShmGroup:
    """ShmGroup(size, n, dtype=np.float64, *, late="drop", average="size", depth=8,
    seed=0, timeout=None, gather=False)

    ``size`` ranks (processes on this box) that combine buffers of ``n`` elements of
    ``dtype`` (float32 or float64) through one shared-memory segment, which this object
    owns (``close()`` or the end of a ``with`` block unlinks it; so do garbage
    collection, interpreter exit and, through the resource tracker, a SIGKILL).

    late, average, timeout: the communicators' defaults (see
    :class:`~sgd_shm.collectives.base.Communicator`); depth: rounds in flight (a rank can
    run at most ``depth`` rounds ahead of the slowest; the segment holds ``depth``
    result buffers); seed: draws the initiator of each majority round; gather: whether
    the ranks may also run gather rounds (``allgather``: payloads of up to n elements;
    the segment then holds ``size`` payloads per slot).

    :meth:`communicator` gives rank k's communicator in the calling process (after a
    fork, or in any process that unpickled this object: it pickles as a handle that
    re-attaches by name); :meth:`run` forks the ranks and runs a function on each.
    """

    def __init__(self, size, n, dtype=np.float64, *, late="drop", average="size", depth=8,
                 seed=0, timeout=None, gather=False):
        size = check_int("size", size, 1, MAX_RANKS)
        n = check_int("n", n, 1, None)
        dt = check_dtype(dtype)
        if not isinstance(gather, (bool, np.bool_)):
            raise TypeError(f"gather must be True or False, got {type(gather).__name__}")
        if gather and dt == np.float32 and n >= 2 ** 24:
            raise ValueError(f"n must be < 2**24 for a float32 group that gathers (a "
                             f"payload's count travels as a float32), got {n}; use "
                             "dtype=np.float64")
        self.late = check_choice("late", late, LATE)
        self.average = check_choice("average", average, AVERAGE)
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)):
            raise TypeError(f"depth must be an int, got {type(depth).__name__}")
        if depth < 1:
            raise ValueError(f"depth must be >= 1 (rounds in flight, the most a rank may "
                             f"run ahead of the slowest), got {depth}; pass depth=8")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        if not 0 <= seed < 2 ** 63:
            raise ValueError(f"seed must be in [0, 2**63), got {seed}")
        self.timeout = check_timeout("timeout", timeout)
        depth = int(depth)
        _slots, _data, _row, _rrow, total = _layout(size, n, depth, dt.itemsize, gather)
        try:
            free = os.statvfs("/dev/shm")
            avail = free.f_bavail * free.f_frsize
        except OSError:             # pragma: no cover
            avail = None
        if avail is not None and total > avail:
            raise ValueError(
                f"the segment needs {total / 2**20:.1f} MiB ((size + depth) buffers of n "
                f"elements; depth * size of them to gather) but /dev/shm has "
                f"{avail / 2**20:.1f} MiB free; lower depth or n")
        seg = _shm.Segment.create(total, shared=True)
        try:
            _shm.write_header(seg.buf, KIND_COLLECTIVE, total)
            W = np.frombuffer(seg.buf, np.int64, count=_data // 8)
            W[_META:_META + 8] = (size, n, depth, 1 if dt == np.float64 else 0, int(seed),
                                  L, _row, int(gather))
        except BaseException:
            seg.close()
            raise
        del W
        self._setup(seg)
        self._reset()

    # ---- attach / pickle ------------------------------------------------------------
    @classmethod
    def _attach(cls, name, late, average, timeout):
        seg = _shm.Segment.attach(name)
        try:
            _shm.check_header(seg.buf, KIND_COLLECTIVE, name)
            meta = np.frombuffer(seg.buf, np.int64, count=_META + 8)
            if int(meta[_META + _M_LINE]) != L:
                raise ValueError(f"segment {name!r} pads words to {int(meta[_META + _M_LINE])}"
                                 f" int64s, this build to {L}; use the same build")
        except BaseException:
            seg.close()
            raise
        del meta
        self = cls.__new__(cls)
        self.late, self.average, self.timeout = late, average, timeout
        self._setup(seg)
        return self

    def _setup(self, seg):
        self._seg = seg
        self.name = seg.name
        meta = np.frombuffer(seg.buf, np.int64, count=_META + 8)[_META:]
        self.size, self.n, self.depth = int(meta[0]), int(meta[1]), int(meta[2])
        self.dtype = _DTYPES[int(meta[3])]
        self.seed, self._row = int(meta[4]), int(meta[6])
        self.gather = bool(meta[7])
        slots, data, row, rrow, total = _layout(self.size, self.n, self.depth,
                                                self.dtype.itemsize, self.gather)
        self._slots = slots
        self._W = np.frombuffer(seg.buf, np.int64, count=data // 8)
        self._C = np.frombuffer(seg.buf, self.dtype, offset=data,
                                count=self.size * row).reshape(self.size, row)
        self._R = np.frombuffer(seg.buf, self.dtype, offset=data + self.size * row *
                                self.dtype.itemsize, count=self.depth * rrow).reshape(
                                    self.depth, rrow)   # result rows, one per slot
        self.nchunks = -(-self.n // CHUNK)
        self.gchunks = self.size * -(-(self.n + 1) // CHUNK)
        self.chunk = CHUNK

    def __reduce__(self):
        if self.closed:
            raise ValueError("cannot pickle a closed ShmGroup")
        return _attach_group, (self.name, self.late, self.average, self.timeout)

    def _reset(self):
        """Fresh protocol state (no rank may be attached)."""
        W = self._W
        W[_ABORT:] = 0
        for s in range(self.depth):
            W[self._slots + s * _SLOT_WORDS + _S_ROUND * L] = s
        _k_store(W, _ABORT, 0)              # publish

    # ---- teardown -------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._seg.closed

    @property
    def owner(self) -> bool:
        return self._seg.owner

    def close(self) -> None:
        """Unmap; the owner also unlinks the segment (ranks that already mapped it keep
        working)."""
        if self._seg.closed:
            return
        self._W = self._C = self._R = None
        self._seg.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self.closed:
            return "<ShmGroup closed>"
        return (f"<ShmGroup size={self.size} n={self.n} dtype={self.dtype} depth="
                f"{self.depth} name={self.name!r}>")

    def _check_open(self):
        if self._seg.closed:
            raise ValueError("this ShmGroup is closed")

    # ---- ranks ----------------------------------------------------------------------
    def communicator(self, rank, *, late=None, average=None, timeout=None) -> "ShmCommunicator":
        """Rank ``rank``'s communicator, in this process (one process per rank; the rank
        records its pid so that the others notice if it dies). late, average, timeout:
        None takes the group's."""
        self._check_open()
        return ShmCommunicator(self, rank, late=self.late if late is None else late,
                               average=self.average if average is None else average,
                               timeout=self.timeout if timeout is None else timeout)

    @property
    def closed_upto(self) -> int:
        """Rounds closed so far."""
        self._check_open()
        return int(_k_load(self._W, _CLOSED_UPTO))

    def positions(self) -> list:
        """Per rank: (rounds posted, rounds finished), as the ranks last recorded them."""
        self._check_open()
        W = self._W
        return [(int(W[_RANKS + k * L + _R_POSTED]), int(W[_RANKS + k * L + _R_PASSED]))
                for k in range(self.size)]

    def abort(self, code=None) -> None:
        """Make every wait of every rank raise RankFailure (the group is then dead)."""
        self._check_open()
        _k_cas(self._W, _ABORT, 0, 1 + 2 * self.size if code is None else int(code))

    def _abort_text(self, code):
        size = self.size
        if 1 <= code <= size:
            return f"rank {code - 1} failed (died or stopped without finishing)"
        if size < code <= 2 * size:
            return f"rank {code - 1 - size} raised an exception"
        return "the group was aborted (by its parent or by abort())"

    def run(self, fn, *args, timeout=None, start_method="fork"):
        """Start ``size`` processes; rank k runs ``fn(comm_k, *args)``. Returns their
        return values in rank order (sent back through pipes: numpy arrays are fine).
        start_method: "fork" (the default: the ranks inherit fn and args), "spawn" or
        "forkserver" (fn and args are pickled, the group as a handle that re-attaches
        by name; see :mod:`sgd_shm.core.launcher` for when to choose which).

        If a rank dies (killed, nonzero exit) or raises, the group is aborted so the
        other ranks' waits raise RankFailure, every process is reaped, and this raises
        RankFailure ("rank k died (signal 9)") or CollectiveError with the rank's
        traceback (chained to the rank's exception itself, as ``__cause__``, when it
        pickles). timeout: seconds for the whole run (None: no limit) ->
        CollectiveTimeout. The group's rounds start again from 0 at each run."""
        self._check_open()
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        timeout = check_timeout("timeout", timeout)
        start_method = check_start_method(start_method)
        W = self._W
        for k in range(self.size):
            pid = int(W[_RANKS + k * L + _R_PID])
            if pid and _pid_alive(pid) and not W[_RANKS + k * L + _R_LEFT]:
                raise CollectiveError(f"rank {k} is attached by process {pid}; run() forks "
                                      "its own ranks: close the other communicators first")
        self._reset()
        import multiprocess as mp
        from multiprocess.connection import wait as mp_wait
        ctx = mp.get_context(start_method)
        parent = os.getpid()
        procs, conns = [], []
        try:
            for k in range(self.size):
                rd, wr = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_child_main, name=f"shm-rank-{k}", daemon=True,
                                args=(self, k, fn, args, wr, parent, start_method))
                p.start()
                wr.close()
                procs.append(p)
                conns.append(rd)
            return self._supervise(procs, conns, mp_wait, timeout)
        finally:
            for p in procs:
                if p.is_alive():
                    try:
                        os.kill(p.pid, signal.SIGKILL)
                    except ProcessLookupError:  # pragma: no cover
                        pass
                p.join()
            for c in conns:
                c.close()

    def _supervise(self, procs, conns, mp_wait, timeout):
        """Wait for every rank of run(): collect the results, abort the group as soon
        as a rank fails, dies or the timeout passes, kill the stragglers after a grace
        time, then return the results or raise."""
        st = _RunWatch(self.size)
        deadline = None if timeout is None else time.monotonic() + timeout
        grace = 2.0
        by_sentinel = {p.sentinel: k for k, p in enumerate(procs)}
        by_conn = {id(c): k for k, c in enumerate(conns)}
        while st.alive:
            objs = [conns[k] for k in st.open_conn] + [procs[k].sentinel for k in st.alive]
            for o in mp_wait(objs, timeout=0.05):
                if o in by_sentinel:
                    continue
                self._take(st, by_conn[id(o)], conns)
            self._reap(st, procs, conns)
            now = time.monotonic()
            if (deadline is not None and now > deadline and not st.timed_out
                    and st.fail_t is None):
                st.timed_out = True
                self.abort()
                st.fail_t = now
            if st.fail_t is not None and now - st.fail_t > (0.5 if st.timed_out else grace):
                for k in st.alive - st.killed:
                    st.killed.add(k)
                    try:
                        os.kill(procs[k].pid, signal.SIGKILL)
                    except ProcessLookupError:  # pragma: no cover
                        pass
        return self._outcome(st, timeout)

    def _take(self, st, k, conns):
        """Read rank k's one message (its result or its error)."""
        try:
            msg = conns[k].recv()
        except (EOFError, OSError):
            st.open_conn.discard(k)
            return
        st.open_conn.discard(k)
        if msg[0] == "ok":
            st.results[k], st.got[k] = msg[1], True
        else:
            st.errors[k] = (msg[1], msg[2], msg[3])
            if not msg[2]:
                self.abort(1 + self.size + k)
            st.fail_t = st.fail_t or time.monotonic()

    def _reap(self, st, procs, conns):
        """Note the ranks whose process exited; one that died without reporting aborts
        the group."""
        for k in list(st.alive):
            if procs[k].exitcode is None:
                continue
            if k in st.open_conn and conns[k].poll():
                self._take(st, k, conns)
            st.alive.discard(k)
            code = procs[k].exitcode
            if not st.got[k] and k not in st.errors and k not in st.killed:
                st.deaths[k] = code
                self.abort(1 + k)
                st.fail_t = st.fail_t or time.monotonic()

    @staticmethod
    def _outcome(st, timeout):
        """run()'s result once every rank exited, or the first failure as an error."""
        if st.deaths:
            k = min(st.deaths)
            code = st.deaths[k]
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            more = ""
            if len(st.deaths) > 1:
                more = "; also " + ", ".join(f"rank {j}" for j in sorted(st.deaths) if j != k)
            raise RankFailure(f"rank {k} died ({how}) before returning{more}; the other "
                              "ranks were aborted")
        raised = {k: e for k, e in st.errors.items() if not e[1]}
        if raised:
            k = min(raised)
            raise CollectiveError(f"rank {k} raised:\n{raised[k][0]}") from raised[k][2]
        if st.timed_out:
            left = sorted(k for k in range(len(st.got)) if not st.got[k])
            raise CollectiveTimeout(f"run() took longer than timeout={timeout} s; ranks "
                                    f"not finished: {left} (killed)")
        if st.errors:
            k = min(st.errors)
            raise RankFailure(f"rank {k} failed:\n{st.errors[k][0]}")
        return st.results


class _RunWatch:
    """What ShmGroup.run()'s supervisor knows about its ranks."""

    def __init__(self, size):
        self.results = [None] * size
        self.got = [False] * size
        self.errors = {}                    # k -> (traceback text, was a RankFailure,
        #                                     the exception when it pickles, else None)
        self.deaths = {}                    # k -> exit code
        self.alive = set(range(size))
        self.open_conn = set(range(size))
        self.fail_t = None                  # when the first failure was seen
        self.timed_out = False
        self.killed = set()                 # ranks the supervisor killed after the grace time


def _portable(e):
    """e itself if it survives pickling (the parent then chains it to the error it
    raises, so a caller can test its type), else None."""
    try:
        pickle.loads(pickle.dumps(e))
    except Exception:
        return None
    return e


def _child_main(group, k, fn, args, conn, parent, start_method="fork"):
    code = 0
    try:
        comm = group.communicator(k)
        comm._parent = parent
        out = fn(comm, *args)
        comm.close()
        conn.send(("ok", out))
    except BaseException as e:                  # noqa: BLE001 - reported to the parent
        code = 1
        rf = isinstance(e, RankFailure)
        if not rf:
            try:
                group.abort(1 + group.size + k)
            except Exception:                  # pragma: no cover
                pass
        try:
            conn.send(("err", traceback.format_exc(), rf, _portable(e)))
        except Exception:                      # pragma: no cover
            pass
    finally:
        conn.close()
    if start_method != "fork":
        exit_now(code)              # a fresh interpreter's shutdown is slow and not needed
    if code:
        sys.exit(code)


class _Handle:
    __slots__ = ("r", "base", "mode", "buf", "flat", "arrived", "state", "done", "gather",
                 "kind", "out")

    def __init__(self, r, base, mode, buf, gather=False):
        self.r, self.base, self.mode, self.buf = r, base, mode, buf
        self.gather = gather
        self.kind = 1 << (min(mode, _MAJ_INIT) + (3 if gather else 0))
        self.out = None                         # a gather's parts, one buffer per round
        self.flat = buf.reshape(-1)
        self.arrived = False                    # our arrival CAS ran (or we were late)
        self.state = 0                          # the closed state, once seen
        self.done = False                       # result copied out, read counted


class ShmCommunicator(Communicator):
    """Rank ``rank`` of a :class:`ShmGroup` (get it with ``group.communicator(rank)``).
    :meth:`buffer` is this rank's contribution row: fill it in place and pass it to a
    collective to save the copy in (only between rounds: after the previous wait).

    All ranks must call the same kind of collective in the same round (as in MPI)."""

    #: polls of a word in one compiled spin (first try / later tries), seconds of
    #: ``sched_yield`` before sleeping, sleep bounds, seconds between liveness checks
    SPIN, SPIN_AGAIN = 2000, 64
    YIELD_S = 0.002
    SLEEP_MIN, SLEEP_MAX = 50e-6, 200e-6
    CHECK_S = 0.1

    def __init__(self, group, rank, *, late, average, timeout):
        super().__init__(rank, group.size, group.n, group.dtype, late=late, average=average,
                         timeout=timeout)
        self.group = group
        self._W = W = group._W
        self._slots = group._slots
        self._depth = group.depth
        self._nchunks = group.nchunks
        self._row = group._C[self.rank, :self.n]
        self._gather_row = group._C[self.rank]     # count, then the payload
        self._rowaddr = self._row.ctypes.data
        self._bit = 1 << self.rank
        self._full = (1 << self.size) - 1
        self._parent = None
        self._closed = False
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):    # pragma: no cover
            cpus = os.cpu_count() or 1
        if self.size > cpus:                    # oversubscribed: spinning steals the
            self.SPIN = min(self.SPIN, 200)     # core of the rank we wait for
        me = _RANKS + self.rank * L
        self._me = me
        pid = int(W[me + _R_PID])
        if pid and pid != os.getpid() and _pid_alive(pid) and not W[me + _R_LEFT]:
            raise ValueError(f"rank {self.rank} is already attached by process {pid}; "
                             "each rank belongs to one process (pick another rank)")
        if W[me + _R_LEFT]:
            raise ValueError(f"rank {self.rank} already closed its communicator in this "
                             "group; ranks cannot rejoin (make a new group)")
        W[me + _R_POSTED] = 0
        W[me + _R_PASSED] = 0
        _k_store(W, me + _R_PID, os.getpid())
        self._next_check = 0.0

    # ---- extras -------------------------------------------------------------------------
    def buffer(self) -> np.ndarray:
        """This rank's contribution row (n elements): filled in place and passed to a
        collective, it is not copied in. Write it only while no round is pending."""
        self._check_open()
        return self._row

    def _check_open(self):
        if self._closed or self.group.closed:
            raise CollectiveError(f"rank {self.rank}: this communicator is closed")

    # ---- transport ----------------------------------------------------------------------
    def _post(self, r, kind, buf, gather=False):
        self._check_open()
        if kind == "sync":
            mode = _SYNC
        elif kind == "solo":
            mode = _SOLO
        else:
            mode = _MAJ_INIT if initiator(self.group.seed, r, self.size) == self.rank \
                else _MAJ_OTHER
        h = _Handle(r, self._slots + (r % self._depth) * _SLOT_WORDS, mode, buf, gather)
        self._W[self._me + _R_POSTED] = r + 1
        self._arrive(h)                         # back-pressure: may not arrive yet
        return h

    def _post_gather(self, r, kind, payload):
        self._check_open()
        if not self.group.gather:
            raise ValueError("this ShmGroup cannot gather: make it with ShmGroup(size, n, "
                             "gather=True) (n: the largest payload)")
        h = self._post(r, kind, payload, gather=True)
        h.out = np.empty(self.size * (self.n + 1), self.dtype)   # the round's own parts
        return h

    def _arrive(self, h):
        """Arrive at h's round if its slot serves it; True once arrived (or late)."""
        s = _k_post(self._W, h.base, L, h.r, self._gather_row if h.gather else self._row,
                    h.flat, self._bit, self._full, h.mode,
                    h.buf.ctypes.data != self._rowaddr, _CLOSED_UPTO, h.kind, h.gather)
        if s == -2:
            self._mismatch(h)
        if s < 0:
            return False
        h.arrived = True
        if s & CLOSED:
            h.state = s
            if not s & self._bit and not h.gather:
                self._keep_late(h.buf)          # before the result overwrites it
        return True

    def _mismatch(self, h):
        """Another rank called round h.r as another kind or operation: abort the group
        (the others stop with RankFailure) and raise."""
        _k_cas(self._W, _ABORT, 0, 1 + self.size + self.rank)
        kinds = int(self._W[h.base + _S_KINDS * L])
        seen = [f"{op} {k}" for b, (op, k) in enumerate(
            (op, k) for op in ("reduce", "gather") for k in ("sync", "solo", "majority"))
            if kinds >> b & 1]
        raise CollectiveError(
            f"rank {self.rank}: the ranks disagree on what round {h.r} is ({', '.join(seen)}); "
            "every rank must call the same kind of collective, reduce or gather, in each "
            "round")

    def _complete_once(self, h, spins):
        g = self.group
        out, nchunks = (h.out, g.gchunks) if h.gather else (h.flat, self._nchunks)
        code, state = _k_complete(self._W, h.base, L, h.r, h.state, g._C,
                                  g._R[h.r % self._depth], out, nchunks, g.chunk,
                                  self.n, self.size, self._depth, spins, h.gather)
        if state:
            h.state = state
        if code == 0:
            h.done = True
            self._W[self._me + _R_PASSED] = h.r + 1
            return True
        return False

    def _test(self, h) -> bool:
        if h.done:
            return True
        self._check_open()
        self._health(h, None, time.monotonic(), "close")
        if not h.arrived and not self._arrive(h):
            return False
        return self._complete_once(h, 1)

    def _finish(self, h, buf, deadline):
        self._check_open()                 # (a round pending at close cannot finish)
        if not h.done:
            if not h.arrived and not self._arrive(h):
                self._backoff(h, deadline, "slot", lambda: self._arrive(h))
            if not self._complete_once(h, self.SPIN):
                self._backoff(h, deadline, "close",
                              lambda: self._complete_once(h, self.SPIN_AGAIN))
        mask = h.state & MASK
        return mask, bool(mask & self._bit)

    def _finish_gather(self, h, deadline):
        mask, contributed = self._finish(h, h.buf, deadline)
        out, n1, parts = h.out, self.n + 1, []
        for j in range(self.size):
            if mask >> j & 1:
                o = j * n1
                parts.append(out[o + 1:o + 1 + int(out[o])])     # views of the round's
        return mask, contributed, parts

    def _backoff(self, h, deadline, what, attempt):
        """Call attempt() until it returns True: sched_yield between tries for
        YIELD_S, then sleeps of SLEEP_MIN growing to SLEEP_MAX. Checks the abort word,
        the deadline and (every CHECK_S) the other ranks' liveness meanwhile."""
        t0 = time.monotonic()
        sleep = self.SLEEP_MIN
        while True:
            now = time.monotonic()
            self._health(h, deadline, now, what)
            if now - t0 < self.YIELD_S:
                os.sched_yield()
            else:
                time.sleep(sleep)
                sleep = min(sleep * 1.5, self.SLEEP_MAX)
            if attempt():
                return

    def _health(self, h, deadline, now, what):
        W = self._W
        code = int(W[_ABORT])
        if code:
            raise RankFailure(f"rank {self.rank}, round {h.r}: "
                              f"{self.group._abort_text(code)}; the group is aborted")
        if deadline is not None and now > deadline:
            raise CollectiveTimeout(self._timeout_text(h, what))
        if now < self._next_check:
            return
        self._next_check = now + self.CHECK_S
        if (self._parent is not None and os.getppid() != self._parent
                and not _pid_alive(self._parent)):     # a forkserver's child: not ppid
            _k_cas(W, _ABORT, 0, 1 + self.rank)
            raise RankFailure(f"rank {self.rank}, round {h.r}: the parent process "
                              f"{self._parent} died; stopping")
        for k in range(self.size):
            if k == self.rank:
                continue
            base = _RANKS + k * L
            pid = int(W[base + _R_PID])
            if not pid:
                continue
            left = int(W[base + _R_LEFT])
            if left and left - 1 > h.r:
                continue                        # it passed this round and left cleanly
            if left:
                why = (f"rank {k} closed its communicator after {left - 1} rounds, "
                       f"so it will never reach round {h.r}")
            elif not _pid_alive(pid):
                why = f"rank {k} (pid {pid}) died"
            else:
                continue
            _k_cas(W, _ABORT, 0, 1 + k)
            raise RankFailure(f"rank {self.rank}, round {h.r}: {why}; the group is aborted")

    def _timeout_text(self, h, what):
        W = self._W
        ranks = [k for k in range(self.size)]
        if what == "slot":
            old = h.r - self.group.depth
            slow = [k for k in ranks if W[_RANKS + k * L + _R_PASSED] <= old]
            return (f"rank {self.rank}: timed out starting round {h.r}: its slot still "
                    f"holds round {old}, not yet read by ranks {slow} (depth="
                    f"{self.group.depth} rounds in flight)")
        if what == "close" and not h.state:
            st = int(W[h.base + _S_STATE * L])
            missing = [k for k in ranks if not (st >> k) & 1]
            return (f"rank {self.rank}: timed out waiting for round {h.r} to close; ranks "
                    f"{missing} have not arrived")
        return (f"rank {self.rank}: timed out waiting for the reduction of round {h.r} "
                f"({int(W[h.base + _S_DONE * L])} of {self.group.nchunks} chunks done)")

    def _closed_upto(self) -> int:
        self._check_open()
        return int(_k_load(self._W, _CLOSED_UPTO))

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.group.closed:
            passed = self._next - (1 if self._pending is not None else 0)
            _k_store(self._W, self._me + _R_LEFT, passed + 1)
        self._W = None

    def __repr__(self):
        return (f"<ShmCommunicator rank={self.rank} size={self.size} n={self.n} "
                f"next_round={self._next}>")
