"""The simulator (sgd_shm.sim) against closed forms and naive oracles: BSP in virtual
time is synchronous data-parallel SGD; ASP with constant step times pushes in the
order of its clocks; SSP's staleness bound holds and binds; SaPS flags the slow
class of a heterogeneous cluster and nobody in a homogeneous one; RPS is model
averaging through block servers (with the real loss coins); compressors' bytes and
the network's times add up; the collectives' rounds give the partial-allreduce
oracle's sums; bad input."""
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from sgd_shm.collectives.base import initiator
from sgd_shm.compress import TopK
from sgd_shm.data import make_rcv1_like
from sgd_shm.core.policies import SSP, Policy
from sgd_shm.sim import Cluster, Network, SimResult, simulate
from tests.naive import (asp_order_naive, data_parallel_sgd_naive, fixed_gradient_model,
                         logistic_grad_naive, model_averaging_of_log,
                         partial_allreduce_naive, rounds_of_log)

ALPHA = 1e-4


@pytest.fixture(scope="module")
def data():
    X, y = make_rcv1_like(1200, 150, density=0.05, random_state=0)
    return X, y


@pytest.mark.parametrize("cluster", [Cluster(1e-3), Cluster(1e-3, factors="hetero",
                                                            delay=("exponential", 1e-4))])
