"""relaxed.conflict: delay policies on transactional conflicts, against independent oracles.

Oracles: closed forms written out here, scipy.integrate.quad over the densities (never the
module's quadrature), scipy.stats.kstest against analytic CDFs, and a naive per-instance
Python loop with its own inverse CDFs and cost rules. Exact properties are asserted exactly
(to float rounding); statistical ones against a stated bound with a fixed seed.
"""
from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from scipy import integrate, stats

from relaxed import conflict as C

E_OVER_E1 = math.e / (math.e - 1.0)
ALL_SPECS = ("abort", "wait", "backoff", "deterministic", "randomized", "rw-deterministic",
             "rw-randomized")
RA, RW = "requestor-aborts", "requestor-wins"


def c_rw(k):
    """Optimal randomized requestor-wins ratio (docs/conflict.md): 1/(1 - (k/(k+1))^k)."""
    return 1.0 / (1.0 - (k / (k + 1.0)) ** k)


# ----------------------------------------------------------------------------- oracles
def ski_density(t, B):
    return math.exp(t / B) / (B * (math.e - 1.0)) if 0.0 <= t <= B else 0.0


def rw_density(t, B, k):
    """(t + B)^(k-1) on [0, B/k], normalized here by quad (independent of the module)."""
    return (t + B) ** (k - 1.0) if 0.0 <= t <= B / k else 0.0


def quad_expected_cost(density, support_end, T, model, B, k=1.0):
    """E[cost(T)] = int_0^min(T,end) abort_cost(x) p(x) dx + wait_cost(T) P(x >= T)."""
    Z = integrate.quad(density, 0.0, support_end)[0]
    a = min(T, support_end)
    if model == RA:
        give_up = integrate.quad(lambda x: (x + B) * density(x), 0.0, a)[0] / Z
        wait = T
    else:
        give_up = integrate.quad(lambda x: ((k + 1.0) * x + B) * density(x), 0.0, a)[0] / Z
        wait = k * T
    p_give_up = integrate.quad(density, 0.0, a)[0] / Z
    return give_up + (1.0 - p_give_up) * wait


def naive_cost(spec, B, extra, x, T, model, k):
    """Per-instance cost, written independently of relaxed.conflict."""
    if spec == "backoff":
        m = int(extra)
        probes = [B * (2.0 ** j - 1.0) / (2.0 ** m - 1.0) for j in range(1, m + 1)]
        seen = next((p for p in probes if p >= T), None)
        o = T if seen is None else seen
    else:
        o = T
    waited_out = o <= x
    if model == RA:
        return o if waited_out else x + B
    return k * o if waited_out else (k + 1.0) * x + B


def naive_delay(spec, B, extra, u):
    if spec == "abort":
        return 0.0
    if spec == "wait":
        return math.inf
    if spec in ("deterministic", "backoff"):
        return B
    if spec == "randomized":
        return B * math.log(1.0 + u * (math.e - 1.0))
    if spec == "rw-deterministic":
        return B / extra
    if spec == "rw-randomized":
        k = extra
        g = (1.0 + 1.0 / k) ** k - 1.0
        return B * ((1.0 + u * g) ** (1.0 / k) - 1.0)
    raise AssertionError(spec)


# ----------------------------------------------------------------------------- requestor aborts
@pytest.mark.parametrize("workload", [C.Exponential(0.3), C.Exponential(3.0),
                                      C.Pareto(1.5, 0.5), C.Pareto(3.0, 2.0), C.Fixed(0.7),
                                      C.Fixed(1.0 + 1e-9), C.Adversarial()])
def test_deterministic_at_most_two_on_every_workload(workload):
    r = C.simulate(C.policy("deterministic", B=1.0), workload, n=50_000, seed=1)
    assert r.ratio <= 2.0 + 1e-12, f"ratio of means {r.ratio} exceeds 2"
    assert r.max_ratio <= 2.0 + 1e-12, f"per-instance ratio {r.max_ratio} exceeds 2"


