"""The kit's process launcher: worker processes on shared-memory arrays, used by
Hogwild's engine, matrix factorization, the MLP, the parameter server's shm transport
and the shm collectives (``ShmGroup.run``: the start methods and their rules below).

A :class:`SharedWorkers` pool puts the arrays its step writes in one shared segment
(:class:`relaxed.shm.Segment`), starts ``multiprocess`` workers, and on each
``run`` tells every worker to call ``step`` once (with the calling process as worker
0 when ``driver_works``). ``close()`` (always called, from a ``finally``) copies the
arrays back to private memory, stops the workers and unlinks the segments, so nothing
is left in /dev/shm after training, an exception in a worker, or a worker killed by a
signal; a worker that dies is reported (:class:`WorkerError`) instead of hanging the
caller. The trainers' own pools are in :mod:`sgd_shm.hogwild._pool`.

:func:`run_workers` is the threads' counterpart: worker 0 in the caller, the others on
threads, the first worker's exception re-raised (Hogwild's engine, its MF and MLP, and
the PyTorch Hogwild share it).

Start methods (``start_method``, :data:`START_METHODS`):

* ``"fork"`` (the default, fastest): the workers are forked and inherit the
  shared views and the (read-only) training data; nothing is copied or pickled.
* ``"spawn"`` / ``"forkserver"``: a fresh interpreter (or a child of a clean fork
  server) that imports the kit and receives its inputs pickled. A
  :class:`Shipment` carries them: every array that lies in a shared segment
  travels as a reference (segment name, offset, shape, dtype, strides) and is
  re-created in the child as a view of the segment, attached by name; every other
  array larger than :data:`INLINE_BYTES` (the training data) is first copied into
  one more segment of the shipment, so no large array goes through a pipe. Costs:
  the children's start-up (about 1.6 s for a pool of two on two cores: the
  interpreter, the kit's imports, Numba loading the kernels from its cache) and
  one copy of the data in /dev/shm for the life of the pool. A forkserver child
  is forked from a server that imports only what it is told to preload: after
  ``multiprocess.set_forkserver_preload(["sgd_shm"])`` (the caller's choice; it
  is process-wide) a pool starts in about 0.5 s. They exist because forking a
  process that runs threads can deadlock the child (Python 3.12+ warns about it),
  Python 3.14 makes forkserver the default on Linux, and macOS defaults to spawn.

Example (``step`` must live in an importable module for spawn and forkserver;
``sgd_shm.hogwild._pool._mf_step`` is one)::

    # mymodule.py
    def step(wid, views, static, scale):
        views["w"][wid] = scale * static["X"].sum()      # a shared write
        return wid

    # the driver
    from sgd_shm.core.launcher import SharedWorkers
    pool = SharedWorkers({"w": ((2,), float)}, mymodule.step,
                         {"X": np.ones(10**6)}, start_method="spawn")
    pool.start(2)                  # X goes through /dev/shm, not through the pipes
    try:
        assert pool.run(lambda w: (2.0,)) == [0, 1]
        assert (pool.views["w"] == 2e6).all()
    finally:
        pool.close()
"""
from __future__ import annotations

import io
import mmap
import os
import pickle
import sys
import threading
import traceback

import numpy as np

from relaxed.shm import HEADER_SIZE, Segment
from sgd_shm.core.atomics import LINE_WORDS
from sgd_shm.core.errors import WorkerError

_ALIGN = 8 * LINE_WORDS          # every array starts on a padded cache line of its own

#: the ways to start worker processes; "fork" is the default (see the module notes)
START_METHODS = ("fork", "spawn", "forkserver")
#: under spawn/forkserver, arrays up to this many bytes outside shared memory are
#: pickled with their object; larger ones are copied into a shared segment first
INLINE_BYTES = 4096


