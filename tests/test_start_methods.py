"""Every multi-process path under every start method: fork (the default), spawn and
forkserver. Hogwild's processes backend counts every update once and keeps hot
coordinates exact; matrix factorization with one worker process equals the serial
oracle and two workers train; the parameter server applies exactly epochs x batches
minibatches and loses none; a worker SIGKILLed under spawn is reported and nothing
is left in /dev/shm; forkserver workers exit when their coordinator is killed. Plus
the unit under it all, :class:`sgd_shm.core.launcher.Shipment`, and bad values.
(Spawned workers take a second or two to start: each test starts few pools.)"""
import os
import signal
import subprocess
import sys
import threading
import textwrap
import time
import warnings

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.preprocessing import StandardScaler

from test_mf import replay_second_epoch_against_serial_oracle
from test_ps_train import _running
from sgd_shm import HogwildClassifier, MatrixFactorization
from sgd_shm.core.launcher import INLINE_BYTES, START_METHODS, Shipment, WorkerError, _land
from sgd_shm.core.launcher import shared_arrays
from sgd_shm.data import make_ratings, make_rcv1_like
from sgd_shm.hogwild import HogwildSGD, Problem
from sgd_shm.ps import train

METHODS = list(START_METHODS)


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return StandardScaler().fit_transform(X), y


@pytest.fixture(scope="module")
def ps_data():
    return make_rcv1_like(4000, 500, random_state=0)


# -- processes, from /proc -----------------------------------------------------------------
def _descendants(pid):
    """Every process below ``pid`` (children first), from each process's parent id."""
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return kids + [g for k in kids for g in _descendants(k)]


