"""sgd_shm.ps.ray_session: Ray as an optional extra, connect()'s rules (the running
instance used, another address refused, an unreachable one failing within its timeout),
RaySession's pool, CPU check and shutdown; and bench.ray_calls' actor-call rates.
The tests on a running instance share conftest's (run alone under xdist)."""
import math
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from sgd_shm.ps.ray_session import RaySession, connect, require_ray

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)        # import ray now fails
    with pytest.raises(ImportError, match=r"pip install 'relaxed-sgd-kit\[ray\]'") as e:
        require_ray()
    assert isinstance(e.value.__cause__, ImportError)


@pytest.fixture
def ray_down(monkeypatch):
    """Ray importable and not initialised in this process (another test's instance
    shut down, as conftest's fixture does), RAY_ADDRESS unset."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return ray


def test_unreachable_address_fails_within_timeout(ray_down):
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=r"'127\.0\.0\.1:1'.*within 2 s"):
        connect("127.0.0.1:1", timeout=2)
    assert time.monotonic() - t0 < 15                   # a fault bound, not a speed check
    assert not ray_down.is_initialized()


@pytest.mark.parametrize("address", ["nonsense", "host:", "host:0", "host:99999", ":6379",
                                     "http://host:1"])
def test_malformed_address(ray_down, address):
    with pytest.raises(ValueError, match="address: must be"):
        connect(address)
    with pytest.raises(TypeError, match="address: must be"):
        connect(6379)


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan"), "30", True])
def test_bad_timeout(ray_down, timeout):
    with pytest.raises(ValueError, match="timeout: must be"):
        connect("127.0.0.1:1", timeout=timeout)


@pytest.mark.parametrize("cpus", [-1, float("nan"), "1", None])
def test_bad_worker_cpus(ray_down, cpus):
    with pytest.raises(ValueError, match="worker_cpus"):
        RaySession(worker_cpus=cpus)


# -- on conftest's running instance --------------------------------------------------------
def test_running_instance_is_used(local_ray):
    assert connect() is False
    gcs = local_ray.get_runtime_context().gcs_address
    assert connect(gcs) is False and connect("auto") is False
    port = gcs.rpartition(":")[2]
    assert connect(f"127.0.0.1:{port}") is False        # this machine, by loopback
    with pytest.raises(ValueError, match=r"'10\.255\.255\.1:6379'.*ray\.shutdown\(\)"):
        connect("10.255.255.1:6379")
    assert connect(num_cpus=4) is False
    with pytest.raises(ValueError, match="num_cpus: Ray already runs .* 4 CPUs, not 3"):
        connect(num_cpus=3)
    assert local_ray.is_initialized()


def test_session_on_running_instance(local_ray):
    s = RaySession()
    assert s.started is False and s.worker_cpus == 1.0 and not s.closed
    assert s.cluster_cpus() == 4
    with pytest.raises(ValueError, match=r"8 workers.*need 8 CPUs.*has 4") as e:
        s.check_fits(8, 1.0)
    assert "RaySession(worker_cpus=0.5)" in str(e.value) and "num_cpus" in str(e.value)
    s.check_fits(8, 0.5)
    s.check_fits(4)
    s.close()
    s.close()                                            # idempotent
    assert s.closed and local_ray.is_initialized()


def test_pool_keeps_and_kills_actors(local_ray):
    @local_ray.remote(num_cpus=0)
    class Idle:
        def ping(self):
            return "pong"

    with RaySession(worker_cpus=0.5) as s:
        a, b = Idle.remote(), Idle.remote()
        s.keep(("worker", 0), a)
        s.keep(("worker", 1), b)
        assert s.take(("worker", 2)) is None
        assert s.take(("worker", 0)) is a and s.take(("worker", 0)) is None
        s.keep(("worker", 0), a)
        assert local_ray.get([a.ping.remote(), b.ping.remote()]) == ["pong", "pong"]
    assert s.closed and local_ray.is_initialized()
    assert _dies(local_ray, a) and _dies(local_ray, b)
    c = Idle.remote()
    with pytest.raises(RuntimeError, match="closed"):
        s.keep("late", c)
    assert _dies(local_ray, c)
    from sgd_shm.ps import train                  # a run on a closed session says so
    with pytest.raises(ValueError, match="session: this RaySession is closed"):
        train(np.zeros((4, 2)), np.array([0, 1, 0, 1]), n_workers=1, backend="ray", session=s)


def _dies(ray, actor, within=30.0):
    """True once calls to ``actor`` fail as a dead actor's (``ray.kill`` is
    asynchronous: a call sent just after it may still be answered)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.05)
    return False


def test_leaked_actor_is_caught_and_not_inherited(local_ray):
    """conftest's after-test check: an actor still alive fails it, naming the class,
    and the instance is shut down with it (the next test starts a fresh one)."""
    from conftest import assert_no_actor_left, live_actors

    @local_ray.remote(num_cpus=1)
    class Leaked:
        def ping(self):
            return "pong"

    a = Leaked.remote()
    assert local_ray.get(a.ping.remote()) == "pong"
    assert [state for name, state in live_actors(local_ray) if name.endswith(".Leaked")] \
        == ["ALIVE"]
    with pytest.raises(AssertionError, match="actors outlived the test: .*Leaked"):
        assert_no_actor_left(local_ray, within=0.5)
    assert not local_ray.is_initialized()


def test_actor_call_rate(local_ray):
    from bench.ray_calls import actor_call_rate
    r = actor_call_rate(seconds=0.6)
    for key in ("sync_calls_per_s", "pipelined_calls_per_s"):
        assert math.isfinite(r[key]) and r[key] > 0
    assert r["pipelined_calls_per_s"] >= 0 and len(r["reps"]["sync"]) == 3


# -- a session that starts Ray ----------------------------------------------------------
@pytest.mark.exclusive
def test_session_that_started_ray_shuts_it_down():
    """In a fresh process (no Ray there): the session starts Ray, logs it at INFO and
    prints nothing on stdout, runs its actors at the kit's niceness (not Ray's 15), and
    shuts Ray down when the block ends."""
    pytest.importorskip("ray")
    code = textwrap.dedent("""
        import logging, os, ray
        logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(message)s")
        from sgd_shm.ps.ray_session import WORKER_NICENESS, RaySession
        assert not ray.is_initialized()
        with RaySession(num_cpus=1) as s:
            assert s.started and ray.is_initialized()
            nice = ray.get(ray.remote(num_cpus=0)(lambda: os.nice(0)).remote())
            assert nice == WORKER_NICENESS == 0, nice
        assert s.closed and not ray.is_initialized()
    """)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    p = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout == ""
    assert "LOG sgd_shm.ps.ray_session started a local Ray instance with 1 CPUs" in p.stderr


def test_niced_actors_warn():
    """Actors above the kit's niceness (Ray's default 15 on a cluster started by hand)
    get a RuntimeWarning naming the setting that fixes it; actors at 0 get none."""
    import warnings
    from sgd_shm.ps.ray_session import warn_if_niced
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_niced([0, 0]) is False and warn_if_niced([]) is False
    with pytest.warns(RuntimeWarning, match=r"nice 15 .*RAY_worker_niceness=0 ray start"):
        assert warn_if_niced([0, 15]) is True