def test_deterministic_tends_to_two_just_after_B():
    B = 3.0
    p = C.policy("deterministic", B=B)
    for eps in (1e-1, 1e-3, 1e-9):
        r = C.simulate(p, C.Fixed(B * (1 + eps)), n=10, seed=0)
        assert r.ratio == pytest.approx(2.0, abs=1e-12), f"T=B(1+{eps}): {r.ratio}, want 2"
    # just before B the holder is waited out: ratio 1
    assert C.simulate(p, C.Fixed(B * (1 - 1e-9)), n=10, seed=0).ratio == pytest.approx(1.0)
    adv = C.simulate(p, C.Adversarial(), n=1000, seed=0)
    assert adv.exact_ratio == pytest.approx(2.0, abs=1e-9) and adv.ratio == pytest.approx(2.0)
    assert adv.worst_T > B


def test_randomized_adversarial_within_three_percent_of_e_over_e_minus_1():
    r = C.simulate(C.policy("randomized", B=1.0), C.Adversarial(), n=200_000, seed=7)
    assert abs(r.ratio / E_OVER_E1 - 1.0) < 0.03, \
        f"Monte Carlo worst-case ratio {r.ratio:.4f} not within 3% of e/(e-1)={E_OVER_E1:.4f}"
    assert r.exact_ratio == pytest.approx(E_OVER_E1, rel=1e-9), \
        f"quadrature worst-case ratio {r.exact_ratio} != e/(e-1)"


@pytest.mark.parametrize("T", [0.05, 0.3, 0.9, 1.0, 1.7, 6.0])
def test_randomized_expected_cost_matches_quad(T):
    B = 1.3
    TT = T * B
    want = quad_expected_cost(lambda x: ski_density(x, B), B, TT, RA, B)
    got = C.expected_cost(C.policy("randomized", B=B), TT, RA)
    assert got == pytest.approx(want, rel=1e-8), f"E[cost(T={TT})]: {got} vs quad {want}"
    # and the closed form of Karlin et al.: e/(e-1) * min(T, B) at every T
    assert got == pytest.approx(E_OVER_E1 * min(TT, B), rel=1e-9)
    mc = C.simulate(C.policy("randomized", B=B), C.Fixed(TT), n=200_000, seed=3)
    assert mc.mean_cost == pytest.approx(want, rel=0.02), \
        f"Monte Carlo E[cost] {mc.mean_cost} not within 2% of quad {want}"


@pytest.mark.parametrize("spec,B,k,cdf", [
    ("randomized", 2.0, None, lambda t: (np.exp(t / 2.0) - 1.0) / (math.e - 1.0)),
    ("rw-randomized", 1.0, 1.0, lambda t: t),
    ("rw-randomized", 0.5, 3.0, lambda t: ((1 + t / 0.5) ** 3 - 1) / ((4 / 3) ** 3 - 1)),
])
def test_delay_sampler_matches_analytic_cdf(spec, B, k, cdf):
    p = C.policy(spec, B=B) if k is None else C.policy(spec, B=B, k=k)
    x = p.delays(np.random.default_rng(11), 20_000)
    res = stats.kstest(x, lambda t: np.clip(cdf(np.asarray(t)), 0.0, 1.0))
    assert res.pvalue > 0.01, f"KS p-value {res.pvalue:.3g} <= 0.01 (statistic {res.statistic:.4f})"
    end = B if k is None else B / k
    assert x.min() >= 0.0 and x.max() <= end * (1 + 1e-12)
    # the scalar path draws from the same distribution
    rng = np.random.default_rng(12)
    y = np.array([p.delay(rng) for _ in range(3000)])
    assert stats.kstest(y, lambda t: np.clip(cdf(np.asarray(t)), 0.0, 1.0)).pvalue > 0.01


# ----------------------------------------------------------------------------- requestor wins
@pytest.mark.parametrize("k", [0.5, 1.0, 2.0, 4.0, 10.0])
def test_rw_deterministic_ratio_is_two_plus_one_over_k(k):
    B = 2.0
    p = C.policy("rw-deterministic", B=B, k=k)
    want = 2.0 + 1.0 / k
    assert p.native() == (C.RW_DETERMINISTIC, B, k)
    adv = C.simulate(p, C.Adversarial(), n=1000, seed=0, model=RW)
    assert adv.exact_ratio == pytest.approx(want, rel=1e-8), f"k={k}: {adv.exact_ratio} != {want}"
    just_after = C.simulate(p, C.Fixed(B / k * (1 + 1e-9)), n=10, seed=0, model=RW)
    assert just_after.ratio == pytest.approx(want, rel=1e-8)
    for w in (C.Exponential(0.5), C.Pareto(1.5, 0.5)):
        r = C.simulate(p, w, n=20_000, seed=2, model=RW)
        assert r.max_ratio <= want * (1 + 1e-12), f"per-instance ratio {r.max_ratio} > {want}"
    assert C.documented_ratio(p) == pytest.approx(want)