def check_start_method(start_method) -> str:
    """``start_method`` if it is one of :data:`START_METHODS`, else a ValueError that
    names the argument, the allowed values and what each is for."""
    if not isinstance(start_method, str) or start_method not in START_METHODS:
        raise ValueError(
            f"start_method: must be one of {START_METHODS}, got {start_method!r}; use "
            "'fork' (the default and fastest: workers inherit the data) or, where forking "
            "is unsafe (a parent running threads, which Python 3.12+ warns about) or "
            "unavailable, 'forkserver' or 'spawn' (the data then goes through shared "
            "memory and each worker takes about a second to start)")
    return start_method


def run_workers(work, n_workers):
    """Run ``work(w)`` for w = 0..n_workers-1, worker 0 in the calling thread and the
    others on new threads (the kernels release the GIL; the caller would only wait),
    and re-raise the first worker's exception in the caller once all have ended."""
    if n_workers == 1:
        work(0)
        return
    errors = [None] * n_workers

    def guarded(w):
        try:
            work(w)
        except BaseException as e:        # re-raised in the caller's thread below
            errors[w] = e
    threads = [threading.Thread(target=guarded, args=(w,)) for w in range(1, n_workers)]
    try:
        for th in threads:
            th.start()
        guarded(0)
    finally:
        for th in threads:
            if th.ident is not None:      # (started)
                th.join()
    for e in errors:
        if e is not None:
            raise e


def _layout(shapes):
    offsets, pos = [], 0
    for shape, dtype in shapes:
        offsets.append(pos)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        pos += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN + _ALIGN    # a line of padding
    return offsets, max(pos, _ALIGN)


def shared_arrays(arrays, shared=True):
    """One shared :class:`Segment` holding ``arrays`` ({name: (shape, dtype)}),
    each on cache lines of its own; returns (segment, {name: array view}).
    Forked processes inherit the views; a :class:`Shipment` sends them to spawned
    ones. Close the segment (after dropping the views) to unlink it.
    ``shared=False``: the same layout in private memory (threads of one process)."""
    names = list(arrays)
    shapes = [arrays[k] for k in names]
    offsets, size = _layout(shapes)
    seg = Segment.create(max(size, HEADER_SIZE), shared=bool(shared))
    try:
        views = {k: np.ndarray(shape, dtype=dt, buffer=seg.buf, offset=off)
                 for k, (shape, dt), off in zip(names, shapes, offsets)}
    except BaseException:
        seg.close()
        raise
    return seg, views


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie counts as dead; a process of another
    user counts as alive). The kit's one liveness test: a shard lock or a collective
    slot whose holder is dead is taken over."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True


# -- shipping objects to spawned processes ----------------------------------------------------
def _base_address(seg):
    return np.frombuffer(seg.buf, np.uint8, count=1).ctypes.data


def _extent(a):
    """[lo, hi) bytes an array's elements span in memory (None when empty)."""
    if a.size == 0:
        return None
    lo = hi = a.__array_interface__["data"][0]
    for n, st in zip(a.shape, a.strides):
        if st >= 0:
            hi += (n - 1) * st
        else:
            lo += (n - 1) * st
    return lo, hi + a.itemsize


def _mapped(a):
    """Whether ``a``'s memory is a bare mmap, as a shared segment's views are (state
    that must stay shared). An ``np.memmap`` (a file the caller mapped: data) is not."""
    while a is not None:
        if isinstance(a, np.memmap):
            return False
        if isinstance(a, mmap.mmap):
            return True
        a = a.obj if isinstance(a, memoryview) else getattr(a, "base", None)
    return False


class _Survey(pickle.Pickler):
    """A dry run of pickling: collects the arrays and the shared segments in an
    object graph without serializing them."""

    def __init__(self):
        super().__init__(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL)
        self.arrays, self.segments = {}, {}

    def persistent_id(self, obj):
        if isinstance(obj, np.ndarray) and not obj.dtype.hasobject:
            self.arrays[id(obj)] = obj
            return 0
        if isinstance(obj, Segment):
            self.segments[obj.name] = obj
            return 0
        return None


