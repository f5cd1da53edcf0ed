"""Numba intrinsics: a software prefetch (LLVM's ``llvm.prefetch``), the atomics of
a spinlock and of work claiming, word atomics at an offset with the orderings a
cross-process protocol states (acquire loads, release stores, acq_rel add and
compare-and-swap: the shared-memory collectives), the padding of shared words
(``LINE_WORDS``), and the same word atomics callable from Python (``fetch_add_py``,
``cas_py``, ``store_release_py``: compiled once, for the parameter server's and the
partitions' counters and locks). The kit's one home for atomics.

SGD visits rows in a shuffled order, so every row starts with a cache miss and
the epoch is bound by memory latency, not by arithmetic. Asking for the row a
few samples ahead overlaps those misses. A prefetch is only a hint: it never
faults and changes no result.
"""
import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from relaxed._base import CACHE_LINE

#: int64 words per padded slot: a word that one worker writes and others read (a
#: progress count, a lock, a version counter) gets a cache line of its own, as the
#: compiled core pads its counters (``RELAXED_CACHE_LINE`` at build time, in bytes).
#: Numba kernels compiled with ``cache=True`` keep a module global's value in their
#: on-disk cache, which a rebuild of the core does not invalidate: kernels take the
#: stride from the shape of the arrays they get, never from this constant.
LINE_WORDS = CACHE_LINE // 8


def read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (no copy). Numba compiles a kernel once per argument
    type, and a read-only array is a type of its own (at some seconds a compile):
    callers hand kernels views of one kind, whatever the user's arrays are (a memory
    map, a copy from joblib or Ray's object store), so that one compile serves all."""
    v = a.view()
    v.flags.writeable = False
    return v


def read_only_fields(t):
    """The named tuple ``t`` with each array field a read-only view (see ``read_only``),
    other fields as they are: what a kernel entry takes, whether the arrays are the
    caller's or arrived writeable in a worker process (shared memory)."""
    return type(t)(*(read_only(a) if isinstance(a, np.ndarray) else a for a in t))


#: rows requested ahead of the one being processed
DISTANCE = 4


def _prefetch_intrinsic(locality, doc):
    @intrinsic
    def _prefetch(typingctx, arr, offset):
        if not isinstance(arr, types.Array) or not isinstance(offset, types.Integer):
            return None
        sig = types.void(arr, offset)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = builder.gep(ary.data, [args[1]])
            i8p = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
            builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0),
                              ir.Constant(i32, locality), ir.Constant(i32, 1)])
            return context.get_dummy_value()
        return sig, codegen
    _prefetch.__doc__ = doc
    return _prefetch


prefetch = _prefetch_intrinsic(3, """Hint the CPU to load the cache line holding arr's flat
    element ``offset`` (for reading, high locality: x86 prefetcht0, into L1).
    arr: any contiguous array; offset: an integer.""")

prefetch_once = _prefetch_intrinsic(1, """As ``prefetch``, for data read once (low locality:
    x86 prefetcht2, which leaves L1 to the weights). The shuffled rows of an SGD epoch
    are read once per epoch, while the weights they touch are read again and again:
    keeping the rows out of L1 keeps the weights in it."""
)