def test_rw_deterministic_no_fixed_delay_beats_two_plus_one_over_k():
    """Lower bound: for every fixed delay x the adversary T = x+ gives >= 2 + 1/k."""
    B, k = 1.0, 2.0
    for x in np.geomspace(1e-3, 1e2, 400):
        worst = ((k + 1) * x + B) / min(k * x, B)
        assert worst >= 2 + 1 / k - 1e-12
    assert C.documented_ratio(C.policy("rw-deterministic", k=k)) == pytest.approx(2 + 1 / k)


@pytest.mark.parametrize("k", [1.0, 2.0, 4.0])
def test_rw_randomized_ratio_matches_derivation(k):
    B = 1.0
    p = C.policy("rw-randomized", B=B, k=k)
    want = c_rw(k)
    adv = C.simulate(p, C.Adversarial(), n=200_000, seed=5, model=RW)
    assert adv.exact_ratio == pytest.approx(want, rel=1e-8), f"k={k}: {adv.exact_ratio} != {want}"
    assert abs(adv.ratio / want - 1) < 0.03, \
        f"k={k}: Monte Carlo worst ratio {adv.ratio:.4f} not within 3% of {want:.4f}"
    # equalizing: the same ratio at every T, checked against quad over the density
    for T in (0.01, 0.2, B / k, 0.9, 5.0):
        e = quad_expected_cost(lambda t: rw_density(t, B, k), B / k, T, RW, B, k)
        got = C.expected_cost(p, T, RW)
        assert got == pytest.approx(e, rel=1e-8), f"k={k}, T={T}: {got} vs quad {e}"
        assert e / min(k * T, B) == pytest.approx(want, rel=1e-7)
    assert C.documented_ratio(p) == pytest.approx(want)


def test_rw_randomized_k1_is_uniform_with_ratio_two_and_large_k_tends_to_e_ratio():
    assert c_rw(1.0) == 2.0
    assert C.rw_randomized_ratio(1.0) == 2.0
    assert C.rw_randomized_ratio(1e6) == pytest.approx(E_OVER_E1, rel=1e-5)
    u = np.linspace(0, 0.999, 50)
    assert np.allclose([C.draw_delay(C.RW_RANDOMIZED, 3.0, 1.0, v) for v in u], 3.0 * u)


@pytest.mark.parametrize("k", [1.0, 3.0])
def test_rw_randomized_lower_bound_adversary(k):
    """Yao's principle: the adversary of docs/conflict.md (P(T > t) = (B/(t+B))^(k+1) on
    [0, B/k), the rest at T = infinity) makes every fixed delay x pay >= c_k * E[OPT]; so no
    randomized policy beats c_k. Checked with quad, independently of the module."""
    B = 1.0
    X = B / k
    S = lambda t: (B / (t + B)) ** (k + 1)                   # noqa: E731
    q = lambda t: (k + 1) * B ** (k + 1) / (t + B) ** (k + 2)  # noqa: E731  (density, -S')
    atom = S(X)
    e_opt = integrate.quad(lambda t: k * t * q(t), 0, X)[0] + atom * B
    assert e_opt == pytest.approx(B * (1 - (k / (k + 1)) ** k), rel=1e-9)
    waited = lambda a: integrate.quad(lambda t: k * t * q(t), 0, a)[0]  # noqa: E731
    for x in np.concatenate([np.linspace(0, X, 9), [1.5 * X, 3 * X]]):
        if x < X:   # holder times in (x, X) and the atom are given up on at x
            e_cost = waited(x) + ((k + 1) * x + B) * S(x)
        else:       # every finite holder time is waited out; only the atom is given up on
            e_cost = waited(X) + ((k + 1) * x + B) * atom
        if x <= X:
            assert e_cost / e_opt == pytest.approx(c_rw(k), rel=1e-9), "equalized on [0, B/k]"
        assert e_cost / e_opt >= c_rw(k) - 1e-9, f"x={x}: {e_cost / e_opt} < {c_rw(k)}"


