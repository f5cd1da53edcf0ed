"""Shared-memory segments: the common ground of every structure in the kit.

A :class:`Segment` is a block of memory that a structure lays itself out in.
With ``shared=True`` it is a named POSIX shared-memory object (``/dev/shm/<name>``):
the *owner* creates it and every other process *attaches* by name. With
``shared=False`` it is anonymous memory, private to the process (and to children
it forks).

Lifetime rules, and why they hold:

* Python 3.11's :class:`multiprocessing.shared_memory.SharedMemory` registers a
  segment with the resource tracker in *every* process that opens it, so when an
  attaching process exits its tracker unlinks the segment under everybody's
  feet. This module opens segments with ``shm_open`` + ``mmap`` directly and only
  the owner registers with the (stdlib) resource tracker.
* The owner unlinks on :meth:`Segment.close`, when the segment object is
  garbage collected, and at interpreter exit (``weakref.finalize``). Because the
  owner registered the name, the resource tracker process unlinks it even if the
  owner is killed with SIGKILL. Only the process that created the segment ever
  unlinks it: a forked child holding a copy of the owner object does not.
* Attaching processes only map and unmap; a SIGKILLed child leaves nothing behind.

Every segment starts with a 64-byte common header: magic ``b"RLXKIT\\0\\1"``,
layout version, structure kind and total size. :func:`check_header` refuses
anything else with a clear error.

Example::

    from relaxed.shm import Segment
    seg = Segment.create(4096, shared=True)     # owner
    other = Segment.attach(seg.name)            # e.g. in another process
    other.close(); seg.close()                  # the owner's close unlinks
"""
from __future__ import annotations

import errno
import mmap
import os
import secrets
import struct
import weakref

import _posixshmem
from multiprocessing import resource_tracker

__all__ = ["Segment", "SharedMemoryFull", "MAGIC", "LAYOUT_VERSION", "HEADER_SIZE", "KIND_NAMES",
           "write_header", "check_header", "live_segment_names"]

MAGIC = b"RLXKIT\x00\x01"
#: raised whenever a structure's shared layout changes (2: the MultiQueue's journal line)
LAYOUT_VERSION = 2
HEADER_SIZE = 64
#: structure kinds stored in the header
KIND_NAMES = {1: "MultiQueue", 2: "MultiCounter", 3: "TL2", 4: "ParameterStore", 5: "Collective"}
_HEADER = struct.Struct("<8sIIQq")  # magic, version, kind, total size, owner pid
_PREFIX = "rlx"

# names this process created and has not yet unlinked (for tests and debugging)
_live: set[str] = set()


def live_segment_names() -> list[str]:
    """Names of the shared segments this process owns and has not unlinked."""
    return sorted(_live)


SHM_DIR = "/dev/shm"


class SharedMemoryFull(OSError):
    """The shared-memory filesystem has less free space than a segment needs."""


