"""relaxed.conflict: how long to wait on a transactional conflict before aborting.

Concept. A transaction (the *requestor*) finds a data item held by another transaction (the
*holder*), which will release it after a remaining time ``T`` that nobody knows. Aborting at
once wastes work; waiting forever wastes time. Alistarh, Haider, Kübler and Nadiradze ("The
transactional conflict problem", SPAA 2018, pp. 383-392; arXiv:1804.00947) treat the length of
that delay as an online problem in the two ways real transactional systems resolve conflicts:

* **requestor aborts** (the requestor restarts itself): classic ski rental. Waiting ``t``
  costs ``t``; giving up after ``t`` costs ``t + B``, where ``B`` is the requestor's work so
  far. OPT = min(T, B). Optimal online policies: wait ``B`` then abort (ratio 2; Karlin,
  Manasse, Rudolph, Sleator 1988) and a random delay with density e^(t/B)/(B(e-1)) on [0, B]
  (ratio e/(e-1) ~ 1.582; Karlin, Manasse, McGeoch, Owicki, SODA 1990 / Algorithmica 1994).
* **requestor wins** (the holder is aborted): a new variant of ski rental. The model this
  module uses (its own statement of the problem; see docs/conflict.md): ``k``
  requestors stall while the holder, whose work so far is ``B``, keeps running. If it
  commits at ``T <= t`` the cost is ``k*T``; if it is aborted after the delay ``t`` it loses
  ``B + t`` and the requestors lost ``k*t``, so the cost is ``(k+1)*t + B``.
  OPT = min(k*T, B). Its optimal policies (proofs in docs/conflict.md):

  - deterministic: wait ``B/k`` then abort the holder, ratio ``2 + 1/k`` (3 for one
    requestor), optimal among deterministic policies;
  - randomized: delay with density proportional to (t + B)^(k-1) on [0, B/k] (uniform for
    k = 1), ratio ``1 / (1 - (k/(k+1))^k)`` (2 for k = 1, tending to e/(e-1) as k grows),
    optimal among randomized policies (a matching adversary distribution exists).

Baselines: abort at once, wait forever, and exponential backoff (poll the holder after
b, 2b, 4b, ... with b = B/(2^m - 1), give up at the m-th probe, i.e. at time B; a release is
noticed only at the next probe).

Units. ``B``, every delay, every holder time ``T`` and every cost are in one time unit of
your choosing (seconds, cycles, abstract units): the ratios do not depend on it.

Native description. Every policy reduces to three numbers, ``policy.native() == (kind, B,
extra)`` with the kind codes below, and :func:`draw_delay` turns them and one uniform ``u`` in
[0, 1) into a delay. The kind codes and the draw are defined once, in C
(``ext/relaxed/_conflict.pxd``, compiled into ``relaxed._conflict``): :func:`draw_delay` is
that compiled function, the simulator's Numba kernels and ``draw_delay_jit`` call it, and the
TL2 STM inlines it while waiting on a held write lock without the GIL. :func:`observe_release`,
:func:`conflict_cost` and :func:`offline_opt` are pure, branch-and-arithmetic only, never
raise, and have Numba twins (``observe_release_jit``, ...) which the simulator uses.

Example::

    import numpy as np
    from relaxed import conflict
    p = conflict.policy("randomized", B=2e-6)        # abort cost: 2 microseconds of work
    rng = np.random.default_rng(0)
    t = p.delay(rng)                                   # seconds to wait before aborting
    kind, B, extra = p.native()                        # nogil: draw_delay(kind, B, extra, u)
    r = conflict.simulate(conflict.policy("deterministic"), conflict.Adversarial(), seed=0)
    r.ratio                                            # 2.0: any holder slower than B
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import types
from numba.extending import register_jitable

from relaxed import _conflict as _native

__all__ = [
    "ABORT_NOW", "WAIT_FOREVER", "DETERMINISTIC", "RANDOMIZED", "EXP_BACKOFF",
    "RW_DETERMINISTIC", "RW_RANDOMIZED", "REQUESTOR_ABORTS", "REQUESTOR_WINS",
    "E_RATIO", "Policy", "policy", "draw_delay", "observe_release", "conflict_cost",
    "offline_opt", "draw_delay_jit", "observe_release_jit", "conflict_cost_jit",
    "offline_opt_jit", "rw_randomized_ratio", "rw_deterministic_ratio", "documented_ratio",
    "expected_cost", "expected_ratio", "Exponential", "Pareto", "Fixed", "Adversarial",
    "SimResult", "simulate", "competitive_table", "default_workloads", "DEFAULT_POLICIES",
    "DEFAULT_MODELS", "DEFAULT_BACKOFF_PROBES",
]

# ----------------------------------------------------------------------------- codes
#: policy kinds (``Policy.native()[0]``), defined with the draw in ext/relaxed/_conflict.pxd;
#: stable: nogil code switches on them and TL2 stores them in shared memory
ABORT_NOW = _native.ABORT_NOW                # delay 0
WAIT_FOREVER = _native.WAIT_FOREVER          # delay +inf
DETERMINISTIC = _native.DETERMINISTIC        # delay B (ski rental, ratio 2)
RANDOMIZED = _native.RANDOMIZED              # density e^(t/B)/(B(e-1)) on [0, B]
EXP_BACKOFF = _native.EXP_BACKOFF            # probes at b, 3b, 7b, ..., gives up at B
RW_DETERMINISTIC = _native.RW_DETERMINISTIC  # requestor wins: delay B/k; extra = k
RW_RANDOMIZED = _native.RW_RANDOMIZED        # requestor wins: density ~ (t+B)^(k-1) on [0, B/k]
_N_KINDS = _native.N_KINDS

#: cost models (``model=`` of the simulator)
REQUESTOR_ABORTS = 0
REQUESTOR_WINS = 1
_MODELS = {"requestor-aborts": REQUESTOR_ABORTS, "requestor-wins": REQUESTOR_WINS}
_MODEL_NAMES = {v: k for k, v in _MODELS.items()}

#: e/(e-1), the optimal randomized ratio of ski rental
E_RATIO = math.e / (math.e - 1.0)

_MAX_BACKOFF_PROBES = 30


# ----------------------------------------------------------------------------- portable kernels
# Scalars only, no allocation, no exceptions. Inputs are trusted (Policy validates them); an
# unknown kind falls back to aborting at once.
#
# The delay draw has one definition, in C: ext/relaxed/_conflict.pxd (compiled into
# relaxed._conflict). Python calls it as ``draw_delay``; the Numba kernels below call the same
# compiled function through its registered symbol (``_draw_delay_c``); TL2 (ext/_stm.pyx)
# inlines it in its nogil waits. The other kernels exist in this module only.

#: delay before giving up for ``(kind, B, extra)`` and a uniform ``u`` (the compiled draw)
draw_delay = _native.draw_delay

llvm.add_symbol(_native.DRAW_DELAY_SYMBOL, _native.draw_delay_address())
_draw_delay_c = types.ExternalFunction(
    _native.DRAW_DELAY_SYMBOL, types.float64(types.int64, types.float64, types.float64,
                                             types.float64))


@register_jitable
def observe_release(kind, B, extra, T):
    """Time at which the waiter notices a release that happens at ``T``.

    ``T`` for every kind that watches continuously; for EXP_BACKOFF the first probe at or
    after ``T`` (probes at b, 3b, 7b, ..., b(2^m - 1) = B with b = B/(2^m - 1), m = extra),
    or ``T`` itself when the release comes after the last probe (the waiter has given up)."""
    if kind != EXP_BACKOFF:
        return T
    m = int(extra)
    gap = B / (math.pow(2.0, m) - 1.0)
    t = gap
    for _ in range(1, m):
        if t >= T:
            return t
        gap = gap * 2.0
        t = t + gap
    if B >= T:
        return B                       # the m-th probe is at B exactly
    return T


@register_jitable
def conflict_cost(kind, B, extra, x, T, model, k):
    """Cost of one conflict: the policy gives up after ``x``, the holder releases at ``T``.

    requestor-aborts: o if o <= x else x + B, where o = observe_release(...) (o = T except
    for backoff). requestor-wins (k stalled requestors, B = the holder's work):
    k*o if o <= x else (k + 1)*x + B."""
    o = observe_release(kind, B, extra, T)
    if o <= x:                         # released, and noticed, before giving up
        if model == REQUESTOR_WINS:
            return k * o
        return o
    if model == REQUESTOR_WINS:        # holder aborted: it loses B + x, requestors k*x
        return (k + 1.0) * x + B
    return x + B                       # requestor aborted: it waited x and loses B


@register_jitable
def offline_opt(B, T, model, k):
    """Cost of the offline optimum, which knows ``T``: wait exactly T or abort at once."""
    if model == REQUESTOR_WINS:
        return min(k * T, B)
    return min(T, B)


@numba.njit(cache=True)
def draw_delay_jit(kind, B, extra, u):
    """:func:`draw_delay` from Numba code: a call of the same compiled function."""
    return _draw_delay_c(kind, B, extra, u)


observe_release_jit = numba.njit(cache=True)(observe_release)
conflict_cost_jit = numba.njit(cache=True)(conflict_cost)
offline_opt_jit = numba.njit(cache=True)(offline_opt)


@numba.njit(cache=True)
def _delays_kernel(kind, B, extra, u, out):
    for i in range(u.shape[0]):
        out[i] = _draw_delay_c(kind, B, extra, u[i])


@numba.njit(cache=True)
def _sim_kernel(kind, B, extra, model, k, T, u, cost, opt):
    """Per instance i: holder time T[i], uniform u[i] -> cost[i], opt[i]."""
    for i in range(T.shape[0]):
        x = _draw_delay_c(kind, B, extra, u[i])
        cost[i] = conflict_cost(kind, B, extra, x, T[i], model, k)
        opt[i] = offline_opt(B, T[i], model, k)


@numba.njit(cache=True)
def _grid_mc_kernel(kind, B, extra, model, k, Ts, u, out):
    """Monte Carlo mean cost at each fixed T in Ts, with the same uniforms u for every T."""
    n = u.shape[0]
    for j in range(Ts.shape[0]):
        s = 0.0
        for i in range(n):
            x = _draw_delay_c(kind, B, extra, u[i])
            s += conflict_cost(kind, B, extra, x, Ts[j], model, k)
        out[j] = s / n


@numba.njit(cache=True)
def _exact_kernel(kind, B, extra, model, k, Ts, nodes, weights, out):
    """E_u[cost] at each T by quadrature over u in [0, 1).

    With o = observe_release(T) the policy waits it out iff draw_delay(u) >= o, so (delays
    being nondecreasing in u) E = int_0^{u*} abort_cost(draw_delay(u)) du + (1 - u*) wait_cost,
    u* = P(delay < o) found by bisection; the first integral is smooth in u and taken by
    Gauss-Legendre (nodes, weights on [-1, 1])."""
    for j in range(Ts.shape[0]):
        T = Ts[j]
        o = observe_release(kind, B, extra, T)
        lo, hi = 0.0, 1.0
        if _draw_delay_c(kind, B, extra, 0.0) >= o:
            hi = 0.0
        elif _draw_delay_c(kind, B, extra, 1.0) < o:
            lo = 1.0
        else:
            for _ in range(64):
                mid = 0.5 * (lo + hi)
                if _draw_delay_c(kind, B, extra, mid) < o:
                    lo = mid
                else:
                    hi = mid
        ustar = lo
        wait_cost = k * o if model == REQUESTOR_WINS else o
        s = 0.0
        if ustar > 0.0:
            half = 0.5 * ustar
            for q in range(nodes.shape[0]):
                x = _draw_delay_c(kind, B, extra, half * (nodes[q] + 1.0))
                if model == REQUESTOR_WINS:
                    s += weights[q] * ((k + 1.0) * x + B)
                else:
                    s += weights[q] * (x + B)
            s *= half
        out[j] = s + (1.0 - ustar) * wait_cost


_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(64)


# ----------------------------------------------------------------------------- validation
def _number(name, value, rule="finite and > 0", fix="", integer=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number ({rule}), got {type(value).__name__} "
                        f"{value!r}{fix}")
    v = float(value)
    if integer and not (math.isfinite(v) and v == int(v)):
        raise ValueError(f"{name} must be an integer ({rule}), got {value!r}{fix}")
    return v


def _positive(name, value, fix=""):
    v = _number(name, value, fix=fix)
    if not (math.isfinite(v) and v > 0.0):
        raise ValueError(f"{name} must be finite and > 0, got {name}={value!r}{fix}")
    return v


def _model_code(model):
    if not isinstance(model, str):
        raise TypeError(f"model must be a string, one of {sorted(_MODELS)}, got "
                        f"{type(model).__name__} {model!r}")
    try:
        return _MODELS[model]
    except KeyError:
        raise ValueError(f"model must be one of {sorted(_MODELS)}, got {model!r}") from None


# ----------------------------------------------------------------------------- policies
_KIND_NAMES = {ABORT_NOW: "abort", WAIT_FOREVER: "wait", DETERMINISTIC: "deterministic",
               RANDOMIZED: "randomized", EXP_BACKOFF: "backoff",
               RW_DETERMINISTIC: "rw-deterministic", RW_RANDOMIZED: "rw-randomized"}
_SPECS = {"abort": ABORT_NOW, "abort-now": ABORT_NOW, "wait": WAIT_FOREVER,
          "wait-forever": WAIT_FOREVER, "deterministic": DETERMINISTIC,
          "randomized": RANDOMIZED, "backoff": EXP_BACKOFF, "exp-backoff": EXP_BACKOFF,
          "rw-deterministic": RW_DETERMINISTIC, "rw-randomized": RW_RANDOMIZED}
DEFAULT_BACKOFF_PROBES = 6


def rw_deterministic_ratio(k: float = 1.0) -> float:
    """Competitive ratio 2 + 1/k of waiting B/k in the requestor-wins model (optimal)."""
    return 2.0 + 1.0 / k


def rw_randomized_ratio(k: float = 1.0) -> float:
    """Competitive ratio 1/(1 - (k/(k+1))^k) of the optimal randomized requestor-wins policy
    (2 for k = 1; e/(e-1) in the limit k -> infinity)."""
    return 1.0 / (1.0 - (k / (k + 1.0)) ** k)


@dataclass(frozen=True)
class Policy:
    """An online delay policy: ``(kind, B, extra)``, validated. Build one with :func:`policy`.

    ``B`` is the abort cost in time units (the requestor's work so far under requestor-aborts,
    the holder's under requestor-wins); ``extra`` is k (stalled requestors) for the
    requestor-wins kinds, m (probes) for EXP_BACKOFF and 0 otherwise."""
    kind: int
    B: float = 1.0
    extra: float = 0.0

    def __post_init__(self):
        if isinstance(self.kind, bool) or not isinstance(self.kind, numbers.Integral):
            raise TypeError(f"kind must be an int code 0..{_N_KINDS - 1} (ABORT_NOW ... "
                            f"RW_RANDOMIZED), got {type(self.kind).__name__} {self.kind!r}; "
                            f"or build policies by name with relaxed.conflict.policy(spec)")
        if not 0 <= self.kind < _N_KINDS:
            raise ValueError(f"kind must be one of the codes 0..{_N_KINDS - 1}, got "
                             f"{self.kind}; use relaxed.conflict.policy(spec) with a spec in "
                             f"{sorted(_SPECS)}")
        B = _positive("B", self.B, "; B is the abort cost in time units, e.g. B=1.0 or the "
                                   "work done so far")
        extra = _number("extra", self.extra)
        if self.kind in (RW_DETERMINISTIC, RW_RANDOMIZED):
            if not (math.isfinite(extra) and extra > 0.0):
                raise ValueError(f"k (the number of stalled requestors, extra) must be finite "
                                 f"and > 0 for {_KIND_NAMES[self.kind]}, got {self.extra!r}; "
                                 f"pass e.g. k=1")
        elif self.kind == EXP_BACKOFF:
            if not math.isfinite(extra) or extra != int(extra) \
                    or not 1 <= extra <= _MAX_BACKOFF_PROBES:
                raise ValueError(f"m (the number of backoff probes, extra) must be an integer "
                                 f"in 1..{_MAX_BACKOFF_PROBES}, got {self.extra!r}; pass e.g. "
                                 f"m={DEFAULT_BACKOFF_PROBES}")
        elif extra != 0.0:
            raise ValueError(f"extra must be 0 for {_KIND_NAMES[self.kind]} (it has no "
                             f"parameter besides B), got {self.extra!r}")
        object.__setattr__(self, "kind", int(self.kind))
        object.__setattr__(self, "B", B)
        object.__setattr__(self, "extra", extra)

    @property
    def name(self) -> str:
        """Short name: the spec, with k or m when the kind has one."""
        base = _KIND_NAMES[self.kind]
        if self.kind in (RW_DETERMINISTIC, RW_RANDOMIZED):
            return f"{base}(k={self.extra:g})"
        if self.kind == EXP_BACKOFF:
            return f"{base}(m={int(self.extra)})"
        return base

    @property
    def home_model(self) -> str | None:
        """The cost model this policy is optimal for (None for the baselines)."""
        if self.kind in (DETERMINISTIC, RANDOMIZED):
            return "requestor-aborts"
        if self.kind in (RW_DETERMINISTIC, RW_RANDOMIZED):
            return "requestor-wins"
        return None

    @property
    def k(self) -> float | None:
        """Stalled requestors the requestor-wins kinds are tuned for (None otherwise)."""
        return self.extra if self.kind in (RW_DETERMINISTIC, RW_RANDOMIZED) else None

    def native(self) -> tuple[int, float, float]:
        """``(kind, B, extra)`` for :func:`draw_delay` in nogil code."""
        return (self.kind, self.B, self.extra)

    def delay(self, rng) -> float:
        """One delay, in the unit of ``B`` (``inf`` for wait-forever); ``rng`` is a
        ``numpy.random.Generator`` or anything with a ``random()`` method in [0, 1)."""
        if not hasattr(rng, "random"):
            raise TypeError(f"rng must be a numpy.random.Generator (or have a random() "
                            f"method), got {type(rng).__name__}; pass "
                            f"numpy.random.default_rng(seed)")
        return float(draw_delay(self.kind, self.B, self.extra, float(rng.random())))

    def delays(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` delays at once (Numba kernel)."""
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got "
                            f"{type(rng).__name__}; pass numpy.random.default_rng(seed)")
        n = int(_number("n", n, rule="an integer >= 1", integer=True))
        if n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        u = rng.random(n)
        out = np.empty(n)
        _delays_kernel(self.kind, self.B, self.extra, u, out)
        return out

    def __repr__(self):
        return f"Policy({self.name}, B={self.B:g})"


def policy(spec, *, B: float = 1.0, k: float | None = None, m: int | None = None) -> Policy:
    """Build a policy by name.

    spec: ``"abort"`` (``"abort-now"``), ``"wait"`` (``"wait-forever"``), ``"deterministic"``,
    ``"randomized"``, ``"backoff"`` (``"exp-backoff"``), ``"rw-deterministic"``,
    ``"rw-randomized"``; a :class:`Policy` is returned unchanged.
    B: abort cost (time units, finite > 0). k: stalled requestors, requestor-wins kinds only
    (default 1). m: probes of ``"backoff"`` only (default 6)."""
    if isinstance(spec, Policy):
        if k is not None or m is not None:
            raise ValueError("k and m apply when building a policy from a name; "
                             f"got a Policy ({spec!r}) with k={k!r}, m={m!r}")
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"spec must be a policy name (one of {sorted(_SPECS)}) or a Policy, "
                        f"got {type(spec).__name__} {spec!r}")
    key = spec.strip().lower().replace("_", "-")
    if key not in _SPECS:
        raise ValueError(f"spec must be one of {sorted(_SPECS)}, got {spec!r}")
    kind = _SPECS[key]
    B = _positive("B", B, "; B is the abort cost in time units, e.g. B=1.0")
    if kind in (RW_DETERMINISTIC, RW_RANDOMIZED):
        if m is not None:
            raise ValueError(f"m (backoff probes) does not apply to {key!r}; drop m=")
        kk = 1.0 if k is None else _positive("k", k, " (the number of requestors stalled "
                                                      "on the holder), e.g. k=1")
        return Policy(kind, B, kk)
    if k is not None:
        raise ValueError(f"k (stalled requestors) applies only to 'rw-deterministic' and "
                         f"'rw-randomized', not {key!r}; drop k= (the simulator takes the "
                         f"model's k)")
    if kind == EXP_BACKOFF:
        mm = DEFAULT_BACKOFF_PROBES if m is None else m
        _number("m", mm, rule=f"an integer in 1..{_MAX_BACKOFF_PROBES}", integer=True)
        return Policy(kind, B, float(mm))
    if m is not None:
        raise ValueError(f"m (backoff probes) applies only to 'backoff', not {key!r}; drop m=")
    return Policy(kind, B, 0.0)