def test_ski_rental_policies_under_requestor_wins():
    """Cross-model numbers quoted in docs/conflict.md: wait-B pays k + 2, the ski-rental
    density pays 1 + (k+1)/(e-1) once kT >= B."""
    for k in (1.0, 4.0):
        d = C.simulate(C.policy("deterministic"), C.Adversarial(), n=100, model=RW, k=k)
        assert d.exact_ratio == pytest.approx(k + 2.0, rel=1e-8)
        r = C.expected_ratio(C.policy("randomized"), 5.0, RW, k=k)
        assert r == pytest.approx(1 + (k + 1) / (math.e - 1), rel=1e-9)
        adv = C.simulate(C.policy("randomized"), C.Adversarial(), n=100, model=RW, k=k)
        assert adv.exact_ratio == pytest.approx(1 + (k + 1) / (math.e - 1), rel=1e-9)
    assert C.documented_ratio(C.policy("deterministic"), RW, 4.0) == pytest.approx(6.0)


# ----------------------------------------------------------------------------- baselines
def test_abort_now_ratio_unbounded_as_T_goes_to_zero():
    p = C.policy("abort", B=1.0)
    ratios = [C.simulate(p, C.Fixed(T), n=10, seed=0).ratio for T in (1e-1, 1e-2, 1e-3)]
    assert ratios == pytest.approx([10.0, 100.0, 1000.0])
    assert C.simulate(p, C.Fixed(5.0), n=10, seed=0).ratio == 1.0   # optimal once T >= B


def test_wait_forever_ratio_grows_with_T_over_B():
    p = C.policy("wait", B=2.0)
    for model, k in ((RA, None), (RW, 3.0)):
        ratios = [C.simulate(p, C.Fixed(T), n=10, seed=0, model=model, k=k).ratio
                  for T in (4.0, 8.0, 16.0)]
        kk = 1.0 if k is None else k
        assert ratios == pytest.approx([kk * T / 2.0 for T in (4.0, 8.0, 16.0)])
        assert C.simulate(p, C.Fixed(0.1), n=10, seed=0, model=model, k=k).ratio == 1.0
    assert p.delay(np.random.default_rng(0)) == math.inf


def test_backoff_probes_and_overshoot():
    B, m = 7.0, 3                       # probes at 1, 3, 7
    p = C.policy("backoff", B=B, m=m)
    assert p.native() == (C.EXP_BACKOFF, 7.0, 3.0)
    obs = [C.observe_release(C.EXP_BACKOFF, B, 3.0, T) for T in (0.5, 1.0, 1.5, 3.0, 6.9, 7.0, 8.0)]
    assert obs == [1.0, 1.0, 3.0, 3.0, 7.0, 7.0, 8.0]
    assert C.simulate(p, C.Fixed(1.0 + 1e-9), n=5, seed=0).ratio == pytest.approx(3.0)
    assert C.simulate(p, C.Fixed(B * (1 + 1e-9)), n=5, seed=0).ratio == pytest.approx(2.0)
    # never cheaper than wait-B: same deadline, a release is seen only at a probe
    for w in (C.Exponential(1.0), C.Pareto(1.5, 2.0)):
        b = C.simulate(p, w, n=20_000, seed=4)
        d = C.simulate(C.policy("deterministic", B=B), w, n=20_000, seed=4)
        assert b.mean_cost >= d.mean_cost and b.mean_opt == d.mean_opt
    # unbounded before the first probe: ratio b/T
    assert C.simulate(p, C.Fixed(1e-3), n=5, seed=0).ratio == pytest.approx(1000.0)
    assert C.documented_ratio(p) == math.inf


