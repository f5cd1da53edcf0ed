# cython: language_level=3, cdivision=True, embedsignature=True
"""The compiled delay draw of relaxed.conflict (compiled core).

The kind codes, the constant e - 1 and the inverse CDFs are defined once, in
ext/relaxed/_conflict.pxd. This module hands that definition to Python: the codes as
ints, :func:`draw_delay` for Python callers, and the address of a C entry point
that the Numba kernels of relaxed.conflict call, so that the simulator, the
parameter server's shard-lock waits and TL2's nogil waits (which cimports the
.pxd) all draw with the same code.
"""
from libc.stdint cimport int64_t

ABORT_NOW = POL_ABORT_NOW
WAIT_FOREVER = POL_WAIT_FOREVER
DETERMINISTIC = POL_DETERMINISTIC
RANDOMIZED = POL_RANDOMIZED
EXP_BACKOFF = POL_EXP_BACKOFF
RW_DETERMINISTIC = POL_RW_DETERMINISTIC
RW_RANDOMIZED = POL_RW_RANDOMIZED
N_KINDS = POL_N_KINDS

#: the symbol under which relaxed.conflict registers draw_delay_address() with Numba
DRAW_DELAY_SYMBOL = "relaxed_conflict_draw_delay"


def draw_delay(int64_t kind, double B, double extra, double u):
    """Delay before giving up (same unit as ``B``) for policy ``(kind, B, extra)``.

    ``u`` is uniform in [0, 1); every kind is an inverse CDF, nondecreasing in ``u``
    (deterministic kinds ignore it). An unknown kind returns 0.0 (abort at once)."""
    return draw_delay_nogil(kind, B, extra, u)


cdef double _draw_delay_entry(int64_t kind, double B, double extra,
                              double u) noexcept nogil:
    return draw_delay_nogil(kind, B, extra, u)


def draw_delay_address():
    """Address of ``double f(int64_t kind, double B, double extra, double u)``, the C
    entry point of :func:`draw_delay` (for Numba, through ``DRAW_DELAY_SYMBOL``)."""
    return <size_t>&_draw_delay_entry
