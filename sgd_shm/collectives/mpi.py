"""Allreduce and the partial collectives of eager-SGD over MPI (mpi4py), with a
progress thread per rank, as in fflib2 (Li et al., PPoPP 2020, arXiv:1908.04207).

Protocol (every rank runs one progress thread, a ``_Progress`` object; after
construction only that thread calls MPI, on a private ``comm.Dup()``):

* Rounds are *activated* strictly in order, one at a time, by each progress thread:
  ``sync``: when its own rank posted the round; ``solo``: when its own rank posted it
  or an activation message for it arrived; ``majority``: when the round's initiator
  posted it (this rank) or the initiator's activation message arrived. A thread that
  activates a solo round (or a majority round as its initiator) by its own rank's
  arrival sends a small activation message ``(round, kind)`` to every other rank
  (``Isend``; duplicates from two solo activators are dropped by round id).
* On activation the thread starts two nonblocking allreduces (``Iallreduce``, SUM) on
  the private communicator: the data (the caller's buffer, in place, when this rank's
  post was there at activation; zeros otherwise) and an int64 *meta* vector: this
  rank's contributor bit (distinct bits, so the sum is the OR, exact) and one count per
  kind (so ranks that disagree on a round's kind, or on when to close, see it). Every
  thread issues the same sequence of collectives, one round after the other, so they
  always match. A rank whose post comes after its thread activated the round is
  *late*: its wait returns the stored result and its contribution goes to the late
  policy (``_keep_late``).
* Back-pressure: a thread holds at most ``depth`` results its main thread has not
  consumed; beyond that it stops joining new rounds, which holds the other ranks back
  in that round's allreduce (bounded lag: a rank is never more than ``depth`` rounds
  behind the fastest).
* ``close()`` is collective: it is one more round (kind "close") in the same stream;
  if any rank instead starts a round there (it ran a different number of rounds), the
  kind counts differ and every rank raises CollectiveError. Then the threads exchange
  how many activation messages each sent to each other (``Ialltoall``), receive the
  stragglers, cancel their receive and stop; the main thread frees the communicator.

No deadlock: a thread only waits (in an allreduce) for ranks that have activated the
same round, and each of them will: a rank's main thread posts round r only after its
thread reduced every round before r; a thread held back by ``depth`` is waiting for its
own main thread, which is never blocked on a later round than its thread has reduced;
and a round every rank passes through is activated on each (sync: its own post;
solo: the first post, whose message reaches every rank; majority: the initiator's
post). Waits yield (Condition waits in the main thread; short sleeps in the progress
thread) and honour ``timeout``.
"""
from __future__ import annotations

import atexit
import threading
import time
import weakref

import numpy as np

from sgd_shm.collectives.base import (MAX_RANKS, CollectiveError, CollectiveTimeout,
                                      Communicator, initiator)

try:
    from mpi4py import MPI
except ImportError as e:        # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "sgd_shm.collectives.mpi needs mpi4py and an MPI library; install them with "
        "pip install 'relaxed-sgd-kit[mpi]' (mpi4py + mpich), or use "
        "sgd_shm.collectives.ShmGroup on one box") from e

__all__ = ["MPICommunicator"]

_TAG_ACT = 7011
_SYNC, _SOLO, _MAJ, _CLOSE = 0, 1, 2, 3
_CODE = {"sync": _SYNC, "solo": _SOLO, "majority": _MAJ, "close": _CLOSE}
_NAME = {v: k for k, v in _CODE.items()}
_META = 5                       # [contributor bits, count sync, solo, majority, close]

_live = weakref.WeakSet()


@atexit.register
def _stop_all():                # before mpi4py finalizes MPI: stop the progress threads
    for c in list(_live):
        try:
            c._abort()
        except Exception:       # pragma: no cover
            pass