# ----------------------------------------------------------------------------- kernels
def test_python_and_numba_kernels_agree():
    rng = np.random.default_rng(0)
    us = np.concatenate([[0.0, 0.5, 1.0 - 1e-16], rng.random(200)])
    Ts = np.concatenate([[1e-6, 0.5, 1.0, 1.0 + 1e-12, 50.0], rng.exponential(1.0, 50)])
    natives = [C.policy(s, B=1.7).native() for s in ALL_SPECS]
    natives += [C.policy("rw-randomized", B=0.3, k=5.0).native(),
                C.policy("rw-deterministic", B=0.3, k=0.25).native(),
                C.policy("backoff", B=2.0, m=1).native(), (99, 1.0, 0.0)]
    for kind, B, extra in natives:
        for u in us:
            a = C.draw_delay(kind, B, extra, u)
            b = C.draw_delay_jit(kind, B, extra, u)
            assert a == pytest.approx(b, rel=1e-14, abs=0) or (a == b), (kind, u, a, b)
        for T in Ts:
            assert C.observe_release(kind, B, extra, T) == C.observe_release_jit(kind, B, extra, T)
            for model, k in ((C.REQUESTOR_ABORTS, 1.0), (C.REQUESTOR_WINS, 3.0)):
                x = C.draw_delay(kind, B, extra, 0.37)
                assert C.conflict_cost(kind, B, extra, x, T, model, k) == pytest.approx(
                    C.conflict_cost_jit(kind, B, extra, x, T, model, k), rel=1e-14)
                assert C.offline_opt(B, T, model, k) == C.offline_opt_jit(B, T, model, k)
    assert C.draw_delay(99, 1.0, 0.0, 0.5) == 0.0      # unknown kind: abort, never raise


def test_draw_delay_matches_naive_inverse_cdfs():
    for spec, kw in (("randomized", {}), ("rw-randomized", {"k": 2.5}),
                     ("rw-deterministic", {"k": 3.0}), ("deterministic", {}), ("abort", {}),
                     ("wait", {}), ("backoff", {})):
        p = C.policy(spec, B=1.9, **kw)
        for u in np.linspace(0, 0.999, 37):
            assert C.draw_delay(*p.native(), u) == pytest.approx(
                naive_delay(spec, p.B, p.extra, u), rel=1e-12)


@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("model,k", [(RA, None), (RW, 2.0)])
def test_simulate_matches_naive_loop(spec, model, k):
    """Same seed, same draws: the Numba simulator equals a per-instance Python loop."""
    kw = {"k": k} if spec.startswith("rw-") and k else {}
    p = C.policy(spec, B=0.8, **kw)
    n, seed = 3000, 9
    r = C.simulate(p, C.Exponential(1.1), n=n, seed=seed, model=model, k=k)
    rng = np.random.default_rng(seed)
    T = rng.exponential(1.1, n)
    u = rng.random(n)
    kk = 1.0 if k is None else k
    cost = [naive_cost(spec, p.B, p.extra, naive_delay(spec, p.B, p.extra, ui), Ti, model, kk)
            for Ti, ui in zip(T, u)]
    opt = [min(Ti, p.B) if model == RA else min(kk * Ti, p.B) for Ti in T]
    assert r.mean_cost == pytest.approx(np.mean(cost), rel=1e-12)
    assert r.mean_opt == pytest.approx(np.mean(opt), rel=1e-12)
    assert r.max_ratio == pytest.approx(max(c / o for c, o in zip(cost, opt)), rel=1e-12)


def test_simulate_is_seeded_and_policies_share_holder_times():
    a = C.simulate(C.policy("randomized"), C.Pareto(1.5, 0.5), n=5000, seed=3)
    b = C.simulate(C.policy("randomized"), C.Pareto(1.5, 0.5), n=5000, seed=3)
    c = C.simulate(C.policy("deterministic"), C.Pareto(1.5, 0.5), n=5000, seed=3)
    assert a == b and a.mean_opt == c.mean_opt
    assert C.simulate(C.policy("randomized"), C.Pareto(1.5, 0.5), n=5000, seed=4) != a


def test_rw_model_k_defaults_to_the_policy_k():
    p = C.policy("rw-randomized", k=3.0)
    assert C.simulate(p, C.Fixed(0.1), n=10, model=RW).k == 3.0
    assert C.simulate(p, C.Fixed(0.1), n=10, model=RW, k=2.0).k == 2.0
    assert C.simulate(C.policy("randomized"), C.Fixed(0.1), n=10, model=RW).k == 1.0