class _ByReference(pickle.Pickler):
    """Pickles arrays in shared segments as ("view", name, offset, shape, dtype,
    strides) and segments as ("seg", name)."""

    def __init__(self, file, refs):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.refs = refs

    def persistent_id(self, obj):
        if isinstance(obj, Segment):
            if obj.name is None:
                raise ValueError("a private (shared=False) segment cannot be sent to a "
                                 "spawned process; create it with shared=True")
            return ("seg", obj.name)
        if isinstance(obj, np.ndarray):
            ref = self.refs.get(id(obj))
            if ref is None and obj.nbytes > INLINE_BYTES and not obj.dtype.hasobject:
                # made while pickling (a __reduce__ that builds it anew), so the survey
                # could not move it: refuse rather than send it through the pipe
                raise TypeError(f"an array of {obj.nbytes} bytes appeared only while "
                                "pickling; store it as an attribute so it can be shared")
            return ref
        return None


class _Attaching(pickle.Unpickler):
    """Resolves the references of :class:`_ByReference`: each segment attached once
    (not owned: a child never unlinks), each array a view of it."""

    def __init__(self, file):
        super().__init__(file)
        self.segments = {}

    def persistent_load(self, pid):
        seg = self.segments.get(pid[1])
        if seg is None:
            seg = self.segments[pid[1]] = Segment.attach(pid[1])
        if pid[0] == "seg":
            return seg
        _, _, offset, shape, dtype, strides = pid
        return np.ndarray(shape, dtype=dtype, buffer=seg.buf, offset=offset, strides=strides)


def _land(blob):
    """Unpickle a :class:`Shipment` in the receiving process."""
    return _Attaching(io.BytesIO(blob)).load()


class Shipment:
    """``obj`` packed for a spawned or forkserver process: pickling the shipment
    pickles ``obj`` with its shared arrays by reference, and unpickling it (in the
    child) gives ``obj`` back with those arrays re-created as views of the same
    segments. Arrays in ``segments`` or in a :class:`Segment` reachable from
    ``obj`` (e.g. a structure's ``_seg``) are shared; any other array above
    :data:`INLINE_BYTES` is copied once into a segment of the shipment's own
    (``self.seg``, unlinked by :meth:`close`); smaller ones are pickled with ``obj``.
    Structures that pickle as handles (a ParameterStore, a MultiQueue) re-attach
    themselves. The pickled bytes are made once, however many children get them."""

    def __init__(self, obj, segments=()):
        survey = _Survey()
        survey.dump(obj)
        segs = {**{s.name: s for s in segments}, **survey.segments}
        bases = {name: (_base_address(s), s.size) for name, s in segs.items()
                 if s.name is not None}
        refs, spill = {}, []
        for key, a in survey.arrays.items():
            ref = self._reference(a, bases)
            if ref is not None:
                refs[key] = ref
            elif a.size and _mapped(a):          # (an empty array has nothing to share)
                raise ValueError("an array to send lies in a memory mapping that is not one "
                                 "of the shipment's segments (a copy would not be shared); "
                                 "pass its Segment in segments=")
            elif a.nbytes > INLINE_BYTES:
                spill.append((key, a))
        self.seg = None
        if spill:
            self.seg, views = shared_arrays({key: (a.shape, a.dtype) for key, a in spill})
            base = _base_address(self.seg)
            for key, a in spill:
                views[key][...] = a
                v = views[key]
                refs[key] = ("view", self.seg.name, v.ctypes.data - base, v.shape, v.dtype,
                             v.strides)
            del views, v
        buf = io.BytesIO()
        _ByReference(buf, refs).dump(obj)
        self.blob = buf.getvalue()

    @staticmethod
    def _reference(a, bases):
        ext = _extent(a)
        if ext is None:
            return None
        for name, (base, size) in bases.items():
            if base <= ext[0] and ext[1] <= base + size:
                return ("view", name, a.ctypes.data - base, a.shape, a.dtype, a.strides)
        return None

    def __reduce__(self):
        return (_land, (self.blob,))

    @staticmethod
    def land(blob):
        """``obj`` back from a shipment's ``blob`` (bytes that travelled by other
        means than pickling the shipment, e.g. as an actor call's argument)."""
        return _land(blob)

    def close(self):
        """Unlink the segment of copied arrays (after the children attached it: each
        keeps its mapping until it exits)."""
        if self.seg is not None:
            self.seg.close()
            self.seg = None


