"""Allreduce, allgather and the partial collectives of eager-SGD over MPI (mpi4py), with
a progress thread per rank, as in fflib2 (Li et al., PPoPP 2020, arXiv:1908.04207).

Protocol (every rank runs one progress thread, a ``_Progress`` object; after
construction only that thread calls MPI, on a private ``comm.Dup()``):

* Rounds (reductions, gathers and the close round, numbered in one sequence) are
  *activated* strictly in order, one at a time, by each progress thread: ``sync``: when
  its own rank posted the round; ``solo``: when its own rank posted it or an activation
  message for it arrived; ``majority``: when the round's initiator posted it (this
  rank) or the initiator's activation message arrived. A thread that activates a solo
  round (or a majority round as its initiator) by its own rank's arrival sends a small
  activation message ``(round, code)`` to every other rank (``Isend``; duplicates from
  two solo activators are dropped by round id). A round's *code* names its operation
  and kind: sync, solo, majority (reductions), close, sync/solo/majority gather.
* Phase 1 of every round is a nonblocking allreduce (``Iallreduce``, SUM) on the
  private communicator of an int64 *meta* vector of one length for every round:
  [this rank's contributor bit (distinct bits, so the sum is the OR, exact), one count
  per code (so ranks that disagree on a round's operation or kind, or on when to close,
  see it), a mismatch count (below), P payload lengths (a gather: rank k writes its
  payload's length at k; a non-contributor writes 0)]. A reduction (and the close
  round) also starts, right after it, the ``Iallreduce`` of the data (the caller's
  buffer, in place, when this rank's post was there at activation; zeros otherwise).
* Phase 2 of a gather round, once its meta vector is in and every rank agrees on the
  code: one ``Iallgatherv`` of the payloads, with the lengths from the meta vector as
  counts (a non-contributor sends nothing); the received buffer is cut into the
  contributors' parts, in rank order. Every thread issues the same sequence of
  collectives, one round after the other, so they always match.
* Disagreement: when the code counts are not P of one code, every rank raises
  CollectiveError. A gather rank first issues the data ``Iallreduce`` if some rank took
  the round as a reduction or close (that rank issued one), so no collective is left
  unmatched. A rank whose post comes after its thread activated the round is *late*:
  its wait returns the stored result and its contribution goes to the late policy
  (``_keep_late``; a gather's payload is dropped). If its post was of another code than
  the round, it raises CollectiveError and sets the mismatch count in its next round's
  meta vector, so every rank raises there.
* Back-pressure: a thread holds at most ``depth`` results its main thread has not
  consumed; beyond that it stops joining new rounds, which holds the other ranks back
  in that round's meta allreduce (bounded lag: a rank is never more than ``depth``
  rounds behind the fastest).
* ``close()`` is collective: it is one more round (code "close") in the same stream;
  if any rank instead starts a round there (it ran a different number of rounds), the
  code counts differ and every rank raises CollectiveError. Then the threads exchange
  how many activation messages each sent to each other (``Ialltoall``), receive the
  stragglers, cancel their receive and stop; the main thread frees the communicator.

No deadlock: a thread only waits (in a collective) for ranks that have activated the
same round, and each of them will: a rank's main thread posts round r only after its
thread finished every round before r; a thread held back by ``depth`` is waiting for its
own main thread, which is never blocked on a later round than its thread has finished;
and a round every rank passes through is activated on each (sync: its own post;
solo: the first post, whose message reaches every rank; majority: the initiator's
post). Waits yield (Condition waits in the main thread; short sleeps in the progress
thread) and honour ``timeout`` (a round's, from its activation, covers both phases).
"""
from __future__ import annotations

import atexit
import threading
import time
import weakref

import numpy as np

from sgd_shm.collectives.base import (
    MAX_RANKS,
    CollectiveError,
    CollectiveTimeout,
    Communicator,
    initiator,
)
from sgd_shm.collectives.stale import remove_stale_segments

try:
    from mpi4py import MPI
except ImportError as e:        # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "sgd_shm.collectives.mpi needs mpi4py and an MPI library; install them with "
        "pip install 'relaxed-sgd-kit[mpi]' (mpi4py + mpich), or use "
        "sgd_shm.collectives.ShmGroup on one box") from e

__all__ = ["MPICommunicator"]


