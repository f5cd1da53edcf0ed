"""Step-size schedules (sgd_shm.core.schedules): their values against torch's own
schedulers, and every place a step is taken against closed forms and naive oracles:
each push of a real parameter-server run (shared memory, threads, Ray's server actors
under message loss) is stepped by the schedule at the version its worker pulled, an
RPS round and an eager-SGD round by the schedule at the round, and the simulator does
the same."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from sgd_shm import eager, ps
from sgd_shm.core.schedules import Constant, Cosine, StepDecay, make_schedule
from sgd_shm.core.status import Losses
from sgd_shm.data import make_rcv1_like
from sgd_shm.sim import Cluster, simulate
from tests.naive import (data_parallel_sgd_naive, eager_round_batches, fixed_gradient_model,
                         model_averaging_of_log, rounds_of_log)

ALPHA = 1e-4
#: steps that are powers of two: every closed form below is exact in float64
STEPS = StepDecay(2.0 ** -10, milestones=[7, 20, 45], gamma=0.5)


@pytest.fixture(scope="module")
def data():
    return make_rcv1_like(1200, 150, density=0.05, random_state=0)


def _g(d):
    return np.where(np.arange(d) % 3 == 0, 1.0, 0.5)


# ---- the schedules ---------------------------------------------------------------------------
def test_schedules_are_torchs_schedulers():
    """StepDecay is MultiStepLR and Cosine is CosineAnnealingLR, stepped once an update
    (Cosine holds its floor after ``total``)."""
    torch = pytest.importorskip("torch")
    for ours, make in [
            (StepDecay(0.3, [5, 12, 30], gamma=0.2),
             lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [5, 12, 30], gamma=0.2)),
            (Cosine(0.3, total=40, floor=0.01),
             lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=40, eta_min=0.01))]:
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.3)
        sched = make(opt)
        for t in range(41):
            assert ours(t) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12, abs=1e-15), t
            opt.step()
            sched.step()
    c = Cosine(0.3, total=40)
    assert c(40) == c(10**6) == pytest.approx(0.003) and c(0) == 0.3


def test_make_schedule_and_user_callables():
    assert isinstance(make_schedule(0.5), Constant) and make_schedule(0.5)(10**9) == 0.5
    assert repr(make_schedule(0.5)) == "0.5"                 # messages name the number
    assert make_schedule(STEPS) is STEPS
    s = make_schedule(lambda t: 1.0 / (1 + t))
    assert s.lr == 1.0 and s(3) == 0.25
    bad = make_schedule(lambda t: 1.0 if t < 5 else -1.0)
    with pytest.raises(ValueError, match=r"lr: must be a finite number > 0.*t = 5"):
        bad(5)


def test_check_steps_calls_only_user_callables(monkeypatch):
    from sgd_shm.core import schedules
    seen = []
    f = make_schedule(lambda t: seen.append(t) or 1.0)
    seen.clear()
    schedules.check_steps(f, 3, 9)
    assert seen == list(range(3, 9))
    monkeypatch.setattr(schedules, "CHECKED_STEPS", 100)
    seen.clear()                         # a long budget: evenly spread, both ends
    schedules.check_steps(f, 0, 10_000)
    assert len(seen) == 100 and seen[0] == 0 and seen[-1] == 9_999
    with pytest.raises(ValueError, match=r"t = 9999\)"):
        schedules.check_steps(make_schedule(lambda t: 1.0 if t < 9_999 else 0.0), 0, 10_000)
    schedules.check_steps(STEPS, 0, 10**12)          # valid by construction: not called


@pytest.mark.parametrize("make, err, match", [
    (lambda: StepDecay(0.1, [5, 5]), ValueError, "milestones: must be increasing"),
    (lambda: StepDecay(0.1, [0, 5]), ValueError, "milestones"),
    (lambda: StepDecay(0.1, []), ValueError, "milestones"),
    (lambda: StepDecay(0.1, [2.5]), ValueError, "milestones"),
    (lambda: StepDecay(0.1, [5], gamma=1.5), ValueError, "gamma"),
    (lambda: StepDecay(0.1, [5], gamma=0), ValueError, "gamma"),
    (lambda: StepDecay(0.1, [1, [2]]), ValueError, "milestones: must be increasing"),
    (lambda: StepDecay(0.1, range(1, 500)), ValueError, "gamma: .* underflows to 0"),
    (lambda: Cosine(1e-322), ValueError, "lr: .* too small for the default floor"),
    (lambda: Cosine(0.1, total=0), ValueError, "total: must be None .* or an int >= 1"),
    (lambda: Cosine(0.1, total=10, floor=0.2), ValueError, "floor: must be < lr"),
    (lambda: Cosine(-0.1, total=10), ValueError, "lr: must be a finite number > 0"),
    (lambda: make_schedule("fast"), TypeError, "lr: must be a number"),
    (lambda: make_schedule(lambda t: float("nan")), ValueError, "lr: must be a finite"),
])
def test_bad_schedules(make, err, match):
    with pytest.raises(err, match=match):
        make()


def test_bad_lr_reaches_the_caller(data):
    X, y = data
    with pytest.raises(TypeError, match="lr: must be a number"):
        ps.train(X, y, lr="0.1", epochs=1, progress=False)
    with pytest.raises(ValueError, match="lr: must be a finite number > 0"):
        ps.train(X, y, lr=lambda t: 0.0, epochs=1, progress=False)
    # a budgeted run checks a callable's every step before it starts
    with pytest.raises(ValueError, match=r"lr: must be a finite number > 0.*t = 40"):
        ps.train(X, y, n_workers=2, lr=lambda t: 0.5 if t < 40 else -1.0, epochs=3,
                 progress=False)
    with pytest.raises(TypeError, match="lr: must be a number"):
        simulate(X, y, n_workers=2, collective="sync", lr=[0.1])
    with pytest.raises(ValueError, match="momentum: the parameter server"):
        simulate(X, y, n_workers=2, policy="asp", momentum=0.5)
    with pytest.raises(ValueError, match="momentum: must be < 1"):
        simulate(X, y, n_workers=2, collective="sync", momentum=1.0)
    with pytest.raises(TypeError, match="lr: must be a number"):
        eager.train(X, y, n_workers=2, lr="2", epochs=1, progress=False)
    with pytest.raises(ValueError, match=r"lr: must be a finite number > 0.*t = 3"):
        eager.train(X, y, n_workers=2, lr=lambda r: 1.0 if r < 3 else -1.0, epochs=1,
                    progress=False)


# ---- real runs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["shm", "threads"])
def test_each_push_is_stepped_at_the_version_it_pulled(data, backend, no_shm_leak):
    """Three workers push a fixed gradient g: the weights end at -g times the sum, over
    the applied pushes, of the schedule at the version each push's worker pulled (read
    from the run's trace)."""
    X, y = data
    g = _g(X.shape[1])
    r = ps.train(X, y, n_workers=3, policy="asp", epochs=3, lr=STEPS, backend=backend,
                 model=fixed_gradient_model(g), n_shards=4, seed=2, trace=True,
                 progress=False)
    pushes = r.trace.pushes()
    assert len(pushes) == r.updates == 3 * 3 * 7 and max(v for *_, v, _ in pushes) > 45
    total = sum(STEPS(v) * s for *_, v, s in pushes)
    assert np.array_equal(r.coef_.ravel(), -total * g)