def exit_now(code=0):
    """End a spawned or forkserver worker at once: flush its output and ``os._exit``,
    as a forked child ends. A fresh interpreter's normal shutdown (finalizing Numba,
    LLVM and SciPy) takes about a second, which the parent would wait for at every
    stop; a worker has nothing of its own to clean up (it only attached segments)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def _serve(conn, wid, payload, start_method="fork"):
    """A worker's loop: each message but "stop" is one call of ``step``. ``payload``
    is (step, views, static): inherited under fork, or a :class:`Shipment` unpickled
    into that (views attached by name) under spawn and forkserver."""
    step, views, static = payload
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                break
            conn.send(("ok", step(wid, views, static, *msg[1:])))
    except (EOFError, KeyboardInterrupt):
        pass
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except Exception:
            pass
    if start_method != "fork":
        exit_now()


def _reap(procs, timeout=5.0):
    """Wait for the stopped worker processes to exit; kill any still alive after
    ``timeout`` seconds."""
    for p in procs:
        p.join(timeout=timeout)
        if p.is_alive():
            p.kill()
            p.join()


_REAPERS = []       # background _reap threads of closed pools (see SharedWorkers.close)


def _reap_later(procs):
    """_reap in a background thread."""
    t = threading.Thread(target=_reap, args=(procs,), daemon=True, name="sgd_shm-reaper")
    t.start()
    _REAPERS.append(t)


def _join_reapers():
    """Wait for the reapers of earlier pools, so that no thread of ours runs when a
    pool forks (forking a multi-threaded process can deadlock the child; Python
    3.12+ warns). Their workers were told to stop when their pool closed, so this
    usually finds them gone."""
    while _REAPERS:
        _REAPERS.pop().join()


class SharedWorkers:
    """``multiprocess`` workers around one shared segment.

    ``arrays``: {name: (shape, dtype)} laid out in one :class:`Segment` (each on
    its own cache lines) and exposed as ``self.views``. Each worker loops on
    ``step(wid, views, static, *args) -> result`` for every :meth:`run`; ``step``
    must be a module-level function (spawned workers import it). ``static`` (the
    data) is inherited under ``start_method="fork"``, never copied; under "spawn"
    and "forkserver" it travels in a :class:`Shipment` (its large arrays copied
    once into shared memory) and the views are re-attached by name.
    :meth:`adopt` moves an object's arrays into the segment for its lifetime;
    :meth:`start` starts the workers once the arrays are filled; :meth:`close`
    stops the workers, gives adopted arrays back and unlinks the segments.

    ``driver_works=True``: the calling process is worker 0 and runs its share in
    :meth:`run` while the n_workers - 1 processes run theirs, as rank 0 of an MPI
    job does. It saves a process start and exit per pool (a fork copies the
    caller's page tables, and an exit tears a copy of them down: milliseconds each
    for a process holding a large training set) and an idle waiting process. Only
    for steps that keep no state in the process that runs them (the caller's
    process would keep it). A worker process that dies while the caller computes
    is reported when the caller's share ends: the steps never wait for one another
    (a part whose owner never started is skipped, see ``_kernels.run_worker``)."""

    def __init__(self, arrays, step, static, start_method="fork", driver_works=False):
        self.start_method = check_start_method(start_method)
        self.driver_works = bool(driver_works)
        self.procs, self.conns = [], []
        self.idle = True        # no run in flight (see close)
        self.seg, self.views = shared_arrays(arrays)
        self._step, self._static = step, static
        self._adopted = self._shipment = None

    def adopt(self, obj, attrs, scratch=()):
        """Copy obj's arrays ``attrs`` ({view name: attribute name}) into the shared
        views and point the attributes at the views; :meth:`close` copies the views
        back into the original arrays and points the attributes at them again. The
        attributes named in ``scratch`` hold buffers whose contents do not outlive
        a call (every use writes them first): they are pointed at the views and back
        without either copy (after a fork, writing the original's pages copies them)."""
        private = {a: getattr(obj, a) for a in attrs.values()}
        for key, a in attrs.items():
            if a not in scratch:
                self.views[key][...] = private[a]
        self._adopted = (obj, attrs, private, frozenset(scratch))
        for key, a in attrs.items():
            setattr(obj, a, self.views[key])

    def start(self, n_workers):
        """Start the workers (after the caller filled the shared arrays): n_workers
        processes, or n_workers - 1 with ``driver_works`` (the caller is worker 0)."""
        import multiprocess as mp          # here: importing the estimators stays cheap
        ctx = mp.get_context(self.start_method)
        first = int(self.driver_works)     # the first worker id that is a process
        _join_reapers()
        try:
            payload = (self._step, self.views, self._static)
            if self.start_method != "fork" and n_workers > first:
                payload = self._shipment = Shipment(payload, [self.seg])
            for wid in range(first, n_workers):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_serve, daemon=True,
                                args=(child, wid, payload, self.start_method))
                p.start()
                child.close()
                self.procs.append(p)
                self.conns.append(parent)
        except BaseException:
            self.close()
            raise

    def run(self, args_of):
        """Send worker w the arguments ``args_of(w)``, wait for all; returns their
        results. Raises :class:`WorkerError` if one raised or died. With
        ``driver_works`` the caller runs worker 0's share in between."""
        first = int(self.driver_works)
        self.idle = False
        for w, conn in enumerate(self.conns, start=first):
            conn.send(("run", *args_of(w)))
        errors, results = [], [None] * (len(self.conns) + first)
        if first:
            try:
                results[0] = self._step(0, self.views, self._static, *args_of(0))
            except Exception:                  # reported with the processes' errors
                errors.append(f"worker 0 (the calling process) raised:\n"
                              f"{traceback.format_exc()}")
        for w, (conn, p) in enumerate(zip(self.conns, self.procs), start=first):
            while not conn.poll(0.2):
                if not p.is_alive():
                    errors.append(f"worker {w} (pid {p.pid}) died with exit code {p.exitcode}")
                    break
            else:
                try:
                    status, payload = conn.recv()
                except (EOFError, OSError):            # it died before answering
                    p.join(timeout=2)
                    errors.append(f"worker {w} (pid {p.pid}) died with exit code {p.exitcode}")
                    continue
                if status == "ok":
                    results[w] = payload
                else:
                    errors.append(f"worker {w} raised:\n{payload}")
        if errors:
            raise WorkerError("Hogwild worker failure; training stopped and shared memory "
                              "released.\n" + "\n".join(errors))
        self.idle = True
        return results

    def close(self):
        """Stop the workers (killing any that do not stop within 5 s), copy the
        adopted arrays back and unlink the segments. Idempotent.

        When every worker has answered its last run (``self.idle``), none will touch
        the segment again, so the workers' exits (a forked child's teardown of its
        copy of a large address space takes milliseconds) are waited for by a
        background thread instead of the caller; otherwise (a run failed or was
        interrupted) the caller waits for them before copying anything back."""
        for conn in self.conns:
            try:
                conn.send(("stop",))
            except Exception:
                pass
        if self.idle and self.procs:
            _reap_later(self.procs)
        else:
            _reap(self.procs)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        if self._adopted is not None:
            obj, attrs, private, scratch = self._adopted
            for key, a in attrs.items():
                if a not in scratch:
                    private[a][...] = self.views[key]
                setattr(obj, a, private[a])
            self._adopted = None
        self.views = {}
        self.seg.close()
        if self._shipment is not None:
            self._shipment.close()
            self._shipment = None