def test_competitive_table_rows():
    rows = C.competitive_table(n=2000, workloads=(C.Exponential(1.0), C.Adversarial(points=41,
                                                                          mc_per_point=500)))
    assert len(rows) == len(C.DEFAULT_POLICIES) * 2 * len(C.DEFAULT_MODELS)
    keys = {"policy", "workload", "model", "k", "ratio", "exact", "documented"}
    assert all(keys <= set(r) for r in rows)
    by = {(r["model"], r["k"], r["policy"], r["workload"]): r for r in rows}
    assert by[(RA, 1.0, "deterministic", "adversarial")]["exact"] == pytest.approx(2.0)
    assert by[(RW, 4.0, "rw-randomized(k=4)", "adversarial")]["exact"] == pytest.approx(c_rw(4))
    assert by[(RW, 4.0, "rw-deterministic(k=4)", "adversarial")]["documented"] == 2.25
    # a name spelled as policy() takes it is tuned for the model's k, as the plain spelling
    for name in ("rw_randomized", "RW-Randomized"):
        row, = C.competitive_table([name], [C.Fixed(1.0)], [(RW, 4.0)], n=200)
        assert row["policy"] == "rw-randomized(k=4)" and row["documented"] is not None
    with pytest.raises(ValueError, match=r"models: expected \(model, k\) pairs"):
        C.competitive_table(["randomized"], models=[RA])


# ----------------------------------------------------------------------------- API and validation
def test_native_and_delay_agree():
    for s in ALL_SPECS:
        p = C.policy(s, B=0.25)
        kind, B, extra = p.native()
        assert type(kind) is int and type(B) is float and type(extra) is float
        u = np.random.default_rng(5).random()
        assert p.delay(np.random.default_rng(5)) == C.draw_delay(kind, B, extra, u)
        assert p.name.startswith(s)


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_policies_pickle(spec):
    p = C.policy(spec, B=0.5)
    q = pickle.loads(pickle.dumps(p))
    assert q == p and q.name == p.name and q.native() == p.native()
    assert q.delay(np.random.default_rng(1)) == p.delay(np.random.default_rng(1))
    for obj in (C.Exponential(2.0), C.Pareto(2.0, 1.0), C.Adversarial(),
                C.simulate(p, C.Fixed(0.3), n=10)):
        assert pickle.loads(pickle.dumps(obj)) == obj