def intracomm(comm):
    """``comm`` checked as the communicator of a run (None: COMM_WORLD): an mpi4py
    intracommunicator, not COMM_NULL (which is falsy: ``comm or COMM_WORLD`` swapped it
    for the world)."""
    if comm is None:
        return MPI.COMM_WORLD
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"comm: must be an mpi4py intracommunicator (an MPI.Intracomm such "
                        f"as MPI.COMM_WORLD, or one from comm.Split), got "
                        f"{type(comm).__name__} {comm!r}")
    return comm

_TAG_ACT = 7011
# round codes: the kind of a reduction, the close round, the kind of a gather
_SYNC, _SOLO, _MAJ, _CLOSE, _GSYNC, _GSOLO, _GMAJ = range(7)
_WRONG = 7      # not a round: counts the ranks that found an earlier round mismatched
_NCODE = 8
_REDUCE_CODE = {"sync": _SYNC, "solo": _SOLO, "majority": _MAJ}
_GATHER_CODE = {"sync": _GSYNC, "solo": _GSOLO, "majority": _GMAJ}
_NAME = {_SYNC: "sync", _SOLO: "solo", _MAJ: "majority", _CLOSE: "close",
         _GSYNC: "sync gather", _GSOLO: "solo gather", _GMAJ: "majority gather",
         _WRONG: "rank(s) that started an earlier round as another kind"}
_GATHERS = (_GSYNC, _GSOLO, _GMAJ)
_SOLOS = (_SOLO, _GSOLO)               # activated by the first arrival
_MAJS = (_MAJ, _GMAJ)                  # activated by the drawn initiator
_WITH_DATA = (_SYNC, _SOLO, _MAJ, _CLOSE)   # rounds whose phase 1 reduces n elements
_MPI_FLOAT = {np.dtype(np.float64): MPI.DOUBLE, np.dtype(np.float32): MPI.FLOAT}


def _meta_len(P):
    """The meta vector: [contributor bits, one count per round code and _WRONG,
    P payload lengths]."""
    return 1 + _NCODE + P


_live = weakref.WeakSet()


@atexit.register
def _stop_all():                # before mpi4py finalizes MPI: stop the progress threads
    for c in list(_live):
        try:
            c._abort()
        except Exception:       # pragma: no cover
            pass


class _Post:
    """A round this rank's main thread posted: its code and its buffer (a reduction:
    the caller's buffer; a gather: a copy of the payload; close: None)."""
    __slots__ = ("r", "code", "buf")

    def __init__(self, r, code, buf):
        self.r, self.code, self.buf = r, code, buf


class _Cur:
    """The round in flight on the progress thread. phase 1: the meta Iallreduce (and,
    for a reduction or close, the data Iallreduce); phase 2: a gather's Iallgatherv;
    ``failed``: the message to raise once the requests (issued only to match the other
    ranks' collectives) complete."""
    __slots__ = ("r", "code", "post", "reqs", "data", "meta", "phase", "failed", "t0",
                 "counts", "displs")

    def __init__(self, r, code, post, reqs, data, meta):
        self.r, self.code, self.post = r, code, post
        self.reqs, self.data, self.meta = reqs, data, meta
        self.phase, self.failed, self.t0 = 1, None, time.monotonic()
        self.counts = self.displs = None


