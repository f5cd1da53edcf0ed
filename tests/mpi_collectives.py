"""Checks of sgd_shm.collectives.mpi.MPICommunicator, run under mpiexec:

    mpiexec -n P python tests/mpi_collectives.py MODE [ROUNDS]

MODE: exact | partial | kill | lag | mismatch | gather | gather_mismatch | single |
bench. Rank 0 prints one line
"OK <mode> ..." on success; a failure prints a message and exits non-zero (the job is
aborted, so no rank hangs). tests/test_collectives_mpi.py runs them.
"""
import hashlib
import os
import signal
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from mpi4py import MPI  # noqa: E402

from naive import partial_allreduce_naive  # noqa: E402
from sgd_shm.collectives import (CollectiveError, CollectiveTimeout,  # noqa: E402
                                 MPICommunicator, initiator)

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def ints(rng, n, dtype=np.float64, lo=-8, hi=9):
    return rng.integers(lo, hi, size=n).astype(dtype)


# ---- exact -------------------------------------------------------------------------------
def mode_exact(args):
    rng = np.random.default_rng(100 + RANK)
    done = 0
    for dtype in (np.float64, np.float32):
        for n in (1, 7, 1000, 20_011):
            for average in ("size", "contributors"):
                with MPICommunicator(n, dtype, average=average, timeout=60) as c:
                    for rnd in range(3):
                        x = ints(rng, n, dtype)
                        allx = WORLD.allgather(x)
                        want = np.sum(np.array(allx, np.float64), axis=0)
                        for op in ("sum", "mean"):
                            b = x.copy()
                            rd = c.allreduce(b, op)
                            check(rd.contributors == tuple(range(SIZE)) and rd.contributed,
                                  f"sync round {rd}")
                            w = want if op == "sum" else want / SIZE
                            check(np.array_equal(b, w.astype(dtype)),
                                  f"{dtype.__name__} n={n} {op}: {b[:4]} != {w[:4]}")
                            done += 1
                    # a solo mean with average="contributors" divides by the contributors
                    x = ints(rng, n, dtype)
                    allx = WORLD.allgather(x)
                    b = x.copy()
                    rd = c.solo_allreduce(b, "mean")
                    want = np.sum(np.array([allx[k] for k in rd.contributors], np.float64),
                                  axis=0)
                    want /= SIZE if average == "size" else len(rd.contributors)
                    check(np.allclose(b, want.astype(dtype), rtol=1e-6),
                          f"solo mean {average}: {b[:4]} != {want[:4]}")
                    done += 1
    # a sub-communicator (even ranks / odd ranks)
    sub = WORLD.Split(RANK % 2, RANK)
    with MPICommunicator(5, comm=sub) as c:
        b = np.full(5, float(RANK))
        c.allreduce(b)
        want = float(sum(k for k in range(SIZE) if k % 2 == RANK % 2))
        check(np.all(b == want), f"sub-communicator: {b} != {want}")
    sub.Free()
    return f"{done} exact rounds (float64/float32, sum/mean, n up to 20011), split comm"


