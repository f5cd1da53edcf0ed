"""The parameter server's relaxed version clock (``train(..., clock="multicounter")``,
``ParameterStore(clock=...)``): the store's verbs under it, staleness within the
stated bound of an exact replay, the SSP gate's bound, SaPS's detection, the closed
form for every policy on every local transport (and Ray), checkpoints that record the
clock and resume across clocks. See docs/parameter-server.md, "Clocks"."""
import pickle
import threading

import numpy as np
import pytest

from sgd_shm.data import make_rcv1_like
from sgd_shm.ps import SSP, ParameterStore, load_checkpoint, train
from sgd_shm.ps.shm_backend import _LiveState
from tests.naive import fixed_gradient_model

POLICIES = ["bsp", "asp", "ssp", "saps", "rps"]


@pytest.fixture(scope="module")
def data():
    return make_rcv1_like(2000, 300, random_state=0)


def _closed_form(X, y, **kw):
    """A run whose every gradient is g (powers of two: the sums are exact): the
    weights, the final version and the pushes, for the closed-form check."""
    d = X.shape[1]
    g = np.where(np.arange(d) % 3 == 0, 1.0, 0.5)
    lr = 2.0 ** -16
    if kw.get("policy") == "saps":
        kw.setdefault("staleness", 10**6)          # no push is scaled or dropped
    r = train(X, y, n_workers=2, max_seconds=60, seed=1, lr=lr, n_shards=4,
              model=fixed_gradient_model(g), progress=False, **kw)
    return r, g, lr