@pytest.mark.parametrize("call,exc,words", [
    (lambda: C.policy("determinstic"), ValueError, ["spec must be one of", "'deterministic'"]),
    (lambda: C.policy(3), TypeError, ["spec must be a policy name"]),
    (lambda: C.policy("deterministic", B=-1.0), ValueError, ["B must be finite and > 0", "-1"]),
    (lambda: C.policy("deterministic", B=0), ValueError, ["B must be finite and > 0"]),
    (lambda: C.policy("randomized", B=math.inf), ValueError, ["B must be finite and > 0"]),
    (lambda: C.policy("randomized", B=math.nan), ValueError, ["B must be finite and > 0"]),
    (lambda: C.policy("randomized", B="1"), TypeError, ["B must be a real number"]),
    (lambda: C.policy("randomized", B=True), TypeError, ["B must be a real number"]),
    (lambda: C.policy("randomized", k=2), ValueError, ["k (stalled requestors) applies only"]),
    (lambda: C.policy("rw-randomized", k=0), ValueError, ["k must be finite and > 0", "k=1"]),
    (lambda: C.policy("rw-deterministic", m=3), ValueError, ["m (backoff probes)"]),
    (lambda: C.policy("backoff", m=0), ValueError, ["integer in 1..30"]),
    (lambda: C.policy("backoff", m=2.5), ValueError, ["m must be an integer"]),
    (lambda: C.policy("backoff", m=float("nan")), ValueError, ["m must be an integer"]),
    (lambda: C.Adversarial(points=float("inf")), ValueError, ["points must be an integer"]),
    (lambda: C.policy("wait", m=2), ValueError, ["applies only to 'backoff'"]),
    (lambda: C.Policy(9), ValueError, ["kind must be one of the codes"]),
    (lambda: C.Policy("randomized"), TypeError, ["kind must be an int code", "policy(spec)"]),
    (lambda: C.Policy(C.DETERMINISTIC, 1.0, 2.0), ValueError, ["extra must be 0"]),
    (lambda: C.policy("randomized").delay(None), TypeError, ["rng must be", "default_rng"]),
    (lambda: C.simulate("randomized", C.Exponential(), model="requestor"), ValueError,
     ["model must be one of"]),
    (lambda: C.simulate("randomized", C.Exponential(), n=0), ValueError, ["n must be"]),
    (lambda: C.simulate("randomized", C.Exponential(), k=2.0), ValueError,
     ["requestor-wins model only"]),
    (lambda: C.simulate("randomized", C.Exponential(), model=RW, k=-1), ValueError,
     ["k must be finite and > 0"]),
    (lambda: C.simulate("randomized", "uniform"), TypeError, ["workload must be"]),
    (lambda: C.simulate("randomized", C.Exponential(), seed=1.5), TypeError, ["seed must be"]),
    (lambda: C.Exponential(-1.0), ValueError, ["mean must be finite and > 0"]),
    (lambda: C.Pareto(alpha=0.0), ValueError, ["alpha must be finite and > 0"]),
    (lambda: C.Adversarial(lo=2.0, hi=1.0), ValueError, ["lo must be < hi"]),
    (lambda: C.expected_cost("randomized", [1.0, -1.0]), ValueError, ["T (holder times)"]),
    # raw errors before: int(nan), float("x"), numpy's seed words; k=True passed
    (lambda: C.Policy(C.EXP_BACKOFF, 1.0, float("nan")), ValueError, ["m (the number of "
                                                                       "backoff probes"]),
    (lambda: C.Policy(C.EXP_BACKOFF, 1.0, float("inf")), ValueError, ["m (the number"]),
    (lambda: C.expected_cost("randomized", 1.0, k="x"), TypeError, ["k must be a real"]),
    (lambda: C.expected_cost("randomized", 1.0, k=True), TypeError, ["k must be a real"]),
    (lambda: C.simulate("randomized", C.Exponential(), seed=-1), ValueError,
     ["seed must be an int >= 0"]),
])
def test_bad_input_messages(call, exc, words):
    with pytest.raises(exc) as ei:
        call()
    msg = str(ei.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def test_expectations_take_holder_times_of_any_shape():
    """A 2-D grid of holder times gives a grid of costs and ratios (a numba typing error
    before), each the value of its own T."""
    T = np.array([[0.25, 1.0], [2.0, 4.0]])
    for fn in (C.expected_cost, C.expected_ratio):
        grid = fn("randomized", T)
        assert grid.shape == (2, 2)
        np.testing.assert_allclose(grid.ravel(), fn("randomized", T.ravel()), rtol=0, atol=0)
        assert grid[0, 1] == fn("randomized", 1.0)


def test_requestor_wins_ratios_below_one_requestor():
    """For k < 1 the ski-rental policies' worst ratios under requestor wins are the
    k >= 1 formulas divided by k (OPT is kT up to B), as docs/conflict.md states."""
    T = np.geomspace(1e-3, 1e3, 4000)
    e = math.e
    for k in (0.25, 0.5):
        det = C.expected_ratio("deterministic", T, model=RW, k=k).max()
        ran = C.expected_ratio("randomized", T, model=RW, k=k).max()
        assert det == pytest.approx((k + 2) / k, rel=3e-3)
        assert ran == pytest.approx((1 + (k + 1) / (e - 1)) / k, rel=3e-3)
        assert C.documented_ratio(C.policy("deterministic"), RW, k) == pytest.approx((k + 2) / k)


def test_string_specs_work_everywhere():
    assert C.simulate("deterministic", "adversarial", n=100).exact_ratio == pytest.approx(2.0)
    assert C.expected_ratio("randomized", [0.2, 3.0]) == pytest.approx([E_OVER_E1] * 2)
    p = C.policy("randomized")
    assert C.policy(p) is p


# ----------------------------------------------------------------------------- benchmark
def test_bench_run_quick(tmp_path):
    import json

    from bench.conflict import run, summary_markdown
    res = run(reps=1, seed=0, out_dir=tmp_path, quick=True)
    assert (tmp_path / "conflict.json").stat().st_size > 0
    assert (tmp_path / "conflict.png").stat().st_size > 0
    with open(tmp_path / "conflict.json") as f:
        on_disk = json.load(f)
    assert on_disk["header"]["seed"] == 0 and len(on_disk["results"]) == len(res["results"])
    md = summary_markdown(res)
    assert "| policy |" in md and "rw-randomized(k=4)" in md and "1.58" in md
