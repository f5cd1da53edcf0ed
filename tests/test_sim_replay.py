"""Traces of real runs replayed in the simulator (sgd_shm.sim.replay): a real 4-worker
parameter-server run (ASP, and SaPS with a straggler, worker processes on shared
memory) and a real 4-rank eager-SGD run (solo, majority), traced and replayed: the
simulator makes the run's decisions (the versions each push read and was applied at,
in order; each push's scale or drop; the counters each sample read and SaPS's flags;
each round's contributors, the skipped gradients and the late arrivals). The trace
itself is checked against the store's counters and SaPS's rule (tests/naive.py);
replays under other settings must decide otherwise. Nothing here depends on how the
real runs were timed: whatever order they ran in, the trace records it."""
import numpy as np
import pytest

from sgd_shm.data import make_rcv1_like
from sgd_shm.eager import train as eager_train
from sgd_shm.ps import train as ps_train
from sgd_shm.sim import simulate
from sgd_shm.sim.replay import least_times
from tests.naive import saps_flags_naive, trace_counters_naive

N = 4
WINDOW = 0.1


@pytest.fixture(scope="module")
def data():
    return make_rcv1_like(2000, 150, density=0.05, random_state=0)


def _ps_run(data, policy, backend="shm", **kw):
    X, y = data
    if policy == "saps":
        kw.setdefault("window", WINDOW)
    return ps_train(X, y, n_workers=N, policy=policy, backend=backend, slowdown={0: 6},
                    max_seconds=0.6, progress=False, trace=True, seed=3, **kw)


def _replay(data, policy, trace, **kw):
    X, y = data
    if policy == "saps":
        kw.setdefault("window", WINDOW)
    return simulate(X, y, n_workers=N, policy=policy, replay=trace, seed=3, **kw)


def _same_columns(trace, sim, cols):
    for k in range(N):
        for c in cols:
            real, got = trace.steps[k][c], sim.replay["steps"][k][c]
            bad = np.flatnonzero(real != got)
            assert bad.size == 0, (f"worker {k}, {c}: rows {bad[:5].tolist()} real "
                                   f"{real[bad[:5]].tolist()} replayed {got[bad[:5]].tolist()}")


@pytest.mark.parametrize("policy", ["asp", "saps"])
def test_ps_trace_replayed_exactly(data, policy):
    real = _ps_run(data, policy)
    tr = real.trace
    assert not tr.truncated and tr.n_workers == N
    # the trace against the store's own counters (tests/naive.py)
    for w, (pushes, dropped, stale) in zip(real.workers, trace_counters_naive(tr.steps)):
        assert (w["pushes"], w["dropped"], w["staleness_sum"]) == (pushes, dropped, stale)
    order = tr.pushes()
    assert [p[0] for p in order] == list(range(1, real.updates + 1))   # every version once
    for st in tr.steps:                                  # each bracket in its worker's order
        t = np.stack([st["pull0"], st["pull1"], st["push0"], st["push1"]], axis=1)
        assert (np.diff(t, axis=1) >= 0).all() and (t[1:, 0] >= t[:-1, 3]).all()

    sim = _replay(data, policy, tr)
    cols = ["pulled", "dropped", "read", "applied"]
    if policy == "saps":
        cols += ["decided", "flagged"]
    _same_columns(tr, sim, cols)
    applied = [(a, k, p, j, v) for a, k, p, j, v, _ in order]
    log = sim.log
    assert [(a + 1, k, p, j, v) for a, k, p, j, v in zip(
        log["version"], log["worker"], log["partition"], log["batch"], log["pulled"])] == applied
    assert [s for *_, s in order] == log["scale"]
    assert sim.replay["beyond_s"] == 0.0                 # every event inside its bracket
    assert [w["pushes"] for w in sim.workers] == [w["pushes"] for w in real.workers]
    if policy == "saps":
        assert len(sim.replay["reads"]) == len(tr.reads) == len(tr.samples)
        for (_, _, sums, tried), (s2, t2) in zip(tr.reads, sim.replay["reads"]):
            assert sums.tolist() == s2.tolist() and tried.tolist() == t2.tolist()
        assert sim.events == real.events and sim.detections == real.detections
        assert saps_flags_naive(tr.samples, [(s, t) for _, _, s, t in tr.reads], N, WINDOW,
                                2.0) == real.events