def _det_ratio(x, B, model, k):
    """Worst-case ratio of giving up after the fixed delay x (adversary: T = x+ or T = x)."""
    if model == REQUESTOR_WINS:
        return max(((k + 1.0) * x + B) / min(k * x, B), k * x / B, 1.0)
    return max((x + B) / min(x, B), x / B, 1.0)


def documented_ratio(p, model: str | None = None, k: float | None = None) -> float | None:
    """The closed-form competitive ratio of ``p`` in ``model`` (default: its home model).

    inf for the baselines (abort: T -> 0; wait: T -> inf; backoff: T -> 0 before the first
    probe); the fixed-delay kinds in either model; the randomized kinds in their home model
    (the tuned k). None where no closed form is documented (use :func:`expected_ratio`)."""
    p = policy(p)
    model = model or p.home_model or "requestor-aborts"
    mc = _model_code(model)
    kk = _model_k(p, mc, k)
    if p.kind in (ABORT_NOW, WAIT_FOREVER, EXP_BACKOFF):
        return math.inf
    if p.kind in (DETERMINISTIC, RW_DETERMINISTIC):
        return _det_ratio(draw_delay(p.kind, p.B, p.extra, 0.0), p.B, mc, kk)
    if p.kind == RANDOMIZED and mc == REQUESTOR_ABORTS:
        return E_RATIO
    if p.kind == RW_RANDOMIZED and mc == REQUESTOR_WINS and kk == p.extra:
        return rw_randomized_ratio(kk)
    return None