# ---- partial -----------------------------------------------------------------------------
def run_partial(kind, late, rounds, n, depth, seed):
    rng = np.random.default_rng(seed * 1000 + RANK)
    recs = []
    with MPICommunicator(n, late=late, depth=depth, seed=seed, timeout=120) as c:
        for r in range(rounds):
            u = rng.random()
            if u < 0.25:
                time.sleep(rng.random() * 2e-3)
            elif u < 0.26:
                time.sleep(0.01)
            g = ints(rng, n)
            b = g.copy()
            rd = c.start(b, kind).wait() if r % 3 == 0 else \
                (c.solo_allreduce(b) if kind == "solo" else
                 c.majority_allreduce(b) if kind == "majority" else c.allreduce(b))
            check(rd.round == r and rd.kind == kind, f"round {r}: {rd}")
            mask = sum(1 << k for k in rd.contributors)
            recs.append((r, mask, rd.contributed, b.copy(), g))
        carried = c.carried()
        stats = dict(c.stats)
    every = WORLD.gather((recs, carried, stats), root=0)
    if RANK != 0:
        return 0
    masks = []
    for r in range(rounds):
        m = {every[k][0][r][1] for k in range(SIZE)}
        check(len(m) == 1, f"{kind}/{late} round {r}: ranks report different masks {m}")
        mask = m.pop()
        check(mask != 0, f"{kind}/{late} round {r}: no contributors")
        if kind == "sync":
            check(mask == (1 << SIZE) - 1, f"sync round {r}: mask {mask:b} not full")
        if kind == "majority":
            i = initiator(seed, r, SIZE)
            check(mask >> i & 1, f"majority round {r}: initiator {i} not in mask {mask:b}")
        for k in range(SIZE):
            check(every[k][0][r][2] == bool(mask >> k & 1),
                  f"{kind}/{late} round {r}: rank {k} contributed flag "
                  f"{every[k][0][r][2]} but mask {mask:b}")
            check(np.array_equal(every[k][0][r][3], every[0][0][r][3]),
                  f"{kind}/{late} round {r}: ranks 0 and {k} got different results")
        masks.append(mask)
    grads = [[every[k][0][r][4] for r in range(rounds)] for k in range(SIZE)]
    sums, leftover = partial_allreduce_naive(grads, masks, late)
    for r in range(rounds):
        check(np.array_equal(every[0][0][r][3], sums[r]),
              f"{kind}/{late} round {r} mask {masks[r]:b}: result {every[0][0][r][3]} != "
              f"oracle {sums[r]}")
    for k in range(SIZE):
        check(np.array_equal(every[k][1], leftover[k]),
              f"{kind}/{late}: rank {k} carries {every[k][1]}, oracle {leftover[k]}")
    if late == "carry":           # mass conservation: results + leftovers == all handed in
        total = sum(sums) + sum(leftover)
        check(np.array_equal(total, sum(sum(g) for g in grads)), "carry lost mass")
    return sum(every[k][2]["late"] for k in range(SIZE))


def mode_partial(args):
    rounds = int(args[0]) if args else 250
    n_late = {}
    total = 0
    cases = [("sync", "drop", 8), ("solo", "drop", 8), ("solo", "carry", 2),
             ("majority", "drop", 3), ("majority", "carry", 8)]
    for i, (kind, late, depth) in enumerate(cases):
        n_late[f"{kind}/{late}"] = run_partial(kind, late, rounds, 6, depth, seed=7 + i)
        total += rounds
    if RANK == 0:
        check(n_late["sync/drop"] == 0, "late sync rounds")
        check(all(v > 0 for k, v in n_late.items() if not k.startswith("sync")),
              f"some partial case had no late rounds: {n_late}")
    return f"{total} rounds x {SIZE} ranks match the oracle; late rank-rounds {n_late}"


# ---- kill --------------------------------------------------------------------------------
def mode_kill(args):
    c = MPICommunicator(4, timeout=10)
    b = np.ones(4)
    for r in range(100000):
        if RANK == 1 and r == 30:
            os.kill(os.getpid(), signal.SIGKILL)
        c.allreduce(b)
        b[:] = 1
    return "not reached"


# ---- lag / nonblocking -------------------------------------------------------------------
def mode_lag(args):
    depth, R = 4, 12
    with MPICommunicator(3, depth=depth, timeout=60) as c:
        if RANK == 1:
            time.sleep(0.5)
            lag = c.lag()
            check(lag == depth, f"rank 1 slept: lag() {lag}, expected depth={depth}")
        lates = []
        for r in range(R):
            b = np.full(3, 1.0)
            rd = c.solo_allreduce(b)
            lates.append(not rd.contributed)
        if RANK == 1 and SIZE > 1:
            check(all(lates[:depth]), f"rank 1's first {depth} rounds not late: {lates}")
        check(c.lag() == 0, f"lag {c.lag()} after catching up")
        # nonblocking: start / test / wait with a timeout
        b = np.full(3, float(RANK))
        if RANK == 1:
            time.sleep(0.3)
        req = c.start(b, "sync")
        if RANK == 0 and SIZE > 1:
            check(not req.test(), "sync round completed while rank 1 sleeps")
            try:
                req.wait(timeout=0.05)
                raise AssertionError("wait(timeout=0.05) did not time out")
            except CollectiveTimeout as e:
                check("sync round" in str(e), f"timeout message: {e}")
            while not req.test():
                time.sleep(1e-3)
        rd = req.wait()
        check(rd.contributed and np.all(b == SIZE * (SIZE - 1) / 2), f"sync: {b}")
        check(req.wait() is rd, "second wait")
    return f"lag == depth {depth} for a sleeping rank; start/test/wait/timeout"