class MPICommunicator(Communicator):
    """A communicator over the ranks of an MPI communicator (default COMM_WORLD).

    Construction and :meth:`close` are collective (every rank calls them, like MPI
    collectives). n, dtype, late, average, timeout: as
    :class:`~sgd_shm.collectives.base.Communicator`; depth: results a rank's progress
    thread may hold for rounds its main thread has not reached (the most a rank can
    lag behind the fastest); seed: draws the initiator of each majority round (the same
    on every rank). Needs MPI's THREAD_MULTIPLE level (mpi4py's default).
    """

    def __init__(self, n, dtype=np.float64, *, comm=None, late="drop", average="size",
                 depth=8, seed=0, timeout=None):
        comm = intracomm(comm)
        size = comm.Get_size()
        if size > MAX_RANKS:
            raise ValueError(
                f"comm must have at most {MAX_RANKS} ranks (contributor sets travel as "
                f"one 64-bit mask), got {size}; split it with comm.Split")
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)):
            raise TypeError(f"depth must be an int, got {type(depth).__name__}")
        if depth < 1:
            raise ValueError(f"depth must be >= 1 (results a rank may hold for rounds "
                             f"it has not reached), got {depth}; pass depth=8")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        if not MPI.Is_initialized() or MPI.Is_finalized():
            raise CollectiveError("MPI is not initialized (or already finalized)")
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise CollectiveError(
                "MPICommunicator needs MPI initialized with THREAD_MULTIPLE (its progress "
                "thread calls MPI while the program may too); do not set "
                "mpi4py.rc.thread_level below 'multiple'")
        super().__init__(comm.Get_rank(), size, n, dtype, late=late, average=average,
                         timeout=timeout)
        self.depth = int(depth)
        self.seed = int(seed)
        if comm.Get_rank() == 0:        # a killed job's MPICH segments (see collectives.stale)
            remove_stale_segments()
        self._comm = comm.Dup()         # collective; from here on only the thread uses it
        self._check_agreement()
        self._cv = threading.Condition(threading.Lock())
        self._posts = {}                # round -> _Post (at most one is outstanding)
        self._results = {}              # round -> (value, mask, code); value: a
        #   reduction's result when this rank did not contribute (None when it did: the
        #   result is in the caller's buffer), or a gather's parts
        self._act = 0                   # rounds this rank's thread has activated
        self._consumed = 0              # rounds the main thread has finished
        self._error = None              # message of a failure in the thread
        self._error_timeout = False
        self._stop = False              # ask the thread to stop (abort)
        self._done = False              # the thread finished the close protocol
        self._closed = False
        self._reported = False          # the thread's error was raised to the caller
        self._wrong = False             # this rank was late for a round of another kind
        self._mismatch = None           # (round, message) of that round
        self._scratch = []              # free zero-able buffers for non-contributions
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"mpi-progress-{self.rank}")
        _live.add(self)
        self._thread.start()

    def _check_agreement(self):
        """Every rank must build the communicator with the same n, dtype, late, average
        and seed (one allgather, before the thread starts): a rank with another n got
        its own values back unsummed, another dtype garbage sums, another seed
        majority rounds that never completed."""
        mine = (self.n, self.dtype.str, self.late, self.average, self.seed)
        every = self._comm.allgather(mine)
        if any(other != mine for other in every):
            self._comm.Free()
            names = ("n", "dtype", "late", "average", "seed")
            differ = [f"{k}: {sorted({str(e[i]) for e in every})}"
                      for i, k in enumerate(names) if len({e[i] for e in every}) > 1]
            raise CollectiveError(f"the ranks built MPICommunicator with different settings "
                                  f"({'; '.join(differ)}); every rank must pass the same "
                                  "n, dtype, late, average and seed")

    # ---- main thread side --------------------------------------------------------------
    def _post(self, r, kind, buf):
        return self._post_code(r, _REDUCE_CODE[kind], buf.reshape(-1))

    def _post_gather(self, r, kind, payload):
        # a copy: the caller may reuse its array as soon as start_gather returns
        return self._post_code(r, _GATHER_CODE[kind], np.array(payload, self.dtype))

    def _post_code(self, r, code, buf):
        """Hand round r to the progress thread; the handle is (r, code, late)."""
        with self._cv:
            self._raise_error()
            if r < self._act:               # the thread already activated r without us
                return (r, code, True)
            self._posts[r] = _Post(r, code, buf)
            self._cv.notify_all()
        return (r, code, False)

    def _test(self, handle):
        with self._cv:
            return handle[0] in self._results or self._error is not None

    def _finish(self, handle, buf, deadline):
        r, code, late = handle
        data, mask = self._await(r, code, deadline)
        flat = buf.reshape(-1)
        contributed = (not late) and data is None
        if not contributed:
            self._keep_late(flat)
            flat[:] = data
            with self._cv:
                self._scratch.append(data)
        return mask, contributed

    def _finish_gather(self, handle, deadline):
        r, code, late = handle
        parts, mask = self._await(r, code, deadline)
        # a late rank's payload was never sent (it is dropped: payloads do not add)
        return mask, not late, parts

    def _await(self, r, code, deadline):
        """Wait for round r's result (value, contributor mask), consume it, and check
        that the round was what this rank started (``code``)."""
        if self._mismatch is not None and self._mismatch[0] == r:
            raise CollectiveError(self._mismatch[1])        # a second wait()
        with self._cv:
            while r not in self._results:
                self._raise_error()
                if deadline is None:
                    self._cv.wait(1.0)
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeout(
                        f"rank {self.rank}: {_NAME[code]} round {r} did not complete "
                        "within the timeout (another rank is slow, stopped calling "
                        "collectives, or died); wait() again, or raise the timeout")
                self._cv.wait(left)
            value, mask, rcode = self._results.pop(r)
            self._consumed = r + 1
            self._cv.notify_all()
        if rcode != code:
            msg = (f"rank {self.rank}: round {r} was a {_NAME[rcode]} round on the other "
                   f"ranks but this rank started it as {_NAME[code]}; every rank must "
                   "call the same kind of collective (allreduce or allgather) in the "
                   "same round")
            with self._cv:
                # the others took round r as they meant it: tell them in the meta vector
                # of this rank's next round, so that every rank raises there
                self._wrong = True
                if rcode not in _GATHERS and value is not None:
                    self._scratch.append(value)     # the unused result buffer goes back
            self._mismatch = (r, msg)
            self._pending = None    # round r is consumed: close() (or a round) may follow
            raise CollectiveError(msg)
        return value, mask

    def _closed_upto(self):
        return self._act

    def _raise_error(self):
        if self._error is not None:
            self._reported = True
            cls = CollectiveTimeout if self._error_timeout else CollectiveError
            raise cls(self._error)

    def _close(self):
        if self._closed:
            return
        if self._error is not None:         # failed earlier: clean up, report it once
            reported = self._reported
            self._abort()
            if not reported:
                self._raise_error()
            return
        if self._pending is not None:
            raise CollectiveError(
                f"rank {self.rank}: close() while round {self._pending.round} is started "
                "and not waited for; wait() for it first")
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        with self._cv:
            if self._error is None:
                self._posts[self._next] = _Post(self._next, _CLOSE, None)
                self._cv.notify_all()
            while not self._done and self._error is None:
                if deadline is None:
                    self._cv.wait(1.0)
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    self._error = (f"rank {self.rank}: close() after {self._next} rounds "
                                   "did not complete within the timeout (the other ranks "
                                   "have not all called close())")
                    self._error_timeout = True
                    break
                self._cv.wait(left)
            ok = self._done and self._error is None
        self._abort()
        if ok:
            self._comm.Free()
        else:
            self._raise_error()

    def _abort(self):
        """Stop the progress thread (not collective); the communicator is then unusable."""
        self._closed = True
        with self._cv:
            self._stop = True
            if self._error is None:
                self._error = f"rank {self.rank}: the communicator is closed"
            self._cv.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        _live.discard(self)

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
        else:                               # an error on this rank: do not wait for others
            self._abort()

    # ---- the progress thread -------------------------------------------------------------
    def _run(self):
        prog = None
        try:
            prog = _Progress(self)
            prog.run()
        except BaseException as e:          # reported to the main thread
            with self._cv:
                if self._error is None:
                    self._error = (f"rank {self.rank}: progress thread failed: "
                                   f"{type(e).__name__}: {e}")
                self._cv.notify_all()
        finally:                            # leave no receive posted (abort / failure)
            if prog is not None:
                prog.cancel_receive()

    def _get_scratch(self):
        with self._cv:
            b = self._scratch.pop() if self._scratch else None
        if b is None:
            return np.zeros(self.n, self.dtype)
        b.fill(0)
        return b


