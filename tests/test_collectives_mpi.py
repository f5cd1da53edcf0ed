"""MPICommunicator (sgd_shm.collectives.mpi): the checks of tests/mpi_collectives.py run
under mpiexec with 2 and 4 ranks (reductions, gather rounds, ranks that disagree), a rank
killed mid-run, and one-rank checks in a plain subprocess (so this pytest process never
initializes MPI)."""
import os
import shutil
import subprocess
import sys
import time

import pytest

pytest.importorskip("mpi4py")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(HERE, "mpi_collectives.py")


def _mpiexec():
    near = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return near if os.path.exists(near) else shutil.which("mpiexec")


MPIEXEC = _mpiexec()
needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich)")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run(args, timeout=120):
    t = time.monotonic()
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=_env(),
                       cwd=ROOT)
    return p, time.monotonic() - t


def _mpirun(P, mode, *extra, timeout=120):
    return _run([MPIEXEC, "-n", str(P), sys.executable, SCRIPT, mode, *extra],
                timeout=timeout)


def _ok(p, mode):
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"rc {p.returncode}:\n{out[-4000:]}"
    assert f"OK {mode}" in p.stdout, out[-4000:]


def _other_live_owner(name):
    """A kit segment (rlx_<pid>_...) whose creator is alive: another process on this
    box (the job's ranks have all exited), not a leak of this job."""
    parts = name.split("_")
    if parts[0] != "rlx" or len(parts) < 3 or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _shm():
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:  # pragma: no cover
        return set()


def _mapped(name):
    """Does a live process map /dev/shm/<name>?"""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                if f"/dev/shm/{name}" in f.read():
                    return True
        except OSError:
            continue
    return False


@needs_mpiexec
@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("mode", ["exact", "partial", "lag"])
def test_mpi_modes(mode, P):
    p, _ = _mpirun(P, mode)
    _ok(p, mode)


@needs_mpiexec
@pytest.mark.parametrize("P", [2, 4])
def test_gather_rounds(P):
    # sync gathers bit-exact (lengths 0..n per rank and round); solo, majority and mixed
    # runs with reductions interleaved agree on every rank; a late rank gets the parts
    p, _ = _mpirun(P, "gather")
    _ok(p, "gather")


@needs_mpiexec
def test_gather_disagreeing_with_reduce_raises_everywhere():
    # one rank gathers while the others reduce (or close, or gather another kind)
    p, _ = _mpirun(3, "gather_mismatch", timeout=90)
    _ok(p, "gather_mismatch")


@needs_mpiexec
def test_ranks_that_build_with_different_settings_are_refused():
    p, _ = _mpirun(2, "settings")
    _ok(p, "settings")


@needs_mpiexec
def test_close_after_different_round_counts_raises_everywhere():
    p, _ = _mpirun(3, "mismatch")
    _ok(p, "mismatch")


@needs_mpiexec
@pytest.mark.parametrize("P", [2, 4])
def test_killed_rank_ends_the_job(P):
    before = _shm()
    p, dt = _mpirun(P, "kill", timeout=90)
    assert p.returncode != 0, "the job survived a killed rank"
    assert dt < 60, f"the job took {dt:.0f} s to end after a rank was killed"
    time.sleep(0.2)
    new = _shm() - before
    # our code creates nothing in /dev/shm; MPICH's own segments of the killed job
    # (mpich_shm_*) are left behind by SIGKILL: remove the ones no live process maps
    ours = {n for n in new if not n.startswith("mpich_shm_") and not _other_live_owner(n)}
    assert not ours, f"left in /dev/shm: {ours}"
    left = {n for n in new - ours if n.startswith("mpich_shm_")}   # not another test's
    for _ in range(20):                 # the killed job's processes may still be exiting
        for n in list(left):
            if not _mapped(n):
                try:
                    os.unlink(os.path.join("/dev/shm", n))
                except OSError:  # pragma: no cover
                    pass
                left.discard(n)
        if not left:
            break
        time.sleep(0.1)


def test_single_rank_without_mpiexec():
    # a singleton MPI process: COMM_SELF / one-rank COMM_WORLD rounds, argument checks
    p, _ = _run([sys.executable, SCRIPT, "single"], timeout=60)
    _ok(p, "single")


def test_import_without_mpi4py():
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "import sgd_shm.collectives as c\n"
            "assert c.Communicator and c.initiator(0, 1, 4) in range(4)\n"
            "try:\n"
            "    c.MPICommunicator\n"
            "except ImportError as e:\n"
            "    assert 'pip install' in str(e) and 'mpi' in str(e), e\n"
            "    print('OK import')\n")
    p, _ = _run([sys.executable, "-c", code], timeout=60)
    _ok(p, "import")
