"""Removal of the shared-memory segments that MPICH leaves in /dev/shm when a rank is
killed (SIGKILL, the OOM killer): MPICH names them ``mpich_shm_*`` and unlinks them
at a clean ``MPI_Finalize`` only, so every killed job leaves one per node, each the
size of MPICH's intranode buffers (about 2 MiB for two ranks).

A segment is stale when no process maps it any longer (no ``/proc/<pid>/maps``
names it) and it has not been touched for ``min_age`` seconds (so a job that has
just created its segment and not yet mapped it keeps it). Only segments owned by
the calling user are considered. :class:`~sgd_shm.collectives.mpi.MPICommunicator`
runs this at construction; ``python -m sgd_shm.collectives.stale`` runs it by hand.
"""
from __future__ import annotations

import glob
import os
import time

__all__ = ["stale_segments", "remove_stale_segments"]

PATTERN = "mpich_shm_*"


def _mapped_paths(root):
    """Every file under ``root`` that a process maps (of the processes we may read)."""
    prefix = os.path.realpath(root).rstrip("/") + "/"
    seen = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                for line in f:
                    path = line.split(None, 5)[5:]
                    if path and path[0].startswith(prefix):
                        seen.add(path[0].rstrip("\n").removesuffix(" (deleted)"))
        except (OSError, IndexError):
            continue            # a process that exited, or one we may not read
    return seen


def stale_segments(root="/dev/shm", pattern=PATTERN, min_age=60.0):
    """The paths of this user's segments matching ``pattern`` under ``root`` that no
    process maps and that are older than ``min_age`` seconds."""
    if not os.path.isdir("/proc/self"):
        return []               # no /proc: cannot tell a live segment from a stale one
    now, uid = time.time(), os.getuid()
    cands = []
    for path in glob.glob(os.path.join(root, pattern)):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_uid == uid and now - st.st_mtime >= min_age:
            cands.append(path)
    if not cands:
        return []
    mapped = _mapped_paths(root)
    return sorted(p for p in cands if os.path.realpath(p) not in mapped)


def remove_stale_segments(root="/dev/shm", pattern=PATTERN, min_age=60.0):
    """Unlink the :func:`stale_segments`; returns the paths removed."""
    gone = []
    for path in stale_segments(root, pattern, min_age):
        try:
            os.unlink(path)
            gone.append(path)
        except OSError:
            pass                # removed by another rank meanwhile, or not ours
    return gone


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(
        prog="python -m sgd_shm.collectives.stale",
        description="Remove the mpich_shm_* segments of killed MPI jobs from /dev/shm "
                    "(segments no process maps, untouched for --min-age seconds).")
    ap.add_argument("--min-age", type=float, default=60.0, help="seconds [60]")
    ap.add_argument("--dry-run", action="store_true", help="list them, remove nothing")
    a = ap.parse_args()
    found = (stale_segments if a.dry_run else remove_stale_segments)(min_age=a.min_age)
    for path in found:
        print(("stale " if a.dry_run else "removed ") + path)
