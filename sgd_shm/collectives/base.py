"""What every communicator shares: argument checks, rounds, the late-gradient policy
and the averaging rule. A backend (:mod:`~sgd_shm.collectives.shm`,
:mod:`~sgd_shm.collectives.mpi`) supplies only the transport of one round.

A *round* is one collective call. Rounds are numbered 0, 1, 2, ... in the order each
rank calls them; every rank passes through every round, in order, and every rank gets
every round's result, so replicas that apply the results stay identical. What differs
between the three kinds is when a round *closes*, which fixes its contributors:

* ``sync`` (allreduce): when all ranks have arrived.
* ``solo``: when the first rank arrives (that rank *activates* the round).
* ``majority``: when the round's *initiator* arrives; the initiator is drawn from a seed
  shared by all ranks (:func:`initiator`), so about half of the ranks have arrived
  before it does, in expectation.

A round either reduces (``start``, ``allreduce``: every rank's buffer of n elements is
summed) or gathers (``start_gather``, ``allgather``: every contributor's payload of up
to n elements reaches every rank, each as it was sent: a real allgather, MPI's
``Allgatherv`` or the shared segment's copy, not a sum). Every rank must call the same
kind and operation in the same round; a rank that finds the others called another
raises :class:`CollectiveError` (and the others stop with it).

A rank that arrives after its round closed is *late*: its wait returns at once with
the round's result, and its contribution is dropped (``late="drop"``, as fflib2 does)
or kept and added to what it contributes next (``late="carry"``, so no gradient mass
is lost). A late *payload* of a gather is never carried (payloads do not add): the
caller sees ``Round.contributed`` False and keeps it as it sees fit.
``op="mean"`` divides the sum by the number of ranks (``average="size"``,
as fflib2) or by the number of contributors (``average="contributors"``).

Source: Li, Ben-Nun, Di Girolamo, Alistarh, Hoefler, "Taming unbalanced training
workloads in deep learning with partial collective operations", PPoPP 2020
(arXiv:1908.04207); its library fflib2.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from sgd_shm.core.validation import FLOAT_DTYPES, check_choice, check_int, check_positive

__all__ = ["Round", "Request", "Communicator", "CollectiveError", "RankFailure",
           "CollectiveTimeout", "KINDS", "LATE", "AVERAGE", "OPS", "initiator",
           "mask_ranks"]

KINDS = ("sync", "solo", "majority")
LATE = ("drop", "carry")
AVERAGE = ("size", "contributors")
OPS = ("sum", "mean")
#: most ranks a communicator takes (contributor sets travel as one 64-bit mask)
MAX_RANKS = 60


class CollectiveError(RuntimeError):
    """A collective could not complete."""


class RankFailure(CollectiveError):
    """A rank died (or its backend aborted): the collective will never complete."""


class CollectiveTimeout(CollectiveError, TimeoutError):
    """A wait ran past its timeout; the round stays pending. Raised by a blocking call
    (``allreduce``, ...), it carries that round's ``request``, whose ``wait()`` may be
    called again."""
    request = None


@dataclass(frozen=True)
class Round:
    """The outcome of one round, as one rank sees it.

    round: the round id (the same on every rank); kind: "sync", "solo" or "majority";
    contributors: the ranks whose contributions are summed in the result (sorted);
    contributed: whether this rank's contribution is among them (False: it was late);
    parts: for a gather, each contributor's payload (in the order of contributors);
    empty for a reduction.
    """
    round: int
    kind: str
    contributors: tuple
    contributed: bool
    parts: tuple = ()

    @property
    def n_contributors(self) -> int:
        return len(self.contributors)


def mask_ranks(mask: int) -> tuple:
    """The ranks whose bits are set in ``mask``, ascending."""
    mask = int(mask)
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return tuple(out)


def _mix(x: int) -> int:
    """splitmix64 finaliser: a well-spread 64-bit hash of x."""
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def initiator(seed: int, round_id: int, size: int) -> int:
    """The rank that activates round ``round_id`` of a majority allreduce: a draw from
    ``seed`` that every rank computes alike, uniform over the ranks."""
    return _mix((int(seed) * 0x2545F4914F6CDD1D + int(round_id)) & ((1 << 64) - 1)) % size


class Request:
    """A started round: :meth:`test` (has it completed?) and :meth:`wait` (its
    :class:`Round`). The buffer belongs to the communicator until the wait returns;
    then it holds the round's result."""

    __slots__ = ("_comm", "_handle", "_buf", "_op", "_kind", "_round", "_result")

    def __init__(self, comm, handle, buf, op, kind, round_id):
        self._comm, self._handle, self._buf = comm, handle, buf
        self._op, self._kind, self._round = op, kind, round_id
        self._result = None

    @property
    def round(self) -> int:
        return self._round

    def test(self) -> bool:
        """True once the round has completed (then :meth:`wait` returns at once)."""
        return self._result is not None or self._comm._test(self._handle)

    def wait(self, timeout: float | None = None) -> Round:
        """Block until the round completes; the buffer then holds its result.

        timeout: seconds (None: the communicator's). Raises CollectiveTimeout, or
        RankFailure when a rank died."""
        if self._result is None:
            self._result = self._comm._complete(self, timeout)
        return self._result