def test_bsp_is_data_parallel_sgd(data, cluster):
    """BSP: every push of a round is computed at the weights of the round before, so
    the run is synchronous data-parallel SGD with the sum of the workers' gradients
    (the naive oracle's mean times P), whatever the step times."""
    X, y = data
    n, lr = 4, 0.3
    r = simulate(X, y, n_workers=n, policy="bsp", epochs=2, cluster=cluster,
                 network=Network(1e-4, 1e8), batch_size=32, lr=lr, seed=3)
    assert r.updates == len(r.log["worker"]) == 2 * 4 * math.ceil(300 / 32)
    pulled = np.array(r.log["pulled"])
    assert np.array_equal(pulled, np.arange(pulled.size) // n * n)   # lockstep rounds
    w = data_parallel_sgd_naive(X, y, rounds_of_log(r, n), lr * n, ALPHA)
    np.testing.assert_allclose(r.coef_, w, rtol=1e-7, atol=1e-10)
    assert r.seconds > 0 and r.history[-1]["seconds"] == r.seconds


def test_asp_order_of_constant_step_times(data):
    """ASP, worker k at a constant step time, free messages: the pushes come in the
    order of the workers' clocks, each computed at the version its previous push
    left (the naive oracle adds the same step times)."""
    X, y = data
    factors = [1.0, 1.13, 1.29, 1.41]
    r = simulate(X, y, n_workers=4, policy="asp", epochs=1,
                 cluster=Cluster(1e-3, factors=factors), seed=1)
    want = asp_order_naive([1e-3 * f for f in factors], r.updates)
    got = list(zip(r.log["seconds"], r.log["worker"], r.log["pulled"]))
    assert got == want
    assert r.log["version"] == list(range(r.updates))
    assert r.seconds == want[-1][0]


def test_ssp_bound_holds_and_binds(data):
    """SSP(s): when worker k applies its push, it is at most s + 1 pushes ahead of the
    slowest (its gate opened at most s ahead); with a 4x spread the bound is reached."""
    X, y = data
    s, n = 2, 4
    r = simulate(X, y, n_workers=n, policy=SSP(staleness=s), epochs=3,
                 cluster=Cluster(1e-3, factors="hetero"), seed=0)
    counts = [0] * n
    gaps = []
    for k in r.log["worker"]:
        gaps.append(counts[k] - min(counts))
        counts[k] += 1
    assert max(gaps) == s                         # the bound holds and is reached
    asp = simulate(X, y, n_workers=n, policy="asp", epochs=3,
                   cluster=Cluster(1e-3, factors="hetero"), seed=0)
    assert r.seconds > asp.seconds                # the gate costs the fast workers time


def test_saps_flags_the_slow_class(data):
    """A heterogeneous cluster of 16, the last quarter 4x slower: SaPS flags exactly
    those four, and their minibatches are stolen; a homogeneous cluster: nobody."""
    X, y = data
    slow = Cluster(1e-3, classes=[(0.75, 1.0), (0.25, 4.0)])
    r = simulate(X, y, n_workers=16, policy="saps", epochs=10, cluster=slow, seed=0,
                 batch_size=16)
    assert sorted(k for _, k in r.detections) == [12, 13, 14, 15]
    assert sum(w["stolen"] for w in r.workers[:12]) > 0
    assert all(w["slowdown"] == 4.0 for w in r.workers[12:])
    even = simulate(X, y, n_workers=16, policy="saps", epochs=10, cluster=Cluster(1e-3),
                    seed=0, batch_size=16)
    assert even.detections == [] and even.events == []


def test_rps_is_model_averaging_with_the_real_coins(data):
    """RPS: the servers' model after the rounds is the naive model averaging of the
    same minibatches with the same lost messages (the coins of core.status.Losses)."""
    X, y = data
    n, S, lr, p = 3, 4, 0.5, 0.2
    r = simulate(X, y, n_workers=n, policy="rps", epochs=1, drop=p, n_shards=S, lr=lr,
                 batch_size=64, seed=5)
    server, up, down = model_averaging_of_log(X, y, r, n, S, p, 5, lr, ALPHA)
    np.testing.assert_allclose(r.coef_, server, rtol=1e-7, atol=1e-10)
    lost = sum(w["up_lost"] + w["down_lost"] for w in r.workers)
    assert lost == (~up).sum() + ((~down) & up.any(axis=1)[:, None, :]).sum()


def test_rps_simulates_faults_and_shared_cores(data):
    """RPS under faults: a worker whose fault comes before its step ends dies then (its
    blocks never sent); later rounds average the live workers' blocks only, which is
    the naive model averaging without it. On shared cores a round's steps queue for
    them. (Both were ignored: the dead worker kept pushing, cores changed no time.)"""
    X, y = data
    n, S, lr, p, step = 3, 4, 0.5, 0.2, 1e-3
    kw = dict(n_workers=n, policy="rps", epochs=1, drop=p, n_shards=S, lr=lr, batch_size=32,
              seed=5, cluster=Cluster(step))
    r = simulate(**kw, X=X, y=y, faults={1: 3.5 * step})   # dies in its fourth step
    assert r.killed == [1]
    per = math.ceil(X.shape[0] / n / 32)                   # rounds of an epoch
    assert [w["pushes"] for w in r.workers] == [per, 3, per]
    server, up, down = model_averaging_of_log(X, y, r, n, S, p, 5, lr, ALPHA)
    assert not up[3:, 1].any()
    np.testing.assert_allclose(r.coef_, server, rtol=1e-7, atol=1e-10)
    every = simulate(**kw, X=X, y=y, faults={0: 0.0, 1: 0.0, 2: 0.5 * step})
    assert every.killed == [0, 1, 2] and every.updates == 0
    four = {**kw, "drop": None, "n_workers": 4}
    free = simulate(X, y, **four)
    shared = simulate(X, y, **{**four, "cluster": Cluster(step, cores=2)})
    rounds = free.updates                                  # (RPS: a round is an update)
    assert shared.updates == free.updates == math.ceil(X.shape[0] / 4 / 32)
    assert free.seconds == pytest.approx(rounds * step, rel=1e-9)
    assert shared.seconds == pytest.approx(rounds * 2 * step, rel=1e-9)   # two waves


def test_bytes_and_network_times_of_compressors(data):
    """One worker on a 1 MB/s link, no latency: a dense step is its compute plus a
    dense pull and a dense push; TopK's push carries k (index, value) pairs of 12
    bytes; both runs count what they sent."""
    X, y = data
    d, bw, step = X.shape[1], 1e6, 1e-3
    net = Network(0.0, bw)
    dense = simulate(X, y, n_workers=1, epochs=1, cluster=Cluster(step), network=net)
    comp = TopK(ratio=0.1)
    topk = simulate(X, y, n_workers=1, epochs=1, cluster=Cluster(step), network=net,
                    compress=comp)
    k = comp.k_for(d)
    pushes = dense.updates
    assert topk.updates == pushes
    assert dense.bytes_sent == dense.bytes_dense == pushes * 8 * d
    assert topk.bytes_sent == pushes * 12 * k and topk.bytes_dense == pushes * 8 * d
    assert dense.seconds == pytest.approx(pushes * (step + 16 * d / bw), rel=1e-9)
    assert topk.seconds == pytest.approx(pushes * (step + (8 * d + 12 * k) / bw), rel=1e-9)


def test_a_policy_of_ones_own_is_driven(data):
    """A user's Policy subclass (a gate of its own: at most one push ahead of worker
    0) runs through the generic path: every waiting gate is asked again."""
    class Lead(Policy):
        name = "lead"

        def may_step(self, k, my_pushes, link):
            return k == 0 or my_pushes <= link.pushes(0)

    X, y = data
    r = simulate(X, y, n_workers=3, policy=Lead(), epochs=1,
                 cluster=Cluster(1e-3, factors=[3.0, 1.0, 1.0]), seed=0)
    counts = [0, 0, 0]
    for k in r.log["worker"]:
        counts[k] += 1
        assert k == 0 or counts[k] <= counts[0] + 1
    assert r.name == "lead" and isinstance(r, SimResult)


def test_time_to_target_and_eval_set(data):
    X, y = data
    Xv, yv = make_rcv1_like(400, 150, density=0.05, random_state=1)
    r = simulate(X, y, n_workers=8, policy="asp", epochs=3, eval_set=(X[:300], y[:300]),
                 target_loss=0.65, seed=0)
    assert r.time_to_target is not None and r.history[-1]["loss"] <= 0.65
    assert all(set(h) >= {"seconds", "step", "loss", "val_loss", "val_score"}
               for h in r.history)
    assert r.time_to_score(0.0) == 0.0
    assert set(r.to_dict()) >= {"history", "final_loss", "seconds", "updates"}


def test_killed_worker_is_no_longer_waited_for(data):
    X, y = data
    r = simulate(X, y, n_workers=4, policy="bsp", epochs=2, faults={1: 0.005}, seed=0)
    assert r.killed == [1]
    assert r.workers[1]["pushes"] < r.workers[0]["pushes"]


# ---- collectives ------------------------------------------------------------------------

def _replay_eager(X, y, r, P, lr, late, seed, batch):
    """The eager run replayed from its log by the naive oracle: rank k's gradients of
    the rounds it did not skip, at the weights after the rounds before, over its
    rows k, k + P, ... in the trainer's order; each round's sum from
    partial_allreduce_naive on the rounds so far."""
    n = X.shape[0]
    rows = [np.arange(k, n, P) for k in range(P)]
    rngs = [np.random.default_rng([seed, k, 0x5EED]) for k in range(P)]
    order = [rngs[k].permutation(rows[k]) for k in range(P)]
    pos = [0] * P
    skips = set(map(tuple, r.log["skips"]))
    masks = [sum(1 << k for k in c) for c in r.log["contributors"]]
    grads = [[] for _ in range(P)]
    w = np.zeros(X.shape[1])
    for t in range(len(masks)):
        for k in range(P):
            if (k, t) in skips:
                grads[k].append(np.zeros_like(w))
                continue
            if pos[k] + batch > order[k].size:
                order[k], pos[k] = rngs[k].permutation(rows[k]), 0
            mb = order[k][pos[k]:pos[k] + batch]
            pos[k] += batch
            grads[k].append(logistic_grad_naive(X, y, mb, w, ALPHA))
        sums, _ = partial_allreduce_naive(grads, masks[:t + 1], late)
        w = w - lr * sums[t] / P
    return w


@pytest.mark.parametrize("kind", ["sync", "solo", "majority"])
@pytest.mark.parametrize("late", ["drop", "carry"])
def test_collectives_match_the_partial_allreduce_oracle(data, kind, late):
    X, y = data
    P, lr, seed, batch = 4, 2.0, 7, 32
    r = simulate(X, y, n_workers=P, collective=kind, late=late, epochs=2, lr=lr,
                 batch_size=batch, seed=seed,
                 cluster=Cluster(1e-3, factors=[1.0, 1.3, 1.7, 2.5], imbalance=(1, 2e-3)),
                 network=Network(5e-5))
    assert r.rounds == len(r.log["contributors"]) == math.ceil(2 * X.shape[0] / (P * batch))
    for t, c in enumerate(r.log["contributors"]):
        if kind == "sync":
            assert c == tuple(range(P))
        elif kind == "solo":
            assert len(c) == 1
        else:
            assert initiator(seed, t, P) in c
    if kind != "sync":
        assert r.mean_contributors < P and sum(r.late) > 0
    w = _replay_eager(X, y, r, P, lr, late, seed, batch)
    np.testing.assert_allclose(r.coef_, w, rtol=1e-7, atol=1e-10)


def test_carry_conserves_the_gradient_mass(data):
    """A fixed gradient g on every rank, late="carry": every gradient computed is
    applied once, or still carried; with "drop" the late ones are lost."""
    X, y = data
    g = np.linspace(-1.0, 1.0, X.shape[1])
    model = fixed_gradient_model(g)
    P, lr = 4, 0.5
    cl = Cluster(1e-3, factors=[1.0, 1.5, 2.0, 3.0])
    for late in ("carry", "drop"):
        r = simulate(X, y, n_workers=P, collective="solo", late=late, epochs=1, lr=lr,
                     model=model, cluster=cl, seed=0)
        applied = -r.coef_ / (lr / P) / g           # gradients that reached the model
        m = float(np.median(applied))
        np.testing.assert_allclose(applied, m, rtol=1e-9)
        computed = r.bytes_dense // (8 * X.shape[1])
        contributed = sum(len(c) for c in r.log["contributors"])
        if late == "drop":
            assert round(m) == r.bytes_sent // (8 * X.shape[1]) <= contributed < computed
        else:
            assert round(m) <= computed and round(m) > contributed - 1


# ---- bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize("kw, err, match", [
    (dict(policy="asp", collective="sync"), ValueError, "give one of them"),
    (dict(collective="ring"), ValueError, "collective"),
    (dict(policy="fast"), ValueError, "policy"),
    (dict(cluster="big"), TypeError, "cluster"),
    (dict(drop=0.1, policy="bsp"), ValueError, "drop"),
    (dict(drop=0.1, collective="sync"), ValueError, "drop"),
    (dict(faults={9: 1.0}), ValueError, "faults"),
    (dict(seed=-1), ValueError, "seed"),
])
def test_bad_input(data, kw, err, match):
    X, y = data
    with pytest.raises(err, match=match):
        simulate(X, y, n_workers=2, epochs=1, **kw)


