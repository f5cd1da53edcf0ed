"""ShmGroup (sgd_shm.collectives.shm): allreduce and the partial collectives of eager-SGD
among forked processes, checked against the serial oracle tests/naive.py
(partial_allreduce_naive) with integer-valued floats so every sum is exact."""
import os
import pickle
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from naive import partial_allreduce_naive
from sgd_shm.collectives import (CollectiveError, CollectiveTimeout, RankFailure, ShmGroup,
                                 initiator)
from sgd_shm.collectives import shm as cshm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.usefixtures("no_shm_leak")


# ---- allreduce ---------------------------------------------------------------------------
def _allreduce_ranks(comm, rounds, op, dtype):
    out = []
    for r in range(rounds):
        g = np.arange(comm.n, dtype=dtype) % 7 + comm.rank * 3 + r
        rnd = comm.allreduce(g, op=op)
        out.append((rnd.round, rnd.contributors, rnd.contributed, g.copy()))
    return out


@pytest.mark.parametrize("P", [2, 3, 4])
@pytest.mark.parametrize("op,average", [("sum", "size"), ("mean", "size"),
                                        ("mean", "contributors")])
def test_allreduce_exact(P, op, average):
    n = 1000 if P != 3 else 70001          # 70001: several reduction chunks, a ragged end
    with ShmGroup(P, n, average=average) as g:
        res = g.run(_allreduce_ranks, 5, op, np.float64)
    for r in range(5):
        want = sum(np.arange(n, dtype=np.float64) % 7 + k * 3 + r for k in range(P))
        if op == "mean":
            want = want / P
        for k in range(P):
            rid, ranks, contributed, got = res[k][r]
            assert rid == r and ranks == tuple(range(P)) and contributed
            np.testing.assert_array_equal(got, want)


def test_allreduce_float32_and_size_one():
    with ShmGroup(2, 33, np.float32) as g:
        g.run(_allreduce_ranks, 2, "sum", np.float32)
        res = g.run(_allreduce_ranks, 3, "sum", np.float32)     # a group runs again
    for r in range(3):
        want = sum(np.arange(33, dtype=np.float32) % 7 + k * 3 + r for k in range(2))
        for k in range(2):
            assert res[k][r][3].dtype == np.float32
            np.testing.assert_array_equal(res[k][r][3], want)
    with ShmGroup(1, 5) as g:               # one rank, in this process: trivial rounds
        with g.communicator(0) as c:
            for kind in ("sync", "solo", "majority"):
                b = np.arange(5.0)
                rnd = c.start(b, kind).wait()
                assert rnd.contributors == (0,) and rnd.contributed
                np.testing.assert_array_equal(b, np.arange(5.0))


# ---- partial collectives against the oracle ----------------------------------------------
def _partial_ranks(comm, kind, rounds, n, seed):
    rng = np.random.default_rng(seed * 100 + comm.rank)
    grads, recs = [], []
    for r in range(rounds):
        u = rng.random()
        if u < 0.3:
            time.sleep(rng.random() * 0.002)
        elif u < 0.32:
            time.sleep(0.005 + rng.random() * 0.005)
        g = rng.integers(-8, 9, n).astype(np.float64)
        grads.append(g.copy())
        call = {"sync": comm.allreduce, "solo": comm.solo_allreduce,
                "majority": comm.majority_allreduce}[kind]
        rnd = comm.start(g, kind).wait() if r % 5 == 0 else call(g)
        mask = sum(1 << k for k in rnd.contributors)
        recs.append((rnd.round, mask, rnd.contributed, g))
    return grads, recs, comm.carried(), comm.stats


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("kind", ["solo", "majority", "sync"])
def test_partial_rounds_match_oracle(P, kind):
    n, seed = 16, 7
    rounds = 300 if kind != "sync" else 100
    lates = {}
    for late in ("drop", "carry"):
        with ShmGroup(P, n, late=late, seed=seed) as g:
            res = g.run(_partial_ranks, kind, rounds, n, P)
        grads = [res[k][0] for k in range(P)]
        masks = [res[0][1][r][1] for r in range(rounds)]
        sums, leftover = partial_allreduce_naive(grads, masks, late)
        late_rounds = 0
        for r in range(rounds):
            rid, mask, _, result = res[0][1][r]
            assert mask != 0
            if kind == "sync":
                assert mask == (1 << P) - 1
            if kind == "majority":
                assert (mask >> initiator(seed, r, P)) & 1
            for k in range(P):
                rid_k, mask_k, contributed_k, result_k = res[k][1][r]
                assert rid_k == r == rid
                assert mask_k == mask
                assert contributed_k == bool((mask >> k) & 1)
                late_rounds += not contributed_k
                np.testing.assert_array_equal(result_k, result)
            np.testing.assert_array_equal(result, sums[r])
        for k in range(P):
            np.testing.assert_array_equal(res[k][2], leftover[k])
            st = res[k][3]
            assert st["rounds"] == rounds and st["contributed"] + st["late"] == rounds
        if late == "carry":                 # no gradient mass lost
            total_in = sum(sum(gr) for gr in grads)
            total_out = sum(sums) + sum(leftover)
            np.testing.assert_array_equal(total_in, total_out)
        lates[late] = late_rounds
    if kind != "sync":
        assert lates["drop"] > 0 and lates["carry"] > 0, lates
    else:
        assert lates == {"drop": 0, "carry": 0}