@intrinsic
def cas_acquire(typingctx, arr, expected, desired):
    """Atomic compare-and-swap of arr[0] (int64): True if it held ``expected`` and now
    holds ``desired`` (acquire ordering on success)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
        return None
    sig = types.boolean(arr, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        res = builder.cmpxchg(ary.data, args[1], args[2], "acquire", "monotonic")
        return builder.extract_value(res, 1)
    return sig, codegen


@intrinsic
def store_release(typingctx, arr, value):
    """Atomic store of ``value`` into arr[0] (int64) with release ordering."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
        return None
    sig = types.void(arr, types.int64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        builder.store_atomic(args[1], ary.data, "release", 8)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def fetch_add(typingctx, arr, value):
    """Atomic arr[0] += value (int64, relaxed ordering); returns the old value."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
        return None
    sig = types.int64(arr, types.int64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.atomic_rmw("add", ary.data, args[1], "monotonic")
    return sig, codegen


@intrinsic
def claim_add(typingctx, arr, offset, value):
    """Atomic arr.flat[offset] += value (int64) with acquire ordering; returns the old
    value. For claiming work from a cursor that its owner published with a release
    store: the claimer then sees everything the owner wrote before that store."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64
            and isinstance(offset, types.Integer)):
        return None
    sig = types.int64(arr, offset, types.int64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        return builder.atomic_rmw("add", ptr, args[2], "acquire")
    return sig, codegen


@intrinsic
def load_relaxed(typingctx, arr, offset):
    """Atomic (relaxed) load of arr.flat[offset] (int64): a fresh read of a word that
    other threads write, which the compiler may not hoist out of a loop."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64
            and isinstance(offset, types.Integer)):
        return None
    sig = types.int64(arr, offset)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        return builder.load_atomic(ptr, "monotonic", 8)
    return sig, codegen


# ---- word atomics at an offset, with the orderings of a protocol ---------------------
def _ptr(context, builder, aryty, ary, off):
    a = context.make_array(aryty)(context, builder, ary)
    return builder.gep(a.data, [off])


def _ok(arr, off):
    return (isinstance(arr, types.Array) and arr.dtype == types.int64
            and isinstance(off, types.Integer))


@intrinsic
def load_acquire(typingctx, arr, off):
    """arr.flat[off] (int64), acquire."""
    if not _ok(arr, off):
        return None

    def codegen(context, builder, sig, args):
        return builder.load_atomic(_ptr(context, builder, sig.args[0], args[0], args[1]),
                                   "acquire", 8)
    return types.int64(arr, off), codegen


@intrinsic
def store_release_at(typingctx, arr, off, v):
    """arr.flat[off] = v (int64), release."""
    if not _ok(arr, off):
        return None

    def codegen(context, builder, sig, args):
        builder.store_atomic(args[2], _ptr(context, builder, sig.args[0], args[0], args[1]),
                             "release", 8)
        return context.get_dummy_value()
    return types.void(arr, off, types.int64), codegen


@intrinsic
def add_acq_rel(typingctx, arr, off, v):
    """Atomic arr.flat[off] += v (int64), acq_rel; returns the old value."""
    if not _ok(arr, off):
        return None

    def codegen(context, builder, sig, args):
        return builder.atomic_rmw("add", _ptr(context, builder, sig.args[0], args[0],
                                              args[1]), args[2], "acq_rel")
    return types.int64(arr, off, types.int64), codegen


@intrinsic
def cas_acq_rel(typingctx, arr, off, expected, desired):
    """Atomic CAS of arr.flat[off] (int64), acq_rel; True if it swapped."""
    if not _ok(arr, off):
        return None

    def codegen(context, builder, sig, args):
        res = builder.cmpxchg(_ptr(context, builder, sig.args[0], args[0], args[1]),
                              args[2], args[3], "acq_rel", "acquire")
        return builder.extract_value(res, 1)
    return types.boolean(arr, off, types.int64, types.int64), codegen


# ---- the same atomics, callable from Python ----------------------------------------------
@njit(cache=True, nogil=True)
def _fetch_add_at(arr, i, v):
    return fetch_add(arr[i:i + 1], v)


@njit(cache=True, nogil=True)
def _cas_at(arr, expected, desired):
    return cas_acquire(arr, expected, desired)


@njit(cache=True, nogil=True)
def _store_at(arr, v):
    store_release(arr, v)


@njit(cache=True, nogil=True)
def load_acquire_py(arr, off):
    """arr.flat[off] (int64), acquire, from Python (the offset atomics' callable twins,
    for the control words of the shm collectives)."""
    return load_acquire(arr, off)


@njit(cache=True, nogil=True)
def store_release_at_py(arr, off, v):
    """arr.flat[off] = v (int64), release, from Python."""
    store_release_at(arr, off, v)


@njit(cache=True, nogil=True)
def cas_acq_rel_py(arr, off, expected, desired):
    """Atomic CAS of arr.flat[off] (int64), acq_rel, from Python; True if it swapped."""
    return cas_acq_rel(arr, off, expected, desired)


def fetch_add_py(arr, i, v) -> int:
    """Atomic arr[i] += v (int64 array, relaxed) from Python; returns the old value."""
    return int(_fetch_add_at(arr, i, v))


def cas_py(arr, expected, desired) -> bool:
    """Atomic compare-and-swap of arr[0] (int64 array, acquire on success) from Python:
    True if it held ``expected`` and now holds ``desired``."""
    return bool(_cas_at(arr, expected, desired))


def store_release_py(arr, v) -> None:
    """arr[0] = v (int64 array) with release order, from Python."""
    _store_at(arr, v)