@pytest.mark.parametrize("kw, match", [
    (dict(staleness=3, policy="asp"), "staleness: policy 'asp' has no staleness"),
    (dict(window=1.0, policy="ssp"), "window: .* which policy 'ssp' does not run"),
    (dict(staleness=3, collective="sync"), "staleness: .* collective='sync' does not use"),
    (dict(window=1.0, collective="solo"), "window: .* 'saps', which collective='solo'"),
    (dict(detect_factor=3.0, collective="majority"), "detect_factor: .* is ignored"),
    (dict(n_shards=2, collective="sync"), "n_shards: .* collective='sync' does not use"),
    (dict(late="drop"), "late: .* eager collectives, which policy='asp' does not use"),
    (dict(average="contributors", policy="bsp"), "average: .* policy='bsp' does not use"),
    (dict(depth=2, policy="saps"), "depth: .* depth=2 is ignored"),
])
def test_settings_the_run_ignores_are_warned_of(data, kw, match):
    """A setting the run does not use is ignored with a warning pointing at the caller's
    line (a comparison may pass one set of settings to every policy)."""
    X, y = data
    with pytest.warns(UserWarning, match=match) as rec:
        simulate(X, y, n_workers=2, epochs=1, **kw)
    assert rec[0].filename == __file__


def test_bad_models():
    with pytest.raises(ValueError, match="step_s"):
        Cluster(-1.0)
    with pytest.raises(ValueError, match="classes"):
        Cluster(classes=[(0.5, 1.0), (0.4, 2.0)])
    with pytest.raises(ValueError, match="bandwidth"):
        Network(bandwidth=0)
    with pytest.raises(ValueError, match="topology"):
        Network(topology="mesh")
    with pytest.raises(ValueError, match="trace"):
        Cluster(trace=[[]])
    assert Network.gbps(8).bandwidth == 1e9
    c = Cluster(classes=[(0.75, 1.0), (0.25, 4.0)])
    assert c.worker_factors(8).tolist() == [1.0] * 6 + [4.0] * 2
    for bad in (("normal", 1.0), ("pareto", 1e-3, 1.0), ("exponential", -1.0), "pareto",
                ("pareto", 1e-3)):
        with pytest.raises(ValueError, match="delay"):
            Cluster(delay=bad)
    with pytest.raises(ValueError, match="imbalance"):
        Cluster(imbalance=(-1, 0.1))