def test_saps_replay_decides_under_other_settings(data):
    """The replay decides with its own policy: another staleness bound scales other
    pushes; a window longer than the run flags nobody."""
    real = _ps_run(data, "saps")
    tr = real.trace
    stale = any(((st["decided"] - st["pulled"]) > 0).any() for st in tr.steps)
    if stale:                                            # bound 0: a stale push is scaled 0
        other = _replay(data, "saps", tr, staleness=0)
        assert any((o["scale"] != st["scale"]).any() or (o["dropped"] != st["dropped"]).any()
                   for o, st in zip(other.replay["steps"], tr.steps))
    blind = _replay(data, "saps", tr, window=1e9)
    assert blind.events == []
    if real.events:
        assert blind.events != real.events


def test_threads_trace_replayed_exactly(data):
    real = _ps_run(data, "saps", backend="threads")
    sim = _replay(data, "saps", real.trace)
    _same_columns(real.trace, sim, ["pulled", "decided", "flagged", "dropped", "read",
                                    "applied"])
    assert sim.events == real.events


@pytest.mark.parametrize("collective", ["solo", "majority", "sync"])
def test_eager_trace_replayed_exactly(data, collective):
    X, y = data
    real = eager_train(X, y, n_workers=N, collective=collective, imbalance=(1, 0.003),
                       max_seconds=0.5, progress=False, trace=True, seed=5)
    tr = real.trace
    got = tr.contributors()
    assert len(got) == real.rounds
    for ranks in got.values():                           # the rule, as the ranks saw it
        assert len(ranks) >= 1 and (collective != "solo" or len(ranks) == 1)
    for k, st in enumerate(tr.ranks):                    # each rank saw the same mask
        for r, m, c in zip(st["round"], st["mask"], st["contributed"]):
            assert tuple(j for j in range(N) if m >> j & 1) == got[int(r)]
            assert bool(c) == (k in got[int(r)])
    sim = simulate(X, y, n_workers=N, collective=collective, replay=tr, seed=5)
    replayed = dict(zip(sim.log["round"], sim.log["contributors"]))
    assert replayed == got
    skips = sorted((k, int(r)) for k, st in enumerate(tr.ranks)
                   for r, s in zip(st["round"], st["skipped"]) if s)
    assert sorted(sim.log["skips"]) == skips
    assert sim.skipped == real.skipped and sim.late == real.late
    assert sim.replay["beyond_s"] == 0.0
    # the trace's round ids start at 1: the count, the steps and the shares are the run's
    # (one round more, and a sync run's participation below 1, before)
    assert sim.rounds == len(sim.log["round"]) == real.rounds
    assert sim.history[-1]["step"] == real.history[-1]["step"] == real.rounds
    np.testing.assert_allclose(sim.participation, real.participation, rtol=1e-12)
    if collective == "sync":
        assert sim.participation == [1.0] * N


def test_trace_off_by_default_and_bad_input(data):
    X, y = data
    r = ps_train(X, y, n_workers=2, policy="asp", backend="threads", max_seconds=0.05,
                 progress=False)
    assert r.trace is None
    for kw, msg in (({"backend": "ray"}, "Ray"), ({"policy": "rps"}, "rounds"),
                    ({"clock": "multicounter"}, "exact"), ({"trace": -1}, "int > 0")):
        args = {"backend": "threads", "policy": "asp", "trace": True, **kw}
        with pytest.raises(ValueError, match=msg):
            ps_train(X, y, n_workers=2, max_seconds=0.05, progress=False, **args)
    with pytest.raises(TypeError, match="trace"):
        eager_train(X, y, n_workers=2, max_seconds=0.05, progress=False, trace="yes")
    real = ps_train(X, y, n_workers=2, policy="asp", backend="threads", max_seconds=0.1,
                    progress=False, trace=True)
    with pytest.raises(ValueError, match="n_workers"):
        simulate(X, y, n_workers=3, policy="asp", replay=real.trace)
    with pytest.raises(ValueError, match="compress"):
        simulate(X, y, n_workers=2, policy="asp", replay=real.trace, compress="topk:0.1")
    ev = eager_train(X, y, n_workers=2, collective="solo", max_seconds=0.1, progress=False,
                     trace=True, seed=1)
    with pytest.raises(ValueError, match="seed"):
        simulate(X, y, n_workers=2, collective="solo", replay=ev.trace, seed=2)


def test_least_times():
    x = least_times([0.0, 5.0, 1.0], [(1, 2), (0, 1)], eps=1.0)
    assert x.tolist() == [0.0, 5.0, 6.0]
    with pytest.raises(ValueError, match="cycle"):
        least_times([0.0, 0.0], [(0, 1), (1, 0)])