def _mean_ranks(comm, rounds):
    out = []
    for r in range(rounds):
        if comm.rank:
            time.sleep(0.002)
        g = np.full(4, 6.0 * (comm.rank + 1))
        rnd = comm.solo_allreduce(g, op="mean")
        out.append((rnd.contributors, g.copy()))
    return out


@pytest.mark.parametrize("average", ["size", "contributors"])
def test_mean_divisor(average):
    with ShmGroup(3, 4, average=average) as g:
        res = g.run(_mean_ranks, 20)
    for k in range(3):
        for ranks, got in res[k]:
            s = sum(6.0 * (j + 1) for j in ranks)
            np.testing.assert_array_equal(got, s / (3 if average == "size" else len(ranks)))


# ---- non-blocking, lag, back-pressure ----------------------------------------------------
def _nonblocking(comm):
    out = {}
    if comm.rank == 0:
        b = np.full(8, 1.0)
        req = comm.start(b, "sync")
        polls = 0
        while not req.test():
            polls += 1
            time.sleep(0.001)
        out["polls"] = polls
        out["res"] = req.wait().contributors
        out["b"] = b.copy()
        time.sleep(0.3)                     # the others run solo rounds meanwhile
        out["lag"] = comm.lag()
        for _ in range(5):
            rnd = comm.solo_allreduce(np.zeros(8))
            out.setdefault("late", []).append(rnd.contributed)
        out["lag_after"] = comm.lag()
    else:
        time.sleep(0.05)
        b = np.full(8, 2.0)
        comm.allreduce(b)
        out["b"] = b.copy()
        for _ in range(5):
            comm.solo_allreduce(np.ones(8))
    return out


def test_nonblocking_and_lag():
    with ShmGroup(3, 8) as g:
        res = g.run(_nonblocking, timeout=20)
    assert res[0]["polls"] > 0 and res[0]["res"] == (0, 1, 2)
    for k in range(3):
        np.testing.assert_array_equal(res[k]["b"], np.full(8, 5.0))
    assert res[0]["lag"] == 5
    assert res[0]["late"] == [False] * 5 and res[0]["lag_after"] == 0


def _backpressure(comm, rounds, slow, group):
    seen = []
    for r in range(rounds):
        if comm.rank == slow:
            time.sleep(0.004)
        comm.solo_allreduce(np.ones(4))
        if comm.rank != slow:
            cu = comm._closed_upto()
            posted_slow = group.positions()[slow][0]
            seen.append(cu - posted_slow)
    return seen


def test_backpressure_bounds_lag():
    depth = 2
    with ShmGroup(3, 4, depth=depth) as g:
        res = g.run(_backpressure, 40, 2, g, timeout=30)
    ahead = [x for k in (0, 1) for x in res[k]]
    assert max(ahead) <= depth
    assert max(ahead) == depth              # the fast ranks were held back by the slow one