# ---- mismatch: ranks close after different numbers of rounds -------------------------------
def mode_mismatch(args):
    c = MPICommunicator(2, timeout=30)
    c.allreduce(np.ones(2))
    try:
        if RANK == 0:
            c.allreduce(np.ones(2))     # one round more than the others
        c.close()
    except CollectiveError as e:
        check("disagree" in str(e), f"message: {e}")
        ok = 1
    else:
        ok = 0
    oks = WORLD.gather(ok, root=0)
    if RANK == 0:
        check(all(oks), f"not every rank raised: {oks}")
    c.close()                           # idempotent
    return "every rank raised CollectiveError"


# ---- settings: the ranks must agree on n, dtype, late, average and seed ---------------------
def mode_settings(args):
    """Each rank builds with one setting of its own: every rank raises CollectiveError
    naming it (another n gave unsummed values back, another dtype garbage, another
    seed majority rounds that never completed); agreeing ranks then work."""
    cases = [dict(n=4 + RANK), dict(n=4, dtype=np.float32 if RANK else np.float64),
             dict(n=4, seed=RANK), dict(n=4, late="carry" if RANK else "drop")]
    names = ["n", "dtype", "seed", "late"]
    for kw, name in zip(cases, names):
        try:
            MPICommunicator(timeout=30, **kw)
        except CollectiveError as e:
            check(f"{name}: [" in str(e) and "every rank must pass the same" in str(e),
                  f"message: {e}")
        else:
            check(False, f"{name} differing across ranks was accepted")
    with MPICommunicator(4, seed=7, timeout=30) as c:
        b = np.full(4, float(RANK))
        c.allreduce(b)
        check(np.all(b == SIZE * (SIZE - 1) / 2), f"sum after the refusals: {b}")
    return "every differing setting refused on every rank; agreeing ranks reduce"


# ---- gather: allgather rounds (payloads of variable length, exact to the bit) --------------
def digest(a):
    """A hash of an array's dtype, length and bits (NaN-free floats compare bitwise)."""
    return hashlib.sha1(a.dtype.str.encode() + a.tobytes()).hexdigest()


def payload(rng, n, dtype, forced_len=None):
    k = int(rng.integers(0, n + 1)) if forced_len is None else forced_len
    return rng.standard_normal(k).astype(dtype)


def gather_sync_exact():
    """Sync gathers: every part is bitwise what its rank sent; lengths vary per rank and
    per round, 0 included; the payload is copied at the start."""
    rng = np.random.default_rng(300 + RANK)
    done = 0
    for dtype in (np.float64, np.float32):
        for n in (1, 7, 1000):
            with MPICommunicator(n, dtype, depth=2, timeout=60) as c:
                for rnd in range(6):
                    # rank rnd % SIZE sends nothing this round; rank 0 sends all n in round 1
                    forced = 0 if rnd % SIZE == RANK else (n if rnd == 1 else None)
                    x = payload(rng, n, dtype, forced)
                    sent = WORLD.allgather(x)
                    req = c.start_gather(x, "sync")
                    x += 1                      # the communicator holds its own copy
                    rd = req.wait()
                    check(rd.kind == "sync" and rd.contributed
                          and rd.contributors == tuple(range(SIZE)), f"sync gather {rd}")
                    for k, part in enumerate(rd.parts):
                        check(part.dtype == dtype and part.tobytes() == sent[k].tobytes(),
                              f"{dtype.__name__} n={n} round {rnd}: rank {k}'s part "
                              f"{part[:4]} != sent {sent[k][:4]}")
                    done += 1
    return done


