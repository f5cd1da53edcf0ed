"""Shared memory: attach by name, headers, and no segment left behind after normal
exit, an exception, or SIGKILL of a child (or of the owner)."""
import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import multiprocess as mp
import pytest
from multiprocessing import shared_memory

import workers
from conftest import new_segments, shm_names
from relaxed import MultiCounter, MultiQueue, Segment


def run_script(code, expect_rc=0):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == expect_rc, r.stderr
    return r


def wait_gone(names, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not (names & shm_names()):
            return True
        time.sleep(0.05)
    return False


def test_segment_create_attach_unlink(no_shm_leak):
    seg = Segment.create(4096)
    assert seg.name in shm_names()
    other = Segment.attach(seg.name)
    other.buf[100] = 7
    assert seg.buf[100] == 7
    other.close()
    assert seg.name in shm_names(), "closing an attached handle must not unlink"
    seg.close()
    assert seg.name not in shm_names()
    seg.close()


def test_attach_missing_and_foreign_segments():
    with pytest.raises(ValueError, match="no shared-memory segment named"):
        MultiQueue.attach("rlx_does_not_exist")
    with pytest.raises(ValueError, match="without '/'"):
        MultiQueue.attach("a/b")
    with pytest.raises(TypeError, match="name must be a str"):
        MultiCounter.attach(5)
    foreign = shared_memory.SharedMemory(create=True, size=4096)
    try:
        with pytest.raises(ValueError, match="not a relaxed structure"):
            MultiQueue.attach(foreign.name)
    finally:
        foreign.close()
        foreign.unlink()
    small = shared_memory.SharedMemory(create=True, size=16)
    try:
        with pytest.raises(ValueError, match="too small"):
            MultiQueue.attach(small.name)
    finally:
        small.close()
        small.unlink()
    with MultiCounter(4, shared=True) as c:
        with pytest.raises(ValueError, match="holds a MultiCounter, not a MultiQueue"):
            MultiQueue.attach(c.name)
    with MultiQueue(10, shared=True) as q:
        with pytest.raises(ValueError, match="holds a MultiQueue, not a MultiCounter"):
            MultiCounter.attach(q.name)


def test_attacher_exit_does_not_unlink_spawn(no_shm_leak):
    """Python 3.11's resource tracker would unlink a segment when a spawned attacher
    exits; ours must survive that."""
    ctx = mp.get_context("spawn")
    with MultiQueue(100, shared=True) as mq:
        mq.push(1, 1)
        with ctx.Pool(1) as pool:
            assert pool.apply(workers.attach_and_exit, (mq.name, "MultiQueue")) == 1
        time.sleep(0.3)
        assert mq.name in shm_names()
        again = MultiQueue.attach(mq.name)
        assert len(again) == 1
        again.close()


def test_no_leak_after_normal_exit_and_exception():
    before = shm_names()
    run_script("""
        from relaxed import MultiQueue, MultiCounter
        q = MultiQueue(1000, shared=True); c = MultiCounter(8, shared=True)
        q.push(1, 1); c.increment()
        q2 = MultiQueue(10, shared=True)   # never closed: the finalizer unlinks it
    """)
    r = run_script("""
        from relaxed import MultiQueue
        q = MultiQueue(1000, shared=True)
        raise RuntimeError("boom")
    """, expect_rc=1)
    assert "boom" in r.stderr
    assert new_segments(before) == set()


def test_no_leak_when_child_is_sigkilled(no_shm_leak):
    ctx = mp.get_context("fork")
    with MultiQueue(100, shared=True) as mq:
        ready = ctx.Event()
        p = ctx.Process(target=workers.attach_and_sleep, args=(mq, ready), daemon=True)
        p.start()
        try:
            assert ready.wait(30)
        finally:
            os.kill(p.pid, signal.SIGKILL)
            p.join()
        mq.push(1, 1)
        assert mq.pop() == (1, 1)


def test_no_leak_when_owner_is_sigkilled():
    before = shm_names()
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from relaxed import MultiQueue
        q = MultiQueue(1000, shared=True)
        print(q.name, flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    name = proc.stdout.readline().strip()
    assert name in shm_names()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # the owner's resource tracker notices the death and unlinks
    assert wait_gone({name}), f"{name} still in /dev/shm after its owner was killed"
    assert new_segments(before) == set()


def test_forked_child_holding_owner_copy_does_not_unlink(no_shm_leak):
    ctx = mp.get_context("fork")
    with MultiQueue(100, shared=True) as mq:
        p = ctx.Process(target=lambda: mq.close())   # the child's copy of the owner
        p.start()
        p.join()
        assert mq.name in shm_names()
        mq.push(1, 1)
        assert len(mq) == 1


def test_private_memory_is_shared_with_forked_children():
    mq = MultiQueue(100, seed=0)
    assert mq.name is None and not mq.shared
    p = mp.get_context("fork").Process(target=workers.produce, args=(mq, 0, 10, 0))
    p.start()
    p.join()
    assert len(mq) == 10
    mq.close()


def test_fork_after_closing_a_structure():
    """The after-fork hook must skip structures that were closed (it once crashed)."""
    q = MultiQueue(10, shared=True)
    c = MultiCounter(4, shared=True)
    q.close()
    c.close()
    with MultiCounter(4, shared=True) as c2:
        p = mp.get_context("fork").Process(target=workers.increment, args=(c2, 1000))
        p.start()
        p.join()
        assert p.exitcode == 0 and c2.exact() == 1000


def test_stdlib_multiprocessing_spawn_receives_structures(no_shm_leak):
    """The objects themselves go to a stdlib multiprocessing worker (pickled as a handle
    that re-attaches by name)."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    with MultiQueue(100, n_queues=2, shared=True, seed=0) as mq, \
            MultiCounter(4, shared=True, seed=0) as c:
        mq.push(3, 4)
        with ctx.Pool(2) as pool:
            assert pool.apply(len, (mq,)) == 1
            pool.apply(workers.increment, (c, 1000))
            pool.apply(workers.produce, (mq, 100, 10, 0))
        assert c.exact() == 1000
        assert len(mq) == 11
        assert mq.name in shm_names() and c.name in shm_names()


def test_segment_larger_than_free_shm_is_a_clear_error(no_shm_leak):
    """Asking for more than /dev/shm has free raises SharedMemoryFull naming the place,
    both sizes and the fix, before anything is allocated; nothing is left behind."""
    from relaxed.shm import SharedMemoryFull, live_segment_names, shm_free_bytes
    free = shm_free_bytes()
    assert free is not None
    before = shm_names()
    with pytest.raises(SharedMemoryFull, match=r"/dev/shm has .* free, but this segment "
                                               r"needs .*--shm-size") as e:
        Segment.create(free + 64 * 2**20)
    assert e.value.errno == errno.ENOSPC and f"{free + 64 * 2**20:,}" in str(e.value)
    assert new_segments(before) == set() and live_segment_names() == []
    with pytest.raises(SharedMemoryFull):                  # through a structure, too
        MultiQueue(capacity=(free // 8) + 2**24, n_queues=2, shared=True)
    assert new_segments(before) == set()


def test_reservation_failure_is_a_clear_error(no_shm_leak, monkeypatch):
    """A filesystem that runs out while reserving (simulated ENOSPC from
    posix_fallocate) gives the same error; one that cannot reserve (EOPNOTSUPP) falls
    back to the plain mapping."""
    from relaxed.shm import SharedMemoryFull

    def enospc(fd, off, size):
        raise OSError(errno.ENOSPC, "No space left on device")
    before = shm_names()
    monkeypatch.setattr(os, "posix_fallocate", enospc)
    with pytest.raises(SharedMemoryFull, match="needs 1,048,576 bytes"):
        Segment.create(2**20)
    assert new_segments(before) == set()

    def unsupported(fd, off, size):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")
    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    seg = Segment.create(2**20)
    seg.buf[-1] = 7
    assert seg.buf[-1] == 7
    seg.close()


def test_segment_beyond_memory_is_a_memory_error(no_shm_leak, monkeypatch):
    """A size no mapping can hold is a MemoryError naming the bytes and the fix (was a
    bare ENOMEM OSError, or an OverflowError past ssize_t); a shared one leaves no name."""
    for size in (2**62, 2**64):                   # beyond the address space / ssize_t
        with pytest.raises(MemoryError, match=f"cannot map a segment of {size:,} bytes.*"
                                              "ask for a smaller structure"):
            Segment.create(size, shared=False)
    import mmap

    def enomem(*a, **k):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")
    before = shm_names()
    monkeypatch.setattr(mmap, "mmap", enomem)
    with pytest.raises(MemoryError, match="cannot map a segment of 1,048,576 bytes"):
        Segment.create(2**20)
    assert new_segments(before) == set()


def test_page_rounded_mapping_is_accepted():
    """Some systems (macOS) round a segment up to a page: the header's size may be
    smaller than the mapping by less than a page, not more."""
    import mmap
    from relaxed.shm import check_header, write_header
    total = 100_001
    for mapped, ok in [(total, True), (-(-total // mmap.PAGESIZE) * mmap.PAGESIZE, True),
                       (total + mmap.PAGESIZE, False), (total - 1, False)]:
        buf = memoryview(bytearray(mapped))
        write_header(buf, 2, total)
        if ok:
            check_header(buf, 2, "x")
        else:
            with pytest.raises(ValueError, match="records"):
                check_header(buf, 2, "x")