def test_a_resumed_run_goes_on_along_the_schedule(data, tmp_path, no_shm_leak):
    """A checkpoint keeps the version: the resumed run's pushes pulled versions 19 on,
    so one worker's weights end at -g times the schedule summed over t < 19 + 38."""
    X, y = data
    g = _g(X.shape[1])
    common = dict(n_workers=1, policy="asp", lr=STEPS, model=fixed_gradient_model(g),
                  n_shards=4, seed=2, progress=False)
    ck = str(tmp_path / "run.ckpt")
    first = ps.train(X, y, epochs=1, checkpoint=ck, **common)
    r = ps.train(X, y, epochs=2, resume=ck, **common)
    assert first.updates == 19 and r.updates == 19 + 38
    assert np.array_equal(r.coef_.ravel(), -sum(STEPS(t) for t in range(57)) * g)


def _lossy_closed_form(g, steps, p, seed, bounds):
    """One worker under message loss: its t-th step's push reaches shard j iff its
    coins say so (core.status.Losses, the documented stream); a push that reaches some
    shard is counted, so the version it pulled is the pushes sent before it."""
    coins = Losses(p, seed, 0, len(bounds) - 1)
    w, v = np.zeros_like(g), 0
    for _ in range(steps):
        up, _ = coins.draw()
        if not up.any():
            continue
        for j in np.flatnonzero(up):
            w[bounds[j]:bounds[j + 1]] -= STEPS(v) * g[bounds[j]:bounds[j + 1]]
        v += 1
    return w


def _lossy_run(data, backend):
    X, y = data
    g = _g(X.shape[1])
    r = ps.train(X, y, n_workers=1, policy="asp", drop=0.3, epochs=4, lr=STEPS,
                 backend=backend, model=fixed_gradient_model(g), n_shards=3, seed=4,
                 progress=False)
    bounds = np.linspace(0, X.shape[1], 4).astype(np.int64)
    return r, _lossy_closed_form(g, 4 * 19, 0.3, 4, bounds)       # 19 minibatches an epoch


