import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

#: multiply iteration counts of the concurrency tests (RELAXED_TEST_SCALE=10 for a soak)
SCALE = float(os.environ.get("RELAXED_TEST_SCALE", "1"))


def scaled(n: int) -> int:
    return max(1, int(n * SCALE))


def shm_names():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("rlx_")}
    except FileNotFoundError:  # pragma: no cover
        return set()


def _creator(name):
    """The creator's pid in a segment name rlx_<creator pid>_<random>, None if unnamed."""
    try:
        return int(name.split("_")[1])
    except (IndexError, ValueError):
        return None


def _ours_or_orphaned(name):
    """A segment counts as leaked by this test if this process created it, or its creator is
    gone (a dead child's segment); a live stranger's segment (another test run on the
    same machine) does not."""
    pid = _creator(name)
    if pid is None or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def new_segments(before, settle=20.0):
    """The relaxed segments in /dev/shm now, not in ``before``, made by this process or
    by one that has exited (see _ours_or_orphaned): those of another test's live
    processes (pytest-xdist runs two at once) are theirs. A dead creator's segment may
    be another test's too, between its SIGKILL of a process and the resource tracker's
    cleanup, so those are waited on for up to ``settle`` seconds to disappear (only when
    there is one: a clean test does not wait)."""
    import time
    deadline = time.monotonic() + settle
    while True:
        found = {n for n in shm_names() - before if _ours_or_orphaned(n)}
        mine = {n for n in found if _creator(n) == os.getpid()}
        if mine or not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)


@pytest.fixture(scope="module")
def one_torch_thread():
    """A module's own torch work (oracles, predictions) on one thread, as the trainers'
    workers run (a spinning pool on a shared 2-core machine crawls)."""
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def no_shm_leak():
    """Fails the test if it leaves a new relaxed segment in /dev/shm."""
    before = shm_names()
    yield
    import gc
    gc.collect()
    leaked = new_segments(before)
    assert not leaked, f"shared-memory segments leaked: {sorted(leaked)}"


# -- one local Ray instance per test process ---------------------------------------------
# Starting and stopping an instance takes seconds, and every Ray test runs alone (see
# ``exclusive`` below): one instance serves all of a process's Ray tests. A test that
# shuts it down (the cluster tests, ``ray_down``) gets it started again by the next.
_RAY = {}                       # the GCS address of the instance this process started


def _ours(ray):
    """Whether Ray is up in this process on the instance conftest started."""
    return ray.is_initialized() and ray.get_runtime_context().gcs_address == _RAY.get("gcs")


def _ray_started():
    """conftest's local Ray instance, started on first use (and again once a test shut
    it down; any other instance this process is connected to is shut down first). It
    declares 4 logical CPUs, so that up to 4 worker actors of one CPU each are placed
    on this 2-core box (they share its cores, as the shm backend's 4 processes do)."""
    ray = pytest.importorskip("ray")
    if _ours(ray):
        return ray
    if ray.is_initialized():
        ray.shutdown()
    from sgd_shm.ps.ray_session import LOCAL_SYSTEM_CONFIG
    # address="local": a new instance even where another test process (pytest-xdist) has
    # a cluster running, which a bare ray.init() would find and join; the actors at the
    # kit's niceness, as an instance the kit starts (at Ray's default 15 a busy process
    # beside the test took the CPU from them for minutes)
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             configure_logging=False, log_to_driver=False, _system_config=LOCAL_SYSTEM_CONFIG)
    _RAY["gcs"] = ray.get_runtime_context().gcs_address
    return ray


def live_actors(ray):
    """The actors of the running instance not yet dead, as (class name, state): from
    the GCS's actor table (``ray._private.state``: the public state API needs the
    dashboard, which conftest's instance does not start)."""
    from ray._private import state
    actors = state.actors().values()
    return sorted((a.get("ActorClassName") or "?", a["State"]) for a in actors
                  if a["State"] != "DEAD")


def assert_no_actor_left(ray, within=30.0):
    """Every actor a test made has died within ``within`` seconds of its end (the kit
    kills a run's actors when it ends; ``ray.kill`` is asynchronous). If one has not,
    the instance is shut down before the test fails, so that the next test neither
    inherits the actor (nor its CPUs) nor is blamed for it."""
    import time
    deadline = time.monotonic() + within
    while (left := live_actors(ray)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        ray.shutdown()
        raise AssertionError(f"actors outlived the test: {left}")


@pytest.fixture(scope="session")
def _ray_for_the_session():
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def local_ray(_ray_for_the_session):
    """conftest's Ray instance for a test (skipped where Ray is not installed), and
    after it the check that no actor of the test outlived it."""
    ray = _ray_started()
    yield ray
    if _ours(ray):
        assert_no_actor_left(ray)


# -- tests that must have the machine to themselves ---------------------------------------
# Under pytest-xdist (``-n 2``) two tests run at once. A few tests compare workers' speeds
# (SaPS's straggler detection, stealing, emulated slowdowns): with another test's
# processes on the same cores their workers all fall behind and every one is flagged.
# Those are marked ``exclusive``: every test holds a shared lock on a file of this run,
# an exclusive test holds it exclusively; a gate taken first gives a waiting exclusive
# test priority over shared tests arriving after it. Without xdist nothing is locked.
def _on_ray(item):
    return ("local_ray" in item.fixturenames
            or item.module.__name__ == "test_ps_ray")


def pytest_collection_modifyitems(config, items):
    """Tests on a Ray cluster are exclusive too (a cluster is a dozen processes: beside
    another test both crawl). Under xdist, exclusive tests run last: one waits for the
    other worker's current test to end, idling its own worker, and near the end those
    tests are short."""
    for item in items:
        if _on_ray(item):
            item.add_marker(pytest.mark.exclusive)
    if os.environ.get("PYTEST_XDIST_WORKER") is not None:
        items.sort(key=lambda item: item.get_closest_marker("exclusive") is not None)


def _run_lock_files(config):
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return None
    shared = config._tmp_path_factory.getbasetemp().parent   # one folder for the workers
    return open(shared / "exclusive.gate", "a+"), open(shared / "exclusive.lock", "a+")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """The lock is held around a test's whole protocol, its module's fixtures' setup
    and teardown included (a Ray cluster starting beside an exclusive test is load)."""
    import fcntl
    files = _run_lock_files(item.config)
    if files is None:
        yield
        return
    gate, lock = files
    with gate, lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        exclusive = item.get_closest_marker("exclusive") is not None
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