# ---- faults ------------------------------------------------------------------------------
def _killer(comm, victim, at):
    b = np.zeros(8)
    for r in range(10 ** 6):
        if comm.rank == victim and r == at:
            os.kill(os.getpid(), signal.SIGKILL)
        comm.allreduce(b)


def test_sigkilled_rank_fails_the_run():
    with ShmGroup(3, 8) as g:
        t = time.monotonic()
        with pytest.raises(RankFailure, match=r"rank 1 died \(signal 9\)"):
            g.run(_killer, 1, 20, timeout=30)
        assert time.monotonic() - t < 5


def _raiser(comm):
    b = np.zeros(8)
    for r in range(100):
        if comm.rank == 2 and r == 3:
            raise ValueError("boom at round 3")
        comm.allreduce(b)


def test_raising_rank_reports_traceback():
    with ShmGroup(3, 8) as g:
        t = time.monotonic()
        with pytest.raises(CollectiveError) as ei:
            g.run(_raiser, timeout=30)
        assert time.monotonic() - t < 5
    assert type(ei.value) is CollectiveError
    msg = str(ei.value)
    assert "rank 2 raised" in msg and "ValueError: boom at round 3" in msg
    assert "Traceback" in msg and "_raiser" in msg


def _sleepy(comm):
    if comm.rank == 1:
        time.sleep(1.0)
        return "slept"
    try:
        comm.allreduce(np.zeros(8), timeout=0.2)
    except CollectiveTimeout as e:
        return str(e)


def test_timeouts():
    with ShmGroup(2, 8) as g:
        res = g.run(_sleepy)
    assert "round 0" in res[0] and "ranks [1] have not arrived" in res[0]
    with ShmGroup(2, 8) as g:
        t = time.monotonic()
        with pytest.raises(CollectiveTimeout, match="timeout=0.3"):
            g.run(lambda comm: time.sleep(60), timeout=0.3)
        assert time.monotonic() - t < 5


def _retry_after_timeout(comm):
    if comm.rank == 1:
        time.sleep(0.5)
        comm.allreduce(np.ones(8))
        comm.allreduce(np.ones(8))
        return "arrived"
    buf = np.ones(8)
    with pytest.raises(ValueError, match="timeout"):
        comm.allreduce(buf, timeout=-1)          # checked before the round is posted
    try:
        comm.allreduce(buf, timeout=0.1)
        return "no timeout"
    except CollectiveTimeout as e:
        late = e.request.wait(10)                # the pending round, waited for again
    return late.round, buf.tolist(), comm.allreduce(np.ones(8)).round


def test_a_blocking_call_left_pending_can_be_finished():
    """A bad timeout is refused before the round starts (it left a round started and
    never waited for: every later call failed), and a blocking call that times out
    hands over its pending round's request, which completes once the others arrive."""
    with ShmGroup(2, 8) as g:
        res = g.run(_retry_after_timeout)
    assert res == [(0, [2.0] * 8, 1), "arrived"]


def test_calls_after_close_say_closed():
    """Every call on a closed communicator (or one of a closed group) is a
    CollectiveError saying so (numba's typing errors or a NoneType subscript before),
    and a failed start takes no round."""
    g = ShmGroup(2, 8)
    c = g.communicator(0)
    req = c.start(np.ones(8))                       # pending when the communicator closes
    c.close()
    for call in (c.lag, req.test, req.wait, lambda: c.allreduce(np.ones(8))):
        with pytest.raises(CollectiveError, match="rank 0: this communicator is closed"):
            call()
    c1 = g.communicator(1)
    g.close()
    with pytest.raises(CollectiveError, match="closed"):
        c1.allreduce(np.ones(8))
    assert c1.next_round == 0
    c1.close()


def test_dead_rank_detected_without_run():
    import multiprocess as mp

    with ShmGroup(2, 8, timeout=20) as g:
        def child():
            c = g.communicator(1)
            for _ in range(3):
                c.allreduce(np.ones(8))
            os.kill(os.getpid(), signal.SIGKILL)

        p = mp.get_context("fork").Process(target=child)
        p.start()
        try:
            c0 = g.communicator(0)
            t = time.monotonic()
            with pytest.raises(RankFailure, match=r"rank 1 \(pid \d+\) died"):
                for _ in range(10):
                    c0.allreduce(np.ones(8))
            assert time.monotonic() - t < 3
            c0.close()
        finally:
            p.join()


