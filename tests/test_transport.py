"""The transport conformance suite: what :mod:`sgd_shm.ps.transport` says every
transport gives, checked on each of them (shared memory, Ray, threads) through
``train(..., backend=...)``: closed-form totals and versions, exactly-once minibatches
under a work budget, the policies' gates (BSP rounds, SSP's bound, SaPS flagging the
slowed worker), a dead worker, and one worker's run drawing the same numbers on every
transport (bit-identical weights). Ray runs on conftest's local instance."""
import numpy as np
import pytest

from sgd_shm.data import make_rcv1_like
from sgd_shm.ps import SSP, load_checkpoint, train
from sgd_shm.ps.transport import TRANSPORTS, Link, Push
from tests.naive import fixed_gradient_model

BACKENDS = [pytest.param("shm"),
            pytest.param("ray", marks=pytest.mark.exclusive),
            pytest.param("threads")]


@pytest.fixture(scope="module")
def data():
    return make_rcv1_like(2000, 300, random_state=0)


@pytest.fixture
def backend(request):
    """The transport's name; for Ray, conftest's local instance."""
    name = request.param
    if name == "ray":
        pytest.importorskip("ray")
        request.getfixturevalue("local_ray")
    return name


def _per_partition(X, workers, batch_size=64):
    return -(-(-(-X.shape[0] // workers)) // batch_size)     # ceil(ceil(n / w) / b)


def test_every_transport_is_tested():
    assert sorted(p.values[0] for p in BACKENDS) == sorted(TRANSPORTS)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_closed_form_totals_and_versions(data, backend, tmp_path, no_shm_leak):
    """k pushes of a fixed g move the weights by exactly k * lr * g; the global
    version and every shard's version equal k, the pushes the slots count and the
    staleness histograms' total."""
    X, y = data
    d = X.shape[1]
    g = np.where(np.arange(d) % 3 == 0, 1.0, 0.5)     # powers of two: sums are exact
    lr = 2.0 ** -16
    r = train(X, y, n_workers=2, policy="asp", backend=backend, max_seconds=60, epochs=2,
              seed=1, lr=lr, model=fixed_gradient_model(g), n_shards=4,
              checkpoint=tmp_path / "end", checkpoint_every=100.0, progress=False)
    k = r.updates
    assert r.backend == backend
    assert k == 2 * 2 * _per_partition(X, 2) == sum(w["pushes"] for w in r.workers)
    assert np.array(r.staleness_hist).sum() == k
    ck = load_checkpoint(tmp_path / "end")
    assert ck["version"] == k and (ck["shard_versions"] == k).all()
    assert np.array_equal(ck["weights"], -lr * k * g)
    assert np.array_equal(r.coef_, -lr * k * g)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_exactly_once_minibatches_under_a_budget(data, backend, no_shm_leak):
    """BSP with a budget of 3 epochs: the workers stay in lockstep, so every
    minibatch of every partition is applied exactly once per epoch (the tally in
    train raises on a second application; none is lost or left queued), and the
    updates are the budget."""
    X, y = data
    nb = _per_partition(X, 2)
    r = train(X, y, n_workers=2, policy="bsp", backend=backend, max_seconds=120, epochs=3,
              seed=0, n_shards=3, progress=False)
    b = r.batches
    assert r.updates == 3 * 2 * nb
    assert b["epochs"] == [3, 3] and b["applied"] == [3 * nb, 3 * nb]
    assert b["lost"] == 0 and b["queued_at_end"] == [0, 0]
    assert [w["pushes"] for w in r.workers] == [3 * nb, 3 * nb]
    assert r.final_loss < np.log(2.0)                 # from log(2) at w = 0


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_gates_bsp_rounds_and_ssp_bound(data, backend, no_shm_leak):
    """BSP: no worker is ever a round ahead of another (pushes differ by at most 1);
    SSP(s=1): by at most s + 1; both with worker 0 slowed 3x."""
    X, y = data
    kw = dict(n_workers=2, backend=backend, max_seconds=0.8, seed=0, slowdown={0: 3.0},
              progress=False)
    r = train(X, y, policy="bsp", **kw)
    pushes = [w["pushes"] for w in r.workers]
    assert min(pushes) > 0 and max(pushes) - min(pushes) <= 1
    s = train(X, y, policy=SSP(staleness=1), **kw)
    pushes = [w["pushes"] for w in s.workers]
    assert min(pushes) > 0 and max(pushes) - min(pushes) <= 2


@pytest.mark.exclusive
@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_saps_flags_the_slowed_worker(data, backend, no_shm_leak):
    """SaPS with worker 0 slowed 4x: worker 0 is flagged and nobody else, the other
    takes its minibatches, none is lost."""
    X, y = data
    r = train(X, y, n_workers=2, policy="saps", backend=backend, slowdown={0: 4.0},
              max_seconds=2.0, seed=0, n_shards=2, progress=False)
    assert [w for _, w in r.detections] == [0]
    assert r.workers[1]["stolen"] > 0 and r.workers[0]["stolen"] == 0
    assert r.batches["stolen_by_worker"] == [0, r.workers[1]["stolen"]]
    assert r.batches["lost"] == 0


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_dead_worker(data, backend, no_shm_leak):
    """Worker 1 killed mid-run under SaPS: the run finishes, reports it, the others
    keep pushing, its queue is taken over (stolen), and at most what it held is lost
    (the minibatch it computed, or the unqueued rest of an epoch it was enqueueing)."""
    X, y = data
    r = train(X, y, n_workers=3, policy="saps", backend=backend, max_seconds=1.2, seed=3,
              faults={1: 0.3}, progress=False)
    assert r.killed == [1]
    pushes = [w["pushes"] for w in r.workers]
    assert min(pushes[0], pushes[2]) > pushes[1]
    assert sum(r.batches["stolen_by_worker"]) > 0
    assert r.batches["lost"] <= 1 + _per_partition(X, 3)
    # it may die between its push and its report of the minibatch
    assert r.updates - 1 <= sum(r.batches["applied"]) <= r.updates


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_dead_worker_under_a_budget(data, backend, no_shm_leak):
    """A worker killed at the coordinator's first sample of a budgeted run: the others
    spend the budget (its partition's minibatches are taken by SaPS's stealing) and
    the run ends by the budget (not by max_seconds), at most one ticket short. Ray's
    steps are actor calls, so its budget is smaller: the run must outlast the kill."""
    X, y = data
    epochs = 4 if backend == "ray" else 60
    budget = epochs * 3 * _per_partition(X, 3)
    r = train(X, y, n_workers=3, policy="saps", backend=backend, max_seconds=120,
              epochs=epochs, seed=3, faults={1: 0.0}, progress=False)
    assert r.killed == [1] and r.seconds < 120
    assert budget - 1 <= r.updates <= budget
    assert r.updates - 1 <= sum(r.batches["applied"]) <= r.updates
    assert r.batches["lost"] <= 1 + _per_partition(X, 3)


@pytest.fixture(scope="module")
def one_worker_reference(data):
    """One worker on shared memory: the numbers every transport must reproduce."""
    X, y = data
    return {pol: train(X, y, n_workers=1, policy=pol, epochs=2, max_seconds=120, seed=0,
                       progress=False, **kw).coef_
            for pol, kw in (("asp", {}), ("rps", {"drop": 0.2, "n_shards": 4}))}


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_one_worker_is_bit_identical_on_every_transport(data, backend,
                                                         one_worker_reference):
    """The same server state code and the same random numbers (a refill's order is
    drawn by the worker on every transport): one worker's weights agree to the bit,
    for plain pushes and for model averaging over lossy links."""
    X, y = data
    for pol, kw in (("asp", {}), ("rps", {"drop": 0.2, "n_shards": 4})):
        r = train(X, y, n_workers=1, policy=pol, epochs=2, max_seconds=120, seed=0,
                  backend=backend, progress=False, **kw)
        assert np.array_equal(r.coef_, one_worker_reference[pol]), pol


def test_links_declare_the_protocol():
    """Every link is a :class:`Link` (five verbs, bounds, poll_s); a push is dense or
    sparse."""
    from sgd_shm.ps.partitions import Batches, Partitions
    from sgd_shm.ps.server import ServerState
    from sgd_shm.ps.shm_backend import ShmLink
    from sgd_shm.ps.store import ParameterStore, WaitPolicy
    from sgd_shm.ps.threads_backend import ThreadLink
    rng = np.random.default_rng(0)
    batches = Batches.draw(40, 2, 8, rng)
    server = ServerState(ParameterStore(8, n_shards=2, n_workers=2, shared=False),
                         Partitions(batches, rng, budget=3, shared=False))
    try:
        for link in (ShmLink(server, 0.5, WaitPolicy(), 0),
                     ThreadLink(server, 0.5, WaitPolicy(), [False, False])):
            assert isinstance(link, Link)
            link.exchange(0, Push(0, 1.0, grad=np.ones(8)), pull=False)
            link.exchange(1, Push(0, 0.5, indices=np.array([1, 6]), values=np.ones(2)),
                          pull=False)
        w, v = link.exchange(0)
        assert v == 4 and np.array_equal(w, -0.5 * (2 * np.ones(8) + np.isin(
            np.arange(8), [1, 6]) * 1.0))
        got = [link.take(0, [(0, None)], rng, claim=True) for _ in range(4)]
        assert got[3] is None and all(t is not None and t[0] == 0 for t in got[:3])
        st = link.state(0)
        assert st.epoch(0) == 1 and st.pushes(1) == 2 and not st.stopped
        with pytest.raises(ValueError, match="counts"):
            link.report(0, {"bogus": 1})
    finally:
        server.close()
    try:
        from sgd_shm.ps.ray_backend import RayLink
    except ImportError:
        return
    assert all(callable(getattr(RayLink, verb)) for verb in (
        "state", "exchange", "take", "report", "average_round"))


def test_bad_backend_names_the_choices(data):
    X, y = data
    with pytest.raises(ValueError, match="backend: must be one of.*threads"):
        train(X, y, backend="thread", max_seconds=0.1)
    with pytest.raises(ValueError, match="start_method"):
        train(X, y, backend="threads", start_method="spawn", max_seconds=0.1)