def test_cluster_and_network_values():
    """Bools are not numbers here (they were taken as 1: a factor, a fraction, a step's
    seconds), factors are checked when the cluster is made and named as factors, numpy
    numbers are numbers, and clusters compare and hash by value (a trace's arrays made
    == ambiguous, list factors made hash() fail)."""
    for kw, match in ((dict(factors=[1, True]), "factors: expected a profile name"),
                      (dict(classes=[(True, 2)]), "classes: expected"),
                      (dict(trace=[[1e-3], [True]]), "trace: .*not bools"),
                      (dict(factors="bogus"), "factors: profile must be one of"),
                      (dict(factors=[1, 0.5]), "factors: factors must be finite and >= 1"),
                      (dict(factors={0: "x"}), "factors: a factor must be a number")):
        with pytest.raises(ValueError, match=match):
            Cluster(**kw)
    for bad in (True, float("nan"), -1.0, "1e9"):
        with pytest.raises(ValueError, match="bandwidth"):
            Network(0.0, bad)
    assert Network(0.0, np.int64(10**9)) == Network(0.0, np.float32(1e9)) == Network(0.0, 1e9)
    times = np.array([1e-3, 2e-3])
    a, b = Cluster(trace=[times]), Cluster(trace=[[1e-3, 2e-3]])
    assert a == b and hash(a) == hash(b) and a != Cluster(trace=[[1e-3, 3e-3]])
    times[0] = 5.0                                       # the cluster keeps its own copy
    assert a.trace[0][0] == 1e-3
    assert {Cluster(factors=[1, 2]): "x"}[Cluster(factors=[1, 2])] == "x"
    assert Cluster(factors={0: 2.0}) == Cluster(factors={0: 2.0}) != Cluster(factors={1: 2.0})
    far = Cluster(factors={10**15: 2.0})          # checked without a vector that long
    with pytest.raises(ValueError, match=r"factors: worker 1000000000000000 is not an int in"):
        far.worker_factors(4)
    assert Cluster() == Cluster() != Cluster(step_s=2e-3)


@pytest.mark.parametrize("delay", [("exponential", 2e-3), ("pareto", 2e-3, 3.0)])
def test_delays_have_the_stated_mean(delay):
    """A per-step delay (the eager trainer's ``delay=``, which the simulator models
    with the same draw) has the stated mean: the sample mean of 200,000 draws is
    within 5 standard errors of it (a Pareto of shape 3 has a finite variance)."""
    from sgd_shm.core.imbalance import delay_of, draw_delay
    d = delay_of(delay)
    rng = np.random.default_rng(3)
    x = np.array([draw_delay(d, rng) for _ in range(200_000)])
    assert (x >= 0).all()
    assert abs(x.mean() - delay[1]) < 5 * x.std() / math.sqrt(x.size)
    if delay[0] == "pareto":                 # Pareto's floor: mean * (shape - 1) / shape
        assert x.min() >= delay[1] * 2 / 3