def _check_closed_form(r, g, lr, policy, ck=None):
    k = r.updates
    pushes = sum(w["pushes"] for w in r.workers)
    assert k > 0
    assert k == (pushes // 2 if policy == "rps" else pushes)   # RPS: rounds of 2 workers
    assert np.array_equal(r.coef_, -lr * k * g)
    if ck is not None:
        assert ck["meta"]["clock"] == "multicounter"
        assert ck["version"] == k and (ck["shard_versions"] == k).all()


# ---- the store --------------------------------------------------------------------------
def test_bad_clock_names_the_argument(data):
    with pytest.raises(ValueError, match='clock: must be "exact" or "multicounter"'):
        ParameterStore(8, clock="relaxed")
    with pytest.raises(ValueError, match="clock_counters"):
        ParameterStore(8, clock="exact", clock_counters=4)
    X, y = data
    with pytest.raises(ValueError, match='clock: must be "exact" or "multicounter", got 3'):
        train(X, y, clock=3)


@pytest.mark.parametrize("shared", [True, False])
def test_store_verbs_under_the_relaxed_clock(shared, no_shm_leak):
    """Pushes count on the MultiCounter: the exact version is the pushes; a read is
    within the bound; bump adds exactly; a pickled handle re-attaches to
    the same clock; the invariants hold."""
    with ParameterStore(8, n_shards=2, n_workers=2, shared=shared,
                        clock="multicounter") as st:
        assert st.clock == "multicounter" and st.clock_error_bound() == 8 * (2 * 3 + 8)
        _, v = st.pull(worker=0)
        for _ in range(300):
            res = st.push(np.ones(8), v, lr=1.0, worker=0)
            assert res.staleness >= 0
        st.push_sparse([1, 2], [1.0, 1.0], v, lr=1.0, worker=1)
        assert st.exact_version == 301
        assert abs(st.version - st.exact_version) <= st.clock_error_bound()
        st.bump([5, 5], 5)
        assert st.exact_version == 306
        if shared:
            other = pickle.loads(pickle.dumps(st))
            other.push(np.ones(8), 0, lr=1.0)
            other.close()
            assert st.exact_version == 307
        assert st._check()


def test_advance_adds_each_round_once_under_races(no_shm_leak):
    """RPS's max-CAS on the relaxed clock: only the call whose CAS moved the round
    word adds the rounds it moved, so many racing publishers count each round once."""
    with ParameterStore(8, n_shards=2, n_workers=4, shared=False,
                        clock="multicounter") as st:
        def publish(k):
            for r in range(1, 2001):
                st.advance(r if (r + k) % 3 else r - 1)
        ts = [threading.Thread(target=publish, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert st.advance(0) == 2000 and st.exact_version == 2000


def test_relaxed_staleness_is_within_the_bound_of_an_exact_replay():
    """Two workers' pulls and pushes interleaved by a seeded schedule, replayed on an
    exact store and a relaxed one push by push: each relaxed staleness is within
    2 * error_bound() of the exact one (two reads, each within the bound), the slots
    count the clamped values, and both end at the same exact version."""
    rng = np.random.default_rng(0)
    ex = ParameterStore(8, n_shards=1, n_workers=2, shared=False)
    rx = ParameterStore(8, n_shards=1, n_workers=2, shared=False, clock="multicounter")
    try:
        bound = 2 * rx.clock_error_bound()
        pulled = {0: (0, 0), 1: (0, 0)}
        diffs, total = [], [0, 0]
        for _ in range(5000):
            k = int(rng.integers(2))
            if rng.random() < 0.3:
                pulled[k] = (ex.pull(worker=k)[1], rx.pull(worker=k)[1])
                continue
            a = ex.push(np.ones(8), pulled[k][0], lr=0.0, worker=k).staleness
            b = rx.push(np.ones(8), pulled[k][1], lr=0.0, worker=k).staleness
            assert b >= 0 and abs(b - a) <= bound, (a, b, bound)
            diffs.append(b - a)
            total[k] += b
        assert ex.exact_version == rx.exact_version == len(diffs)
        assert [rx.slot(k)["staleness_sum"] for k in (0, 1)] == total
        assert rx.staleness_histogram().sum() == len(diffs)
        assert abs(np.mean(diffs)) < rx.clock_error_bound()   # the reads are unbiased
    finally:
        ex.close()
        rx.close()


def test_ssp_gate_reads_push_counts_not_the_clock(no_shm_leak):
    """The SSP gate asks each worker's push count (exact slots), never the global
    version: moving the relaxed clock far leaves its answer as it was."""
    pol = SSP(staleness=1).bind(2)
    with ParameterStore(8, n_shards=1, n_workers=2, shared=False,
                        clock="multicounter") as st:
        for _ in range(3):
            st.push(np.ones(8), 0, lr=0.0, worker=0)
        link = type("L", (), {"server": type("S", (), {"store": st, "parts": None})()})()
        view = _LiveState(link)
        before = [pol.may_step(0, n, view) for n in range(6)]
        st.bump([10**6], 10**6)
        assert [pol.may_step(0, n, view) for n in range(6)] == before
        assert before == [True, True, False, False, False, False]


# ---- training under the relaxed clock ---------------------------------------------------
@pytest.mark.parametrize("backend", ["shm", "threads"])
@pytest.mark.parametrize("policy", POLICIES)
def test_closed_form_every_policy(data, backend, policy, tmp_path, no_shm_leak):
    """k pushes of g move the weights by exactly k * lr * g with clock="multicounter";
    the final version and the checkpoint's are exact (k); the checkpoint records the
    clock."""
    X, y = data
    r, g, lr = _closed_form(X, y, policy=policy, backend=backend, epochs=2,
                            clock="multicounter", checkpoint=tmp_path / "end",
                            checkpoint_every=100.0)
    _check_closed_form(r, g, lr, policy, load_checkpoint(tmp_path / "end"))
    assert np.array(r.staleness_hist).sum() == sum(w["pushes"] for w in r.workers)


@pytest.mark.parametrize("backend", ["shm", "threads"])
def test_ssp_bound_holds_with_the_relaxed_clock(data, backend, no_shm_leak):
    """SSP(s=1) with worker 0 slowed 3x: pushes differ by at most s + 1 (the gate's
    error under the relaxed clock is 0: it reads push counts)."""
    X, y = data
    r = train(X, y, n_workers=2, policy=SSP(staleness=1), backend=backend, max_seconds=0.8,
              seed=0, slowdown={0: 3.0}, progress=False, clock="multicounter")
    pushes = [w["pushes"] for w in r.workers]
    assert min(pushes) > 0 and max(pushes) - min(pushes) <= 2


@pytest.mark.exclusive
def test_saps_flags_only_the_slowed_worker(data, no_shm_leak):
    """SaPS reads the staleness the relaxed clock recorded: worker 0, slowed 4x, is
    flagged and nobody else."""
    X, y = data
    r = train(X, y, n_workers=2, policy="saps", slowdown={0: 4.0}, max_seconds=2.0, seed=0,
              n_shards=2, progress=False, clock="multicounter")
    assert [w for _, w in r.detections] == [0]
    assert r.workers[1]["stolen"] > 0 and r.workers[0]["stolen"] == 0


@pytest.mark.parametrize("first,second", [("exact", "multicounter"),
                                          ("multicounter", "exact")])
def test_resume_across_clocks(data, first, second, tmp_path, no_shm_leak):
    """A checkpoint written under one clock resumes under the other: the version goes
    on from the checkpoint's, the closed form holds over both runs, each checkpoint
    names its clock."""
    X, y = data
    kw = dict(policy="asp", epochs=1, checkpoint_every=100.0)
    r1, g, lr = _closed_form(X, y, clock=first, checkpoint=tmp_path / "a", **kw)
    ck1 = load_checkpoint(tmp_path / "a")
    assert ck1["meta"]["clock"] == first and ck1["version"] == r1.updates
    r2, _, _ = _closed_form(X, y, clock=second, checkpoint=tmp_path / "b",
                            resume=tmp_path / "a", **kw)
    ck2 = load_checkpoint(tmp_path / "b")
    assert ck2["meta"]["clock"] == second
    assert r2.updates > r1.updates and ck2["version"] == r2.updates
    assert np.array_equal(r2.coef_, -lr * r2.updates * g)


# ---- Ray --------------------------------------------------------------------------------
@pytest.mark.exclusive
def test_closed_form_every_policy_on_ray(data, local_ray):
    """The same closed form on Ray: node-local stores (BSP, ASP, SSP, SaPS, whose
    agents add other nodes' pushes with bump) and the hub's private store (RPS)."""
    X, y = data
    for policy in POLICIES:
        r, g, lr = _closed_form(X, y, policy=policy, backend="ray", epochs=1,
                                clock="multicounter")
        _check_closed_form(r, g, lr, policy)


@pytest.mark.exclusive
def test_saps_flags_only_the_slowed_worker_on_ray(data, local_ray):
    X, y = data
    r = train(X, y, n_workers=2, policy="saps", backend="ray", slowdown={0: 4.0},
              max_seconds=2.0, seed=0, n_shards=2, progress=False, clock="multicounter")
    assert [w for _, w in r.detections] == [0]
