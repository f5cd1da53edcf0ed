"""The Ray transport with node-local shared memory (:mod:`sgd_shm.ps.ray_local`): two
Ray nodes on this box (``ray.cluster_utils.Cluster``), the exact cross-node sync, the
gates across nodes, per-node traffic, faults of a worker, an agent and a server, and
Ray as its users expect (missing Ray, a bad address, arguments Ray cannot honour)."""
import sys
import time

import numpy as np
import pytest

from sgd_shm.data import make_rcv1_like
from sgd_shm.ps import train
from tests.naive import fixed_gradient_model

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.exclusive


@pytest.fixture(scope="module")
def two_nodes():
    """A two-node Ray cluster on this box, 2 CPUs per node: train joins it by address
    and its 4 worker actors (1 CPU each) spread 2 per node."""
    from ray.cluster_utils import Cluster
    if ray.is_initialized():
        ray.shutdown()
    from sgd_shm.ps.ray_session import LOCAL_SYSTEM_CONFIG
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "_system_config": LOCAL_SYSTEM_CONFIG})
    try:
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, configure_logging=False, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def session(two_nodes):
    """One RaySession for the module's runs: their actors are reused (an actor takes
    seconds to start), and killed at its end."""
    from sgd_shm.ps import RaySession
    with RaySession() as s:
        yield s


@pytest.fixture(scope="module")
def data():
    X, y = make_rcv1_like(3000, 300, random_state=4)
    return X, y


def test_exact_closed_form_across_two_nodes(session, data, tmp_path):
    """k pushes of a fixed g on two nodes leave the global weights at exactly -k lr g,
    and the global version and every shard's version at k; BSP's budget is applied
    exactly once per minibatch; each node reports its own traffic."""
    X, y = data
    d = X.shape[1]
    g = np.where(np.arange(d) % 3 == 0, 1.0, 0.5)
    lr = 2.0 ** -16
    r = train(X, y, n_workers=4, policy="bsp", backend="ray", epochs=2, max_seconds=120,
              seed=1, lr=lr, model=fixed_gradient_model(g), n_shards=4, session=session,
              checkpoint=tmp_path / "end", checkpoint_every=100.0, progress=False)
    k = r.updates
    per = -(-(-(-X.shape[0] // 4)) // 64)
    assert k == 2 * 4 * per == sum(r.batches["applied"]) and r.batches["lost"] == 0
    assert np.array_equal(r.coef_, -lr * k * g)
    from sgd_shm.ps import load_checkpoint
    ck = load_checkpoint(tmp_path / "end")
    assert ck["version"] == k and (ck["shard_versions"] == k).all()
    assert len(set(r.nodes)) == 2
    assert sorted(len(t["workers"]) for t in r.traffic) == [2, 2]
    assert all(t["syncs"] > 0 and t["bytes_up"] > 0 and t["bytes_down"] > 0
               for t in r.traffic)


def test_ssp_bound_holds_across_nodes(session, data):
    """SSP(1) over two nodes: remote counts arrive late, so the gate only closes more:
    no worker's pushes run more than s + 1 ahead of the slowest's (the +1: the
    push of the step the gate let through)."""
    X, y = data
    r = train(X, y, n_workers=4, policy="ssp", staleness=1, backend="ray", epochs=1,
              max_seconds=120, seed=2, slowdown={0: 3.0}, progress=False, session=session)
    pushes = [w["pushes"] for w in r.workers]
    assert max(pushes) - min(pushes) <= 2
    assert r.updates == sum(r.batches["applied"])


def test_two_nodes_learn_like_one_box_and_topk_sends_less(session):
    """Same wall time: two nodes' ASP ends within 0.02 of shared memory's loss; the
    bytes across nodes are counted per node and are smaller with TopK."""
    X, y = make_rcv1_like(3000, 2000, random_state=4)
    shm = train(X, y, n_workers=4, policy="asp", max_seconds=3, seed=0, progress=False)
    dense = train(X, y, n_workers=4, policy="asp", backend="ray", max_seconds=3, seed=0,
                  progress=False, session=session)
    topk = train(X, y, n_workers=4, policy="asp", backend="ray", max_seconds=3, seed=0,
                 compress="topk:0.001", progress=False, session=session)
    assert abs(dense.final_loss - shm.final_loss) < 0.02
    assert dense.final_loss < dense.history[0]["loss"] - 0.1

    def per_push(r):                 # bytes across nodes, both ways, per update applied
        return sum(t["bytes_up"] + t["bytes_down"] for t in r.traffic) / r.updates
    assert per_push(topk) < 0.5 * per_push(dense)


def _kill_named(role):
    """Kill one of the run's agents or servers, found by name (the run holds every one
    of the session's: a session's idle actors are taken by its next run)."""
    names = [n for n in ray.util.list_named_actors() if n.startswith(f"sgd_shm.ps {role}")]
    assert names, ray.util.list_named_actors()
    ray.kill(ray.get_actor(names[0]), no_restart=True)


@pytest.mark.parametrize("role", ["agent", "server"])
def test_a_dead_agent_or_server_ends_the_run_with_a_named_error(session, data, role,
                                                                 no_shm_leak):
    """Killing a node's agent or a global server mid-run: train raises NodeError
    naming the node within 10 s, and no shared memory is left behind."""
    from sgd_shm.ps.ray_local import NodeError
    X, y = data
    t_kill = []

    def kill(rec):
        if rec["seconds"] > 0.5 and not t_kill:
            _kill_named(role)
            t_kill.append(time.perf_counter())
    with pytest.raises(NodeError, match="Ray node"):
        train(X, y, n_workers=4, policy="asp", backend="ray", max_seconds=60, seed=0,
              progress=False, callbacks=kill, session=session)
    assert t_kill and time.perf_counter() - t_kill[0] < 10


def test_wait_and_missing_ray_and_session_errors(monkeypatch, data):
    """Arguments Ray cannot honour raise before anything starts; without Ray the
    error says how to install it."""
    from sgd_shm.ps import WaitPolicy
    X, y = data
    with pytest.raises(ValueError, match="wait: on Ray"):
        train(X, y, backend="ray", policy="rps", wait=WaitPolicy(), epochs=1)
    with pytest.raises(ValueError, match="wait: on Ray"):
        train(X, y, backend="ray", policy="asp", drop=0.1, wait=WaitPolicy(), epochs=1)
    with pytest.raises(TypeError, match="session: expected a sgd_shm.ps.RaySession"):
        train(X, y, backend="ray", session="local", epochs=1)
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install 'relaxed-sgd-kit\[ray\]'"):
        train(X, y, backend="ray", epochs=1)


def test_bad_address_fails_fast_naming_it(data, monkeypatch):
    """An address where nothing answers: the trainer raises a ConnectionError naming it
    once the connection timeout has passed, not later (Ray not running in this
    process; the 30 s default shortened to 3 s for the test)."""
    from sgd_shm.ps import ray_session
    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.setattr(ray_session, "CONNECT_TIMEOUT", 3.0)
    X, y = data
    t = time.perf_counter()
    with pytest.raises(ConnectionError, match="127.0.0.1:9.*within 3 s"):
        train(X, y, backend="ray", address="127.0.0.1:9", epochs=1, progress=False)
    assert 3.0 <= time.perf_counter() - t < 20         # the setting governs, not the 30 s
