"""Compressed pushes on the parameter server: a sparse push equals the dense push of
the same vector scattered into zeros (weights, slot counters, the global version),
but locks and bumps only the shards its indices hit (shared memory and Ray); train
with a compressor sends a fraction of the dense bytes and still learns; a work budget
(epochs=) stops at equal work; bad input."""
import numpy as np
import pytest

from sgd_shm.data import make_rcv1_like
from sgd_shm.ps import ParameterStore, WaitPolicy, load_checkpoint, train
from sgd_shm.core.atomics import store_release_py
from sgd_shm.ps.store import LINE
from tests.naive import fixed_gradient_model

LR = 2.0 ** -10                          # powers of two: the updates are exact


@pytest.fixture(scope="module")
def data():
    return make_rcv1_like(4000, 500, random_state=0)


def _slot(s, k):
    d = s.slot(k)
    d.pop("heartbeat_ns")
    return d


def _random_sparse(rng, n, dtype):
    nnz = int(rng.integers(0, 12))
    idx = np.sort(rng.choice(n, nnz, replace=False)).astype(dtype)
    vals = rng.integers(-8, 9, nnz) / 4.0
    return idx, vals


def test_sparse_push_equals_scattered_dense(no_shm_leak):
    n, shards = 1000, 8
    rng = np.random.default_rng(0)
    with ParameterStore(n, n_shards=shards, n_workers=2) as sp, \
            ParameterStore(n, n_shards=shards, n_workers=2) as de:
        hits = np.zeros(shards, np.int64)
        for t in range(60):
            k = t % 2
            idx, vals = _random_sparse(rng, n, np.int32 if t % 3 else np.int64)
            scale = [1.0, 0.5, 0.25][t % 3]
            _, v_s = sp.pull(worker=k)
            _, v_d = de.pull(worker=k)
            if t % 5 == 0:                     # stale by a few pushes
                v_s, v_d = max(v_s - 3, 0), max(v_d - 3, 0)
            g = np.zeros(n)
            g[idx] = vals
            rs = sp.push_sparse(idx, vals, v_s, lr=LR, worker=k, scale=scale)
            rd = de.push(g, v_d, lr=LR, worker=k, scale=scale)
            hit = np.unique(np.searchsorted(sp.bounds, idx, side="right") - 1)
            hits[hit] += 1
            assert rs.applied == hit.tolist() and rs.deferred == []
            assert rs.staleness == rd.staleness
            assert sp.version == de.version == t + 1         # +1 per push, as dense
            np.testing.assert_array_equal(sp.weights, de.weights)
            assert (sp.shard_versions() == hits).all()        # only hit shards bump
            assert (de.shard_versions() == t + 1).all()
        for k in range(2):
            a, b = _slot(sp, k), _slot(de, k)
            assert a.pop("bytes_sent") < b.pop("bytes_sent") == 30 * 8 * n
            assert a == b and a["bytes_dense"] == 30 * 8 * n
            assert (sp.staleness_histogram(k) == de.staleness_histogram(k)).all()
        assert sp.slack >= sp.version - sp.shard_versions().min() > 0
        assert sp._check() and de._check() and de.slack == 0
        # a snapshot of a sparse run restores only with the slack it needs
        w, vers, v = sp.snapshot()
        with pytest.raises(ValueError, match="version"):
            de.restore(w, vers, v)
        de.restore(w, vers, v, slack=v - int(vers.min()))
        assert de._check() and de.version == v


def test_sparse_push_defers_held_shards_and_bytes(no_shm_leak):
    n = 100
    with ParameterStore(n, n_shards=4, n_workers=1) as s:
        s._lock_shard_for_test(2)                              # a live holder (us)
        idx = np.array([1, 2, 60, 99])                         # shards 0, 2, 3
        res = s.push_sparse(idx, np.ones(4), 0, lr=1.0, worker=0, nbytes=40,
                            wait=WaitPolicy(spins=0, yields=0))
        assert res.applied == [0, 3] and res.deferred == [2] and s.version == 0
        assert s.slot(0)["deferred"] == 1 and s.slot(0)["bytes_sent"] == 40
        store_release_py(s._locks[2 * LINE:2 * LINE + 1], 0)
        s.push_deferred(res)
        assert res.deferred == [] and s.version == 1
        assert s.shard_versions().tolist() == [1, 0, 1, 1]
        assert (s.weights[idx] == -1.0).all() and s.weights.sum() == -4.0
        r = s.push_sparse(np.array([], np.int64), np.array([]), 1, lr=1.0, worker=0)
        assert r.applied == [] and s.version == 2 and s.slot(0)["pushes"] == 2
        assert s.slot(0)["bytes_dense"] == 2 * 8 * n and s._check()
        for idx, vals, what in [([3, 2], [1.0, 1.0], "ascending"),
                                ([3, 3], [1.0, 1.0], "ascending"),
                                ([0, n], [1.0, 1.0], "ascending"),
                                ([1, 2], [1.0], "values"),
                                ([1, 2], [1.0, np.nan], "NaN")]:
            with pytest.raises(ValueError, match=what):
                s.push_sparse(np.array(idx), np.array(vals), 0, lr=1.0)
        with pytest.raises(TypeError, match="indices"):
            s.push_sparse(np.array([0.5]), np.array([1.0]), 0, lr=1.0)


