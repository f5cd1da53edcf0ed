"""Training over unreliable links: the Robust Parameter Server (RPS) of Yu et al.,
"Distributed learning over unreliable networks", ICML 2019 (arXiv:1810.07766), and
message loss on the asynchronous PS.

RPS with no loss is exactly synchronous model averaging, and with loss it is exactly
the paper's round replayed with the run's documented coins (oracle in tests/naive.py,
on shared memory and on Ray); the same seed gives the same weights; a lost ASP push
is missing from exactly the shards it was lost to (closed form); observed loss rates
lie within a binomial bound of p; a killed worker is not waited for; bad input.
"""
import numpy as np
import pytest

from sgd_shm.data import make_rcv1_like
from sgd_shm.ps import ParameterStore, load_checkpoint, train
from sgd_shm.core.status import LOSS_STREAM
from tests.naive import fixed_gradient_model, model_averaging_naive

P, S, ROUNDS, SEED, LR, ALPHA = 3, 4, 12, 5, 0.5, 1e-4
SIGMAS = 6                                  # the binomial bound, in standard deviations


@pytest.fixture(scope="module")
def small():
    X, y = make_rcv1_like(600, 40, random_state=3)
    return X, np.where(y == np.unique(y)[1], 1.0, -1.0)


@pytest.fixture(scope="module")
def data():
    return make_rcv1_like(4000, 500, random_state=0)


def _partitions(n, seed):
    """train's documented partition rule: its generator default_rng(seed) draws the
    evaluation rows (up to 4096, without replacement), then a permutation of the rows,
    cut into P contiguous parts."""
    rng = np.random.default_rng(seed)
    rng.choice(n, min(4096, n), replace=False)
    perm = rng.permutation(n)
    b = np.linspace(0, n, P + 1).astype(np.int64)
    return [perm[b[k]:b[k + 1]] for k in range(P)]


def _coins(seed, p, rounds=ROUNDS):
    """The documented loss coins: worker k's round t draws u = rng.random(2 S) from
    default_rng([seed, k, LOSS_STREAM]); up iff u[j] >= p, down iff u[S + j] >= p."""
    up = np.empty((rounds, P, S), bool)
    down = np.empty((rounds, P, S), bool)
    for k in range(P):
        g = np.random.default_rng([seed, k, LOSS_STREAM])
        for t in range(rounds):
            u = g.random(2 * S)
            up[t, k], down[t, k] = u[:S] >= p, u[S:] >= p
    return up, down


def _oracle_run(X, ys, p, backend="shm"):
    """RPS for ROUNDS rounds, one minibatch per partition (batch_size = all rows), so
    every round of worker k uses exactly its partition; and the oracle's answer."""
    r = train(X, ys, n_workers=P, policy="rps", drop=p, n_shards=S, epochs=ROUNDS,
              batch_size=X.shape[0], lr=LR, alpha=ALPHA, seed=SEED, max_seconds=120,
              backend=backend, progress=False)
    up, down = _coins(SEED, p)
    bounds = np.linspace(0, X.shape[1], S + 1).astype(np.int64)
    want, _ = model_averaging_naive(X, ys, [_partitions(X.shape[0], SEED)] * ROUNDS, LR,
                                    ALPHA, bounds, up, down)
    return r, want, up, down


def _check_oracle(r, want, up, down):
    assert r.policy == "rps" and r.updates == ROUNDS
    assert [w["pushes"] for w in r.workers] == [ROUNDS] * P
    np.testing.assert_allclose(r.coef_, want, rtol=1e-12, atol=1e-15)
    tot = r.messages["total"]
    assert tot["up_sent"] == tot["down_sent"] == ROUNDS * P * S     # every server answered
    assert tot["up_lost"] == int((~up).sum()) and tot["down_lost"] == int((~down).sum())
    assert r.batches["lost"] == 0 and r.batches["applied"] == [ROUNDS] * P


def test_no_loss_is_synchronous_model_averaging(small, no_shm_leak):
    """p = 0: every round is exactly model averaging of one local step per worker."""
    X, ys = small
    r, want, up, down = _oracle_run(X, ys, 0.0)
    _check_oracle(r, want, up, down)
    assert r.observed_drop == 0.0 and r.drop == 0.0 and r.messages["seed"] == SEED
    assert r.final_loss < np.log(2.0) - 0.02                     # from log 2 at w = 0