def shm_free_bytes() -> int | None:
    """Free bytes of /dev/shm (None where it cannot be read)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _full(size: int, free: int | None) -> SharedMemoryFull:
    have = "an unknown amount" if free is None else f"{free:,} bytes ({free / 2**20:.1f} MiB)"
    return SharedMemoryFull(
        errno.ENOSPC,
        f"{SHM_DIR} has {have} free, but this segment needs {size:,} bytes "
        f"({size / 2**20:.1f} MiB). Enlarge it (Docker: `docker run --shm-size=2g`; "
        f"Linux: `mount -o remount,size=8G {SHM_DIR}`), free it (close other structures), "
        "or ask for a smaller structure (capacity, workers, weights)")


def _is_no_memory(e: BaseException) -> bool:
    return isinstance(e, OverflowError) or (isinstance(e, OSError) and e.errno == errno.ENOMEM)


def _no_memory(size: int, cause: BaseException) -> MemoryError:
    return MemoryError(
        f"cannot map a segment of {size:,} bytes ({size / 2**30:.1f} GiB): {cause}; "
        "ask for a smaller structure (capacity, n_words, max_writes, workers, weights)")


def _reserve(fd: int, size: int) -> None:
    """Allocate the segment's pages now, so a full /dev/shm is a clear error here and
    never a SIGBUS at the first write past the real space (a sparse ftruncate'd file
    promises space it may not have)."""
    free = shm_free_bytes()
    if free is not None and size > free:
        raise _full(size, free)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise _full(size, shm_free_bytes()) from None
        if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
            raise                               # else: this filesystem cannot reserve


def _unlink_name(name: str) -> None:
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass
    try:
        resource_tracker.unregister("/" + name, "shared_memory")
    except Exception:  # pragma: no cover - tracker already gone at shutdown
        pass
    _live.discard(name)


def unlink_orphan(name: str) -> None:
    """Unlink the segment ``name`` whose owner died without unlinking it (killed with
    its resource tracker, as a Ray actor is with its children); a missing name is
    fine. Mappings that other processes hold stay valid until they exit."""
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"name: expected a segment name without '/', got {name!r}")
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass


def _finalize(mm: mmap.mmap, name: str | None, owner_pid: int) -> None:
    if name is not None and os.getpid() == owner_pid:
        _unlink_name(name)
    try:
        mm.close()
    except BufferError:  # still exported (a numpy view lives on): the OS unmaps at exit
        pass


class Segment:
    """A mapped block of shared (named) or private (anonymous) memory.

    Use :meth:`create` or :meth:`attach`; do not call the constructor.
    ``buf`` is a writable memoryview of the whole block.
    """

    __slots__ = ("name", "size", "owner", "_mm", "buf", "_fin", "__weakref__")

    def __init__(self, mm: mmap.mmap, name: str | None, size: int, owner: bool):
        self._mm = mm
        self.name = name
        self.size = size
        self.owner = owner
        self.buf = memoryview(mm)
        self._fin = weakref.finalize(self, _finalize, mm, name if owner else None,
                                     os.getpid())

    # -- construction -------------------------------------------------------
    @classmethod
    def create(cls, size: int, *, shared: bool = True) -> "Segment":
        """Create a zero-filled block of ``size`` bytes (owner)."""
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"size must be an int, got {type(size).__name__}")
        if size < HEADER_SIZE:
            raise ValueError(f"size must be at least {HEADER_SIZE} bytes, got {size}")
        if not shared:
            try:
                return cls(mmap.mmap(-1, size), None, size, True)
            except (OSError, OverflowError) as e:
                if not _is_no_memory(e):
                    raise
                raise _no_memory(size, e) from e
        for _ in range(100):
            name = f"{_PREFIX}_{os.getpid()}_{secrets.token_hex(6)}"
            try:
                fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR,
                                          mode=0o600)
            except FileExistsError:
                continue
            break
        else:  # pragma: no cover
            raise RuntimeError("could not find a free shared-memory name")
        try:
            # registered before anything can fail, so a crash from here on is cleaned up
            resource_tracker.register("/" + name, "shared_memory")
            _live.add(name)
            os.ftruncate(fd, size)
            _reserve(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException as e:
            os.close(fd)
            _unlink_name(name)
            if _is_no_memory(e):
                raise _no_memory(size, e) from e
            raise
        os.close(fd)
        return cls(mm, name, size, True)

    @classmethod
    def attach(cls, name: str) -> "Segment":
        """Map an existing named segment created by another handle or process."""
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        if not name or "/" in name:
            raise ValueError(f"name must be a segment name without '/', got {name!r}")
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        except FileNotFoundError:
            raise ValueError(
                f"no shared-memory segment named {name!r}: it was never created, or its "
                "owner has closed it; attach while the owner's object is open") from None
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise ValueError(f"segment {name!r} is {size} bytes, too small to be a "
                                 "relaxed structure (it was not made by this kit)")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(mm, name, size, False)

    # -- teardown -----------------------------------------------------------
    @property
    def closed(self) -> bool:
        return not self._fin.alive

    def close(self) -> None:
        """Unmap; the owner (in the process that created it) also unlinks the name.

        The name is always removed; if numpy views of ``buf`` are still alive the
        mapping itself stays until they are gone (or the process exits)."""
        try:
            self.buf.release()
        except BufferError:
            pass
        self._fin()

    def __repr__(self) -> str:
        kind = "shared" if self.name else "private"
        return (f"Segment({kind}, name={self.name!r}, size={self.size}, "
                f"owner={self.owner}, closed={self.closed})")


def write_header(buf: memoryview, kind: int, total_size: int) -> None:
    _HEADER.pack_into(buf, 0, MAGIC, LAYOUT_VERSION, kind, total_size, os.getpid())


def check_header(buf: memoryview, kind: int, name: str | None) -> None:
    """Raise ValueError unless ``buf`` holds a structure of ``kind`` at this layout."""
    magic, version, got_kind, total, _pid = _HEADER.unpack_from(buf, 0)
    where = f"segment {name!r}"
    if magic != MAGIC:
        raise ValueError(f"{where} is not a relaxed structure (bad magic {magic!r}); "
                         "attach only to names returned by a structure's .name")
    if version != LAYOUT_VERSION:
        raise ValueError(f"{where} has layout version {version}, this build reads "
                         f"version {LAYOUT_VERSION}; use the same kit version on both sides")
    if got_kind != kind:
        raise ValueError(f"{where} holds a {KIND_NAMES.get(got_kind, got_kind)}, not a "
                         f"{KIND_NAMES[kind]}; attach with the matching class")
    if not total <= len(buf) < total + mmap.PAGESIZE:    # some systems round up to a page
        raise ValueError(f"{where} records {total} bytes but maps {len(buf)}; "
                         "it is truncated or foreign")