def _model_k(p, mc, k):
    if mc == REQUESTOR_ABORTS:
        if k is not None and _number("k", k, fix=" (the number of stalled requestors)") != 1.0:
            raise ValueError(f"k (stalled requestors) is a parameter of the requestor-wins "
                             f"model only, got k={k!r} with model='requestor-aborts'; drop k=")
        return 1.0
    if k is None:
        return p.k if p.k is not None else 1.0
    return _positive("k", k, " (the number of requestors stalled on the holder), e.g. k=1")


# ----------------------------------------------------------------------------- exact expectations
def expected_cost(p, T, model: str = "requestor-aborts", k: float | None = None):
    """E[cost] of policy ``p`` over its own randomness when the holder releases at ``T``.

    Exact up to quadrature error (~1e-12 relative): bisection for the probability of giving
    up before the release, Gauss-Legendre for the cost of giving up. ``T`` scalar or array
    (time units, > 0). ``k`` (requestor-wins only) defaults to the policy's k, else 1."""
    p = policy(p)
    mc = _model_code(model)
    kk = _model_k(p, mc, k)
    Ts = np.asarray(T, dtype=np.float64)
    if not (np.all(np.isfinite(Ts)) and np.all(Ts > 0)):
        raise ValueError(f"T (holder times) must be finite and > 0, got {T!r}")
    out = np.empty(Ts.size)
    _exact_kernel(p.kind, p.B, p.extra, mc, kk, Ts.reshape(-1), _GL_NODES, _GL_WEIGHTS, out)
    return float(out[0]) if Ts.ndim == 0 else out.reshape(Ts.shape)     # (any shape of T)


