"""Checkpoints of a parameter-server run, written atomically.

A checkpoint holds the weights, the shard and global versions, per-worker pushes,
partition epochs and the elapsed seconds of a run, plus a little metadata (policy,
shape, loss). It does not depend on the transport, so a run checkpointed on shared
memory resumes on Ray and vice versa. Writes are atomic: a temporary file in the same
folder is written and fsync'ed, then renamed over the path (``os.replace``), so a
reader sees the old checkpoint or the new one, never a torn one.
"""
from __future__ import annotations

import json
import os
import zipfile

import numpy as np

__all__ = ["save_checkpoint", "load_checkpoint", "CHECKPOINT_FORMAT"]

CHECKPOINT_FORMAT = 1


def save_checkpoint(path, *, weights, shard_versions, version, pushes, epochs, seconds,
                    meta):
    """Write a checkpoint atomically: a temporary file beside ``path`` is
    written and fsync'ed, then renamed over ``path`` (``os.replace``)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, weights=weights, shard_versions=shard_versions,
                     version=np.int64(version), pushes=np.asarray(pushes, np.int64),
                     epochs=np.asarray(epochs, np.int64), seconds=np.float64(seconds),
                     meta=np.array(json.dumps({"format": CHECKPOINT_FORMAT, **meta})))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:                                          # make the rename itself durable
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
    return path


def load_checkpoint(path) -> dict:
    """Read a checkpoint written by :func:`train`: a dict with weights,
    shard_versions, version, pushes, epochs, seconds and meta."""
    try:
        z = np.load(os.fspath(path), allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):           # (a .npy file: one array)
            raise ValueError("one array, not an archive of them")
        with z:
            d = {k: z[k] for k in z.files}
        meta = json.loads(str(d.pop("meta")))
    except FileNotFoundError:
        raise ValueError(f"resume: no checkpoint at {os.fspath(path)!r}") from None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        # numpy takes a file of unknown format for pickled data and suggests loading it
        # unsafely: a checkpoint is an archive of plain arrays, never pickles
        why = "not an archive of plain arrays" if "pickle" in str(e).lower() else str(e)
        raise ValueError(f"resume: {os.fspath(path)!r} is not a readable checkpoint "
                         f"({why}); give a file that ps.train(checkpoint=...) wrote") from None
    need = {"weights", "shard_versions", "version", "pushes", "epochs", "seconds"}
    if not need <= d.keys() or not isinstance(meta, dict) \
            or meta.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"resume: {os.fspath(path)!r} is not a checkpoint of format "
                         f"{CHECKPOINT_FORMAT} (has {sorted(d)})")
    why = _fault(d)
    if why:
        raise ValueError(f"resume: {os.fspath(path)!r} is not a valid checkpoint ({why}); "
                         "give a file that ps.train(checkpoint=...) wrote")
    d["version"], d["seconds"] = int(d["version"]), float(d["seconds"])
    d["meta"] = meta
    return d


def _fault(d) -> str | None:
    """What makes the arrays of a checkpoint inconsistent (None: nothing): a run
    resumed from it would fail late (a short epochs array) or carry nonsense (a NaN
    clock) otherwise."""
    def ints(a, ndim):
        return a.ndim == ndim and a.dtype.kind in "iu" and (a >= 0).all()
    w, sv = d["weights"], d["shard_versions"]
    if w.ndim != 1 or w.dtype.kind != "f" or w.size == 0:
        return f"weights of shape {w.shape} and dtype {w.dtype}, not a flat float vector"
    if not np.isfinite(w).all():
        return "weights hold NaN or inf"
    if not ints(d["version"], 0):
        return f"version {d['version'].tolist()!r} is not an int >= 0"
    # (a checkpoint taken while workers push reads the global version before the
    # shards, so a shard's version may be above it: no bound between them here)
    if not ints(sv, 1) or sv.size == 0:
        return "shard_versions are not ints >= 0, one per shard"
    if not ints(d["pushes"], 1) or not ints(d["epochs"], 1) \
            or d["pushes"].shape != d["epochs"].shape:
        return "pushes and epochs are not ints >= 0, one of each per worker"
    sec = d["seconds"]
    if sec.ndim != 0 or sec.dtype.kind != "f" or not np.isfinite(sec) or sec < 0:
        return f"seconds {sec.tolist()!r} is not a finite number >= 0"
    return None