def test_the_simulator_runs_on_the_shared_core_alone():
    """Simulating imports none of the trainers: the policies, statuses, minibatch cut,
    straggler model, traces and the drop rule it shares with them live in
    sgd_shm.core."""
    code = ("import sys\n"
            "from sgd_shm.data import make_rcv1_like\n"
            "from sgd_shm.sim import Cluster, simulate\n"
            "X, y = make_rcv1_like(400, 50, random_state=0)\n"
            "for kw in ({'policy': 'saps'}, {'policy': 'rps', 'drop': 0.1},\n"
            "           {'collective': 'majority'}):\n"
            "    simulate(X, y, n_workers=3, epochs=1, cluster=Cluster(0.001, transient="
            "(1.0, 2.0, 0.01)), seed=0, **kw)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('sgd_shm.ps', "
            "'sgd_shm.eager', 'sgd_shm.hogwild'))))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


# ---- the command line ---------------------------------------------------------------------

def test_cli_sim_runs_and_writes(tmp_path, capsys):
    from sgd_shm.__main__ import main
    rc = main(["sim", "--workers", "16", "--policies", "bsp,saps", "--collectives", "majority",
               "--imbalance", "1", "0.002", "--samples", "1500", "--holdout", "300",
               "--features", "200", "--epochs", "1", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "16 workers" in out and "saps" in out and "majority" in out
    import json
    got = json.loads((tmp_path / "sim-main.json").read_text())
    assert set(got["runs"]) == {"bsp", "saps", "majority"}
    assert got["runs"]["bsp"]["updates"] > 0 and (tmp_path / "sim-main.png").stat().st_size > 0


@pytest.mark.parametrize("argv, match", [
    (["--policies", "fast"], "--policies"),
    (["--policies", "", "--collectives", ""], "at least one"),
    (["--classes", "0.5:1,0.2:4"], "--classes"),
    (["--target", "2"], "--target"),
])
def test_cli_sim_bad_options(argv, match, capsys):
    from sgd_shm.__main__ import main
    with pytest.raises(SystemExit) as e:
        main(["sim", *argv])
    assert e.value.code == 2 and match in capsys.readouterr().err


def test_cli_sim_help_runs_nothing(capsys, monkeypatch):
    import sgd_shm.sim.__main__ as sim_cli
    from sgd_shm.__main__ import main
    for a in ("run", "check"):
        monkeypatch.setattr(sim_cli, a, lambda *_, _a=a, **__: pytest.fail(f"{_a} ran"))
    with pytest.raises(SystemExit) as e:
        main(["sim", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m sgd_shm sim ")
    for flag in ("--workers", "--policies", "--collectives", "--classes", "--gbps",
                 "--imbalance", "--compress", "--epochs", "--target", "--out", "--verbose"):
        assert flag in out, flag
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert "    sim " in capsys.readouterr().out


def test_compress_seconds_add_to_each_compressed_step(data):
    X, y = data
    step, extra = 1e-3, 4e-4
    base = simulate(X, y, n_workers=1, epochs=1, cluster=Cluster(step, compress_s=extra),
                    compress="topk:0.1")
    assert base.seconds == pytest.approx(base.updates * (step + extra), rel=1e-9)
    dense = simulate(X, y, n_workers=1, epochs=1, cluster=Cluster(step, compress_s=extra))
    assert dense.seconds == pytest.approx(dense.updates * step, rel=1e-9)
    r = simulate(X, y, n_workers=2, collective="sync", epochs=1,
                 cluster=Cluster(step, compress_s=extra), compress="topk:0.1")
    assert r.seconds == pytest.approx(r.rounds * (step + extra), rel=1e-9)


@pytest.mark.parametrize("kind", [dict(policy="asp"), dict(policy="rps"),
                                  dict(collective="sync")])
def test_a_callback_stops_the_run(data, kind):
    X, y = data
    seen = []

    def stop(rec):
        seen.append(rec["step"])
        return len(seen) >= 3

    r = simulate(X, y, n_workers=4, epochs=5, callbacks=stop, seed=0, **kind)
    full = simulate(X, y, n_workers=4, epochs=5, seed=0, **kind)
    assert len(seen) == 3 and r.updates < full.updates
    assert r.history[-2]["step"] == seen[-1]


def test_calibrate_fits_the_real_runs_counts(data):
    """The fitted step: the one-worker step times what the workers' measured stretch
    holds beyond the box's cores' queueing at their demand; the calibration's simulate
    runs that cluster."""
    from sgd_shm.calibrate import calibrate
    X, y = data
    cal = calibrate(X, y, n_workers=2, seconds=0.3, backend="threads",
                    slowdown={0: 2.0})
    per = np.array(cal.measured["step_s_per_worker"])
    s, base = cal.measured["stretch"], cal.measured["step_s_alone"]
    assert cal.kind == "ps" and s == pytest.approx(per[1] / base)
    # the box's cores queue the workers' computing; the rest of the stretch is the step's
    box = os.cpu_count()
    assert cal.cores == box
    queued = max(1.0, (1 / 2 + 1) / box)
    assert cal.measured["contention"] == pytest.approx(s / queued)
    assert cal.step_s == pytest.approx(base * s / queued)
    m = max(s, 1.0)
    assert cal.slow_extra_s == pytest.approx(max(per[0] - 2.0 * base * m, 0.0) / m)
    assert cal.wake_s >= 0.0001                    # half the shm transport's poll at least
    assert 0.0 <= cal.start_s < 0.3 and cal.cluster().start_s == cal.start_s
    # the gated step's charge: the real BSP round's excess over the simulated one
    m_ = cal.measured
    assert cal.gate_s == pytest.approx(max(m_["bsp_round_s"] - m_["bsp_round_s_simulated"], 0))
    sim = cal.simulate(X, y, policy="bsp", slowdown={0: 2.0}, epochs=1)
    assert sim.n_workers == 2 and sim.seconds > 0
    f = cal.cluster({0: 2.0}).worker_factors(2)
    assert f[1] == 1.0 and f[0] == pytest.approx(2.0 + cal.slow_extra_s / cal.step_s)
    with pytest.raises(ValueError, match="slowdown"):
        calibrate(X, y, n_workers=2, collective=True, slowdown="straggler")
    with pytest.raises(ValueError, match="imbalance"):
        calibrate(X, y, n_workers=2, imbalance=(1, 0.001))


def test_calibrate_reads_contention_off_a_full_speed_run_when_every_worker_is_slowed(
        data, monkeypatch):
    """With every worker slowed, the slowed steps hold the sleeps' overrun too, which the
    calibration took for contention. It now reads the contention off a run of as many
    workers at full speed. Oracle: trainer runs of known steps (one worker alone: BASE; n
    workers: their factor times BASE times C, plus OVER for a slowed one)."""
    import sgd_shm.calibrate as calib
    from sgd_shm.core.imbalance import factors_of
    BASE, C, OVER = 1e-4, 1.3, 4e-5
    made = []

    def fake_train(X, y, *, n_workers, slowdown=None, max_seconds, **kw):
        f = factors_of(slowdown, n_workers)
        step = BASE * f * (C if n_workers > 1 else 1.0) + np.where(f > 1, OVER, 0.0)
        rate = float(np.sum(1.0 / step))
        made.append((n_workers, tuple(f)))
        hist = [{"seconds": t, "step": rate * (t - 0.01)} for t in np.arange(0.02, 0.3, 0.02)]
        return SimpleNamespace(history=hist, seconds=max_seconds, updates=hist[-1]["step"],
                               workers=[{"pushes": max_seconds / s} for s in step])
    monkeypatch.setattr(calib, "ps_train", fake_train)
    X, y = data
    box = os.cpu_count()
    for slowdown, runs in (([2.0, 2.0], [(1, (1.0,)), (2, (2.0, 2.0)), (2, (1.0, 1.0))]),
                           ({0: 2.0}, [(1, (1.0,)), (2, (2.0, 1.0))])):
        made.clear()
        cal = calib.calibrate(X, y, n_workers=2, seconds=0.3, slowdown=slowdown)
        assert made[:len(runs)] == runs                 # (then the BSP runs of gate_s)
        contention = C / max(1.0, 2 / box)
        assert cal.measured["contention"] == pytest.approx(contention)
        assert cal.step_s == pytest.approx(BASE * contention)
        stretch = cal.measured["stretch"]
        assert stretch == pytest.approx(contention * max(1.0, sum(1 / np.array(
            factors_of(slowdown, 2))) / box))
        assert cal.slow_extra_s == pytest.approx(
            (2.0 * BASE * C + OVER - 2.0 * BASE * max(stretch, 1.0)) / max(stretch, 1.0))
    made.clear()
    one = calib.calibrate(X, y, n_workers=1, seconds=0.3, slowdown="straggler")
    assert one.measured["contention"] == 1.0 and made[:2] == [(1, (1.0,)), (1, (4.0,))]


def test_calibration_arguments_and_scaling(data):
    """Bad arguments are refused before any run; a calibration is checked when made by
    hand; its cluster and simulate scale to other worker counts (the factors were drawn
    for the calibration's count); the simulator refuses more sleeping ranks than the run
    has, as eager.train does."""
    from sgd_shm.calibrate import Calibration, calibrate
    X, y = data
    for kw, err, match in ((dict(seed="a"), TypeError, "seed: must be an int >= 0 or None"),
                           (dict(seed=-1), ValueError, "seed"),
                           (dict(collective="majority"), TypeError, "collective: expected True"),
                           (dict(collective=True, imbalance=(1, -1.0)), ValueError,
                            "imbalance: must be a finite number >= 0"),
                           (dict(collective=True, imbalance=5), ValueError,
                            r"imbalance: expected \(k ranks, seconds\)"),
                           (dict(collective=True, imbalance=(3, 0.01)), ValueError,
                            r"imbalance: k must be an int in \[0, n_workers=2\]")):
        with pytest.raises(err, match=match):
            calibrate(X, y, n_workers=2, seconds=0.3, **kw)
    for args, match in ((("ps", 2, 0.0), "step_s: must be a finite number > 0"),
                        (("cluster", 2, 1e-4), "kind: must be 'ps' or 'collective'"),
                        (("ps", 0, 1e-4), "n_workers")):
        with pytest.raises(ValueError, match=match):
            Calibration(*args)
    with pytest.raises(ValueError, match="slow_extra_s"):
        Calibration("ps", 2, 1e-4, slow_extra_s=-1.0)
    cal = Calibration("ps", 2, 1e-4, slow_extra_s=1e-4, cores=2.0)
    assert cal.cluster("straggler", n_workers=8).worker_factors(8).tolist() == [5.0] + [1.0] * 7
    sim = cal.simulate(X, y, n_workers=8, epochs=1)
    assert sim.n_workers == 8 and sim.updates > 0
    for bad in (5, (1,), (1, "x")):
        with pytest.raises(ValueError, match="imbalance"):
            cal.cluster(imbalance=bad)
    with pytest.raises(ValueError, match=r"imbalance: k must be an int in \[0, n_workers=2\]"):
        simulate(X, y, n_workers=2, collective="sync", epochs=1,
                 cluster=Cluster(1e-3, imbalance=(5, 0.01)))


def test_calibrate_collectives_fits_the_sync_rounds(data):
    """The collectives' calibration: the round and the start-up are read off the sync
    runs' records (medians over the repeats), the imbalance's overrun the imbalanced
    runs' round beyond the round and the nominal sleep; the fitted cluster carries them
    to simulate."""
    from sgd_shm.calibrate import calibrate
    X, y = data
    imb = (1, 0.002)
    cal = calibrate(X, y, n_workers=2, collective=True, seconds=0.3, imbalance=imb,
                    repeats=2)
    m = cal.measured
    assert cal.kind == "collective" and cal.step_s == m["round_s"] > 0 and m["repeats"] == 2
    assert cal.sleep_extra_s == pytest.approx(max(m["round_s_imbalanced"] - m["round_s"]
                                                  - imb[1], 0.0))
    assert m["round_s_imbalanced"] > m["round_s"]          # the sleeps cost the rounds
    c = cal.cluster(imbalance=imb)
    assert c.start_s == cal.start_s >= 0 and c.imbalance == (1, imb[1] + cal.sleep_extra_s)
    sim = cal.simulate(X, y, collective="solo", imbalance=imb, epochs=1)
    assert sim.seconds > cal.start_s and sim.updates > 0
    with pytest.raises(ValueError, match="repeats"):
        calibrate(X, y, n_workers=2, collective=True, repeats=0)


def test_wake_seconds_delay_a_gated_worker(data):
    """BSP on two workers of (almost) equal steps: each round, the first to push waits
    and notices the open gate wake_s later, which makes it the last of the next
    round: every round after the first costs a step plus wake_s."""
    X, y = data
    step, wake = 1e-3, 3e-4
    cl = dict(factors=[1.0, 1.0 + 1e-6])
    a = simulate(X, y, n_workers=2, policy="bsp", epochs=1, cluster=Cluster(step, **cl))
    b = simulate(X, y, n_workers=2, policy="bsp", epochs=1,
                 cluster=Cluster(step, wake_s=wake, **cl))
    rounds = a.updates // 2
    assert a.seconds == pytest.approx(rounds * step, rel=1e-5)
    assert b.seconds == pytest.approx(rounds * step + (rounds - 1) * wake, rel=1e-5)


def test_gate_seconds_charge_every_gated_step(data):
    """gate_s is charged to every step a gated policy begins (BSP: each round is one
    step of its slowest worker longer by gate_s); ASP's steps are not charged."""
    X, y = data
    step, gate = 1e-3, 4e-4
    cl = dict(factors=[1.0, 2.0])
    runs = {(pol, g): simulate(X, y, n_workers=2, policy=pol, epochs=1,
                               cluster=Cluster(step, gate_s=g, **cl))
            for pol in ("bsp", "asp") for g in (0.0, gate)}
    rounds = runs[("bsp", 0.0)].updates // 2
    assert runs[("bsp", 0.0)].seconds == pytest.approx(rounds * 2 * step, rel=1e-5)
    assert runs[("bsp", gate)].seconds == pytest.approx(rounds * (2 * step + gate), rel=1e-5)
    assert runs[("asp", gate)].seconds == runs[("asp", 0.0)].seconds
    with pytest.raises(ValueError, match="gate_s"):
        Cluster(step, gate_s=-1.0)


def test_start_seconds_shift_every_run(data):
    """start_s holds every worker back from the run's zero: a run with it ends start_s
    later than the same run without it, with the same updates and the same weights, on
    the parameter server (event-driven and RPS rounds) and in eager-SGD's rounds."""
    X, y = data
    start = 0.05
    for kind in ({"policy": "asp"}, {"policy": "bsp"}, {"policy": "rps"},
                 {"collective": "solo"}):
        a = simulate(X, y, n_workers=3, epochs=1, seed=0, cluster=Cluster(1e-3), **kind)
        b = simulate(X, y, n_workers=3, epochs=1, seed=0,
                     cluster=Cluster(1e-3, start_s=start), **kind)
        assert b.seconds == pytest.approx(a.seconds + start, rel=1e-9), kind
        assert b.updates == a.updates and np.array_equal(b.coef_, a.coef_), kind
        assert all(h["step"] == 0 for h in b.history if h["seconds"] < start), kind
    with pytest.raises(ValueError, match="start_s"):
        Cluster(1e-3, start_s=-1.0)


def test_calibrations_combine_by_medians():
    """Calibration.median: each fitted quantity's median over the calibrations; cores
    only where most found shared cores; one kind and worker count only."""
    from sgd_shm.calibrate import Calibration
    cals = [Calibration("ps", 4, step_s=s, slow_extra_s=e, wake_s=1e-4, gate_s=g,
                        start_s=st, cores=c, measured={"i": i})
            for i, (s, e, g, st, c) in enumerate([(1e-4, 2e-4, 0.0, 0.01, 1.5),
                                                  (3e-4, 1e-4, 5e-4, 0.03, None),
                                                  (2e-4, 9e-4, 1e-4, 0.02, 2.5)])]
    m = Calibration.median(cals)
    assert (m.kind, m.n_workers) == ("ps", 4)
    assert (m.step_s, m.slow_extra_s, m.gate_s, m.start_s, m.wake_s) == pytest.approx(
        (2e-4, 2e-4, 1e-4, 0.02, 1e-4))
    assert m.cores == 2.0 and [c["i"] for c in m.measured["combined"]] == [0, 1, 2]
    assert Calibration.median(cals[1:2] + cals[1:2] + cals[:1]).cores is None
    with pytest.raises(ValueError, match="one kind and worker count"):
        Calibration.median(cals + [Calibration("collective", 4, 1e-4)])
    with pytest.raises(TypeError, match="cals"):
        Calibration.median([])


def test_sim_still_resolves_the_moved_calibration_with_a_warning():
    """sgd_shm.sim.calibrate and .Calibration are the objects of sgd_shm.calibrate,
    reached lazily with a DeprecationWarning (for one release); neither is in
    sgd_shm.sim's ``__all__``, so a star import does not reach the trainers."""
    import sgd_shm.calibrate
    import sgd_shm.sim
    for name in ("calibrate", "Calibration"):
        with pytest.warns(DeprecationWarning, match="moved to sgd_shm.calibrate"):
            moved = getattr(sgd_shm.sim, name)
        assert moved is getattr(sgd_shm.calibrate, name)
        assert name not in sgd_shm.sim.__all__
    with pytest.warns(DeprecationWarning, match="moved to sgd_shm.calibrate"):
        from sgd_shm.sim import calibrate
    assert calibrate is sgd_shm.calibrate.calibrate
    with pytest.raises(AttributeError, match="no_such_name"):
        sgd_shm.sim.no_such_name


def test_line_fit_reads_start_and_step_off_a_history():
    """The calibration's line: on exact records the start-up and the step come back;
    a stall in one record moves neither (Theil-Sen); too few records is an error."""
    from sgd_shm.calibrate import line_fit
    hist = [{"step": 0, "seconds": 0.0}] + [{"step": 50 * i, "seconds": 0.04 + 2e-4 * 50 * i}
                                            for i in range(1, 30)]
    assert line_fit(hist) == pytest.approx((0.04, 2e-4))
    hist[10]["seconds"] += 0.02                      # one stalled stretch
    assert line_fit(hist) == pytest.approx((0.04, 2e-4), rel=1e-6)
    with pytest.raises(ValueError, match="seconds"):
        line_fit(hist[:3])


def test_bench_sim_quick_parts(tmp_path):
    """``python -m bench sim --quick`` on two parts writes its JSON, findings and plots;
    a later run of one part keeps the other's results."""
    import json
    import subprocess
    import sys
    root = __import__("pathlib").Path(__file__).resolve().parent.parent
    run = lambda parts: subprocess.run(
        [sys.executable, "-m", "bench", "sim", "--quick", "--sim-parts", parts, "--out",
         str(tmp_path)], cwd=root, capture_output=True, text=True, timeout=600)
    r = run("eager,rps")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads((tmp_path / "sim.json").read_text())
    assert {row["part"] for row in d["results"]} == {"eager", "rps"}
    assert any(f.startswith("eager, 16 ranks, majority") for f in d["findings"])
    assert (tmp_path / "sim_eager.png").exists() and (tmp_path / "sim_rps.png").exists()
    assert run("rps").returncode == 0
    d = json.loads((tmp_path / "sim.json").read_text())
    assert {row["part"] for row in d["results"]} == {"eager", "rps"} and "eager_curves" in d
    bad = run("nope")
    assert bad.returncode != 0 and "--sim-parts" in bad.stderr


def test_shared_cores_stretch_concurrent_steps(data):
    """Four equal workers on 2 cores served first come, first served: under ASP every
    step waits for a core as long as it computes, so each takes twice its time; a BSP
    round is two waves of two steps; one worker alone is not stretched."""
    X, y = data
    step = 1e-3
    r = simulate(X, y, n_workers=4, epochs=1, cluster=Cluster(step, cores=2))
    free = simulate(X, y, n_workers=4, epochs=1, cluster=Cluster(step))
    assert r.updates == free.updates
    assert r.seconds == pytest.approx(2 * free.seconds, rel=1e-9)
    bsp = simulate(X, y, n_workers=4, policy="bsp", epochs=1, cluster=Cluster(step, cores=2))
    assert bsp.seconds == pytest.approx(bsp.updates // 4 * 2 * step, rel=1e-9)
    one = simulate(X, y, n_workers=1, epochs=1, cluster=Cluster(step, cores=2))
    assert one.seconds == pytest.approx(one.updates * step, rel=1e-9)
    with pytest.raises(ValueError, match="cores"):
        Cluster(cores=0)


# ---- traces of real runs ---------------------------------------------------------------------

def test_replay_follows_a_trace(data):
    """A hand-made trace of two workers: every step begins, pulls, decides, ends its
    push and begins again at the trace's times, and each push reads the version those
    times give (worker 0: steps of 3 ms, worker 1: of 2 ms, pushes 1 ms after pulls)."""
    from sgd_shm.sim.trace import Trace
    X, y = data
    n = 6
    tr = Trace(lead=[np.zeros(n), np.zeros(n)], pre=[np.full(n, 1e-3), np.full(n, 1e-3)],
               lag=[np.zeros(n), np.zeros(n)], post=[np.full(n, 2e-3), np.full(n, 1e-3)],
               first=[0.0, 0.5e-3], samples=[5e-3, 10e-3], pushes=[])
    r = simulate(X, y, n_workers=2, policy="asp", replay=tr, max_seconds=1.0, epochs=None)
    want = sorted([(1e-3 + 3e-3 * i, 0) for i in range(n)] +
                  [(1.5e-3 + 2e-3 * i, 1) for i in range(n)])
    got = list(zip(r.log["seconds"], r.log["worker"]))
    assert [k for _, k in got] == [k for _, k in want]
    np.testing.assert_allclose([t for t, _ in got], [t for t, _ in want], rtol=0, atol=1e-12)
    for q, (t, k) in enumerate(got):            # pulled at its step's start: pushes before it
        start = t - 1e-3
        assert r.log["pulled"][q] == sum(1 for u, _ in want if u <= start + 1e-12)
    assert [h["seconds"] for h in r.history[1:3]] == [5e-3, 10e-3]


def test_recorder_traces_a_real_threads_run(data):
    """A real run of the in-process transport under a Recorder: every step's start,
    pull and push decision are recorded (a decision not dropped is an applied push,
    the last ones possibly in flight at the stop), and the trace replays, sampling at
    the real run's times."""
    from sgd_shm.models import Linear
    from sgd_shm.ps import train
    from sgd_shm.sim.trace import Recorder
    X, y = data
    rec = Recorder("saps", window=0.05)
    real = train(X, y, n_workers=3, policy=rec, model=rec.model(Linear(X.shape[1])),
                 backend="threads", max_seconds=0.3, seed=0, progress=False)
    tr = rec.trace(real)
    assert tr.n_workers == 3 and real.policy == "saps"
    applied = sum(1 for _, _, d in tr.pushes if not d)
    assert abs(applied - real.updates) <= 3              # a last push may be in flight
    for w in range(3):
        assert len(tr.lead[w]) == len(tr.pre[w]) == len(tr.lag[w]) > 0
        assert (tr.pre[w] >= 0).all() and (tr.lag[w] >= 0).all()
    sim = simulate(X, y, n_workers=3, policy="saps", replay=tr, max_seconds=real.seconds,
                   window=0.05, seed=0)
    assert sim.updates > 0 and set(t for t, _ in sim.detections) <= set(tr.samples)
    with pytest.raises(TypeError, match="threads"):
        import pickle
        pickle.dumps(rec)
    with pytest.raises(ValueError, match="replay"):
        simulate(X, y, n_workers=2, policy="asp", replay=tr)