def expected_ratio(p, T, model: str = "requestor-aborts", k: float | None = None):
    """E[cost(T)] / OPT(T) (see :func:`expected_cost`)."""
    p = policy(p)
    mc = _model_code(model)
    kk = _model_k(p, mc, k)
    Ts = np.asarray(T, dtype=np.float64)
    opt = np.minimum(kk * Ts, p.B) if mc == REQUESTOR_WINS else np.minimum(Ts, p.B)
    return expected_cost(p, T, model, k) / opt


# ----------------------------------------------------------------------------- workloads
@dataclass(frozen=True)
class Exponential:
    """Holder times T ~ Exponential with the given mean (time units)."""
    mean: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "mean", _positive("mean", self.mean, " (time units)"))

    @property
    def name(self):
        return f"exponential(mean={self.mean:g})"

    def sample(self, rng, n):
        return rng.exponential(self.mean, n)


@dataclass(frozen=True)
class Pareto:
    """Heavy-tailed holder times: Pareto type II (Lomax) on [0, inf),
    P(T > t) = (1 + t/scale)^(-alpha); mean scale/(alpha-1) for alpha > 1, infinite variance
    for alpha <= 2 (so wait-forever's mean cost converges slowly or not at all)."""
    alpha: float = 1.5
    scale: float = 0.5

    def __post_init__(self):
        object.__setattr__(self, "alpha", _positive("alpha", self.alpha, " (the tail index)"))
        object.__setattr__(self, "scale", _positive("scale", self.scale, " (time units)"))

    @property
    def name(self):
        return f"pareto(alpha={self.alpha:g}, scale={self.scale:g})"

    def sample(self, rng, n):
        return self.scale * rng.pareto(self.alpha, n)   # numpy's pareto is Lomax