class Communicator:
    """P ranks that combine equal-length float buffers. Subclasses implement the
    transport (``_post``, ``_test``, ``_finish``, ``_closed_upto``, ``_close``).

    n: elements of every buffer; dtype: float32 or float64; late: "drop" | "carry";
    average: "size" | "contributors" (the divisor of ``op="mean"``); timeout: seconds
    a wait may take before CollectiveTimeout (None: no limit; a dead rank is still
    reported as RankFailure by the backend).
    """

    def __init__(self, rank, size, n, dtype=np.float64, *, late="drop", average="size",
                 timeout=None):
        self.size = check_int("size", size, 1, MAX_RANKS)
        self.rank = check_int("rank", rank, 0, self.size - 1)
        self.n = check_int("n", n, 1, None)
        self.dtype = check_dtype(dtype)
        self.late = check_choice("late", late, LATE)
        self.average = check_choice("average", average, AVERAGE)
        self.timeout = check_timeout("timeout", timeout)
        self._carry = np.zeros(self.n, self.dtype) if self.late == "carry" else None
        self._carry_live = False
        self._next = 0                  # this rank's next round
        self._pending = None
        self.stats = {"rounds": 0, "contributed": 0, "late": 0}

    # ---- the public calls ---------------------------------------------------------
    def allreduce(self, buf, op="sum", *, timeout=None) -> Round:
        """Sum (or mean) of every rank's ``buf``, in place. Returns the Round. A wait
        past ``timeout`` raises :class:`CollectiveTimeout` with the round still pending:
        its ``request`` waits again (as every blocking call's)."""
        return self._blocking(lambda: self.start(buf, "sync", op), timeout)

    def solo_allreduce(self, buf, op="sum", *, timeout=None) -> Round:
        """Partial allreduce activated by the first rank to arrive, in place."""
        return self._blocking(lambda: self.start(buf, "solo", op), timeout)

    def majority_allreduce(self, buf, op="sum", *, timeout=None) -> Round:
        """Partial allreduce activated by the round's drawn initiator, in place."""
        return self._blocking(lambda: self.start(buf, "majority", op), timeout)

    def allgather(self, payload, kind="sync", *, timeout=None) -> Round:
        """Every contributor's ``payload`` (at most n elements of this communicator's
        dtype), in ``Round.parts``; ``kind`` as for a reduction."""
        return self._blocking(lambda: self.start_gather(payload, kind), timeout)

    def _blocking(self, start, timeout):
        """start() then wait: the timeout is checked before the round is posted (a bad
        one left it started and never waited for), and a timeout hands the caller the
        pending round's request on the exception."""
        if timeout is not None:
            check_timeout("timeout", timeout)
        req = start()
        try:
            return req.wait(timeout)
        except CollectiveTimeout as e:
            e.request = req
            raise

    def start_gather(self, payload, kind="sync") -> Request:
        """Start this rank's next round as a gather of ``payload`` (non-blocking); its
        wait returns the Round with ``parts``. As a reduction's buffer, the payload
        belongs to the communicator until the wait returns (a backend that waits for
        its slot copies it in later). The parts are views of a buffer of that round's
        own: a later round does not overwrite them."""
        kind = check_choice("kind", kind, KINDS)
        payload = self._check_payload(payload)
        self._check_idle()
        r = self._next
        handle = self._post_gather(r, kind, payload)
        self._next = r + 1
        req = Request(self, handle, payload, "gather", kind, r)
        self._pending = req
        return req

    def start(self, buf, kind="sync", op="sum") -> Request:
        """Start this rank's next round with ``buf`` (non-blocking); see Request."""
        kind = check_choice("kind", kind, KINDS)
        op = check_choice("op", op, OPS)
        self._check_buf(buf)
        self._check_idle()
        if self._carry_live:
            buf += self._carry.reshape(buf.shape)
            self._carry[:] = 0
            self._carry_live = False
        r = self._next
        req = Request(self, self._post(r, kind, buf), buf, op, kind, r)
        self._next = r + 1                 # (only once posted: a failed start takes none)
        self._pending = req
        return req

    def lag(self) -> int:
        """Rounds that have closed and that this rank has not yet started: each of
        them, started now, would find its round closed (this rank is late for it)."""
        return max(0, self._closed_upto() - self._next)

    @property
    def next_round(self) -> int:
        """The id of the round this rank starts next."""
        return self._next

    def carried(self) -> np.ndarray:
        """A copy of what this rank carries into its next contribution (zeros with
        ``late="drop"``)."""
        if self._carry is None:
            return np.zeros(self.n, self.dtype)
        return self._carry.copy()

    def close(self) -> None:
        self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- for the backends -----------------------------------------------------------
    def _keep_late(self, contribution) -> None:
        """A backend calls this with a contribution that missed its round, before it
        overwrites the buffer: ``carry`` keeps it for the next round; ``drop`` drops it."""
        if self._carry is not None:
            self._carry += np.asarray(contribution).reshape(-1)
            self._carry_live = True

    def _check_idle(self):
        if self._pending is not None:
            raise CollectiveError(
                f"rank {self.rank}: round {self._pending._round} was started and not "
                "waited for; call wait() on its request before starting the next round")

    def _check_payload(self, payload):
        if not isinstance(payload, np.ndarray):
            raise TypeError(f"payload must be a numpy array, got {type(payload).__name__}")
        if payload.dtype != self.dtype:
            raise TypeError(f"payload must have dtype {self.dtype} (this communicator's), "
                            f"got {payload.dtype}; convert with payload.astype(np."
                            f"{self.dtype})")
        payload = payload.reshape(-1)
        if payload.size > self.n:
            raise ValueError(f"payload must have at most {self.n} elements (this "
                             f"communicator's n), got {payload.size}; make the "
                             "communicator with n = the largest payload")
        return payload

    def _complete(self, req, timeout):
        t = self.timeout if timeout is None else check_timeout("timeout", timeout)
        deadline = None if t is None else time.monotonic() + t
        if req._op == "gather":
            mask, contributed, parts = self._settle(self._finish_gather, req._handle,
                                                    deadline)
            self._count(contributed)
            return Round(req._round, req._kind, mask_ranks(mask), bool(contributed),
                         tuple(parts))
        mask, contributed = self._settle(self._finish, req._handle, req._buf, deadline)
        ranks = mask_ranks(mask)
        if req._op == "mean":
            req._buf /= self.size if self.average == "size" else len(ranks)
        self._count(contributed)
        return Round(req._round, req._kind, ranks, bool(contributed))

    def _settle(self, finish, *args):
        """The backend's finish of the pending round. A timeout leaves the round
        pending (wait() may be called again); any other error ends it, so that the
        communicator can still be closed."""
        try:
            out = finish(*args)
        except CollectiveTimeout:
            raise
        except BaseException:
            self._pending = None
            raise
        self._pending = None
        return out

    def _count(self, contributed):
        self.stats["rounds"] += 1
        self.stats["contributed" if contributed else "late"] += 1

    def _check_buf(self, buf):
        if not isinstance(buf, np.ndarray):
            raise TypeError(f"buf must be a numpy array, got {type(buf).__name__}")
        if buf.dtype != self.dtype:
            raise TypeError(f"buf must have dtype {self.dtype} (this communicator's), got "
                            f"{buf.dtype}; convert with buf.astype(np.{self.dtype})")
        if buf.size != self.n:
            raise ValueError(f"buf must have {self.n} elements (this communicator's n), "
                             f"got {buf.size}")
        if not buf.flags.c_contiguous or not buf.flags.writeable:
            raise ValueError("buf must be C-contiguous and writeable (the result is "
                             "written into it); pass np.ascontiguousarray(buf)")

    # subclasses
    def _post(self, r, kind, buf):          # pragma: no cover - abstract
        raise NotImplementedError

    def _test(self, handle) -> bool:        # pragma: no cover - abstract
        raise NotImplementedError

    def _finish(self, handle, buf, deadline):   # pragma: no cover - abstract
        raise NotImplementedError

    def _post_gather(self, r, kind, payload):    # pragma: no cover - abstract
        raise NotImplementedError

    def _finish_gather(self, handle, deadline):  # pragma: no cover - abstract
        """(contributor mask, contributed, the contributors' payloads in rank order)."""
        raise NotImplementedError

    def _closed_upto(self) -> int:          # pragma: no cover - abstract
        raise NotImplementedError

    def _close(self) -> None:               # pragma: no cover - abstract
        raise NotImplementedError


def check_dtype(dtype):
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {dtype!r}")
    return dt


def check_timeout(name, t):
    """A timeout: None (no limit) or a finite number of seconds > 0."""
    return None if t is None else check_positive(name, t)