def gather_mixed(kinds, rounds, n, seed):
    """Rounds of the given kinds, reductions and gathers interleaved in one run (the
    same draw on every rank), with random delays so that some ranks are late. Checks:
    every rank sees the same contributors and results (hashes gathered at the end);
    each part is what its contributor sent; a reduction's result is the sum of its
    contributors' buffers (late="drop"); a late rank has contributed=False."""
    plan = np.random.default_rng(seed)     # shared: which kind and operation per round
    rng = np.random.default_rng(seed * 1000 + RANK)
    mine, seen = [], []
    with MPICommunicator(n, late="drop", depth=3, seed=seed, timeout=120) as c:
        for r in range(rounds):
            kind = kinds[int(plan.integers(len(kinds)))]
            gather = plan.random() < 0.6
            if rng.random() < 0.3:
                time.sleep(rng.random() * 2e-3)
            if gather:
                x = payload(rng, n, np.float64)
                rd = c.allgather(x, kind)
                res = [digest(p) for p in rd.parts]
            else:
                x = ints(rng, n)
                b = x.copy()
                rd = c.start(b, kind).wait()
                res = digest(b)
            check(rd.round == r and rd.kind == kind and rd.contributed == (RANK in
                  rd.contributors), f"round {r}: {rd}")
            if kind == "sync":
                check(rd.contributors == tuple(range(SIZE)), f"sync round {r}: {rd}")
            if kind == "majority":
                check(initiator(seed, r, SIZE) in rd.contributors, f"round {r}: {rd}")
            mine.append((gather, x))
            seen.append((rd.contributors, rd.contributed, res))
        late = c.stats["late"]
    every = WORLD.allgather(seen)
    allx = WORLD.allgather([x for _, x in mine])      # what each rank sent, per round
    for r in range(rounds):
        contributors, _, res = every[0][r]
        for k in range(SIZE):
            check(every[k][r][0] == contributors and every[k][r][2] == res,
                  f"round {r}: ranks 0 and {k} saw different contributors or results")
        if mine[r][0]:
            want = [digest(allx[k][r]) for k in contributors]
            check(res == want, f"gather round {r}: parts are not the contributors' payloads")
        else:
            want = np.sum([allx[k][r] for k in contributors], axis=0)
            check(res == digest(want), f"reduce round {r}: not the contributors' sum")
    return WORLD.allreduce(late)


def gather_late(depth=3, R=8):
    """A rank that sleeps is late for the first ``depth`` solo gathers: it gets their
    parts (the same as the others) with contributed=False, and its payload is dropped;
    a gather's wait honours its timeout."""
    with MPICommunicator(4, depth=depth, timeout=60) as c:
        if RANK == 1:
            time.sleep(0.5)
            check(c.lag() == depth, f"rank 1 slept: lag() {c.lag()}, expected {depth}")
        seen = []
        for r in range(R):
            x = np.full(1 + (RANK + r) % 4, RANK + r / 8)
            rd = c.allgather(x, "solo")
            check(rd.contributed == (RANK in rd.contributors), f"round {r}: {rd}")
            if rd.contributed:
                check(np.array_equal(rd.parts[rd.contributors.index(RANK)], x), "own part")
            seen.append((rd.contributors, rd.contributed, [digest(p) for p in rd.parts]))
        # nonblocking: a wait with a timeout while rank 1 sleeps, then the same request
        if RANK == 1:
            time.sleep(0.3)
        req = c.start_gather(np.full(2, float(RANK)), "sync")
        if RANK == 0 and SIZE > 1:
            check(not req.test(), "sync gather completed while rank 1 sleeps")
            expect(CollectiveTimeout, ["sync gather round"], req.wait, timeout=0.05)
        rd = req.wait()
        check([p.tolist() for p in rd.parts] == [[float(k)] * 2 for k in range(SIZE)],
              f"sync gather after a timeout: {rd}")
    every = WORLD.allgather(seen)
    for r in range(R):
        check(all(every[k][r][0] == every[0][r][0] and every[k][r][2] == every[0][r][2]
                  for k in range(SIZE)), f"round {r}: ranks saw different parts")
    if SIZE > 1:
        check(all(not s[1] and 1 not in s[0] for s in every[1][:depth]),
              f"rank 1's first {depth} gathers not late: {every[1][:depth]}")
        check(len(every[1][0][2]) == len(every[1][0][0]) >= 1, "a late rank got no parts")


def mode_gather(args):
    rounds = int(args[0]) if args else 120
    done = gather_sync_exact()
    lates = {}
    for i, kinds in enumerate((("solo",), ("majority",), ("sync", "solo", "majority"))):
        lates["+".join(kinds)] = gather_mixed(kinds, rounds, 9, seed=11 + i)
    gather_late()
    if RANK == 0 and SIZE > 1:
        check(lates["solo"] > 0, f"no late rank-round in the solo run: {lates}")
    return (f"{done} exact sync gathers (float64/float32, lengths 0..n); {3 * rounds} "
            f"mixed reduce/gather rounds agree on every rank, late rank-rounds {lates}; "
            "a late rank gets the parts")