@dataclass(frozen=True)
class Fixed:
    """Every holder releases at the same T (time units)."""
    T: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "T", _positive("T", self.T, " (the holder time)"))

    @property
    def name(self):
        return f"fixed(T={self.T:g})"

    def sample(self, rng, n):
        return np.full(n, self.T)


@dataclass(frozen=True)
class Adversarial:
    """The worst holder time for the policy under test.

    T ranges over ``points`` log-spaced values in [lo*B, hi*B] plus the policy's critical
    points (just after a fixed delay, each backoff probe, B and B/k). For each the exact
    E[cost(T)]/OPT(T) is computed (:func:`expected_cost`) and a Monte Carlo estimate from
    ``mc_per_point`` stratified uniforms shared by all T (its relative error grows like
    B/(T*mc_per_point) at small T, where giving up early is a rare, costly event); the
    simulator then re-estimates at the worst T (by the exact ratio; the largest T among ties)
    with ``n`` fresh iid samples. A supremum over a finite grid: unbounded ratios show as
    large finite ones (e.g. abort-now: 1/lo)."""
    lo: float = 1e-3
    hi: float = 10.0
    points: int = 241
    mc_per_point: int = 20000

    def __post_init__(self):
        lo = _positive("lo", self.lo, " (smallest T, in units of B)")
        hi = _positive("hi", self.hi, " (largest T, in units of B)")
        if not lo < hi:
            raise ValueError(f"lo must be < hi, got lo={lo!r}, hi={hi!r}")
        pts = _number("points", self.points, rule="an integer >= 2", integer=True)
        if pts < 2:
            raise ValueError(f"points must be an integer >= 2, got {self.points!r}")
        mcp = _number("mc_per_point", self.mc_per_point, rule="an integer >= 1", integer=True)
        if mcp < 1:
            raise ValueError(f"mc_per_point must be an integer >= 1, got {self.mc_per_point!r}")
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)
        object.__setattr__(self, "points", int(pts))
        object.__setattr__(self, "mc_per_point", int(mcp))

    @property
    def name(self):
        return "adversarial"

    def grid(self, p: Policy, k: float) -> np.ndarray:
        B = p.B
        crit = [B, B / k]
        if p.kind in (DETERMINISTIC, RW_DETERMINISTIC):
            crit.append(draw_delay(p.kind, B, p.extra, 0.0))
        if p.kind == EXP_BACKOFF:
            m = int(p.extra)
            crit += list(B * (2.0 ** np.arange(1, m + 1) - 1.0) / (2.0 ** m - 1.0))
        crit = np.asarray(crit)
        Ts = np.concatenate([np.geomspace(self.lo * B, self.hi * B, self.points),
                             crit, crit * (1.0 + 1e-9)])
        Ts = Ts[(Ts >= self.lo * B) & (Ts <= self.hi * B * (1 + 1e-8))]
        return np.unique(Ts)


