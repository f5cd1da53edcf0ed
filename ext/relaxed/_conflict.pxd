# The one definition of the conflict-policy delay draw: the policy kind codes, the
# constant e - 1 and the inverse CDFs. Every user takes it from here:
#   ext/_conflict.pyx    compiles it into relaxed._conflict (the Python-callable
#                        draw_delay, the codes as ints, and the C address that the
#                        Numba kernels of relaxed/conflict.py call);
#   ext/_stm.pyx         cimports it for TL2's nogil waits on a held stripe.
# The model behind each kind (ski rental, requestor wins, backoff) is explained in
# the docstring of relaxed/conflict.py.
from libc.stdint cimport int64_t
from libc.math cimport log1p, pow, INFINITY, M_E

# Policy kinds, Policy.native()[0]. Stored in shared-memory headers (TL2) and
# switched on by nogil code: append new kinds, never renumber.
cdef enum:
    POL_ABORT_NOW = 0          # delay 0
    POL_WAIT_FOREVER = 1       # delay +inf
    POL_DETERMINISTIC = 2      # delay B (ski rental, ratio 2)
    POL_RANDOMIZED = 3         # density e^(t/B)/(B(e-1)) on [0, B] (ratio e/(e-1))
    POL_EXP_BACKOFF = 4        # probes at b, 3b, 7b, ..., gives up at B; extra = m probes
    POL_RW_DETERMINISTIC = 5   # requestor wins: delay B/k; extra = k
    POL_RW_RANDOMIZED = 6      # requestor wins: density ~ (t+B)^(k-1) on [0, B/k]; extra = k
    POL_N_KINDS = 7


cdef inline double draw_delay_nogil(int64_t kind, double B, double extra,
                                    double u) noexcept nogil:
    """Delay before giving up (same unit as B) for policy (kind, B, extra).

    u is uniform in [0, 1); every kind is an inverse CDF, nondecreasing in u
    (deterministic kinds ignore it). Scalars only, no allocation, never fails:
    inputs are trusted (relaxed.conflict.Policy validates them) and an unknown
    kind returns 0.0 (abort at once)."""
    cdef double g
    if kind == POL_WAIT_FOREVER:
        return INFINITY
    if kind == POL_DETERMINISTIC:
        return B
    if kind == POL_RANDOMIZED:
        # F(t) = (e^(t/B) - 1)/(e - 1)  =>  t = B ln(1 + u(e - 1))
        return B * log1p(u * (M_E - 1.0))
    if kind == POL_EXP_BACKOFF:
        return B                       # the m-th probe (relaxed.conflict.observe_release)
    if kind == POL_RW_DETERMINISTIC:
        return B / extra
    if kind == POL_RW_RANDOMIZED:
        # F(t) = ((1 + t/B)^k - 1) / ((1 + 1/k)^k - 1)  =>  t = B((1 + u g)^(1/k) - 1)
        g = pow(1.0 + 1.0 / extra, extra) - 1.0
        return B * (pow(1.0 + u * g, 1.0 / extra) - 1.0)
    return 0.0                         # POL_ABORT_NOW and unknown kinds