def mode_gather_mismatch(args):
    """Ranks that disagree on a round (one gathers, another reduces or closes; or two
    gather kinds) raise CollectiveError on every rank, and no collective is left
    unmatched: a new communicator works afterwards."""
    cases = {
        "gather/reduce": lambda c: (c.allgather(np.ones(2)) if RANK == 0
                                    else c.allreduce(np.ones(3))),
        # rank 0 closes its round by its own post, the others by theirs or its message
        "sync/solo gather": lambda c: c.allgather(np.ones(RANK % 3), "solo" if RANK
                                                  else "sync"),
        "gather/close": lambda c: c.allgather(np.ones(1)) if RANK == 0 else None,
    }
    for name, act in cases.items():
        c = MPICommunicator(3, timeout=20)
        c.allgather(np.ones(1))
        errors = []
        for step in (act, MPICommunicator.close):
            # a rank that was late for the round sees the mismatch itself; it tells the
            # others in its next round (here: close), where every rank raises
            try:
                step(c)
            except CollectiveError as e:
                check(not isinstance(e, CollectiveTimeout), f"{name}: timed out: {e}")
                check("disagree on what round" in str(e) or "this rank started it as"
                      in str(e), f"{name}: {e}")
                errors.append(str(e))
        c.close()                       # idempotent
        raised = WORLD.allgather(len(errors))
        check(all(raised), f"{name}: not every rank raised: {raised}")
    with MPICommunicator(3, timeout=20) as c:
        rd = c.allgather(np.full(1, float(RANK)))
        check([p[0] for p in rd.parts] == list(range(SIZE)), f"after the errors: {rd}")
    return f"every rank raised CollectiveError ({', '.join(cases)}); a new one works"


# ---- single: one rank (no mpiexec needed): size-1 rounds and argument checks ----------------
def expect(exc, words, fn, *a, **k):
    try:
        fn(*a, **k)
    except exc as e:
        check(all(w in str(e) for w in words), f"{exc.__name__} message {e!r} lacks {words}")
        return
    raise AssertionError(f"{fn.__name__}{a}{k} did not raise {exc.__name__}")


def mode_single(args):
    from sgd_shm.collectives.base import MAX_RANKS
    for comm in (MPI.COMM_SELF, WORLD):
        if comm.Get_size() != 1:
            continue
        for dtype in (np.float64, np.float32):
            for late in ("drop", "carry"):
                with MPICommunicator(1, dtype, comm=comm, late=late) as c:
                    for r, kind in enumerate(("sync", "solo", "majority") * 5):
                        b = np.array([r + 1.0], dtype)
                        rd = c.start(b, kind).wait()
                        check(rd.round == r and rd.contributors == (0,) and rd.contributed
                              and b[0] == r + 1, f"size-1 {kind}: {rd} {b}")
                        check(c.lag() == 0, "lag")
                    b = np.arange(4, dtype=dtype).reshape(2, 2)
                    expect(ValueError, ["4", "elements"], c.allreduce, b)
                    expect(TypeError, ["dtype"], c.allreduce, np.ones(1, np.int64))
                    b = np.array([3.0], dtype)
                    check(c.allreduce(b, "mean").n_contributors == 1 and b[0] == 3, "mean")
                c.close()                                   # idempotent
                expect(CollectiveError, ["closed"], c.allreduce, np.ones(1, dtype))
        # size-1 gathers: each kind, lengths 0..n, a 2-D payload; argument checks
        with MPICommunicator(4, comm=comm, timeout=10) as c:
            for r, kind in enumerate(("sync", "solo", "majority") * 2):
                x = np.arange(r % 5, dtype=np.float64) - 0.5
                rd = c.allgather(x, kind)
                check(rd.contributors == (0,) and rd.contributed and len(rd.parts) == 1
                      and rd.parts[0].tobytes() == x.tobytes(), f"size-1 {kind}: {rd}")
            rd = c.allgather(np.ones((2, 2)))
            check(rd.parts[0].shape == (4,), f"2-D payload: {rd}")
            expect(ValueError, ["at most 4 elements", "got 5"], c.allgather, np.ones(5))
            expect(TypeError, ["dtype"], c.allgather, np.ones(2, np.float32))
            expect(TypeError, ["numpy array"], c.allgather, [1.0])
            expect(ValueError, ["kind"], c.allgather, np.ones(2), "all")
            b = np.ones(4)
            c.allreduce(b)                      # reductions and gathers in one stream
            check(np.all(b == 1) and c.allgather(np.ones(0)).parts[0].size == 0, "mixed")
    c = MPICommunicator(7, comm=MPI.COMM_SELF, depth=1, seed=3, timeout=5)
    b = np.arange(7.0)
    req = c.start(b, "majority")
    check(req.wait().contributed and np.array_equal(b, np.arange(7.0)), "n=7")
    req = c.start(b)
    expect(CollectiveError, ["wait"], c.start, b)
    expect(CollectiveError, ["wait"], c.close)       # a started round: wait first
    req.wait()
    c.close()
    expect(TypeError, ["comm", "Intracomm"], MPICommunicator, 4, comm="world")
    expect(TypeError, ["comm", "Intracomm"], MPICommunicator, 4, comm=MPI.COMM_WORLD.group
           if hasattr(MPI.COMM_WORLD, "group") else 3)
    expect(ValueError, ["depth", ">= 1"], MPICommunicator, 4, comm=MPI.COMM_SELF, depth=0)
    expect(TypeError, ["depth"], MPICommunicator, 4, comm=MPI.COMM_SELF, depth=1.5)
    expect(ValueError, ["n: must be"], MPICommunicator, 0, comm=MPI.COMM_SELF)
    expect(TypeError, ["dtype"], MPICommunicator, 4, np.int32, comm=MPI.COMM_SELF)
    expect(ValueError, ["late"], MPICommunicator, 4, comm=MPI.COMM_SELF, late="keep")
    expect(ValueError, ["timeout"], MPICommunicator, 4, comm=MPI.COMM_SELF, timeout=-1)

    class Big(MPI.Intracomm):
        def Get_size(self):
            return MAX_RANKS + 1
    expect(ValueError, ["at most", str(MAX_RANKS), "Split"], MPICommunicator, 4,
           comm=Big(MPI.COMM_SELF))
    return "size-1 rounds and gathers (COMM_SELF and singleton COMM_WORLD), argument checks"