_WORKLOAD_SPECS = {"exponential": Exponential, "pareto": Pareto, "adversarial": Adversarial}


def _workload(w):
    if isinstance(w, (Exponential, Pareto, Fixed, Adversarial)):
        return w
    if isinstance(w, str) and w in _WORKLOAD_SPECS:
        return _WORKLOAD_SPECS[w]()
    raise TypeError(f"workload must be Exponential(...), Pareto(...), Fixed(...), "
                    f"Adversarial(...) or one of {sorted(_WORKLOAD_SPECS)}, got {w!r}")


# ----------------------------------------------------------------------------- simulator
@dataclass(frozen=True)
class SimResult:
    """Outcome of :func:`simulate`. ``ratio`` = mean_cost / mean_opt (ratio of means; for
    the adversarial workload, Monte Carlo at ``worst_T``); ``mean_ratio`` and ``max_ratio``
    summarize the per-instance cost/OPT. Adversarial workload only: ``exact_ratio`` is the
    quadrature supremum over the grid, attained at ``worst_T`` (the largest such grid T),
    and ``mc_sup`` the Monte Carlo supremum (biased up by taking a max of noisy estimates)."""
    policy: str
    workload: str
    model: str
    k: float
    n: int
    mean_cost: float
    mean_opt: float
    ratio: float
    mean_ratio: float
    max_ratio: float
    exact_ratio: float | None = None
    worst_T: float | None = None
    mc_sup: float | None = None


