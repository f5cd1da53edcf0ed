"""sgd_shm.collectives.stale: a segment no process maps and older than min_age goes;
one a process maps, a fresh one, or another pattern stays."""
import mmap
import os
import shutil
import subprocess
import sys
import time

import pytest

from sgd_shm.collectives.stale import remove_stale_segments, stale_segments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _make(path, age):
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    t = time.time() - age
    os.utime(path, (t, t))


def test_only_unmapped_old_segments_go(tmp_path):
    old, fresh, mapped, other = (str(tmp_path / n) for n in (
        "mpich_shm_old_0", "mpich_shm_fresh_0", "mpich_shm_mapped_0", "keep_me"))
    for p in (old, mapped, other):
        _make(p, 600)
    _make(fresh, 0)
    with open(mapped, "r+b") as f:
        m = mmap.mmap(f.fileno(), 4096)            # a live job's segment
        try:
            assert stale_segments(str(tmp_path)) == [old]
            assert remove_stale_segments(str(tmp_path)) == [old]
        finally:
            m.close()
    assert sorted(os.listdir(tmp_path)) == ["keep_me", "mpich_shm_fresh_0",
                                            "mpich_shm_mapped_0"]
    assert remove_stale_segments(str(tmp_path), min_age=0) == [fresh, mapped]


KILLED = r'''
import os, signal
import numpy as np
from mpi4py import MPI
from sgd_shm.collectives.mpi import MPICommunicator
c = MPICommunicator(4, timeout=10)
c.allreduce(np.ones(4))
if MPI.COMM_WORLD.Get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
c.allreduce(np.ones(4))
'''


def test_segment_of_a_killed_mpi_job_is_removed(tmp_path):
    """A SIGKILLed rank leaves MPICH's segment behind; the cleanup finds it once no
    process maps it (min_age=0 here: nothing else of this test's runs in between)."""
    pytest.importorskip("mpi4py")
    exe = shutil.which("mpiexec") or os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(exe):
        pytest.skip("no mpiexec")
    before = set(os.listdir("/dev/shm"))
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    p = subprocess.run([exe, "-n", "2", sys.executable, str(script)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert p.returncode != 0
    left = {f for f in set(os.listdir("/dev/shm")) - before if f.startswith("mpich_shm_")}
    if not left:
        pytest.skip("this MPICH build left no segment (nothing to clean)")
    stale = {os.path.basename(x) for x in stale_segments(min_age=0)}
    assert left <= stale
    for name in left:               # by name: other tests' live jobs are not touched
        assert remove_stale_segments(pattern=name, min_age=0) == ["/dev/shm/" + name]
    assert not left & set(os.listdir("/dev/shm"))