def test_train_closed_form_with_sparse_messages(data, tmp_path, no_shm_leak):
    """Every worker pushes a fixed gradient with K nonzeros through top-K with
    error feedback: each message is exactly those K entries and the residual stays
    0, so the weights end at -lr * (sum of scales) * g, the shards holding no
    nonzero are never touched, and the others count every push."""
    X, y = data
    d = X.shape[1]
    g = np.zeros(d)
    g[[3, 4, 200, 201, 202]] = [1.0, -0.5, 2.0, 0.25, -1.0]  # shards 0 and 3 of 8 (d=500)
    r = train(X, y, n_workers=2, policy="asp", max_seconds=0.5, seed=1, lr=LR,
              model=fixed_gradient_model(g), compress="topk:0.01", checkpoint=tmp_path / "end",
              checkpoint_every=100.0, progress=False)
    k = r.updates
    assert k == sum(w["pushes"] for w in r.workers) > 10
    ck = load_checkpoint(tmp_path / "end")
    hit = np.zeros(8, bool)
    hit[[0, 3]] = True
    assert ck["version"] == k and (ck["shard_versions"][hit] == k).all()
    assert (ck["shard_versions"][~hit] == 0).all()
    np.testing.assert_array_equal(r.coef_, -LR * k * g)
    assert r.bytes_dense == k * 8 * d and 0 < r.bytes_sent < r.bytes_dense / 20


def test_train_topk_sends_little_and_learns(data, no_shm_leak):
    X, y = data
    r = train(X, y, n_workers=2, policy="asp", compress="topk:0.01", epochs=6,
              max_seconds=20, seed=0, progress=False)
    assert r.updates == 6 * -(-X.shape[0] // 2 // 64) * 2 == sum(r.batches["applied"])
    assert r.bytes_dense == r.updates * 8 * X.shape[1]
    assert 0 < r.bytes_sent < r.bytes_dense / 50
    assert r.final_loss < np.log(2.0) - 0.05                # from log(2) at w = 0
    assert r.compress is not None and r.epochs == 6
    dense = train(X, y, n_workers=2, policy="saps", max_seconds=0.3, seed=0, progress=False)
    assert dense.bytes_sent == dense.bytes_dense == dense.updates * 8 * X.shape[1] > 0
    assert dense.compress is None


@pytest.mark.parametrize("compress", ["qsgd:8", "qsgd:8:256", "threshold:0.01"])
def test_train_qsgd_and_threshold_learn(data, compress, no_shm_leak):
    """QSGD's messages vary in size and carry a decoding scale; the threshold
    compressor's vary in size: both travel as sparse pushes and learn."""
    X, y = data
    r = train(X, y, n_workers=2, policy="asp", compress=compress, epochs=4,
              max_seconds=20, seed=0, progress=False)
    assert r.bytes_dense == r.updates * 8 * X.shape[1]
    assert 0 < r.bytes_sent < r.bytes_dense / 4
    assert r.final_loss < np.log(2.0) - 0.05


@pytest.mark.parametrize("policy,compress", [("asp", None), ("bsp", None),
                                             ("saps", "topk:0.01")])
def test_epochs_stop_at_equal_work(data, policy, compress, no_shm_leak):
    X, y = data
    n_batches = 2 * -(-(X.shape[0] // 2) // 64)
    r = train(X, y, n_workers=2, policy=policy, epochs=2, max_seconds=30, seed=0,
              compress=compress, slowdown={0: 2.0}, progress=False)
    assert sum(r.batches["applied"]) == r.updates == 2 * n_batches
    assert r.batches["lost"] == 0 and r.seconds < 30


def test_bad_input(data):
    X, y = data
    with pytest.raises(ValueError, match="compress"):
        train(X, y, compress="bogus", max_seconds=0.1)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="epochs"):
            train(X, y, epochs=bad, max_seconds=0.1)


def test_sparse_push_on_ray(data, local_ray):
    """The Ray link sends only the hit shards their runs; the result equals the
    dense push of the scattered vector."""
    from sgd_shm.ps.partitions import Batches
    from sgd_shm.ps.ray_backend import RayBackend, RayLink
    from sgd_shm.ps.transport import Push
    n, rng = 100, np.random.default_rng(0)
    batches = Batches.draw(64, 2, 8, rng)
    from sgd_shm.ps import RaySession
    backend = RayBackend(n, 4, 2, batches, rng, session=RaySession(), owned=True)
    try:
        link = RayLink(backend.hub, backend.shards, backend.bounds, LR)
        idx = np.array([1, 2, 60, 99], np.int32)            # shards 0, 2, 3
        vals = np.array([1.0, -2.0, 0.5, 4.0])
        link.exchange(0, Push(0, 0.5, indices=idx, values=vals, nbytes=24), pull=False)
        g = np.zeros(n)
        g[idx] = vals
        link.exchange(1, Push(0, 1.0, grad=g), pull=False)
        w, vers, v, pushes, _ = backend.snapshot()
        np.testing.assert_array_equal(w, -LR * 1.5 * g)
        assert vers.tolist() == [2, 1, 2, 2] and v == 2 and pushes.tolist() == [1, 1]
        workers, hist, _ = backend.report()
        assert [wk["bytes_sent"] for wk in workers] == [24, 8 * n]
        assert [wk["bytes_dense"] for wk in workers] == [8 * n, 8 * n]
        assert [wk["staleness_sum"] for wk in workers] == [0, 1]
        assert [wk["applied_weight"] for wk in workers] == [0.5, 1.0]
    finally:
        backend.close()