def simulate(p, workload, *, n: int = 200_000, seed: int = 0, model: str = "requestor-aborts",
             k: float | None = None) -> SimResult:
    """Empirical competitive ratio of policy ``p`` on ``n`` conflicts drawn from ``workload``.

    The abort cost of every conflict is ``p.B`` (online policies know B, as in ski rental).
    ``model``: ``"requestor-aborts"`` or ``"requestor-wins"``; ``k`` (requestor-wins only)
    defaults to the policy's own k, else 1. Holder times are drawn before the policy's
    uniforms, so policies simulated with one seed face the same holder times."""
    p = policy(p)
    w = _workload(workload)
    mc = _model_code(model)
    kk = _model_k(p, mc, k)
    n = int(_number("n", n, rule="an integer >= 1", integer=True))
    if n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    if seed < 0:                                  # (numpy's "expected non-negative integer")
        raise ValueError(f"seed must be an int >= 0, got {seed}")
    rng = np.random.default_rng(seed)
    extra = {}
    if isinstance(w, Adversarial):
        Ts = w.grid(p, kk)
        ex = np.empty_like(Ts)
        _exact_kernel(p.kind, p.B, p.extra, mc, kk, Ts, _GL_NODES, _GL_WEIGHTS, ex)
        opt_grid = np.minimum(kk * Ts, p.B) if mc == REQUESTOR_WINS else np.minimum(Ts, p.B)
        mcg = np.empty_like(Ts)
        m = w.mc_per_point                           # stratified: one uniform per 1/m slice
        _grid_mc_kernel(p.kind, p.B, p.extra, mc, kk, Ts, (np.arange(m) + rng.random(m)) / m,
                        mcg)
        ratios = ex / opt_grid
        # ties (an equalizing policy has the same ratio at every T, up to ~1e-13): take the
        # largest tied T, where Monte Carlo is most precise (at T << B a give-up is rare)
        j = int(np.flatnonzero(ratios >= ratios.max() * (1.0 - 1e-9))[-1])
        extra = dict(exact_ratio=float(ex[j] / opt_grid[j]), worst_T=float(Ts[j]),
                     mc_sup=float(np.max(mcg / opt_grid)))
        T = np.full(n, Ts[j])
    else:
        T = w.sample(rng, n)
        T = np.maximum(T, np.finfo(float).tiny)      # T = 0 has probability 0; keep OPT > 0
    u = rng.random(n)
    cost = np.empty(n)
    opt = np.empty(n)
    _sim_kernel(p.kind, p.B, p.extra, mc, kk, T, u, cost, opt)
    r = cost / opt
    return SimResult(policy=p.name, workload=w.name, model=_MODEL_NAMES[mc], k=kk, n=n,
                     mean_cost=float(cost.mean()), mean_opt=float(opt.mean()),
                     ratio=float(cost.mean() / opt.mean()), mean_ratio=float(r.mean()),
                     max_ratio=float(r.max()), **extra)