class _Post:
    __slots__ = ("r", "kind", "buf")

    def __init__(self, r, kind, buf):
        self.r, self.kind, self.buf = r, kind, buf


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
        if comm is None:
            comm = MPI.COMM_WORLD
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(
                "comm must be an mpi4py intracommunicator (an MPI.Intracomm such as "
                f"MPI.COMM_WORLD), got {type(comm).__name__}; pass comm=MPI.COMM_WORLD "
                "or a communicator from comm.Split")
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
        self._comm = comm.Dup()         # collective; from here on only the thread uses it
        self._cv = threading.Condition(threading.Lock())
        self._posts = {}                # round -> _Post (at most one is outstanding)
        self._results = {}              # round -> (data or None, mask, kind)
        self._act = 0                   # rounds this rank's thread has activated
        self._consumed = 0              # rounds the main thread has finished
        self._error = None              # message of a failure in the thread
        self._error_timeout = False
        self._stop = False              # ask the thread to stop (abort)
        self._done = False              # the thread finished the close protocol
        self._closed = False
        self._reported = False          # the thread's error was raised to the caller
        self._scratch = []              # free zero-able buffers for non-contributions
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"mpi-progress-{self.rank}")
        _live.add(self)
        self._thread.start()

    # ---- main thread side --------------------------------------------------------------
    def _post(self, r, kind, buf):
        with self._cv:
            self._raise_error()
            if r < self._act:               # the thread already activated r without us
                return (r, kind, True)
            self._posts[r] = _Post(r, kind, buf.reshape(-1))
            self._cv.notify_all()
        return (r, kind, False)

    def _test(self, handle):
        with self._cv:
            return handle[0] in self._results or self._error is not None

    def _finish(self, handle, buf, deadline):
        r, kind, late = handle
        with self._cv:
            while r not in self._results:
                self._raise_error()
                if deadline is None:
                    self._cv.wait(1.0)
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeout(
                        f"rank {self.rank}: {kind} round {r} did not complete within the "
                        "timeout (another rank is slow, stopped calling collectives, "
                        "or died); wait() again, or raise the timeout")
                self._cv.wait(left)
            data, mask, rkind = self._results.pop(r)
            self._consumed = r + 1
            self._cv.notify_all()
        if rkind != kind:
            raise CollectiveError(
                f"rank {self.rank}: round {r} was a {rkind} round on the other ranks but "
                f"this rank started it as {kind}; every rank must call the same kind of "
                "collective in the same round")
        flat = buf.reshape(-1)
        contributed = (not late) and data is None
        if not contributed:
            self._keep_late(flat)
            flat[:] = data
            with self._cv:
                self._scratch.append(data)
        return mask, contributed

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
                self._posts[self._next] = _Post(self._next, "close", None)
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
        self.cur = None                     # (round, requests, data, meta, kind, post)
        self.t_start = 0.0                  # when cur was activated
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
        """Test the in-flight round; when it completed, check it, finish the close
        protocol or hand the result to the main thread, and return True."""
        o = self.owner
        r, reqs, data, meta, code, post = self.cur
        if not MPI.Request.Testall(reqs):
            if o.timeout is not None and time.monotonic() - self.t_start > o.timeout:
                o._error_timeout = True
                raise CollectiveError(
                    f"{_NAME[code]} round {r} did not complete within {o.timeout} s "
                    "(a rank died, or stopped calling collectives)")
            return False
        self.cur = None
        counts = meta[1:]
        mask = int(meta[0])
        if int(counts.max()) != self.P or int(counts.sum()) != self.P:
            desc = ", ".join(f"{int(c)} {_NAME[i]}" for i, c in enumerate(counts) if c)
            raise CollectiveError(
                f"round {r}: the ranks disagree on what round {r} is ({desc}); "
                "every rank must call the same kind of collective in each "
                "round and close() after the same number of rounds")
        if code == _CLOSE:
            self.finish_close()
            with self.cv:
                o._done = True
                self.cv.notify_all()
            self.finished = True
            return True
        with self.cv:
            o._results[r] = (None if post is not None else data, mask, _NAME[code])
            self.cv.notify_all()
        return True

    def _choose(self, a):
        """Under the lock: whether round ``a`` activates now, and as what kind.
        Returns (post, code or None, kinds heard for a); on activation advances
        ``_act`` and takes the post."""
        o = self.owner
        with self.cv:
            post = o._posts.get(a)
            hold = post is None and a - o._consumed >= o.depth
            code = None
            h = self.heard.get(a, ())
            if post is not None:
                pc = _CODE[post.kind]
                if pc in (_SYNC, _SOLO, _CLOSE):
                    code = pc
                elif initiator(o.seed, a, self.P) == self.me or h:
                    code = pc
            elif not hold:
                if _SOLO in h:
                    code = _SOLO
                elif _MAJ in h:
                    code = _MAJ
            if code is not None:
                o._act = a + 1
                o._posts.pop(a, None)
        return post, code, h

    def activate_next(self):
        """Activate the next round if it is due: announce it if this rank's arrival
        activated it, and start its two Iallreduce. Returns whether it did."""
        o = self.owner
        a = o._act
        post, code, h = self._choose(a)
        if code is None:
            return False
        self.heard.pop(a, None)
        if post is not None and (
                (code == _SOLO and not h)
                or (code == _MAJ and initiator(o.seed, a, self.P) == self.me)
                or code == _CLOSE):
            self.announce(a, code)
        if post is not None and post.buf is not None:
            data = post.buf
        else:
            data = o._get_scratch()
        meta = np.zeros(_META, np.int64)
        if post is not None and code != _CLOSE:
            meta[0] = 1 << self.me
        meta[1 + code] = 1
        reqs = [self.comm.Iallreduce(MPI.IN_PLACE, data, MPI.SUM),
                self.comm.Iallreduce(MPI.IN_PLACE, meta, MPI.SUM)]
        if code == _CLOSE:
            post = None
        self.cur = (a, reqs, data, meta, code, post)
        self.t_start = time.monotonic()
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
