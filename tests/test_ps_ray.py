"""The parameter server on Ray: the same train(), policies and checks as on shared
memory, with shard actors, a hub actor and worker actors, on a local Ray instance (and
a two-node cluster on this box). Skipped where Ray is not installed (it is an
optional extra that the test extras install)."""
import numpy as np
import pytest

ray = pytest.importorskip("ray")

from sgd_shm.data import make_rcv1_like  # noqa: E402
from sgd_shm.ps import SSP, load_checkpoint, train  # noqa: E402
from tests.naive import fixed_gradient_model


@pytest.fixture(scope="module")
def data():
    return make_rcv1_like(4000, 500, random_state=0)


@pytest.mark.parametrize("n_workers", [1, 4])
def test_closed_form_on_ray(local_ray, data, n_workers, tmp_path):
    """k pushes of g move the weights by exactly k * lr * g, and every shard's
    version and the global version by k."""
    X, y = data
    d = X.shape[1]
    g = np.where(np.arange(d) % 3 == 0, 1.0, 0.5)
    lr = 2.0 ** -16
    r = train(X, y, n_workers=n_workers, policy="asp", backend="ray", max_seconds=1.0,
              seed=1, lr=lr, model=fixed_gradient_model(g), n_shards=4, checkpoint=tmp_path / "end",
              checkpoint_every=100.0, progress=False)
    k = r.updates
    assert r.backend == "ray"
    assert k == sum(w["pushes"] for w in r.workers) > 5
    ck = load_checkpoint(tmp_path / "end")
    assert ck["version"] == k and (ck["shard_versions"] == k).all()
    assert np.array_equal(ck["weights"], -lr * k * g)
    assert np.array_equal(r.coef_, -lr * k * g)
    assert r.batches["lost"] == 0 and sum(r.batches["applied"]) == k


def test_bsp_lockstep_and_training_on_ray(local_ray, data):
    X, y = data
    r = train(X, y, n_workers=3, policy="bsp", backend="ray", max_seconds=1.5, seed=0,
              progress=False)
    pushes = [w["pushes"] for w in r.workers]
    assert max(pushes) - min(pushes) <= 1
    assert r.final_loss < r.history[0]["loss"]
    assert r.batches["lost"] == 0
    s = train(X, y, n_workers=3, policy=SSP(staleness=1), backend="ray", max_seconds=1.0,
              seed=0, progress=False)
    pushes = [w["pushes"] for w in s.workers]
    assert max(pushes) - min(pushes) <= 2


@pytest.mark.exclusive
def test_saps_flags_only_the_slowed_worker_on_ray(local_ray, data):
    """Worker 0 slowed 4x is flagged and nobody else (4 workers); with no slowdown
    nobody is flagged (2 workers: on a 2-core box 4 worker actors beside Ray's own
    processes are slowed by the CPU itself, one of them sometimes enough to be a true
    straggler for a window)."""
    X, y = data
    kw = dict(policy="saps", backend="ray", max_seconds=3.0, seed=0, n_shards=2,
              progress=False)
    r = train(X, y, n_workers=4, slowdown={0: 4.0}, **kw)
    assert {w for _, w in r.detections} == {0}
    assert r.workers[0]["stolen"] == 0 and sum(w["stolen"] for w in r.workers) > 0
    assert r.batches["lost"] == 0
    r = train(X, y, n_workers=2, **kw)
    assert r.detections == []


def test_killed_worker_actor_on_ray(local_ray, data):
    """A worker actor killed mid-run (ray.kill): the run completes and its final loss
    is within 0.02 of an undisturbed run."""
    X, y = data
    kw = dict(n_workers=3, policy="saps", backend="ray", max_seconds=2.0, seed=3,
              progress=False)
    ref = train(X, y, **kw)
    r = train(X, y, faults={1: 0.5}, **kw)
    assert r.killed == [1]
    assert r.final_loss < ref.final_loss + 0.02
    assert r.batches["lost"] <= 1          # the minibatch it held (refills are atomic)


def test_checkpoint_moves_between_backends(local_ray, data, tmp_path, no_shm_leak):
    """A run checkpointed on shared memory resumes on Ray, and the other way round:
    versions, pushes and the clock continue."""
    X, y = data
    a = train(X, y, n_workers=2, policy="asp", max_seconds=0.5, seed=0,
              checkpoint=tmp_path / "shm.ckpt", progress=False)
    b = train(X, y, n_workers=2, policy="asp", backend="ray", max_seconds=0.8, seed=0,
              resume=tmp_path / "shm.ckpt", checkpoint=tmp_path / "ray.ckpt", progress=False)
    assert b.resumed_from["version"] == a.updates
    assert b.updates > a.updates and b.seconds > a.seconds
    assert [w["pushes"] for w in b.workers] >= [w["pushes"] for w in a.workers]
    c = train(X, y, n_workers=2, policy="asp", max_seconds=0.5, seed=0,
              resume=tmp_path / "ray.ckpt", progress=False)
    assert c.resumed_from["version"] == b.updates and c.updates > b.updates
    assert c.final_loss < a.history[0]["loss"]


def test_predicts_held_out_data_on_ray(local_ray, data):
    X, y = data
    r = train(X[:3000], y[:3000], n_workers=2, policy="asp", backend="ray",
              max_seconds=1.0, seed=0, progress=False)
    assert r.score(X[3000:], y[3000:]) > max(np.mean(y[3000:] > 0), np.mean(y[3000:] < 0))


def test_two_node_cluster():
    """Two Ray nodes on this box (ray.cluster_utils.Cluster): train joins the
    cluster by its address and its worker actors spread over both nodes. The cluster
    keeps Ray's default worker niceness (15), as one started by hand would: the run
    warns about it."""
    from ray.cluster_utils import Cluster
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        X, y = make_rcv1_like(2000, 200, random_state=1)
        with pytest.warns(RuntimeWarning, match="RAY_worker_niceness=0"):
            r = train(X, y, n_workers=2, policy="asp", backend="ray",
                      address=cluster.address, epochs=1, max_seconds=120, seed=0,
                      progress=False)
        assert len({n["NodeID"] for n in ray.nodes() if n["Alive"]}) == 2
        # one epoch, however slow the box: each partition's minibatches, applied once
        assert r.updates == sum(r.batches["applied"]) == 2 * -(-1000 // 64)
        assert r.batches["lost"] == 0
        assert len(set(r.nodes)) == 2
    finally:
        ray.shutdown()
        cluster.shutdown()