def test_lossy_pushes_follow_the_schedule(data, no_shm_leak):
    r, want = _lossy_run(data, "shm")
    assert np.array_equal(r.coef_.ravel(), want)


def test_lossy_pushes_follow_the_schedule_on_ray(data, local_ray):
    """Under message loss Ray's workers push to the server actors (ray_backend's link),
    which step by the schedule at the version pulled, as the shared-memory store does."""
    r, want = _lossy_run(data, "ray")
    assert r.backend == "ray" and np.array_equal(r.coef_.ravel(), want)


def test_rps_rounds_follow_the_schedule(data, no_shm_leak):
    """RPS: each worker's local step of round t is the schedule at t; the servers'
    model is the naive model averaging with that step (same minibatches, same coins)."""
    X, y = data
    n, S, p = 3, 4, 0.2
    sched = StepDecay(0.5, milestones=[1, 2], gamma=0.5)
    kw = dict(n_workers=n, policy="rps", drop=p, n_shards=S, epochs=3, lr=sched, alpha=ALPHA,
              batch_size=X.shape[0] // n, seed=5)
    r = ps.train(X, y, max_seconds=120, progress=False, **kw)
    sim = simulate(X, y, **kw)
    assert len(sim.log["worker"]) // n == r.updates == 3
    want, _, _ = model_averaging_of_log(X, y, sim, n, S, p, 5, sched, ALPHA)
    np.testing.assert_allclose(sim.coef_, want, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(r.coef_.ravel(), want, rtol=1e-7, atol=1e-10)


# ---- the simulator -------------------------------------------------------------------------
def test_simulated_bsp_is_data_parallel_sgd_on_the_schedule(data):
    """BSP: round t's pushes all pulled version n t, so the run is data-parallel SGD
    whose step t is n times the schedule at n t."""
    X, y = data
    n = 4
    sched = Cosine(0.3, total=40)
    r = simulate(X, y, n_workers=n, policy="bsp", epochs=2, cluster=Cluster(1e-3),
                 batch_size=32, lr=sched, alpha=ALPHA, seed=3)
    rounds = rounds_of_log(r, n)
    assert len(rounds) == 2 * math.ceil(300 / 32) and n * len(rounds) > sched.total
    w = data_parallel_sgd_naive(X, y, rounds, lambda t: n * sched(n * t), ALPHA)
    np.testing.assert_allclose(r.coef_, w, rtol=1e-7, atol=1e-10)


def test_simulated_asp_steps_each_push_at_its_pulled_version(data):
    X, y = data
    g = _g(X.shape[1])
    r = simulate(X, y, n_workers=3, policy="asp", epochs=3, lr=STEPS, n_shards=4,
                 model=fixed_gradient_model(g), cluster=Cluster(1e-3, factors="hetero"),
                 seed=2)
    assert max(r.log["version"]) > 45
    total = sum(STEPS(v) for v in r.log["pulled"])
    assert np.array_equal(r.coef_.ravel(), -total * g)


# ---- eager-SGD: the step of round r ----------------------------------------------------------
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_eager_sync_rounds_follow_the_schedule(data, momentum, no_shm_leak):
    """Synchronous eager-SGD on a schedule, real (two forked ranks) and simulated, is
    data-parallel SGD whose round r steps by the schedule at r (heavy ball: the step
    inside the velocity)."""
    X, y = data
    P, b, epochs = 2, 32, 3
    sched = Cosine(1.0, total=40, floor=0.05)
    kw = dict(n_workers=P, collective="sync", epochs=epochs, batch_size=b, lr=sched,
              alpha=ALPHA, seed=7, momentum=momentum)
    r = eager.train(X, y, max_seconds=120, progress=False, **kw)
    rounds = math.ceil(epochs * X.shape[0] / (P * b))
    assert r.rounds == rounds > sched.total and r.replicas_equal
    want = data_parallel_sgd_naive(X, y, eager_round_batches(X.shape[0], P, b, 7, rounds), sched,
                                   ALPHA, momentum=momentum)
    np.testing.assert_allclose(r.coef_.ravel(), want, rtol=1e-9, atol=1e-12)
    sim = simulate(X, y, **kw)
    np.testing.assert_allclose(sim.coef_, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("collective, momentum", [("solo", 0.0), ("majority", 0.0),
                                                  ("majority", 0.5)])
def test_a_replayed_eager_run_steps_its_rounds_alike(data, collective, momentum,
                                                     no_shm_leak):
    """A traced partial-collective run under a step decay, replayed: the simulator
    decides the same contributors and steps round r by the schedule at r as the ranks
    did (the trace's rounds count from the communicator's first training round), with
    the same heavy ball, so the replica ends bit for bit equal."""
    X, y = data
    sched = StepDecay(2.0, milestones=[5, 20], gamma=0.5)
    real = eager.train(X, y, n_workers=3, collective=collective, imbalance=(1, 0.003),
                       max_seconds=0.3, lr=sched, trace=True, seed=5, momentum=momentum,
                       progress=False)
    assert real.rounds > 20 and real.trace.momentum == momentum
    sim = simulate(X, y, n_workers=3, collective=collective, replay=real.trace, lr=sched,
                   seed=5, momentum=momentum)
    assert np.array_equal(sim.coef_, real.coef_.ravel())
    with pytest.raises(ValueError, match=f"momentum={momentum!r}"):
        simulate(X, y, n_workers=3, collective=collective, replay=real.trace, lr=sched,
                 seed=5, momentum=0.25)


MPI_SCRIPT = """
import sys, numpy as np
from sgd_shm import eager
from sgd_shm.data import make_rcv1_like
X, y = make_rcv1_like(1200, 150, density=0.05, random_state=0)
r = eager.train(X, y, n_workers=None, backend="mpi", collective="sync", epochs=2,
                batch_size=32, lr=eager.Cosine(1.0, total=20, floor=0.05), alpha=1e-4,
                momentum=0.5, seed=7, max_seconds=60, progress=False)
from mpi4py import MPI
if MPI.COMM_WORLD.rank == 0:
    np.save(sys.argv[1], r.coef_)
    print("OK", r.replicas_equal, r.rounds)
"""


def test_eager_rounds_follow_the_schedule_under_mpi(data, tmp_path):
    """The same rule on MPI ranks: two ranks under mpiexec, a cosine step with momentum,
    against the naive data-parallel oracle."""
    pytest.importorskip("mpi4py")
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        pytest.skip("no mpiexec (pip install mpich)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = str(tmp_path / "w.npy")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", MPI_SCRIPT, out],
                       capture_output=True, text=True, timeout=180, env=env, cwd=root)
    rounds = math.ceil(2 * 1200 / (2 * 32))
    assert p.returncode == 0 and f"OK True {rounds}" in p.stdout, (p.stdout + p.stderr)[-3000:]
    X, y = data
    want = data_parallel_sgd_naive(X, y, eager_round_batches(1200, 2, 32, 7, rounds),
                                   Cosine(1.0, total=20, floor=0.05), ALPHA, momentum=0.5)
    np.testing.assert_allclose(np.load(out).ravel(), want, rtol=1e-9, atol=1e-12)



# ---- a cosine over the whole run ---------------------------------------------------------
def test_a_cosine_without_total_falls_over_the_run(data, no_shm_leak):
    """Cosine(lr) with no total takes the run's length from the trainer that knows it
    (epochs=): the parameter server's updates, the eager trainer's rounds, the
    simulator's budget; a run with a time limit only refuses it before it starts."""
    X, y = data
    g = _g(X.shape[1])
    r = ps.train(X, y, n_workers=1, policy="asp", epochs=2, lr=Cosine(0.5), n_shards=4,
                 model=fixed_gradient_model(g), seed=2, progress=False)
    assert r.updates == 38
    want = -sum(Cosine(0.5, total=38)(t) for t in range(38)) * g
    np.testing.assert_allclose(r.coef_.ravel(), want, rtol=1e-12)
    kw = dict(n_workers=2, collective="sync", epochs=2, batch_size=32, alpha=ALPHA, seed=3)
    rounds = math.ceil(2 * X.shape[0] / 64)
    a = eager.train(X, y, lr=Cosine(1.0), progress=False, **kw)
    b = eager.train(X, y, lr=Cosine(1.0, total=rounds), progress=False, **kw)
    assert a.rounds == rounds and np.array_equal(a.coef_, b.coef_)
    sim = simulate(X, y, lr=Cosine(1.0), **kw)
    np.testing.assert_allclose(sim.coef_, b.coef_.ravel(), rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="lr: Cosine.*total=None.*give total= or epochs="):
        ps.train(X, y, n_workers=2, max_seconds=1, lr=Cosine(0.5), progress=False)
    with pytest.raises(ValueError, match="lr: Cosine.*total=None"):
        eager.train(X, y, n_workers=2, max_seconds=1, lr=Cosine(1.0), progress=False)
    with pytest.raises(ValueError, match="lr: Cosine.*total=None"):
        simulate(X, y, n_workers=2, max_seconds=1, lr=Cosine(1.0))
    assert Cosine(0.5).over(10)(10) == Cosine(0.5, total=10)(10) == 0.005
    assert Cosine(0.5, total=7).over(10).total == 7 and STEPS.over(10) is STEPS