class _Progress:
    """The progress thread of one :class:`MPICommunicator` (``owner``): its state and
    the steps of its loop. Only this thread calls MPI (on ``owner._comm``); it shares
    ``_posts``, ``_results``, ``_act``, ``_consumed``, ``_done`` and ``_scratch`` with
    the main thread under ``owner._cv``."""

    def __init__(self, owner):
        self.owner = owner
        self.comm, self.P, self.me = owner._comm, owner.size, owner.rank
        self.cv = owner._cv
        self.msg = np.zeros(2, np.int64)    # the receive buffer of activation messages
        self.status = MPI.Status()
        self.rreq = None                    # the posted receive of activation messages
        self.heard = {}                     # round -> set of kind codes heard
        self.sends = []                     # (request, buffer) of activation messages
        self.sent_to = np.zeros(self.P, np.int64)   # messages sent to each rank
        self.got_from = np.zeros(self.P, np.int64)  # messages received from each rank
        self.cur = None                     # the round in flight (a _Cur)
        self.finished = False               # the close round completed

    def run(self):
        if self.P > 1:
            self._post_receive()
        n_idle = 0
        while True:
            progress = self.drain()
            if self.sends:
                self.sends = [s for s in self.sends if not s[0].Test()]
            if self.owner._stop:
                return
            if self.cur is not None and self.poll_current():
                progress += 1
                if self.finished:
                    return
            if self.cur is None and self.activate_next():
                continue
            if progress:
                n_idle = 0
                continue
            n_idle += 1
            self.idle(n_idle)

    def _post_receive(self):
        self.rreq = self.comm.Irecv(self.msg, source=MPI.ANY_SOURCE, tag=_TAG_ACT)

    def drain(self):
        """Take every activation message that has arrived; returns how many."""
        n = 0
        while self.rreq is not None and self.rreq.Test(self.status):
            r, k = int(self.msg[0]), int(self.msg[1])
            self.got_from[self.status.Get_source()] += 1
            if r >= self.owner._act:
                self.heard.setdefault(r, set()).add(k)
            self._post_receive()
            n += 1
        return n

    def announce(self, r, code):
        """Send the activation message (r, code) to every other rank."""
        b = np.array([r, code], np.int64)
        for d in range(self.P):
            if d != self.me:
                self.sends.append((self.comm.Isend(b, dest=d, tag=_TAG_ACT), b))
                self.sent_to[d] += 1

    def poll_current(self):
        """Test the in-flight round; on progress (a phase completed) return True: check
        the meta vector, start a gather's phase 2, finish the close protocol or hand
        the result to the main thread."""
        c = self.cur
        if not MPI.Request.Testall(c.reqs):
            o = self.owner
            if o.timeout is not None and time.monotonic() - c.t0 > o.timeout:
                o._error_timeout = True
                raise CollectiveError(
                    f"{_NAME[c.code]} round {c.r} did not complete within {o.timeout} s "
                    "(a rank died, or stopped calling collectives)")
            return False
        if c.failed is not None:
            raise CollectiveError(c.failed)
        if c.phase == 1:
            err = self.disagreement(c)
            if err is not None:
                return self.fail(c, err)
            if c.code in _GATHERS:
                self.start_gatherv(c)
                return True
        self.cur = None
        if c.code == _CLOSE:
            self.finish_close()
            with self.cv:
                self.owner._done = True
                self.cv.notify_all()
            self.finished = True
            return True
        if c.code in _GATHERS:
            value = self.parts(c)
        else:
            value = None if c.post is not None else c.data
        with self.cv:
            self.owner._results[c.r] = (value, int(c.meta[0]), c.code)
            self.cv.notify_all()
        return True

    def disagreement(self, c):
        """The error message when the ranks did not all post round c.r as the same
        kind of round (the code counts of the summed meta vector), else None."""
        counts = c.meta[1:1 + _NCODE]
        if int(counts.max()) == self.P and int(counts.sum()) == self.P:
            return None
        desc = ", ".join(f"{int(k)} {_NAME[i]}" for i, k in enumerate(counts) if k)
        return (f"round {c.r}: the ranks disagree on what round {c.r} is ({desc}); "
                "every rank must call the same kind of collective (allreduce or "
                "allgather) in each round and close() after the same number of rounds")

    def fail(self, c, err):
        """Raise err, after matching the data Iallreduce that the ranks which took
        round c.r as a reduction (or close) issued after the meta one: a gather rank
        did not issue it, and no collective may be left unmatched."""
        counts = c.meta[1:1 + _NCODE]
        if c.code in _GATHERS and any(counts[k] for k in _WITH_DATA):
            c.data = np.zeros(self.owner.n, self.owner.dtype)
            c.reqs = [self.comm.Iallreduce(MPI.IN_PLACE, c.data, MPI.SUM)]
            c.failed = err
            return True
        raise CollectiveError(err)

    def start_gatherv(self, c):
        """Phase 2 of a gather round: every rank's payload (its length from the meta
        vector, 0 for a non-contributor) to every rank, by one Iallgatherv."""
        P = self.P
        c.counts = c.meta[1 + _NCODE:1 + _NCODE + P].copy()
        c.displs = np.zeros(P, np.int64)
        np.cumsum(c.counts[:-1], out=c.displs[1:])
        dt = self.owner.dtype
        mtype = _MPI_FLOAT[dt]
        send = c.post.buf if c.post is not None else np.zeros(0, dt)
        c.data = np.empty(int(c.counts.sum()), dt)
        c.reqs = [self.comm.Iallgatherv([send, int(c.counts[self.me]), mtype],
                                        [c.data, (c.counts, c.displs), mtype])]
        c.phase = 2

    @staticmethod
    def parts(c):
        """The contributors' payloads (ascending rank), cut from the gathered buffer."""
        mask = int(c.meta[0])
        return tuple(c.data[int(c.displs[k]):int(c.displs[k] + c.counts[k])]
                     for k in range(len(c.counts)) if mask >> k & 1)

    def _choose(self, a):
        """Under the lock: whether round ``a`` activates now, and as what kind.
        Returns (post, code or None, codes heard for a, whether this rank must report
        an earlier mismatch); on activation advances ``_act`` and takes the post."""
        o = self.owner
        with self.cv:
            post = o._posts.get(a)
            hold = post is None and a - o._consumed >= o.depth
            code, wrong = None, False
            h = self.heard.get(a, ())
            if post is not None:
                # a majority round waits for its initiator (or any activation message)
                if (post.code not in _MAJS or h
                        or initiator(o.seed, a, self.P) == self.me):
                    code = post.code
            elif not hold:                  # joined without a post: as announced
                solo = [k for k in h if k in _SOLOS]
                maj = [k for k in h if k in _MAJS]
                code = min(solo) if solo else (min(maj) if maj else None)
            if code is not None:
                o._act = a + 1
                o._posts.pop(a, None)
                wrong, o._wrong = o._wrong, False
        return post, code, h, wrong

    def activate_next(self):
        """Activate the next round if it is due: announce it if this rank's arrival
        activated it, and start its phase 1 (the meta Iallreduce, then, for a
        reduction or close, the data Iallreduce). Returns whether it did."""
        o = self.owner
        a = o._act
        post, code, h, wrong = self._choose(a)
        if code is None:
            return False
        self.heard.pop(a, None)
        if post is not None and (
                (code in _SOLOS and not h)
                or (code in _MAJS and initiator(o.seed, a, self.P) == self.me)
                or code == _CLOSE):
            self.announce(a, code)
        if code == _CLOSE:
            post = None
        meta = np.zeros(_meta_len(self.P), np.int64)
        meta[1 + code] = 1
        meta[1 + _WRONG] = wrong            # a count past P: every rank raises
        if post is not None:
            meta[0] = 1 << self.me
            if code in _GATHERS:
                meta[1 + _NCODE + self.me] = post.buf.size
        # the meta Iallreduce is every round's first collective, of one length for
        # every kind, so ranks that disagree on the round still match it
        reqs = [self.comm.Iallreduce(MPI.IN_PLACE, meta, MPI.SUM)]
        data = None
        if code in _WITH_DATA:
            data = post.buf if post is not None else o._get_scratch()
            reqs.append(self.comm.Iallreduce(MPI.IN_PLACE, data, MPI.SUM))
        self.cur = _Cur(a, code, post, reqs, data, meta)
        return True

    def idle(self, n):
        """Back off after the n-th pass in a row without progress."""
        if n < 8:
            time.sleep(0)
        elif self.cur is None and not self.sends:
            o = self.owner
            with self.cv:                   # a post wakes us at once
                if not o._stop and o._act not in o._posts:
                    self.cv.wait(min(5e-4, 2e-5 * n))
        else:
            time.sleep(min(2e-4, 1e-5 * n))

    def finish_close(self):
        """After a clean close round: receive every activation message still in flight,
        cancel the receive, complete the sends."""
        P = self.P
        if P == 1:
            return
        expect = np.zeros(P, np.int64)
        req = self.comm.Ialltoall(self.sent_to, expect)
        done = False
        while True:
            while self.rreq.Test(self.status):
                self.got_from[self.status.Get_source()] += 1
                self._post_receive()
            if not done:
                done = req.Test()
            self.sends[:] = [s for s in self.sends if not s[0].Test()]
            if done and np.array_equal(self.got_from, expect) and not self.sends:
                break
            if self.owner._stop:
                return
            time.sleep(5e-5)
        self.rreq.Cancel()
        while not self.rreq.Test():
            time.sleep(5e-5)
        self.rreq = None

    def cancel_receive(self):
        """Leave no receive posted (after an abort or a failure)."""
        rreq, self.rreq = self.rreq, None
        if rreq is not None:
            try:
                rreq.Cancel()
                t = time.monotonic() + 0.2
                while not rreq.Test() and time.monotonic() < t:
                    time.sleep(1e-4)
            except Exception:               # pragma: no cover
                pass