# ---- arguments -----------------------------------------------------------------------------
@pytest.mark.parametrize("kw,exc,text", [
    (dict(size=0), ValueError, "size: must be an int in"),
    (dict(size=61), ValueError, "size: must be an int in"),
    (dict(size=2.0), TypeError, "size: must be an int"),
    (dict(n=0), ValueError, "n: must be an int >= 1"),
    (dict(dtype=np.int32), TypeError, "dtype must be float32 or float64"),
    (dict(late="keep"), ValueError, "late: must be one of"),
    (dict(average="mean"), ValueError, "average: must be one of"),
    (dict(depth=0), ValueError, "depth must be >= 1"),
    (dict(depth=1.5), TypeError, "depth must be an int"),
    (dict(seed=-1), ValueError, "seed must be in"),
    (dict(timeout=0), ValueError, "timeout: must be a finite number > 0"),
])
def test_bad_group_arguments(kw, exc, text):
    args = dict(size=2, n=4)
    args.update(kw)
    with pytest.raises(exc, match=text):
        ShmGroup(args.pop("size"), args.pop("n"), **args)


def test_bad_calls():
    with ShmGroup(1, 6) as g:
        with pytest.raises(ValueError, match="rank: must be an int in"):
            g.communicator(1)
        with pytest.raises(TypeError, match="rank: must be an int"):
            g.communicator("0")
        with g.communicator(0) as c:
            with pytest.raises(TypeError, match="dtype float64"):
                c.allreduce(np.zeros(6, np.float32))
            with pytest.raises(ValueError, match="6 elements"):
                c.allreduce(np.zeros(5))
            with pytest.raises(ValueError, match="C-contiguous"):
                c.allreduce(np.zeros(12)[::2])
            with pytest.raises(TypeError, match="numpy array"):
                c.allreduce([0.0] * 6)
            with pytest.raises(ValueError, match="kind: must be one of"):
                c.start(np.zeros(6), "gossip")
            with pytest.raises(ValueError, match="op: must be one of"):
                c.allreduce(np.zeros(6), op="max")
            req = c.start(np.zeros(6), "solo")
            with pytest.raises(CollectiveError, match="not waited for"):
                c.start(np.zeros(6), "solo")
            req.wait()
            buf = c.buffer()                   # in place: no copy in
            buf[:] = 3.0
            c.allreduce(buf)
            np.testing.assert_array_equal(buf, np.full(6, 3.0))
        with pytest.raises(TypeError, match="fn must be callable"):
            g.run(42)


# ---- pickling -----------------------------------------------------------------------------
def test_pickled_group_reattaches_in_a_fresh_process():
    with ShmGroup(2, 5, timeout=30) as g:
        blob = pickle.dumps(g).hex()
        assert len(blob) < 1000
        code = (
            "import pickle, numpy as np\n"
            f"g = pickle.loads(bytes.fromhex('{blob}'))\n"
            "assert not g.owner and g.size == 2 and g.n == 5\n"
            "c = g.communicator(1)\n"
            "b = np.full(5, 2.0); c.allreduce(b)\n"
            "print('RESULT', b.tolist()); c.close(); g.close()\n")
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        c0 = g.communicator(0)
        b = np.full(5, 1.0)
        c0.allreduce(b)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert "RESULT [3.0, 3.0, 3.0, 3.0, 3.0]" in out
        np.testing.assert_array_equal(b, np.full(5, 3.0))
        c0.close()
    with pytest.raises(ValueError, match="no shared-memory segment"):
        cshm._attach_group(g.name, "drop", "size", None)


# ---- gather rounds -------------------------------------------------------------------------
def _payload(rank, r, cap):
    """Rank ``rank``'s payload of round r: a length in [0, cap] and NaN-free floats
    whose bits any copy would keep (and any sum would change)."""
    rng = np.random.default_rng([rank, r])
    return rng.standard_cauchy(int(rng.integers(0, cap + 1))) * 1e-300