# ---- bench -------------------------------------------------------------------------------
def mode_bench(args):
    reps = int(args[0]) if args else 2000
    out = []
    for kind in ("sync", "solo"):
        with MPICommunicator(8) as c:
            b = np.ones(8)
            for _ in range(50):
                c.start(b, kind).wait()
            WORLD.Barrier()
            ts = []
            for _ in range(reps):
                t = time.perf_counter()
                c.start(b, kind).wait()
                ts.append(time.perf_counter() - t)
            med = WORLD.reduce(np.median(ts), op=MPI.MAX, root=0)
        out.append(f"{kind} n=8: {1e6 * (med or 0):.0f} us")
    b, ts = np.ones(8), []
    for i in range(reps):
        t = time.perf_counter()
        WORLD.Allreduce(MPI.IN_PLACE, b)
        ts.append(time.perf_counter() - t)
    med = WORLD.reduce(np.median(ts[50:]), op=MPI.MAX, root=0)
    out.append(f"comm.Allreduce n=8: {1e6 * (med or 0):.0f} us")
    n = 2 * 1024 * 1024                 # 16 MB of float64
    x = np.ones(n)
    y = np.empty(n)
    with MPICommunicator(n) as c:
        tc, tm, ti = [], [], []
        for i in range(12):
            WORLD.Barrier()
            t = time.perf_counter()
            c.allreduce(x)
            tc.append(time.perf_counter() - t)
            WORLD.Barrier()
            t = time.perf_counter()
            WORLD.Allreduce(x, y)
            tm.append(time.perf_counter() - t)
            WORLD.Barrier()
            t = time.perf_counter()
            WORLD.Allreduce(MPI.IN_PLACE, y)
            ti.append(time.perf_counter() - t)
        mc = WORLD.reduce(np.median(tc[2:]), op=MPI.MAX, root=0)
        mm = WORLD.reduce(np.median(tm[2:]), op=MPI.MAX, root=0)
        mi = WORLD.reduce(np.median(ti[2:]), op=MPI.MAX, root=0)
    if RANK == 0:
        out.append(f"16 MB allreduce: communicator {1e3 * mc:.1f} ms, "
                   f"comm.Allreduce {1e3 * mm:.1f} ms (in place {1e3 * mi:.1f} ms)")
    return "; ".join(out)


MODES = {"exact": mode_exact, "partial": mode_partial, "kill": mode_kill,
         "lag": mode_lag, "single": mode_single, "mismatch": mode_mismatch, "bench": mode_bench,
         "gather": mode_gather, "gather_mismatch": mode_gather_mismatch,
         "settings": mode_settings}


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "exact"
    t = time.perf_counter()
    try:
        msg = MODES[mode](sys.argv[2:])
        ok = WORLD.allreduce(1, op=MPI.MIN)
    except BaseException:
        sys.stderr.write(f"FAIL {mode} rank {RANK}:\n{traceback.format_exc()}")
        sys.stderr.flush()
        WORLD.Abort(1)
        return
    if RANK == 0 and ok:
        print(f"OK {mode} P={SIZE} {msg} ({time.perf_counter() - t:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