DEFAULT_POLICIES = ("abort", "wait", "backoff", "deterministic", "randomized",
                    "rw-deterministic", "rw-randomized")
DEFAULT_MODELS = (("requestor-aborts", None), ("requestor-wins", 1.0), ("requestor-wins", 4.0))


def default_workloads(B: float = 1.0) -> tuple:
    """Exponential with mean B/2 and 2B, Lomax(alpha=1.5) with mean B, adversarial."""
    return (Exponential(0.5 * B), Exponential(2.0 * B), Pareto(1.5, 0.5 * B), Adversarial())


def competitive_table(policies=DEFAULT_POLICIES, workloads=None, models=DEFAULT_MODELS, *,
                      B: float = 1.0, n: int = 200_000, seed: int = 0) -> list[dict]:
    """Every policy on every workload under every model: a list of rows
    ``{policy, workload, model, k, ratio, exact, worst_T, documented, mean_ratio, max_ratio}``.

    ``policies``: names (built with ``B`` and, for the requestor-wins kinds, the model's k,
    so each row shows the policy tuned for that model) or :class:`Policy` objects (used as
    they are). ``models``: pairs ``(model, k)``; k is None for requestor-aborts. All policies
    of one (workload, model) share the holder times (same seed)."""
    workloads = default_workloads(B) if workloads is None else tuple(workloads)
    rows = []
    for pair in models:
        try:
            model, k = pair
        except (TypeError, ValueError):
            raise ValueError(f"models: expected (model, k) pairs, e.g. ('requestor-wins', 4.0) "
                             f"or ('requestor-aborts', None), got {pair!r}") from None
        mc = _model_code(model)
        for wi, w in enumerate(workloads):
            w = _workload(w)
            for spec in policies:
                if isinstance(spec, Policy):
                    p = spec
                elif str(spec).strip().lower().replace("_", "-").startswith("rw-"):
                    # (spelled as policy() reads names)
                    p = policy(spec, B=B, k=(1.0 if k is None else k))
                else:
                    p = policy(spec, B=B)
                r = simulate(p, w, n=n, seed=seed + wi, model=model, k=k)
                doc = documented_ratio(p, model, r.k if mc == REQUESTOR_WINS else None)
                rows.append({"policy": r.policy, "workload": r.workload, "model": r.model,
                             "k": r.k, "ratio": r.ratio, "exact": r.exact_ratio,
                             "worst_T": r.worst_T, "mc_sup": r.mc_sup, "documented": doc,
                             "mean_ratio": r.mean_ratio, "max_ratio": r.max_ratio})
    return rows