def _is_worker(pid):
    """Whether ``pid`` has a relaxed segment mapped (a worker of a pool or a run; the
    resource trackers and the fork server never map one)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "/dev/shm/rlx_" in f.read()
    except OSError:
        return False


# -- the shipment: shared arrays by reference, other large arrays through a segment -----------
def test_shipment_shares_views_and_moves_large_arrays_through_shared_memory(tmp_path,
                                                                           no_shm_leak):
    seg, views = shared_arrays({"w": ((10,), np.float64)})
    big = np.memmap(tmp_path / "big.f8", np.float64, "w+", shape=(200_000,))  # data: moved
    big[:] = np.arange(200_000.0)
    small = np.arange(5)[::-1]
    try:
        sh = Shipment({"w": views["w"][2:], "data": (big, small)}, [seg])
        try:
            assert len(sh.blob) < INLINE_BYTES, "a large array went into the pickle"
            got = _land(sh.blob)             # what a spawned child unpickles
            got["w"][0] = 7.0                # a view of the same segment: shared
            assert views["w"][2] == 7.0
            np.testing.assert_array_equal(got["data"][0], big)     # a copy, in /dev/shm
            np.testing.assert_array_equal(got["data"][1], small)   # small: pickled
            del got
        finally:
            sh.close()
        del big
        with pytest.raises(ValueError, match="segments="):          # would be a silent copy
            Shipment({"w": views["w"]})
    finally:
        del views
        seg.close()


# -- Hogwild ----------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_hogwild_processes_count_every_update_once(method, cancer, no_shm_leak):
    """Two worker processes: every update counted once in the staleness histogram,
    accuracy as with threads; with every feature hot, hinge steps that never leave
    the margin sum to exactly eta X^T y (no step lost or doubled)."""
    X, y = cancer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = HogwildClassifier(loss="log_loss", n_workers=2, backend="processes",
                                start_method=method, instrument=True, max_iter=3, tol=None,
                                random_state=0).fit(X, y)
    assert clf.staleness_.sum() == 3 * len(y)
    assert clf.score(X, y) > 0.93
    Xs, ys = make_rcv1_like(4000, 200, density=0.05, random_state=4)
    prob = Problem.from_xy(Xs, ys[:, None], hot_features=1024)
    sgd = HogwildSGD(200, 1, loss="hinge", alpha=0.0, learning_rate="constant", eta0=1e-6,
                     fit_intercept=False, n_workers=2, backend="processes", seed=1,
                     start_method=method)
    sgd.epoch(prob)
    np.testing.assert_allclose(sgd.W[0], 1e-6 * (Xs.T @ ys), rtol=1e-9, atol=1e-15)


def _kill_first_attached_child(pids, earlier=()):
    """SIGKILL the first worker process once it has a relaxed segment mapped (it is
    in the pool, about to run or running), and record its pid; processes in
    ``earlier`` (an earlier test's workers, still exiting) are left alone. (Read from
    /proc: the multiprocess bookkeeping is not safe to walk from a second thread.)"""
    deadline = time.time() + 60
    while time.time() < deadline:
        for pid in _descendants(os.getpid()):
            if pid not in earlier and _is_worker(pid):
                os.kill(pid, signal.SIGKILL)
                pids.append(pid)
                return
        time.sleep(0.02)


def test_hogwild_worker_sigkilled_under_spawn(cancer, no_shm_leak):
    X, y = cancer
    clf = HogwildClassifier(n_workers=2, backend="processes", start_method="spawn",
                            max_iter=20_000, tol=None, random_state=0)
    killed = []
    killer = threading.Thread(target=_kill_first_attached_child,
                              args=(killed, set(_descendants(os.getpid()))))
    killer.start()
    try:
        with pytest.raises(WorkerError, match="died"):
            clf.fit(X, y)
    finally:
        killer.join()
    assert killed, "no worker was killed"


# -- matrix factorization ---------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_mf_processes(method, no_shm_leak):
    """One worker process replays the serial oracle exactly (as
    test_mf.test_one_worker_epoch_equals_serial_oracle); two train as well as threads."""
    replay_second_epoch_against_serial_oracle(backend="processes", start_method=method)
    Xr, yr = make_ratings(300, 100, 20_000, random_state=0)
    kw = dict(n_factors=8, max_iter=5, random_state=0)
    two = MatrixFactorization(n_workers=2, backend="processes", start_method=method, **kw)
    ref = MatrixFactorization(n_workers=2, **kw).fit(Xr, yr).rmse(Xr, yr)
    assert two.fit(Xr, yr).rmse(Xr, yr) < ref + 0.05


# -- the parameter server ---------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_ps_applies_every_minibatch_exactly_once(method, ps_data, no_shm_leak):
    """As test_ps_compress.test_epochs_stop_at_equal_work: exactly epochs x batches
    minibatches applied, none lost, under every start method."""
    X, y = ps_data
    n_batches = 2 * -(-(X.shape[0] // 2) // 64)
    r = train(X, y, n_workers=2, policy="saps", epochs=2, max_seconds=30, seed=0,
              slowdown={0: 2.0}, start_method=method, progress=False)
    assert sum(r.batches["applied"]) == r.updates == 2 * n_batches
    assert r.batches["lost"] == 0 and r.killed == []
    assert r.final_loss < 0.69


def test_ps_worker_sigkilled_under_spawn(ps_data, no_shm_leak):
    """A spawned worker killed 0.1 s into a 0.6 s run: the survivor goes on (the
    workers start together, on the coordinator's go, so the killed one cannot have
    trained alone while the other was still starting), at most one ticket is lost."""
    X, y = ps_data
    r = train(X, y, n_workers=2, policy="asp", max_seconds=0.6, seed=3, faults={1: 0.1},
              start_method="spawn", progress=False)
    assert r.killed == [1]
    assert r.workers[0]["pushes"] > r.workers[1]["pushes"]        # the survivor went on
    per_part = -(-(-(-X.shape[0] // 2)) // 64)
    assert r.batches["lost"] <= 1 + per_part      # at most what it held or was enqueueing


def test_ps_classifier_and_command_line_under_spawn(ps_data, tmp_path, no_shm_leak):
    """ParameterServerClassifier and ``python -m sgd_shm.ps`` pass start_method on:
    a spawned run learns (better than the majority class) and writes its report."""
    from sgd_shm.ps import ParameterServerClassifier
    X, y = ps_data
    clf = ParameterServerClassifier(n_workers=2, policy="asp", max_seconds=0.4,
                                    start_method="spawn", random_state=0).fit(X[:3000], y[:3000])
    assert clf.result_.batches["lost"] == 0 and clf.result_.killed == []
    assert clf.score(X[3000:], y[3000:]) > max(np.mean(y[3000:] > 0), np.mean(y[3000:] < 0))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-m", "sgd_shm.ps", "--start-method", "spawn", "--policies", "asp",
         "--workers", "2", "--seconds", "0.3", "--samples", "2000", "--features", "200",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": root, "MPLBACKEND": "Agg"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "ps-main.json").exists() and (tmp_path / "ps-main.png").exists()
    bad = subprocess.run([sys.executable, "-m", "sgd_shm.ps", "--start-method", "spawn",
                          "--backend", "ray"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": root})
    assert bad.returncode == 2 and "--start-method applies to --backend shm" in bad.stderr


def test_forkserver_workers_exit_when_the_coordinator_is_killed(tmp_path):
    """A forkserver worker's parent is the fork server, not the coordinator: it
    watches the server, which exits with the coordinator, so SIGKILLing the
    process running train() still ends its workers, and no segment stays behind."""
    script = tmp_path / "run.py"
    script.write_text(
        "from sgd_shm.data import make_rcv1_like\n"
        "from sgd_shm.ps import train\n"
        "if __name__ == '__main__':\n"
        "    X, y = make_rcv1_like(4000, 500, random_state=0)\n"
        "    train(X, y, n_workers=2, policy='asp', max_seconds=60, seed=0,\n"
        "          start_method='forkserver', progress=False)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.Popen([sys.executable, str(script)],
                         env={**os.environ, "PYTHONPATH": root})
    workers = []
    deadline = time.time() + 60
    while time.time() < deadline and len(workers) < 2:
        time.sleep(0.1)
        workers = [k for k in _descendants(p.pid) if _is_worker(k)]
    assert len(workers) >= 2, "the workers did not start"
    time.sleep(0.3)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    alive, left = workers, ["?"]
    deadline = time.time() + 10
    while (alive or left) and time.time() < deadline:
        time.sleep(0.1)
        alive = [k for k in workers if _running(k)]
        left = [n for n in os.listdir("/dev/shm") if n.startswith(f"rlx_{p.pid}_")]
    assert alive == [], f"orphans still running: {alive}"
    assert left == [], f"segments left in /dev/shm: {left}"


# -- bad values -------------------------------------------------------------------------------
def test_bad_start_method_names_the_argument_and_the_choices(cancer, ps_data):
    X, y = cancer
    msg = r"start_method.*\('fork', 'spawn', 'forkserver'\).*'threads'"
    with pytest.raises(ValueError, match=msg):
        HogwildClassifier(backend="processes", start_method="threads").fit(X, y)
    with pytest.raises(ValueError, match=msg):
        HogwildSGD(3, 1, backend="processes", start_method="threads")
    Xr, yr = make_ratings(20, 10, 100, random_state=0)
    with pytest.raises(ValueError, match=msg):
        MatrixFactorization(backend="processes", start_method="threads").fit(Xr, yr)
    Xp, yp = ps_data
    with pytest.raises(ValueError, match=msg):
        train(Xp, yp, start_method="threads", max_seconds=0.1)
    with pytest.raises(ValueError, match="start_method.*backend='shm'"):
        train(Xp, yp, backend="ray", start_method="spawn", max_seconds=0.1)


def test_worker_modules_leave_out_scikit_learn():
    """A worker process (spawned, a Ray actor, an MPI rank) imports the engine only:
    not scikit-learn or matplotlib, which the estimators and plots import on first
    use; the package's estimators still resolve, listed by dir()."""
    code = ("import sys\n"
            "import sgd_shm.ps, sgd_shm.ps.worker, sgd_shm.ps.ray_backend, sgd_shm.hogwild\n"
            "import sgd_shm.core.launcher, sgd_shm.eager, sgd_shm.collectives, sgd_shm.models\n"
            "print(sorted(m for m in ('sklearn', 'matplotlib') if m in sys.modules))\n"
            "import sgd_shm\n"
            "assert {'HogwildClassifier', 'MatrixFactorization'} <= set(dir(sgd_shm))\n"
            "print(sgd_shm.HogwildClassifier.__module__, sgd_shm.ps.ParameterServerClassifier"
            ".__module__)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["[]", "sgd_shm.hogwild.estimators sgd_shm.ps.estimator"]
    import sgd_shm
    import sgd_shm.torch
    for pkg in (sgd_shm, sgd_shm.torch):      # public names only: no helper modules
        assert not {"importlib", "logging"} & set(dir(pkg))
        assert set(pkg.__all__) <= set(dir(pkg))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        sgd_shm.Nope
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        sgd_shm.ps.Nope


def test_process_workers_reuse_the_threads_compiled_kernel(tmp_path):
    """A spawned worker gets its data as writeable views of shared memory (or, for a
    model's prepared data, unpickled); the kernel's entry takes read-only views of
    them, as of the caller's arrays, so threads and processes share one compiled
    kernel: Hogwild's, and the MLP's gradient in parameter-server workers, whose
    parent evaluates the loss with the same kernel (counted in a fresh Numba cache)."""
    code = textwrap.dedent("""
        from sgd_shm import HogwildClassifier, ps
        from sgd_shm.data import make_rcv1_like
        from sgd_shm.models import MLP
        if __name__ == "__main__":
            X, y = make_rcv1_like(1000, 100, random_state=0)
            for backend in ("threads", "processes"):
                HogwildClassifier(max_iter=1, tol=None, n_workers=2, backend=backend,
                                  start_method="spawn", random_state=0).fit(X, y)
            ps.train(X, y, model=MLP(100, (8,), 2), n_workers=2, epochs=1,
                     start_method="spawn")
    """)
    (tmp_path / "fits.py").write_text(code)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, str(tmp_path / "fits.py")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for kernel in ("_run_body", "loss_grad"):
        compiled = sorted(p.name for p in (tmp_path / "cache").rglob(f"*{kernel}*.nbc"))
        assert len(compiled) == 1, compiled