def _gather_ranks(comm, rounds, kind, every_reduce):
    out = []
    for r in range(rounds):
        rnd = comm.allgather(_payload(comm.rank, r, comm.n), kind)
        out.append((rnd.round, rnd.contributors, rnd.contributed,
                    [p.tobytes() for p in rnd.parts]))
        if every_reduce and r % every_reduce == 0:       # reductions in the same sequence
            b = np.full(comm.n, float(comm.rank + 1))
            assert comm.allreduce(b).contributors == tuple(range(comm.size))
            assert b[0] == comm.size * (comm.size + 1) / 2
    return out


@pytest.mark.parametrize("kind", ["sync", "solo", "majority"])
@pytest.mark.parametrize("P,n", [(2, 9), (3, 40000)])    # 40000: several copy chunks
def test_gather_delivers_each_payload_exactly(kind, P, n):
    rounds = 30 if n < 1000 else 6
    with ShmGroup(P, n, gather=True, timeout=60) as g:
        res = g.run(_gather_ranks, rounds, kind, 4)
    for r in range(rounds):
        views = {(x[r][0], x[r][1], tuple(x[r][3])) for x in res}
        assert len(views) == 1                   # every rank saw the same round
        _, contributors, _, parts = res[0][r]
        if kind == "sync":
            assert contributors == tuple(range(P))
        assert len(contributors) >= 1
        for j, part in zip(contributors, parts):
            assert part == _payload(j, r, n).tobytes()      # the bits that were sent
        for k in range(P):
            assert res[k][r][2] == (k in contributors)


def _mixed(comm, how):
    if how == "op":
        if comm.rank == 0:
            comm.allgather(np.ones(3))
        else:
            comm.allreduce(np.ones(comm.n))
    else:                                       # sync on one rank, majority on another
        comm.start(np.ones(comm.n), "sync" if comm.rank == 0 else "majority").wait()


@pytest.mark.parametrize("how", ["op", "kind"])
def test_ranks_that_disagree_on_a_round_raise(how):
    """One rank gathers (or reduces by sync) while another reduces (by majority): the
    group stops with an error naming the disagreement instead of returning a wrong
    result or hanging."""
    with ShmGroup(2, 10, gather=True, timeout=30) as g:
        t0 = time.monotonic()
        with pytest.raises(CollectiveError, match="disagree on what round 0 is"):
            g.run(_mixed, how)
        assert time.monotonic() - t0 < 25


def test_gather_arguments():
    with ShmGroup(1, 4) as g:
        c = g.communicator(0)
        with pytest.raises(ValueError, match="gather=True"):
            c.allgather(np.ones(2))
        assert c.allreduce(np.ones(4)).round == 0     # the failed call used no round
        c.close()
    with ShmGroup(1, 4, gather=True) as g:
        c = g.communicator(0)
        with pytest.raises(ValueError, match="at most 4 elements"):
            c.allgather(np.ones(5))
        with pytest.raises(TypeError, match="dtype"):
            c.allgather(np.ones(2, np.float32))
        rnd = c.allgather(np.zeros(0))
        assert rnd.contributors == (0,) and rnd.parts[0].size == 0
        c.close()
    with pytest.raises(TypeError, match="gather"):
        ShmGroup(2, 4, gather="yes")
    with pytest.raises(ValueError, match="2\\*\\*24"):
        ShmGroup(2, 2 ** 24, np.float32, gather=True)


def _sum_ranks(comm, rounds):
    out = []
    for r in range(rounds):
        b = np.full(comm.n, float(comm.rank + r))
        comm.allreduce(b)
        out.append(b[0])
    return out


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_run_with_other_start_methods(start_method):
    """The ranks start through the kit's launcher rules: fresh interpreters attach the
    group by name and give the same sums as forked ranks."""
    with ShmGroup(2, 5, timeout=60) as g:
        res = g.run(_sum_ranks, 4, timeout=120, start_method=start_method)
    assert res == [[1.0 + 2 * r for r in range(4)]] * 2
    with ShmGroup(2, 5) as g, pytest.raises(ValueError, match="start_method"):
        g.run(_sum_ranks, 1, start_method="thread")