def test_loss_replays_the_papers_round(small, no_shm_leak):
    """p = 0.3: the same run equals the oracle fed with the replayed coins (a server
    averages what it received; a worker keeps its block where the answer is lost)."""
    X, ys = small
    r, want, up, down = _oracle_run(X, ys, 0.3)
    _check_oracle(r, want, up, down)
    assert not np.allclose(r.coef_, _oracle_run(X, ys, 0.0)[1])   # the losses mattered


def test_same_seed_same_weights(data, no_shm_leak):
    """Rounds are synchronous and the coins seeded: two runs of the same seed and
    budget end with the same weights, bit for bit (several minibatches per partition)."""
    X, y = data
    kw = dict(n_workers=2, policy="rps", drop=0.1, n_shards=8, epochs=2, seed=11,
              max_seconds=60, progress=False)
    a, b = train(X, y, **kw), train(X, y, **kw)
    assert a.updates == b.updates == 2 * -(-X.shape[0] // 2 // 64)  # rounds of 2 epochs
    assert np.array_equal(a.coef_, b.coef_)
    assert a.messages == b.messages
    assert a.final_loss < np.log(2.0) - 0.02


def _within(lost, sent, p, what):
    sd = np.sqrt(sent * p * (1 - p))
    assert abs(lost - p * sent) <= SIGMAS * sd, (
        f"{what}: {lost} of {sent} messages lost, more than {SIGMAS} standard deviations "
        f"({SIGMAS * sd:.1f}) from p * sent = {p * sent:.1f} (p = {p})")


@pytest.mark.parametrize("policy, p", [("rps", 0.05), ("rps", 0.3), ("asp", 0.2)])
def test_observed_loss_within_binomial_bound(data, policy, p, no_shm_leak):
    """Lost messages per shard, per worker and per direction lie within 6 standard
    deviations of p times the messages sent; the three views add up."""
    X, y = data
    r = train(X, y, n_workers=2, policy=policy, drop=p, n_shards=4, max_seconds=0.6,
              seed=3, progress=False)
    m = r.messages
    assert m["drop"] == p and m["seed"] == 3 and len(m["per_shard"]) == 4
    for f in ("up_sent", "up_lost", "down_sent", "down_lost"):
        assert sum(x[f] for x in m["per_shard"]) == sum(x[f] for x in m["per_worker"]) \
            == m["total"][f] == sum(w[f] for w in r.workers)
    assert m["total"]["up_sent"] > 2000
    for view in ("per_shard", "per_worker"):
        for i, x in enumerate(m[view]):
            _within(x["up_lost"], x["up_sent"], p, f"{policy} {view} {i} up")
            _within(x["down_lost"], x["down_sent"], p, f"{policy} {view} {i} down")
    if policy == "rps":                     # a worker sends every block every round
        assert [x["up_sent"] for x in m["per_worker"]] == [4 * w["pushes"] for w in r.workers]
    assert r.final_loss < r.history[0]["loss"]


def test_lost_asp_push_is_missing_from_exactly_its_shards(data, tmp_path, no_shm_leak):
    """ASP, every worker pushes a fixed g (powers of two: exact sums): block j ends at
    exactly -lr * (pushes that reached shard j) * g, shard j's version counts them,
    and a push lost to every shard is not applied at all."""
    X, y = data
    d = X.shape[1]
    g = np.where(np.arange(d) % 3 == 0, 1.0, 0.5)
    lr = 2.0 ** -16
    r = train(X, y, n_workers=2, policy="asp", drop=0.3, n_shards=4, max_seconds=0.5,
              seed=2, lr=lr, model=fixed_gradient_model(g), checkpoint=tmp_path / "end",
              checkpoint_every=100.0, progress=False)
    ck = load_checkpoint(tmp_path / "end")
    b = np.linspace(0, d, 5).astype(np.int64)
    reached = [x["up_sent"] - x["up_lost"] for x in r.messages["per_shard"]]
    assert ck["shard_versions"].tolist() == reached and min(reached) > 100
    for j in range(4):
        assert np.array_equal(ck["weights"][b[j]:b[j + 1]], -lr * reached[j] * g[b[j]:b[j + 1]])
    steps = r.messages["per_worker"][0]["up_sent"] // 4 + r.messages["per_worker"][1]["up_sent"] // 4
    assert max(reached) <= r.updates < steps                  # some pushes lost everywhere
    assert sum(w["pushes"] for w in r.workers) == r.updates == ck["version"]
    assert sum(r.batches["applied"]) == steps                 # the worker cannot know


def test_killed_worker_is_not_waited_for(data, no_shm_leak):
    """A worker SIGKILLed mid-run under RPS: the others' rounds go on without it."""
    X, y = data
    r = train(X, y, n_workers=3, policy="rps", drop=0.1, n_shards=4, max_seconds=1.2,
              seed=4, faults={1: 0.3}, progress=False)
    assert r.killed == [1]
    pushes = [w["pushes"] for w in r.workers]
    assert min(pushes[0], pushes[2]) > pushes[1] + 20
    assert r.final_loss < r.history[0]["loss"]


def test_store_publish_and_partial_push(no_shm_leak):
    """The store verbs under RPS and loss: publish writes a round once (the first
    caller) and the global version is the rounds every shard completed; a push to
    some shards raises the slack and counts once."""
    with ParameterStore(6, n_shards=3, n_workers=2) as s:
        assert s.publish(0, np.ones(2), 1) and not s.publish(0, np.zeros(2), 1)
        assert s.version == 0                         # shards 1 and 2 are at round 0
        assert s.publish(1, None, 1) and s.publish(2, np.full(2, 2.0), 1)
        assert s.version == 1 and s.weights.tolist() == [1, 1, 0, 0, 2, 2]
        s.deposited(1, 48)
        assert s.slot(1)["pushes"] == 1 and s.slot(1)["bytes_sent"] == 48
        res = s.push(np.ones(6), 1, lr=1.0, worker=0, shards=[0, 2])
        assert res.applied == [0, 2] and s.version == 2 and s.slack == 1
        assert s.weights.tolist() == [0, 0, 0, 0, 1, 1] and s._check()
        for bad in ([], [2, 0], [3]):
            with pytest.raises(ValueError, match="shards"):
                s.push(np.ones(6), 0, lr=1.0, shards=bad)
        with pytest.raises(ValueError, match="values"):
            s.publish(0, np.ones(3), 5)


def test_bad_input(data):
    X, y = data
    for p in (1.0, -0.1, 1.5, np.nan, "0.1", True):
        with pytest.raises(ValueError, match=r"drop: .*\[0, 1\)"):
            train(X, y, policy="rps", drop=p)
    for pol in ("bsp", "ssp", "saps"):
        with pytest.raises(ValueError, match=f"drop: policy '{pol}' cannot lose messages.*rps"):
            train(X, y, policy=pol, drop=0.1)
    with pytest.raises(ValueError, match="n_shards: must be an int >= 1"):
        train(X, y, policy="rps", n_shards=0)
    with pytest.raises(ValueError, match=r"n_shards: 600 shards for 500 weights.*<= 500"):
        train(X, y, policy="rps", n_shards=600)
    with pytest.raises(ValueError, match=r"n_shards: .*for 500 weights"):
        train(X, y, policy="asp", drop=0.1, n_shards=501)
    with pytest.raises(ValueError, match="compress: policy 'rps' sends model blocks"):
        train(X, y, policy="rps", compress="topk:0.01")
    with pytest.raises(ValueError, match="'rps'"):
        train(X, y, policy="gossip")


def test_rps_on_ray(small, local_ray):
    """On Ray (shard actors as the servers): the same oracle with loss, the same bits
    as on shared memory, and ASP's lost pushes counted against the shards."""
    X, ys = small
    r, want, up, down = _oracle_run(X, ys, 0.3, backend="ray")
    assert r.backend == "ray"
    _check_oracle(r, want, up, down)
    shm = _oracle_run(X, ys, 0.3)[0]
    assert np.array_equal(r.coef_, shm.coef_) and r.messages == shm.messages
    a = train(X, ys, n_workers=2, policy="asp", drop=0.2, n_shards=4, max_seconds=0.8,
              seed=1, backend="ray", progress=False)
    tot = a.messages["total"]
    assert tot["up_sent"] == tot["down_sent"] > 0
    _within(tot["up_lost"] + tot["down_lost"], 2 * tot["up_sent"], 0.2, "ray asp")
    assert a.updates == sum(w["pushes"] for w in a.workers)
